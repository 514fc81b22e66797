"""Test agent: answers with as many "x" as the last word of the intent says."""

import json
import sys

intent = json.loads(sys.stdin.readline())
size = int(intent["text"].split()[-1])
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": "x" * size, "sources": []}), flush=True)
