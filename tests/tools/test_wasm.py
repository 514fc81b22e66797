"""``runtime: wasm`` tools: real modules (built from WAT here) run by wasmtime in the agent's sandbox, both ABIs,
stopped by fuel and by their memory cap, nothing left running."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager

import pytest
import trio

from covenant.home import Home

from .conftest import Tools, confined
from .wasm_modules import RUN_ECHO, WASI_ECHO
from .test_process import marked_processes

wasmtime = pytest.importorskip("wasmtime", reason="wasm tools need the wasmtime package (a covenant dependency)")

SPIN = """(module (memory (export "memory") 1)
  (func (export "run") (param i32 i32 i32 i32) (result i32) (loop $forever (br $forever)) (i32.const 0)))"""

GREEDY = """(module (memory (export "memory") 1)
  (func (export "run") (param i32 i32 i32 i32) (result i32)
    (if (i32.lt_s (memory.grow (i32.const 8192)) (i32.const 0)) (then unreachable))
    (i32.const 0)))"""

IMPORTS_ENV = """(module (import "env" "peek" (func)) (memory (export "memory") 1)
  (func (export "run") (param i32 i32 i32 i32) (result i32) (i32.const 0)))"""


def wasm_tools(home: Home, **settings: object) -> AbstractAsyncContextManager[Tools]:
    """Tools whose agents run as uids of their own, their files confined (Landlock), under ``settings``. Needs root."""
    return confined(home, "wasm tools", **settings)


def wasm_package(tools: Tools, name: str, modules: dict[str, str], timeout_ms: int = 5000) -> object:
    files: dict[str, str] = {}
    for tool in modules:
        files[f"tools/{tool}.yaml"] = (f"name: {tool}\nversion: 0.1.0\nruntime: wasm\nmodule: tools/{tool}.wasm\n"
                                       f"timeout_ms: {timeout_ms}\n")
    folder = tools.tmp / "agents" / name / "tools"
    folder.mkdir(parents=True, exist_ok=True)
    folder.parent.chmod(0o755)
    folder.chmod(0o755)
    for tool, wat in modules.items():
        (folder / f"{tool}.wasm").write_bytes(wasmtime.wat2wasm(wat))
        (folder / f"{tool}.wasm").chmod(0o644)
    return tools.package(name, list(modules), files)


async def test_both_abis_round_trip_and_bad_modules_stop_cleanly(home: Home) -> None:
    # 2000 fuel per ms of a 5 s timeout: 10M, spent in well under a second
    async with wasm_tools(home, tools={"wasm": {"fuel_per_ms": 2_000}}) as tools:
        agent = wasm_package(tools, "wasmer", {"wasi_echo": WASI_ECHO, "run_echo": RUN_ECHO, "spin": SPIN,
                                               "greedy": GREEDY})
        assert sorted(t["function"]["name"] for t in tools.host.offered(agent)) == ["greedy", "run_echo", "spin", "wasi_echo"], tools.host.unavailable(agent)
        ctx = tools.ctx(agent, tools.grant("tool.*"))
        args = {"text": "héllo", "n": [1, 2.5, None], "nested": {"ok": True}}
        for name in ("wasi_echo", "run_echo"):
            result = await tools.host.call(ctx, name, json.dumps(args))
            assert result.ok, result
            assert result.content == args

        spun = await tools.host.call(ctx, "spin", {})
        assert (spun.ok, spun.error_code) == (False, "tool_failed"), spun
        assert "ran out of fuel (10000000 units" in spun.error_message
        greedy = await tools.host.call(ctx, "greedy", {})
        assert (greedy.ok, greedy.error_code) == (False, "tool_failed"), greedy
        assert "memory is capped at 256 MiB" in greedy.error_message
        assert [e["outcome"] for e in tools.audit.of("tool.call")] == ["ok", "ok", "error", "error"]
        # Gone, or going: on a loaded box the full suite once saw the runner of the last call still exiting
        # (releasing its 256 MiB) just after the call returned; it must be gone within seconds, never stay.
        deadline = trio.current_time() + 10
        while marked_processes(ctx.intent_id) and trio.current_time() < deadline:
            await trio.sleep(0.05)
        assert marked_processes(ctx.intent_id) == []


async def test_a_module_no_abi_fits_is_unavailable_with_the_reason(home: Home) -> None:
    async with wasm_tools(home) as tools:
        agent = wasm_package(tools, "odd", {"imports_env": IMPORTS_ENV, "run_echo": RUN_ECHO})
        (agent.root / "tools" / "empty.wasm").write_bytes(b"\0asm\x01\0\0\0")
        reasons = dict(tools.host.unavailable(agent))
        assert "imports nothing; it imports from env" in reasons["imports_env"]
        assert [t["function"]["name"] for t in tools.host.offered(agent)] == ["run_echo"]


async def test_an_interpreter_without_wasmtime_makes_wasm_tools_unavailable(home: Home) -> None:
    """/usr/bin/python3 (the distribution's) has no wasmtime: the reason says so and how to fix it."""
    async with wasm_tools(home, rune={"python": "/usr/bin/python3"}) as tools:
        agent = wasm_package(tools, "nowasm", {"run_echo": RUN_ECHO})
        reason = dict(tools.host.unavailable(agent))["run_echo"]
        assert "cannot import it" in reason and "pip install wasmtime" in reason, reason
