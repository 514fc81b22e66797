"""A spawned agent is never more than its spawner (``rune@agent-spawn``): the Runefile fields that bound it.

Each bound is a Runefile field. One the spawned Runefile leaves out takes the spawner's value; one it sets
must be within the spawner's, else the spawn is refused with the field named:

- at most the spawner's: ``timeout_ms`` (its CPU and wall time per intent), ``max_steps``,
  ``runtime.concurrency_limit``, ``runtime.startup_timeout_ms``, ``runtime.request_timeout_ms``,
  ``models.token_budget``, and the memory of ``runtime.resource_profile`` (compared in MiB, as
  ``[rune] memory_*_mb`` make them);
- a subset of the spawner's: ``models.providers``, ``toolset``, ``networks``;
- never weaker: ``models.safety_policy``, in the order :data:`SAFETY_ORDER`.

Pure: no I/O. :func:`bounded_by` answers the Runefile the spawned agent gets, and every field past its
spawner's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from covenant.manifest.runefile import Runefile

__all__ = ["SAFETY_ORDER", "bounded_by"]

SAFETY_ORDER = ("none", "standard", "strict")
"""``models.safety_policy`` from the weakest to the strongest: ``standard`` redacts secrets, ``strict`` also
wraps tool results as untrusted and refuses an answer that still holds one."""

_AT_MOST = (("timeout_ms",), ("max_steps",), ("runtime", "concurrency_limit"), ("runtime", "startup_timeout_ms"),
            ("runtime", "request_timeout_ms"), ("models", "token_budget"))
_SUBSETS = (("models", "providers"), ("toolset",), ("networks",))
_INHERITED = (*_AT_MOST, ("runtime", "resource_profile"), ("models", "providers"), ("models", "safety_policy"),
              ("networks",))
"""Taken from the spawner when the spawned Runefile leaves them out (never ``toolset``: tools are chosen)."""


def _get(model: BaseModel, path: tuple[str, ...]) -> Any:
    value: Any = model
    for name in path:
        value = getattr(value, name)
    return value


def _is_set(model: BaseModel, path: tuple[str, ...]) -> bool:
    """Did the Runefile write ``path`` itself (not a default)?"""
    value: Any = model
    for name in path:
        if name not in value.model_fields_set:
            return False
        value = getattr(value, name)
    return True


def _with(model: BaseModel, path: tuple[str, ...], value: Any) -> Any:
    """``model`` with ``path`` set to ``value`` (copies along the path; the models are frozen)."""
    head, rest = path[0], path[1:]
    return model.model_copy(update={head: _with(getattr(model, head), rest, value) if rest else value})


def bounded_by(spawned: Runefile, spawner: Runefile, memory_mb: Callable[[str], int]) -> tuple[Runefile, list[str]]:
    """The Runefile the spawned agent gets (the fields it left out taken from ``spawner``), and every field that
    goes past the spawner's, each as ``FIELD: what is wrong`` (empty when none does).

    ``memory_mb`` gives the memory limit of a ``resource_profile`` (``[rune] memory_*_mb``).
    """
    runefile = spawned
    for path in _INHERITED:
        if not _is_set(spawned, path):
            runefile = _with(runefile, path, _get(spawner, path))
    problems = []
    for path in _AT_MOST:
        mine, theirs = _get(runefile, path), _get(spawner, path)
        if mine > theirs:
            problems.append(f"{'.'.join(path)}: {mine} is more than its spawner's {theirs}")
    profile, spawner_profile = runefile.runtime.resource_profile, spawner.runtime.resource_profile
    if memory_mb(profile) > memory_mb(spawner_profile):
        problems.append(f"runtime.resource_profile: {profile} ({memory_mb(profile)} MiB) is more memory than its "
                        f"spawner's {spawner_profile} ({memory_mb(spawner_profile)} MiB)")
    for path in _SUBSETS:
        extra = [entry for entry in _get(runefile, path) if entry not in _get(spawner, path)]
        if extra:
            problems.append(f"{'.'.join(path)}: {', '.join(extra)} not among its spawner's "
                            f"({', '.join(_get(spawner, path)) or 'none'})")
    safety, spawner_safety = runefile.models.safety_policy, spawner.models.safety_policy
    if SAFETY_ORDER.index(safety) < SAFETY_ORDER.index(spawner_safety):
        problems.append(f"models.safety_policy: {safety} is weaker than its spawner's {spawner_safety} "
                        f"({' < '.join(SAFETY_ORDER)})")
    return runefile, problems
