"""systemd integration without libsystemd: sd_notify, the watchdog, socket activation.

The protocols are small and stable (sd_notify(3), sd_watchdog_enabled(3),
sd_listen_fds(3)), so they are spoken directly over plain sockets: no C
library, no trio. Outside systemd every call is a cheap no-op, so the daemon
calls them unconditionally.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

from covenant.errors import ConfigError

__all__ = [
    "Notifier",
    "notify",
    "watchdog_interval_s",
    "run_watchdog",
    "listen_fds",
    "activated_unix_listener",
    "monotonic_usec",
    "SD_LISTEN_FDS_START",
]

SD_LISTEN_FDS_START = 3
_LISTEN_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def _notify_address(raw: str | None) -> str | bytes | None:
    """``$NOTIFY_SOCKET`` as a connectable address; ``@name`` is Linux's abstract namespace."""
    if not raw:
        return None
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    # vsock: and other transports newer systemd versions may hand out are not
    # spoken here; treating them as "not under systemd" keeps the daemon running.
    return None


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, as Type=notify-reload wants with RELOADING=1."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Notifier:
    """Sends sd_notify datagrams, keeping one socket open for frequent watchdog pings.

    ``address`` defaults to ``$NOTIFY_SOCKET`` read at construction. When there is
    no address, every method returns False and does nothing. Send errors (the
    manager went away, a stale path) also return False: notification is best
    effort and must never take the daemon down.
    """

    def __init__(self, address: str | None = None) -> None:
        raw = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._address = _notify_address(raw)
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        """True when a notification socket was configured (i.e. running under systemd)."""
        return self._address is not None

    def send(self, state: str) -> bool:
        """Send ``state`` (newline-separated ``KEY=value`` assignments) as one datagram."""
        if self._address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(state.encode("utf-8", "replace"), self._address)
            return True
        except OSError:
            self.close()
            return False

    def ready(self, status: str | None = None) -> bool:
        """READY=1 (and STATUS=), sent once the control socket serves requests."""
        return self.send("READY=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))

    def status(self, text: str) -> bool:
        """STATUS=<text>: what ``systemctl status covenant`` shows."""
        return self.send(f"STATUS={_one_line(text)}")

    def reloading(self, status: str | None = "reloading manifests and grants") -> bool:
        """RELOADING=1 with MONOTONIC_USEC (Type=notify-reload needs it); follow with ready()."""
        state = f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec()}"
        if status:
            state += f"\nSTATUS={_one_line(status)}"
        return self.send(state)

    def stopping(self, status: str | None = "draining in-flight dispatches") -> bool:
        """STOPPING=1, sent as soon as SIGTERM is handled."""
        return self.send("STOPPING=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))

    def watchdog(self) -> bool:
        """WATCHDOG=1 keep-alive ping; send every :func:`watchdog_interval_s` seconds."""
        return self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "Notifier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _one_line(text: str) -> str:
    # A newline would start a new assignment and let text inject e.g. READY=1.
    return " ".join(text.splitlines())


def notify(state: str) -> bool:
    """Send one sd_notify datagram to ``$NOTIFY_SOCKET``; False when not under systemd.

    Example: ``notify("READY=1\\nSTATUS=serving on /run/covenant/covenant.sock")``.
    Never raises for a missing or dead socket.
    """
    with Notifier() as notifier:
        return notifier.send(state)


def watchdog_interval_s(env: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of ``WatchdogSec=``), or None when disabled.

    Reads ``WATCHDOG_USEC``; when ``WATCHDOG_PID`` is set it must name this process
    (otherwise the watchdog belongs to someone else, e.g. a parent that exec'd us).
    Malformed values disable the watchdog rather than crash the daemon.
    """
    env = os.environ if env is None else env
    pid = os.getpid() if pid is None else pid
    raw_usec = env.get("WATCHDOG_USEC")
    if not raw_usec:
        return None
    raw_pid = env.get("WATCHDOG_PID")
    if raw_pid:
        try:
            if int(raw_pid) != pid:
                return None
        except ValueError:
            return None
    try:
        usec = int(raw_usec)
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 2 / 1_000_000


async def run_watchdog(notifier: Notifier, period_s: float) -> None:
    """Ping WATCHDOG=1 every ``period_s`` until cancelled; run it in the daemon's nursery.

    It lives on the event loop on purpose: if the loop stalls, the pings stop
    and systemd restarts the daemon, which is what the watchdog is for.
    """
    import trio  # only the daemon needs this; the rest of the module is plain sockets

    while True:
        notifier.watchdog()
        await trio.sleep(period_s)


def listen_fds() -> list[socket.socket]:
    """Sockets passed by systemd socket activation (fds 3.. per ``LISTEN_FDS``), else [].

    Only honoured when ``LISTEN_PID`` is this process. The LISTEN_* variables are
    removed from the environment either way so that spawned children never
    mistake the daemon's sockets for their own; the returned sockets are
    close-on-exec for the same reason.
    """
    raw_pid = os.environ.get("LISTEN_PID")
    raw_fds = os.environ.get("LISTEN_FDS")
    for name in _LISTEN_VARS:
        os.environ.pop(name, None)
    if not raw_pid or not raw_fds:
        return []
    try:
        if int(raw_pid) != os.getpid():
            return []
        count = int(raw_fds)
    except ValueError:
        return []
    sockets: list[socket.socket] = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + max(count, 0)):
        os.set_inheritable(fd, False)
        sockets.append(socket.socket(fileno=fd))
    return sockets


def activated_unix_listener() -> socket.socket | None:
    """The one AF_UNIX stream socket systemd passed us, or None without activation.

    Anything else (several sockets, a TCP or datagram socket) is a unit-file
    mistake; it is reported as a ConfigError naming what was received.
    """
    sockets = listen_fds()
    if not sockets:
        return None
    described = [f"fd {s.fileno()}: family={s.family.name} type={s.type.name}" for s in sockets]
    if len(sockets) != 1 or sockets[0].family != socket.AF_UNIX or sockets[0].type != socket.SOCK_STREAM:
        for s in sockets:
            s.close()
        raise ConfigError(
            "socket activation passed "
            + "; ".join(described)
            + ", but covenant serves exactly one AF_UNIX stream socket: "
            "fix ListenStream= in covenant.socket (one ListenStream=%t/covenant/covenant.sock)",
            sockets=described,
        )
    return sockets[0]
