"""A network namespace of the test's own behind a veth pair: "the internet" agents reach, off the host.

Used by tests/security/test_agent_network.py (listeners on 443 and 8080) and tests/tools/test_browser.py
(a web server). Needs root, ``ip``, ``slirp4netns`` and ``nft`` (agents reach it through their own
namespaces); skips otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from tests.conftest import process_slot, require_tool


@dataclass
class Internet:
    """A network namespace behind a veth pair: ``far`` is its address; ``near`` is the host's end."""

    far: str
    near: str


@contextmanager
def far_namespace(prefix: str, subnet: int, program: str, *args: str) -> Iterator[Internet]:
    """The namespace, with ``python -c program FAR *args`` running inside until the end (it prints one line
    when it is ready). ``prefix`` (2 letters) and ``subnet`` (10.<subnet>.<slot>.0/30) keep each user's
    interface names and addresses apart from the others' and from other test processes'."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces and veth pairs need root")
    ip = require_tool("ip")
    require_tool("slirp4netns")
    require_tool("nft")
    slot = process_slot()  # unique among the test processes running now: names and addresses are host-wide
    host_end, far_end = f"c{prefix}h{slot}", f"c{prefix}f{slot}"
    near, far = f"10.{subnet}.{slot}.1", f"10.{subnet}.{slot}.2"
    subprocess.run([ip, "link", "del", host_end], capture_output=True, check=False)  # left by a test process that was killed
    # The namespace is held by a process of its own, not mounted under /run/netns: a named namespace's
    # mount was seen to vanish there mid-set-up while other tests ran (`ip -n NAME` then failed with
    # "setting the network namespace failed: Invalid argument"), and nothing here needs a name.
    holder = subprocess.Popen(["unshare", "--net", "sh", "-c", "ip link set lo up && echo up && exec cat"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    inside = ["nsenter", f"--net=/proc/{holder.pid}/ns/net"]
    server = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        commands = [
            [ip, "link", "add", host_end, "type", "veth", "peer", "name", far_end],
            [ip, "link", "set", far_end, "netns", str(holder.pid)],
            [ip, "addr", "add", f"{near}/30", "dev", host_end],
            [ip, "link", "set", host_end, "up"],
            [*inside, ip, "addr", "add", f"{far}/30", "dev", far_end],
            [*inside, ip, "link", "set", far_end, "up"],
        ]
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            assert done.returncode == 0, f"{command}: exit {done.returncode}: {done.stderr.strip()}"
        server = subprocess.Popen([*inside, sys.executable, "-c", program, far, *args],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip(), "the namespace's program did not start"
        yield Internet(far=far, near=near)
    finally:
        for process in (server, holder):
            if process is not None:
                process.kill()
                process.wait()
        subprocess.run([ip, "link", "del", host_end], capture_output=True, check=False)
