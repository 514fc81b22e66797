"""The agent's environment: built from an allowlist, never inherited."""

from __future__ import annotations

from collections.abc import Mapping

from covenant.config import RuntimeConfig
from covenant.runtime.sampler import MARKER_NAME

__all__ = ["agent_environment", "FIXED_DEFAULTS"]

FIXED_DEFAULTS: dict[str, str] = {"LANG": "C.UTF-8", "TZ": "UTC"}
"""Locale and time zone every agent gets unless covenant.toml's runtime.env says otherwise."""


def agent_environment(
    config: RuntimeConfig,
    *,
    agent_id: str,
    intent_id: str,
    scratch: str,
    parent_env: Mapping[str, str],
) -> dict[str, str]:
    """PATH, HOME/TMPDIR (the scratch dir), LANG, TZ, allowed names, then COVENANT_*.

    Precedence, lowest first: fixed defaults, ``runtime.env``, names listed in
    ``runtime.env_allow`` that the daemon's environment holds, and finally the
    ``COVENANT_*`` variables, which nothing may override: the intent id marks
    every process of the dispatch so teardown can find escaped descendants.
    """
    env = {"PATH": config.path, "HOME": scratch, "TMPDIR": scratch, **FIXED_DEFAULTS}
    env.update(config.env)
    for name in config.env_allow:
        if name in parent_env:
            env[name] = parent_env[name]
    env["COVENANT_AGENT_ID"] = agent_id
    env[MARKER_NAME] = intent_id
    return env
