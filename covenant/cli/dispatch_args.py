"""The one definition of ``covenant dispatch``'s arguments, and a click-free parser for them.

Plain NamedTuples, not dataclasses: a frozen dataclass costs ~1 ms to define. The click command in :mod:`covenant.cli.dispatch_cmd` builds its decorators from
:data:`DISPATCH_OPTIONS`; :func:`parse_fast` reads the same table to recognise a
plain ``covenant [--home DIR] dispatch TEXT [options]`` without importing click
(~30 ms of a dispatch's start-up). Anything it does not fully understand — help,
unknown or repeated-dash forms, a bad choice, a missing or extra argument, ``--``
— returns None, so click stays the single source of usage errors and help text.

The two tuples are ``collections.namedtuple`` at run time and ``typing.NamedTuple`` for type
checkers: the fast path imports no typing (≈ 10 million instructions), and a class-syntax
NamedTuple with string annotations calls the builtin ``compile``, whose first call in a
process costs ≈ 7.6 million more (:mod:`covenant.home_paths`; docs/performance.md, issue 38).
"""

from __future__ import annotations

import os
from collections import namedtuple

from covenant.priorities import PRIORITIES

TYPE_CHECKING = False  # typing's constant, without importing typing on the dispatch path (issue 38)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import NamedTuple

__all__ = ["DispatchOption", "DISPATCH_OPTIONS", "TEXT_ARGUMENT", "DispatchArgs", "parse_fast"]

TEXT_ARGUMENT = "text"


if TYPE_CHECKING:
    class DispatchOption(NamedTuple):
        """One ``--flag`` of ``covenant dispatch``: how click declares it and how the fast parser reads it."""

        flag: str
        dest: str
        help: str
        metavar: str | None = None
        is_flag: bool = False
        choices: tuple[str, ...] | None = None
        default: str | None = None
else:
    DispatchOption = namedtuple("DispatchOption", ["flag", "dest", "help", "metavar", "is_flag", "choices", "default"],
                                defaults=(None, False, None, None))
    DispatchOption.__doc__ = "One ``--flag`` of ``covenant dispatch``: how click declares it and how the fast parser reads it."


DISPATCH_OPTIONS: tuple[DispatchOption, ...] = (
    DispatchOption("--agent", "agent_id", "Send to this agent (an id, or a bare name when only one namespace has it) instead of routing by keywords.", metavar="ID"),
    DispatchOption("--priority", "priority", "Queue order when the daemon is saturated, and the agent's nice value "
                   "(low 10, high -5 under a root daemon; normal: the agent's own [settlement] priority).",
                   choices=PRIORITIES, default="normal"),
    DispatchOption("--parent", "parent", "Intent id this one follows from (recorded, passed to the agent).",
                   metavar="ID"),
    DispatchOption("--json", "as_json", "Print the full outcome as JSON.", is_flag=True),
    DispatchOption("--dry-run", "dry_run", "Route and check policy, explain the decision, spawn nothing (a workflow: "
                   "every step with its route and decision; exit 3 or 6 when a step may not run).", is_flag=True),
    DispatchOption("--session", "session_id", "Rune agents: continue this session, or start it under this id "
                   "(1-128 of A-Za-z0-9._-). The outcome names the session either way.", metavar="ID"),
    DispatchOption("--stream", "stream", "Rune agents: print the answer as it arrives (a line at a time when the agent's "
                   "safety_policy redacts secret shapes, each model delta under none); tool events go to stderr "
                   "(with --json: one JSON event per line).", is_flag=True),
    DispatchOption("--fleet", "fleet", "Send the intent over the fleet (NATS, [fleet] in covenant.toml) to a live host "
                   "that runs the agent, instead of to this home's daemon (docs/fleet.md).", is_flag=True),
    DispatchOption("--timeout", "timeout", "With --fleet: seconds to wait for the answer (default: [policy] skew_s "
                   "- 30, after which the intent could no longer run).", metavar="S"),
)

_BY_FLAG = {option.flag: option for option in DISPATCH_OPTIONS}


if TYPE_CHECKING:
    class DispatchArgs(NamedTuple):
        """A parsed ``covenant dispatch`` invocation (``home`` is the group's ``--home``, if given)."""

        home: str | None
        text: str
        agent_id: str | None
        priority: str
        parent: str | None
        as_json: bool
        dry_run: bool
        session_id: str | None
        stream: bool
        fleet: bool = False
        timeout: str | None = None
else:
    DispatchArgs = namedtuple("DispatchArgs", ["home", "text", "agent_id", "priority", "parent", "as_json", "dry_run",
                                               "session_id", "stream", "fleet", "timeout"], defaults=(False, None))
    DispatchArgs.__doc__ = "A parsed ``covenant dispatch`` invocation (``home`` is the group's ``--home``, if given)."


def _plain_value(value: str) -> bool:
    # A value that looks like an option (click would take it as the value) or is empty: let click decide.
    return bool(value) and not value.startswith("-")


def parse_fast(argv: Sequence[str], environ: Mapping[str, str]) -> DispatchArgs | None:
    """``argv`` (without the program name) as a dispatch, or None to hand it to click."""
    if "_COVENANT_COMPLETE" in environ:  # click's shell completion
        return None
    args = list(argv)
    home: str | None = None
    if args[:1] == ["--home"] and len(args) >= 2 and _plain_value(args[1]):
        home, args = args[1], args[2:]
    if args[:1] != ["dispatch"]:
        return None
    # click's Path(file_okay=False) rejects a home that is an existing file (from --home or COVENANT_HOME).
    chosen_home = home if home is not None else environ.get("COVENANT_HOME")
    if chosen_home and os.path.exists(chosen_home) and not os.path.isdir(chosen_home):
        return None
    values: dict[str, str | bool | None] = {o.dest: (False if o.is_flag else o.default) for o in DISPATCH_OPTIONS}
    texts: list[str] = []
    rest = args[1:]
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if not token.startswith("-"):
            texts.append(token)
            continue
        option = _BY_FLAG.get(token)
        if option is None:  # --help, -h, --opt=value, --, -, unknown options
            return None
        if option.is_flag:
            values[option.dest] = True
            continue
        if i >= len(rest) or not _plain_value(rest[i]):
            return None
        value = rest[i]
        i += 1
        if option.choices is not None and value not in option.choices:
            return None
        values[option.dest] = value
    if len(texts) != 1 or not texts[0]:
        return None
    return DispatchArgs(home=home, text=texts[0], **values)  # type: ignore[arg-type]
