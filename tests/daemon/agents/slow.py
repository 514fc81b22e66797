"""Test agent: sleeps for the number of seconds given as the intent text, then answers."""

import json
import sys
import time

intent = json.loads(sys.stdin.readline())
try:
    seconds = float(intent["text"].split()[-1])
except ValueError:
    seconds = 0.0
time.sleep(seconds)
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": f"slept {seconds}", "sources": []}), flush=True)
