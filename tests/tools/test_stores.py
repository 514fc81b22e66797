"""rune@knowledge-*, rune@task-*, rune@event-publish: per-agent chain stores kept by the daemon, verified before use."""

from __future__ import annotations

import json
import os
import stat

from covenant.tools.builtins.knowledge import MAX_ENTITIES

from .conftest import Tools

KNOWLEDGE = ["rune@knowledge-add-entity", "rune@knowledge-add-relation", "rune@knowledge-query"]
TASKS = ["rune@task-post", "rune@task-claim", "rune@task-complete", "rune@task-list", "rune@event-publish"]
ACTIONS = ("tool.knowledge_add_entity", "tool.knowledge_add_relation", "tool.knowledge_query", "tool.task_post",
           "tool.task_claim", "tool.task_complete", "tool.task_list", "tool.event_publish")


async def test_knowledge_graph_round_trip_and_persistence(tools: Tools) -> None:
    agent = tools.package("scholar", KNOWLEDGE)
    assert [t["function"]["name"] for t in tools.host.offered(agent)] == [
        "knowledge-add-entity", "knowledge-add-relation", "knowledge-query"]
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    call = tools.host.call
    assert (await call(ctx, "knowledge-add-entity", {"name": "Ada", "type": "person", "observations": ["wrote notes"]})).content["created"]
    merged = await call(ctx, "knowledge-add-entity", {"name": "Ada", "observations": ["wrote notes", "liked maths"]})
    assert merged.content == {"stored": True, "name": "Ada", "created": False, "observations_added": 1}
    refused = await call(ctx, "knowledge-add-relation", {"from": "Ada", "relation": "worked_with", "to": "Charles"})
    assert refused.error_code == "unknown_entity"
    await call(ctx, "knowledge-add-entity", {"name": "Charles", "type": "person"})
    assert (await call(ctx, "knowledge-add-relation", {"from": "Ada", "relation": "worked_with", "to": "Charles"})).content["stored"]
    found = (await tools.new_host().call(ctx, "knowledge-query", {"text": "MATHS"})).content
    assert found["matched"] == 1
    [ada] = found["entities"]
    assert ada["type"] == "person" and ada["observations"] == ["wrote notes", "liked maths"]
    assert ada["relations"] == [{"from": "Ada", "relation": "worked_with", "to": "Charles"}]
    path = tools.home.state_dir / "knowledge" / agent.id / "knowledge.jsonl"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert (await call(ctx, "knowledge-add-entity", {"name": "x", "extra": 1})).error_code == "invalid_arguments"
    assert MAX_ENTITIES == 2000


async def test_a_changed_record_makes_the_store_refuse_to_load(tools: Tools) -> None:
    agent = tools.package("tampered", KNOWLEDGE)
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    await tools.host.call(ctx, "knowledge-add-entity", {"name": "secret", "observations": ["blue"]})
    path = tools.home.state_dir / "knowledge" / agent.id / "knowledge.jsonl"
    path.write_bytes(path.read_bytes().replace(b"blue", b"gold"))
    result = await tools.host.call(ctx, "knowledge-query", {})
    assert result.error_code == "store_corrupt" and "line 2" in result.error_message
    # A torn tail (a cut write) is cut and reported, the rest still loads.
    other = tools.package("torn", KNOWLEDGE)
    octx = tools.ctx(other, tools.grant(*ACTIONS))
    await tools.host.call(octx, "knowledge-add-entity", {"name": "kept"})
    opath = tools.home.state_dir / "knowledge" / other.id / "knowledge.jsonl"
    with open(opath, "ab") as f:
        f.write(b'{"at":1,"op":"ent')
    fresh = tools.new_host()
    assert [e["name"] for e in (await fresh.call(octx, "knowledge-query", {})).content["entities"]] == ["kept"]
    [recover] = tools.audit.of("store.recover")
    assert recover["store"] == "knowledge" and recover["discarded_bytes"] == len(b'{"at":1,"op":"ent')


async def test_a_well_chained_record_of_the_wrong_shape_is_corrupt(tools: Tools) -> None:
    from covenant.chainlog import append_records, read_chain

    agent = tools.package("shaped", TASKS)
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    await tools.host.call(ctx, "task-post", {"title": "one"})
    path = tools.home.state_dir / "tasks" / agent.id / "tasks.jsonl"
    header = {"format": "covenant-tasks/v1", "agent": agent.id}
    append_records(path, read_chain(path, header), header, [{"op": "post", "id": "../x", "title": "t", "detail": "", "at": 1}])
    assert (await tools.new_host().call(ctx, "task-list", {})).error_code == "store_corrupt"


async def test_task_board_lifecycle_and_events(tools: Tools) -> None:
    agent = tools.package("worker", TASKS)
    grants = tools.grant(*ACTIONS)
    ctx = tools.ctx(agent, grants)
    call = tools.host.call
    first = (await call(ctx, "task-post", {"title": "write report", "detail": "weekly"})).content
    assert first == {"posted": True, "id": "task-1", "status": "open"}
    await call(ctx, "task-post", {"title": "second"})
    claimed = await call(ctx, "task-claim", {"id": "task-1"})
    assert claimed.content["claimed"] and claimed.content["detail"] == "weekly"
    again = await call(tools.ctx(agent, grants, intent="intent-2"), "task-claim", {"id": "task-1"})
    assert again.error_code == "task_not_open" and "claimed" in again.error_message
    assert (await call(ctx, "task-claim", {"id": "task-99"})).error_code == "unknown_task"
    assert (await call(ctx, "task-claim", {"id": "../etc"})).error_code == "invalid_arguments"
    assert (await call(ctx, "task-complete", {"id": "task-1", "result": "done it"})).content["completed"]
    assert (await call(ctx, "task-complete", {"id": "task-1"})).error_code == "task_not_open"
    board = (await tools.new_host().call(ctx, "task-list", {})).content
    assert [(t["id"], t["status"]) for t in board["tasks"]] == [("task-1", "done"), ("task-2", "open")]
    assert board["tasks"][0]["claimed_by"] == ctx.intent_id and board["tasks"][0]["result"] == "done it"
    assert [t["id"] for t in (await call(ctx, "task-list", {"status": "open"})).content["tasks"]] == ["task-2"]
    published = await call(ctx, "event-publish", {"topic": "reports/weekly", "data": "ready"})
    assert published.content["published"] is True
    assert (await call(ctx, "event-publish", {"topic": "bad topic!"})).error_code == "invalid_arguments"
    events = (tools.home.state_dir / "events" / agent.id / "events.jsonl").read_text().splitlines()
    assert [json.loads(line).get("topic") for line in events] == [None, "reports/weekly"]


async def test_calls_in_the_reference_runtimes_shape_work_and_are_audited_in_covenants_names(tools: Tools) -> None:
    """The argument names raftio/rune documents for these built-ins reach the same stores (issue 37 item 5)."""
    import hashlib

    from covenant.canonical import canonical_bytes

    agent = tools.package("reference", KNOWLEDGE + TASKS)
    ctx = tools.ctx(agent, tools.grant(*ACTIONS))
    call = tools.host.call
    ada = await call(ctx, "knowledge-add-entity", {"name": "Ada", "entity_type": "person", "properties": {"born": 1815}})
    assert ada.content["created"] is True
    await call(ctx, "knowledge-add-entity", {"name": "Charles", "entity_type": "person"})
    linked = await call(ctx, "knowledge-add-relation", {"source": "Ada", "relation": "knows", "target": "Charles",
                                                        "confidence": 0.8})
    assert linked.content == {"stored": True, "already_known": False}
    found = (await call(ctx, "knowledge-query", {"source": "Ada"})).content
    assert found == {"relations": [{"from": "Ada", "relation": "knows", "to": "Charles"}], "relations_matched": 1}
    entity = (await call(ctx, "knowledge-query", {"name": "Ada"})).content["entities"][0]
    assert entity["type"] == "person" and entity["observations"] == ["born: 1815"]

    posted = await call(ctx, "task-post", {"title": "report", "description": "weekly", "assigned_to": "reference"})
    assert posted.content == {"posted": True, "id": "task-1", "status": "open"}
    claimed = await call(ctx, "task-claim", {"agent_id": "reference@local"})  # the next open task
    assert claimed.content["id"] == "task-1" and claimed.content["detail"] == "weekly"
    assert (await call(ctx, "task-claim", {})).error_code == "unknown_task"  # none open is left
    assert [t["id"] for t in (await call(ctx, "task-list", {"status": "in_progress"})).content["tasks"]] == ["task-1"]
    assert (await call(ctx, "task-complete", {"task_id": "task-1", "result": "sent"})).content["completed"] is True
    assert [t["id"] for t in (await call(ctx, "task-list", {"status": "completed"})).content["tasks"]] == ["task-1"]
    published = await call(ctx, "event-publish", {"event_type": "report.sent", "payload": {"to": "@ada"}})
    assert published.content["topic"] == "report.sent"
    events = (tools.home.state_dir / "events" / agent.id / "events.jsonl").read_text().splitlines()
    assert json.loads(events[-1])["data"] == '{"to":"@ada"}'

    # What covenant cannot do is refused, never half done: another agent's board, both names at once.
    other = await call(ctx, "task-post", {"title": "x", "assigned_to": "someone-else"})
    assert other.error_code == "invalid_arguments" and "agent-send" in other.error_message
    both = await call(ctx, "task-complete", {"id": "task-1", "task_id": "task-1"})
    assert both.error_code == "invalid_arguments" and "not both" in both.error_message

    events = tools.audit.of("tool.call")
    complete = next(e for e in events if e["name"] == "task-complete" and e["outcome"] == "ok")
    assert complete["args_aliases"] == ["task_id"]
    assert complete["args_sha256"] == hashlib.sha256(canonical_bytes({"id": "task-1", "result": "sent"})).hexdigest()
    assert "args_aliases" not in next(e for e in events if e["name"] == "task-claim" and e["error_code"] == "unknown_task")
    assert [e["error_code"] for e in events[-2:]] == ["invalid_arguments", "invalid_arguments"]
