"""Test agent: answers with text meant for the operator's terminal, not for reading.

OSC 52 (set the clipboard), a screen clear and cursor home, a carriage return that would overwrite
the line, a C1 CSI, BEL and a right-to-left override: each would act on the terminal if printed raw.
"""

import json
import sys

intent = json.loads(sys.stdin.readline())
text = ("answer \x1b]52;c;ZXZpbA==\x07 \x1b[2J\x1b[Hall clear\r\x9b31m"
        "outcome: ok\u202e evil \x00end")
sys.stderr.write("stderr \x1b]0;title\x07 too\n")
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": text, "sources": []}), flush=True)
