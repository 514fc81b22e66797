"""A minimal python3 agent: echoes the intent text."""
import json
import sys

intent = json.loads(sys.stdin.readline())
sys.stdout.write(json.dumps({"intent_id": intent["id"], "status": "ok", "text": intent["text"], "sources": []}) + "\n")
