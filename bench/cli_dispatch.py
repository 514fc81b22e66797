"""`covenant dispatch` end to end against `python -c pass`, interleaved, on a real daemon (issue 38).

On a throwaway home (`covenant init`, the rust-bin echo agent, or the python3 one without cargo,
granted to the bench identity) with a real `covenant daemon`, each round runs, one after the other:

1. `.venv/bin/python -c pass`: the interpreter's own start-up, the baseline of the ratio;
2. `covenant dispatch --agent ID TEXT` of this checkout, with `COVENANT_SOCKET` set (as the other
   daemon benches run it) and without it (a plain user's case: the CLI reads covenant.toml to find
   the socket);
3. the same two of another checkout when `--base PATH` names one (its `covenant` package on
   `PYTHONPATH`; the venv stays this one's), for a before/after from one run.

Printed: p50 wall and CPU (user+sys of the process, the agent excluded: it is the daemon's child)
per command and the ratio of each p50 wall to `python -c pass`'s. With `--instructions`, also the
user-space instructions of one run of each under callgrind (valgrind): they do not move with the
load the way times do, so they are the figure to compare on a shared box.

Goal (issue 38): `covenant dispatch` end to end at most 3x `python -c pass`.

    .venv/bin/python bench/cli_dispatch.py [--rounds N] [--base PATH] [--instructions] [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_dispatch import (  # noqa: E402
    COVENANT,
    VENV_BIN,
    granted_identity,
    install_agents,
    start_daemon,
    stop_and_clean,
    throwaway_home,
)

from covenant.config import RuntimeConfig  # noqa: E402

TEXT = "hello from the bench"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(argv: list[str], env: dict[str, str], expect: str | None) -> tuple[float, float]:
    """(wall s, CPU s) of one process; it must exit 0 and, when ``expect`` is given, print it."""
    cpu_before = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0 or (expect is not None and done.stdout.strip() != expect):
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}")
    return wall, _children_cpu() - cpu_before


def _instructions(argv: list[str], env: dict[str, str], valgrind: str) -> int:
    """User-space instructions of one run of ``argv`` under callgrind (the process only, not its children)."""
    done = subprocess.run([valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
                          env=env, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"callgrind of {' '.join(argv)} failed: {done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (default 30)")
    parser.add_argument("--base", type=Path, help="another checkout (e.g. a git worktree of an older commit)")
    parser.add_argument("--instructions", action="store_true", help="also count instructions under callgrind")
    parser.add_argument("--keep", action="store_true", help="keep the temp home afterwards")
    args = parser.parse_args()
    valgrind = shutil.which("valgrind") if args.instructions else None
    if args.instructions and valgrind is None:
        raise SystemExit("--instructions needs valgrind (apt install valgrind)")

    tmp, home, socket_path, env = throwaway_home("covenant-cli-")
    daemon = None
    try:
        granted_identity(env)
        agents = install_agents(home, tmp, RuntimeConfig())
        agent = next((a for a in agents if a.runtime == "rust-bin"), agents[0])
        daemon = start_daemon(env, socket_path, tmp / "daemon.log")
        dispatch = [str(VENV_BIN / "python"), str(COVENANT), "dispatch", "--agent", agent.agent_id, TEXT]
        without_socket = {k: v for k, v in env.items() if k != "COVENANT_SOCKET"}
        # The default socket path is where the daemon listens: the CLI finds it through covenant.toml.
        if socket_path != home / "run" / "covenant.sock":
            (home / "run").mkdir(exist_ok=True)
            link = home / "run" / "covenant.sock"
            if not link.exists():
                link.symlink_to(socket_path)
        checkouts: list[tuple[str, dict[str, str]]] = [("this checkout", {})]
        if args.base is not None:
            checkouts.insert(0, (f"base {args.base}", {"PYTHONPATH": str(args.base.resolve())}))
        commands: dict[str, tuple[list[str], dict[str, str], str | None]] = {
            "`python -c pass`": ([str(VENV_BIN / "python"), "-c", "pass"], env, None)}
        for label, extra in checkouts:
            commands[f"dispatch, {label}, COVENANT_SOCKET set"] = (dispatch, {**env, **extra}, TEXT)
            commands[f"dispatch, {label}, socket from covenant.toml"] = (dispatch, {**without_socket, **extra}, TEXT)

        load = os.getloadavg()
        print(f"covenant dispatch CLI bench  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  nproc={os.cpu_count()}  "
              f"load={load[0]:.2f},{load[1]:.2f},{load[2]:.2f}  rounds={args.rounds}  agent={agent.agent_id}")
        walls: dict[str, list[float]] = {name: [] for name in commands}
        cpus: dict[str, list[float]] = {name: [] for name in commands}
        for round_number in range(args.rounds + 3):  # 3 warm-up rounds: page cache, .pyc files
            for name, (argv, run_env, expect) in commands.items():
                wall, cpu = _run(argv, run_env, expect)
                if round_number >= 3:
                    walls[name].append(wall)
                    cpus[name].append(cpu)
        counts = {name: _instructions(argv, run_env, valgrind) for name, (argv, run_env, _) in commands.items()} \
            if valgrind else {}

        base_wall = statistics.median(walls["`python -c pass`"])
        base_count = counts.get("`python -c pass`")
        print()
        print("| command | p50 wall (ms) | × `python -c pass` | p50 CPU (ms) |"
              + (" instructions (M) | × `python -c pass` |" if counts else ""))
        print("|---|---:|---:|---:|" + ("---:|---:|" if counts else ""))
        for name in commands:
            wall = statistics.median(walls[name])
            line = f"| {name} | {wall * 1000:.1f} | {wall / base_wall:.2f} | {statistics.median(cpus[name]) * 1000:.1f} |"
            if counts and base_count:
                line += f" {counts[name] / 1e6:.1f} | {counts[name] / base_count:.2f} |"
            print(line)
        load_end = os.getloadavg()
        print(f"\nload average at the end: {load_end[0]:.2f}, {load_end[1]:.2f}, {load_end[2]:.2f}")
        return 0
    finally:
        stop_and_clean([daemon], tmp, args.keep)


if __name__ == "__main__":
    sys.exit(main())
