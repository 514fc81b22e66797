"""The host's side of agents' network confinement: one nftables table per home.

An agent with network reaches the world through slirp4netns (:mod:`covenant.runtime.netns`), which
connects from the host's own network namespace with the agent's gid. This table refuses whatever a
socket of one of the home's agent gids sends to an address of the host itself — its loopback and
every address it owns (``fib daddr type local``) — except the services listed in
``[isolation] host_allow`` and port 53 of the host's resolvers (``/etc/resolv.conf``). So egress
reaches the world and never the host. The rule matches agent processes that run in the host's
network namespace too.

Writing it takes CAP_NET_ADMIN: a root daemon (or ``covenant run``) installs a table of its own at
start and removes it at stop; a daemon without that capability (the systemd unit) gets the home's
table from ``covenant network-setup``, run as root by ``ExecStartPre=+`` (``ExecStopPost=+`` removes
it). Either way it is checked before an agent gets egress (:func:`check`): a probe process of an
agent gid must fail to reach a listener of covenant's on the host's loopback.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

from covenant.netpolicy import parse_host_service

__all__ = ["table_name", "ruleset", "install", "remove", "host_resolvers", "check"]

_NFT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def table_name(home_key: str, pid: int | None = None) -> str:
    """``covenant_<10 hex>``: the home's table (its state dir), as ``covenant network-setup`` makes it;
    with ``pid``, ``covenant_<10 hex>_<pid>``: the table of one covenant process (a root daemon or
    ``covenant run``), removed when it stops. Two homes, or two processes of one, keep theirs."""
    name = "covenant_" + hashlib.sha256(home_key.encode()).hexdigest()[:10]
    return f"{name}_{pid}" if pid is not None else name


def host_resolvers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The IP addresses of the ``nameserver`` lines of ``resolv_conf`` (none when it is unreadable)."""
    try:
        lines = resolv_conf.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                found.append(str(ipaddress.ip_address(fields[1].split("%", 1)[0])))
            except ValueError:
                continue
    return found


def _family(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    return "ip" if address.version == 4 else "ip6"


def ruleset(name: str, gids: tuple[int, int], host_allow: tuple[str, ...], resolvers: list[str]) -> str:
    """The ``nft -f`` text that makes table ``name`` anew (atomically: no moment without it)."""
    low, high = gids
    allowed = []
    for entry in host_allow:
        address, port = parse_host_service(entry)
        allowed.append(f"    {_family(address)} daddr {address} tcp dport {port} accept")
    for resolver in resolvers:
        address = ipaddress.ip_address(resolver)
        for proto in ("udp", "tcp"):
            allowed.append(f"    {_family(address)} daddr {address} {proto} dport 53 accept")
    agents = f"{low}-{high}" if low != high else str(low)
    return "\n".join([
        f"table inet {name}",
        f"delete table inet {name}",
        f"table inet {name} {{",
        "  chain agents {",
        *allowed,
        # Refused at once: a TCP connect gets a reset (an ICMP error would only be retried past), the rest
        # an ICMP error, so nothing waits for its timeout.
        "    fib daddr type local meta l4proto tcp reject with tcp reset",
        "    fib daddr type local reject with icmpx type admin-prohibited",
        "  }",
        "  chain output {",
        "    type filter hook output priority filter; policy accept;",
        f"    meta skgid {agents} jump agents",
        "  }",
        "}",
        "",
    ])


def _nft() -> str:
    found = shutil.which("nft", path=_NFT_PATH)
    if found is None:
        raise OSError("nft is not installed (Debian package nftables)")
    return found


def install(text: str) -> None:
    """Load a :func:`ruleset` (needs CAP_NET_ADMIN); OSError with nft's reason when it is refused."""
    done = subprocess.run([_nft(), "-f", "-"], input=text.encode(), capture_output=True, timeout=30)
    if done.returncode != 0:
        raise OSError(f"nft refused the home's table: {done.stderr.decode(errors='replace').strip()}")


def remove(name: str) -> None:
    """Delete table ``name`` (nothing when it is not there)."""
    subprocess.run([_nft(), "-f", "-"], input=f"table inet {name}\ndelete table inet {name}\n".encode(),
                   capture_output=True, timeout=30)


_PROBE = 'echo started; exec 3<>"/dev/tcp/127.0.0.1/$1"'


def check(uid: int, gid: int) -> str | None:
    """Why a process of agent ``uid``/``gid`` in the host's network namespace can still reach the host's
    loopback (None when it cannot: the rules are in place). Blocking; starts one short process."""
    bash = shutil.which("bash", path="/usr/bin:/bin")
    if bash is None:
        return "no bash on /usr/bin:/bin to run the check that agents cannot reach the host"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        try:
            done = subprocess.run([bash, "-c", _PROBE, "probe", str(port)], user=uid, group=gid, extra_groups=[],
                                  env={}, cwd="/", capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"the check that agents cannot reach the host could not run: {exc}"
    if not done.stdout.startswith(b"started"):
        return f"the check that agents cannot reach the host did not run: {done.stderr.decode(errors='replace').strip()[:200]}"
    if done.returncode == 0:
        return ("a process of an agent gid still reaches the host's loopback: the home's nftables table is not "
                "in place (run `covenant network-setup` as root, see systemd/covenant.service)")
    return None


def confine(home_key: str, gids: tuple[int, int], host_allow: tuple[str, ...]) -> str | None:
    """Install this process's table for the home (when covenant may: CAP_NET_ADMIN, i.e. root) and
    return its name, or None when the home's table must come from ``covenant network-setup``.

    Tables of covenant processes that died without removing theirs (``kill -9``) are removed first:
    they would keep refusing what a later process of the same range allows."""
    if os.geteuid() != 0:
        return None
    remove_orphans()
    name = table_name(home_key, os.getpid())
    install(ruleset(name, gids, host_allow, host_resolvers()))
    return name


_PROCESS_TABLE = re.compile(r"^table inet (covenant_[0-9a-f]{10}_(\d+))$")


def remove_orphans() -> None:
    """Delete every per-process covenant table whose process is gone."""
    done = subprocess.run([_nft(), "list", "tables"], capture_output=True, text=True, timeout=30)
    for line in done.stdout.splitlines():
        match = _PROCESS_TABLE.match(line.strip())
        if match is not None and not os.path.exists(f"/proc/{match[2]}"):
            remove(match[1])
