"""Disk user agent: writes what its intent asks, then answers (its HOME and a report go to stderr first).

Intent text ``MODE [N]``:

- ``files N``: N files of 1 MiB in its TMPDIR, then answers;
- ``hold N``: the same, then sleeps (a run that only the sampler can stop);
- ``tmp``: 1 MiB files in /tmp until a write fails (or 64 MiB), then answers with how far it got;
- ``tiny N``: N empty files in its HOME (no block: only the entry cap can stop them);
- ``odd``: a link to ``/`` and to the agent's own interpreter, 200 levels of directories with a 1 MiB file
  at the bottom, and a directory made 000 holding another 1 MiB file (2 MiB in all, under the limit);
- ``nice``: answers with its own nice value (``os.getpriority``).
"""

import json
import os
import sys
import time

intent = json.loads(sys.stdin.readline())
mode, _, arg = intent["text"].partition(" ")
sys.stderr.write(f"home {os.environ['HOME']}\n")
sys.stderr.flush()
text = "done"
if mode in ("files", "hold"):
    for i in range(int(arg)):
        with open(os.path.join(os.environ["TMPDIR"], f"f{i}"), "wb") as f:
            f.write(b"\1" * 1024 * 1024)
    if mode == "hold":
        time.sleep(300)
elif mode == "tmp":
    written = 0
    try:
        while written < 64:
            with open(f"/tmp/fill{written}", "wb") as f:
                f.write(b"\1" * 1024 * 1024)
            written += 1
    except OSError as exc:
        text = f"stopped after {written} MiB: {exc.strerror}"
    sys.stderr.write(text + "\n")
elif mode == "tiny":
    for i in range(int(arg)):
        open(os.path.join(os.environ["HOME"], f"e{i}"), "wb").close()
elif mode == "odd":
    home = os.environ["HOME"]
    os.symlink("/", os.path.join(home, "to-root"))
    os.symlink(sys.executable, os.path.join(home, "to-python"))
    deep = os.path.join(home, "deep")
    os.makedirs(os.path.join(deep, *["d"] * 199))
    with open(os.path.join(deep, *["d"] * 199, "bottom"), "wb") as f:
        f.write(b"\1" * 1024 * 1024)
    os.mkdir(os.path.join(home, "shut"))
    with open(os.path.join(home, "shut", "inside"), "wb") as f:
        f.write(b"\1" * 1024 * 1024)
    os.chmod(os.path.join(home, "shut"), 0)
elif mode == "nice":
    text = str(os.getpriority(os.PRIO_PROCESS, 0))
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": text, "sources": []}))
