"""covenant.toml on reload: read it again, apply what can change live, name what needs a restart.

A reload (SIGHUP, ``covenant reload``) first prepares, off the event loop and without touching anything
that runs: the file is loaded and validated, split against the running config
(:func:`~covenant.daemon.config_diff.plan_reload`), and every schedule, webhook route and A2A client is
resolved against identities.toml and the daemon's environment. Any problem there keeps the whole running
config and is reported with the file, the line and the key; nothing is half applied. Then each component
takes its part: the model gateway its providers, the tool host its tools, channels and MCP servers (a
replica whose offered tools change is drained and started again), the schedule runner its schedules, the
webhook and A2A apps their routes, clients and exposed agents, the registry scan the config it validates
against. Each reload is audited as ``config.reloaded`` (keys only: secrets are named by their variables in
covenant.toml and never read into the event).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from covenant.a2a.client import RemoteAgents
from covenant.a2a.server import A2AApp, resolve_clients
from covenant.a2a.server import Client as A2AClient
from covenant.audit.events import CONFIG_RELOADED
from covenant.audit.writer import AuditLog
from covenant.config import Config, McpServerConfig, ProviderConfig, load_config
from covenant.daemon.config_diff import ConfigPlan, plan_reload
from covenant.daemon.live_agents import LiveAgents
from covenant.daemon.rune_host import RuneHost
from covenant.errors import ConfigError
from covenant.home import Home
from covenant.policy.identities import KnownIdentities
from covenant.runtime.launch_plans import resolve_program
from covenant.runtime.runner import Runner
from covenant.toml_lines import entry_key_line
from covenant.triggers.schedules import ScheduleRunner, resolve_issuers
from covenant.triggers.webhooks import WebhookApp, resolve_routes

__all__ = ["ConfigOutcome", "ConfigReload", "Resolved", "resolve_named", "warn_unset_provider_keys"]

log = logging.getLogger("covenant.daemon")

_PRIVATE_TMPS = ("/tmp/", "/dev/shm/")


@dataclass(frozen=True)
class ConfigOutcome:
    """What one reload did with covenant.toml (the ``config`` part of the reload answer)."""

    config: Config
    """The config the daemon runs now (the previous one when ``error`` is set)."""
    changed: tuple[str, ...] = ()
    needs_restart: tuple[str, ...] = ()
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"changed": list(self.changed), "needs_restart": list(self.needs_restart), "error": self.error}


@dataclass(frozen=True)
class Resolved:
    """What covenant.toml names, resolved: the schedules', webhook routes' and A2A clients' issuer keys, and the
    routes' secrets and clients' tokens."""

    issuers: dict[str, str]
    routes: dict[str, Any]
    clients: list[A2AClient]


def _located(path: Path, text: str, table: str, id_key: str, ident: str, exc: ConfigError) -> ConfigError:
    """``exc`` prefixed with ``path:line`` of the key it is about, in the array-of-tables entry ``ident``."""
    key = str(exc.details.get("field", "")).rpartition(".")[2]
    line = entry_key_line(text, table, id_key, ident, key) if text and key else None
    return ConfigError(f"{path}:{line}: {exc.message}" if line else f"{path}: {exc.message}", **exc.details)


def resolve_named(config: Config, known: Mapping[str, str], environ: Mapping[str, str], path: Path,
                  text: str) -> Resolved:
    """Every ``[[schedules]]`` issuer, ``[[webhooks.routes]]`` issuer and secret and ``[[a2a.clients]]`` issuer and
    token; ConfigError naming the file, the line and the key of the first that cannot be resolved."""
    issuers: dict[str, str] = {}
    for schedule in config.schedules:
        try:
            issuers.update(resolve_issuers((schedule,), dict(known)))
        except ConfigError as exc:
            raise _located(path, text, "schedules", "name", schedule.name, exc) from None
    routes: dict[str, Any] = {}
    for route in config.webhooks.routes:
        try:
            routes.update(resolve_routes(config.webhooks.model_copy(update={"routes": (route,)}), dict(known), environ))
        except ConfigError as exc:
            raise _located(path, text, "webhooks.routes", "path", route.path, exc) from None
    clients: list[A2AClient] = []
    for client in config.a2a.clients:
        try:
            clients += resolve_clients(config.a2a.model_copy(update={"clients": (client,)}), dict(known), environ)
        except ConfigError as exc:
            raise _located(path, text, "a2a.clients", "name", client.name, exc) from None
    return Resolved(issuers, routes, clients)


def warn_unset_provider_keys(providers: Mapping[str, ProviderConfig], names: Iterable[str],
                             environ: Mapping[str, str]) -> None:
    """Log each provider of ``names`` whose ``api_key_env`` the daemon's environment lacks: its calls are skipped
    (``provider_unavailable`` when it is an agent's only one) until the daemon starts with the variable set."""
    for name in names:
        provider = providers.get(name)
        if provider is not None and provider.api_key_env and not environ.get(provider.api_key_env):
            log.warning("provider key variable not set in the daemon's environment; its calls are skipped",
                        extra={"provider": name, "api_key_env": provider.api_key_env})


def _tmp_entries(paths: Iterable[str]) -> set[str]:
    """``/tmp/NAME`` (or ``/dev/shm/NAME``) for each path under a private /tmp, as given and resolved."""
    entries = set()
    for path in paths:
        for candidate in {os.path.abspath(path), os.path.realpath(path)}:
            for root in _PRIVATE_TMPS:
                if candidate.startswith(root):
                    entries.add(root + candidate[len(root):].split("/", 1)[0])
    return entries


def _mcp_tmp_rule(runner: Runner, running: Config) -> Callable[[McpServerConfig], bool]:
    """Whether an ``[mcp.NAME]`` table needs a restart: when agents have a private /tmp, only what was named at
    start under /tmp or /dev/shm is shown in it, so a server whose program or paths lie elsewhere there waits."""
    spaces = runner.mount_namespaces
    if spaces is None:
        return lambda _server: False
    shown: set[str] = set()

    def needs_restart(server: McpServerConfig) -> bool:  # blocking (it resolves paths): called off the loop
        if not shown:
            shown.update(_tmp_entries(spaces.always_needed))
        program = resolve_program(server.command[0], running.runtime.path)
        return not _tmp_entries([*([program] if program else []), *server.named_paths()]) <= shown

    return needs_restart


class ConfigReload:
    """The daemon's running config and the components that take a reloaded one."""

    def __init__(self, *, home: Home, config: Config, runner: Runner, rune: RuneHost, agents: LiveAgents,
                 remote: RemoteAgents, schedules: ScheduleRunner, webhooks: WebhookApp, a2a: A2AApp,
                 audit: AuditLog) -> None:
        self.home = home
        self.running = config
        self.needs_restart: tuple[str, ...] = ()
        """Keys the last reload found changed in the file but could not apply (``covenant status``)."""
        self._mcp_rule = _mcp_tmp_rule(runner, config)
        self._rune = rune
        self._agents = agents
        self._remote = remote
        self._schedules = schedules
        self._webhooks = webhooks
        self._a2a = a2a
        self._audit = audit

    def _prepare(self) -> tuple[ConfigPlan, Resolved]:
        """Load, validate, split and resolve the file (blocking); ConfigError with file, line and key."""
        new = load_config(self.home)
        plan = plan_reload(self.running, new, mcp_needs_restart=self._mcp_rule)
        try:
            text = self.home.config_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        known = KnownIdentities(self.home).all()
        return plan, resolve_named(plan.config, known, os.environ, self.home.config_path, text)

    async def reload(self, *, reason: str) -> ConfigOutcome:
        """Read covenant.toml again and apply it; audited as ``config.reloaded``. Never raises for the file."""
        try:
            plan, named = await trio.to_thread.run_sync(self._prepare)
        except ConfigError as exc:
            outcome = ConfigOutcome(self.running, error=exc.message)
            log.error("covenant.toml not reloaded; the running config is kept", extra={"problem": exc.message})
        else:
            await self._apply(plan, named)
            outcome = ConfigOutcome(plan.config, plan.changed, plan.needs_restart)
            self.needs_restart = plan.needs_restart
            log.info("covenant.toml reloaded", extra={"changed": ",".join(plan.changed) or "-",
                                                     "needs_restart": ",".join(plan.needs_restart) or "-"})
            for key in plan.needs_restart:
                log.warning("covenant.toml change needs a restart of the daemon to apply", extra={"key": key})
        await self._audit.record(CONFIG_RELOADED, {"reason": reason, **outcome.to_json()})
        return outcome

    async def _apply(self, plan: ConfigPlan, named: Resolved) -> None:
        """Hand each component its part of the new config; nothing here can fail on the file's account."""
        config = plan.config
        self.running = config
        restarting = await self._rune.set_config(config)
        if restarting:
            log.info("replicas restart to offer their new tools", extra={"agents": ",".join(restarting)})
        # LiveAgents validates manifests against its config at each rescan; it has no setter yet (the
        # registry's owner adds one), so the reloaded config is handed over here.
        self._agents.use_config(config)
        self._remote.set_config(config.a2a)
        self._webhooks.set_routes(config.webhooks, named.routes)
        self._a2a.set_clients(config.a2a, named.clients)
        await self._schedules.replace(config.schedules, named.issuers)
        warn_unset_provider_keys(config.providers, [k.partition(".")[2] for k in plan.changed
                                                    if k.startswith("providers.")], os.environ)
