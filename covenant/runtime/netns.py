"""A network namespace of each agent for everything it starts, held open by covenant.

Agents and their tools must never share the host's network namespace: on the host's loopback an
agent reaches every local service (databases, a local model server, the daemon's own listeners) and
can bind a free port a provider should answer on. So every process covenant starts for an agent uid
(its runs, its Rune replica, its process tools, its ``shell-exec`` and ``process-*`` commands, its
stdio MCP servers) enters a network namespace of that uid, one per network mode:

- ``off``: only its own ``lo``;
- ``full``: egress through ``slirp4netns`` (user-mode TCP/IP: no veth, no forwarding, no host-wide
  change), started with ``--disable-host-loopback`` (unless ``[isolation] host_allow`` names a
  loopback service, reached at 10.0.2.2 inside) and the agent's gid, so that the host's nftables
  table of the home (:mod:`covenant.runtime.hostnet`) refuses whatever it sends to any address of
  the host itself but the allowed services; DNS through the host's resolvers;
- ``outbound-https-only``: the same, and inside the namespace only TCP 443 and DNS leave.

The namespace is made once per uid and mode (~30 ms with slirp4netns) by a small process that
joins the uid's private mount namespace (:mod:`covenant.runtime.mountns`) when there is one, makes a
user namespace (owned by covenant's uid, never by the agent's: the agent gets no capability over the
namespace it lives in) with the network namespace, sets ``lo`` up and, for ``outbound-https-only``,
its filter, then execs ``sleep infinity`` to hold them (PDEATHSIG: it dies with covenant). An
agent's process enters both namespaces at exec with one ``setns`` on the holder's pidfd (covenant's
exec helper, :func:`covenant.runtime._elf.read_credentials`): ~10 µs per spawn.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from typing import Literal

from covenant.runtime import _elf
from covenant.runtime.holders import holder_alive, start_holder

__all__ = ["AgentNetworks", "HeldNamespaces", "NetworkMode", "SLIRP_DNS"]

log = logging.getLogger("covenant.runtime")

NetworkMode = Literal["off", "full", "outbound-https-only"]

SLIRP_DNS = "10.0.2.3"
"""slirp4netns's DNS forwarder inside the namespace (to the host's resolvers)."""

_SLIRP_READY_S = 10.0

# Inside the namespace of an outbound-https-only agent: nothing leaves but TCP 443 and DNS, and what is
# refused fails at once (no connect waits for its timeout). The namespace is owned by covenant's user
# namespace, so the agent (another uid) cannot change it.
_HTTPS_ONLY = """
table inet covenant {
  chain output {
    type filter hook output priority 0; policy drop;
    oifname "lo" accept
    ct state established,related accept
    tcp dport 443 accept
    udp dport 53 accept
    tcp dport 53 accept
    meta l4proto tcp reject with tcp reset
    reject with icmpx type admin-prohibited
  }
}
"""

_SETUP = r"""
import ctypes, fcntl, json, os, socket, struct, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(what, result):
    if result != 0:
        err = ctypes.get_errno()
        sys.stdout.write("error %s: %s\n" % (what, os.strerror(err)))
        sys.exit(1)
spec = json.loads(sys.argv[1])
if spec["mount_ns"]:
    fd = os.open(spec["mount_ns"], os.O_RDONLY)
    call("setns into the private /tmp", libc.setns(fd, 0x20000))
    os.close(fd)
    os.chdir("/")
uid, gid = os.geteuid(), os.getegid()
call("unshare a user and a network namespace", libc.unshare(0x10000000 | 0x40000000))
# Root in the new user namespace is covenant's own uid: what the holder execs keeps its capabilities
# there (nft below), and no agent uid is mapped in it.
for name, text in (("setgroups", "deny"), ("uid_map", "0 %d 1" % uid), ("gid_map", "0 %d 1" % gid)):
    with open("/proc/self/" + name, "w") as f:
        f.write(text)
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH14x", fcntl.ioctl(sock, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
fcntl.ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))
sock.close()
if spec["filter"]:
    done = subprocess.run([spec["nft"], "-f", "-"], input=spec["filter"].encode(), capture_output=True)
    if done.returncode != 0:
        sys.stdout.write("error nft: %s\n" % done.stderr.decode(errors="replace").strip())
        sys.exit(1)
sys.stdout.write("ready\n")
sys.stdout.flush()
os.execv(spec["sleep"], [spec["sleep"], "infinity"])
"""


@dataclass(frozen=True)
class HeldNamespaces:
    """What an agent process enters at exec: the namespaces of process ``holder`` that ``flags`` name."""

    holder: int
    flags: int


class _Holder:
    def __init__(self, process: subprocess.Popen[bytes], slirp: subprocess.Popen[bytes] | None,
                 exit_fd: int) -> None:
        self.process = process
        self.slirp = slirp
        self.exit_fd = exit_fd
        """Our end of slirp4netns's exit pipe: closing it stops slirp4netns (as covenant's death does)."""

    def alive(self) -> bool:
        """Are the holder and its slirp4netns up? Never reaps them: an unreaped pid cannot be reused while
        it is listed in :attr:`AgentNetworks.helper_pids`."""
        return holder_alive(self.process) and (self.slirp is None or holder_alive(self.slirp))

    def stop(self) -> None:
        if self.exit_fd >= 0:
            os.close(self.exit_fd)
            self.exit_fd = -1
        for process in (self.slirp, self.process):
            if process is not None:
                process.kill()
                process.wait()


class AgentNetworks:
    """One held network namespace per agent uid and network mode. Blocking methods.

    :meth:`namespaces_for` may start a holder, which dies with the thread that started it: call it on
    the loop's thread or a launch thread (:mod:`covenant.runtime.workers`).
    """

    def __init__(self, *, host_loopback: bool = False) -> None:
        self.host_loopback = host_loopback
        """Let slirp4netns connect to the host's loopback (10.0.2.2 inside): only when ``[isolation]
        host_allow`` lists a loopback service; the host's table still refuses every other port there."""
        self._holders: dict[tuple[int, NetworkMode], _Holder] = {}
        self._lock = threading.Lock()
        self.helper_pids: frozenset[int] = frozenset()
        """The holders' and slirp4netns' pids: covenant's children that are never an agent's."""
        self._sleep = shutil.which("sleep", path="/usr/bin:/bin")
        self._slirp = shutil.which("slirp4netns", path="/usr/bin:/bin:/usr/sbin:/sbin")
        self._nft = shutil.which("nft", path="/usr/sbin:/usr/bin:/sbin:/bin")

    def egress_problem(self) -> str | None:
        """Why agents cannot be given egress from a namespace here (None when they can)."""
        if self._slirp is None:
            return "slirp4netns is not installed (Debian package slirp4netns)"
        if self._nft is None:
            return "nft is not installed (Debian package nftables)"
        return None

    def namespaces_for(self, uid: int, gid: int, mode: NetworkMode, mount_ns: str | None) -> HeldNamespaces:
        """The namespaces a process of agent ``uid`` with network ``mode`` enters (made on first use).

        ``mount_ns``: the uid's private /tmp (a ``/proc/<pid>/ns/mnt`` path) the holder joins first, so
        that one setns gives both. Raises OSError (with the reason) when they cannot be made.
        """
        flags = _elf.CLONE_NEWNET | (_elf.CLONE_NEWNS if mount_ns else 0)
        with self._lock:
            holder = self._holders.get((uid, mode))
            if holder is not None:
                if holder.alive():
                    return HeldNamespaces(holder.process.pid, flags)
                del self._holders[(uid, mode)]
                self._list_pids()
                holder.stop()  # reaped only once it is off the list
            holder = self._start(gid, mode, mount_ns)
            self._holders[(uid, mode)] = holder
            self._list_pids()
            return HeldNamespaces(holder.process.pid, flags)

    def held(self, uid: int, mode: NetworkMode) -> bool:
        """Has ``uid`` a holder for ``mode`` already (so :meth:`namespaces_for` starts none unless it died)?"""
        return (uid, mode) in self._holders

    def release(self, uid: int) -> None:
        """Stop ``uid``'s namespaces (its agent is gone: unloaded, or a spawned agent that ended)."""
        with self._lock:
            holders = [self._holders.pop(key) for key in [k for k in self._holders if k[0] == uid]]
            self._list_pids()
        for holder in holders:
            holder.stop()

    def close(self) -> None:
        """Stop every holder and slirp4netns."""
        with self._lock:
            holders, self._holders = list(self._holders.values()), {}
            self._list_pids()
        for holder in holders:
            holder.stop()

    def _list_pids(self) -> None:
        pids = set()
        for holder in self._holders.values():
            pids.add(holder.process.pid)
            if holder.slirp is not None:
                pids.add(holder.slirp.pid)
        self.helper_pids = frozenset(pids)

    def _start(self, gid: int, mode: NetworkMode, mount_ns: str | None) -> _Holder:
        if self._sleep is None:
            raise OSError("no sleep(1) on /usr/bin:/bin to hold the network namespace")
        if mode != "off" and (problem := self.egress_problem()) is not None:
            raise OSError(f"no network for agents with network = {mode!r}: {problem}")
        spec = {"mount_ns": mount_ns, "sleep": self._sleep, "nft": self._nft,
                "filter": _HTTPS_ONLY if mode == "outbound-https-only" else ""}
        process = start_holder(_SETUP, spec, "the agent's network namespace")
        if mode == "off":
            return _Holder(process, None, -1)
        try:
            slirp, exit_fd = self._start_slirp(process.pid, gid)
        except OSError:
            process.kill()
            process.wait()
            raise
        return _Holder(process, slirp, exit_fd)

    def _start_slirp(self, holder: int, gid: int) -> tuple[subprocess.Popen[bytes], int]:
        """slirp4netns for ``holder``'s namespace, as covenant's uid with the agent's ``gid`` (the host's
        nftables rule for the home matches its sockets by gid); returns it with its exit pipe's end."""
        assert self._slirp is not None
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        exit_r, exit_w = os.pipe2(os.O_CLOEXEC)
        argv = [
            self._slirp, "--configure", "--mtu=65520", *([] if self.host_loopback else ["--disable-host-loopback"]),
            "--enable-sandbox", "--enable-seccomp",
            f"--userns-path=/proc/{holder}/ns/user", "--netns-type=path",
            f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", f"/proc/{holder}/ns/net", "tap0",
        ]
        try:
            slirp = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                env={}, close_fds=True, pass_fds=(ready_w, exit_r), start_new_session=True,
                group=gid, extra_groups=[],
            )
        except OSError:
            for fd in (ready_r, ready_w, exit_r, exit_w):
                os.close(fd)
            raise
        os.close(ready_w)
        os.close(exit_r)
        try:
            ready = _read_with_timeout(ready_r, _SLIRP_READY_S)
        finally:
            os.close(ready_r)
        if ready != b"1":
            slirp.kill()
            _, err = slirp.communicate()
            os.close(exit_w)
            detail = err.decode(errors="replace").strip().splitlines()
            raise OSError(f"slirp4netns did not come up: {detail[-1] if detail else 'no reason given'}")
        assert slirp.stderr is not None
        slirp.stderr.close()
        return slirp, exit_w


def _read_with_timeout(fd: int, timeout_s: float) -> bytes:
    import select

    readable, _, _ = select.select([fd], [], [], timeout_s)
    return os.read(fd, 1) if readable else b""
