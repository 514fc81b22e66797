"""What running agents as other uids adds to a dispatch: the uid switch and the sweep.

Three measurements, each against the same work without isolation, in one
process with the two sides interleaved in small blocks (load from elsewhere
on the box hits both alike):

1. spawn: ``ProcessGroupLauncher.launch`` of ``/bin/true`` behind the gated
   exec helper, released, waited for and reaped; with credentials (the
   credentialed helper: read the block, setgroups/setgid/setuid, drop the
   capabilities, no_new_privs) against without.
2. sweep: what the last run of a uid pays after its tree is gone: the uid
   kill (a static helper as the uid doing ``kill(-1, SIGKILL)``), reaping
   adopted orphans, and emptying its private /tmp and /dev/shm; timed alone.
3. dispatch: ``Runner.run`` of the python3 echo agent with ``isolation: uid``
   (uid switch, private /tmp, RLIMIT_NPROC, the sweep) against
   ``isolation: same-uid``, both as the daemon runs them.

Goal (issue 12): at most 0.2 ms added by the uid switch and the sweep.
Needs root (or the unit's capabilities). Prints a Markdown table for
docs/performance.md.

    .venv/bin/python bench/isolation_overhead.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from covenant.config import IsolationConfig, RuntimeConfig  # noqa: E402
from covenant.manifest.model import AgentSpec  # noqa: E402
from covenant.runtime import _procfs, uidkill  # noqa: E402
from covenant.runtime.host import can_switch_uid, pdeathsig_wrapper, set_child_subreaper  # noqa: E402
from covenant.runtime.isolation import Isolation, open_isolation  # noqa: E402
from covenant.runtime.launcher import AgentCredentials, LaunchPlan, ProcessGroupLauncher  # noqa: E402
from covenant.runtime.pdeathsig import GATE_BYTE  # noqa: E402
from covenant.runtime.runner import Runner  # noqa: E402
from echo_agents import AGENTS  # noqa: E402

BLOCK = 10
RANGE = IsolationConfig(uid_range=(700000, 700999))
"""Not the default range: other covenant homes on a shared box sweep theirs."""
UID = 700500


async def spawn_once(launcher: ProcessGroupLauncher, plan: LaunchPlan) -> float:
    start = time.perf_counter()
    launched = launcher.launch(plan)
    os.write(launched.stdin.fileno(), GATE_BYTE)
    os.waitid(os.P_PID, launched.pid, os.WEXITED | os.WNOWAIT)
    status = launched.reap()
    elapsed = time.perf_counter() - start
    launched.close()
    assert status.exit_code == 0, status
    return elapsed


async def bench_spawn(runs: int) -> tuple[float, float]:
    launcher = ProcessGroupLauncher()
    plain = LaunchPlan(argv=("/bin/true",), env={}, cwd="/")
    switched = LaunchPlan(argv=("/bin/true",), env={}, cwd="/", credentials=AgentCredentials(UID, UID))
    for _ in range(20):
        await spawn_once(launcher, plain)
        await spawn_once(launcher, switched)
    a: list[float] = []
    b: list[float] = []
    while len(a) < runs:
        for _ in range(BLOCK):
            a.append(await spawn_once(launcher, plain))
        for _ in range(BLOCK):
            b.append(await spawn_once(launcher, switched))
    return statistics.median(a), statistics.median(b)


def bench_sweep(runs: int, scratch: Path) -> tuple[float, float, float]:
    """(usual-case check p50, uid kill p50, private /tmp collect p50) for a uid with nothing left running."""
    kills = []
    for _ in range(runs):
        start = time.perf_counter()
        assert uidkill.kill_uid(UID, UID)
        kills.append(time.perf_counter() - start)
    collects: list[float] = []
    checks: list[float] = []

    async def main() -> None:
        iso = open_isolation(RANGE, scratch / "state")
        async with Runner.open(RuntimeConfig(), scratch_root=scratch / "scratch", isolation=iso) as runner:
            spaces = runner.mount_namespaces
            if spaces is None:
                return
            spaces.namespace_for(UID, 8, [])
            for _ in range(runs):
                # What the last run of a uid pays when nothing escaped and nothing was left in /tmp.
                start = time.perf_counter()
                assert not any(_procfs.read_real_uid(pid) == UID for pid in runner.uids.strangers())
                assert not spaces.dirty(UID)
                checks.append(time.perf_counter() - start)
            for _ in range(runs):
                start = time.perf_counter()
                spaces.collect(UID)
                collects.append(time.perf_counter() - start)

    trio.run(main)
    nan = float("nan")
    return (statistics.median(checks) if checks else nan, statistics.median(kills),
            statistics.median(collects) if collects else nan)


def payload() -> dict:
    return {"id": str(uuid.uuid4()), "text": "hello", "issuer": {"display": "bench@host", "pubkey": ""},
            "issued_at": 0, "priority": "normal", "parent": None}


async def bench_dispatch(runs: int, scratch: Path) -> tuple[float, float]:
    entry = scratch / "echo.py"
    entry.write_bytes((AGENTS / "echo.py").read_bytes())
    spec = AgentSpec(id="echo@bench", name="echo", version="1", runtime="python3", kind="agent.toml",
                     manifest_path=scratch / "agent.toml", root=scratch, entry=entry)
    config = RuntimeConfig(python3="/usr/bin/python3")
    iso = open_isolation(RANGE, scratch / "state")
    async with Runner.open(config, scratch_root=scratch / "s1", isolation=Isolation.same_uid()) as same, \
            Runner.open(config, scratch_root=scratch / "s2", isolation=iso) as isolated:

        async def once(runner: Runner) -> float:
            start = time.perf_counter()
            record = await runner.run(spec, payload())
            elapsed = time.perf_counter() - start
            assert record.outcome == "ok", record
            return elapsed

        for _ in range(5):
            await once(same)
            await once(isolated)
        a: list[float] = []
        b: list[float] = []
        while len(a) < runs:
            for _ in range(BLOCK // 2):
                a.append(await once(same))
            for _ in range(BLOCK // 2):
                b.append(await once(isolated))
    return statistics.median(a), statistics.median(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs per side for spawn and sweep (dispatch: a quarter)")
    args = parser.parse_args()
    if not can_switch_uid():
        sys.exit("needs root (or CAP_SETUID, CAP_SETGID, CAP_KILL): agents only switch uid then")
    set_child_subreaper()
    wrapper = pdeathsig_wrapper(credentials=True)
    load = os.getloadavg()
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"credentialed helper: {'yes' if wrapper else 'no (Popen fallback)'}; {args.runs} runs per side")
    base = Path(tempfile.mkdtemp(prefix="covenant-bench-"))
    base.chmod(0o711)
    try:
        plain, switched = trio.run(bench_spawn, args.runs)
        check, kill, collect = bench_sweep(args.runs, base / "sweep")
        (base / "d").mkdir()
        (base / "d").chmod(0o711)
        same, isolated = trio.run(bench_dispatch, max(args.runs // 4, 20), base / "d")
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    print()
    print("| measured | without ms | with ms | added ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    print(f"| spawn of /bin/true, uid switch | {plain * 1000:.3f} | {switched * 1000:.3f} "
          f"| {(switched - plain) * 1000:+.3f} | {switched / plain:.3f} |")
    print(f"| sweep, usual case: no orphan of the uid, private /tmp empty | - | {check * 1000:.3f} "
          f"| {check * 1000:+.3f} | - |")
    print(f"| sweep: uid kill (helper as the uid, kill(-1)), when an orphan exists | - | {kill * 1000:.3f} "
          f"| {kill * 1000:+.3f} | - |")
    print(f"| sweep: empty the uid's private /tmp, /dev/shm, when not empty | - | {collect * 1000:.3f} "
          f"| {collect * 1000:+.3f} | - |")
    print(f"| dispatch of the python3 echo agent (Runner.run) | {same * 1000:.3f} | {isolated * 1000:.3f} "
          f"| {(isolated - same) * 1000:+.3f} | {isolated / same:.3f} |")


if __name__ == "__main__":
    main()
