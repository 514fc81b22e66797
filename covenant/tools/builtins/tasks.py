"""``rune@task-post|claim|complete|list``: a per-agent task board, and ``rune@event-publish``: its event log.

Stored by the daemon (:mod:`covenant.tools.agent_stores`, stores ``tasks`` and
``events``). Task records: ``{"op": "post", "id", "title", "detail", "at"}``,
``{"op": "claim", "id", "intent", "at"}``, ``{"op": "complete", "id", "result", "at"}``;
a task is ``open`` → ``claimed`` (by an intent) → ``done``. Event records:
``{"op": "event", "topic", "data", "at"}``. Limits: titles 1–200 bytes,
detail and result up to 4096, 1000 tasks not done and 10 000 task records
per agent; topics 1–128 of ``A-Za-z0-9._/-``, data up to 16 KiB, the
newest 1000 events kept.
"""

from __future__ import annotations

import json
import re
from typing import Any

import trio

from covenant.clock import iso_ms, now_ms
from covenant.tools.agent_stores import AgentStore, StoreKind
from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.result import RESULT_MAX_BYTES, ToolError

__all__ = ["TASKS", "EVENTS", "POST", "CLAIM", "COMPLETE", "LIST", "PUBLISH", "TOOLS"]

TITLE_MAX, DETAIL_MAX, OPEN_MAX, RECORDS_MAX = 200, 4096, 1000, 10_000
TOPIC = re.compile(r"^[A-Za-z0-9._/-]{1,128}$")
DATA_MAX, EVENTS_KEPT = 16 * 1024, 1000
_BUDGET = RESULT_MAX_BYTES - 2048
_ID = re.compile(r"^task-[1-9][0-9]{0,8}$")


def _size(value: Any) -> int:
    return len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else -1


def _task_check(record: dict[str, Any]) -> str | None:
    op, keys = record.get("op"), set(record)
    ok = type(record.get("at")) is int and isinstance(record.get("id"), str) and bool(_ID.match(record["id"]))
    if op == "post":
        ok = ok and keys == {"op", "id", "title", "detail", "at"} and 0 < _size(record["title"]) <= TITLE_MAX \
            and 0 <= _size(record["detail"]) <= DETAIL_MAX
    elif op == "claim":
        ok = ok and keys == {"op", "id", "intent", "at"} and 0 < _size(record["intent"]) <= 256
    elif op == "complete":
        ok = ok and keys == {"op", "id", "result", "at"} and 0 <= _size(record["result"]) <= DETAIL_MAX
    else:
        ok = False
    return None if ok else "a task record is post {op, id, title, detail, at}, claim {op, id, intent, at} or complete {op, id, result, at}"


def _event_check(record: dict[str, Any]) -> str | None:
    if (set(record) == {"op", "topic", "data", "at"} and record["op"] == "event" and isinstance(record["topic"], str)
            and TOPIC.match(record["topic"]) and 0 <= _size(record["data"]) <= DATA_MAX and type(record["at"]) is int):
        return None
    return "an event record is {op: event, topic, data, at} within the limits"


TASKS = StoreKind("tasks", _task_check)
EVENTS = StoreKind("events", _event_check)


def _board(store: AgentStore) -> dict[str, dict[str, Any]]:
    tasks: dict[str, dict[str, Any]] = {}
    for record in store.records:
        if record["op"] == "post":
            tasks[record["id"]] = {"id": record["id"], "title": record["title"], "detail": record["detail"],
                                   "status": "open", "posted_at": iso_ms(record["at"])}
        elif record["id"] in tasks:
            task = tasks[record["id"]]
            if record["op"] == "claim":
                task.update(status="claimed", claimed_by=record["intent"], claimed_at=iso_ms(record["at"]))
            else:
                task.update(status="done", result=record["result"], completed_at=iso_ms(record["at"]))
    return tasks


async def _open(call: BuiltinCall, kind: StoreKind) -> AgentStore:
    return await call.services.stores.open(kind, call.ctx.agent.id, call.ctx.intent_id, call.services.audit)


def _task(tasks: dict[str, dict[str, Any]], task_id: str) -> dict[str, Any]:
    task = tasks.get(task_id)
    if task is None:
        raise ToolError("unknown_task", f"no task {task_id!r} on this agent's board")
    return task


async def _post(call: BuiltinCall) -> dict[str, Any]:
    async with call.services.stores.lock(TASKS, call.ctx.agent.id):
        store = await _open(call, TASKS)
        tasks = _board(store)
        if sum(t["status"] != "done" for t in tasks.values()) >= OPEN_MAX or len(store.records) >= RECORDS_MAX:
            raise ToolError("store_full", f"this agent's board is full ({OPEN_MAX} tasks not done or {RECORDS_MAX} records)")
        task_id = f"task-{len(tasks) + 1}"
        record = {"op": "post", "id": task_id, "title": call.arguments["title"],
                  "detail": call.arguments.get("detail", ""), "at": now_ms()}
        await trio.to_thread.run_sync(store.append, record)
    return {"posted": True, "id": task_id, "status": "open"}


async def _claim(call: BuiltinCall) -> dict[str, Any]:
    async with call.services.stores.lock(TASKS, call.ctx.agent.id):
        store = await _open(call, TASKS)
        tasks = _board(store)
        if "id" in call.arguments:
            task = _task(tasks, call.arguments["id"])
        else:
            task = next((t for t in tasks.values() if t["status"] == "open"), None)
            if task is None:
                raise ToolError("unknown_task", "no open task on this agent's board")
        if task["status"] != "open":
            raise ToolError("task_not_open", f"task {task['id']} is {task['status']}, not open")
        if len(store.records) >= RECORDS_MAX:
            raise ToolError("store_full", f"this agent's board holds {RECORDS_MAX} records")
        record = {"op": "claim", "id": task["id"], "intent": call.ctx.intent_id, "at": now_ms()}
        await trio.to_thread.run_sync(store.append, record)
    return {"claimed": True, "id": task["id"], "title": task["title"], "detail": task["detail"]}


async def _complete(call: BuiltinCall) -> dict[str, Any]:
    async with call.services.stores.lock(TASKS, call.ctx.agent.id):
        store = await _open(call, TASKS)
        task = _task(_board(store), call.arguments["id"])
        if task["status"] == "done":
            raise ToolError("task_not_open", f"task {task['id']} is done already")
        if len(store.records) >= RECORDS_MAX:
            raise ToolError("store_full", f"this agent's board holds {RECORDS_MAX} records")
        record = {"op": "complete", "id": task["id"], "result": call.arguments.get("result", ""), "at": now_ms()}
        await trio.to_thread.run_sync(store.append, record)
    return {"completed": True, "id": task["id"]}


async def _list(call: BuiltinCall) -> dict[str, Any]:
    wanted = call.arguments.get("status")
    async with call.services.stores.lock(TASKS, call.ctx.agent.id):
        tasks = _board(await _open(call, TASKS))
    matching = [t for t in tasks.values() if wanted is None or t["status"] == wanted]
    shown: list[dict[str, Any]] = []
    used = 0
    for task in matching:
        used += len(json.dumps(task, ensure_ascii=False).encode())
        if used > _BUDGET:
            break
        shown.append(task)
    return {"tasks": shown, "count": len(matching), "truncated": len(shown) < len(matching)}


async def _publish(call: BuiltinCall) -> dict[str, Any]:
    topic = call.arguments["topic"]
    if not TOPIC.match(topic):
        raise ToolError("invalid_arguments", "topic must be 1-128 of A-Z a-z 0-9 . _ / -")
    data = call.arguments.get("data", "")
    if _size(data) > DATA_MAX:
        raise ToolError("invalid_arguments", f"data is over {DATA_MAX} bytes of UTF-8")
    async with call.services.stores.lock(EVENTS, call.ctx.agent.id):
        store = await _open(call, EVENTS)
        record = {"op": "event", "topic": topic, "data": data, "at": now_ms()}
        await trio.to_thread.run_sync(store.append, record)
        count = len(store.records)
        if count > 2 * EVENTS_KEPT:
            await trio.to_thread.run_sync(store.rewrite, store.records[-EVENTS_KEPT:])
    return {"published": True, "topic": topic, "at": iso_ms(record["at"])}


_TASK_ID = {"type": "string", "pattern": "^task-[1-9][0-9]{0,8}$", "description": "as task-post answered"}

POST = Builtin(
    name="rune@task-post",
    description="Post a task on this agent's task board (it starts open).",
    parameters={"type": "object", "properties": {"title": {"type": "string", "minLength": 1, "maxLength": TITLE_MAX},
                                                  "detail": {"type": "string", "maxLength": DETAIL_MAX}},
                "required": ["title"], "additionalProperties": False},
    run=_post,
)
CLAIM = Builtin(
    name="rune@task-claim",
    description="Claim an open task of this agent's board for the current request (without id: the oldest open one).",
    parameters={"type": "object", "properties": {"id": _TASK_ID}, "additionalProperties": False},
    run=_claim,
)
COMPLETE = Builtin(
    name="rune@task-complete",
    description="Mark a task done, with an optional result text.",
    parameters={"type": "object", "properties": {"id": _TASK_ID, "result": {"type": "string", "maxLength": DETAIL_MAX}},
                "required": ["id"], "additionalProperties": False},
    run=_complete,
)
LIST = Builtin(
    name="rune@task-list",
    description="List the tasks of this agent's board, oldest first, optionally only open, claimed or done ones.",
    parameters={"type": "object", "properties": {"status": {"enum": ["open", "claimed", "done"]}},
                "additionalProperties": False},
    run=_list,
)
PUBLISH = Builtin(
    name="rune@event-publish",
    description="Append an event (a topic and optional text data) to this agent's event log.",
    parameters={"type": "object", "properties": {"topic": {"type": "string", "minLength": 1, "maxLength": 128},
                                                  "data": {"type": "string", "maxLength": DATA_MAX}},
                "required": ["topic"], "additionalProperties": False},
    run=_publish,
)

TOOLS = (POST, CLAIM, COMPLETE, LIST, PUBLISH)
