"""The daemon's lifecycle: open everything in order, serve, reload on SIGHUP, drain on SIGTERM.

Start-up order matters for systemd: READY=1 is sent only after the registry is
scanned, the audit log is open (and recovered) and the socket serves.
Exit status: 0 after a clean drain, 5 when the drain timed out and in-flight
dispatches had to be cancelled.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from covenant import __version__
from covenant.clock import ms_from_iso, now_ms
from covenant.audit.errors import AuditUnavailable
from covenant.audit.writer import AuditLog
from covenant.config import Config
from covenant.daemon import systemd
from covenant.daemon.agents_state import LoadedAgents
from covenant.daemon.api import ControlAPI
from covenant.daemon.config_reload import ConfigReload, warn_unset_provider_keys
from covenant.daemon.grants_watch import GrantsWatch, IdentityNames
from covenant.daemon.home_lock import serving_home
from covenant.daemon.interrupted import record_interrupted_intents
from covenant.daemon.logstream import LogBroadcaster
from covenant.daemon.front_doors import FrontDoors
from covenant.daemon.metrics import Metrics
from covenant.daemon.network_server import serve_network
from covenant.daemon.scheduler import ShuttingDown
from covenant.daemon.refusal_count import counting_refusals
from covenant.daemon.server import bind_unix_socket, serve
from covenant.daemon.start_config import StartConfig
from covenant.daemon.registry_scan import scan_with_snapshots, snapshot_store
from covenant.daemon.rune_host import RuneHost
from covenant.daemon.service import Daemon
from covenant.daemon.stopped_agents import STOPPED_FILE, StoppedAgents
from covenant.errors import ConfigError, ConfigProblems, ExitCode
from covenant.home import Home
from covenant.homeinit import check_home_modes, init_home
from covenant.daemon.agent_calls import DaemonAgentCalls
from covenant.keys import load_private_key, public_key_hex
from covenant.manifest.registry import Registry
from covenant.models import ModelGateway
from covenant.policy.budget import BudgetLedger
from covenant.policy.grants import GrantStore
from covenant.policy.identities import KnownIdentities
from covenant.runtime.artifacts import ArtifactRefused
from covenant.runtime.cpu_class import CpuGroups
from covenant.runtime.host import network_isolation_available, set_child_subreaper
from covenant.runtime.isolation import Isolation, open_isolation, reachability_problems
from covenant.runtime.launch_plans import resolve_program
from covenant.runtime.liveroots import LiveRoots
from covenant.runtime.records import DispatchStore
from covenant.runtime.runner import Runner, paths_agent_processes_run
from covenant.tools import ToolHost
from covenant.tools.containers import remove_left_containers
from covenant.triggers.agent_schedules import AgentScheduleStore, agent_schedules_path
from covenant.triggers.onbehalf import OnBehalfSigner
from covenant.triggers.schedules import ScheduleRunner
from covenant.triggers.state import ScheduleState
from covenant.triggers.webhooks import WebhookApp
from covenant.a2a.card import AgentFacts, find_agent
from covenant.a2a.server import A2AApp, Client as A2AClient
from covenant.runtime.outcome import DispatchRecord

__all__ = ["DaemonOptions", "run_daemon"]

log = logging.getLogger("covenant.daemon")

HOUR_MS = 3600 * 1000


@dataclass(frozen=True)
class DaemonOptions:
    socket_path: Path
    drain_timeout_s: float


def _budget_from_history(store: DispatchStore, agents: Registry, now_ms: int) -> BudgetLedger:
    """Rebuild the rolling budgets from the last hour of records, so a restart does not reset them.

    Only agents with a budget are charged, so a busy hour of unbudgeted
    dispatches costs nothing at start-up.
    """
    budgeted = {a.id for a in agents.agents.values() if a.settlement.budget_credits_per_hour > 0}
    charges = []
    if budgeted:
        for record in store.newest_first():
            ended = ms_from_iso(record.ended_at)
            if now_ms - ended > HOUR_MS:
                break  # newest first: everything after this is older
            if record.agent_id in budgeted:
                charges.append((record.agent_id, record.cpu_ms, ended))
    return BudgetLedger.from_records(charges, now_ms)


NOFILE_TARGET = 65536


def _raise_open_files_limit() -> None:
    """Lift the soft RLIMIT_NOFILE towards the hard limit.

    Every queued dispatch holds a client connection (queue_max defaults to
    1000) and every running agent three pipes and a pidfd; the usual soft
    limit of 1024 would make accept() fail under a full queue.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = NOFILE_TARGET if hard == resource.RLIM_INFINITY else min(hard, NOFILE_TARGET)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _open_isolation(home: Home, config: Config) -> Isolation:
    """Decide the agents' uid, check what they must reach, and say loudly what is not enforced.

    ``[isolation] require = true`` turns a same-uid host or an unreachable
    interpreter into a refusal to start (ConfigError).
    """
    import covenant

    isolation = open_isolation(config.isolation, home.state_dir)
    if not isolation.enforced:
        log.warning(
            "isolation: same-uid: agents run as covenant's own uid and can read its keys and audit log "
            "(docs/security.md); run the daemon as root, or set isolation.require = true to refuse",
            extra={"reason": isolation.reason},
        )
        return isolation
    runtime = config.runtime
    needs = [
        (resolve_program(runtime.python3, runtime.path) or runtime.python3, "file", "runtime.python3"),
        (config.rune.python or sys.executable, "file", "rune.python (replicas run covenant's own code under it)"),
        (os.path.dirname(covenant.__file__), "dir", "rune.python (covenant's package must be readable)"),
        (str(home.agents_dir), "dir", "agents_dir"),
    ]
    node = resolve_program(runtime.node, runtime.path)
    if node is not None:
        needs.append((node, "file", "runtime.node"))
    isolation.problems = reachability_problems(needs, isolation)
    for problem in isolation.problems:
        log.warning("agent uids cannot reach what they must run", extra={"problem": problem})
    if isolation.problems and config.isolation.require:
        raise ConfigError(
            "isolation.require = true, but agent uids cannot reach what they must run: "
            + "; ".join(isolation.problems),
            field="isolation.require",
        )
    return isolation


def _open_sockets(options: DaemonOptions) -> tuple[list[socket.socket], list[str], bool]:
    """Sockets passed by systemd (LISTEN_FDS) or our own; the flag says which."""
    activated = systemd.listen_fds()
    if activated:
        return activated, [str(s.getsockname()) for s in activated], True
    return [bind_unix_socket(options.socket_path)], [str(options.socket_path)], False


def _rune_host(
    home: Home, config: Config, runner: Runner, audit: AuditLog, grants: GrantsWatch, metrics: Metrics,
    key: Ed25519PrivateKey,
) -> RuneHost:
    """Replicas, the model gateway (it alone reads the provider keys) and the tool host."""
    models = ModelGateway(config.providers, environ=os.environ, audit=audit.record, store_text=config.audit.store_text,
                          observe=metrics.observe_model_call, is_agent_uid=runner.isolation.is_agent_uid)
    tools = ToolHost(home, config, runner, audit.record, packages=lambda agent: rune.packages.get(agent.id),
                     observe=metrics.observe_tool_call)
    skills = Path(config.rune.skills_dir)
    rune = RuneHost(
        state_dir=home.state_dir,
        skills_dir=skills if skills.is_absolute() else home.root / skills,
        config=config,
        runner=runner,
        models=models,
        tools=tools,
        grants=lambda: grants.current,
        key=key,
    )
    rune.replicas.on_restart = metrics.replica_restarted
    return rune


def _a2a_app(config: Config, clients: list[A2AClient], daemon: Daemon, key: Ed25519PrivateKey, audit: AuditLog,
             store: DispatchStore) -> A2AApp:
    """The A2A listener's app: exposed agents looked up in what is loaded now (reloads included)."""

    def agent(name: str) -> AgentFacts | None:
        loaded = daemon.agents.loaded
        return find_agent(name, loaded.agents, loaded.packages, loaded.workflows)

    async def record(intent_id: str) -> DispatchRecord | None:
        return await trio.to_thread.run_sync(store.get, intent_id)

    async def artifact_bytes(intent_id: str, name: str) -> bytes | None:
        artifacts = daemon.rune.tools.services.artifacts
        assert artifacts is not None
        try:
            found = await trio.to_thread.run_sync(artifacts.read, intent_id, name)
        except (ArtifactRefused, OSError) as exc:
            log.warning("artifact %s of intent %s not readable: %s", name, intent_id, exc)
            return None
        return None if found is None else found[1]

    return A2AApp(config.a2a, clients, agent, OnBehalfSigner(key), audit.record, daemon, record,
                  store_text=config.audit.store_text, artifact_bytes=artifact_bytes)


def _bind_tcp(listen: str, key: str) -> socket.socket:
    """The TCP listener of ``[webhooks] listen`` or ``[a2a] listen`` (HOST:PORT); ConfigError when it cannot be bound."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        table = key.partition(".")[0]
        raise ConfigError(f"[{table}] listen = {listen!r}: cannot listen there ({exc.strerror})", field=key) from None
    sock.listen(1024)  # the accept loop closes what is over its caps at once: a deep backlog only absorbs bursts
    return sock


def _bind_listeners(config: Config) -> dict[str, socket.socket]:
    """The sockets of ``[webhooks] listen`` and ``[a2a] listen`` that are set; one ConfigError naming each that
    cannot be bound (none is left open then)."""
    bound: dict[str, socket.socket] = {}
    problems = ConfigProblems()
    for name, listen in (("webhooks", config.webhooks.listen), ("a2a", config.a2a.listen)):
        if listen:
            with problems.gathered():
                bound[name] = _bind_tcp(listen, f"{name}.listen")
    if problems.errors:
        for sock in bound.values():
            sock.close()
    problems.raise_any()
    return bound


def _address(sock: socket.socket) -> str:
    """HOST:PORT a listener is bound to (the port the kernel chose for ``:0``)."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Lifecycle:
    """Signals, reload and the drain of one daemon run."""

    def __init__(
        self, daemon: Daemon, api: ControlAPI, runner: Runner, notifier: systemd.Notifier, drain_timeout_s: float
    ) -> None:
        self.notifier = notifier
        self.daemon = daemon
        self.api = api
        self.runner = runner
        self.drain_timeout_s = drain_timeout_s
        self.exit_code = ExitCode.OK
        self.cancelled = 0

    async def serve_until_stop_signal(self, signals: AsyncIterator[int]) -> None:
        """SIGHUP reloads; return at the first SIGTERM or SIGINT."""
        async for signum in signals:
            if signum != signal.SIGHUP:
                return
            self.notifier.reloading()
            await self.daemon.reload(reason="sighup")
            self.notifier.ready(self.status_text())

    @staticmethod
    async def _cancel_on_stop_signal(signals: AsyncIterator[int], scope: trio.CancelScope) -> None:
        async for signum in signals:
            if signum != signal.SIGHUP:
                log.warning("second stop signal: cancelling in-flight dispatches now")
                scope.cancel()
                return

    def status_text(self) -> str:
        loaded = self.daemon.agents.loaded
        return f"serving {len(loaded.agents)} agents ({len(loaded.problems)} rejected)"

    async def drain(self, signals: AsyncIterator[int]) -> None:
        """Refuse new work, wait for in-flight dispatches, cancel them past the timeout.

        A second SIGTERM/SIGINT during the wait ends it at once; SIGHUP is ignored.
        """
        daemon = self.daemon
        daemon.shutting_down = True
        daemon.scheduler.close(ShuttingDown("the daemon is shutting down; the dispatch was not started"))
        in_flight = daemon.admitted
        self.notifier.stopping(f"draining {in_flight} in-flight dispatches (up to {self.drain_timeout_s:g} s)")
        log.info("draining", extra={"in_flight": in_flight, "timeout_s": self.drain_timeout_s})
        with trio.move_on_after(self.drain_timeout_s):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._cancel_on_stop_signal, signals, nursery.cancel_scope)
                await daemon.idle.wait()
                nursery.cancel_scope.cancel()
        if daemon.admitted:
            self.cancelled = daemon.admitted
            self.exit_code = ExitCode.UNREACHABLE
            log.warning("drain timed out; cancelling in-flight dispatches", extra={"in_flight": self.cancelled})
            daemon.cancels.cancel_all()
            await daemon.idle.wait()
        # Let the last responses reach their clients before the server goes away.
        with trio.move_on_after(5):
            await self.api.wait_requests_done()


@asynccontextmanager
async def _cpu_groups(home: Home) -> AsyncIterator[CpuGroups]:
    """The CPU groups of this home's agents: what a killed daemon left is removed first; all are removed when
    the daemon stops (after its runner has ended every agent process)."""
    groups = await trio.to_thread.run_sync(CpuGroups.open, str(home.state_dir.resolve()))
    try:
        yield groups
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(groups.close)


async def serve_daemon(
    home: Home,
    start: StartConfig,
    options: DaemonOptions,
    logs: LogBroadcaster,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Run the daemon until SIGTERM/SIGINT; return the exit status."""
    config = start.config
    with trio.open_signal_receiver(signal.SIGHUP, signal.SIGTERM, signal.SIGINT) as signals, systemd.Notifier() as notifier:
        await trio.to_thread.run_sync(init_home, home)
        for warning in await trio.to_thread.run_sync(check_home_modes, home):
            log.warning("home mode too wide", extra={"problem": warning})
        key = await trio.to_thread.run_sync(load_private_key, home.daemon_key_path)
        isolation = await trio.to_thread.run_sync(_open_isolation, home, config)
        set_child_subreaper()
        _raise_open_files_limit()
        metrics = Metrics()
        scan = await trio.to_thread.run_sync(scan_with_snapshots, home, config, snapshot_store(home))
        stopped = StoppedAgents(home.state_dir / STOPPED_FILE)
        await trio.to_thread.run_sync(stopped.load)  # before anything opens: a damaged file is a config error (exit 2)
        registry = scan.registry
        store = DispatchStore(home.dispatches_dir)
        budget = await trio.to_thread.run_sync(_budget_from_history, store, registry, now_ms())
        grants = await trio.to_thread.run_sync(GrantsWatch, GrantStore(home.grants_path, key.public_key()))
        names = IdentityNames(KnownIdentities(home), home.known_identities_path)
        listeners = _bind_listeners(config)
        webhook_socket, a2a_socket = listeners.get("webhooks"), listeners.get("a2a")
        warn_unset_provider_keys(config.providers, config.providers, os.environ)
        # Probing runs `unshare` once (cached): do it here, never on the loop in a status call.
        network_isolation = await trio.to_thread.run_sync(network_isolation_available)
        sockets, socket_names, activated = _open_sockets(options)
        async with AuditLog.open(
            home.audit_dir, key, config.audit, on_batch=metrics.observe_audit_batch, dispatches=home.dispatches_dir
        ) as audit:
            await record_interrupted_intents(home, audit, registry, isolation)
            if isolation.enforced:
                # Survivors of an earlier run (covenant killed with -9) die before any new work: its containers
                # (run only with agent uids) are removed first, while podman still knows them as running.
                containers = await trio.to_thread.run_sync(remove_left_containers, str(home.state_dir.resolve()), config)
                swept = await trio.to_thread.run_sync(isolation.sweep_survivors)
                await audit.record(
                    "isolation.sweep",
                    {"reason": "start", "uids": swept.uids, "pids": swept.pids, "survivors": swept.survivors,
                     "containers": containers},
                )
                if swept.pids:
                    log.warning("killed processes left by an earlier run", extra={"pids": len(swept.pids), "uids": swept.uids})
                if containers:
                    log.warning("removed containers left by an earlier run", extra={"containers": ",".join(containers)})
            async with _cpu_groups(home) as cpu_groups, Runner.open(
                config.runtime,
                scratch_root=home.state_dir / "scratch",
                isolation=isolation,
                live_roots=LiveRoots(),
                own_children=lambda: audit.process_ids,
                visible=paths_agent_processes_run(config),
                rune=config.rune,
                cpu_groups=cpu_groups,
            ) as runner:
                rune = _rune_host(home, config, runner, audit, grants, metrics, key)
                daemon = Daemon(
                    home=home,
                    config=config,
                    runner=runner,
                    audit=audit,
                    store=store,
                    grants=grants,
                    names=names,
                    agents=LoadedAgents.first(scan),
                    budget=budget,
                    metrics=metrics,
                    socket_paths=socket_names,
                    network_isolation=network_isolation,
                    rune=rune,
                    key=key,
                    isolation=isolation,
                )
                rune.tools.services.agents = DaemonAgentCalls(daemon)
                await daemon.restore_replay_window()
                daemon.agents.use_stopped(stopped)
                await trio.to_thread.run_sync(daemon.agents.clear_spawned)  # spawned agents never survive a restart
                await audit.record(
                    "daemon.start",
                    {
                        "pid": os.getpid(),
                        "version": __version__,
                        "sockets": socket_names,
                        "pubkey": public_key_hex(key),
                        "isolation": isolation.mode,
                    },
                )
                await daemon.agents.record_registry(reason="start")
                schedules = ScheduleRunner(config.schedules, start.schedule_issuers, ScheduleState(home.state_dir / "schedules.json"),
                                           OnBehalfSigner(key), audit, daemon,
                                           AgentScheduleStore(agent_schedules_path(home.state_dir)))
                webhooks = WebhookApp(config.webhooks, start.webhook_routes, OnBehalfSigner(key), audit.record, daemon)
                await webhooks.restore(home.audit_dir)
                a2a = _a2a_app(config, start.a2a_clients, daemon, key, audit, store)
                await a2a.restore(home.audit_dir)
                daemon.config_reload = ConfigReload(home=home, config=config, runner=runner, rune=rune,
                                                    agents=daemon.agents, remote=daemon.remote.remotes,
                                                    schedules=schedules, webhooks=webhooks, a2a=a2a, audit=audit)
                daemon.front_doors = FrontDoors(
                    config_path=str(home.config_path), webhooks=webhooks, a2a=a2a, schedules=schedules,
                    fleet=config.fleet, has_agent=lambda name: daemon.agents.find(name) is not None,
                    listening={name: _address(sock) for name, sock in listeners.items()},
                )
                daemon.front_doors.warn_unknown_names()
                api = ControlAPI(daemon, logs, schedules.view)
                lifecycle = _Lifecycle(daemon, api, runner, notifier, options.drain_timeout_s)
                async with trio.open_nursery() as nursery:
                    await nursery.start(rune.tools.mcp.run)
                    await nursery.start(rune.replicas.run)
                    startable = daemon.agents.replica_packages()  # a stopped agent gets no replica
                    await rune.start_eager({i: package for i, (_, package) in startable.items()}, daemon.agents.loaded.agents)
                    await nursery.start(partial(serve, on_closed=partial(metrics.listener_closed, "control")),
                                        counting_refusals(api, "control", metrics.http_refusal), sockets)
                    await nursery.start(schedules.run)
                    await nursery.start(daemon.agents.expire)
                    if webhook_socket is not None:
                        await nursery.start(partial(serve_network, name="webhooks", limits=config.webhooks,
                                                    observer=metrics),
                                            counting_refusals(webhooks, "webhooks", metrics.http_refusal), [webhook_socket])
                    if a2a_socket is not None:
                        await nursery.start(a2a.run)  # where returnImmediately tasks run on
                        await nursery.start(partial(serve_network, name="a2a", limits=config.a2a, observer=metrics),
                                            counting_refusals(a2a, "a2a", metrics.http_refusal), [a2a_socket])
                    watchdog_period = systemd.watchdog_interval_s()
                    if watchdog_period is not None:
                        nursery.start_soon(systemd.run_watchdog, notifier, watchdog_period)
                    notifier.ready(lifecycle.status_text())
                    log.info("ready", extra={"sockets": ",".join(socket_names), "agents": len(daemon.agents.loaded.agents)})
                    task_status.started(socket_names)
                    await lifecycle.serve_until_stop_signal(signals)
                    await lifecycle.drain(signals)
                    await rune.replicas.stop_all()
                    await rune.models.aclose()
                    await daemon.remote.remotes.aclose()
                    nursery.cancel_scope.cancel()
                try:
                    await audit.record(
                        "daemon.stop",
                        {"exit_code": lifecycle.exit_code, "cancelled": lifecycle.cancelled},
                    )
                except AuditUnavailable as exc:
                    log.error("daemon.stop could not be recorded", extra={"error": exc.message})
        for sock in sockets:
            sock.close()
        for listener in (webhook_socket, a2a_socket):
            if listener is not None:
                listener.close()
        if not activated and options.socket_path.exists():
            options.socket_path.unlink()
        log.info("stopped", extra={"exit_code": lifecycle.exit_code})
        return lifecycle.exit_code


def run_daemon(home: Home, start: StartConfig, options: DaemonOptions, logs: LogBroadcaster) -> int:
    """Blocking entry point for ``covenant daemon``: the home's lock first, so a second daemon touches nothing."""
    with serving_home(home):
        return trio.run(serve_daemon, home, start, options, logs)
