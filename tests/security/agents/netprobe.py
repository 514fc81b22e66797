"""An agent (or process tool) that tries to reach each ``HOST:PORT`` of its input and says what happened.

As an agent: the intent's text is the targets; as a process tool: the ``targets`` argument. Each
target is ``ok`` (connected), or the error's name (``ECONNREFUSED``, ``EHOSTUNREACH``, ``timeout``…).
"""

import errno
import json
import os
import socket
import sys


def reach(target: str) -> str:
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            return "ok"
    except socket.timeout:
        return "timeout"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))


def interfaces() -> list[str]:
    lines = open("/proc/self/net/dev").read().splitlines()[2:]  # this process's namespace
    return sorted(line.split(":")[0].strip() for line in lines)


document = json.loads(sys.stdin.readline())
targets = (document.get("text") or "").split() if "id" in document else document.get("targets", [])
seen = {"reached": {target: reach(target) for target in targets}, "interfaces": interfaces(),
        "netns": os.readlink("/proc/self/ns/net")}
if "id" in document:
    print(json.dumps({"intent_id": document["id"], "status": "ok", "text": json.dumps(seen), "sources": []}))
else:
    print(json.dumps(seen))
