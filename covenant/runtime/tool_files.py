"""What a tool process may see of the file system: the Landlock rules of one tool run.

Every tool run confined by :mod:`covenant.runtime.tool_confinement` gets the system's files
read-only — what a program needs to run, never a credential — and writes only its scratch dir
(``HOME``/``TMPDIR``); a :class:`ToolFiles` adds the rest (its package folder read-only, the
agent's workspace read-write when the tool declares ``filesystem``). The lists are documented in
docs/security.md ("Tool files"); a change here changes that page.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable
from dataclasses import dataclass

from covenant.runtime.landlock import DEVICE, READ_ONLY, READ_WRITE, Rule

__all__ = [
    "DEVICES",
    "ETC",
    "ETC_SECRETS",
    "PROC",
    "SYSTEM_DIRS",
    "SystemFiles",
    "ToolFiles",
    "interpreter_roots",
    "system_files",
]

SYSTEM_DIRS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Read-only, with everything beneath: programs, libraries, their data (a missing one is skipped)."""

DEVICES: tuple[str, ...] = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
"""Read, write and ioctl; nothing else of /dev (no /dev/shm, no terminals, no disks)."""

PROC = "/proc"
"""Read-only. Landlock names inodes, and "the process itself" (``/proc/self``) has none before the tool
exists, so all of /proc is readable as the kernel allows it: other uids' entries by their modes, and a
same-uid process outside the tool's own Landlock domain (its replica, another run) is ptrace-scoped,
so its ``environ``, ``mem``, ``fd`` and ``maps`` stay closed to the tool."""

ETC = "/etc"
ETC_SECRETS: tuple[str, ...] = (
    "shadow", "shadow-", "gshadow", "gshadow-", ".pwd.lock", "security/opasswd",
    "sudoers", "sudoers.d",
    "ssh/ssh_host_*_key",
    "ssl/private", "pki/tls/private", "pki/CA/private",
    "krb5.keytab", "credstore", "credstore.encrypted", "ipsec.secrets", "ipsec.d/private",
    "NetworkManager/system-connections", "wpa_supplicant", "ppp/chap-secrets", "ppp/pap-secrets",
    "letsencrypt", "libvirt/secrets", "docker/key.json",
    "covenant",
)
"""Entries of /etc a tool never sees, whatever their modes (``fnmatch`` patterns per component, relative to
/etc): password hashes, sudo rules, SSH host keys, TLS private keys, Kerberos keytabs, systemd
credentials, VPN, Wi-Fi and PPP secrets, and covenant's own config folder (the shipped unit's). Every
other entry of /etc is readable (one rule each: Landlock allows, it cannot subtract); /etc itself and
the folders holding a secret cannot be listed."""


_SECRET_PARTS = tuple(tuple(pattern.split("/")) for pattern in ETC_SECRETS)


def _secrecy(parts: tuple[str, ...]) -> str:
    """``secret`` (a secret or beneath one), ``holds`` (a folder with a secret beneath) or ``clear``, for a path
    relative to /etc given as components."""
    holds = False
    for pattern in _SECRET_PARTS:
        common = min(len(parts), len(pattern))
        if all(fnmatch.fnmatchcase(parts[i], pattern[i]) for i in range(common)):
            if len(parts) >= len(pattern):
                return "secret"
            holds = True
    return "holds" if holds else "clear"


@dataclass(frozen=True)
class SystemFiles:
    """The rules every confined tool run gets, and the folders whose change makes them stale."""

    rules: tuple[Rule, ...]
    watched: tuple[str, ...]
    """/etc and each folder of it enumerated around a secret: an entry created, renamed or replaced in one
    (``passwd`` is replaced on every ``useradd``) changes its mtime, and the rules are made again."""


def _etc_rules(etc: str, rules: list[Rule], watched: list[str]) -> None:
    """A rule per entry of ``etc`` that is no secret; a folder holding a secret is listed in turn.

    Secrets are judged by where an entry really is (its symlinks resolved), so a link to a folder
    (``/etc/pki -> ssl``) cannot carry a rule over a secret the folder's own name would have kept out.
    """
    root = os.path.realpath(etc)
    folders, seen = [root], set()
    while folders:
        folder = folders.pop()
        if folder in seen:
            continue
        seen.add(folder)
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        watched.append(folder)
        for name in names:
            path = os.path.join(folder, name)
            real = os.path.realpath(path)
            inside = real == root or real.startswith(root + "/")
            secrecy = _secrecy(tuple(os.path.relpath(real, root).split("/"))) if inside else "clear"
            if real == root:
                secrecy = "holds"
            if secrecy == "holds" and os.path.isdir(real):
                folders.append(real)
            elif secrecy == "clear":
                rules.append(Rule(path, READ_ONLY))


def interpreter_roots(path: str) -> list[str]:
    """The folders an interpreter needs read-only beyond the system's: for ``<P>/bin/python3`` its prefix ``<P>``
    (a venv's, with the ``home`` its ``pyvenv.cfg`` names), for the file it links to too; never ``/``."""
    roots: list[str] = []
    for candidate in dict.fromkeys((path, os.path.realpath(path))):
        folder = os.path.dirname(candidate)
        prefix = os.path.dirname(folder) if os.path.basename(folder) == "bin" else folder
        roots.append(prefix)
        try:
            with open(os.path.join(prefix, "pyvenv.cfg"), encoding="utf-8") as f:
                for line in f:
                    key, _, value = line.partition("=")
                    if key.strip() == "home" and value.strip():
                        home = os.path.realpath(value.strip())
                        roots.append(os.path.dirname(home) if os.path.basename(home) == "bin" else home)
        except (OSError, UnicodeDecodeError):
            pass
    return [root for root in dict.fromkeys(roots) if root not in ("/", "")]


def system_files(interpreters: Iterable[str], etc: str = ETC) -> SystemFiles:
    """The system part of every confined tool run's rules (blocking: it lists ``etc``, /etc but in tests)."""
    rules = [Rule(path, READ_ONLY) for path in SYSTEM_DIRS]
    watched: list[str] = []
    _etc_rules(etc, rules, watched)
    rules += [Rule(path, DEVICE) for path in DEVICES]
    rules.append(Rule(PROC, READ_ONLY))
    for interpreter in interpreters:
        rules += [Rule(root, READ_ONLY) for root in interpreter_roots(interpreter) if not _beneath_system_dir(root)]
    return SystemFiles(tuple(dict.fromkeys(rules)), tuple(watched))


def _beneath_system_dir(path: str) -> bool:
    return any(path == top or path.startswith(top + "/") for top in SYSTEM_DIRS)


@dataclass(frozen=True)
class ToolFiles:
    """What one tool run may see beyond the system's files and its own scratch dir (absolute paths).

    A process tool: its package folder read-only, and with the ``filesystem`` capability the agent's
    workspace read-write; ``rune@shell-exec`` and ``rune@process-start``: the workspace read-write.
    """

    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()

    def rules(self, scratch: str) -> list[Rule]:
        """These paths and ``scratch`` as rules, each of which must exist. A writable one never follows a symlink
        (its parent is the daemon's, but a rule must not land elsewhere); a read-only one (a package folder, which
        only the daemon's uid may change) does."""
        return [
            *(Rule(path, READ_ONLY, required=True) for path in self.read_only),
            *(Rule(path, READ_WRITE, follow=False, required=True) for path in (*self.read_write, scratch)),
        ]
