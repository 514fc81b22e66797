"""Leaver agent: leaves behind, or answers, what breaks a supervisor's cleanup and records, then answers.

Intent text ``MODE [ARG]``:

- ``deep [LEVELS]``: a directory tree LEVELS (default 1000) deep in its HOME and in /tmp, a file every 100
  levels, a link to ``/`` at each top and the top's first directory made 000 (its own, so removable);
- ``files``: empty files in /tmp until the tmpfs refuses (or 150,000), reporting how many and why;
- ``escape``: answers with a lone surrogate as a JSON escape (``"\\ud800"``);
- ``raw``: answers with a lone surrogate's raw bytes (invalid UTF-8);
- ``look``: reports what its HOME and /tmp hold.

The answer's text is a JSON report: ``home`` and ``tmp`` (the names there), ``made``, ``error``; it is also the
last line on stderr, after ``report ``, for a run whose answer is not kept (``files`` ends ``disk_exceeded``).
"""

import json
import os
import sys

intent = json.loads(sys.stdin.readline())
mode, _, arg = intent["text"].partition(" ")
report = {"mode": mode}


def deep(top: str, levels: int) -> None:
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for level in range(levels):
        os.mkdir("d", dir_fd=fd)
        if level % 100 == 0:
            os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    os.symlink("/", os.path.join(top, "to-root"))
    os.chmod(os.path.join(top, "d"), 0)


if mode == "deep":
    for top in (os.environ["HOME"], "/tmp"):
        deep(top, int(arg or 1000))
elif mode == "files":
    made = 0
    try:
        while made < 150_000:
            os.close(os.open(f"/tmp/e{made}", os.O_WRONLY | os.O_CREAT, 0o600))
            made += 1
    except OSError as exc:
        report["error"] = exc.strerror
    report["made"] = made
report["home"] = sorted(os.listdir(os.environ["HOME"]))
report["tmp"] = sorted(os.listdir("/tmp"))[:20]
report["tmp_count"] = len(os.listdir("/tmp"))
sys.stderr.write("report " + json.dumps(report) + "\n")
sys.stderr.flush()

if mode == "escape":
    line = '{"intent_id": %s, "status": "ok", "text": "half \\ud800 a pair", "sources": []}' % json.dumps(intent["id"])
    sys.stdout.write(line + "\n")
elif mode == "raw":
    line = '{"intent_id": %s, "status": "ok", "text": "half ' % json.dumps(intent["id"])
    sys.stdout.buffer.write(line.encode() + b"\xed\xa0\x80" + b'", "sources": []}\n')
else:
    print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": json.dumps(report), "sources": []}))
