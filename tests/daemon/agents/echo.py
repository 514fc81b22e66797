"""Test agent: answers with the intent text, unchanged."""

import json
import sys

intent = json.loads(sys.stdin.readline())
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": intent["text"], "sources": ["echo"]}), flush=True)
