"""Runs one container for an agent through rootful ``podman run`` (``runtime: container`` tools, ``rune@docker-exec``).

Podman runs as covenant's own uid (root: rootless podman cannot give a container another host uid), never
inside the daemon process; the container's process runs as the agent's uid and gid, with no
capabilities, ``no-new-privileges``, a read-only root, a size-capped ``/tmp`` tmpfs, the agent's memory
limit (no swap beyond it) and a pids limit; its network is ``none`` (its own loopback) or the agent's
network namespace for the mode it may use, never the host's. Images are never pulled (``--pull
never``): only what the operator built or loaded and listed runs.

The OCI runtime is ``runc`` with explicit ``nofile``/``nproc`` ulimits: podman's default ``crun`` fails
on hosts whose cgroup layout it cannot set up, and without the ulimits runc tries to raise rlimits a
container in such a host may not.

Every container is named and labelled; a run that times out, overflows its output cap or is cancelled is
removed with ``podman rm -f`` (shielded), and the podman client is killed after it, so nothing outlives
the call. Each also carries its home's label (:data:`HOME_LABEL`): a daemon killed mid-call cannot remove
its containers, so the next start of a daemon on that home does (:func:`sweep_containers`), and no other's.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field

import trio

from covenant.manifest.model import AgentSpec
from covenant.runtime import _elf
from covenant.runtime.launch_plans import LaunchPlans
from covenant.runtime.launcher import AgentCredentials, LaunchError
from covenant.runtime.netns import NetworkMode

__all__ = ["HOME_LABEL", "RUN_LABEL", "ContainerRun", "ContainerSpec", "Podman", "container_network", "find_podman",
           "home_label", "podman_argv", "run_container", "sweep_containers"]

RUN_LABEL = "covenant.run"
"""The label each container carries: the tool run's marker (``<intent>:tool:<n>``)."""

HOME_LABEL = "covenant.home"
"""The label each container carries: its daemon's home (:func:`home_label`)."""

PODMAN_ERROR = 125
"""``podman run``'s own failure (no such image, a bad option), as opposed to the container's exit code."""

_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_REMOVE_TIMEOUT_S = 30.0
_STDERR_TAIL = 8192


@dataclass(frozen=True)
class Podman:
    """The programs a container run uses (absolute paths)."""

    podman: str
    runc: str


def _locate(program: str) -> str | None:
    if os.path.isabs(program):
        return program if os.access(program, os.X_OK) else None
    return shutil.which(program, path=_SEARCH_PATH)


@functools.lru_cache(maxsize=8)
def _judge(podman: str, runc: str, euid: int) -> Podman | str:
    if euid != 0:
        return ("containers run through rootful podman, and this daemon is not root (rootless podman cannot run a "
                "container as an agent's uid)")
    found_podman = _locate(podman)
    if found_podman is None:
        return f"podman ({podman!r}, [tools.container] podman) is not installed (Debian package podman)"
    found_runc = _locate(runc)
    if found_runc is None:
        return f"runc ({runc!r}, [tools.container] runc) is not installed (Debian package runc)"
    return Podman(found_podman, found_runc)


def find_podman(podman: str, runc: str) -> Podman | str:
    """The container programs, or why containers cannot run here (judged once per process and setting)."""
    return _judge(podman, runc, os.geteuid())


def home_label(home_key: str) -> str:
    """The :data:`HOME_LABEL` value of a home: 16 hex of the sha256 of its state dir (resolved)."""
    return hashlib.sha256(home_key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ContainerSpec:
    """One container to run: what, as whom, with what limits and network."""

    image: str
    uid: int
    gid: int
    network: str
    """``none``, or ``ns:/proc/<pid>/ns/net``: the agent's namespace for its network mode."""
    memory_mb: int
    pids_max: int
    tmp_mb: int
    """The size of its ``/tmp`` tmpfs (the agent's disk_mb)."""
    marker: str
    """The run's marker, its :data:`RUN_LABEL`."""
    home: str
    """Its daemon's home, its :data:`HOME_LABEL` (:func:`home_label`)."""
    cpus: float | None = None
    """Its CPU quota in cores (``--cpus``: the agent's ``resource_profile`` share), or None: no quota."""
    command: tuple[str, ...] = ()
    """``/bin/sh -c COMMAND`` style argv replacing the image's entrypoint; empty: the image's own."""
    workspace: str | None = None
    """Mounted read-write at ``/workspace``, the working directory (a tool declaring ``filesystem``)."""
    name: str = field(default_factory=lambda: "covenant-" + secrets.token_hex(8))


def podman_argv(podman: Podman, spec: ContainerSpec) -> list[str]:
    """The ``podman run`` command line of ``spec`` (pure)."""
    argv = [
        podman.podman, "run", "--rm", "--interactive", "--pull", "never", "--runtime", podman.runc,
        "--name", spec.name, "--label", f"{RUN_LABEL}={spec.marker}", "--label", f"{HOME_LABEL}={spec.home}",
        "--log-driver", "none",
        "--user", f"{spec.uid}:{spec.gid}", "--network", spec.network,
        "--read-only", "--read-only-tmpfs=false",
        "--tmpfs", f"/tmp:rw,size={spec.tmp_mb}m,mode=1777,nosuid,nodev",
        "--cap-drop", "all", "--security-opt", "no-new-privileges",
        "--memory", f"{spec.memory_mb}m", "--memory-swap", f"{spec.memory_mb}m",
        "--pids-limit", str(spec.pids_max),
        "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
    ]
    if spec.cpus is not None:
        argv += ["--cpus", f"{spec.cpus:g}"]
    if spec.workspace is not None:
        argv += ["--volume", f"{spec.workspace}:/workspace:rw", "--workdir", "/workspace"]
    if spec.command:
        argv += ["--entrypoint", spec.command[0], spec.image, *spec.command[1:]]
    else:
        argv.append(spec.image)
    return argv


@dataclass(frozen=True)
class ContainerRun:
    """How one container run ended."""

    outcome: str
    """``exited`` (see exit_code), ``timeout``, ``output_too_large``, ``podman_error`` (exit 125: no such
    image, a refused option) or ``spawn_failed``."""
    exit_code: int | None
    stdout: bytes
    stderr_tail: str
    duration_ms: int
    name: str
    left_behind: bool = False
    """The container could not be removed (``podman rm -f`` failed): named in the log."""

    @property
    def last_stderr_line(self) -> str:
        lines = [line for line in self.stderr_tail.splitlines() if line.strip()]
        return lines[-1][-300:] if lines else ""


def _environment() -> dict[str, str]:
    """What podman itself gets: nothing of the daemon's environment but where it finds its own files."""
    return {"PATH": _SEARCH_PATH, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}


async def _remove(podman: Podman, name: str) -> bool:
    """``podman rm -f`` the container (gone already counts as removed); False when it may still exist."""
    with trio.move_on_after(_REMOVE_TIMEOUT_S):
        done = await trio.run_process(
            [podman.podman, "rm", "--force", "--ignore", "--time", "0", name],
            capture_stdout=True, capture_stderr=True, check=False, env=_environment(),
        )
        return done.returncode == 0
    return False


async def run_container(
    podman: Podman, spec: ContainerSpec, document: bytes, *, ends: float, output_max_bytes: int
) -> ContainerRun:
    """Run ``spec`` with ``document`` on its stdin until it exits or ``ends`` (trio time).

    Never raises for a fault of the container; on cancellation the container is removed (shielded) and
    Cancelled propagates.
    """
    t0 = time.monotonic()

    def ended(outcome: str, code: int | None, out: bytes, err: bytearray, left: bool = False) -> ContainerRun:
        tail = bytes(err[-_STDERR_TAIL:]).decode("utf-8", "replace")
        return ContainerRun(outcome, code, out, tail, int((time.monotonic() - t0) * 1000), spec.name, left)

    try:
        process = await trio.lowlevel.open_process(
            podman_argv(podman, spec), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=_environment(), start_new_session=True,
        )
    except OSError as exc:
        return ended("spawn_failed", None, b"", bytearray(str(exc).encode()))
    stdout, stderr = bytearray(), bytearray()
    overflow = left_behind = False
    outcome = "exited"
    waiting = trio.CancelScope(deadline=ends)
    try:
        async with trio.open_nursery() as nursery:
            assert process.stdin is not None and process.stdout is not None and process.stderr is not None

            async def feed() -> None:
                try:
                    async with process.stdin:
                        await process.stdin.send_all(document)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # it did not read its input: its answer says how it fared

            async def read_stdout() -> None:
                nonlocal overflow
                async for chunk in process.stdout:  # read to the end: what is past the cap is dropped
                    if not overflow:
                        stdout.extend(chunk)
                        if len(stdout) > output_max_bytes:
                            overflow = True
                            waiting.cancel()

            async def read_stderr() -> None:
                async for chunk in process.stderr:
                    stderr.extend(chunk)
                    del stderr[:-_STDERR_TAIL]

            nursery.start_soon(feed)
            nursery.start_soon(read_stdout)
            nursery.start_soon(read_stderr)
            with waiting:
                await process.wait()
            if process.returncode is None:
                outcome = "output_too_large" if overflow else "timeout"
                left_behind = await _stop(podman, spec.name, process)
    finally:
        if process.returncode is None:  # cancelled from outside
            with trio.CancelScope(shield=True):
                await _stop(podman, spec.name, process)
    if outcome == "exited" and process.returncode == PODMAN_ERROR:
        outcome = "podman_error"
    return ended(outcome, process.returncode if outcome in ("exited", "podman_error") else None,
                 bytes(stdout[:output_max_bytes]), stderr, left_behind)


async def _stop(podman: Podman, name: str, process: trio.Process) -> bool:
    """End a run early: the podman client first (so nothing waits on its output), then the container with
    ``podman rm -f``; True when the container may be left behind."""
    with trio.CancelScope(shield=True):
        process.kill()
        await process.wait()
        return not await _remove(podman, name)


def sweep_containers(podman: Podman, home: str) -> list[str]:
    """Remove every container labelled with the home ``home`` (:func:`home_label`): what a daemon of it killed
    mid-call left; return their names. Blocking; call at start, before any tool runs. Raises OSError when
    podman cannot list or remove them."""
    listed = subprocess.run(
        [podman.podman, "ps", "--all", "--filter", f"label={HOME_LABEL}={home}", "--format", "{{.Names}}"],
        capture_output=True, text=True, timeout=_REMOVE_TIMEOUT_S, env=_environment(), check=False,
    )
    if listed.returncode != 0:
        raise OSError(f"podman ps failed: {listed.stderr.strip()[-300:]}")
    names = listed.stdout.split()
    if names:
        removed = subprocess.run([podman.podman, "rm", "--force", "--ignore", "--time", "0", *names],
                                 capture_output=True, text=True, timeout=_REMOVE_TIMEOUT_S, env=_environment(), check=False)
        if removed.returncode != 0:
            raise OSError(f"podman rm failed for {', '.join(names)}: {removed.stderr.strip()[-300:]}")
    return names


def container_network(plans: LaunchPlans, agent: AgentSpec, creds: AgentCredentials, mode: NetworkMode) -> str:
    """The ``--network`` of a container of ``agent`` with network ``mode``: ``none`` for ``off``, else the
    agent's own namespace for that mode (the holder's, as its other processes enter).

    Raises LaunchError when the agent has no namespace of its own with egress here: a container never
    gets the host's network, whatever ``[isolation] network`` says.
    """
    if mode == "off":
        return "none"
    held = plans.namespaces(agent, creds, mode)
    if held is None or not held.flags & _elf.CLONE_NEWNET:
        raise LaunchError(f"agent {agent.id}: a container with network {mode!r} needs the agent's own network "
                          "namespace with egress, which this host cannot give (it never gets the host's network)")
    return f"ns:/proc/{held.holder}/ns/net"
