"""Test agent: says on stderr that it waits, then answers once a file named ``open`` exists in the folder
given as the intent text's last word (the test opens it when it has seen what it checks)."""

import json
import pathlib
import sys
import time

intent = json.loads(sys.stdin.readline())
gate = pathlib.Path(intent["text"].split()[-1]) / "open"
print(f"gate waiting for {gate}", file=sys.stderr, flush=True)
while not gate.exists():
    time.sleep(0.02)
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": "opened", "sources": []}), flush=True)
