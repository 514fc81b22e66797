"""Containers for agents' tools: ``runtime: container`` tools (their ``module`` is the image) and
``rune@docker-exec``, both through :mod:`covenant.runtime.podman`.

Only images listed in ``[tools.container] images`` run, as the agent's uid with the agent's memory and
disk limits, and only for an agent that has a uid of its own (a same-uid daemon would run them as
itself). A ``runtime: container`` tool is run like a process tool: the arguments document on its
stdin, one JSON document expected on its stdout.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
from typing import Any

import trio

from covenant.config import AgentNetwork, Config
from covenant.runtime.launcher import LaunchError
from covenant.runtime.podman import (
    ContainerRun,
    ContainerSpec,
    container_network,
    find_podman,
    home_label,
    run_container,
    sweep_containers,
)
from covenant.tools.context import ToolCallContext
from covenant.tools.result import ToolError, ToolResult, capped
from covenant.tools.schema import first_error
from covenant.tools.services import ToolServices

__all__ = ["container_problem", "image_problem", "remove_left_containers", "run_container_tool", "run_in_container"]

log = logging.getLogger("covenant.tools")


def remove_left_containers(home_key: str, config: Config) -> list[str]:
    """Remove the containers a daemon of this home (state dir ``home_key``) killed mid-call left, whatever the
    images listed now; return their names (blocking; at start). None where podman cannot run here; a failure
    is logged, never fatal."""
    podman = find_podman(config.tools.container.podman, config.tools.container.runc)
    if isinstance(podman, str):
        return []
    try:
        return sweep_containers(podman, home_label(home_key))
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot remove containers left by an earlier run", extra={"detail": str(exc)})
        return []


def container_problem(config: Config) -> str | None:
    """Why no container can run under this config here (no podman or runc, not root, no image listed), or None."""
    settings = config.tools.container
    found = find_podman(settings.podman, settings.runc)
    if isinstance(found, str):
        return found
    if not settings.images:
        return "no image is listed in [tools.container] images (only listed images run)"
    return None


def image_problem(config: Config, image: str) -> str | None:
    """Why ``image`` may not run under this config, or None."""
    problem = container_problem(config)
    if problem is not None:
        return problem
    if image not in config.tools.container.images:
        return f"its image {image!r} is not listed in [tools.container] images (only listed images run; never pulled)"
    return None


async def run_in_container(
    services: ToolServices, ctx: ToolCallContext, image: str, document: bytes, *, ends: float, network: AgentNetwork,
    command: tuple[str, ...] = (), workspace: bool = False, output_max_bytes: int, memory_mb: int | None,
) -> ContainerRun:
    """Run ``image`` for ``ctx``'s agent until ``ends``; raises ToolError when it cannot be started at all.

    ``memory_mb``: the agent's ``resource_profile`` memory (default: its ``memory_mb``)."""
    config = services.config
    problem = image_problem(config, image)
    if problem is not None:
        raise ToolError("tool_unavailable", problem)
    podman = find_podman(config.tools.container.podman, config.tools.container.runc)
    assert not isinstance(podman, str)  # judged by image_problem
    agent = ctx.agent
    creds = await trio.to_thread.run_sync(services.runner.isolation.credentials_for, agent.id)
    if creds is None:
        raise ToolError("tool_unavailable", "containers run only as an agent uid of its own, and this daemon runs "
                                            "agents as its own uid ([isolation])")
    try:
        net = container_network(services.runner.plans, agent, creds, network)
    except (LaunchError, OSError) as exc:
        raise ToolError("tool_unavailable", str(exc)) from None
    mount = str((await trio.to_thread.run_sync(services.workspace, agent.id)).root) if workspace else None
    found = services.runner.plans.resource_class(agent)
    spec = ContainerSpec(
        image=image, uid=creds.uid, gid=creds.gid, network=net, memory_mb=memory_mb or agent.resources.memory_mb,
        pids_max=config.tools.container.pids_max, tmp_mb=agent.resources.disk_mb, marker=ctx.run_marker(),
        home=home_label(str(services.home.state_dir.resolve())), cpus=found.cpu_cores if found else None,
        command=command, workspace=mount,
    )
    run = await run_container(podman, spec, document, ends=ends, output_max_bytes=output_max_bytes)
    log.info("container run", extra={"agent": agent.id, "intent": ctx.intent_id, "image": image, "outcome": run.outcome,
                                     "exit_code": run.exit_code, "duration_ms": run.duration_ms, "container": run.name,
                                     "left_behind": run.left_behind})
    if run.left_behind:
        log.error("a container could not be removed", extra={"agent": agent.id, "intent": ctx.intent_id,
                                                              "container": run.name})
    return run


def _tool_result(entry: Any, run: ContainerRun) -> ToolResult:
    name = entry.model_name
    hint = f"; its last stderr line: {run.last_stderr_line!r}" if run.last_stderr_line else ""
    match run.outcome:
        case "timeout":
            return ToolResult.failure("tool_timeout", f"{name} did not finish in time; its container was removed")
        case "output_too_large":
            return ToolResult.failure("tool_failed", f"{name} wrote more than its output cap; its container was removed")
        case "podman_error" | "spawn_failed":
            return ToolResult.failure("tool_unavailable", f"{name}'s container could not be run{hint}")
    if run.exit_code != 0:
        return ToolResult.failure("tool_failed", f"{name} exited with code {run.exit_code}{hint}")
    try:
        answer = json.loads(run.stdout)
    except (UnicodeDecodeError, ValueError):
        return ToolResult.failure("tool_bad_output", f"{name} did not answer one JSON document (its first bytes: "
                                                     f"{run.stdout[:80]!r})")
    if entry.output_validator is not None:
        error = first_error(entry.output_validator, answer)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(the document)"
            return ToolResult.failure(
                "tool_bad_output", f"{name} answered a document that does not match its output schema at {where}: {error.message}"
            )
    return capped(answer)


async def run_container_tool(
    services: ToolServices, ctx: ToolCallContext, entry: Any, arguments: dict[str, Any], ends: float,
    memory_mb: int | None = None,
) -> ToolResult:
    """One attempt of a ``runtime: container`` tool (``entry`` a :class:`~covenant.tools.catalogue.ToolEntry`)."""
    assert entry.image is not None
    document = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    network = services.config.tools.tool_network if entry.declares_network else "off"
    try:
        run = await run_in_container(
            services, ctx, entry.image, document, ends=ends, network=network, workspace=entry.declares_filesystem,
            output_max_bytes=services.config.runtime.stdout_cap_bytes, memory_mb=memory_mb,
        )
    except ToolError as exc:
        return ToolResult.failure(exc.code, f"{entry.model_name}: {exc.message}")
    return dataclasses.replace(_tool_result(entry, run), left_behind=int(run.left_behind))
