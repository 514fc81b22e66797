"""``rune@knowledge-add-entity``, ``rune@knowledge-add-relation``, ``rune@knowledge-query``: a per-agent graph.

Stored by the daemon (:mod:`covenant.tools.agent_stores`, store ``knowledge``).
Records: ``{"op": "entity", "name", "type", "observations", "at"}`` (adding an
entity again merges: a given type replaces the old one, observations are
added once each) and ``{"op": "relation", "from", "relation", "to", "at"}``.
Limits: names 1–128 bytes, types and relations 1–64, observations 1–1024
bytes and 64 per entity, 2000 entities and 10 000 relations per agent.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from covenant.clock import iso_ms, now_ms
from covenant.tools.agent_stores import AgentStore, StoreKind
from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.result import RESULT_MAX_BYTES, ToolError

__all__ = ["KIND", "ADD_ENTITY", "ADD_RELATION", "QUERY", "TOOLS"]

NAME_MAX, LABEL_MAX, OBSERVATION_MAX = 128, 64, 1024
OBSERVATIONS_PER_ENTITY, MAX_ENTITIES, MAX_RELATIONS = 64, 2000, 10_000
_BUDGET = RESULT_MAX_BYTES - 2048


def _text(value: Any, most: int) -> bool:
    return isinstance(value, str) and 0 < len(value.encode("utf-8", "surrogatepass")) <= most


def _check(record: dict[str, Any]) -> str | None:
    op = record.get("op")
    if op == "entity" and set(record) == {"op", "name", "type", "observations", "at"}:
        obs = record["observations"]
        if (_text(record["name"], NAME_MAX) and (record["type"] == "" or _text(record["type"], LABEL_MAX))
                and isinstance(obs, list) and len(obs) <= OBSERVATIONS_PER_ENTITY
                and all(_text(o, OBSERVATION_MAX) for o in obs) and type(record["at"]) is int):
            return None
    if op == "relation" and set(record) == {"op", "from", "relation", "to", "at"}:
        if (_text(record["from"], NAME_MAX) and _text(record["to"], NAME_MAX)
                and _text(record["relation"], LABEL_MAX) and type(record["at"]) is int):
            return None
    return "a knowledge record is an entity {op, name, type, observations, at} or a relation {op, from, relation, to, at} within the limits"


KIND = StoreKind("knowledge", _check)


def _graph(store: AgentStore) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str, str]]]:
    entities: dict[str, dict[str, Any]] = {}
    relations: dict[tuple[str, str, str], None] = {}
    for record in store.records:
        if record["op"] == "entity":
            old = entities.get(record["name"], {"type": "", "observations": []})
            observations = list(dict.fromkeys([*old["observations"], *record["observations"]]))
            entities[record["name"]] = {"type": record["type"] or old["type"], "observations": observations,
                                        "at": record["at"]}
        else:
            relations[(record["from"], record["relation"], record["to"])] = None
    return entities, list(relations)


async def _open(call: BuiltinCall) -> AgentStore:
    return await call.services.stores.open(KIND, call.ctx.agent.id, call.ctx.intent_id, call.services.audit)


async def _add_entity(call: BuiltinCall) -> dict[str, Any]:
    name = call.arguments["name"]
    kind = call.arguments.get("type", "")
    observations = list(dict.fromkeys(call.arguments.get("observations", [])))
    async with call.services.stores.lock(KIND, call.ctx.agent.id):
        store = await _open(call)
        entities, _ = _graph(store)
        old = entities.get(name)
        if old is None and len(entities) >= MAX_ENTITIES:
            raise ToolError("store_full", f"this agent's knowledge holds {MAX_ENTITIES} entities, the most allowed")
        new = [o for o in observations if old is None or o not in old["observations"]]
        total = len(new) + (len(old["observations"]) if old else 0)
        if total > OBSERVATIONS_PER_ENTITY:
            raise ToolError("store_full", f"an entity keeps at most {OBSERVATIONS_PER_ENTITY} observations; {name!r} would have {total}")
        record = {"op": "entity", "name": name, "type": kind, "observations": new, "at": now_ms()}
        await trio.to_thread.run_sync(store.append, record)
    return {"stored": True, "name": name, "created": old is None, "observations_added": len(new)}


async def _add_relation(call: BuiltinCall) -> dict[str, Any]:
    source, relation, target = call.arguments["from"], call.arguments["relation"], call.arguments["to"]
    async with call.services.stores.lock(KIND, call.ctx.agent.id):
        store = await _open(call)
        entities, relations = _graph(store)
        missing = [n for n in (source, target) if n not in entities]
        if missing:
            raise ToolError("unknown_entity", f"no entity named {missing[0]!r}; add it with knowledge-add-entity first")
        if (source, relation, target) in relations:
            return {"stored": False, "already_known": True}
        if len(relations) >= MAX_RELATIONS:
            raise ToolError("store_full", f"this agent's knowledge holds {MAX_RELATIONS} relations, the most allowed")
        record = {"op": "relation", "from": source, "relation": relation, "to": target, "at": now_ms()}
        await trio.to_thread.run_sync(store.append, record)
    return {"stored": True, "already_known": False}


def _matching_relations(arguments: dict[str, Any], relations: list[tuple[str, str, str]], limit: int) -> dict[str, Any]:
    """The relations matching every given filter of ``from``, ``relation``, ``to`` (exact)."""
    wanted = [arguments.get(key) for key in ("from", "relation", "to")]
    matches = [r for r in relations if all(w is None or w == got for w, got in zip(wanted, r))]
    shown = [{"from": f, "relation": r, "to": t} for f, r, t in matches[:limit]]
    return {"relations": shown, "relations_matched": len(matches)}


async def _query(call: BuiltinCall) -> dict[str, Any]:
    text = call.arguments.get("text", "").casefold()
    name = call.arguments.get("name")
    limit = call.arguments.get("limit", 20)
    async with call.services.stores.lock(KIND, call.ctx.agent.id):
        store = await _open(call)
        entities, relations = _graph(store)
    by_relation = {"from", "relation", "to"} & set(call.arguments)
    if by_relation and not text and name is None:
        return _matching_relations(call.arguments, relations, limit)
    found: list[dict[str, Any]] = []
    used = 0
    matches = [n for n, e in entities.items() if (name is None or n == name) and (
        not text or text in n.casefold() or text in e["type"].casefold() or any(text in o.casefold() for o in e["observations"]))]
    for entity_name in matches[:limit]:
        entity = entities[entity_name]
        item = {
            "name": entity_name, "type": entity["type"], "observations": entity["observations"],
            "updated_at": iso_ms(entity["at"]),
            "relations": [{"from": f, "relation": r, "to": t} for f, r, t in relations if entity_name in (f, t)][:50],
        }
        used += len(json.dumps(item, ensure_ascii=False).encode())
        if used > _BUDGET:
            break
        found.append(item)
    answer = {"entities": found, "matched": len(matches), "truncated": len(found) < len(matches)}
    return {**answer, **_matching_relations(call.arguments, relations, limit)} if by_relation else answer


_NAME = {"type": "string", "minLength": 1, "maxLength": NAME_MAX}
_LABEL = {"type": "string", "minLength": 1, "maxLength": LABEL_MAX}

ADD_ENTITY = Builtin(
    name="rune@knowledge-add-entity",
    description=("Add an entity to this agent's knowledge graph, or add observations to one already there "
                 "(a given type replaces the old one)."),
    parameters={
        "type": "object",
        "properties": {
            "name": _NAME, "type": _LABEL,
            "observations": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": OBSERVATION_MAX},
                             "maxItems": OBSERVATIONS_PER_ENTITY},
        },
        "required": ["name"],
        "additionalProperties": False,
    },
    run=_add_entity,
)

ADD_RELATION = Builtin(
    name="rune@knowledge-add-relation",
    description="Record that entity `from` stands in `relation` to entity `to` (both must exist).",
    parameters={
        "type": "object",
        "properties": {"from": _NAME, "relation": _LABEL, "to": _NAME},
        "required": ["from", "relation", "to"],
        "additionalProperties": False,
    },
    run=_add_relation,
)

QUERY = Builtin(
    name="rune@knowledge-query",
    description=("Find entities of this agent's knowledge graph by exact name and/or text found in their name, type "
                 "or observations (case-insensitive), with their relations; or find relations by `from`, "
                 "`relation` and/or `to` (exact)."),
    parameters={
        "type": "object",
        "properties": {"text": {"type": "string", "maxLength": 256}, "name": _NAME,
                       "from": _NAME, "relation": _LABEL, "to": _NAME,
                       "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
        "additionalProperties": False,
    },
    run=_query,
)

TOOLS = (ADD_ENTITY, ADD_RELATION, QUERY)
