"""The argument shapes of the reference Rune runtime (raftio/rune), mapped onto covenant's built-ins.

Rune packages are written against the reference runtime: their instructions tell the model to call
``rune@schedule-create`` with ``description``, ``schedule: "every 5 minutes"``, ``agent_name``…, which is
how that runtime's built-ins name their arguments. covenant's built-ins keep their own names (the
schema offered to models, the audit's ``args_sha256``, the results): a call in the reference's shape is
mapped onto them here, before the schema check, and the names that were mapped are recorded in the
``tool.call`` event (``args_aliases``). docs/tools.md lists every alias ("Arguments written for the
reference runtime").

Rules: an alias given together with the covenant name it maps to is refused (which one was meant is
not ours to guess); an argument of the reference whose effect covenant cannot give (a web-fetch
``POST``, a task assigned to another agent) is refused with a message saying so, never silently
dropped; the few that change nothing here (a relation's ``confidence``) are accepted and ignored,
as documented. Pure: no I/O.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from covenant.canonical import canonical_bytes

__all__ = ["Caller", "Mapped", "ShapeError", "canonical_arguments", "parse_schedule", "ALIASED_TOOLS"]


class ShapeError(Exception):
    """The call is in the reference's shape but cannot be mapped; the message is for the model."""


@dataclass(frozen=True)
class Caller:
    """Who makes the call: an argument naming "this agent" is checked against it."""

    agent_id: str
    """``name@namespace``."""

    @property
    def agent_name(self) -> str:
        return self.agent_id.partition("@")[0]

    def is_me(self, value: Any) -> bool:
        return isinstance(value, str) and value in (self.agent_id, self.agent_name)


@dataclass(frozen=True)
class Mapped:
    arguments: dict[str, Any]
    """In covenant's names, ready for the tool's schema."""
    aliases: tuple[str, ...] = ()
    """The reference names that were mapped (sorted), for the audit."""


_DROP = object()
"""A converter's answer for an argument that is accepted and has no covenant counterpart."""

_Convert = Callable[[Any, Caller], Any]


@dataclass(frozen=True)
class _Alias:
    reference: str
    canonical: str | None = None
    """covenant's name for it; None: the reference's name is kept (only the value is converted)."""
    convert: _Convert | None = None


def _json_text(value: Any, _caller: Caller) -> str:
    """An event payload of any JSON shape -> covenant's text ``data`` (canonical JSON)."""
    return canonical_bytes(value).decode("utf-8")


def _seconds_to_ms(value: Any, _caller: Caller) -> Any:
    if type(value) is not int or value < 1:
        raise ShapeError(f"timeout_seconds must be a whole number of seconds, 1 or more, got {value!r}")
    return value * 1000


def _get_only(value: Any, _caller: Caller) -> Any:
    if not isinstance(value, str) or value.upper() != "GET":
        raise ShapeError(f"web-fetch makes GET requests only; method {value!r} is not supported here")
    return _DROP


def _nothing(what: str) -> _Convert:
    def check(value: Any, _caller: Caller) -> Any:
        if value in (None, "", {}):
            return _DROP
        raise ShapeError(f"web-fetch makes plain GET requests: {what} cannot be given here")
    return check


def _confidence(value: Any, _caller: Caller) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ShapeError(f"confidence must be a number from 0 to 1, got {value!r}")
    return _DROP  # accepted; covenant's graph keeps no confidence


def _observations(value: Any, _caller: Caller) -> list[str]:
    """An entity's ``properties`` object -> covenant's observations, one ``key: value`` line each."""
    if not isinstance(value, dict):
        raise ShapeError(f"properties must be an object, got {type(value).__name__}")
    return [f"{key}: {item if isinstance(item, str) else canonical_bytes(item).decode('utf-8')}"
            for key, item in value.items()]


def _this_agent(what: str) -> _Convert:
    def check(value: Any, caller: Caller) -> Any:
        if caller.is_me(value):
            return _DROP
        raise ShapeError(f"{what} {value!r}: a task board belongs to one agent, this one ({caller.agent_id}); "
                         "ask another agent with agent-send")
    return check


_TASK_STATUS = {"pending": "open", "in_progress": "claimed", "completed": "done"}


def _task_status(value: Any, _caller: Caller) -> Any:
    return _TASK_STATUS.get(value, value) if isinstance(value, str) else value


_PROCESS_ID = _Alias("process_id", "id")

_ALIASES: dict[str, tuple[_Alias, ...]] = {
    "rune@shell-exec": (_Alias("timeout_seconds", "timeout_ms", _seconds_to_ms),),
    "rune@web-fetch": (_Alias("method", None, _get_only), _Alias("headers", None, _nothing("headers")),
                       _Alias("body", None, _nothing("a body"))),
    "rune@knowledge-add-entity": (_Alias("entity_type", "type"), _Alias("properties", "observations", _observations)),
    "rune@knowledge-add-relation": (_Alias("source", "from"), _Alias("target", "to"),
                                    _Alias("confidence", None, _confidence)),
    "rune@knowledge-query": (_Alias("source", "from"), _Alias("target", "to")),
    "rune@task-post": (_Alias("description", "detail"), _Alias("assigned_to", None, _this_agent("assigned_to"))),
    "rune@task-claim": (_Alias("agent_id", None, _this_agent("agent_id")),),
    "rune@task-complete": (_Alias("task_id", "id"),),
    "rune@task-list": (_Alias("status", None, _task_status),),
    "rune@event-publish": (_Alias("event_type", "topic"), _Alias("payload", "data", _json_text)),
    "rune@schedule-delete": (_Alias("id", "name"),),
    "rune@process-poll": (_PROCESS_ID,),
    "rune@process-write": (_PROCESS_ID,),
    "rune@process-kill": (_PROCESS_ID,),
    "rune@agent-send": (_Alias("agent_id", "agent"), _Alias("message", "input")),
    "rune@channel-send": (_Alias("message", "text"),),
}


def _rename(tool: str, arguments: dict[str, Any], caller: Caller) -> tuple[dict[str, Any], list[str]]:
    out = dict(arguments)
    mapped: list[str] = []
    for alias in _ALIASES.get(tool, ()):
        if alias.reference not in arguments:
            continue
        target = alias.canonical or alias.reference
        if target != alias.reference and target in arguments:
            raise ShapeError(f"give {target} or {alias.reference} (its name in the reference runtime), not both")
        value = out.pop(alias.reference)
        converted = alias.convert(value, caller) if alias.convert is not None else value
        if converted is not _DROP:
            out[target] = converted
        if target != alias.reference or converted is not value:
            mapped.append(alias.reference)
    return out, mapped


# --- schedules: "every 5 minutes", "daily at 9am", a cron line ------------------------------------------------

_CRON_FIELD = re.compile(r"^[0-9*/,-]+$")
_PERIOD = re.compile(r"^every\s+(?:(\d{1,7})\s+)?(second|minute|hour|day|week)s?$")
_PERIOD_UNIT = {"second": (1, "s"), "minute": (1, "m"), "hour": (1, "h"), "day": (24, "h"), "week": (168, "h")}
_AT = re.compile(r"^(daily|weekdays|weekends)\s+at\s+(.+)$")
_AT_DAYS = {"daily": "*", "weekdays": "1-5", "weekends": "0,6"}
_NAMED = {"hourly": "0 * * * *", "daily": "0 0 * * *", "weekly": "0 0 * * 0", "monthly": "0 0 1 * *"}
_CLOCK = re.compile(r"^(\d{1,2})(?::(\d{2}))?\s*(am|pm)?$")


def _hour_minute(text: str) -> tuple[int, int]:
    match = _CLOCK.match(text.strip())
    if match is None:
        raise ShapeError(f"cannot read the time {text!r} (write 9am, 5pm or 17:30)")
    hour, minute, half = int(match.group(1)), int(match.group(2) or 0), match.group(3)
    if half is not None:
        if not 1 <= hour <= 12:
            raise ShapeError(f"{text!r}: an hour with am/pm is 1 to 12")
        hour = hour % 12 + (12 if half == "pm" else 0)
    if hour > 23 or minute > 59:
        raise ShapeError(f"{text!r} is not a time of day")
    return hour, minute


def parse_schedule(text: str) -> tuple[str, str]:
    """A reference ``schedule`` -> ``("every", "5m")`` or ``("cron", "0 9 * * *")`` (UTC); ShapeError otherwise.

    A plain period ("every 5 minutes", "every hour", "every 2 days") becomes covenant's ``every``, which
    counts from the schedule's start (the reference rounds it to the clock with ``*/5``); a time of day
    ("daily at 9am", "weekdays at 17:30"), "hourly"/"daily"/"weekly"/"monthly" and a five-field cron
    line become ``cron``.
    """
    line = " ".join(text.lower().split())
    fields = line.split(" ")
    if len(fields) == 5 and all(_CRON_FIELD.match(f) for f in fields):
        return "cron", line
    if line in _NAMED:
        return "cron", _NAMED[line]
    period = _PERIOD.match(line)
    if period is not None:
        count = int(period.group(1) or 1)
        factor, unit = _PERIOD_UNIT[period.group(2)]
        if count < 1 or count * factor > 9_999_999:
            raise ShapeError(f"schedule {text!r}: the period must be 1 or more and under 10 million {unit}")
        return "every", f"{count * factor}{unit}"
    at = _AT.match(line)
    if at is not None:
        hour, minute = _hour_minute(at.group(2))
        return "cron", f"{minute} {hour} * * {_AT_DAYS[at.group(1)]}"
    raise ShapeError(f"cannot read the schedule {text!r}: write a period (\"every 5 minutes\", \"every 2 hours\"), "
                     "a time (\"daily at 9am\", \"weekdays at 17:30\", UTC) or a five-field cron line")


def _new_schedule_name() -> str:
    return "sched-" + secrets.token_hex(6)


def _schedule_create(arguments: dict[str, Any], caller: Caller, new_name: Callable[[], str]) -> tuple[dict[str, Any], list[str]]:
    """``{description, schedule, agent_name?, channel?, recipient?}`` -> covenant's ``{name, input, every|cron, agent}``.

    The firing's text is what the reference runtime sends a scheduled run: ``[SCHEDULED] <description>
    (schedule_id: <id>)``, and with a channel and a recipient a ``[CHANNEL_CONTEXT] channel=… recipient=…``
    line asking for rune@channel-send, so a package's "when a scheduled trigger fires" instructions work.
    """
    out = dict(arguments)
    mapped: list[str] = []
    if "schedule" in out:
        if "every" in out or "cron" in out:
            raise ShapeError("give schedule (the reference runtime's) or every/cron, not both")
        value = out.pop("schedule")
        if not isinstance(value, str):
            raise ShapeError(f"schedule must be text such as \"every 5 minutes\", got {type(value).__name__}")
        kind, timing = parse_schedule(value)
        out[kind] = timing
        mapped.append("schedule")
    if "agent_name" in out:
        if "agent" in out:
            raise ShapeError("give agent or agent_name (its name in the reference runtime), not both")
        out["agent"] = out.pop("agent_name")
        mapped.append("agent_name")
    reference_text = {key: out.pop(key) for key in ("description", "channel", "recipient") if key in out}
    if reference_text:
        if "input" in out:
            raise ShapeError("give input or description (the reference runtime's), not both")
        for key, value in reference_text.items():
            if not isinstance(value, str) or not value.strip() or any(c in value for c in "\r\n"):
                raise ShapeError(f"{key} must be one line of text, got {value!r}")
        if "description" not in reference_text:
            raise ShapeError("channel and recipient go with description (what the schedule reports)")
        if ("channel" in reference_text) != ("recipient" in reference_text):
            raise ShapeError("give channel and recipient together")
        out.setdefault("name", new_name())
        text = f"[SCHEDULED] {reference_text['description']} (schedule_id: {out['name']})"
        if "channel" in reference_text:
            text += (f"\n[CHANNEL_CONTEXT] channel={reference_text['channel']} recipient={reference_text['recipient']}"
                     "\nSend your report to this channel/recipient using rune@channel-send.")
        out["input"] = text
        mapped.extend(reference_text)
    return out, mapped


def _process_start(arguments: dict[str, Any], caller: Caller, new_name: Callable[[], str]) -> tuple[dict[str, Any], list[str]]:
    """``{command, args: [...]}``: covenant's command is one shell line, so the args are quoted onto it."""
    if "args" not in arguments:
        return dict(arguments), []
    out = dict(arguments)
    args = out.pop("args")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ShapeError("args must be a list of strings")
    if isinstance(out.get("command"), str) and args:
        out["command"] = " ".join([out["command"], *(shlex.quote(a) for a in args)])
    return out, ["args"]


_WHOLE: dict[str, Callable[[dict[str, Any], Caller, Callable[[], str]], tuple[dict[str, Any], list[str]]]] = {
    "rune@schedule-create": _schedule_create,
    "rune@process-start": _process_start,
}

ALIASED_TOOLS: frozenset[str] = frozenset(_ALIASES) | frozenset(_WHOLE)
"""The built-ins whose arguments have a reference shape that differs from covenant's."""


def canonical_arguments(
    tool: str, arguments: dict[str, Any], caller: Caller, *, new_name: Callable[[], str] = _new_schedule_name
) -> Mapped:
    """``arguments`` of the built-in ``tool`` (``rune@…``) in covenant's names; unchanged when nothing maps.

    ``new_name`` names a schedule created in the reference's shape (which has no name). Raises
    :class:`ShapeError` when the reference's shape asks for something covenant does not do.
    """
    out, mapped = _rename(tool, arguments, caller)
    whole = _WHOLE.get(tool)
    if whole is not None:
        out, more = whole(out, caller, new_name)
        mapped += more
    return Mapped(out, tuple(sorted(set(mapped))))
