"""Which covenant.toml keys a reload applies to the running daemon, and which wait for a restart.

Pure: the running :class:`~covenant.config.Config` and a freshly loaded one in; out come the keys that
changed, split into those applied live and those that need a restart, and the config the daemon runs
from then on: the new file, except that every key needing a restart keeps its running value (so what
``status`` and the components report stays what really runs, and the key is named again at the next
reload until the daemon restarts). docs/configuration.md ("Reloading covenant.toml") has the table.

Keys are named as an operator writes them: ``runtime.kill_grace_ms``, ``webhooks.listen``, a named
table whole (``providers.local``, ``mcp.clock``, ``channels.alerts``), an entry of an array of tables
by its name or path (``schedules[nightly]``, ``webhooks.routes[/hooks/build]``, ``a2a.clients[ci]``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from covenant.config import Config, McpServerConfig
from covenant.triggers.webhook_config import ListenerLimits

__all__ = ["FRONT_DOOR_RESTART_KEYS", "LISTENER_KEYS", "RESTART_TABLES", "ConfigPlan", "changed_keys", "plan_reload"]

RESTART_TABLES = ("agents_dir", "socket", "runtime", "audit", "policy", "daemon", "log", "rune", "isolation", "fleet")
"""Top-level keys and tables the daemon (or ``covenant fleet``, for ``[fleet]``) takes once, at start: the
registry and its snapshots, the control socket, the runner and its namespaces, the audit writer, the
intent verifier and its replay cache, the run slots, the log handlers, the replicas, the uid allocator."""

LIVE_AUDIT_KEYS = ("pubkey",)
"""``[audit]`` keys the daemon never reads (``covenant audit verify`` reads the file each time)."""

LISTENER_KEYS = ("listen", *ListenerLimits.model_fields)
"""``[webhooks]`` and ``[a2a]`` keys of the bound listener: its address and its connection limits."""

FRONT_DOOR_RESTART_KEYS = {"webhooks": (*LISTENER_KEYS, "skew_s"), "a2a": LISTENER_KEYS}
"""Per listener table, the keys fixed at start: the listener's, and ``[webhooks] skew_s``, which sizes the
window of accepted signatures restored from the audit log at start (a longer one applied live could let a
signature forgotten under the shorter one be replayed)."""

_ARRAY_IDS = ("name", "path")
"""The field that names an entry of an array of tables (``[[schedules]]`` name, ``[[webhooks.routes]]`` path)."""


@dataclass(frozen=True)
class ConfigPlan:
    """What one reload of covenant.toml does."""

    config: Config
    """The config the daemon runs after the reload."""
    changed: tuple[str, ...]
    """Keys whose new value is applied now."""
    needs_restart: tuple[str, ...]
    """Keys whose new value differs from the running one and applies only after a restart."""


def _entry_id(item: Any) -> str | None:
    if isinstance(item, BaseModel):
        for field in _ARRAY_IDS:
            value = getattr(item, field, None)
            if isinstance(value, str):
                return value
    return None


def _named_entries(value: Any) -> dict[str, Any] | None:
    """An array of tables as id -> entry (``{}`` for an empty array), or None when ``value`` is not one."""
    if not isinstance(value, tuple):
        return None
    ids = [_entry_id(item) for item in value]
    if any(i is None for i in ids):
        return None
    return dict(zip(ids, value))  # type: ignore[arg-type]


def _table_of_models(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(v, BaseModel) for v in value.values())


def changed_keys(old: BaseModel, new: BaseModel, prefix: str = "") -> list[str]:
    """Every key whose value differs between ``old`` and ``new`` (same model), in the models' field order."""
    keys: list[str] = []
    for field in type(new).model_fields:
        before, after = getattr(old, field), getattr(new, field)
        if before == after:
            continue
        path = f"{prefix}{field}"
        if isinstance(before, BaseModel) and type(before) is type(after):
            keys += changed_keys(before, after, f"{path}.")
        elif _table_of_models(before) and _table_of_models(after):
            keys += [f"{path}.{name}" for name in sorted(before.keys() | after.keys()) if before.get(name) != after.get(name)]
        elif (entries := _named_entries(before)) is not None and (news := _named_entries(after)) is not None:
            names = [*entries, *(n for n in news if n not in entries)]
            keys += [f"{path}[{name}]" for name in names if entries.get(name) != news.get(name)]
        else:
            keys.append(path)
    return keys


def _needs_restart(key: str, restart_mcp: set[str]) -> bool:
    top, _, rest = key.partition(".")
    top = top.partition("[")[0]
    if top == "audit":
        return rest not in LIVE_AUDIT_KEYS
    if top in RESTART_TABLES:
        return True
    if top in FRONT_DOOR_RESTART_KEYS:
        return rest in FRONT_DOOR_RESTART_KEYS[top]
    if top == "mcp":
        return rest in restart_mcp
    return False


def plan_reload(
    running: Config, new: Config, *, mcp_needs_restart: Callable[[McpServerConfig], bool] = lambda _: False
) -> ConfigPlan:
    """Split the difference between ``running`` and ``new`` into what applies now and what waits.

    ``mcp_needs_restart`` says whether an ``[mcp.NAME]`` table (new or changed) can only run after a
    restart (a program or path under a private /tmp that agents' namespaces were not made to show).
    """
    keys = changed_keys(running, new)
    restart_mcp = {
        key.partition(".")[2] for key in keys
        if key.startswith("mcp.") and (server := new.mcp.get(key.partition(".")[2])) is not None
        and mcp_needs_restart(server)
    }
    needs_restart = tuple(k for k in keys if _needs_restart(k, restart_mcp))
    changed = tuple(k for k in keys if k not in needs_restart)
    mcp = dict(new.mcp)
    for name in restart_mcp:
        if name in running.mcp:
            mcp[name] = running.mcp[name]
        else:
            del mcp[name]
    kept: dict[str, Any] = {name: getattr(running, name) for name in RESTART_TABLES}
    kept["audit"] = running.audit.model_copy(update={k: getattr(new.audit, k) for k in LIVE_AUDIT_KEYS})
    for table, fixed in FRONT_DOOR_RESTART_KEYS.items():
        kept[table] = getattr(new, table).model_copy(update={k: getattr(getattr(running, table), k) for k in fixed})
    kept["mcp"] = mcp
    return ConfigPlan(new.model_copy(update=kept), changed, needs_restart)
