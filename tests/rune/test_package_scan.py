"""What the daemon's scan makes of a package's and its skills' files: deep trees, skill edits."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.daemon.conftest import DaemonProcess
from tests.daemon.test_daemon_e2e import wait_for
from tests.fakes import FakeModelServer, Reply
from tests.rune.conftest import add_rune_agent, configure, outcome_of


def test_a_deep_package_tree_loads_and_a_skill_edit_in_either_layout_is_a_change(
    daemon: DaemonProcess, fake_model: FakeModelServer
) -> None:
    configure(daemon, ("fake", fake_model))
    package = add_rune_agent(daemon, toolset=())
    runefile = package / "Runefile"
    runefile.write_text(runefile.read_text().replace("toolset: []", "toolset: []\nskills: [acme/kit/notes, acme/kit/flat]"))
    nested = daemon.home / "skills" / "acme" / "kit" / "skills" / "notes"
    flat = daemon.home / "skills" / "acme" / "kit" / "flat"
    for folder, body in ((nested, "Say NOTES-ONE."), (flat, "Say FLAT-ONE.")):
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text(f"---\nname: {folder.name}\ndescription: a test skill\n---\n{body}\n")
    deep = add_rune_agent(daemon, "deep", toolset=())
    # 1,200 folders, one in the other, in a package and in a skill: os.walk and rglob raise RecursionError there.
    trees = (deep / "data", nested / "refs")
    for base in trees:
        inner = base
        for _ in range(12):
            inner = inner.joinpath(*["d"] * 100)
            os.makedirs(inner)
    try:
        _scan_and_reload(daemon, fake_model, nested, flat)
    finally:
        daemon.stop()
        subprocess.run(["rm", "-rf", *map(str, trees)], check=True)  # shutil.rmtree recurses as deep as the tree


def _scan_and_reload(daemon: DaemonProcess, fake_model: FakeModelServer, nested: Path, flat: Path) -> None:
    daemon.start()

    fake_model.script(Reply(text="one"))
    assert outcome_of(daemon.cli("dispatch", "a", "--agent", "chat@local", "--json"))["outcome"] == "ok"
    instructions = fake_model.requests[-1].messages[0]["content"]
    assert "NOTES-ONE" in instructions and "FLAT-ONE" in instructions
    fake_model.script(Reply(text="deep"))
    assert outcome_of(daemon.cli("dispatch", "a", "--agent", "deep@local", "--json"))["text"] == "deep"
    logs = daemon.cli("logs").stdout
    assert "not snapshotted" in logs and "deeper than 64 levels" in logs  # the deep package: no snapshot, and why

    for folder, old, new in ((nested, "NOTES-ONE", "NOTES-TWO"), (flat, "FLAT-ONE", "FLAT-TWO")):
        replaced = _replica_pid(daemon)
        (folder / "SKILL.md").write_text((folder / "SKILL.md").read_text().replace(old, new))
        doc = json.loads(daemon.cli("reload", "--json").stdout)
        assert doc["changed"] == ["chat@local"] and doc["rejected"] == [], (folder, doc)
        wait_for(lambda: _replica_pid(daemon) not in (replaced, None), what="the replica with the edited skill")
    fake_model.script(Reply(text="two"))
    assert outcome_of(daemon.cli("dispatch", "b", "--agent", "chat@local", "--json"))["outcome"] == "ok"
    instructions = fake_model.requests[-1].messages[0]["content"]
    assert "NOTES-TWO" in instructions and "FLAT-TWO" in instructions


def _replica_pid(daemon: DaemonProcess) -> int | None:
    status = daemon.api("GET", "/v1/status")
    ready = [r["pid"] for r in status["replicas"] if r["agent"] == "chat@local" and r["state"] == "ready"]  # type: ignore[index]
    return ready[0] if ready else None
