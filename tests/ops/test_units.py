"""The systemd unit files: verify, the security score, sysusers and tmpfiles."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT, require_tool

UNITS = REPO_ROOT / "systemd"
MAX_EXPOSURE = 3.5


def directives(unit: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def installed_covenant() -> Path:
    """The venv's covenant entry point: verify insists ExecStart's binary exists."""
    path = Path(sys.executable).parent / "covenant"
    assert path.exists(), f"{path} missing: run `pip install -e .` first"
    return path


def verifiable_copy(tmp_path: Path) -> tuple[Path, Path]:
    """The units as shipped, except ExecStart points at this checkout's venv.

    The shipped unit keeps /usr/local/bin/covenant (the documented install
    path); only that one line changes, so everything else is verified as is.
    """
    service_text = (UNITS / "covenant.service").read_text()
    assert len(re.findall(r"^ExecStart=/usr/local/bin/covenant ", service_text, flags=re.M)) == 1, \
        "covenant.service must have exactly one ExecStart=/usr/local/bin/covenant line"
    # ExecStartPre/ExecStopPost run `covenant network-setup` (as root, "+"): the same binary.
    rewritten = re.sub(r"^(Exec\w+=\+?)/usr/local/bin/covenant ", rf"\g<1>{installed_covenant()} ", service_text,
                       flags=re.M)
    service = tmp_path / "covenant.service"
    service.write_text(rewritten)
    socket_unit = tmp_path / "covenant.socket"
    socket_unit.write_text((UNITS / "covenant.socket").read_text())
    return service, socket_unit


def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    tool = require_tool("systemd-analyze")
    service, socket_unit = verifiable_copy(tmp_path)
    out = subprocess.run([tool, "verify", str(service), str(socket_unit)], capture_output=True, text=True, timeout=120)
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if "covenant" in line]
    assert out.returncode == 0 and not complaints, out.stdout + out.stderr


def test_security_exposure_is_at_most_3_5() -> None:
    tool = require_tool("systemd-analyze")
    out = subprocess.run(
        [tool, "security", "--offline=yes", str(UNITS / "covenant.service")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    match = re.search(r"Overall exposure level for covenant\.service: (\d+\.\d+)", out.stdout + out.stderr)
    assert match, out.stdout + out.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, out.stdout


def test_service_has_the_directives_operations_rely_on() -> None:
    d = directives(UNITS / "covenant.service")
    assert d["Type"] == ["notify"]
    assert d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert d["KillMode"] == ["mixed"]
    assert d["Restart"] == ["on-failure"]
    assert d["User"] == ["covenant"]
    assert "COVENANT_HOME=/var/lib/covenant" in d["Environment"]
    assert "COVENANT_SOCKET=%t/covenant/covenant.sock" in d["Environment"]
    # Stop timeout must exceed the default 30 s drain plus the 2 s kill grace.
    assert int(d["TimeoutStopSec"][0].rstrip("s")) > 32
    assert d["OOMPolicy"] == ["continue"]
    for hardening in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "RestrictSUIDSGID", "LockPersonality"):
        assert d[hardening] == ["yes"], hardening
    assert d["ProtectSystem"] == ["strict"]
    assert d["SystemCallArchitectures"] == ["native"]
    # Agents run as other uids (docs/security.md): exactly these capabilities, each said why in the unit.
    caps = {"CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER",
            "CAP_SYS_ADMIN", "CAP_SYS_CHROOT"}
    assert set(d["CapabilityBoundingSet"][0].split()) == caps == set(d["AmbientCapabilities"][0].split())
    why = (UNITS / "covenant.service").read_text().split("CapabilityBoundingSet=")[0]
    assert all(cap in why for cap in caps), "each capability is explained in a comment above it"
    # The daemon watches agent processes of other uids: /proc must show them.
    assert "ProtectProc" not in d
    # Agents' network and mount namespaces (private /tmp); user: agents' network namespaces are owned by a user namespace of the daemon's uid (netns.py).
    assert set(d["RestrictNamespaces"][0].split()) == {"net", "mnt", "user"}
    assert d["ExecStartPre"] == ["+/usr/local/bin/covenant network-setup"]
    assert d["ExecStopPost"] == ["+/usr/local/bin/covenant network-setup --remove"]
    # The home is traversable by agent uids (0711), never listable.
    assert d["StateDirectoryMode"] == ["0711"]
    # setuid and friends must not be filtered out (the exec helper needs them).
    assert not any("@privileged" in f or "@setuid" in f for f in d["SystemCallFilter"] if f.startswith("~"))
    socket_d = directives(UNITS / "covenant.socket")
    assert socket_d["ListenStream"] == ["%t/covenant/covenant.sock"]
    assert socket_d["SocketMode"] == ["0660"]


def test_sysusers_creates_the_account(tmp_path: Path) -> None:
    tool = require_tool("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    out = subprocess.run(
        [tool, f"--root={tmp_path}", str(UNITS / "covenant.sysusers.conf")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text()
    assert re.search(r"^covenant:x:\d+:\d+:[^:]*:/var/lib/covenant:/usr/sbin/nologin$", passwd, re.M), passwd
    assert re.search(r"^covenant:x:\d+:", (tmp_path / "etc" / "group").read_text(), re.M)


def test_tmpfiles_creates_the_layout(tmp_path: Path) -> None:
    tool = require_tool("systemd-tmpfiles")
    # systemd 252 resolves owners on the host, where no covenant account exists
    # in a test run; the layout and modes are what is checked here.
    config = tmp_path / "covenant.tmpfiles.conf"
    config.write_text((UNITS / "covenant.tmpfiles.conf").read_text().replace("covenant covenant", "root root"))
    root = tmp_path / "root"
    root.mkdir()
    out = subprocess.run([tool, f"--root={root}", "--create", str(config)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert oct((root / "var/lib/covenant").stat().st_mode & 0o777) == "0o711"
    assert oct((root / "run/covenant").stat().st_mode & 0o777) == "0o750"
    link = root / "var/lib/covenant/covenant.toml"
    assert link.is_symlink() and str(link.readlink()) == "/etc/covenant/covenant.toml"



def test_the_fleet_unit_verifies_beside_the_daemon_units(tmp_path: Path) -> None:
    tool = require_tool("systemd-analyze")
    service, socket_unit = verifiable_copy(tmp_path)
    rewritten, count = re.subn(r"^ExecStart=/usr/local/bin/covenant ", f"ExecStart={installed_covenant()} ",
                               (UNITS / "covenant-fleet.service").read_text(), flags=re.M)
    assert count == 1, "covenant-fleet.service must have exactly one ExecStart=/usr/local/bin/covenant line"
    fleet = tmp_path / "covenant-fleet.service"
    fleet.write_text(rewritten)
    out = subprocess.run([tool, "verify", str(fleet), str(service), str(socket_unit)], capture_output=True, text=True,
                         timeout=120)
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if "covenant" in line]
    assert out.returncode == 0 and not complaints, out.stdout + out.stderr


def test_the_fleet_unit_security_exposure_is_at_most_2_0() -> None:
    tool = require_tool("systemd-analyze")
    out = subprocess.run([tool, "security", "--offline=yes", str(UNITS / "covenant-fleet.service")],
                         capture_output=True, text=True, timeout=120)
    match = re.search(r"Overall exposure level for covenant-fleet\.service: (\d+\.\d+)", out.stdout + out.stderr)
    assert match, out.stdout + out.stderr
    assert float(match.group(1)) <= 2.0, out.stdout  # no capabilities, no namespaces, no @mount: far below the daemon


def test_the_fleet_unit_is_hardened_like_the_daemon_unit() -> None:
    fleet, daemon = directives(UNITS / "covenant-fleet.service"), directives(UNITS / "covenant.service")
    assert fleet["ExecStart"] == ["/usr/local/bin/covenant fleet"]
    assert fleet["BindsTo"] == ["covenant.service"] and "covenant.service" in fleet["After"][0].split()
    # The daemon's user (POST /v1/fleet/events is for root or the daemon's uid), home and socket.
    for key in ("User", "Group", "UMask", "Environment", "WorkingDirectory"):
        assert fleet[key] == daemon[key], key
    # Every switch the daemon's unit turns on is on here too, but the one that keeps its own runtime directory.
    for key, values in daemon.items():
        if values == ["yes"] and key != "RuntimeDirectoryPreserve":
            assert fleet.get(key) == ["yes"], key
    assert fleet["ProtectSystem"] == daemon["ProtectSystem"] == ["strict"]
    assert fleet["SystemCallArchitectures"] == ["native"]
    # Stricter than the daemon, which runs agents: no capabilities, no namespaces, no @mount, /proc shows only itself.
    assert fleet["CapabilityBoundingSet"] == [""] and fleet["AmbientCapabilities"] == [""]
    assert fleet["RestrictNamespaces"] == ["yes"] and fleet["ProtectProc"] == ["invisible"]
    assert "@mount" not in fleet["SystemCallFilter"][0] and "@mount" in fleet["SystemCallFilter"][1]
    assert set(fleet["RestrictAddressFamilies"][0].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    # It owns no directory of the daemon's (a second owner would remove /run/covenant when it stops) and writes nothing.
    for key in ("StateDirectory", "RuntimeDirectory", "ConfigurationDirectory", "ReadWritePaths"):
        assert key not in fleet, key
    # It drains like the daemon: SIGTERM to it, the same time to finish what is in flight.
    assert fleet["TimeoutStopSec"] == daemon["TimeoutStopSec"] and fleet["KillMode"] == ["mixed"]
