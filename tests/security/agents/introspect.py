"""Test agent: reports its uid, capabilities and groups, and leaves a file in its scratch dir and /tmp."""

import json
import os
import sys

intent = json.loads(sys.stdin.readline())
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
with open(os.path.join(os.environ["HOME"], "left-behind"), "w") as f:
    f.write("x" * 4096)
with open("/tmp/left-behind", "w") as f:
    f.write("y" * 4096)
seen = {
    "uid": os.getuid(),
    "groups": os.getgroups(),
    "caps": {name: status[name].strip() for name in ("CapInh", "CapPrm", "CapEff", "CapAmb")},
    "no_new_privs": status["NoNewPrivs"].strip(),
    "tmp": sorted(os.listdir("/tmp")),
}
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": json.dumps(seen), "sources": []}), flush=True)
