"""``covenant sessions``: list, show, verify and remove Rune session transcripts; export trajectories.

Reads ``<home>/state/sessions/<agent id>/<session id>.jsonl`` directly (no
daemon needed). ``verify`` checks every record's hash and link, and that the
file reaches its signed head (``<session id>.head``), as the daemon does before
it loads a session; it repairs nothing. The head's signature is checked when
the daemon's public key is at hand (``audit.pubkey``, or ``identity/daemon.key``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from covenant.agent_names import resolve_agent_id
from covenant.audit.verify import pinned_public_key
from covenant.cli._agents import known_agents
from covenant.cli._common import CliContext, echo, fail, pass_cli, print_json
from covenant.config import load_config
from covenant.errors import CovenantError, ExitCode
from covenant.terminal import neutralize
from covenant.rune.session_heads import HEAD_SUFFIX, HeadProblem, check_head, head_path, read_head
from covenant.rune.sessions import SessionCorrupt, Verified, session_path, valid_session_id, verify_file

__all__ = ["sessions"]


def _root(cli: CliContext) -> Path:
    return cli.home.state_dir / "sessions"


def _files(cli: CliContext, agent: str | None) -> list[tuple[str, str, Path]]:
    root = _root(cli)
    if not root.is_dir():
        return []
    agents = [agent] if agent else sorted(p.name for p in root.iterdir() if p.is_dir())
    out = []
    for agent_id in agents:
        folder = root / agent_id
        if folder.is_dir():
            # A head whose file is gone is a session too: one cut back to nothing.
            stems = {p.stem for p in folder.glob("*.jsonl")} | {p.stem for p in folder.glob(f"*{HEAD_SUFFIX}")}
            out += [(agent_id, stem, folder / f"{stem}.jsonl") for stem in sorted(stems)]
    return out


def _public_key(cli: CliContext) -> Ed25519PublicKey | None:
    """The daemon's public key for the heads' signatures, when this user can get it."""
    try:
        return pinned_public_key(cli.home, load_config(cli.home), None)
    except (CovenantError, OSError, ValueError):
        return None


def _check(path: Path, agent: str, session: str, key: Ed25519PublicKey | None) -> tuple[Verified | None, str | None]:
    try:
        verified = verify_file(path) if path.exists() or not head_path(path).exists() else Verified(path)
        check_head(path, verified.records, read_head(path, agent, session, key))
        return verified, None
    except SessionCorrupt as exc:
        return None, f"(edited) {exc}"
    except HeadProblem as exc:
        return None, f"({exc.reason}) {exc.message}"
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"


def _agent_id(cli: CliContext, agent: str) -> str:
    """The agent AGENT means (an id, or a bare name as `dispatch --agent` takes) among the loaded agents and
    those with sessions; exit 6 when it means none (covenant.agent_names)."""
    root = _root(cli)
    with_sessions = [p.name for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    try:
        return resolve_agent_id(agent, [*known_agents(cli.home).ids(), *with_sessions])
    except CovenantError as exc:
        fail(exc.message, exc.exit_code)


def _path(cli: CliContext, agent_id: str, session: str) -> Path:
    """The transcript of ``session`` of the agent ``agent_id`` (resolved by :func:`_agent_id`)."""
    if not valid_session_id(session):
        fail(f"session id {session!r}: use 1-128 of A-Za-z0-9._-", ExitCode.USAGE)
    path = session_path(_root(cli), agent_id, session)
    if not path.is_file() and not head_path(path).is_file():
        fail(f"no session {session} for agent {agent_id} (looked for {path})", ExitCode.USAGE)
    return path


@click.group()
def sessions() -> None:
    """Rune session transcripts under <home>/state/sessions/ (hash-linked JSON lines).

    AGENT is an id or a bare name, as `dispatch --agent` takes; exit 6 when it names no agent.
    """


def _age(at_ms: int) -> str:
    """How long ago ``at_ms`` was, in the largest whole unit."""
    seconds = max(0, int(time.time() - at_ms / 1000))
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


@sessions.command("list")
@click.option("--agent", metavar="ID", help="Only this agent's sessions (an id, or a bare name as `dispatch --agent` takes).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@pass_cli
def list_sessions(cli: CliContext, agent: str | None, as_json: bool) -> None:
    """List sessions: agent, session id, turns, bytes, and whether each verifies."""
    rows: list[dict[str, Any]] = []
    key = _public_key(cli)
    for agent_id, session, path in _files(cli, _agent_id(cli, agent) if agent else None):
        verified, problem = _check(path, agent_id, session, key)
        rows.append({
            "agent": agent_id,
            "session": session,
            "turns": len(verified.turns) if verified else None,
            "bytes": path.stat().st_size if path.exists() else 0,
            "valid": problem is None,
            "torn_bytes": verified.torn_bytes if verified else None,
            "problem": problem,
        })
    if as_json:
        print_json(rows)
        return
    for row in rows:
        state = "ok" if row["valid"] else "CORRUPT"
        if row["valid"] and row["torn_bytes"]:
            state = f"ok, torn tail {row['torn_bytes']} B"
        turns = "-" if row["turns"] is None else row["turns"]
        echo(f"{row['agent']:<24} {row['session']:<34} {turns:>5} turns {row['bytes']:>9} B  {state}")


@sessions.command()
@click.argument("agent")
@click.argument("session")
@click.option("--json", "as_json", is_flag=True, help="Print the verified records as JSON.")
@pass_cli
def show(cli: CliContext, agent: str, session: str, as_json: bool) -> None:
    """Show a session's turns (only after it verifies; exit 1 when it does not)."""
    agent_id = _agent_id(cli, agent)
    verified, problem = _check(_path(cli, agent_id, session), agent_id, session, _public_key(cli))
    if verified is None:
        fail(f"refused: {problem}", 1)
    if as_json:
        print_json(verified.records)
        return
    header = verified.header
    echo(f"session {header.get('session')} of {header.get('agent')}, issuer {header.get('issuer')}")
    for turn in verified.turns:
        written = turn.get("at_ms")
        when = f" ({_age(written)} ago)" if isinstance(written, int) else ""
        echo(f"--- intent {turn.get('intent')}{when}")
        for message in turn["messages"]:
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            calls = message.get("tool_calls") or []
            names = ", ".join(str((c.get("function") or {}).get("name")) for c in calls if isinstance(c, dict))
            echo(f"{message.get('role')}: {text}" + (f" [tool calls: {names}]" if names else ""))


@sessions.command()
@click.argument("agent", required=False)
@click.argument("session", required=False)
@click.option("--json", "as_json", is_flag=True,
              help="A JSON list: {agent, session, records, torn_bytes, tier, tier_reasons}.")
@pass_cli
def verify(cli: CliContext, agent: str | None, session: str | None, as_json: bool) -> None:
    """Verify sessions (all, one agent's, or one) and give each its tier. Exit 0 when all verify, 1 otherwise.

    Tiers: clean; suspicious (earlier turns hold what looks like prompt
    injection: instruction-override phrases, encoded payloads, tool output
    addressing the model — each reason named; loaded with a warning, or
    refused under [rune] suspicious = "refuse"); tainted (it does not verify:
    every load is refused as session_corrupt). A torn tail (a last line cut
    by a crash mid-write) is reported, not counted as corruption: the
    replica cuts it at the next load.
    """
    from covenant.rune.session_tiers import assess, tainted

    agent_id = _agent_id(cli, agent) if agent else None
    targets = [(agent_id, session, _path(cli, agent_id, session))] if agent_id and session else _files(cli, agent_id)
    bad = 0
    key = _public_key(cli)
    rows: list[dict[str, Any]] = []
    for agent_id, session_id, path in targets:
        verified, problem = _check(path, agent_id, session_id, key)
        assessment = assess(verified.turns) if verified is not None else tainted(str(problem))
        bad += verified is None
        rows.append({"agent": agent_id, "session": session_id,
                     "records": len(verified.records) if verified else None,
                     "torn_bytes": verified.torn_bytes if verified else None,
                     "tier": assessment.tier, "tier_reasons": assessment.reasons})
    if as_json:
        print_json(rows)
        raise SystemExit(1 if bad else 0)
    for row in rows:
        where = f"{row['agent']} {row['session']}"
        if row["tier"] == "tainted":
            echo(f"TAINTED    {where}: {row['tier_reasons'][0]}")
            continue
        torn = f", torn tail of {row['torn_bytes']} bytes" if row["torn_bytes"] else ""
        echo(f"{row['tier']:<10} {where}: {row['records']} records{torn}")
        for reason in row["tier_reasons"]:
            echo(f"           {neutralize(reason)}")
    echo(f"{len(targets) - bad} of {len(targets)} sessions verify")
    raise SystemExit(1 if bad else 0)


@sessions.command()
@click.argument("agent")
@click.argument("session")
@pass_cli
def rm(cli: CliContext, agent: str, session: str) -> None:
    """Remove one session transcript, and its head."""
    path = _path(cli, _agent_id(cli, agent), session)
    for file in (path, head_path(path)):
        if file.exists():
            file.unlink()
            echo(f"removed {file}")


@sessions.command()
@click.option("--trajectories", is_flag=True,
              help="Export the test-driven loop's attempts (state/trajectories/), the one kind export writes.")
@click.option("--agent", metavar="ID", help="Only this agent's (an id, or a bare name as `dispatch --agent` takes).")
@click.option("--jsonl", is_flag=True, help="One JSON line per attempt (for training) instead of one JSON list.")
@pass_cli
def export(cli: CliContext, trajectories: bool, agent: str | None, jsonl: bool) -> None:
    """Export trajectories of `loop: test-driven` agents, one record per attempt.

    Each record: session_id, attempt, generated_code, stdout, stderr,
    exit_code, tests_passed, test_count, tests_ran, task_description,
    task_type, adapter_ids, ts, agent, intent, and the session's outcome
    (success, exhausted, or null for a run that never ended). Exit 1 when a
    file cannot be read, naming it and the line.
    """
    from covenant.rune.trajectories import exported_attempts

    if not trajectories:
        fail("export writes trajectories only: add --trajectories", ExitCode.USAGE)
    root = cli.home.state_dir / "trajectories"
    agent_id = None
    if agent:
        with_trajectories = [p.name for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
        try:
            agent_id = resolve_agent_id(agent, [*known_agents(cli.home).ids(), *with_trajectories])
        except CovenantError as exc:
            fail(exc.message, exc.exit_code)
    try:
        records = exported_attempts(root, agent_id)
    except (OSError, ValueError) as exc:
        fail(f"cannot export: {exc}", 1)
    if not jsonl:
        print_json(records)
        return
    for record in records:
        echo(json.dumps(record, ensure_ascii=False, sort_keys=True))
