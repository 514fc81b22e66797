"""Test agent: leaves ``started`` in the directory given as the intent text, then waits (up to 60 s) for a file
``go`` there before it answers: a test holds it running for as long as it needs."""

import json
import pathlib
import sys
import time

intent = json.loads(sys.stdin.readline())
folder = pathlib.Path(intent["text"].split()[-1])
(folder / "started").write_text(intent["id"] + "\n")
deadline = time.monotonic() + 60
while not (folder / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": "went", "sources": []}), flush=True)
