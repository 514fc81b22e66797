"""Hostile test agent: writes 32-byte lines to stderr as fast as it can for the seconds its intent
names, then a last line, then answers with how many bytes it wrote."""

import json
import os
import sys
import time

intent = json.loads(sys.stdin.readline())
block = (b"f" * 31 + b"\n") * 1024
written = 0
end = time.monotonic() + float(intent["text"].split()[-1])
while time.monotonic() < end:
    written += os.write(2, block)
written += os.write(2, b"flood over\n")
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": str(written), "sources": []}), flush=True)
