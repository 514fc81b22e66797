"""The sampler's view of a process's children: a one-thread process is read through its main thread
only, and a child forked by another thread of a multi-threaded process is still found."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

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
