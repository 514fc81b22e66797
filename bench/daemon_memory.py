"""The daemon's resident memory at start and as dispatches accumulate (issue 17).

A real daemon on a throwaway home (the same set-up as ``daemon_dispatch.py``): its RSS 2 s after it
answers, then after every ``--every`` of ``--dispatches`` sequential dispatches of the echo agent
(rust-bin when cargo is on PATH, else python3), then after ``--idle`` seconds without work; and
beside it the RSS of its audit writer process (a second interpreter, counted apart: the goals are
the daemon's). Goals: ≤ 40 MB idle after start-up, ≤ 45 MB after 10,000 dispatches (issue 17);
daemon + writer ≤ 50 MB idle, ≤ 55 MB after 2,000 dispatches (issue 38).

Each row also gives PSS (``/proc/PID/smaps_rollup``: a page shared with N processes counts 1/N, so
the writer's libpython and libcrypto pages are split with the daemon — and with any other Python
on the box) and, read as root from ``/proc/PID/pagemap``, the two processes together: the distinct
physical pages either maps, the memory they would free between them.

    .venv/bin/python bench/daemon_memory.py [--dispatches N] [--every N] [--idle S] [--keep]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_dispatch import (  # noqa: E402
    DaemonCPU, daemon_once, granted_identity, install_agents, start_daemon, stop_and_clean, throwaway_home,
)
from covenant.config import RuntimeConfig  # noqa: E402


PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1000


def pss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        line = next(line for line in rollup if line.startswith("Pss:"))
    return int(line.split()[1]) / 1000


def page_frames(pid: int) -> set[int] | None:
    """The physical frames ``pid`` has resident (``/proc/PID/pagemap``); None without CAP_SYS_ADMIN
    (the frame numbers read as 0 then)."""
    frames: set[int] = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for mapping in maps:
            start, end = (int(bound, 16) for bound in mapping.split(None, 1)[0].split("-"))
            if mapping.rstrip().endswith("[vsyscall]"):
                continue
            pagemap.seek(start // PAGE * 8)
            entries = pagemap.read((end - start) // PAGE * 8)
            for entry in memoryview(entries).cast("Q"):
                if entry >> 63:  # present in RAM
                    frames.add(entry & ((1 << 55) - 1))
    return None if frames and frames <= {0} else frames


def together_mb(pids: list[int]) -> str:
    frames: set[int] = set()
    for pid in pids:
        own = page_frames(pid)
        if own is None:
            return "n/a"
        frames |= own
    return f"{len(frames) * PAGE / 1e6:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dispatches", type=int, default=10_000, help="sequential dispatches in all")
    parser.add_argument("--every", type=int, default=2_000, help="read RSS after every N dispatches")
    parser.add_argument("--idle", type=float, default=12.0, help="seconds without work before the last reading")
    parser.add_argument("--keep", action="store_true", help="keep the temp home afterwards")
    args = parser.parse_args()
    tmp, home, socket_path, env = throwaway_home("covenant-mem-")
    daemon = None
    try:
        identity = granted_identity(env)
        agents = install_agents(home, tmp, RuntimeConfig())
        agent = next((a for a in agents if a.runtime == "rust-bin"), None) or next(a for a in agents if a.runtime == "python3")
        daemon = start_daemon(env, socket_path, tmp / "daemon.log")
        writer = DaemonCPU(daemon.pid).writer  # the audit writer process, when this checkout has one

        def row(after: str) -> str:
            own = f"| {after} | {rss_mb(daemon.pid):.1f} | {pss_mb(daemon.pid):.1f} |"
            if writer is None:
                return own
            return own + f" {rss_mb(writer.pid):.1f} | {pss_mb(writer.pid):.1f} | {together_mb([daemon.pid, writer.pid])} |"

        time.sleep(2.0)
        print(f"daemon memory, {agent.runtime} echo agent, load {os.getloadavg()[0]:.2f}")
        head = "| after | daemon RSS (MB) | daemon PSS |"
        if writer is not None:
            head += " audit writer RSS | writer PSS | both, distinct pages |"
        print(head + "\n|---|---:|---:|" + ("---:|---:|---:|" if writer is not None else ""))
        print(row("start-up (2 s idle)"))
        for done in range(1, args.dispatches + 1):
            daemon_once(agent, identity, socket_path)
            if done % args.every == 0 or done == args.dispatches:
                print(row(f"{done:,} dispatches"), flush=True)
        time.sleep(args.idle)
        print(row(f"then {args.idle:g} s idle"))
        return 0
    finally:
        stop_and_clean([daemon], tmp, args.keep)


if __name__ == "__main__":
    raise SystemExit(main())
