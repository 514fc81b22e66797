"""The replica process: ``python -m covenant.rune.host`` serves one Rune agent.

Started by the daemon through the same launcher as any agent (process
group, built environment, PDEATHSIG, memory limit). Its first stdin line is
the replica spec (JSON, see :class:`ReplicaSpec`), written by the daemon;
it then serves the Rune replica API on ``spec.socket``:

- ``GET <health path>`` → 200 ``{"status": "ok"}``;
- ``POST /invoke {"input", "session_id"?, "stream"?, "intent_id", "issuer", "deadline_ms"?}`` →
  ``{"request_id", "session_id", "output": {"text", "input_required"?}, "usage"}`` (``input_required``:
  the turn ended with ``rune@ask-user``'s question as its text), or HTTP 422
  ``{"error": {"code", "message"}, "request_id", "session_id", "usage"}``
  with the outcome code; with ``stream`` a ``text/event-stream`` of
  ``token``, ``tool_start``, ``tool_done`` and finally ``done`` (the
  document above) or ``error``.

Model and tool calls go to ``spec.gateway``, the daemon's socket for this
replica alone. Logs are lines on stderr (the daemon logs them with the agent id).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from covenant.rune import wire
from covenant.rune.conversation import Conversations, SessionPolicy
from covenant.rune.gateway_client import GatewayBackend
from covenant.rune.loop import LoopFailed, LoopSpec
from covenant.rune.skills import with_skills
from covenant.rune.test_driven import run_test_driven

__all__ = ["ReplicaSpec", "ReplicaApp", "main"]

INVOKE_PATH = "/invoke"
GATEWAY_LOST_EXIT = 3
"""Exit code of a replica that found its gateway socket served by another process than the daemon."""
_LAST_ANSWER_S = 0.2


@dataclass(frozen=True)
class ReplicaSpec:
    agent: str
    socket: str
    gateway: str
    gateway_pid: int
    """The daemon's pid: the only process whose gateway socket this replica talks to."""
    health_path: str
    system_prompt: str
    tools: list[dict[str, Any]]
    max_steps: int
    memory_profile: str
    standard_turns: int
    token_budget: int
    checkpoint_policy: str
    safety_policy: str
    skills: dict[str, str]
    loop: str
    """``tools`` (the Rune loop) or ``test-driven`` (:mod:`covenant.rune.test_driven`)."""

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> "ReplicaSpec":
        return cls(**{name: document[name] for name in cls.__dataclass_fields__})


def _log(message: str, **fields: Any) -> None:
    extra = " ".join(f"{k}={json.dumps(v)}" for k, v in fields.items())
    sys.stderr.write(f"{message} {extra}\n" if extra else f"{message}\n")
    sys.stderr.flush()


def _error(code: str, message: str, **rest: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}, **rest}


class ReplicaApp:
    """Request handling of one replica."""

    def __init__(self, spec: ReplicaSpec) -> None:
        self.spec = spec
        self.gateway_lost = trio.Event()
        self.gateway_connections = wire.ConnectionPool(spec.gateway, spec.gateway_pid)
        """Kept-alive connections to the daemon's gateway, shared by every intent of this replica."""
        self.loop_spec = LoopSpec(
            system_prompt=spec.system_prompt, tools=spec.tools, max_steps=spec.max_steps, safety_policy=spec.safety_policy
        )
        self.conversations = Conversations(
            SessionPolicy(
                memory_profile=spec.memory_profile,
                standard_turns=spec.standard_turns,
                token_budget=spec.token_budget,
                checkpoint_policy=spec.checkpoint_policy,
            )
        )

    async def handle(self, request: wire.Request) -> wire.JSONResponse | wire.EventStream:
        if request.method == "GET" and request.target == self.spec.health_path:
            return wire.JSONResponse(200, {"status": "ok", "agent": self.spec.agent})
        if request.target != INVOKE_PATH:
            return wire.JSONResponse(404, _error("not_found", f"no such endpoint: {request.target}"))
        if request.method != "POST":
            return wire.JSONResponse(405, _error("method_not_allowed", f"{request.method} is not allowed on {INVOKE_PATH}"))
        body = request.body
        problem = self._invalid(body)
        if problem is not None:
            return wire.JSONResponse(400, _error("bad_request", problem))
        if body.get("stream"):
            return wire.EventStream(lambda emit: self._stream(body, emit))
        status, document = await self._invoke(body, None)
        return wire.JSONResponse(status, document)

    @staticmethod
    def _invalid(body: Any) -> str | None:
        if not isinstance(body, dict):
            return "the body must be a JSON object"
        if not isinstance(body.get("input"), str):
            return "input must be a string"
        if not isinstance(body.get("intent_id"), str) or not body["intent_id"]:
            return "intent_id must be a non-empty string"
        if not isinstance(body.get("issuer", ""), str):
            return "issuer must be a string"
        if body.get("session_id") is not None and not isinstance(body["session_id"], str):
            return "session_id must be a string"
        if body.get("deadline_ms") is not None and not isinstance(body["deadline_ms"], int):
            return "deadline_ms must be an integer (ms since the epoch)"
        if body.get("session") is not None and not isinstance(body["session"], dict):
            return "session must be an object"
        return None

    def _gateway_taken_over(self, why: str) -> None:
        """Another process serves the gateway socket: this replica is done (the daemon starts a new one, and the
        sweep of the agent's uid ends that process)."""
        if not self.gateway_lost.is_set():
            _log("the gateway socket is served by another process; exiting", error=why)
            self.gateway_lost.set()

    async def _stream(self, body: dict[str, Any], emit: wire.Emit) -> None:
        status, document = await self._invoke(body, emit)
        await emit("done" if status == 200 else "error", document)

    async def _invoke(self, body: dict[str, Any], emit: wire.Emit | None) -> tuple[int, dict[str, Any]]:
        request_id = os.urandom(8).hex()
        intent_id = body["intent_id"]
        gateway = GatewayBackend(Path(self.spec.gateway), intent_id, self.spec.gateway_pid, self._gateway_taken_over,
                                 session=body.get("session"), pool=self.gateway_connections)
        backend = with_skills(gateway, self.spec.skills)
        notes: dict[str, Any] = {}
        session_id = body.get("session_id")
        deadline = body.get("deadline_ms")
        remaining = (deadline - time.time() * 1000) / 1000 if deadline is not None else float("inf")
        try:
            with trio.fail_after(max(remaining, 0)):
                if self.spec.loop == "test-driven":  # its attempts are its record: no conversation session
                    result = await run_test_driven(self.loop_spec, gateway, body["input"])
                else:
                    session_id, result = await self.conversations.answer(
                        self.loop_spec, backend, text=body["input"], issuer=body.get("issuer", ""),
                        session_id=session_id, store=gateway, emit=emit, notes=notes,
                    )
        except LoopFailed as exc:
            _log("intent failed", intent=intent_id, outcome=exc.code)
            return 422, _error(exc.code, exc.message, request_id=request_id, session_id=session_id, usage=exc.usage, **notes)
        except trio.TooSlowError:
            return 422, _error("timeout", "the intent's deadline passed in the replica", request_id=request_id,
                               session_id=session_id, **notes)
        checkpoint = {} if gateway.checkpoint is None else {"checkpoint": gateway.checkpoint}
        output: dict[str, Any] = {"text": result.text}
        if result.input_required:
            output["input_required"] = True
        return 200, {"request_id": request_id, "session_id": session_id, "output": output,
                     "usage": result.usage, **checkpoint, **notes}


async def _serve(spec: ReplicaSpec) -> int:
    """Serve until the gateway is found taken over (returns 3); otherwise until killed."""
    app = ReplicaApp(spec)
    sock = wire.bind_socket(Path(spec.socket))
    _log("replica serving", agent=spec.agent, socket=spec.socket)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(wire.serve, sock, app.handle, peer_pid=lambda: spec.gateway_pid, name=spec.socket))
        await app.gateway_lost.wait()
        await trio.sleep(_LAST_ANSWER_S)  # the intent that found it out gets its error first
        nursery.cancel_scope.cancel()
    return GATEWAY_LOST_EXIT


_PR_SET_DUMPABLE = 4


def _not_dumpable() -> None:
    """Keep processes of the agent's uid (its tools) out of this one: no ``/proc/<pid>/mem``, ``environ`` or
    ``fd``, no ptrace. The replica holds every in-flight intent of its agent, other issuers' turns included;
    the kernel only lets root (or CAP_SYS_PTRACE) read a process that is not dumpable. Fails closed."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def main() -> int:
    """Read the spec line from stdin and serve until killed."""
    _not_dumpable()
    # Worker threads (session files) need little stack; the default 8 MiB each counts against RLIMIT_AS.
    threading.stack_size(512 * 1024)
    line = sys.stdin.buffer.readline()
    try:
        spec = ReplicaSpec.from_json(json.loads(line))
    except (ValueError, KeyError, TypeError) as exc:
        _log(f"bad replica spec on stdin: {exc}")
        return 2
    try:
        return trio.run(_serve, spec)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
