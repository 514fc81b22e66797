"""Agent uids' leases: claimed before anything runs as one, swept of escapes when given back.

Every process covenant starts for an agent (a one-shot run or a tool run of the runner, a Rune replica,
a stdio MCP server) claims its agent's uid with :meth:`UidLeases.claim` and gives it back with
:meth:`UidLeases.release` once its process tree is gone; the last live root of a uid kills what is
left of it and empties its temp dirs (:mod:`covenant.runtime.liveroots`). Also here: the orphans
covenant adopted as child subreaper (its *strangers*), which the uid sweep, the kill ladder
(:mod:`covenant.runtime.kill_ladder`) and the runner's close end and reap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Callable, Collection, Iterable

import trio

from covenant.runtime import _procfs, uidkill
from covenant.runtime.isolation import Isolation
from covenant.runtime.launcher import AgentCredentials
from covenant.runtime.liveroots import LiveRoots
from covenant.runtime.mountns import MountNamespaces
from covenant.runtime.teardown import KILL_WAIT_S
from covenant.runtime.tree_removal import Removal, remove_owned_entries

__all__ = ["UidLeases", "Released", "SHARED_TMP_DIRS"]

log = logging.getLogger("covenant.runtime")

SHARED_TMP_DIRS = ("/dev/shm", "/tmp")
"""World-writable host dirs: without private ones (:mod:`~covenant.runtime.mountns`), what an agent
uid left there is removed and counted after its last run."""


@dataclasses.dataclass(frozen=True)
class Released:
    """What :meth:`UidLeases.release` found when it swept an agent uid."""

    left: Removal = Removal()
    """What the uid left in its /tmp and /dev/shm, now removed: its bytes count as the dispatch's disk use,
    and what could not be removed goes in the dispatch record (``cleanup``)."""
    killed: int = 0
    """Live processes of the uid covenant had adopted (escapes from their run's tree), now killed."""


class UidLeases:
    """Claims and sweeps of agent uids, and the end of covenant's adopted orphans; one per runner
    (:attr:`covenant.runtime.runner.Runner.uids`).

    ``helper_pids`` gives covenant's long-lived children that are never an agent's (mount namespace
    holders, the audit writer); ``run_roots`` the root pids of the runner's runs in flight. Neither is
    ever a stranger.
    """

    def __init__(
        self,
        isolation: Isolation,
        live_roots: LiveRoots,
        mount_namespaces: MountNamespaces | None,
        *,
        subreaper: bool,
        helper_pids: Callable[[], Collection[int]],
        run_roots: Callable[[], Iterable[int]],
    ) -> None:
        self.isolation = isolation
        self.live_roots = live_roots
        """Shared with a replica supervisor: a uid is swept only when its last live root ends."""
        self.mount_namespaces = mount_namespaces
        """Each agent uid's private /tmp and /dev/shm; None: the host's (swept per uid instead)."""
        self._subreaper = subreaper
        self._helper_pids = helper_pids
        self._run_roots = run_roots
        self._sweeping: dict[int, trio.Event] = {}
        """uid -> set while that uid is being swept."""

    async def claim(self, agent_id: str, *, resident: bool = False) -> AgentCredentials | None:
        """The agent's credentials, registered as a live root of its uid before anything runs as it.

        Waits while a sweep of that uid is under way (it would kill the new run).
        None in ``same-uid`` mode. Every process covenant starts for an agent
        (a one-shot run or a tool run of the runner; a Rune replica or a stdio MCP server elsewhere, which
        are ``resident``) is claimed so, put in ``LaunchPlan.credentials``, and given back with
        :meth:`release` once its process tree is gone.
        """
        if not self.isolation.enforced:
            return None
        creds = self.isolation.known_credentials(agent_id)
        if creds is None:  # first run of this agent: the allocation table is written
            creds = await trio.to_thread.run_sync(self.isolation.credentials_for, agent_id)
        assert creds is not None
        while (sweeping := self._sweeping.get(creds.uid)) is not None:
            await sweeping.wait()
        self.live_roots.add(creds.uid, resident=resident)
        return creds

    async def release(
        self, creds: AgentCredentials | None, agent_id: str, intent_id: str, *, resident: bool = False
    ) -> Released:
        """The run's tree is gone: if it was the last live root of its uid, sweep the uid.

        Kills every process still running as the uid (escapes that left the
        tree: setsid, double fork, emptied environment; see
        :meth:`strangers` for when), reaps those covenant adopted, and
        empties the uid's private /tmp and /dev/shm (or removes what it left
        in :data:`SHARED_TMP_DIRS`); returns that removal (its bytes count as
        the dispatch's disk use) and how many live processes of the uid covenant
        had adopted and killed (without child subreaper the kill is blind: 0).
        When only resident roots of the uid are left (a Rune replica, stdio
        MCP servers: the run was a tool run, or one of them stopped), the
        processes of the uid covenant adopted are killed one by one instead,
        and the resident ones go on (:mod:`covenant.runtime.liveroots`).
        New runs of the uid wait until the sweep is over.

        Without credentials (``same-uid`` mode) there is no uid to sweep: the orphans covenant adopted
        that still carry ``intent_id`` as their marker are ended instead (:meth:`end_adopted_orphans`).
        A one-shot run's sweep has ended those already, so it skips this call.
        """
        if creds is None:
            await self.end_adopted_orphans(intent_id)
            return Released()
        self.live_roots.remove(creds.uid, resident=resident)
        if self.live_roots.passing(creds.uid):
            return Released()
        done = self._sweeping[creds.uid] = trio.Event()
        try:
            if self.live_roots.live(creds.uid):
                return await self._end_escapes_of(creds.uid, agent_id, intent_id)
            return await self._sweep_uid(creds, agent_id, intent_id)
        finally:
            del self._sweeping[creds.uid]
            done.set()

    async def _end_escapes_of(self, uid: int, agent_id: str, intent_id: str) -> Released:
        """Only resident roots of ``uid`` are left: kill, one by one, its processes covenant adopted (they
        left the tree they were started in), and reap them; the resident ones are no strangers and go on.

        Without child subreaper covenant adopts nothing, and an escape of the uid cannot be told from a
        resident root's own process: it lives until the uid's last root ends.
        """
        if not self._subreaper:
            return Released()
        ended = await self._end_strangers(lambda pid: _procfs.read_real_uid(pid) == uid)
        if ended:
            log.warning("killed processes agents left behind", extra={"agent": agent_id, "intent": intent_id,
                                                                       "pids": sorted(ended)})
        return Released(killed=len(ended))

    async def _sweep_uid(self, creds: AgentCredentials, agent_id: str, intent_id: str) -> Released:
        """The uid's last live root ended: kill every process of it, reap those covenant adopted, and empty
        (and measure) what it left in its private /tmp and /dev/shm or the shared temp dirs."""

        def of_uid(pid: int) -> bool:
            return _procfs.read_real_uid(pid) == creds.uid  # a zombie has no uid here

        strangers = self.strangers()
        killed = sum(1 for pid in strangers if of_uid(pid))
        if not self._subreaper or killed:
            if not await trio.to_thread.run_sync(uidkill.kill_uid, creds.uid, creds.gid):
                log.error("cannot sweep agent uid", extra={"agent": agent_id, "intent": intent_id, "uid": creds.uid})
            await self._end_strangers(of_uid)  # the strangers among them, reaped as they die
        else:
            self.reap_zombies(strangers)
        if self.mount_namespaces is not None:
            if not self.mount_namespaces.dirty(creds.uid):
                return Released(Removal(), killed)  # nothing left there (the usual case): no thread hop
            left = await trio.to_thread.run_sync(self.mount_namespaces.collect, creds.uid)
        else:
            left = await trio.to_thread.run_sync(remove_owned_entries, SHARED_TMP_DIRS, creds.uid)
        if not left.complete:
            log.warning("files an agent left could not all be removed", extra={
                "agent": agent_id, "intent": intent_id, "uid": creds.uid, "reason": left.reason, "left": left.left})
        return Released(left, killed)

    async def end_adopted_orphans(self, marker: str | None = None) -> None:
        """SIGKILL and reap the orphans covenant adopted as child subreaper: those whose environment
        still holds ``COVENANT_INTENT_ID=marker``, or, without a marker, every one.

        A process an agent, a replica or an MCP server left in a session of its own survives the kill
        of its group. With uid isolation the uid sweep ends it. In ``same-uid`` mode, when a replica or
        server stops, :meth:`release` ends its marked orphans here; live replicas and servers are
        children of the launch threads, never strangers, so one agent's other servers (same marker) are
        safe. At close, once every run, replica and server has stopped,
        :meth:`covenant.runtime.runner.Runner.open` ends the rest, marked or not.
        """
        if not self._subreaper:
            return
        if marker is None:
            ended = await self._end_strangers(lambda pid: _procfs.read_real_uid(pid) is not None)
        else:
            marked = f"COVENANT_INTENT_ID={marker}".encode()
            ended = await self._end_strangers(lambda pid: _procfs.environ_has(pid, marked))
        if ended:
            log.warning("killed processes agents left behind", extra={"pids": sorted(ended), "intent": marker})

    async def _end_strangers(self, matches: Callable[[int], bool]) -> set[int]:
        """SIGKILL every stranger (:meth:`strangers`) that ``matches`` (it must not match a zombie), and
        those that match among the strangers they leave in turn (a dying stranger's children come to
        covenant), and reap each as it dies; returns the pids killed.

        A stranger is covenant's child, so its pid cannot be reused before covenant reaps it: killing
        by pid is safe. SIGKILL takes effect when each process is next scheduled, so the loop waits
        (for at most ``KILL_WAIT_S``) until none of them is still dying, or they would stay zombies.
        """
        deadline = trio.current_time() + KILL_WAIT_S
        ended: set[int] = set()
        dying: set[int] = set()
        while True:
            strangers = self.strangers()
            found = [pid for pid in strangers if pid not in dying and matches(pid)]
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                dying.add(pid)
            ended.update(found)
            alive = [pid for pid in strangers if pid in dying and _alive(pid)]
            dying.difference_update(self.reap_zombies(strangers))  # after the look: what died before it
            if not found and not alive:
                return ended
            if trio.current_time() > deadline:
                log.error("processes left by agents survived SIGKILL", extra={"pids": sorted(alive)})
                return ended
            await trio.sleep(0.005)

    def strangers(self) -> list[int]:
        """covenant's children that are neither the root of a run in flight nor a mount namespace holder.

        As child subreaper covenant is the parent of last resort of every process an agent starts:
        once a run's tree is gone, anything left of its uid is such a stranger (an orphan covenant
        adopted), or a descendant of one. So the uid kill (a process spawn, ~0.3 ms) runs only when a
        stranger has the uid; without subreaper it always runs. Usually there is none, and one read
        of covenant's children list is all this costs.
        """
        known = set(self._run_roots())
        helpers = self._helper_pids()
        return [pid for pid in _procfs.thread_children(os.getpid()) if pid not in known and pid not in helpers]

    @staticmethod
    def reap_zombies(strangers: list[int], *, group: int | None = None) -> list[int]:
        """Reap the zombies among ``strangers`` (orphans covenant adopted as child subreaper), only those of
        process group ``group`` when given (never its leader, a run's root); returns their pids."""
        reaped = []
        for pid in strangers:
            stat = _procfs.read_stat(pid)
            if stat is None or stat.state != "Z" or (group is not None and (stat.pgrp != group or pid == group)):
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped.append(pid)
            except ChildProcessError:
                pass
        return reaped


def _alive(pid: int) -> bool:
    """Is ``pid`` there and not a zombie?"""
    stat = _procfs.read_stat(pid)
    return stat is not None and stat.state != "Z"
