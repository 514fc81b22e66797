"""Hostile: a process tool goes after files it was not given (issue 35, "Tool capabilities are enforced").

Under a root daemon a tool runs as its agent's uid, so the file modes already keep it from the daemon's
key and other uids' files; what the modes allow — its own agent's workspace, another agent's folder
an operator opened to everyone, world-writable /var/tmp, its private /tmp and /dev/shm, /home, /srv —
only its Landlock ruleset refuses. Without the ``filesystem`` capability it reaches the system's files,
its package and its scratch dir; with it, its agent's workspace too, and nothing more.

``shell-exec`` (and ``process-start``) declare nothing but work in the workspace: their commands get it,
and nothing else a tool would not get (not even the uid's private /tmp: what is bound back into it, a
home under /tmp as here, would come with it).

A daemon that cannot confine a tool's files (here: one run as ``nobody``, which cannot give agents uids
of their own) offers no process tool at all, and says why.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from covenant.client import DaemonClient
from covenant.runtime import landlock
from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture, re-exported
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_process_tool, add_rune_agent, configure, outcome_of
from tests.rune.test_file_tools import tool_results
from tests.security.test_same_uid import (  # noqa: F401 - nobody_home is the fixture, re-exported
    NOBODY, _nobodys_package, as_nobody, daemon_as_nobody, env_for, nobody_home,
)

PROBER = (Path(__file__).parent / "agents" / "file_prober.py").read_text()
REFUSED = {"EACCES", "EPERM"}


def _probe_package(package: Path) -> None:
    """Two tools of one script: ``probe`` declares no capability, ``probe_fs`` declares ``filesystem``."""
    add_process_tool(package, "probe", PROBER)
    for name, capabilities in (("probe", "[]"), ("probe_fs", "[filesystem]")):
        descriptor = package / "tools" / f"{name}.yaml"
        descriptor.write_text(f"name: {name}\nruntime: process\nmodule: tools/probe.py\ncapabilities: {capabilities}\n")
        descriptor.chmod(0o644)


@pytest.mark.skipif(os.geteuid() != 0, reason="tools run as their agent's uid, confined, only under a root daemon")
def test_a_tool_reaches_the_system_its_package_and_scratch_dir_and_its_workspace_only_with_filesystem(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    reason = landlock.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    configure(daemon, ("fake", fake_model))
    package = add_rune_agent(daemon, toolset=("probe_fs", "probe", "rune@shell-exec"))
    _probe_package(package)
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.probe", "tool.probe_fs", "tool.shell_exec", check=True)
    home = daemon.home
    workspaces = home / "state" / "workspaces"
    workspaces.mkdir(mode=0o711, exist_ok=True)
    other = workspaces / "other@local"  # another agent's folder an operator opened to everyone: only Landlock refuses
    other.mkdir(mode=0o755)
    (other / "notes.txt").write_text("another agent's notes")
    (other / "notes.txt").chmod(0o644)
    own = workspaces / "chat@local"
    token = secrets.token_hex(6)
    elsewhere = [f"/var/tmp/covenant-probe-{token}", f"/tmp/covenant-probe-{token}", f"/dev/shm/covenant-probe-{token}",
                 str(package / "planted.txt"), str(home / "planted.txt")]
    forbidden = [str(home / "identity" / "daemon.key"), str(home / "grants.toml"), str(other / "notes.txt"),
                 "/etc/shadow", "/etc/gshadow"]
    folders = [str(other), str(home / "state"), *(d for d in ("/root", "/home", "/srv") if os.path.isdir(d))]
    shell_writes = ["shell.txt", f"/tmp/shell-{token}", f"/dev/shm/shell-{token}", *elsewhere[:1], *elsewhere[3:]]
    command = (f"for p in {' '.join(shell_writes)}; do (echo x > $p) 2>/dev/null && echo \"ok $p\" || echo \"no $p\"; done; "
               f"for p in {' '.join(forbidden)}; do (head -c1 $p > /dev/null) 2>/dev/null && echo \"ok $p\" || echo \"no $p\"; done")
    fake_model.script(
        Reply.tools(ToolCall("probe_fs", {"write": ["mine.txt", *elsewhere], "read": ["mine.txt", *forbidden],
                                          "list": [".", *folders]})),
        Reply.tools(ToolCall("probe", {"write": [str(own / "again.txt"), *elsewhere],
                                       "read": [str(own / "mine.txt"), *forbidden], "list": [str(own), *folders]})),
        Reply.tools(ToolCall("shell-exec", {"command": command})),
        Reply(text="done"),
    )
    try:
        outcome = outcome_of(daemon.cli("dispatch", "probe", "--agent", "chat@local", "--json"))
        assert outcome["outcome"] == "ok", outcome
    finally:
        Path(elsewhere[0]).unlink(missing_ok=True)
    wide = tool_results(fake_model, 1)[-1]
    bare = tool_results(fake_model, 2)[-1]

    # With filesystem: its workspace (its working directory), read and written.
    assert wide["cwd"] == str(own)
    assert wide["write"].pop("mine.txt") == wide["read"].pop("mine.txt") == wide["list"].pop(".") == "ok", wide
    assert (own / "mine.txt").read_text() == "written by a confined tool\n"
    # Without: not even that. Either way its interpreter ran, its own package and its scratch dir are its.
    assert bare["cwd"] == str(package)
    for answer in (wide, bare):
        assert answer["own_package"] == answer["home"] == "ok", answer
        tried = {**answer["write"], **answer["read"], **answer["list"]}
        assert tried and set(tried.values()) <= REFUSED, tried
    assert not (own / "again.txt").exists() and not Path(elsewhere[0]).exists() and not (package / "planted.txt").exists()

    # shell-exec: its workspace (its working directory); nothing else.
    shell = tool_results(fake_model, 3)[-1]
    said = dict(reversed(line.split(" ", 1)) for line in shell["stdout"].splitlines())
    assert said == {"shell.txt": "ok", **{p: "no" for p in shell_writes[1:] + forbidden}}, shell
    assert (own / "shell.txt").read_text() == "x\n" and not Path(elsewhere[0]).exists()

    status = json.loads(daemon.cli("status", "--json", check=True).stdout)
    assert status["tool_files"] == {"confined_by": "landlock", "landlock_abi": landlock.abi_version(), "problem": None}
    text = daemon.cli("status", check=True).stdout
    assert f"tools      files confined by Landlock ABI {landlock.abi_version()}" in text


PROBE_RUNEFILE = """\
name: clock
version: 0.1.0
instructions: You run a probe.
default_model: default
toolset: ["probe", "rune@system-time"]
max_steps: 4
timeout_ms: 60000
runtime:
  startup_timeout_ms: 30000
models:
  providers: ["fake"]
  model_mapping:
    default: fake-model
"""


@pytest.mark.xdist_group("nobody")
def test_a_daemon_that_cannot_confine_tool_files_offers_no_process_tool_and_says_why(
    nobody_home: Path, fake_model: FakeModelServer
) -> None:
    """Run as ``nobody`` the daemon gives agents no uid of their own (isolation: same-uid), so Landlock has no
    switch to ride on: the tool is unavailable, in ``tools list`` and ``status``, and a call of it never runs."""
    env = env_for(nobody_home)
    subprocess.run(as_nobody(nobody_home, "init", "--display", "nobody@test"), env=env, check=True, capture_output=True)
    package = _nobodys_package(nobody_home / "agents" / "clock", PROBE_RUNEFILE)
    _probe_package(package)
    for path in [package, *package.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    (nobody_home / "covenant.toml").write_text('[runtime]\npython3 = "/usr/bin/python3"\n\n'
                                               + fake_model.provider_toml("fake", timeout_s=30))
    os.chown(nobody_home / "covenant.toml", NOBODY, NOBODY)
    marker = nobody_home.parent / "probe-ran"
    with daemon_as_nobody(nobody_home, env) as (_daemon, log_path):
        with DaemonClient(nobody_home / "run" / "covenant.sock", timeout=5) as client:
            files = client.request("GET", "/v1/status")["tool_files"]
        assert files["confined_by"] is None and "isolation: same-uid" in files["problem"], files
        listed = subprocess.run(as_nobody(nobody_home, "tools", "list", "--json"), env=env, capture_output=True,
                                text=True, check=True)
        rows = {row["entry"]: row for row in json.loads(listed.stdout)["tools"]}
        assert rows["rune@system-time"]["available"], rows
        assert not rows["probe"]["available"]
        assert "cannot be confined on this host" in rows["probe"]["reason"], rows["probe"]
        assert "isolation: same-uid" in rows["probe"]["reason"], rows["probe"]
        status = subprocess.run(as_nobody(nobody_home, "status"), env=env, capture_output=True, text=True, check=True)
        assert "tools      files NOT confined (agents run as the daemon's own uid" in status.stdout, status.stdout
        subprocess.run(as_nobody(nobody_home, "grant", "nobody@test", "tool.probe", "tool.system_time"), env=env, check=True,
                       capture_output=True)
        fake_model.script(Reply.tools(ToolCall("probe", {"write": [str(marker)]})), Reply(text="it did not run"))
        done = subprocess.run(as_nobody(nobody_home, "dispatch", "probe", "--agent", "clock@local", "--json"),
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr + log_path.read_text()
    first, second = fake_model.requests
    assert first.tool_names == ["system-time"]  # never offered
    [refused] = tool_results(fake_model, 1)
    assert refused["error"]["code"] == "unknown_tool", refused
    assert not marker.exists()
