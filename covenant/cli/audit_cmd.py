"""``covenant audit``: tail, verify and witness the signed audit log."""

from __future__ import annotations

import collections
import fnmatch
import json
import signal
import sys
from pathlib import Path
from typing import Any

import click

from covenant.cli._agents import resolve_recorded_agent
from covenant.cli._common import CliContext, echo, fail, pass_cli, print_json, reports_errors
from covenant.cli._output import echo_json
from covenant.home import home_command

__all__ = ["audit"]

TAIL_LINES = 10
"""Records `audit tail` starts with unless -n says otherwise (the log may hold millions)."""


@click.group()
def audit() -> None:
    """Tail, verify and witness the signed audit log (in <home>/audit)."""


def _matches(record: dict[str, Any], agent: str | None, type_pattern: str | None) -> bool:
    if type_pattern is None:
        # Checkpoints prove the log; they are noise when reading it.
        if record["type"] == "audit.checkpoint":
            return False
    elif not fnmatch.fnmatchcase(record["type"], type_pattern):
        return False
    if agent is not None and record["data"].get("agent") != agent:
        return False
    return True


def _human(number: int, record: dict[str, Any]) -> str:
    """One shown record: its number in this listing (1, 2, 3… with no gaps: hidden checkpoints and
    filtered records are not counted), then time, the log's own ``seq``, type, agent, intent, outcome."""
    data = record["data"]

    def field(name: str) -> str:
        value = data.get(name)
        if isinstance(value, dict):  # e.g. an intent given as {"id": ...}
            value = value.get("id")
        return "-" if value is None else str(value)

    outcome = field("outcome")
    if outcome == "-" and isinstance(data.get("allowed"), bool):  # policy.decision
        outcome = "allowed" if data["allowed"] else f"denied({data.get('reason') or '-'})"
    return (
        f"{number:>6}  {record['ts']}  seq={record['seq']:<7} {record['type']:<18} "
        f"agent={field('agent')}  intent={field('intent')}  outcome={outcome}"
    )


@audit.command()
@click.option("-f", "--follow", "follow_", is_flag=True, help="Keep printing records as they are written.")
@click.option("--agent", metavar="ID", help="Only records whose data.agent is this agent: an id, or a bare name as "
              "`dispatch --agent` takes (exit 6 when it names no agent; a full id of an agent no longer loaded "
              "shows its records).")
@click.option("--type", "type_", metavar="T", help="Only records of type T (glob, e.g. 'intent.*'); shows checkpoints only when asked.")
@click.option("--json", "as_json", is_flag=True, help="Print each record as its JSON line, exactly as stored (JSON Lines: "
              "nothing when no record matches).")
@click.option("-n", "--lines", type=click.IntRange(min=0), default=TAIL_LINES, show_default=True,
              help="Start with the last N matching records.")
@click.option("--interval", type=click.FloatRange(min=0.01), default=0.2, hidden=True, help="Poll interval for -f, seconds.")
@pass_cli
@reports_errors
def tail(
    ctx: CliContext, follow_: bool, agent: str | None, type_: str | None, as_json: bool, lines: int, interval: float
) -> None:
    """Print the last audit records (10 unless -n), numbered 1, 2, 3… (time, seq, type, agent, intent,
    outcome); -f follows from there.

    Works whether or not the daemon runs. When no record matches it says
    `no records` on stderr. Warnings about a broken chain, a file that shrank
    or was replaced, go to stderr.
    """
    from covenant.audit.reader import CaughtUp, Entry, follow

    directory = ctx.home.audit_dir
    if not directory.is_dir() and not follow_:
        fail(f"no audit log at {directory} (the daemon creates it on start: run "
             f"`{home_command(ctx.home.root, 'daemon')}`, or point --home at the daemon's home)", 1)
    unknown = None
    if agent is not None:
        agent, unknown = resolve_recorded_agent(ctx.home, agent)
    # SIGTERM ends a `tail -f` as quietly as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    shown = matched = 0
    backlog: collections.deque[Entry] = collections.deque(maxlen=lines)
    caught_up = False

    def show(entry: Entry) -> None:
        nonlocal shown
        shown += 1
        if as_json:
            echo_json(entry.line.decode("utf-8"))
        else:
            echo(_human(shown, entry.record))

    def catch_up() -> None:
        """The end of the log reached: the last records, or why there are none."""
        nonlocal caught_up
        caught_up = True
        for entry in backlog:
            show(entry)
        backlog.clear()
        if matched:
            return
        if unknown is not None:
            raise unknown  # a full id no agent has, and no record names
        if not as_json:
            echo(_no_records(agent, type_, follow_), err=True)

    try:
        for item in follow(directory, keep_following=follow_, poll_s=interval, should_stop=None):
            if isinstance(item, CaughtUp):
                catch_up()
            elif not isinstance(item, Entry):
                echo(f"covenant: audit {'WARNING' if item.loud else 'note'}: {item.message}", err=True)
            elif _matches(item.record, agent, type_):
                matched += 1
                if caught_up:
                    show(item)
                else:
                    backlog.append(item)
    except KeyboardInterrupt:
        return
    if not caught_up:
        catch_up()


def _no_records(agent: str | None, type_: str | None, following: bool) -> str:
    """What `audit tail` says when no record matches (on stderr: stdout holds records only)."""
    words = ["no records", *([f"of agent {agent}"] if agent else []), *([f"of type {type_}"] if type_ else [])]
    return " ".join(words) + ("; following (Ctrl-C to stop)" if following else "")


@audit.command()
@click.option("--witness", type=click.Path(dir_okay=False, exists=True, path_type=Path), help="A head file kept elsewhere: the log must still contain that checkpoint.")
@click.option("--pubkey", metavar="HEX", help="The daemon public key to verify against (default: audit.pubkey, else identity/daemon.key).")
@click.option("--fleet", "against_fleet", is_flag=True, help="Also check the log against every head this host published to the fleet (COVENANT_AUDIT); exit 5 when NATS cannot be reached.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@pass_cli
@reports_errors
def verify(ctx: CliContext, witness: Path | None, pubkey: str | None, against_fleet: bool, as_json: bool) -> None:
    """Check every record, link, checkpoint signature and recovery; exit 0 valid, 1 not."""
    from covenant.audit.verify import load_witness, pinned_public_key, verify_log
    from covenant.config import load_config

    config = load_config(ctx.home)
    key = pinned_public_key(ctx.home, config, pubkey)
    witness_doc = load_witness(witness) if witness is not None else None
    report = verify_log(ctx.home.audit_dir, key, witness=witness_doc)
    fleet = _fleet_check(ctx, config, key, report.log_id) if against_fleet else None
    ok = report.ok and (fleet is None or fleet.ok)
    if as_json:
        print_json({**report.to_json(), "ok": ok, **({"fleet": fleet.to_json()} if fleet is not None else {})})
        sys.exit(0 if ok else 1)
    for warning in report.warnings + (fleet.ignored if fleet is not None else []):
        echo(f"warning: {warning}", err=True)
    if report.ok:
        last = report.last_checkpoint or {}
        echo(
            f"ok: {report.records} records in {report.segments} segment(s), log {report.log_id}, "
            f"last checkpoint covers seq {last.get('seq')} ({last.get('ts')})"
            + (", witness matched" if witness_doc is not None else "")
        )
    else:
        p = report.first_problem
        assert p is not None
        echo(f"FAILED: {p.segment}, seq {p.seq}, byte offset {p.offset}: {p.message}")
    if fleet is not None:
        if fleet.ok:
            echo(f"ok: the log agrees with the {fleet.heads} head(s) this host published to the fleet"
                 + (f" (newest covers seq {fleet.newest_seq})" if fleet.newest_seq is not None else ""))
        else:
            echo(f"FAILED: fleet, seq {fleet.problem_seq}: {fleet.problem}")
    if not ok:
        echo(
            "covenant: the log does not prove itself from that point on. Keep a copy of the audit "
            "folder as evidence before anything writes to it, compare it with a witness kept "
            "elsewhere (`covenant audit verify --witness FILE`), and see docs/audit.md (verify)",
            err=True,
        )
    sys.exit(0 if ok else 1)


def _fleet_check(ctx: CliContext, config: Any, key: Any, log_id: str | None) -> Any:
    """The log against the heads this host published to COVENANT_AUDIT (docs/fleet.md)."""
    import asyncio

    from covenant.fleet.client import FleetClient
    from covenant.fleet.heads import check_heads, fetch_heads

    fleet = config.fleet.require(ctx.home.config_path)
    host = fleet.host_name()

    async def heads() -> list[dict[str, Any]]:
        async with FleetClient(fleet) as client:
            return await fetch_heads(client.js, host)

    return check_heads(asyncio.run(heads()), host, key, log_id, ctx.home.audit_dir)


@audit.command()
@click.option("--pubkey", metavar="HEX", help="Check the head's signature against this key.")
@click.option("--json", "as_json", is_flag=True, help="Print it as one line of JSON (what the fleet publishes, without host).")
@pass_cli
@reports_errors
def head(ctx: CliContext, pubkey: str | None, as_json: bool) -> None:
    """Print the latest checkpoint as a witness file; keep copies on another host."""
    from covenant.audit.format import checkpoint_signature_ok
    from covenant.audit.store import HEAD_NAME
    from covenant.audit.verify import pinned_public_key
    from covenant.config import load_config
    from covenant.errors import CovenantError

    path = ctx.home.audit_dir / HEAD_NAME
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        fail(f"{path} not found (the daemon writes it when it opens the audit log)", 1)
    except (OSError, ValueError) as exc:
        fail(f"{path}: cannot read it ({exc}); run as root or as the daemon's user", 1)
    try:
        key = pinned_public_key(ctx.home, load_config(ctx.home), pubkey)
    except CovenantError as exc:
        echo(f"covenant: note: signature not checked: {exc.message}", err=True)
    else:
        if not isinstance(doc, dict) or type(doc.get("seq")) is not int or not checkpoint_signature_ok(
            key, str(doc.get("log")), doc.get("seq"), str(doc.get("hash")), doc.get("sig")
        ):
            fail(f"{path}: the checkpoint signature does not verify under the pinned key; do not use it as a "
                 "witness, and run `covenant audit verify` to check the log itself", 1)
    echo(json.dumps(doc, sort_keys=True, separators=(",", ":")) if as_json else json.dumps(doc, sort_keys=True, indent=2))
