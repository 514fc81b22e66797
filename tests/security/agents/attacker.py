"""Attacker agent: tries what the intent text names, reports what happened, and answers ok.

Intent text: ``attack NAME ARG...``. The answer's text is a JSON object:
``{"attack": NAME, "succeeded": bool, "detail": str, ...}``. ``succeeded`` is
True only when the attempt got through (the tests assert it is False). The
same report is the last line on stderr, after ``report ``, for a run whose
answer is not kept (``shm`` ends ``disk_exceeded``).
"""

import ctypes
import json
import os
import resource
import signal
import socket
import sys
import time


def attempt(fn):
    try:
        detail = fn()
    except OSError as exc:
        return {"succeeded": False, "detail": f"{type(exc).__name__}: {exc}", "errno": exc.errno}
    return {"succeeded": True, "detail": str(detail)[:200]}


def read(path):
    return attempt(lambda: open(path, "rb").read(64))


def write(path):
    def go():
        with open(path, "ab") as f:
            f.write(b"tampered\n")
        return "wrote"

    return attempt(go)


def create_in(folder):
    def go():
        with open(os.path.join(folder, "planted.toml"), "w") as f:
            f.write("x")
        return "created"

    return attempt(go)


def ask_daemon(address):
    """Connect to a unix socket (a path, or "@name" for an abstract one) and ask for /v1/status."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2)
    target = "\0" + address[1:] if address.startswith("@") else address
    sock.connect(target)
    sock.sendall(b"GET /v1/status HTTP/1.1\r\nHost: covenant\r\nConnection: close\r\n\r\n")
    answer = sock.recv(4096)
    sock.close()
    return answer


def unix_sockets():
    names = []
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 8:
                names.append(parts[7])
    return names


def socket_attack(paths):
    """Every given path, every path and abstract name in /proc/net/unix: none may answer as covenant."""
    tried, reached = [], []
    for address in list(paths) + unix_sockets():
        tried.append(address)
        try:
            answer = ask_daemon(address)
        except OSError:
            continue
        if b"covenant" in answer or b"HTTP/1.1 200" in answer:
            reached.append(address)
    return {"succeeded": bool(reached), "detail": f"tried {len(tried)} sockets, reached {reached}", "tried": tried}


def fork_bomb():
    children, error = [], None
    for _ in range(100_000):
        try:
            pid = os.fork()
        except OSError as exc:
            error = exc.errno
            break
        if pid == 0:
            time.sleep(120)
            os._exit(0)
        children.append(pid)
    return {"succeeded": error is None, "detail": f"forked {len(children)} then errno {error}",
            "forked": len(children), "errno": error}


def shm_filler(total_mb):
    written, error = 0, None
    chunk = b"\0" * (1 << 20)
    for i in range(total_mb):
        try:
            with open(f"/dev/shm/filler-{i}", "wb") as f:
                f.write(chunk)
            written += len(chunk)
        except OSError as exc:
            error = exc.errno
            break
    return {"succeeded": error is None, "detail": f"wrote {written} bytes then errno {error}",
            "written": written, "errno": error}


def escape(drop):
    """setsid + double fork; the grandchild empties its environment, goes non-dumpable and stays."""
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.close(read_end)
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: /proc/<pid> then belongs to root
            os.write(write_end, str(os.getpid()).encode())
            os.close(write_end)
            os.execve(sys.executable, [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"], {})
        os._exit(0)
    os.close(write_end)
    pid = int(os.read(read_end, 32))
    if drop:
        with open(os.path.join(drop, "escaped.pid"), "w") as f:
            f.write(str(pid))
    return {"succeeded": False, "detail": "escaped grandchild started (the test checks it dies)", "pid": pid}


def main():
    intent = json.loads(sys.stdin.readline())
    words = intent["text"].split()
    name, args = words[1], words[2:]
    daemon = os.getppid()
    if name == "read":
        report = read(args[0])
    elif name == "write":
        report = write(args[0])
    elif name == "create":
        report = create_in(args[0])
    elif name == "socket":
        report = socket_attack(args)
    elif name == "environ":
        report = read(f"/proc/{daemon}/environ")
    elif name == "mem":
        report = read(f"/proc/{daemon}/mem")
    elif name == "signal":
        report = attempt(lambda: os.kill(daemon, signal.SIGTERM))
    elif name == "writer":  # the audit writer process holds the daemon's key in its memory
        pid = int(args[0])
        report = {"mem": read(f"/proc/{pid}/mem"), "environ": read(f"/proc/{pid}/environ"),
                  "kill": attempt(lambda: os.kill(pid, signal.SIGKILL))}
        report["succeeded"] = any(step["succeeded"] for step in report.values())
    elif name == "forkbomb":
        report = fork_bomb()
    elif name == "shm":
        report = shm_filler(int(args[0]))
    elif name == "escape":
        report = escape(args[0] if args else None)
    elif name == "escape-and-wait":
        report = escape(args[0])
        time.sleep(600)
    else:
        report = {"succeeded": True, "detail": f"unknown attack {name}"}
    report["attack"] = name
    report["uid"] = os.getuid()
    report["rlimits"] = {n: list(resource.getrlimit(getattr(resource, n))) for n in ("RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_CPU", "RLIMIT_CORE")}
    sys.stderr.write("report " + json.dumps(report) + "\n")
    print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": json.dumps(report), "sources": []}), flush=True)


main()
