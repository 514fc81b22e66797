"""Which uid each agent runs as, and what the host lets covenant enforce.

When covenant runs as root (the systemd unit, CI) every agent process runs as
an unprivileged uid/gid that is not covenant's, with no supplementary groups
(docs/security.md):

- ``[isolation] uid_range`` (default 61184-65519, systemd's DynamicUser
  range): each agent gets its own uid, gid = uid. The choice is
  deterministic and persistent: a hash of the home's salt (random, made
  once) and the agent id picks the first candidate, linear probing skips
  uids already given to another agent or held by an account in the user
  database, and the result is kept in ``<home>/state/isolation/uids.json``
  (written atomically, 0600), so an agent's files keep their owner across
  restarts. A uid is this home's only while it holds the uid's host-wide
  lock (:mod:`covenant.runtime.uid_locks`): two homes on one host never
  share one, and a new allocation also skips a uid that runs a process or
  owns a file in the workspaces root. An entry whose lock another home
  holds is dropped at start: that agent gets a new uid.
  The top ``[isolation] spawned_uids`` of the range (at most an eighth of
  it) are for agents made by
  ``rune@agent-spawn`` only (:meth:`Isolation.retire` gives such a uid back,
  its workspace removed, when the agent has ended), so they never use up the
  uids of the operator's agents.
- ``[isolation] user = "NAME"``: one fixed account for every agent (its uid
  and primary gid; it must not be root). The account must be dedicated to
  covenant: every process it runs is swept when no dispatch is live.

Not root (a laptop): agents run as covenant's own uid, ``isolation:
same-uid``, said loudly at start, in ``covenant status`` and in every
dispatch record; ``[isolation] require = true`` refuses to start instead.

:meth:`Isolation.credentials_for` is what the runner (and a replica
supervisor) asks before a spawn; :meth:`Isolation.workspace_for` gives the
agent's workspace ``<home>/state/workspaces/<agent id>/``, owned by its uid.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pwd
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal, NamedTuple

from covenant.config import IsolationConfig
from covenant.errors import ConfigError
from covenant.policy._files import atomic_write_text
from covenant.spawned_ids import is_spawned_id
from covenant.runtime import _procfs, uidkill
from covenant.runtime.host import can_switch_uid
from covenant.runtime.tree_removal import remove_tree
from covenant.runtime.launcher import AgentCredentials, LaunchError
from covenant.runtime.mountns import DEFAULT_TMP_INODES
from covenant.runtime.uid_locks import UidLocks, ever_an_agent_uid

__all__ = [
    "AgentCredentials",
    "Isolation",
    "IsolationMode",
    "SweepReport",
    "can_switch_uid",
    "open_isolation",
    "reachability_problems",
]

IsolationMode = Literal["uid", "same-uid"]

log = logging.getLogger("covenant.runtime")

_TABLE_NAME = "uids.json"


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


class _UidTable:
    """The persistent agent id -> uid allocation (thread-safe: an agent's first allocation runs on a
    worker thread). Every uid in it is held in ``locks``; ``workspaces`` is the root of the agents'
    workspaces, where a candidate uid must own nothing."""

    def __init__(self, path: Path, low: int, high: int, locks: UidLocks, workspaces: Path, *, spawned: int = 0) -> None:
        self.path = path
        self.low, self.high = low, high
        self.spawned = min(spawned, (high - low + 1) // 8)
        """The top ``spawned`` uids of the range (at most an eighth of it) are for agents made by
        rune@agent-spawn, and only for them."""
        self.locks = locks
        self.workspaces = workspaces
        self._lock = threading.Lock()
        self._salt = ""
        self._agents = self._load()
        lost = {agent: uid for agent, uid in self._agents.items() if not locks.take(uid)}
        if lost:
            for agent in lost:
                del self._agents[agent]
            log.warning("agent uids held by another home on this host: those agents get new uids",
                        extra={"agents": sorted(lost), "uids": sorted(lost.values()), "table": str(path)})
            self._save()

    def _load(self) -> dict[str, int]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self.path}: unreadable uid table ({exc}); fix or remove it", path=str(self.path)) from None
        agents = raw.get("agents") if isinstance(raw, dict) else None
        if not isinstance(agents, dict) or not all(
            isinstance(k, str) and type(v) is int and v > 0 for k, v in agents.items()
        ):
            raise ConfigError(f"{self.path}: field `agents` must map agent ids to uids", path=str(self.path))
        salt = raw.get("salt", "")
        if not isinstance(salt, str):
            raise ConfigError(f"{self.path}: field `salt` must be a string", path=str(self.path))
        self._salt = salt
        # Entries outside today's range stay valid: files keep their owner when the range moves.
        return dict(agents)

    def known(self, agent_id: str) -> int | None:
        return self._agents.get(agent_id)

    def uid_for(self, agent_id: str) -> int:
        with self._lock:
            uid = self._agents.get(agent_id)
            if uid is not None:
                return uid
            low, high = self._span(agent_id)
            size = high - low + 1
            if size <= 0:
                raise LaunchError(f"no uid of isolation.uid_range [{self.low}, {self.high}] is for spawned agents "
                                  f"(isolation.spawned_uids, at most an eighth of the range): agent {agent_id} cannot "
                                  "run; widen the range in covenant.toml")
            if not self._salt:
                self._salt = os.urandom(16).hex()
            digest = hashlib.sha256(f"{self._salt}\0{agent_id}".encode()).digest()
            start = int.from_bytes(digest[:8], "big") % size
            taken = set(self._agents.values())
            for step in range(size):
                candidate = low + (start + step) % size
                if candidate in taken or _has_account(candidate) or self._owns_anything(candidate):
                    continue
                if self.locks.take(candidate):  # last: a lock is a file, taken only for a free uid
                    self._agents[agent_id] = candidate
                    self._save()
                    return candidate
            part = "the spawned agents' part of isolation.uid_range" if is_spawned_id(agent_id) else "isolation.uid_range"
            raise LaunchError(
                f"no free uid left in {part} [{low}, {high}] for agent {agent_id} "
                f"({len(taken)} agents hold one; see {self.path}): widen the range (or isolation.spawned_uids) "
                "in covenant.toml"
            )

    def _span(self, agent_id: str) -> tuple[int, int]:
        """The uids ``agent_id`` may get: a spawned agent's from the top ``spawned`` of the range, any other's
        below them, so agents made at run time can never use up the uids of the operator's agents."""
        if is_spawned_id(agent_id):
            return self.high - self.spawned + 1, self.high
        return self.low, self.high - self.spawned

    def release(self, agent_id: str) -> None:
        """``agent_id`` no longer has a uid (a spawned agent that ended): the uid is free for another."""
        with self._lock:
            uid = self._agents.pop(agent_id, None)
            if uid is None:
                return
            self._save()
            self.locks.release(uid)

    def allocated(self) -> list[str]:
        """The agent ids holding a uid."""
        with self._lock:
            return sorted(self._agents)

    def _owns_anything(self, uid: int) -> bool:
        """Does ``uid`` run a process, or own an entry of the workspaces root (a previous holder's)?"""
        if _processes_by_uid(lambda found: found == uid):
            return True
        try:
            entries = list(os.scandir(self.workspaces))
        except FileNotFoundError:
            return False
        return any(entry.stat(follow_symlinks=False).st_uid == uid for entry in entries)

    def _save(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        doc = {"version": 1, "salt": self._salt, "agents": dict(sorted(self._agents.items()))}
        text = json.dumps(doc, indent=1) + "\n"
        atomic_write_text(self.path, text, mode=0o600)

    def uids(self) -> set[int]:
        with self._lock:
            return set(self._agents.values())


class SweepReport(NamedTuple):
    """What a start-up sweep found and killed."""

    uids: list[int]
    pids: list[int]
    survivors: list[int]
    """Still alive after the wait (stuck in the kernel): reported, never silently ignored."""


class Isolation:
    """The uid decision for every agent process. Use :func:`open_isolation`."""

    def __init__(
        self,
        mode: IsolationMode,
        *,
        state_dir: Path | None = None,
        table: _UidTable | None = None,
        fixed: AgentCredentials | None = None,
        max_processes: int = 256,
        tmp_inodes: int = DEFAULT_TMP_INODES,
        reason: str = "",
        network: Literal["namespaced", "host"] = "namespaced",
        host_allow: tuple[str, ...] = (),
    ) -> None:
        self.mode: IsolationMode = mode
        self.network = network
        """``[isolation] network``: "host" lets agents with network run in the host's network namespace
        where they cannot get one of their own; "namespaced" refuses them then."""
        self.host_allow = host_allow
        """``[isolation] host_allow``: host services agents with network may reach."""
        self.network_problem: str | None = None
        """Why agents get no network namespace of their own here (the runner says, at open)."""
        self.egress_problem: str | None = None
        """Why agents with network cannot get egress from their namespace here (the runner says, at open)."""
        self.state_dir = state_dir
        self._table = table
        self._fixed = fixed
        self.max_processes = max_processes
        self.tmp_inodes = tmp_inodes
        """``[isolation] tmp_inodes``: the most inodes of each agent uid's private /tmp and /dev/shm."""
        self.reason = reason
        """Why agents share covenant's uid (empty in ``uid`` mode)."""
        self.problems: list[str] = []
        """Start-up findings an operator must act on (unreachable interpreters, ...)."""

    @classmethod
    def same_uid(
        cls, reason: str = "not requested", state_dir: Path | None = None, *,
        network: Literal["namespaced", "host"] = "namespaced",
    ) -> "Isolation":
        """Agents run as covenant's own uid (``state_dir`` set: workspaces are available too); with
        ``network = "host"`` agents with network run in the host's network namespace."""
        return cls("same-uid", state_dir=state_dir, reason=reason, network=network)

    @property
    def enforced(self) -> bool:
        return self.mode == "uid"

    def credentials_for(self, agent_id: str) -> AgentCredentials | None:
        """The uid/gid ``agent_id``'s processes run as; None in ``same-uid`` mode (blocking on first use)."""
        if self._fixed is not None:
            return self._fixed
        if self._table is None:
            return None
        uid = self._table.uid_for(agent_id)
        return AgentCredentials(uid, uid)

    def known_credentials(self, agent_id: str) -> AgentCredentials | None:
        """:meth:`credentials_for` without I/O: None when not allocated yet (or same-uid)."""
        if self._fixed is not None:
            return self._fixed
        uid = self._table.known(agent_id) if self._table is not None else None
        return AgentCredentials(uid, uid) if uid is not None else None

    def retire(self, agent_id: str) -> bool:
        """Give back an ended agent's uid (a spawned agent's) and remove its workspace, with the uid's own
        rights and never through a link (blocking). False, with nothing given back, while a process still runs
        as the uid or the workspace could not all be removed: a uid is never handed on with files or
        processes of its previous agent."""
        creds = self.known_credentials(agent_id)
        shared = self._fixed is not None
        if creds is not None and not shared and _processes_by_uid(lambda found: found == creds.uid):
            return False
        if self.state_dir is not None:
            removal = remove_tree(str(self.state_dir / "workspaces" / agent_id), None if creds is None else creds.uid)
            if not removal.complete:
                log.warning("an ended agent's workspace could not all be removed: its uid stays allocated",
                            extra={"agent": agent_id, "reason": removal.reason, "left": removal.left})
                return False
        if self._table is not None:
            self._table.release(agent_id)
        return True

    def allocated(self) -> list[str]:
        """The agent ids this home gave a uid (none with a fixed user or in same-uid mode)."""
        return self._table.allocated() if self._table is not None else []

    def workspace_for(self, agent_id: str) -> Path:
        """``<home>/state/workspaces/<agent id>/``, made if missing, 0700 and owned by the agent's uid."""
        if self.state_dir is None:
            raise LaunchError("no home: workspaces need covenant's state dir")
        if not agent_id or "/" in agent_id or agent_id in (".", "..") or "\0" in agent_id:
            raise LaunchError(f"agent id {agent_id!r} cannot name a workspace directory")
        root = self.state_dir / "workspaces"
        root.mkdir(mode=0o711, parents=True, exist_ok=True)
        path = root / agent_id
        path.mkdir(mode=0o700, exist_ok=True)
        creds = self.credentials_for(agent_id)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if creds is not None:
                os.fchown(fd, creds.uid, creds.gid)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        return path

    def agent_gids(self) -> tuple[int, int] | None:
        """The inclusive range of gids agent processes run with (the host's nftables rule matches them)."""
        if self._fixed is not None:
            return self._fixed.gid, self._fixed.gid
        if self._table is not None:
            return self._table.low, self._table.high
        return None

    def probe_credentials(self) -> AgentCredentials | None:
        """Credentials that stand for every agent in access checks: the fixed user, or a range uid
        that owns nothing; None in ``same-uid`` mode."""
        if self._fixed is not None:
            return self._fixed
        if self._table is not None:
            return AgentCredentials(self._table.low, self._table.low)
        return None

    def owns_uid(self, uid: int) -> bool:
        """Is ``uid`` one this home gave to an agent (its table), or the fixed user?

        Not the whole range: another home on the host (or a systemd
        ``DynamicUser=`` service) may hold other uids of it.
        """
        if self._fixed is not None:
            return uid == self._fixed.uid
        return self._table is not None and uid in self._table.uids()

    def is_agent_uid(self, uid: int) -> bool:
        """Could ``uid`` be an agent's, of this home or any other on the host: the fixed user, a uid of
        this home's range, or one any home ever locked (:func:`covenant.runtime.uid_locks.ever_an_agent_uid`).
        For checks that must fail closed, such as whom the daemon may hand a provider's key."""
        if self._fixed is not None and uid == self._fixed.uid:
            return True
        if self._table is not None and self._table.low <= uid <= self._table.high:
            return True
        return uid > 0 and ever_an_agent_uid(uid)

    def gid_of(self, uid: int) -> int:
        """The gid that goes with an agent uid."""
        return self._fixed.gid if self._fixed is not None and uid == self._fixed.uid else uid

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"mode": self.mode, "problems": list(self.problems)}
        doc["network"] = {
            "setting": self.network,
            "namespaces": self.network_problem is None and self.enforced,
            "egress": self.network_problem is None and self.egress_problem is None and self.enforced,
            "problem": self.network_problem or self.egress_problem,
            "host_allow": list(self.host_allow),
        }
        if self._fixed is not None:
            doc["user"] = {"uid": self._fixed.uid, "gid": self._fixed.gid}
        elif self._table is not None:
            doc["uid_range"] = [self._table.low, self._table.high]
        if self.reason:
            doc["reason"] = self.reason
        return doc

    def sweep_survivors(self, wait_s: float = 10.0) -> SweepReport:
        """Kill every process running as one of this home's agent uids (blocking; call at start, before work).

        After ``kill -9`` of covenant, escaped agent processes outlive it.
        One /proc scan finds them by real uid (read from ``status``, which a
        non-dumpable process cannot hide), then each uid found is killed
        from inside (:func:`covenant.runtime.uidkill.kill_uid`), and the
        scan repeats until none is left or ``wait_s`` passed.
        """
        if not self.enforced:
            return SweepReport([], [], [])
        found = _processes_by_uid(self.owns_uid)
        uids = sorted(set(found.values()))
        for uid in uids:
            uidkill.kill_uid(uid, self.gid_of(uid))
        deadline = time.monotonic() + wait_s
        left = dict(found)
        while left and time.monotonic() < deadline:
            left = {pid: uid for pid, uid in _processes_by_uid(self.owns_uid).items()}
            for uid in sorted(set(left.values())):
                uidkill.kill_uid(uid, self.gid_of(uid))
            if left:
                time.sleep(0.05)
        return SweepReport(uids, sorted(found), sorted(left))


def _processes_by_uid(wanted: Callable[[int], bool]) -> dict[int, int]:
    """pid -> real uid of every live (non-zombie) process whose uid ``wanted`` accepts."""
    found: dict[int, int] = {}
    for pid in _procfs.all_pids():
        uid = _procfs.read_real_uid(pid)
        if uid is not None and uid > 0 and wanted(uid):
            found[pid] = uid
    return found


def open_isolation(config: IsolationConfig, state_dir: Path) -> Isolation:
    """Decide the isolation of this run of covenant; raise ConfigError when it cannot be what was asked."""
    if not can_switch_uid():
        reason = f"covenant runs as uid {os.geteuid()} without CAP_SETUID/CAP_SETGID/CAP_KILL"
        if config.require:
            raise ConfigError(
                f"isolation.require = true, but {reason}: agents would run as covenant's own uid. "
                "Run the daemon as root (or with those capabilities, see systemd/covenant.service), "
                "or set isolation.require = false to accept isolation: same-uid",
                field="isolation.require",
            )
        isolation = Isolation.same_uid(reason, state_dir, network=config.network)
        isolation.host_allow = config.host_allow
        return isolation
    if config.user is not None:
        try:
            entry = pwd.getpwnam(config.user)
        except KeyError:
            raise ConfigError(
                f"isolation.user = {config.user!r}: no such account (create it, e.g. useradd --system "
                f"--no-create-home {config.user})",
                field="isolation.user",
            ) from None
        if entry.pw_uid == 0 or entry.pw_gid == 0:
            raise ConfigError(f"isolation.user = {config.user!r} is root (uid or gid 0): agents never run as root",
                              field="isolation.user")
        return Isolation("uid", state_dir=state_dir, fixed=AgentCredentials(entry.pw_uid, entry.pw_gid),
                         max_processes=config.max_processes, tmp_inodes=config.tmp_inodes,
                         network=config.network, host_allow=config.host_allow)
    low, high = config.uid_range
    locks = UidLocks(str(state_dir.resolve()))
    table = _UidTable(state_dir / "isolation" / _TABLE_NAME, low, high, locks, state_dir / "workspaces",
                      spawned=config.spawned_uids)
    return Isolation("uid", state_dir=state_dir, table=table, max_processes=config.max_processes,
                     tmp_inodes=config.tmp_inodes, network=config.network, host_allow=config.host_allow)


def _may(st: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    """Would ``uid``/``gid`` (no supplementary groups) get ``bits`` (r=4, w=2, x=1) on this file?"""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == uid:
        granted = mode >> 6
    elif st.st_gid == gid:
        granted = mode >> 3
    else:
        granted = mode
    return granted & bits == bits


def reachability_problems(
    needs: Iterable[tuple[str, str, str]], isolation: Isolation
) -> list[str]:
    """What an agent uid cannot reach among ``needs``: (path, "file" | "read" | "dir", the setting to change).

    A "file" must be executable, a "read" file readable, a dir readable and searchable, and every
    ancestor directory searchable, for the uid agents run as (for a uid
    range: a uid that owns nothing). Symlinks are resolved first.
    """
    probe = isolation.probe_credentials()
    if probe is None:
        return []
    uid, gid = probe
    problems = []
    for path, kind, setting in needs:
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}; set {setting}")
            continue
        blocked = None
        parent = os.path.dirname(real)
        while True:
            try:
                if not _may(os.stat(parent), uid, gid, 1):
                    blocked = parent
            except OSError:
                blocked = parent
            if parent == "/":
                break
            parent = os.path.dirname(parent)
        want = {"file": 1, "read": 4}.get(kind, 5)
        if blocked is not None:
            problems.append(
                f"{path} is not reachable by agent uids: {blocked} is not searchable by others "
                f"(mode {stat.S_IMODE(os.stat(blocked).st_mode):04o}); install it elsewhere or set {setting}"
            )
        elif not _may(st, uid, gid, want):
            what = "executable" if kind == "file" else "readable"
            problems.append(f"{path} is not {what} by agent uids (mode {stat.S_IMODE(st.st_mode):04o}); set {setting}")
    return problems
