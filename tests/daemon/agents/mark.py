"""Test agent: first leaves a file named after its intent in the directory given as the intent text."""

import json
import pathlib
import sys

intent = json.loads(sys.stdin.readline())
folder = pathlib.Path(intent["text"].split()[-1])
(folder / intent["id"]).write_text("ran\n")
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": "marked", "sources": []}), flush=True)
