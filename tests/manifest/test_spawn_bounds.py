"""A spawned agent's Runefile against its spawner's (covenant/manifest/spawn_bounds.py): each bound refused with
its field named, the fields left out taken from the spawner."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from covenant.manifest.runefile import Runefile
from covenant.manifest.spawn_bounds import bounded_by

MEMORY_MB = {"small": 256, "medium": 1024, "large": 4096}

SPAWNER: dict[str, Any] = {
    "name": "boss", "version": "0.1.0", "instructions": "x", "default_model": "d",
    "toolset": ["rune@system-time", "rune@file-write"], "max_steps": 8, "timeout_ms": 60_000,
    "networks": ["bridge", "ops"],
    "runtime": {"concurrency_limit": 4, "startup_timeout_ms": 20_000, "request_timeout_ms": 30_000,
                "resource_profile": "medium"},
    "models": {"providers": ["fake", "local"], "model_mapping": {"d": "m"}, "token_budget": 2000,
               "safety_policy": "standard"},
}
MINIMAL: dict[str, Any] = {"name": "helper", "version": "0.1.0", "instructions": "y", "default_model": "d",
                           "models": {"model_mapping": {"d": "m"}}}


def _runefile(data: dict[str, Any], **changes: Any) -> Runefile:
    merged = yaml.safe_load(yaml.safe_dump(data))
    for dotted, value in changes.items():
        target = merged
        *parents, last = dotted.split("__")
        for name in parents:
            target = target.setdefault(name, {})
        target[last] = value
    return Runefile.model_validate(merged)


def test_what_a_spawned_runefile_leaves_out_is_its_spawners() -> None:
    runefile, problems = bounded_by(_runefile(MINIMAL), _runefile(SPAWNER), MEMORY_MB.__getitem__)
    assert problems == []
    assert (runefile.timeout_ms, runefile.max_steps, runefile.networks) == (60_000, 8, ("bridge", "ops"))
    assert (runefile.runtime.concurrency_limit, runefile.runtime.resource_profile) == (4, "medium")
    assert (runefile.runtime.startup_timeout_ms, runefile.runtime.request_timeout_ms) == (20_000, 30_000)
    assert runefile.models.token_budget == 2000 and runefile.models.providers == ("fake", "local")
    assert runefile.models.safety_policy == "standard" and runefile.toolset == ()  # tools are never inherited
    assert runefile.models.model_mapping == {"d": "m"} and runefile.name == "helper"  # its own otherwise


def test_what_a_spawned_runefile_sets_within_its_spawners_stays() -> None:
    within = _runefile(MINIMAL, timeout_ms=1000, toolset=["rune@system-time"], networks=["ops"],
                       runtime__resource_profile="small", models__providers=["local"], models__token_budget=10,
                       models__safety_policy="strict")
    runefile, problems = bounded_by(within, _runefile(SPAWNER), MEMORY_MB.__getitem__)
    assert problems == []
    assert (runefile.timeout_ms, runefile.networks, runefile.models.providers) == (1000, ("ops",), ("local",))
    assert (runefile.runtime.resource_profile, runefile.models.safety_policy) == ("small", "strict")


BEYOND = [
    ({"timeout_ms": 600_000}, "timeout_ms: 600000 is more than its spawner's 60000"),
    ({"max_steps": 50}, "max_steps: 50 is more than its spawner's 8"),
    ({"runtime__concurrency_limit": 100}, "runtime.concurrency_limit: 100 is more than its spawner's 4"),
    ({"runtime__startup_timeout_ms": 60_000}, "runtime.startup_timeout_ms: 60000 is more than its spawner's 20000"),
    ({"runtime__request_timeout_ms": 60_000}, "runtime.request_timeout_ms: 60000 is more than its spawner's 30000"),
    ({"models__token_budget": 10**9}, "models.token_budget: 1000000000 is more than its spawner's 2000"),
    ({"runtime__resource_profile": "large"},
     "runtime.resource_profile: large (4096 MiB) is more memory than its spawner's medium (1024 MiB)"),
    ({"models__providers": ["fake", "openai"]}, "models.providers: openai not among its spawner's (fake, local)"),
    ({"models__safety_policy": "none"},
     "models.safety_policy: none is weaker than its spawner's standard (none < standard < strict)"),
    ({"toolset": ["rune@shell-exec"]}, "toolset: rune@shell-exec not among its spawner's"),
    ({"networks": ["bridge", "internet"]}, "networks: internet not among its spawner's (bridge, ops)"),
]


@pytest.mark.parametrize(("changes", "problem"), BEYOND, ids=[next(iter(c)) for c, _ in BEYOND])
def test_each_bound_past_the_spawners_is_named(changes: dict[str, Any], problem: str) -> None:
    _, problems = bounded_by(_runefile(MINIMAL, **changes), _runefile(SPAWNER), MEMORY_MB.__getitem__)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_memory_is_compared_in_mib_as_the_host_sizes_the_profiles() -> None:
    """A host that makes small as large as medium: small is then no more than a medium spawner's."""
    same = {"small": 1024, "medium": 1024, "large": 4096}.__getitem__
    spawner = _runefile(SPAWNER)
    assert bounded_by(_runefile(MINIMAL, runtime__resource_profile="small"), spawner, same)[1] == []
