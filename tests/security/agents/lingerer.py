"""Hostile Rune process tool: leaves behind a process that neither its run's tree nor a marker leads to.

It forks; the child starts a session of its own, forks again and exits at once, so the grandchild is
covenant's (the child subreaper) within a millisecond; the grandchild execs ``sleep`` with an empty
environment (no ``COVENANT_INTENT_ID``). The tool waits for that exec (its pipe closes on exec), then
answers with the grandchild's pid.
"""

import json
import os
import sys

json.load(sys.stdin)
read_end, write_end = os.pipe()  # close-on-exec
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(write_end, str(os.getpid()).encode())
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.execve("/bin/sleep", ["sleep", "3600"], {})
    os._exit(0)
os.close(write_end)
os.wait()
told = b""
while chunk := os.read(read_end, 64):
    told += chunk
print(json.dumps({"left": int(told)}))
