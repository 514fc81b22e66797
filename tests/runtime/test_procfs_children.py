"""The sampler's view of a process's children: a one-thread process is read through its main thread
only, and a child forked by another thread of a multi-threaded process is still found; the files a
tree keeps open between samples are closed when their process exits and when the tree is closed; a tree's
own memory (what memory_mb limits) is what its processes hold, not the files they map."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from covenant.runtime import _procfs
from covenant.runtime.sampler import ProcessTree

_ONE_THREAD = "import subprocess, sys, time; subprocess.Popen(['sleep', '60']); print('ready', flush=True); time.sleep(60)"
_FORK_FROM_A_THREAD = textwrap.dedent("""\
    import subprocess, threading, time
    def spawn():
        subprocess.Popen(["sleep", "60"])
        print("ready", flush=True)
        time.sleep(60)  # the thread lives on: its child stays listed under it
    threading.Thread(target=spawn, daemon=True).start()
    time.sleep(60)
    """)


def _started(code: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def _tree_pids(process: subprocess.Popen[str]) -> set[int]:
    tree = ProcessTree(process.pid, "test")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        tree.refresh()
        if len(tree.members) == 2:
            break
        time.sleep(0.02)
    tree.close()
    return set(tree.members)


def test_a_one_thread_process_and_a_child_forked_by_another_thread_are_both_found() -> None:
    for code in (_ONE_THREAD, _FORK_FROM_A_THREAD):
        process = _started(code)
        try:
            stat = _procfs.read_stat(process.pid)
            assert stat is not None
            members = _tree_pids(process)
            assert process.pid in members and len(members) == 2, (code, members, stat.num_threads)
            (child,) = members - {process.pid}
            assert _procfs.read_stat(child).ppid == process.pid  # type: ignore[union-attr]
            if code is _ONE_THREAD:
                assert stat.num_threads == 1 and _procfs.children(process.pid, 1) == [child]
            else:
                assert stat.num_threads > 1
                assert _procfs.children(process.pid, 1) == []  # not on the main thread's list...
                assert _procfs.children(process.pid, stat.num_threads) == [child]  # ...but found
        finally:
            for pid in _tree_pids(process) - {process.pid}:
                subprocess.run(["kill", "-9", str(pid)], check=False)
            process.kill()
            process.wait()


def test_a_tree_holds_its_members_files_open_only_while_they_live_and_until_closed() -> None:
    held_before = _procfs.OpenProcess.held
    leaving, staying = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    trees = [ProcessTree(leaving.pid, "test"), ProcessTree(staying.pid, "test")]
    try:
        for tree in trees:
            tree.refresh()
        assert _procfs.OpenProcess.held == held_before + 4  # stat and children of both roots
        leaving.kill()
        leaving.wait()  # reaped: its pid is free for reuse
        trees[0].refresh()
        assert trees[0].members == {} and _procfs.OpenProcess.held == held_before + 2
        trees[1].close()
        assert _procfs.OpenProcess.held == held_before
        trees[1].refresh()  # a closed tree still samples, by path, holding nothing open
        assert set(trees[1].members) == {staying.pid} and _procfs.OpenProcess.held == held_before
    finally:
        for tree in trees:
            tree.close()
        for process in (leaving, staying):
            process.kill()
            process.wait()
    assert _procfs.OpenProcess.held == held_before


def test_an_open_process_reads_nothing_once_it_has_exited() -> None:
    process = subprocess.Popen(["sleep", "60"])
    proc = _procfs.OpenProcess.open(process.pid)
    assert proc is not None
    try:
        stat = proc.stat()
        assert stat is not None and stat.pid == process.pid and stat.state in "SR"
        process.kill()
        process.wait()  # reaped: the pid is free for reuse, the open file still names the old process
        assert proc.stat() is None and proc.children(1) == []
    finally:
        proc.close()


_HOLD = """
import mmap, os, sys
size = 64 << 20
with open(sys.argv[1], 'rb') as f:  # 64 MiB of a file's pages: the page cache, which others mapping it share
    mapped = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
    touched = sum(mapped[i] for i in range(0, size, 4096))
memfd = os.memfd_create('held')  # 32 MiB of shared memory and 16 MiB of its own: both held by this process
os.ftruncate(memfd, 32 << 20)
shared = mmap.mmap(memfd, 32 << 20)
shared.write(b'x' * (32 << 20))
own = bytearray(b'y' * (16 << 20))
print('holding', flush=True)
sys.stdin.readline()
"""


def test_a_trees_own_memory_is_what_its_processes_hold_not_the_files_they_map(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(os.urandom(64 << 20))
    process = subprocess.Popen([sys.executable, "-c", _HOLD, str(big)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdin is not None and process.stdout is not None
    tree = ProcessTree(process.pid, "test")
    try:
        assert process.stdout.readline().strip() == "holding"
        tree.refresh()
        tree.refresh()
        own_mib = tree.own_resident_kib() // 1024
        assert 48 <= own_mib < 48 + 40, own_mib  # the memfd and the bytearray, and the interpreter's own heap
        assert tree.rss_kib // 1024 >= own_mib + 60, (tree.rss_kib, own_mib)  # the mapped file: resident, not its own
    finally:
        tree.close()
        process.kill()
        process.wait()


def test_a_lone_root_sampled_cheaply_still_gains_the_child_it_forks_later() -> None:
    code = ("import subprocess, sys, time\nprint('ready', flush=True)\nsys.stdin.readline()\n"
            "subprocess.Popen(['sleep', '60'])\nprint('forked', flush=True)\ntime.sleep(60)\n")
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    tree = ProcessTree(process.pid, "test")
    try:
        assert process.stdout.readline().strip() == "ready"
        tree.refresh()
        tree.refresh()  # the root alone: the cheap path
        assert set(tree.members) == {process.pid} and tree.rss_kib > 0
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "forked"
        tree.refresh()
        assert len(tree.members) == 2 and tree.has_descendants()
    finally:
        for pid in set(tree.members) - {process.pid}:
            subprocess.run(["kill", "-9", str(pid)], check=False)
        tree.close()
        process.kill()
        process.wait()
