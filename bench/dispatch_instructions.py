"""Instructions per dispatch: the daemon and its audit writer under callgrind, counted, not timed.

Wall and CPU times of the dispatch path move by ±3–5 % between runs on a shared 2-core box
(`dispatch_ab.py` prints how much); a change of 20–40 µs is below that. Instructions do not move
with the load: the same daemon gives the same count to within ≈ 0.5 %, whatever else runs. So this
bench starts the daemon under ``valgrind --tool=callgrind`` on a throwaway home with the rust-bin
echo agent, dispatches ``--warm`` intents, zeroes the counters of the daemon and its writer process,
dispatches ``--dispatches`` more one after the other, dumps, and prints user-space instructions per
dispatch for each process, with the shares of the few native costs worth knowing (Ed25519, JSON,
pydantic-core). ``--base PATH`` runs another checkout the same way first (a ``git worktree`` of the
old commit, on this venv) and prints the ratio.

What it does not see: the kernel's work (spawns, pipes, sockets, ``fdatasync``), and the time an
instruction takes (crypto runs at several per cycle, the interpreter at fewer than one). Read it
beside `dispatch_ab.py`, never instead of it.

Needs valgrind 3.20 or newer (3.19, Debian 12's, does not know ``pidfd_open``, which every spawn
uses); ``--valgrind`` names its binary. Debian's source tarball builds in ≈ 8 min on 2 cores::

    curl -O http://deb.debian.org/debian/pool/main/v/valgrind/valgrind_3.24.0.orig.tar.bz2
    tar xjf valgrind_3.24.0.orig.tar.bz2 && cd valgrind-3.24.0
    ./configure --prefix=/opt/valgrind && make -j2 && make install

    .venv/bin/python bench/dispatch_instructions.py [--valgrind /opt/valgrind/bin/valgrind]
        [--dispatches 200] [--warm 30] [--base PATH] [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_dispatch import (  # noqa: E402
    VENV_BIN, daemon_once, granted_identity, install_agents, stop_and_clean, throwaway_home,
)
from covenant.client import DaemonClient, DaemonUnreachable  # noqa: E402
from covenant.config import RuntimeConfig  # noqa: E402

# Native entry points whose inclusive share is printed: (label, pattern of callgrind_annotate's name).
NATIVE = (
    ("Ed25519 verify", r"Ed25519PublicKey>::__pymethod_verify__"),
    ("Ed25519 sign", r"Ed25519PrivateKey>::__pymethod_sign__"),
    ("pydantic-core", r"_pydantic_core\.cpython"),
    ("json (C)", r"_json\.cpython"),
)
WRITER = "covenant.audit.writer_process"


@dataclass
class Counted:
    """Instructions per dispatch of one process, and the native shares of them."""

    per_dispatch: float
    native: dict[str, float]


def valgrind_version(valgrind: str) -> tuple[int, int]:
    done = subprocess.run([valgrind, "--version"], capture_output=True, text=True)
    match = re.search(r"(\d+)\.(\d+)", done.stdout)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"{valgrind}: not a valgrind binary ({done.stderr.strip() or done.stdout.strip()})")
    return int(match.group(1)), int(match.group(2))


def control(valgrind: str, option: str, env: dict[str, str]) -> None:
    """``callgrind_control -z`` or ``-d`` for every callgrind process of this home.

    vgdb finds a process by the ``USER`` it runs with: the daemon has the home's, its writer
    process none (the daemon gives it ``PYTHONPATH`` and ``PATH`` only), so both are asked.
    """
    tool = str(Path(valgrind).with_name("callgrind_control"))
    for variant in (env, {k: v for k, v in env.items() if k != "USER"}):
        subprocess.run([tool, option], capture_output=True, env=variant, check=False)


def wait_ready(daemon: subprocess.Popen[bytes], socket_path: Path, log: Path) -> None:
    deadline = time.monotonic() + 600  # start-up under callgrind takes ≈ 30 s
    while True:
        try:
            with DaemonClient(socket_path, timeout=60) as client:
                client.request("GET", "/v1/status")
            return
        except DaemonUnreachable:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon under callgrind did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.5)


def annotate(valgrind: str, dump: Path) -> dict[str, int]:
    """Inclusive instructions of the :data:`NATIVE` entries in one dump."""
    tool = str(Path(valgrind).with_name("callgrind_annotate"))
    text = subprocess.run([tool, "--inclusive=yes", "--threshold=100", str(dump)], capture_output=True,
                          text=True, check=True).stdout
    found = dict.fromkeys((label for label, _ in NATIVE), 0)
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+) \(", line)
        if match is None:
            continue
        for label, pattern in NATIVE:
            # An object's functions nest (a pydantic-core function calling another): take the largest
            # entry of each object, which covers the rest; a named method is one entry anyway.
            if re.search(pattern, line):
                found[label] = max(found[label], int(match.group(1).replace(",", "")))
    return found


def count(valgrind: str, checkout: str | None, dispatches: int, warm: int, keep: bool) -> dict[str, Counted]:
    """Run one daemon under callgrind; instructions per dispatch of the daemon and of its writer."""
    home = throwaway_home("covenant-instr-", {"PYTHONPATH": checkout} if checkout else None)
    identity = granted_identity(home.env)
    agent = next(a for a in install_agents(home.home, home.tmp, RuntimeConfig()) if a.runtime == "rust-bin")
    out = home.tmp / "callgrind"
    out.mkdir()
    log = home.tmp / "daemon.log"
    # Children are traced so that the writer process is counted; the agents and the exec helpers
    # (run from /proc/self/fd) are not.
    argv = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p", "--trace-children=yes",
            "--trace-children-skip=/proc/*,*/echo-rs,/usr/bin/*,/sbin/*,/bin/*", str(VENV_BIN / "python"),
            "-m", "covenant", "daemon"]
    with open(log, "wb") as sink:
        daemon = subprocess.Popen(argv, env=home.env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_ready(daemon, home.socket_path, log)
        for _ in range(warm):
            daemon_once(agent, identity, home.socket_path)
        control(valgrind, "-z", home.env)
        for _ in range(dispatches):
            daemon_once(agent, identity, home.socket_path)
        control(valgrind, "-d", home.env)
        counted: dict[str, Counted] = {}
        for dump in sorted(out.glob("cg.*.1")):
            text = dump.read_text(errors="replace")
            command = re.search(r"^cmd: (.*)$", text, re.M)
            total = re.search(r"^summary: (\d+)$", text, re.M)
            if command is None or total is None:
                raise SystemExit(f"{dump}: not a callgrind dump")
            name = "writer" if WRITER in command.group(1) else "daemon"
            instructions = int(total.group(1))
            counted[name] = Counted(
                instructions / dispatches,
                {label: value / instructions for label, value in annotate(valgrind, dump).items()},
            )
        if set(counted) != {"daemon", "writer"}:
            raise SystemExit(f"expected dumps of the daemon and its writer, got {sorted(counted)} in {out}")
        return counted
    finally:
        stop_and_clean([daemon], home.tmp, keep)


def report(name: str, counted: dict[str, Counted]) -> None:
    for process, figures in counted.items():
        shares = ", ".join(f"{label} {share * 100:.1f} %" for label, share in figures.native.items() if share)
        print(f"| {name} | {process} | {figures.per_dispatch / 1e6:.3f} M | {shares} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--valgrind", default=shutil.which("valgrind") or "valgrind", help="valgrind ≥ 3.20")
    parser.add_argument("--dispatches", type=int, default=200, help="sequential dispatches counted")
    parser.add_argument("--warm", type=int, default=30, help="dispatches before the counters are zeroed")
    parser.add_argument("--base", help="another checkout to count first (e.g. a git worktree of the old commit)")
    parser.add_argument("--keep", action="store_true", help="keep the temp homes and their dumps")
    args = parser.parse_args()
    if valgrind_version(args.valgrind) < (3, 20):
        raise SystemExit(f"{args.valgrind} is older than 3.20, which has no pidfd_open: see this script's docstring")
    if args.base and not (Path(args.base) / "covenant" / "__init__.py").is_file():
        raise SystemExit(f"--base {args.base}: no covenant package there (make one with `git worktree add PATH REV`)")
    sides = [("base", os.path.abspath(args.base))] if args.base else []
    sides.append(("this", None))
    results = {name: count(args.valgrind, checkout, args.dispatches, args.warm, args.keep) for name, checkout in sides}
    print(f"rust-bin echo agent, {args.dispatches} sequential dispatches after {args.warm}; user-space instructions")
    print("| checkout | process | per dispatch | of which (inclusive) |")
    print("|---|---|---:|---|")
    for name, counted in results.items():
        report(name, counted)
    if args.base:
        for process in ("daemon", "writer"):
            ratio = results["this"][process].per_dispatch / results["base"][process].per_dispatch
            print(f"this/base, {process}: {ratio:.4f}")
        both = {name: sum(c.per_dispatch for c in counted.values()) for name, counted in results.items()}
        print(f"this/base, both: {both['this'] / both['base']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
