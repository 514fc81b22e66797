"""``rune@memory-store``, ``rune@memory-recall``, ``rune@memory-list``: per-agent key/value memory.

Stored by the daemon (:mod:`covenant.tools.memory_store`); the replica never
sees the file. Limits: keys 1–128 bytes without control characters, values
at most 16 KiB, at most 1000 keys per agent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from covenant.chainlog import TornTail
from covenant.clock import iso_ms
from covenant.tools.builtins.base import NO_ARGUMENTS, Builtin, BuiltinCall
from covenant.tools.memory_store import KEY_MAX_BYTES, MAX_KEYS, MEMORY_RECOVER, VALUE_MAX_BYTES, AgentMemory, check_key
from covenant.tools.result import RESULT_MAX_BYTES, ToolError

__all__ = ["STORE", "RECALL", "LIST", "TOOLS"]

_LIST_BUDGET = RESULT_MAX_BYTES - 1024
"""memory-list stops adding keys before its result reaches the cap."""

_KEY_SCHEMA = {"type": "string", "minLength": 1, "maxLength": KEY_MAX_BYTES, "description": "the name to store under"}


async def _open(call: BuiltinCall) -> AgentMemory:
    agent_id = call.ctx.agent.id

    async def report(path: Path, torn: TornTail) -> None:
        await call.services.audit(
            MEMORY_RECOVER,
            {
                "agent": agent_id,
                "intent": call.ctx.intent_id,
                "path": str(path),
                "valid_bytes": torn.valid_bytes,
                "discarded_bytes": torn.discarded_bytes,
                "discarded_sha256": torn.discarded_sha256,
            },
        )

    return await call.services.memory.open(agent_id, report)


async def _store(call: BuiltinCall) -> dict[str, Any]:
    key, value = call.arguments["key"], call.arguments["value"]
    check_key(key)
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > VALUE_MAX_BYTES:
        raise ToolError("invalid_arguments", f"value is {size} bytes of UTF-8, over the {VALUE_MAX_BYTES}-byte limit")
    async with call.services.memory.lock(call.ctx.agent.id):
        memory = await _open(call)
        record = await trio.to_thread.run_sync(memory.store, key, value)
    return {"stored": True, "key": key, "stored_at": iso_ms(record["at"])}


async def _recall(call: BuiltinCall) -> dict[str, Any]:
    key = call.arguments["key"]
    check_key(key)
    async with call.services.memory.lock(call.ctx.agent.id):
        memory = await _open(call)
        record = memory.latest.get(key)
    if record is None:
        return {"found": False, "key": key}
    return {"found": True, "key": key, "value": record["value"], "stored_at": iso_ms(record["at"])}


async def _list(call: BuiltinCall) -> dict[str, Any]:
    async with call.services.memory.lock(call.ctx.agent.id):
        memory = await _open(call)
        keys = list(reversed(memory.latest))  # most recently stored first
    shown: list[str] = []
    used = 0
    for key in keys:
        used += len(json.dumps(key, ensure_ascii=False).encode()) + 1
        if used > _LIST_BUDGET:
            break
        shown.append(key)
    return {"keys": shown, "count": len(keys), "truncated": len(shown) < len(keys)}


STORE = Builtin(
    name="rune@memory-store",
    description=(
        "Remember a value under a key, across conversations (this agent only). Storing a key again replaces its "
        f"value. Keys up to {KEY_MAX_BYTES} bytes, values up to {VALUE_MAX_BYTES} bytes, at most {MAX_KEYS} keys."
    ),
    parameters={
        "type": "object",
        "properties": {"key": _KEY_SCHEMA, "value": {"type": "string", "description": "the text to remember"}},
        "required": ["key", "value"],
        "additionalProperties": False,
    },
    run=_store,
)

RECALL = Builtin(
    name="rune@memory-recall",
    description="Recall the value last stored under a key (found: false when there is none).",
    parameters={
        "type": "object",
        "properties": {"key": _KEY_SCHEMA},
        "required": ["key"],
        "additionalProperties": False,
    },
    run=_recall,
)

LIST = Builtin(
    name="rune@memory-list",
    description="List the keys in this agent's memory, most recently stored first.",
    parameters=NO_ARGUMENTS,
    run=_list,
)

TOOLS = (STORE, RECALL, LIST)
