"""The kill ladder: end the whole process tree of a run whose root exited or must stop.

SIGTERM to the group, ``kill_grace_ms``, SIGKILL to the group and every survivor; then whatever is
still alive of the run is swept and the group's zombies covenant adopted meanwhile are reaped.
The signals and reaping themselves are :mod:`covenant.runtime.teardown`.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Awaitable, Callable, Iterable
from functools import partial

import trio

from covenant.runtime import teardown
from covenant.runtime.run_state import RunState
from covenant.runtime.sampler import Sampler, adopted_orphans
from covenant.runtime.teardown import KILL_WAIT_S
from covenant.runtime.uid_leases import UidLeases

__all__ = ["KillLadder", "collect_root"]

log = logging.getLogger("covenant.runtime")

_GROUP_GONE_S = 2.0
"""After the sweep, how long a run's process group may take to empty (its last members dying)."""


def collect_root(d: RunState) -> None:
    """The root has exited: kill what is left of its group, take the last sample, reap it.

    The group is signalled while the root is still an unreaped zombie, so
    its pid — the group id — cannot have been reused.
    """
    teardown.signal_group(d.launched.pid, signal.SIGKILL)
    if d.tree.has_descendants():
        d.tree.refresh()  # last figures of the other members (the root's come from wait4)
    d.launched.reap()


class KillLadder:
    """The kill ladder of one runner's runs.

    ``runs`` gives the runs in flight (their trees attribute adopted orphans), ``uids`` the strangers
    a finished run's group may leave.
    """

    def __init__(
        self, kill_grace_ms: int, sampler: Sampler, uids: UidLeases, *, subreaper: bool,
        runs: Callable[[], Iterable[RunState]],
    ) -> None:
        self._kill_grace_ms = kill_grace_ms
        self._sampler = sampler
        self._uids = uids
        self._subreaper = subreaper
        self._runs = runs

    async def terminate(self, d: RunState, await_root: Callable[[float], Awaitable[bool]] | None = None) -> None:
        """The kill ladder: SIGTERM to the group, grace, SIGKILL to the group and every survivor.

        Survivors are found by the tree walk, covenant's adopted orphans and,
        when covenant is not a subreaper, a scan for the intent's marker.
        Whatever the outcome, no process of the dispatch remains. ``await_root``
        waits for the root's exit with a timeout (default: :meth:`_await_root`).
        """
        await_root = await_root or partial(self._await_root, d)
        pid = d.launched.pid
        if not d.launched.exited_now():
            d.tree.refresh()
            teardown.signal_group(pid, signal.SIGTERM)
            teardown.signal_processes(d.tree.members, signal.SIGTERM, signalled_group=pid)
            grace_ms = self._kill_grace_ms
            if not await await_root(grace_ms / 1000):
                d.notes.append(f"the agent ignored SIGTERM for {grace_ms} ms and was killed with SIGKILL")
                d.tree.refresh()
                teardown.signal_group(pid, signal.SIGKILL)
                teardown.signal_processes(d.tree.members, signal.SIGKILL, signalled_group=pid)
                if not await await_root(KILL_WAIT_S):
                    log.error(
                        "agent survived SIGKILL",
                        extra={"agent": d.agent.id, "intent": d.intent_id, "pid": pid},
                    )
                    return
        if d.launched.status is None:
            collect_root(d)
        await self._sweep(d)

    @staticmethod
    async def _await_root(d: RunState, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the root to exit, on its pidfd alone (the pipes are not read)."""
        with trio.move_on_after(timeout):
            await d.launched.wait_exit()
            return True
        return False

    async def _sweep(self, d: RunState) -> None:
        """SIGKILL every process of the dispatch still alive after its root is gone, and reap them."""
        tree = d.tree
        # Attributing against every in-flight tree spares reading the environment
        # of the other dispatches' roots and known members.
        others = (o.tree for o in self._runs() if o is not d)
        adopted = adopted_orphans([tree, *others], self._sampler.foreign, self._sampler.helper_pids()).get(tree, [])
        if adopted or tree.has_descendants():
            tree.refresh(adopted)
        victims = {pid: start for pid, start in tree.members.items() if pid != tree.root}
        if not self._subreaper:
            exclude = {os.getpid(), tree.root, *victims}
            victims.update(await trio.to_thread.run_sync(teardown.marked_processes, tree.marker, exclude))
        if victims:
            d.left_behind += len(victims)
            teardown.signal_processes(victims, signal.SIGKILL)
            left = await teardown.await_gone(victims, KILL_WAIT_S)
            if left:
                log.error(
                    "agent processes survived SIGKILL",
                    extra={"agent": d.agent.id, "intent": d.intent_id, "pids": sorted(left)},
                )
                return
        await self._reap_group_zombies(tree.root)
        d.swept = True

    async def _reap_group_zombies(self, group: int) -> None:
        """Reap the dead members of a finished run's process group that covenant adopted meanwhile.

        A zombie whose parent died after the sweep looked at it is reparented
        to covenant (the child subreaper) later; with another live root of the
        uid (a replica) no uid sweep comes to reap it, and zombies count
        against the uid's RLIMIT_NPROC. Only zombies of the run's own group
        (pgid = its root's pid) are taken, never another child of covenant.
        Members killed a moment ago may still be dying, or become covenant's
        only once their own parent is dead, so as child subreaper covenant
        waits until the group is empty, for at most ``_GROUP_GONE_S``; the
        usual run leaves nothing, and one ``killpg(group, 0)`` says so.
        """
        deadline = trio.current_time() + _GROUP_GONE_S
        while True:
            reaped = self._uids.reap_zombies(self._uids.strangers(), group=group)
            left = reaped or (self._subreaper and teardown.group_exists(group))
            if not left or trio.current_time() > deadline:
                return
            if not reaped:
                await trio.sleep(0.005)
