"""Hostile: a process tool that tries files it should not reach and says what the kernel answered.

Arguments: ``{"write": [path], "read": [path], "list": [path]}``, tried in that order (a relative path is
relative to the tool's working directory). Answers, per path, ``ok`` or the errno name, and whether it
could still read its own package and write its HOME (its scratch dir).
"""

import errno
import json
import os
import sys


def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))


def write(path):
    with open(path, "a") as f:
        f.write("written by a confined tool\n")


def read(path):
    with open(path, "rb") as f:
        f.read(1)


args = json.load(sys.stdin)
answer = {"write": {p: attempt(lambda p=p: write(p)) for p in args.get("write", [])}}
answer["read"] = {p: attempt(lambda p=p: read(p)) for p in args.get("read", [])}
answer["list"] = {p: attempt(lambda p=p: os.listdir(p)) for p in args.get("list", [])}
answer["own_package"] = attempt(lambda: read(os.path.abspath(sys.argv[0])))
answer["home"] = attempt(lambda: write(os.path.join(os.environ["HOME"], "scratch.txt")))
answer["cwd"] = os.getcwd()
json.dump(answer, sys.stdout)
