"""What an agent leaves in its HOME and its private /tmp is removed whatever its shape, and the record says
so: 1,000 levels of directories, empty files past the tmpfs's inode cap (0 bytes used; the run that fills
/tmp ends ``disk_exceeded``). Real runs as an agent uid (root only)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from covenant.config import IsolationConfig, RuntimeConfig
from covenant.runtime.isolation import open_isolation
from covenant.runtime.mountns import DEFAULT_TMP_INODES, INODES_PER_MIB, MIN_TMP_INODES
from covenant.runtime.runner import Runner
from tests.conftest import agent_uid_range
from tests.runtime.conftest import make_agent, make_payload

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="agent uids and private /tmp need root")

LEAVER = """\
import json, os, sys
intent = json.loads(sys.stdin.readline())
what = intent["text"]
report = {}
if what == "deep":
    for top in (os.environ["HOME"], "/tmp"):
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        for level in range(1000):
            os.mkdir("d", dir_fd=fd)
            if level % 250 == 0:
                os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(fd)
    os.symlink("/", os.path.join(os.environ["HOME"], "root-link"))
    os.chmod(os.path.join(os.environ["HOME"], "d"), 0)
elif what == "files":
    made = 0
    try:
        while made < 150_000:
            os.close(os.open(f"/tmp/e{made}", os.O_WRONLY | os.O_CREAT, 0o600))
            made += 1
    except OSError as exc:
        report["error"] = exc.strerror
    report["made"] = made
report["home"] = os.listdir(os.environ["HOME"])
report["tmp"] = sorted(os.listdir("/tmp"))
sys.stderr.write("report " + json.dumps({"error": report.get("error"), "made": report.get("made")}) + "\\n")
print(json.dumps({"intent_id": intent["id"], "status": "ok", "text": json.dumps(report), "sources": []}))
"""


def runs(folder: Path, texts: list[str], disk_mb: int = 8):  # type: ignore[no-untyped-def]
    """Each text a run of the leaver agent as its own uid, one after the other (each its uid's last)."""
    entry = folder / "pkg" / "leaver.py"
    entry.parent.mkdir()
    entry.write_text(LEAVER)
    low, _ = agent_uid_range()
    isolation = open_isolation(IsolationConfig(uid_range=(low, low + 99)), folder / "state")

    async def main():  # type: ignore[no-untyped-def]
        async with Runner.open(RuntimeConfig(python3="/usr/bin/python3"), scratch_root=folder / "scratch",
                               isolation=isolation) as runner:
            assert runner.mount_namespaces is not None, isolation.problems
            return [await runner.run(make_agent(entry, disk_mb=disk_mb), make_payload(text)) for text in texts]

    return trio.run(main)


def stderr_report(record) -> dict:  # type: ignore[no-untyped-def]
    """The leaver's ``error`` and ``made`` from the last line of its stderr (a run whose answer is not kept)."""
    line = record.stderr_tail.splitlines()[-1]
    assert line.startswith("report "), record.stderr_tail
    return json.loads(line.removeprefix("report "))


@root_only
def test_a_1000_level_tree_in_home_and_tmp_is_removed_and_the_record_says_so(agent_reachable_dir: Path) -> None:
    before, deep, after = runs(agent_reachable_dir, ["look", "deep", "look"])
    assert deep.outcome == "ok", deep.error  # 2,000 directories and a few files: within disk_mb = 8 (2,048 entries)
    assert deep.cleanup.complete and deep.cleanup.reason is None, deep.cleanup
    report = json.loads(after.result["text"])
    assert report["home"] == []  # a fresh HOME
    assert report["tmp"] == json.loads(before.result["text"])["tmp"]  # only what is bound back from the host
    assert not list((agent_reachable_dir / "scratch").glob("dispatch-*/d"))


@root_only
def test_empty_files_past_the_inode_cap_are_refused_and_cleaned(agent_reachable_dir: Path) -> None:
    """0 bytes used, 150,000 files asked for: the tmpfs refuses past its nr_inodes, and the files are removed
    though its byte count says nothing is there."""
    disk_mb = 8
    cap = min(DEFAULT_TMP_INODES, max(MIN_TMP_INODES, disk_mb * INODES_PER_MIB))
    before, filled, after = runs(agent_reachable_dir, ["look", "files", "look"], disk_mb=disk_mb)
    assert filled.outcome == "disk_exceeded" and "filled its private /tmp" in (filled.error or ""), filled.error
    report = stderr_report(filled)
    assert report["error"] == "No space left on device" and report["made"] < cap, report
    assert filled.cleanup.complete
    assert json.loads(after.result["text"])["tmp"] == json.loads(before.result["text"])["tmp"]
