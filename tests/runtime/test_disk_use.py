"""Measuring a run's disk use: a bounded, resumable scan that hostile trees cannot mislead or stall, a
sampler tick whose disk work is capped however many files the runs hold, and a tool run held to its
workspace's growth. Real files, real directories, real processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from covenant.runtime.disk_use import (
    ENTRIES_PER_TICK,
    MIN_ENTRIES_PER_RUN,
    OPEN_LEVELS,
    DiskUse,
    PrivateUse,
    TreeScan,
)
from covenant.runtime.runner import Runner
from covenant.runtime.sampler import Sampler
from covenant.runtime.tree_removal import remove_tree
from tests.runtime.conftest import leftovers, make_agent

MIB = 1024 * 1024


def scan_whole(path: Path, budget: int = 10_000) -> TreeScan:
    scan = TreeScan(str(path))
    steps = 0
    while scan.passes == 0 and scan.problem is None:
        scan.step(budget)
        steps += 1
        assert steps < 100_000
    return scan


def test_sizes_and_entries_of_a_tree_links_never_followed_nor_counted_twice(tmp_path: Path) -> None:
    top = tmp_path / "scratch"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "one").write_bytes(b"x" * 1000)
    (top / "a" / "b" / "two").write_bytes(b"y" * 3000)
    os.link(top / "a" / "one", top / "again")  # one file, two names: its bytes once
    outside = tmp_path / "outside"
    outside.write_bytes(b"z" * MIB)
    (top / "to-outside").symlink_to(outside)
    (top / "to-root").symlink_to("/")
    (top / "a" / "b" / "two").chmod(0)  # unreadable to its owner: its size is still known
    scan = scan_whole(top)
    assert scan.problem is None
    assert scan.bytes == 4000
    assert scan.entries == 7  # a, b, one, two, again, to-outside, to-root
    scan.close()


def test_each_step_reads_at_most_its_budget_and_a_pass_resumes_where_it_stopped(tmp_path: Path) -> None:
    top = tmp_path / "many"
    for d in range(10):
        (top / f"d{d}").mkdir(parents=True)
        for f in range(100):
            (top / f"d{d}" / f"f{f}").write_bytes(b"1")
    scan = TreeScan(str(top))
    steps = 0
    while scan.passes == 0:
        assert scan.step(50) <= 50
        steps += 1
    assert steps >= 20  # 1,010 entries and 10 directories opened, 50 at a time
    assert scan.bytes == 1000 and scan.entries == 1010
    (top / "d0" / "big").write_bytes(b"2" * 5000)
    while scan.passes == 1:
        scan.step(50)
    assert scan.bytes == 6000 and scan.entries == 1011
    scan.close()


def _chain(top: Path, levels: int, file_every: int = 0) -> None:
    """``levels`` directories ``d`` one in the other under ``top``, a 10-byte file every ``file_every`` levels."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for level in range(levels):
        os.mkdir("d", dir_fd=fd)
        if file_every and level % file_every == 0:
            file = os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
            os.write(file, b"0123456789")
            os.close(file)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)


def test_any_depth_is_measured_with_a_bounded_number_of_open_directories(tmp_path: Path) -> None:
    top = tmp_path / "deep"
    top.mkdir()
    _chain(top, 1000, file_every=100)
    for branch in range(3):  # beside the chain, past the open levels too: found again on the way back up
        (top / "d" / "d" / f"side{branch}").mkdir()
        _chain(top / "d" / "d" / f"side{branch}", 40, file_every=10)
    try:
        fds_before = len(os.listdir("/proc/self/fd"))
        scan = TreeScan(str(top))
        most_fds = 0
        while scan.passes == 0:
            assert scan.step(50) <= 50
            most_fds = max(most_fds, len(os.listdir("/proc/self/fd")) - fds_before)
        assert scan.problem is None
        assert scan.entries == 1000 + 10 + 3 * (1 + 40 + 4) and scan.bytes == 10 * (10 + 3 * 4)
        assert most_fds <= 2 * (OPEN_LEVELS + 1) + 1, most_fds  # the top, its window, the listing being read
        scan.close()
        assert len(os.listdir("/proc/self/fd")) == fds_before
    finally:
        assert remove_tree(str(top)).complete  # pytest's own clean-up recurses once per level


def test_a_tree_moved_under_the_scan_is_scanned_again(tmp_path: Path) -> None:
    top = tmp_path / "moving"
    top.mkdir()
    (top / "a").mkdir()
    _chain(top / "a", OPEN_LEVELS + 5)
    scan = TreeScan(str(top))
    scan.step(OPEN_LEVELS + 4)  # deep in a/d/d/…, with a/ let go
    (top / "c").mkdir()
    os.rename(top / "a" / "d", top / "c" / "d")  # the chain's '..' is no longer the a/ it let go
    while scan.passes == 0:
        scan.step(1000)
    assert scan.problem is None and scan.passes == 1
    assert scan.entries == 2 + OPEN_LEVELS + 5  # a/, c/ and the chain, counted once
    scan.close()


CLOSED_SCAN = """\
import json, os, sys
from covenant.runtime.disk_use import DiskUse
top = sys.argv[1]
os.makedirs(os.path.join(top, "open", "shut"))
with open(os.path.join(top, "open", "shut", "inside"), "wb") as f:
    f.write(b"x" * 100)
os.chmod(os.path.join(top, "open", "shut"), 0)
disk = DiskUse(100, 25_600, top)
disk.finish()
print(json.dumps({"problem": disk.scratch.problem, "over": disk.over(at_end=True), "bytes": disk.scratch.bytes}))
disk.close()
os.chmod(os.path.join(top, "open", "shut"), 0o700)
"""


def test_a_directory_it_may_not_list_ends_the_run_and_root_lists_it(tmp_path: Path) -> None:
    """Who may not list a directory the agent closed (a same-uid daemon: the agent is its uid, not root) does
    not guess what it holds; root lists it and measures it."""
    base = Path(tempfile.mkdtemp(prefix="closed-"))
    try:
        base.chmod(0o777)
        as_nobody = {"user": 65534, "group": 65534} if os.geteuid() == 0 else {}
        ran = subprocess.run([sys.executable, "-c", CLOSED_SCAN, str(base / "unprivileged")], check=False, capture_output=True,
                             text=True, timeout=60, env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                             **as_nobody)  # type: ignore[call-overload]
        assert ran.returncode == 0, ran.stderr
        found = json.loads(ran.stdout)
        assert found["problem"] is not None and "open/shut: cannot list it (Permission denied)" in found["problem"]
        assert "cannot measure the run's disk use" in found["over"], found
        if os.geteuid() == 0:
            (base / "root").mkdir()
            ran = subprocess.run([sys.executable, "-c", CLOSED_SCAN, str(base / "root")], capture_output=True,
                                 text=True, timeout=60, check=True)
            assert json.loads(ran.stdout) == {"problem": None, "over": None, "bytes": 100}
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_a_missing_scratch_dir_is_empty_and_measure_ends(tmp_path: Path) -> None:
    scan = TreeScan(str(tmp_path / "gone"))
    scan.measure()
    assert scan.bytes == 0 and scan.entries == 0 and scan.problem is None
    scan.close()


def test_whole_use_over_disk_mb_files_over_the_entry_cap_and_a_full_private_tmp(tmp_path: Path) -> None:
    top = tmp_path / "scratch"
    top.mkdir()
    for i in range(6):
        (top / f"f{i}").write_bytes(b"\0" * MIB)
    disk = DiskUse(5, 1024, str(top))
    disk.finish()
    assert disk.over() is not None and "over disk_mb = 5" in disk.over()  # type: ignore[operator]
    assert disk.peak_bytes == 6 * MIB
    disk.close()

    small = tmp_path / "small"
    small.mkdir()
    (small / "f").write_bytes(b"\0" * MIB)
    private = PrivateUse(bytes=3 * MIB, inodes=3)
    disk = DiskUse(5, 1024, str(small), private=lambda: private)
    disk.finish()
    assert disk.over() is None and disk.total_bytes == 4 * MIB
    private = PrivateUse(bytes=4 * MIB + 1, inodes=3)
    disk.finish()
    assert "private /tmp and /dev/shm" in (disk.over() or "")
    private = PrivateUse(bytes=MIB, inodes=1000, full=True)
    disk.step(ENTRIES_PER_TICK)
    assert disk.over() is None  # the kernel holds it to its cap while the run goes on
    disk.finish()
    assert "filled its private /tmp" in (disk.over(at_end=True) or "")
    disk.close()

    crowd = tmp_path / "crowd"
    crowd.mkdir()
    for i in range(1100):
        (crowd / f"e{i}").touch()  # no block at all: the entry cap still holds
    disk = DiskUse(4, 1024, str(crowd))
    disk.finish()
    assert "1100 files" in (disk.over() or "")
    disk.close()


def test_the_last_measurement_goes_on_where_its_share_on_the_loop_stopped(tmp_path: Path) -> None:
    top = tmp_path / "scratch"
    top.mkdir()
    for i in range(1200):
        (top / f"f{i}").write_bytes(b"ab")
    disk = DiskUse(100, 25_600, str(top))
    assert disk.finish(ENTRIES_PER_TICK) is False  # more than a tick's share: the rest is for a thread
    assert disk.finish() is True
    assert disk.scratch.passes == 1 and disk.scratch.entries == 1200 and disk.peak_bytes == 2400
    assert disk.over(at_end=True) is None
    (top / "f0").write_bytes(b"\0" * 101 * MIB)
    assert disk.finish() is True and "over disk_mb = 100" in (disk.over(at_end=True) or "")
    disk.close()


def test_a_workspace_counts_by_its_growth_only(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "kept").write_bytes(b"\0" * 8 * MIB)  # from earlier runs: more than disk_mb already
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    before = TreeScan(str(workspace))
    before.measure()
    disk = DiskUse(5, 1024, str(scratch), workspace=before)
    disk.finish()
    assert disk.over() is None
    (workspace / "new").write_bytes(b"\0" * 6 * MIB)
    disk.finish()
    assert "workspace growth 6291456 bytes" in (disk.over() or "")
    disk.close()


def test_a_tick_reads_a_bounded_number_of_entries_however_many_files_runs_hold(tmp_path: Path) -> None:
    disks = []
    for run in range(4):
        top = tmp_path / f"run{run}"
        top.mkdir()
        for i in range(600):
            (top / f"f{i}").write_bytes(b"x")
        disks.append(DiskUse(100, 25_600, str(top)))
    sampler = Sampler(50)
    for disk in disks:
        sampler.watch_disk(disk)
    ticks = 0
    while not all(disk.scratch.passes for disk in disks):
        sampler.tick()
        ticks += 1
        assert 0 < sampler.disk_entries <= ENTRIES_PER_TICK
    assert ticks >= 4 * 600 // ENTRIES_PER_TICK
    assert all(disk.scratch.bytes == 600 for disk in disks)
    many = [DiskUse(100, 25_600, str(tmp_path / "run0")) for _ in range(40)]
    for disk in many:
        sampler.watch_disk(disk)
    sampler.tick()
    assert sampler.disk_entries <= max(ENTRIES_PER_TICK, MIN_ENTRIES_PER_RUN * 44)
    for disk in disks + many:
        sampler.unwatch_disk(disk)
        disk.close()


WRITER = """\
import json, os, sys
json.load(sys.stdin)
for i in range(int(sys.argv[1])):
    with open(f"grown-{sys.argv[1]}-{i}", "wb") as f:
        f.write(b"\\1" * 1024 * 1024)
print(json.dumps({"wrote": int(sys.argv[1])}))
"""


async def test_a_tool_run_is_held_to_its_workspaces_growth_not_to_what_it_held_before(
    runner: Runner, tmp_path: Path
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "earlier").write_bytes(b"\0" * 8 * MIB)  # more than disk_mb, from earlier runs
    agent = make_agent(sys.executable, disk_mb=5)
    argv = [sys.executable, "-c", WRITER]

    async def tool(megabytes: int):  # type: ignore[no-untyped-def]
        return await runner.run_tool(agent, [*argv, str(megabytes)], b"{}\n", run_id=f"tool-{megabytes}",
                                     wall_ms=30_000, network="off", cwd=str(workspace), priority="normal")

    small = await tool(2)
    assert small.outcome == "ok" and small.result == {"wrote": 2}, small.error
    big = await tool(7)  # grows it by 7 MiB: over disk_mb whatever a tick saw
    assert big.outcome == "disk_exceeded" and "workspace growth" in (big.error or ""), big.error
    assert big.result is None and leftovers("tool-7") == []
