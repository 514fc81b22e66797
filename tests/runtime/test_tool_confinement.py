"""What a confined tool run may see (tool_files) and the rulesets kept for its runs (tool_confinement)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from covenant.config import RuntimeConfig
from covenant.runtime import landlock
from covenant.runtime.landlock import DEVICE, READ_ONLY, READ_WRITE
from covenant.runtime.launcher import LaunchError
from covenant.runtime.tool_confinement import ToolConfinement, confinement_problem
from covenant.runtime.tool_files import DEVICES, PROC, ToolFiles, interpreter_roots, system_files

from .test_landlock import run_confined


def _fake_etc(root: Path) -> Path:
    etc = root / "etc"
    for folder in ("ssh", "ssl/private", "ssl/certs", "sudoers.d", "security"):
        (etc / folder).mkdir(parents=True)
    for name in ("passwd", "shadow", "gshadow-", "hosts", "ssh/ssh_host_ed25519_key", "ssh/ssh_host_ed25519_key.pub",
                 "ssh/ssh_config", "ssl/private/server.key", "ssl/certs/ca.pem", "ssl/openssl.cnf", "sudoers.d/admins",
                 "security/opasswd", "security/limits.conf"):
        (etc / name).write_text(name)
    (etc / "pki").symlink_to("ssl")  # a link to a folder holding a secret: the folder is enumerated
    return etc


def test_etc_is_readable_entry_by_entry_without_its_secrets(tmp_path: Path) -> None:
    etc = _fake_etc(tmp_path)
    files = system_files([], str(etc))
    seen = {r.path.removeprefix(f"{etc}/") for r in files.rules if r.path.startswith(str(etc))}
    assert seen == {"passwd", "hosts", "ssh/ssh_host_ed25519_key.pub", "ssh/ssh_config", "ssl/certs", "ssl/openssl.cnf",
                    "security/limits.conf", "ssl/certs", "ssl/openssl.cnf"}
    assert all(r.access == READ_ONLY for r in files.rules if r.path.startswith(str(etc)))
    assert set(files.watched) == {str(etc), str(etc / "ssh"), str(etc / "ssl"), str(etc / "security")}


def test_the_hosts_system_files_hold_no_secret_and_what_programs_need() -> None:
    files = system_files(["/usr/bin/python3"])
    paths = {r.path: r.access for r in files.rules}
    assert not {"/etc", "/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/sudoers.d"} & set(paths)
    assert not [p for p in paths if p.startswith("/etc/ssh/ssh_host_") and p.endswith("_key")]
    assert paths["/usr"] == paths["/etc/passwd"] == paths[PROC] == READ_ONLY
    assert all(paths[d] == DEVICE for d in DEVICES if os.path.exists(d))
    assert not [p for p in paths if p in ("/", "/home", "/root", "/var", "/srv", "/tmp")]


def test_an_interpreters_prefix_and_its_venvs_home_are_readable(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    (venv / "pyvenv.cfg").write_text(f"home = {tmp_path / 'base' / 'bin'}\n")
    assert interpreter_roots(str(venv / "bin" / "python")) == [str(venv), str(tmp_path / "base"), "/usr"]
    assert interpreter_roots("/opt/tool/python") == ["/opt/tool"]
    assert interpreter_roots("/python") == []  # never the whole file system
    assert str(venv) in {r.path for r in system_files([str(venv / "bin" / "python")]).rules}


def test_the_host_is_judged_before_any_ruleset() -> None:
    assert "same-uid" in (confinement_problem(RuntimeConfig(), isolated=False) or "")
    assert "runtime.pdeathsig = false" in (confinement_problem(RuntimeConfig(pdeathsig=False), isolated=True) or "")
    refusing = ToolConfinement("no Landlock here")
    with pytest.raises(LaunchError, match="refusing to run it unconfined"):
        refusing.acquire(ToolFiles(), "/nonexistent")
    assert refusing.to_json() == {"confined_by": None, "landlock_abi": landlock.abi_version(), "problem": "no Landlock here"}
    assert refusing.where_possible(ToolFiles(read_write=("/w",))) is None


@pytest.fixture
def confinement(tmp_path: Path) -> ToolConfinement:
    reason = landlock.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    made = ToolConfinement(None, capacity=2, etc=str(_fake_etc(tmp_path)))
    yield made
    made.close()


def _open_rulesets() -> int:
    return sum(_live(int(fd)) for fd in os.listdir("/proc/self/fd"))


def _live(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[landlock-ruleset]"
    except FileNotFoundError:
        return False


def test_a_runs_ruleset_is_kept_for_the_same_files_and_scratch_dir(tmp_path: Path, confinement: ToolConfinement) -> None:
    package, scratch, other = tmp_path / "pkg", tmp_path / "s1", tmp_path / "s2"
    for folder in (package, scratch, other):
        folder.mkdir()
    files = ToolFiles(read_only=(str(package),))
    first = confinement.acquire(files, str(scratch))
    again = confinement.acquire(files, str(scratch))
    assert again is first and first.users == 2
    confinement.release(first)
    confinement.release(again)
    assert _live(first.fd)  # kept, unused
    elsewhere = confinement.acquire(files, str(other))
    assert elsewhere is not first
    package.rmdir()
    package.mkdir()  # the same path, another inode: a rule on the old one would not reach it
    renewed = confinement.acquire(files, str(scratch))
    assert renewed is not first and first.evicted and not elsewhere.evicted
    assert _open_rulesets() == 2  # capacity 2: the oldest, unused, was closed
    confinement.release(renewed)
    confinement.release(elsewhere)


def test_a_ruleset_in_use_outlives_its_eviction(tmp_path: Path, confinement: ToolConfinement) -> None:
    scratches = [tmp_path / f"s{i}" for i in range(3)]
    for folder in scratches:
        folder.mkdir()
    held = [confinement.acquire(ToolFiles(), str(folder)) for folder in scratches]
    assert held[0].evicted and _live(held[0].fd)
    confinement.release(held[0])
    assert not _live(held[0].fd)
    for h in held[1:]:
        confinement.release(h)


def test_a_change_in_etc_makes_every_kept_ruleset_anew(tmp_path: Path, confinement: ToolConfinement) -> None:
    scratch = tmp_path / "s"
    scratch.mkdir()
    before = confinement.acquire(ToolFiles(), str(scratch))
    confinement.release(before)
    (tmp_path / "etc" / "passwd").rename(tmp_path / "etc" / "passwd.new")  # as useradd replaces it
    (tmp_path / "etc" / "passwd.new").rename(tmp_path / "etc" / "passwd")
    after = confinement.acquire(ToolFiles(), str(scratch))
    assert after is not before and before.evicted and _open_rulesets() == 1
    results = run_confined(after.fd, [("read", str(tmp_path / "etc" / "passwd")), ("read", str(tmp_path / "etc" / "shadow"))])
    confinement.release(after)
    assert results == ["ok", "EACCES"]


def test_a_confined_run_sees_its_package_writes_its_scratch_and_nothing_else(tmp_path: Path, confinement: ToolConfinement) -> None:
    package, workspace, scratch = tmp_path / "pkg", tmp_path / "ws", tmp_path / "scratch"
    for folder in (package, workspace, scratch):
        folder.mkdir()
        (folder / "f").write_text("x")
    for files, workspace_access in ((ToolFiles(read_only=(str(package),)), "EACCES"),
                                    (ToolFiles(read_only=(str(package),), read_write=(str(workspace),)), "ok")):
        held = confinement.acquire(files, str(scratch))
        try:
            results = run_confined(held.fd, [
                ("read", f"{package}/f"), ("create", f"{scratch}/new-{workspace_access}"), ("write", f"{package}/f"),
                ("read", f"{workspace}/f"), ("create", f"{workspace}/new"), ("read", str(tmp_path / "etc" / "shadow")),
            ])
        finally:
            confinement.release(held)
        assert results[:3] == ["ok", "ok", "EACCES"], results
        assert results[3:5] == [workspace_access, workspace_access] and results[5] == "EACCES", results
    assert READ_WRITE & landlock.handled_access(landlock.abi_version()) == landlock.handled_access(landlock.abi_version())
