"""``covenant history`` and ``covenant show``: read dispatch records.

They ask the running daemon (a user may not read the daemon's state folder)
and read the home's DispatchStore directly when no daemon runs. ``history``
also lists denied intents, read from the audit log when this user can read it.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, urlencode

import click

from covenant.audit.denials import Denial, recent_denials
from covenant.cli._agents import resolve_recorded_agent
from covenant.cli._common import CliContext, echo, ask_daemon, fail, pass_cli, print_json, reports_errors
from covenant.cli.artifact_files import save_artifacts
from covenant.client import RemoteError
from covenant.home import Home
from covenant.runtime.outcome import DispatchRecord
from covenant.runtime.records import DispatchStore

__all__ = ["history", "show", "fetch_recent", "fetch_one"]


def fetch_recent(home: Home, limit: int, agent: str | None) -> tuple[list[DispatchRecord], list[str]]:
    """Newest-first records and any unreadable-line problems met on the way."""
    query = urlencode({"limit": limit, **({"agent": agent} if agent else {})})
    answer = ask_daemon(home, f"/v1/dispatches?{query}")
    if answer is not None:
        return [DispatchRecord.model_validate(doc) for doc in answer["dispatches"]], []
    store = DispatchStore(home.dispatches_dir)
    return store.recent(limit, agent=agent), store.problems


def fetch_one(home: Home, intent_id: str) -> tuple[DispatchRecord | None, list[str]]:
    try:
        answer = ask_daemon(home, f"/v1/dispatches/{quote(intent_id, safe='')}")
    except RemoteError as exc:
        if exc.code != "not_found":
            raise
        return None, []
    if answer is not None:
        return DispatchRecord.model_validate(answer), []
    store = DispatchStore(home.dispatches_dir)
    return store.get(intent_id), store.problems


def fetch_denials(home: Home, limit: int, agent: str | None) -> tuple[list[Denial], list[str]]:
    """Newest-first denials from the audit log, or a note saying why they cannot be read."""
    try:
        return recent_denials(home.audit_dir, limit, agent), []
    except PermissionError:
        return [], [f"denied intents not shown: cannot read {home.audit_dir} (run as root or the daemon's user)"]


def _exit_text(record: DispatchRecord) -> str:
    if record.exit_code is not None:
        return f"code {record.exit_code}"
    return f"signal {record.signal}" if record.signal is not None else "-"


def _warn(problems: list[str]) -> None:
    for problem in problems:
        echo(f"covenant: warning: {problem}", err=True)


@click.command()
@click.option("--agent", "agent_id", metavar="ID",
              help="Only records of this agent: an id, or a bare name as `dispatch --agent` takes (exit 6 when it "
                   "names no agent; a full id of an agent no longer loaded shows its records).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100_000), help="How many records.")
@click.option("--json", "as_json", is_flag=True, help="Print the records as a JSON list.")
@pass_cli
@reports_errors
def history(cli: CliContext, agent_id: str | None, limit: int, as_json: bool) -> None:
    """List recent dispatches and denied intents, newest first.

    Through the daemon you see the dispatches you submitted; root, the
    daemon's user and members of [isolation] operators_group see all.
    A denied intent (outcome `denied`, with the reason and the issuer) spawned
    nothing; it comes from the audit log, shown when this user can read it.
    """
    unknown = None
    if agent_id is not None:
        agent_id, unknown = resolve_recorded_agent(cli.home, agent_id)
    records, problems = fetch_recent(cli.home, limit, agent_id)
    denials, notes = fetch_denials(cli.home, limit, agent_id)
    _warn(problems + notes)
    entries: list[DispatchRecord | Denial] = [*records, *denials]
    if unknown is not None and not entries:
        raise unknown
    entries.sort(key=lambda e: e.started_at if isinstance(e, DispatchRecord) else e.at, reverse=True)
    del entries[limit:]
    if as_json:
        print_json([e.model_dump(mode="json") if isinstance(e, DispatchRecord) else e.to_json() for e in entries])
        return
    if not entries:
        echo("no dispatch records")
        return
    for e in entries:
        if isinstance(e, DispatchRecord):
            echo(f"{e.started_at}  {e.outcome:<16} {e.duration_ms:>7} ms  {e.agent_id:<24} {e.intent_id}")
        else:
            echo(f"{e.at}  {'denied':<16} {'-':>7}     {e.agent_id or '-':<24} {e.intent_id or '-'}  "
                       f"{e.reason} (issuer {e.issuer or '-'})")


def _left_behind_text(record: DispatchRecord) -> str:
    if record.pid is None:  # nothing was spawned (a Rune or workflow intent, a failed spawn)
        return "-"
    if record.left_behind:
        return f"{record.left_behind} processes still running after the agent ended, killed"
    return "nothing running after the agent ended"


def _cleanup_text(record: DispatchRecord) -> str:
    if record.pid is None:
        return "-"
    if record.cleanup.complete:
        return "everything it left was removed"
    return f"incomplete: {record.cleanup.reason}"


def _stderr_text(record: DispatchRecord) -> str:
    if record.pid is None:
        return "-"
    if record.stderr_unlogged_bytes:
        return f"{record.stderr_unlogged_bytes} bytes over the log budget, not logged"
    return "every line logged"


@click.command()
@click.argument("intent_id")
@click.option("--json", "as_json", is_flag=True, help="Print the full record as JSON.")
@click.option("--save", "save_dir", metavar="DIR", type=click.Path(file_okay=False, path_type=Path),
              help="Also write the intent's artifacts (files its tools handed back: a canvas, a screenshot) into DIR, "
                   "made if missing, each under its name; an existing file is never overwritten (exit 1).")
@pass_cli
@reports_errors
def show(cli: CliContext, intent_id: str, as_json: bool, save_dir: Path | None) -> None:
    """Show the dispatch record of INTENT_ID (exit 1 when there is none, or it is not yours to read).

    An intent that called other agents (agent tools, workflow steps) lists its child
    intents as a tree: step, agent, outcome, duration, start and intent id of each.
    """
    record, problems = fetch_one(cli.home, intent_id)
    _warn(problems)
    if record is None:
        fail(f"no dispatch record for intent {intent_id} in {cli.home.dispatches_dir} (a denied intent spawned "
             "nothing and has none: `covenant history` lists denials with their reason; one a killed daemon had not "
             "decided yet has none either: `covenant audit tail --type intent.interrupted`)", 1)
    if save_dir is not None:
        save_artifacts(cli.home, record, save_dir, quiet=as_json)
    if as_json:
        print_json(record.model_dump(mode="json"))
        return
    rows = [
        ("intent", record.intent_id),
        ("agent", f"{record.agent_id} {record.agent_version} ({record.runtime})"),
        ("outcome", record.outcome),
        ("error", record.error or "-"),
        ("started", record.started_at),
        ("ended", record.ended_at),
        ("duration", f"{record.duration_ms} ms"),
        ("cpu", f"{record.cpu_ms} ms"),
        ("peak rss", f"{record.peak_rss_kib} KiB"),
        ("stdout", f"{record.stdout_bytes} bytes"),
        ("scratch", f"{record.scratch_peak_bytes} bytes"),
        ("pid", str(record.pid) if record.pid is not None else "-"),
        ("exit", _exit_text(record)),
        ("left", _left_behind_text(record)),
        ("cleanup", _cleanup_text(record)),
        ("stderr", _stderr_text(record)),
        ("network", "enforced" if record.network_enforced else "not enforced"),
        ("limits", " ".join(f"{k}={v}" for k, v in sorted(record.limits.items()))),
        ("argv", " ".join(record.argv)),
        ("parent", record.parent or "-"),
    ]
    for name, value in rows:
        echo(f"{name:>9}  {value}")
    if record.result is not None:
        echo(f"{'result':>9}  {record.result.get('text', '')}")
    if record.stderr_tail:
        echo("   stderr (tail):")
        echo(record.stderr_tail.rstrip("\n"))
    for entry in record.artifacts:
        echo(f"{'artifact':>9}  {entry.get('name')}  {entry.get('media_type')}  {entry.get('bytes')} bytes  "
             f"sha256 {entry.get('sha256')}")
    if record.children:
        echo(" children")
        for line in _tree(cli.home, record.children, 1, set()):
            echo(line)


_TREE_MAX_DEPTH = 32


def _tree(home: Home, children: list[dict], level: int, seen: set[str]) -> list[str]:
    """One line per child intent (step, agent, outcome, start, time), its own children indented below."""
    lines: list[str] = []
    for child in children:
        step = f"step {child['step']}  " if child.get("step") else ""
        lines.append(
            f"{'  ' * level}- {step}{child.get('agent') or '-'}  {child.get('outcome') or '-'}  "
            f"{child.get('duration_ms', '-')} ms  started {child.get('started_at', '-')}  {child.get('intent') or '-'}"
        )
        intent = child.get("intent")
        if not intent or intent in seen or level >= _TREE_MAX_DEPTH:
            continue
        seen.add(intent)
        sub, _ = fetch_one(home, intent)
        if sub is not None and sub.children:
            lines.extend(_tree(home, sub.children, level + 1, seen))
    return lines
