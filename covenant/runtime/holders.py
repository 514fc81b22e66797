"""Namespace holders: small root processes that make namespaces for agent uids and keep them open.

A holder runs a short Python setup (``python -I -S -c SCRIPT SPEC``: no site, no environment), says
``ready`` on its stdout, then execs ``sleep infinity`` so that its namespaces live as long as it
does. It is started behind covenant's PDEATHSIG helper, so it dies with the thread that started it
(:mod:`covenant.runtime.workers`): the private /tmp (:mod:`covenant.runtime.mountns`) and the network
namespaces (:mod:`covenant.runtime.netns`) of agent uids are both held this way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from covenant.runtime import host, teardown
from covenant.runtime.workers import on_a_lasting_thread

__all__ = ["start_holder", "holder_alive"]


def start_holder(setup: str, spec: dict[str, Any], what: str) -> subprocess.Popen[bytes]:
    """Run ``setup`` with ``spec`` (JSON) as a holder; return it once it said ``ready``.

    ``what`` names the namespace in the OSError raised when the setup fails (with the setup's own line).
    Call on the loop's thread or a launch thread only.
    """
    if not on_a_lasting_thread():
        raise RuntimeError(
            f"{what}'s holder dies with the thread that starts it (PDEATHSIG): start it on the loop's thread "
            "or a launch thread"
        )
    wrapper = host.pdeathsig_wrapper()
    prefix = list(wrapper.argv) if wrapper is not None else []
    process = subprocess.Popen(
        [*prefix, sys.executable, "-I", "-S", "-c", setup, json.dumps(spec)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={}, close_fds=True, start_new_session=True,
    )
    assert process.stdin is not None and process.stdout is not None
    if wrapper is not None and wrapper.gated:
        from covenant.runtime.pdeathsig import GATE_BYTE

        process.stdin.write(GATE_BYTE)
    process.stdin.close()
    line = process.stdout.readline().decode(errors="replace").strip()
    process.stdout.close()
    if line != "ready":
        process.kill()
        process.wait()
        raise OSError(f"cannot make {what}: {line or 'the setup process died'}")
    return process


def holder_alive(process: subprocess.Popen[bytes]) -> bool:
    """Has ``process`` not exited? Never reaps it: an unreaped holder's pid cannot be reused while covenant
    still lists it among its helpers."""
    return process.returncode is None and not teardown.child_exited(process.pid)
