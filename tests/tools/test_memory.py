"""rune@memory-*: persisted per agent by the daemon, hash-linked, verified before every load."""

from __future__ import annotations

import json
import os
import stat

import trio

from covenant.chainlog import append_records, read_chain
from covenant.manifest.model import AgentSpec
from covenant.tools.memory_store import MAX_KEYS, MEMORY_FORMAT, VALUE_MAX_BYTES, memory_dir

from .conftest import Tools

MEMORY_TOOLS = ["rune@memory-store", "rune@memory-recall", "rune@memory-list"]
ACTIONS = ("tool.memory_store", "tool.memory_recall", "tool.memory_list")


def memory_file(tools: Tools, agent: AgentSpec):
    return memory_dir(tools.home, agent.id) / "memory.jsonl"


async def test_store_recall_list_latest_wins(tools: Tools) -> None:
    agent = tools.package("rememberer", MEMORY_TOOLS)
    assert [t["function"]["name"] for t in tools.host.offered(agent)] == ["memory-store", "memory-recall", "memory-list"]
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    call = tools.host.call
    assert (await call(ctx, "memory-recall", {"key": "colour"})).content == {"found": False, "key": "colour"}
    assert (await call(ctx, "memory-store", '{"key": "colour", "value": "blue"}')).content["stored"] is True
    await call(ctx, "memory-store", {"key": "size", "value": "large"})
    await call(ctx, "memory-store", {"key": "colour", "value": "green"})
    recalled = await call(ctx, "memory-recall", {"key": "colour"})
    assert recalled.content["found"] and recalled.content["value"] == "green"
    listed = await call(ctx, "memory-list", "{}")
    assert listed.content == {"keys": ["colour", "size"], "count": 2, "truncated": False}
    path = memory_file(tools, agent)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path.parent.parent).st_mode) == 0o700
    assert [e["outcome"] for e in tools.audit.of("tool.call")] == ["ok"] * 6


async def test_memory_persists_across_hosts_and_is_per_agent(tools: Tools) -> None:
    one = tools.package("one", MEMORY_TOOLS)
    two = tools.package("two", MEMORY_TOOLS)
    grants = tools.grant(*ACTIONS)
    await tools.host.call(tools.ctx(one, grants), "memory-store", {"key": "k", "value": "from one"})
    fresh = tools.new_host()
    assert (await fresh.call(tools.ctx(one, grants), "memory-recall", {"key": "k"})).content["value"] == "from one"
    assert (await fresh.call(tools.ctx(two, grants), "memory-recall", {"key": "k"})).content["found"] is False


async def test_a_torn_tail_is_cut_and_reported(tools: Tools) -> None:
    agent = tools.package("torn", MEMORY_TOOLS)
    grants = tools.grant(*ACTIONS)
    await tools.host.call(tools.ctx(agent, grants), "memory-store", {"key": "a", "value": "kept"})
    path = memory_file(tools, agent)
    intact = path.read_bytes()
    torn = b'{"at":1,"key":"b","prev":"00'  # a write cut by a crash
    with open(path, "ab") as f:
        f.write(torn)
    fresh = tools.new_host()
    result = await fresh.call(tools.ctx(agent, grants), "memory-recall", {"key": "a"})
    assert result.content["value"] == "kept"
    assert path.read_bytes() == intact
    [recover] = tools.audit.of("memory.recover")
    assert recover["agent"] == "torn@local" and recover["discarded_bytes"] == len(torn) and recover["valid_bytes"] == len(intact)
    await fresh.call(tools.ctx(agent, grants), "memory-store", {"key": "b", "value": "after"})
    assert read_chain(path, {"format": MEMORY_FORMAT, "agent": agent.id}) is not None


async def test_a_changed_record_refuses_to_load(tools: Tools) -> None:
    agent = tools.package("tampered", MEMORY_TOOLS)
    grants = tools.grant(*ACTIONS)
    for key in ("a", "b", "c"):
        await tools.host.call(tools.ctx(agent, grants), "memory-store", {"key": key, "value": f"value {key}"})
    path = memory_file(tools, agent)
    original = path.read_bytes()
    path.write_bytes(original.replace(b"value b", b"value X"))
    tampered = path.read_bytes()
    fresh = tools.new_host()
    for name, args in (("memory-recall", {"key": "a"}), ("memory-list", {}), ("memory-store", {"key": "d", "value": "x"})):
        result = await fresh.call(tools.ctx(agent, grants), name, args)
        assert result.error_code == "memory_corrupt", result
        assert "line 3" in result.error_message
    assert path.read_bytes() == tampered  # nothing cut, nothing appended
    assert [e["outcome"] for e in tools.audit.of("tool.call")][-3:] == ["error"] * 3


async def test_reordered_records_and_a_foreign_file_refuse_to_load(tools: Tools) -> None:
    agent = tools.package("shuffled", MEMORY_TOOLS)
    other = tools.package("other", MEMORY_TOOLS)
    grants = tools.grant(*ACTIONS)
    for key in ("a", "b"):
        await tools.host.call(tools.ctx(agent, grants), "memory-store", {"key": key, "value": key})
        await tools.host.call(tools.ctx(other, grants), "memory-store", {"key": key, "value": key})
    path = memory_file(tools, agent)
    header, first, second = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(header + second + first)
    result = await tools.new_host().call(tools.ctx(agent, grants), "memory-recall", {"key": "a"})
    assert result.error_code == "memory_corrupt" and "reordered" in result.error_message
    path.write_bytes(memory_file(tools, other).read_bytes())
    result = await tools.new_host().call(tools.ctx(agent, grants), "memory-recall", {"key": "a"})
    assert result.error_code == "memory_corrupt" and "belongs elsewhere" in result.error_message


async def test_a_file_changed_under_a_running_host_is_verified_again(tools: Tools) -> None:
    agent = tools.package("watched", MEMORY_TOOLS)
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    await tools.host.call(ctx, "memory-store", {"key": "a", "value": "one"})
    path = memory_file(tools, agent)
    path.write_bytes(path.read_bytes().replace(b'"one"', b'"two"'))
    result = await tools.host.call(ctx, "memory-recall", {"key": "a"})
    assert result.error_code == "memory_corrupt"


async def test_caps_on_keys_values_and_count(tools: Tools) -> None:
    agent = tools.package("capped", MEMORY_TOOLS)
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    big = await tools.host.call(ctx, "memory-store", {"key": "k", "value": "x" * (VALUE_MAX_BYTES + 1)})
    assert big.error_code == "invalid_arguments" and str(VALUE_MAX_BYTES) in big.error_message
    wide = await tools.host.call(ctx, "memory-store", {"key": "é" * 100, "value": "v"})  # 100 chars, 200 bytes
    assert wide.error_code == "invalid_arguments"
    control = await tools.host.call(ctx, "memory-recall", {"key": "a\nb"})
    assert control.error_code == "invalid_arguments"
    # Fill the file to the key limit directly, then one more key is refused while an old one may change.
    path = memory_file(tools, agent)
    path.parent.mkdir(parents=True, mode=0o700)
    header = {"format": MEMORY_FORMAT, "agent": agent.id}
    append_records(path, None, header, [{"key": f"k{i}", "value": "v", "at": 1} for i in range(MAX_KEYS)])
    host = tools.new_host()
    full = await host.call(ctx, "memory-store", {"key": "one-more", "value": "v"})
    assert full.error_code == "memory_full"
    assert (await host.call(ctx, "memory-store", {"key": "k7", "value": "new"})).ok
    listed = await host.call(ctx, "memory-list", {})
    assert listed.content["count"] == MAX_KEYS and listed.content["keys"][0] == "k7"


async def test_superseded_records_are_compacted(tools: Tools) -> None:
    agent = tools.package("churn", MEMORY_TOOLS)
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    for i in range(100):
        assert (await tools.host.call(ctx, "memory-store", {"key": f"k{i % 3}", "value": str(i)})).ok
    lines = memory_file(tools, agent).read_bytes().count(b"\n")
    assert lines < 70
    fresh = tools.new_host()
    assert (await fresh.call(ctx, "memory-recall", {"key": "k0"})).content["value"] == "99"
    assert (await fresh.call(ctx, "memory-list", {})).content["keys"] == ["k0", "k2", "k1"]


async def test_concurrent_stores_all_land(tools: Tools) -> None:
    agent = tools.package("busy", MEMORY_TOOLS)
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(tools.host.call, ctx, "memory-store", {"key": f"k{i}", "value": str(i)})
    listed = await tools.new_host().call(ctx, "memory-list", {})
    assert listed.content["count"] == 20
    stores = [e for e in tools.audit.of("tool.call") if e["name"] == "memory-store"]
    assert len(stores) == 20 and all(e["outcome"] == "ok" for e in stores)


async def test_no_argument_text_in_the_audit(tools: Tools) -> None:
    agent = tools.package("secretive", MEMORY_TOOLS)
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    await tools.host.call(ctx, "memory-store", {"key": "api-note", "value": "s3cr3t-VALUE-123"})
    await tools.host.call(ctx, "memory-recall", {"key": "api-note"})
    dumped = json.dumps(tools.audit.events)
    assert "s3cr3t-VALUE-123" not in dumped and "api-note" not in dumped


async def test_memory_list_stays_under_the_result_cap(tools: Tools) -> None:
    agent = tools.package("wide", MEMORY_TOOLS)
    path = memory_file(tools, agent)
    path.parent.mkdir(parents=True, mode=0o700)
    header = {"format": MEMORY_FORMAT, "agent": agent.id}
    append_records(path, None, header, [{"key": f"{i:04d}" + "k" * 120, "value": "v", "at": 1} for i in range(MAX_KEYS)])
    listed = await tools.host.call(tools.ctx(agent, tools.grant(*ACTIONS)), "memory-list", {})
    assert listed.ok, listed
    assert listed.content["count"] == MAX_KEYS and listed.content["truncated"] is True
    assert 0 < len(listed.content["keys"]) < MAX_KEYS
    assert listed.content["keys"][0].startswith("0999")


async def test_a_well_chained_record_of_the_wrong_shape_refuses_to_load(tools: Tools) -> None:
    agent = tools.package("misshapen", MEMORY_TOOLS)
    path = memory_file(tools, agent)
    path.parent.mkdir(parents=True, mode=0o700)
    header = {"format": MEMORY_FORMAT, "agent": agent.id}
    append_records(path, None, header, [{"key": "ok", "value": "v", "at": 1}, {"value": "no key", "at": 2}])
    result = await tools.host.call(tools.ctx(agent, tools.grant(*ACTIONS)), "memory-list", {})
    assert result.error_code == "memory_corrupt" and "line 3" in result.error_message
    assert "exactly key, value and at" in result.error_message
