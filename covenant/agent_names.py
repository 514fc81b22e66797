"""Which agent a name given by a person means: the one rule for ``dispatch --agent`` and every command that
takes an agent (``logs``, ``history``, ``audit tail``, ``restart``, ``agents show``, ``tools list``, ``sessions``).

A full id (``name@namespace``) means that agent; a bare name means the one agent of that name in any
namespace, and is ``ambiguous`` when several namespaces have it. An agent made by ``rune@agent-spawn`` is
reached by its full id only (:mod:`covenant.spawned_ids`). A name that means no agent is an error naming it,
the closest ids and what is loaded — never an empty answer. Pure: the caller hands in the ids it knows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from os import PathLike

from covenant.errors import CovenantError, ExitCode
from covenant.spawned_ids import is_spawned_id

__all__ = ["NoAgent", "AmbiguousRoute", "resolve_agent_id", "resolve_recorded_agent_id", "unknown_agent"]

_LISTED = 10
"""Loaded agents an error lists by id; past that it says how many more."""


class NoAgent(CovenantError):
    code = "no_agent"
    exit_code = ExitCode.NO_AGENT
    http_status = 404


class AmbiguousRoute(CovenantError):
    code = "ambiguous"
    exit_code = ExitCode.NO_AGENT
    http_status = 409


def _by_bare_name(name: str, ids: Collection[str]) -> str | None:
    """The one id ``name@…`` of ``ids`` (spawned agents left out); ``ambiguous`` when several namespaces have it."""
    candidates = sorted({i for i in ids if i.partition("@")[0] == name and not is_spawned_id(i)})
    if len(candidates) > 1:
        raise AmbiguousRoute(
            f"{name!r} names {len(candidates)} agents ({', '.join(candidates)}); give the full id",
            candidates=candidates,
        )
    return candidates[0] if candidates else None


def unknown_agent(name: str, ids: Collection[str]) -> NoAgent:
    """The error for ``name`` meaning none of ``ids``: the closest ids first, then what is loaded."""
    import difflib  # here: only a request naming an unknown agent needs it, not an idle daemon

    listed = sorted(i for i in ids if not is_spawned_id(i))
    # Names are compared without their namespace: every id ends in "@local" alike, which says nothing.
    near = set(difflib.get_close_matches(name.partition("@")[0], {i.partition("@")[0] for i in listed}, cutoff=0.6))
    closest = [i for i in listed if i.partition("@")[0] in near]
    hint = f"did you mean {', '.join(closest)}? " if closest else ""
    loaded = ", ".join(listed[:_LISTED]) + (f" and {len(listed) - _LISTED} more" if len(listed) > _LISTED else "")
    return NoAgent(
        f"no agent with id {name!r} is loaded ({hint}loaded: {loaded or 'none'}; `covenant agents list` shows them)",
        agent=name,
    )


def resolve_agent_id(
    name: str, ids: Collection[str], *, withdrawn: Mapping[str, str | PathLike[str]] | None = None
) -> str:
    """The id of ``ids`` that ``name`` (a full id or a bare name) means.

    ``withdrawn`` (id -> manifest path) names agents a rejected edit took away, so that naming one says
    which file to fix. Raises :class:`NoAgent` (exit 6, HTTP 404) or :class:`AmbiguousRoute` (exit 6, 409).
    """
    if name in ids:
        return name
    withdrawn = withdrawn or {}
    gone = name if name in withdrawn else None
    if gone is None and "@" not in name:
        found = _by_bare_name(name, ids)
        if found is not None:
            return found
        gone = _by_bare_name(name, withdrawn)
    if gone is not None:
        raise NoAgent(
            f"agent {gone!r} is withdrawn: its manifest {withdrawn[gone]} was rejected at the last reload; fix it "
            "(`covenant agents check` names the problem), then run `covenant reload`",
            agent=gone,
        )
    raise unknown_agent(name, ids)


def resolve_recorded_agent_id(name: str, ids: Collection[str]) -> tuple[str, NoAgent | None]:
    """For what reads records kept for good (``history``, ``audit tail``): the id ``name`` means, and the
    error to raise if no record names it.

    A bare name must mean one of ``ids``. A full id none of ``ids`` has is taken as written — the records
    of an agent no longer loaded outlive it — with :class:`NoAgent` for the caller to raise when it finds
    none of them.
    """
    try:
        return resolve_agent_id(name, ids), None
    except NoAgent as exc:
        if "@" not in name:
            raise
        return name, exc
