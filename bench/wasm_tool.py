"""Wasm tool calls: ``ToolHost.call`` of a ``runtime: wasm`` tool against the same module run directly.

Issue 37's figure: a wasm tool call, p50, over the same work done directly; goal <= 1.2x. Both ABIs are
measured with an echo module (built here from WAT): a WASI command (``_start``, the arguments document on
stdin, the answer on stdout) and the reference runtime's ``run(input_ptr, input_len, output_ptr,
output_max)`` export.

The direct run is what covenant's runner does minus covenant: a fresh ``[rune] python`` process (default
this interpreter) that imports wasmtime, compiles the module with fuel on, instantiates it and runs it
with the same document, from a plain ``subprocess.run``. The hosted call is everything a Rune agent's call
costs the daemon: name lookup, argument validation, the grant check, the runner's tool mode (the agent's
uid, its private /tmp and network namespace, the Landlock ruleset, PDEATHSIG gate, limits, CPU group,
sampler, kill ladder) around covenant's wasm runner under the same interpreter, and the ``tool.call``
event (to an in-memory sink). The two run interleaved in blocks of five so load from elsewhere on the box
hits both alike. Needs root (wasm tools run only confined, as agent uids).

    sudo .venv/bin/python bench/wasm_tool.py [--runs N]
"""

from __future__ import annotations

import argparse
import importlib.metadata
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
import wasmtime

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from covenant.clock import now_ms  # noqa: E402
from covenant.config import Config, IsolationConfig  # noqa: E402
from covenant.home import Home  # noqa: E402
from covenant.homeinit import init_home  # noqa: E402
from covenant.keys import load_private_key, public_key_hex  # noqa: E402
from covenant.manifest.runefile import load_rune_package  # noqa: E402
from covenant.policy.grants import GrantStore  # noqa: E402
from covenant.runtime.isolation import open_isolation  # noqa: E402
from covenant.runtime.runner import Runner  # noqa: E402
from covenant.tools import ToolCallContext, ToolHost  # noqa: E402
from tests.tools.wasm_modules import RUN_ECHO, WASI_ECHO  # noqa: E402

BLOCK = 5
RANGE = IsolationConfig(uid_range=(702000, 702999))
ARGUMENTS = {"texts": ["I love this", "This is terrible"], "n": 3}

# The same work without covenant: compile with fuel, instantiate, run with the document, answer on stdout.
DIRECT = r"""
import sys, wasmtime
path, abi = sys.argv[1], sys.argv[2]
config = wasmtime.Config()
config.consume_fuel = True
engine = wasmtime.Engine(config)
store = wasmtime.Store(engine)
store.set_fuel(10_000_000)
module = wasmtime.Module.from_file(engine, path)
if abi == "wasi":
    wasi = wasmtime.WasiConfig()
    wasi.inherit_stdin()
    wasi.inherit_stdout()
    store.set_wasi(wasi)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    linker.instantiate(store, module).exports(store)["_start"](store)
else:
    document = sys.stdin.buffer.read()
    exports = wasmtime.Instance(store, module, []).exports(store)
    memory = exports["memory"]
    base = memory.data_len(store)
    memory.grow(store, 2)
    memory.write(store, document, base)
    written = exports["run"](store, base, len(document), base + 65536, 65536)
    sys.stdout.buffer.write(memory.read(store, base + 65536, base + 65536 + written))
"""


def make_package(root: Path) -> Path:
    package = root / "agents" / "wasmbench"
    (package / "tools").mkdir(parents=True)
    (package / "Runefile").write_text(
        "name: wasmbench\nversion: 0.1.0\ninstructions: bench\ndefault_model: default\n"
        "toolset: [wasi_echo, run_echo]\nmodels:\n  model_mapping:\n    default: m\n"
    )
    for name, wat in (("wasi_echo", WASI_ECHO), ("run_echo", RUN_ECHO)):
        (package / "tools" / f"{name}.wasm").write_bytes(wasmtime.wat2wasm(wat))
        (package / "tools" / f"{name}.yaml").write_text(
            f"name: {name}\nversion: 0.1.0\nruntime: wasm\nmodule: tools/{name}.wasm\ntimeout_ms: 10000\n")
    for folder, _, files in os.walk(root):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    return package


def direct_once(python: str, module: Path, abi: str, document: bytes) -> float:
    start = time.perf_counter()
    done = subprocess.run([python, "-I", "-c", DIRECT, str(module), abi], input=document, capture_output=True,
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    elapsed = time.perf_counter() - start
    assert done.returncode == 0 and json.loads(done.stdout) == ARGUMENTS, done
    return elapsed


async def measure(root: Path, runs: int) -> dict[str, float]:
    home = Home(root / "home")
    home.root.mkdir()
    init_home(home)
    config = Config()
    python = config.rune.python or sys.executable
    daemon_key = load_private_key(home.daemon_key_path)
    issuer = public_key_hex(Ed25519PrivateKey.generate())
    store = GrantStore(home.grants_path, daemon_key.public_key())
    store.add(daemon_key, issuer, ["tool.*"], None, None)
    grants = store.load()
    package = make_package(home.root)
    agent = load_rune_package(package).to_agent_spec()
    events: list[tuple[str, dict[str, Any]]] = []

    async def sink(type_: str, data: dict[str, Any]) -> None:
        events.append((type_, data))

    isolation = open_isolation(RANGE, home.state_dir)
    document = json.dumps(ARGUMENTS).encode() + b"\n"
    out: dict[str, float] = {}
    async with Runner.open(config.runtime, scratch_root=home.state_dir / "scratch", isolation=isolation,
                           rune=config.rune) as runner:
        host = ToolHost(home, config, runner, sink)
        await host.load(agent)
        offered = sorted(t["function"]["name"] for t in host.offered(agent))
        if offered != ["run_echo", "wasi_echo"]:
            raise SystemExit(f"wasm tools do not run here: {host.unavailable(agent)}")

        async def host_once(name: str) -> float:
            ctx = ToolCallContext("bench-intent", agent, issuer, grants, now_ms(), trio.current_time() + 60)
            start = time.perf_counter()
            result = await host.call(ctx, name, json.dumps(ARGUMENTS))
            elapsed = time.perf_counter() - start
            assert result.ok and result.content == ARGUMENTS, result
            return elapsed

        for name, abi in (("wasi_echo", "wasi"), ("run_echo", "run")):
            module = package / "tools" / f"{name}.wasm"
            for _ in range(3):
                direct_once(python, module, abi, document)
                await host_once(name)
            direct: list[float] = []
            hosted: list[float] = []
            while len(direct) < runs:
                direct.extend(direct_once(python, module, abi, document) for _ in range(BLOCK))
                for _ in range(BLOCK):
                    hosted.append(await host_once(name))
            out[f"{abi}_direct_p50"] = statistics.median(direct)
            out[f"{abi}_host_p50"] = statistics.median(hosted)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60, help="calls of each kind per ABI (default 60)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("wasm tools run only confined, as agent uids: run as root")
    with tempfile.TemporaryDirectory(prefix="wasmbench-") as tmp:
        os.chmod(tmp, 0o755)
        figures = trio.run(measure, Path(tmp), args.runs)
    print(f"python {platform.python_version()}, wasmtime {importlib.metadata.version('wasmtime')}, "
          f"load {os.getloadavg()[0]:.2f} at the end, {args.runs} calls of each kind per ABI")
    for abi, label in (("wasi", "WASI command (_start)"), ("run", "run(input_ptr, input_len, output_ptr, output_max)")):
        direct, hosted = figures[f"{abi}_direct_p50"] * 1000, figures[f"{abi}_host_p50"] * 1000
        print(f"{label:<52} direct p50 {direct:7.1f} ms   tool call p50 {hosted:7.1f} ms   ratio {hosted / direct:.2f}x")


if __name__ == "__main__":
    main()
