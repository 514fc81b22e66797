"""A misbehaving agent for the runner's fault corpus: the intent text picks the fault."""

import json
import os
import signal
import socket
import sys
import time

intent = json.loads(sys.stdin.readline())
mode, _, arg = intent["text"].partition(" ")


def answer(text="ok", status="ok", intent_id=None):
    reply = {"intent_id": intent_id or intent["id"], "status": status, "text": text, "sources": []}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


def sleep_forever():
    while True:
        time.sleep(3600)


if mode == "echo":
    answer(arg)
elif mode == "echo-linger":  # answers, then stays alive a moment: its memory can be read when it answers
    answer(arg)
    time.sleep(0.5)
elif mode == "error":
    answer("it went wrong", status="error")
elif mode == "sleep":
    sleep_forever()
elif mode == "busy":
    while True:
        pass
elif mode == "alloc":
    held = bytearray(int(arg) * 1024 * 1024)
    for i in range(0, len(held), 4096):
        held[i] = 1
    sleep_forever()
elif mode == "flood-stdout":
    chunk = b"x" * 65536
    for _ in range(int(arg) * 16):
        sys.stdout.buffer.write(chunk)
    sys.stdout.flush()
elif mode == "flood-stderr":
    line = b"e" * 1023 + b"\n"
    for _ in range(int(arg) * 1024):
        sys.stderr.buffer.write(line)
    sys.stderr.flush()
    answer("survived")
elif mode == "garbage":
    print("this is not json")
elif mode == "deep":  # nests past any recursion limit: json.loads raises RecursionError, not ValueError
    print("[" * 200_000 + "]" * 200_000)
elif mode == "two-lines":
    answer("one")
    answer("two")
elif mode == "wrong-id":
    answer(intent_id="not-the-id")
elif mode == "wrong-shape":
    print(json.dumps({"intent_id": intent["id"], "status": "fine", "text": 3}))
elif mode == "silent":
    sys.exit(0)
elif mode == "exit":
    sys.exit(int(arg))
elif mode == "escape":
    # A grandchild that leaves the process group; the agent answers and exits at once
    # (arg "stay": the agent sleeps instead, so the escapee still has its parent).
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            sleep_forever()
        sleep_forever()
    time.sleep(0.2)
    if arg == "stay":
        sleep_forever()
    answer("escaped")
elif mode == "farewell":  # on SIGTERM: more on stderr than a pipe holds, then a clean exit
    def farewell(_signum, _frame):
        for _ in range(int(arg)):
            os.write(2, b"f" * 1023 + b"\n")  # under PIPE_BUF: each write is whole
        os.write(2, b"farewell done\n")
        os._exit(0)

    signal.signal(signal.SIGTERM, farewell)
    sleep_forever()
elif mode == "count-term":  # says each SIGTERM it gets; exits a moment after the first
    received = []

    def counted(_signum, _frame):
        received.append(1)
        os.write(2, b"got SIGTERM\n")

    signal.signal(signal.SIGTERM, counted)
    while not received:
        time.sleep(0.01)
    time.sleep(0.2)
    os._exit(0)
elif mode == "close-pipes":  # closes stdout and stderr at once, then stays
    os.close(1)
    os.close(2)
    sleep_forever()
elif mode == "unended":  # a last stderr line without its newline
    sys.stderr.write("first line\nlast words")
    sys.stderr.flush()
    answer("said")
elif mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stderr.write("ignoring SIGTERM\n")
    sys.stderr.flush()
    sleep_forever()
elif mode == "bigfile":
    with open(os.path.join(os.environ["TMPDIR"], "big"), "wb") as f:
        for _ in range(int(arg)):
            f.write(b"\0" * 1024 * 1024)
    answer("wrote it")
elif mode == "connect":
    try:
        socket.create_connection(("127.0.0.1", int(arg)), timeout=2).close()
        answer("connected")
    except OSError as exc:
        answer(f"refused: {exc}", status="error")
elif mode == "nice":
    answer(str(os.getpriority(os.PRIO_PROCESS, 0)))
elif mode == "cpus":
    answer(json.dumps(sorted(os.sched_getaffinity(0))))
elif mode == "env":
    answer(json.dumps(dict(os.environ)))
else:
    answer(f"unknown mode {mode}", status="error")
