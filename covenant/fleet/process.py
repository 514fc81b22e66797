"""``covenant fleet``: the per-host process between NATS JetStream and this host's daemon.

It runs in the foreground (systemd: ``covenant-fleet.service``) and, until SIGTERM:

- makes the streams, the hosts bucket and, for each agent its daemon has loaded, the
  agent's durable pull consumer, when they do not exist (:mod:`covenant.fleet.streams`);
- asks the daemon every second how busy it is and every two seconds which agents it has
  loaded, so a reload that adds or removes agents is followed within 5 s;
- pulls intents for those agents only, as many as :class:`~covenant.fleet.capacity.Capacity`
  allows, and takes each to its answer (:mod:`covenant.fleet.delivery`);
- writes this host's entry in ``COVENANT_HOSTS`` every 5 s (it lives 15 s), and an audit
  head to ``COVENANT_AUDIT`` every 10 s when the log has a new checkpoint;
- answers the intents JetStream gave up on (``max_deliver``) as ``delivery_exhausted``
  (one fleet process of all takes each such advisory: a queue group).

nats-py reconnects by itself for ever: a NATS node restart or a blip never needs a
restart of this process. When the daemon does not answer, nothing is pulled until it does.

SIGTERM (or SIGINT): stop pulling, let the intents in flight finish and acknowledge
them, publish a last audit head, remove this host's entry, exit 0; what was not started stays in the stream for
the other hosts. A second SIGTERM exits at once: what was in flight is redelivered. A loop of the process that
fails (a bug) drains it the same way and exits 1, for systemd to restart it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from covenant.client import DaemonUnreachable
from covenant.config import Config
from covenant.fleet import host_entry
from covenant.fleet.capacity import Capacity, agent_limit
from covenant.fleet.connect import connect
from covenant.fleet.daemon_link import DaemonLink
from covenant.fleet.delivery import Deliveries
from covenant.fleet.heads import HEAD_INTERVAL_S, head_message
from covenant.fleet.streams import ensure_consumer, ensure_hosts_bucket, ensure_streams
from covenant.fleet.subjects import (
    ADVISORY_MAX_DELIVERIES,
    INTENTS_STREAM,
    WORKER_QUEUE,
    audit_subject,
    consumer_name,
    token_clashes,
)
from covenant.home import Home

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

__all__ = ["FleetProcess", "HOST_EVERY_S", "STATUS_EVERY_S", "AGENTS_EVERY_S"]

log = logging.getLogger("covenant.fleet")

HOST_EVERY_S = 5.0
STATUS_EVERY_S = 1.0
AGENTS_EVERY_S = 2.0
_FETCH_S = 1.0
"""One pull request waits this long for an intent; also how soon a stop or a removed agent ends a puller."""
_RETRY_S = 1.0


class FleetProcess:
    """One host's fleet process; :meth:`run` until SIGTERM, returns the exit status."""

    def __init__(self, home: Home, config: Config, socket_path: str) -> None:
        self.home = home
        self.fleet = config.fleet.require(home.config_path)
        self.host = self.fleet.host_name()
        self.max_concurrent_default = config.daemon.max_concurrent
        self.daemon = DaemonLink(socket_path)
        self.capacity = Capacity()
        self.digests = host_entry.Digests(home)
        self.agents: dict[str, host_entry.AgentView] = {}
        self._specs: dict[str, dict[str, Any]] = {}
        self._pullers: dict[str, asyncio.Task[None]] = {}
        self._handlers: set[asyncio.Task[None]] = set()
        self._status: dict[str, Any] = {}
        self._stop = asyncio.Event()
        self._failed = False
        self._daemon_up = False
        self._rune_limits: dict[tuple[str, float], int | None] = {}
        self._head_sent: tuple[Any, Any] | None = None
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self.kv: KeyValue | None = None
        self.deliveries: Deliveries | None = None

    # -- life cycle ---------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        log.info("fleet process starting", extra={"host": self.host, "servers": ",".join(self.fleet.servers)})
        connecting = asyncio.create_task(connect(self.fleet, f"covenant-fleet {self.host}", keep_trying=True,
                                                 disconnected_cb=self._disconnected, reconnected_cb=self._reconnected))
        stopping = asyncio.create_task(self._stop.wait())
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not connecting.done():  # stopped before any NATS server answered: nothing to drain
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await connecting
            log.info("fleet process stopped before NATS answered", extra={"host": self.host})
            return 0
        stopping.cancel()
        self.nc = connecting.result()
        self.js = self.nc.jetstream(timeout=5)
        await self._until_ready()
        if self._stop.is_set():
            await self.nc.close()
            return 0
        assert self.js is not None
        self.deliveries = Deliveries(self.host, self.js, self.daemon, self.nc.max_payload)
        await self.nc.subscribe(ADVISORY_MAX_DELIVERIES, queue=WORKER_QUEUE, cb=self._on_advisory)
        loops = [asyncio.create_task(self._guarded(coro))
                 for coro in (self._watch_daemon(), self._publish_host(), self._publish_heads())]
        log.info("fleet process ready", extra={"host": self.host})
        await self._stop.wait()
        await self._drain(loops)
        return 1 if self._failed else 0

    async def _guarded(self, loop: Coroutine[Any, Any, None]) -> None:
        """A loop of the process: if it fails (a bug), the process drains and exits 1, so systemd restarts it
        rather than leaving a host that looks alive and pulls nothing."""
        try:
            await loop
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("a loop of the fleet process failed; stopping (exit 1)")
            self._failed = True
            self._stop.set()

    def _on_signal(self) -> None:
        if self._stop.is_set():
            log.warning("second stop signal: exiting now; intents in flight will be redelivered")
            for task in list(self._handlers):
                task.cancel()
            return
        log.info("stop signal: no more pulls; finishing the intents in flight")
        self._stop.set()

    async def _until_ready(self) -> None:
        """Streams and bucket in place (retried while JetStream elects its leaders, or the servers are away)."""
        assert self.js is not None
        while not self._stop.is_set():
            try:
                await ensure_streams(self.js, self.fleet)
                self.kv = await ensure_hosts_bucket(self.js, self.fleet)
                return
            except Exception as exc:  # JetStream not ready yet (no leader, no quorum): try again
                log.warning("JetStream not ready; retrying", extra={"error": f"{type(exc).__name__}: {exc}"})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), _RETRY_S)

    async def _drain(self, loops: list[asyncio.Task[None]]) -> None:
        await self.capacity.close()
        pullers = list(self._pullers.values())
        await asyncio.gather(*pullers, return_exceptions=True)  # each ends after its current pull (≤ 1 s)
        if self._handlers:
            log.info("waiting for intents in flight", extra={"in_flight": len(self._handlers)})
            await asyncio.gather(*self._handlers, return_exceptions=True)
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        with contextlib.suppress(DaemonUnreachable):
            self._status = await self.daemon.get("/v1/status")
            await self._publish_head()  # the fleet keeps the log's last state before a planned stop
        if self.kv is not None:
            with contextlib.suppress(Exception):
                await self.kv.delete(self.host)  # the CLIs stop routing here at once, not after the TTL
        assert self.nc is not None
        with contextlib.suppress(Exception):
            if self.nc.is_connected:
                await self.nc.drain()  # flushes the last acks
            else:
                await self.nc.close()
        log.info("fleet process stopped", extra={"host": self.host})

    async def _disconnected(self) -> None:
        log.warning("disconnected from NATS; reconnecting")

    async def _reconnected(self) -> None:
        assert self.nc is not None
        log.info("reconnected to NATS", extra={"server": str(self.nc.connected_url.netloc if self.nc.connected_url else "")})

    # -- the daemon -------------------------------------------------------------------

    async def _watch_daemon(self) -> None:
        """Status every second (free slots, audit head), agents every two (reloads)."""
        next_agents = 0.0
        while True:
            try:
                self._status = await self.daemon.get("/v1/status")
                if not self._daemon_up:
                    log.info("the daemon answers", extra={"pid": self._status.get("pid")})
                self._daemon_up = True
                limits = self._status.get("limits") or {}
                busy = len(self._status.get("in_flight") or []) + int(self._status.get("queued") or 0)
                if self._status.get("shutting_down"):
                    await self.capacity.daemon_gone()  # it refuses new dispatches while it drains
                else:
                    await self.capacity.set_daemon(int(limits.get("max_concurrent") or self.max_concurrent_default), busy)
                if time.monotonic() >= next_agents:
                    next_agents = time.monotonic() + AGENTS_EVERY_S
                    await self._follow_agents(await self.daemon.get("/v1/agents"))
            except DaemonUnreachable as exc:
                if self._daemon_up:
                    log.warning("the daemon does not answer; pulling nothing until it does", extra={"error": exc.message})
                self._daemon_up = False
                await self.capacity.daemon_gone()
            await asyncio.sleep(STATUS_EVERY_S)

    def _own_limit(self, spec: dict[str, Any]) -> int | None:
        if spec.get("runtime") != "rune":
            return None
        path = str(spec.get("manifest_path"))
        try:
            stamp = os.stat(path).st_mtime
        except OSError:
            return None
        key = (path, stamp)
        if key not in self._rune_limits:
            self._rune_limits[key] = host_entry.rune_concurrency(path)
        return self._rune_limits[key]

    async def _follow_agents(self, listing: dict[str, Any]) -> None:
        """Start pulling for agents the daemon loaded, stop for those it dropped; update the limits."""
        specs = {a["id"]: a for a in listing.get("agents") or [] if isinstance(a, dict) and isinstance(a.get("id"), str)}
        for agent_id, earlier in token_clashes(list(specs)).items():
            log.error("agent not served by the fleet: its subject token is the one of another agent",
                      extra={"agent": agent_id, "other": earlier})
            del specs[agent_id]
        limits = self._status.get("limits") or {}
        max_concurrent = int(limits.get("max_concurrent") or self.max_concurrent_default)
        per_agent = int(limits.get("per_agent") or 0)
        views: dict[str, host_entry.AgentView] = {}
        for agent_id, spec in specs.items():
            capacity = agent_limit(self.fleet.max_in_flight, self._own_limit(spec), per_agent, max_concurrent)
            views[agent_id] = {"id": agent_id, "keywords": list(spec.get("keywords") or []),
                               "runtime": spec.get("runtime"), "capacity": capacity}
        await self.capacity.set_limits({a: v["capacity"] for a, v in views.items()})
        changed = set(views) != set(self.agents)
        added, removed = sorted(set(views) - set(self._pullers)), sorted(set(self._pullers) - set(views))
        self.agents = views
        for agent_id in added:
            self._pullers[agent_id] = asyncio.create_task(self._pull(agent_id))
        for agent_id in removed:
            log.info("agent gone from the daemon: no more pulls for it", extra={"agent": agent_id})
        if changed:
            await self._put_host()

    # -- pulling -------------------------------------------------------------------------

    async def _pull(self, agent_id: str) -> None:
        """Pull intents for one agent while it is loaded and the process runs."""
        from nats.errors import TimeoutError as NatsTimeout

        assert self.js is not None and self.deliveries is not None
        consumer = consumer_name(agent_id)
        subscription = None
        ack_wait_s, max_deliver = float(self.fleet.ack_wait_s), self.fleet.max_deliver  # the consumer's, once bound
        failing = False  # logged once per run of failures, not once a second while NATS is away
        try:
            while agent_id in self.agents and not self._stop.is_set():
                try:
                    if subscription is None:
                        info = await ensure_consumer(self.js, agent_id, self.fleet)
                        ack_wait_s = float(info.config.ack_wait or self.fleet.ack_wait_s)
                        max_deliver = int(info.config.max_deliver or self.fleet.max_deliver)
                        subscription = await self.js.pull_subscribe_bind(consumer, INTENTS_STREAM)
                        log.info("pulling intents" if not failing else "pulling intents again",
                                 extra={"agent": agent_id, "consumer": consumer})
                        failing = False
                    if not await self.capacity.wait_room(agent_id, _FETCH_S):
                        continue
                    try:
                        messages = await subscription.fetch(1, timeout=_FETCH_S)
                    except (NatsTimeout, asyncio.TimeoutError):
                        continue
                    for msg in messages:
                        self._start(agent_id, msg, consumer, ack_wait_s, max_deliver)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # NATS away, the consumer deleted under us, JetStream electing: retry
                    if not failing:
                        log.warning("pulling failed; retrying every second",
                                    extra={"agent": agent_id, "error": f"{type(exc).__name__}: {exc}"})
                    failing = True
                    if subscription is not None:
                        with contextlib.suppress(Exception):
                            await subscription.unsubscribe()
                        subscription = None
                    await asyncio.sleep(_RETRY_S)
        finally:
            if subscription is not None:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()
            if self._pullers.get(agent_id) is asyncio.current_task():
                del self._pullers[agent_id]

    def _start(self, agent_id: str, msg: "Msg", consumer: str, ack_wait_s: float, max_deliver: int) -> None:
        assert self.deliveries is not None
        self.capacity.take(agent_id)
        deliveries = self.deliveries

        async def handle() -> None:
            try:
                await deliveries.handle(msg, consumer, ack_wait_s, max_deliver)
            except Exception:
                log.exception("delivery failed; the intent will be redelivered", extra={"agent": agent_id})
            finally:
                await self.capacity.release(agent_id)

        task = asyncio.create_task(handle())
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _on_advisory(self, msg: "Msg") -> None:
        assert self.deliveries is not None
        try:
            await self.deliveries.exhausted(json.loads(msg.data))
        except Exception as exc:
            log.warning("a max-deliveries advisory was not handled", extra={"error": f"{type(exc).__name__}: {exc}"})

    # -- what the fleet sees of this host ------------------------------------------------

    async def _put_host(self) -> None:
        """This host's entry; none while its daemon is away or draining (the entry then lapses within 15 s)."""
        if self.kv is None or not self._daemon_up or self._stop.is_set() or self._status.get("shutting_down"):
            return
        head = (self._status.get("audit") or {}).get("head") or {}
        self.digests.refresh(head.get("pubkey"))
        entry = host_entry.build(self.host, list(self.agents.values()), self.capacity.running, self._status,
                                 self.digests.grants, self.digests.identities)
        try:
            await self.kv.put(self.host, json.dumps(entry, separators=(",", ":")).encode())
        except Exception as exc:
            log.warning("host entry not written", extra={"error": f"{type(exc).__name__}: {exc}"})

    async def _publish_host(self) -> None:
        while True:
            await self._put_host()
            await asyncio.sleep(HOST_EVERY_S)

    async def _publish_head(self) -> None:
        """Publish the daemon's audit head when it is newer than the last one published."""
        assert self.js is not None
        head = (self._status.get("audit") or {}).get("head")
        if not self._daemon_up or not isinstance(head, dict) or (head.get("log"), head.get("seq")) == self._head_sent:
            return
        try:
            await self.js.publish(audit_subject(self.host), head_message(head, self.host), timeout=5)
            self._head_sent = (head.get("log"), head.get("seq"))
        except Exception as exc:
            log.warning("audit head not published", extra={"error": f"{type(exc).__name__}: {exc}"})

    async def _publish_heads(self) -> None:
        """Every 10 s, the audit head, when the log has a checkpoint newer than the last head published."""
        while True:
            await self._publish_head()
            await asyncio.sleep(HEAD_INTERVAL_S if self._head_sent is not None else STATUS_EVERY_S)
