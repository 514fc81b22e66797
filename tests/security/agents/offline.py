"""A network = "off" agent: answers with its network namespace and the interfaces in it."""

import json
import os
import sys

intent = json.loads(sys.stdin.readline())
lines = open("/proc/self/net/dev").read().splitlines()[2:]  # this process's namespace (sysfs shows the host's)
seen = {"netns": os.readlink("/proc/self/ns/net"), "interfaces": [line.split(":")[0].strip() for line in lines]}
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": json.dumps(seen), "sources": []}))
