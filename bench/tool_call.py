"""Tool host overhead: ``ToolHost.call`` of a process tool against a raw ``subprocess.run`` of it.

A python3 process tool that echoes its arguments (one JSON document in, one
out) is run with the same document both ways, sequentially, raw and through
the host interleaved in small blocks in one process so load from elsewhere on
the box hits both alike. The host path is everything the daemon does for a
call: name lookup, argument parsing and schema validation, the grant check,
the runner's tool mode (PDEATHSIG gate, limits, sampler, kill ladder), the
result cap and the ``tool.call`` event (to an in-memory sink: the audit
writer is measured by ``audit_throughput.py``). Also the p50 of a built-in
(``system-time``) call, which spawns nothing. Goal (issue 14): <= 2 ms p50
added to a process tool.

The same for the built-ins that do a host's work: ``shell-exec`` of
``echo hi`` against ``subprocess.run(["/bin/sh", "-c", "echo hi"])`` in the
workspace, and ``file-read`` / ``file-write`` of a 4 KiB file against a plain
``open``/``read``/``write`` of it (the host adds openat2 resolution, the
fstat checks, fchown of a created file, the thread hop off the event loop).

Process tools run only confined (their agent's uid and a Landlock ruleset,
docs/security.md "Tool files"), so this runs as root, with agent uids as the
daemon gives them. Last, what the Landlock ruleset adds to one run of the
tool: ``Runner.run_tool`` of the same tool without a ruleset, with the
runner's kept one (the cache: a run of the same agent and tool with a reused
scratch dir), and with one built for every run (cache capacity 0), interleaved;
and the build itself (~160 rules: the system's files, /etc entry by entry,
the package, the scratch dir) against a kept one's lookup, in a thread.

    sudo .venv/bin/python bench/tool_call.py [--runs N]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from covenant.clock import now_ms  # noqa: E402
from covenant.config import Config, IsolationConfig, RuntimeConfig  # noqa: E402
from covenant.home import Home  # noqa: E402
from covenant.homeinit import init_home  # noqa: E402
from covenant.keys import load_private_key, public_key_hex  # noqa: E402
from covenant.manifest.runefile import load_rune_package  # noqa: E402
from covenant.policy.grants import GrantStore  # noqa: E402
from covenant.runtime import landlock  # noqa: E402
from covenant.runtime.host import set_child_subreaper  # noqa: E402
from covenant.runtime.isolation import open_isolation  # noqa: E402
from covenant.runtime.runner import Runner  # noqa: E402
from covenant.runtime.tool_confinement import ToolConfinement  # noqa: E402
from covenant.runtime.tool_files import ToolFiles  # noqa: E402
from covenant.tools import ToolCallContext, ToolHost  # noqa: E402

BLOCK = 5
RANGE = IsolationConfig(uid_range=(701000, 701999))
ECHO = "import json, sys\njson.dump({'got': json.load(sys.stdin)}, sys.stdout)\n"
RUNEFILE = """\
name: bench
version: 0.1.0
instructions: bench
default_model: default
toolset: [echo, rune@system-time, rune@shell-exec, rune@file-read, rune@file-write]
models:
  model_mapping:
    default: m
"""
ARGUMENTS = {"texts": ["I love this", "This is terrible"], "n": 3}


def make_package(root: Path) -> Path:
    package = root / "agents" / "bench"
    (package / "tools").mkdir(parents=True, mode=0o755)
    (package / "Runefile").write_text(RUNEFILE)
    (package / "tools" / "echo.yaml").write_text("name: echo\nruntime: process\nmodule: tools/echo.py\n")
    (package / "tools" / "echo.py").write_text(ECHO)
    return package


def raw_once(argv: list[str], cwd: Path, env: dict[str, str], document: bytes) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, input=document, capture_output=True, cwd=cwd, env=env)
    elapsed = time.perf_counter() - start
    assert done.returncode == 0 and json.loads(done.stdout)["got"] == ARGUMENTS, done
    return elapsed


async def measure(root: Path, runs: int) -> dict[str, float]:
    home = Home(root / "home")
    home.root.mkdir()
    init_home(home)
    config = Config(runtime=RuntimeConfig(python3="/usr/bin/python3"))
    daemon_key = load_private_key(home.daemon_key_path)
    issuer = public_key_hex(Ed25519PrivateKey.generate())
    store = GrantStore(home.grants_path, daemon_key.public_key())
    store.add(daemon_key, issuer, ["tool.*"], None, None)
    grants = store.load()
    agent = load_rune_package(make_package(home.root)).to_agent_spec()
    events: list[tuple[str, dict[str, Any]]] = []

    async def sink(type_: str, data: dict[str, Any]) -> None:
        events.append((type_, data))

    isolation = open_isolation(RANGE, home.state_dir)
    async with Runner.open(config.runtime, scratch_root=home.state_dir / "scratch", isolation=isolation) as runner:
        if runner.tool_confinement.problem is not None:
            raise SystemExit(f"process tools do not run here: {runner.tool_confinement.problem}")
        host = ToolHost(home, config, runner, sink)
        await host.load(agent)
        argv = [runner.plans.interpreter("python3") or sys.executable, str(agent.root / "tools" / "echo.py")]
        env = {"PATH": config.runtime.path, "HOME": str(root), "LANG": "C.UTF-8"}
        document = json.dumps(ARGUMENTS).encode() + b"\n"

        async def host_once(name: str, arguments: Any = None) -> float:
            ctx = ToolCallContext("bench-intent", agent, issuer, grants, now_ms(), trio.current_time() + 60)
            start = time.perf_counter()
            result = await host.call(ctx, name, json.dumps(ARGUMENTS) if arguments is None else arguments)
            elapsed = time.perf_counter() - start
            assert result.ok, result
            return elapsed

        async def interleaved(raw: Any, hosted: Any) -> tuple[float, float]:
            for _ in range(3):
                raw()
                await hosted()
            raw_times: list[float] = []
            host_times: list[float] = []
            while len(raw_times) < runs:
                raw_times.extend(raw() for _ in range(BLOCK))
                for _ in range(BLOCK):
                    host_times.append(await hosted())
            return statistics.median(raw_times), statistics.median(host_times)

        out: dict[str, float] = {}
        out["raw_p50"], out["host_p50"] = await interleaved(
            lambda: raw_once(argv, agent.root, env, document), lambda: host_once("echo")
        )
        out["builtin_p50"] = statistics.median([await host_once("system-time", "{}") for _ in range(runs)])

        workspace = host.services.workspace(agent.id).root
        shell = ["/bin/sh", "-c", "echo hi"]

        def raw_shell() -> float:
            start = time.perf_counter()
            done = subprocess.run(shell, capture_output=True, cwd=workspace, env=env)
            assert done.stdout == b"hi\n"
            return time.perf_counter() - start

        out["shell_raw"], out["shell_host"] = await interleaved(
            raw_shell, lambda: host_once("shell-exec", {"command": "echo hi"})
        )
        text = "x" * 4096
        (workspace / "data.txt").write_text(text)
        creds = isolation.credentials_for(agent.id)
        assert creds is not None
        os.chown(workspace / "data.txt", creds.uid, creds.gid)  # the host reads only the agent's own files

        def raw_read() -> float:
            start = time.perf_counter()
            with open(workspace / "data.txt", "rb") as f:
                assert len(f.read(32768)) == 4096
            return time.perf_counter() - start

        def raw_write() -> float:
            start = time.perf_counter()
            with open(workspace / "raw-out.txt", "w") as f:
                f.write(text)
            return time.perf_counter() - start

        out["read_raw"], out["read_host"] = await interleaved(raw_read, lambda: host_once("file-read", {"path": "data.txt"}))
        out["write_raw"], out["write_host"] = await interleaved(
            raw_write, lambda: host_once("file-write", {"path": "out.txt", "content": text})
        )
        out.update(await landlock_cost(runner, agent, argv, document, runs))
    return out


async def landlock_cost(runner: Runner, agent: Any, argv: list[str], document: bytes, runs: int) -> dict[str, float]:
    """What a Landlock ruleset adds to one run: on the daemon's side, the ruleset handed to the launch from the
    event loop (the thread hop and the lookup of a kept one, or a build); in the tool, the CPU time of the
    python3 tool confined against unconfined (the kernel checks every file it opens), as one process each."""
    files = ToolFiles(read_only=(str(agent.root),))
    kept = runner.tool_confinement
    built_each_time = ToolConfinement(None, kept._interpreters, capacity=0)
    scratch = runner.scratch.make()

    async def handed(confinement: ToolConfinement) -> float:
        start = time.perf_counter()
        held = await trio.to_thread.run_sync(confinement.acquire, files, scratch)
        confinement.release(held)
        return time.perf_counter() - start

    out: dict[str, float] = {}
    for key, confinement in (("kept", kept), ("built", built_each_time)):
        await handed(confinement)
        out[f"hand_{key}"] = statistics.median([await handed(confinement) for _ in range(runs)])
    held = kept.acquire(files, scratch)
    out["rules"] = len(kept._system_files()[1].rules) + len(files.rules(scratch))

    def child_cpu(ruleset: int) -> float:
        def restrict() -> None:  # the same work in both children, but for landlock_restrict_self
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(38, 1, 0, 0, 0) != 0 or (ruleset >= 0 and libc.syscall(446, ruleset, 0) != 0):
                os._exit(70)

        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=agent.root,
                                   preexec_fn=restrict, pass_fds=(ruleset,) if ruleset >= 0 else ())
        assert process.stdin is not None
        process.stdin.write(document)
        process.stdin.close()
        _, status, usage = os.wait4(process.pid, 0)  # reaped here, for the kernel's CPU figure of this process
        process.returncode = os.waitstatus_to_exitcode(status)
        assert process.returncode == 0, process.returncode
        return usage.ru_utime + usage.ru_stime

    def cpu_times() -> tuple[float, float]:
        plain: list[float] = []
        confined: list[float] = []
        while len(plain) < runs:
            plain.extend(child_cpu(-1) for _ in range(BLOCK))
            confined.extend(child_cpu(held.fd) for _ in range(BLOCK))
        return statistics.median(plain), statistics.median(confined)

    out["cpu_plain"], out["cpu_confined"] = await trio.to_thread.run_sync(cpu_times)
    kept.release(held)
    built_each_time.close()
    os.rmdir(scratch)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60, help="sequential calls per side")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: process tools run only confined, as their agent's uid (docs/security.md)")
    set_child_subreaper()
    load = os.getloadavg()
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{args.runs} sequential calls per side")
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o711)  # agent uids reach the home's packages and scratch dirs
        m = trio.run(measure, Path(tmp), args.runs)
    print()
    print("| tool | raw p50 ms | host p50 ms | added ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| python3 process tool | {m['raw_p50'] * 1000:.2f} | {m['host_p50'] * 1000:.2f} "
        f"| {(m['host_p50'] - m['raw_p50']) * 1000:+.2f} | {m['host_p50'] / m['raw_p50']:.3f} |"
    )
    print(f"| built-in system-time | - | {m['builtin_p50'] * 1000:.3f} | - | - |")
    for label, key in (("shell-exec `echo hi`", "shell"), ("file-read 4 KiB", "read"), ("file-write 4 KiB", "write")):
        raw, hosted = m[f"{key}_raw"], m[f"{key}_host"]
        print(f"| {label} | {raw * 1000:.3f} | {hosted * 1000:.3f} | {(hosted - raw) * 1000:+.3f} | {hosted / raw:.2f} |")
    print()
    print(f"Landlock (ABI {landlock.abi_version()}, {m['rules']} rules) per run of the process tool, p50:")
    print(f"- the ruleset handed to the launch from the loop: kept {m['hand_kept'] * 1e6:.0f} us, "
          f"built for the run {m['hand_built'] * 1e6:.0f} us (a worker-thread hop either way)")
    print(f"- the tool's CPU time: unconfined {m['cpu_plain'] * 1000:.2f} ms, confined {m['cpu_confined'] * 1000:.2f} ms "
          f"({(m['cpu_confined'] - m['cpu_plain']) * 1000:+.2f} ms)")


if __name__ == "__main__":
    main()
