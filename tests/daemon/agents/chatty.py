"""Test agent: writes two lines to stderr, then answers."""

import json
import sys

intent = json.loads(sys.stdin.readline())
print("chatty starting", file=sys.stderr, flush=True)
print("chatty: still here", file=sys.stderr, flush=True)
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": "done", "sources": []}), flush=True)
