"""``rune@browser-navigate|click|type|screenshot|read-page|close|scroll|wait|run-js|back``: a headless Chromium.

Each agent session has its own browser (:mod:`covenant.tools.browsers`): Chromium driven by
:mod:`covenant.tools.browser_runner` as the agent's uid in its network namespace, never inside the
daemon. The daemon checks the arguments and a navigation's URL (the address rules of
``rune@web-fetch`` with ``[tools.browser] allow``) before sending; the runner checks every request
Chromium makes against the same rules; the namespace is the hard boundary. Names and argument shapes
are the reference runtime's. A screenshot becomes an artifact of the intent, as
``rune@canvas-present``'s content does.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from covenant.config import Config
from covenant.netpolicy import AddressPolicy
from covenant.runtime.artifacts import ArtifactRefused
from covenant.runtime.launch_plans import resolve_program
from covenant.tools.builtins.base import NO_ARGUMENTS, Builtin, BuiltinCall
from covenant.tools.builtins.web_fetch import checked_addresses
from covenant.tools.result import RESULT_MAX_BYTES, ToolError
from covenant.tools.runner_python import RunnerCommand, runner_command

__all__ = ["RUNNER", "TOOLS", "browser_problem"]

RUNNER = str(Path(__file__).parent.parent / "browser_runner.py")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_SELECTOR = {"type": "string", "minLength": 1, "maxLength": 4096,
             "description": "a CSS selector (or the visible text of a link or button)"}


def _chromium(config: Config) -> str | None:
    return resolve_program(config.tools.browser.chromium, config.runtime.path)


def _backend(config: Config) -> RunnerCommand | str:
    return runner_command(config.rune.python or sys.executable, RUNNER, "browser runner")


def browser_problem(config: Config) -> str | None:
    """Why the browser tools are unavailable with this config on this host, or None."""
    backend = _backend(config)
    if isinstance(backend, str):
        return backend
    if _chromium(config) is None:
        return (f"needs chromium ([tools.browser] chromium = {config.tools.browser.chromium!r}, not found on [runtime] "
                f"path); install it: apt-get install chromium")
    return None


def _timeout_ms(config: Config, arguments: dict[str, Any]) -> int:
    # the runner's own deadline comes first, with its message; a wait may ask for longer than a call's default
    return max(config.tools.browser.timeout_ms, int(arguments.get("timeout_ms", 0)) + 5000) + 1000


async def _request(call: BuiltinCall, request: dict[str, Any]) -> dict[str, Any]:
    """Send ``request`` to the caller's browser (started at its first call) and return the runner's answer."""
    config = call.services.config
    limits = config.tools.browser
    backend = _backend(config)
    chromium = _chromium(config)
    if isinstance(backend, str) or chromium is None:  # removed since the toolset was resolved
        raise ToolError("tool_unavailable", browser_problem(config) or "the browser cannot run here")
    registry = call.services.browsers
    key = registry.key(call.ctx.agent.id, call.ctx.session_id, call.ctx.intent_id)
    start = {
        "op": "start", "chromium": chromium, "allow": list(limits.allow), "network": limits.network,
        "data_mb": limits.memory_mb, "text_max_chars": limits.text_max_chars,
        "screenshot_max_bytes": limits.screenshot_max_kb * 1024,
    }
    return await registry.request(call.ctx.agent, key, call.ctx.intent_id, backend, start, request,
                                  min(call.ends, call.ctx.deadline))


async def _navigate(call: BuiltinCall) -> dict[str, Any]:
    import httpx  # loaded by the first navigation, not with the daemon

    url = call.arguments["url"]
    limits = call.services.config.tools.browser
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ToolError("invalid_arguments", f"url is not a URL: {exc}") from None
    await checked_addresses(parsed, AddressPolicy.from_config(limits.allow), limits.network, "[tools.browser]",
                            "[tools.browser] network")
    return await _request(call, {"op": "navigate", "url": url})


async def _screenshot(call: BuiltinCall) -> dict[str, Any]:
    answer = await _request(call, {"op": "screenshot", "full_page": bool(call.arguments.get("full_page"))})
    try:
        data = base64.b64decode(answer.pop("png", ""), validate=True)
    except (binascii.Error, ValueError):
        data = b""
    if not data.startswith(_PNG_MAGIC):
        raise ToolError("tool_failed", "the browser's screenshot is not a PNG image")
    try:
        entry = await call.services.save_artifact(call.ctx.intent_id, "screenshot", "image/png", data)
    except ArtifactRefused as exc:
        raise ToolError("artifact_refused", str(exc)) from None
    return {"artifact": entry, **answer}


def _result_bytes(answer: dict[str, Any]) -> int:
    return len(json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def _within_result(answer: dict[str, Any], field: str) -> dict[str, Any]:
    """``answer`` with its text ``field`` cut so the whole fits in one tool result (``RESULT_MAX_BYTES``, what the
    model is handed at most), ``truncated`` set when it was cut; a value that is not text becomes its JSON text."""
    if _result_bytes(answer) <= RESULT_MAX_BYTES:
        return answer
    text = answer[field] if isinstance(answer[field], str) else json.dumps(answer[field], ensure_ascii=False)
    budget = RESULT_MAX_BYTES - _result_bytes({**answer, field: "", "truncated": True})
    while text and (size := _result_bytes({field: text}) - _result_bytes({field: ""})) > budget:
        text = text[: min(len(text) - 1, len(text) * budget // size)]  # proportionally: characters differ in bytes
    return {**answer, field: text, "truncated": True}


async def _read_page(call: BuiltinCall) -> dict[str, Any]:
    return _within_result(await _request(call, {"op": "read"}), "text")


async def _run_js(call: BuiltinCall) -> dict[str, Any]:
    return _within_result(await _request(call, {"op": "run_js", "expression": call.arguments["expression"]}), "value")


async def _close(call: BuiltinCall) -> dict[str, Any]:
    registry = call.services.browsers
    closed = await registry.close(registry.key(call.ctx.agent.id, call.ctx.session_id, call.ctx.intent_id))
    return {"closed": closed}


def _op(op: str, *names: str) -> Callable[[BuiltinCall], Awaitable[dict[str, Any]]]:
    async def run(call: BuiltinCall) -> dict[str, Any]:
        return await _request(call, {"op": op, **{n: call.arguments[n] for n in names if n in call.arguments}})

    return run


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def _tool(name: str, description: str, parameters: dict[str, Any], run: Callable[[BuiltinCall], Awaitable[Any]]) -> Builtin:
    return Builtin(name=f"rune@browser-{name}", description=description, parameters=parameters, run=run,
                   timeout_ms=_timeout_ms, needs=browser_problem)


TOOLS = (
    _tool("navigate", "Open a URL (http or https) in your browser and wait for it to load. Returns its url and title.",
          _object({"url": {"type": "string", "minLength": 1, "maxLength": 8192, "description": "the URL to open"}}, ("url",)),
          _navigate),
    _tool("click", "Click an element of the page (a real mouse click at its centre) and wait for what it loads.",
          _object({"selector": _SELECTOR}, ("selector",)), _op("click", "selector")),
    _tool("type", "Type text into an input field of the page (its old value is replaced).",
          _object({"selector": _SELECTOR, "text": {"type": "string", "maxLength": 65536, "description": "the text to type"}},
                  ("selector", "text")), _op("type", "selector", "text")),
    _tool("screenshot", "Take a PNG screenshot of the page; it is kept with this request and shown to the user. "
          "Returns its artifact (name, bytes, sha256).",
          _object({"full_page": {"type": "boolean", "description": "the whole page, not only the visible part"}}),
          _screenshot),
    _tool("read-page", "Read the page: its url, title and visible text (cut to [tools.browser] text_max_chars and to "
          "what one tool result holds; truncated says so).", NO_ARGUMENTS, _read_page),
    _tool("close", "Close your browser (its pages, cookies and history are gone).", NO_ARGUMENTS, _close),
    _tool("scroll", "Scroll the page.",
          _object({"direction": {"type": "string", "enum": ["up", "down", "left", "right"], "description": "default down"},
                   "amount": {"type": "integer", "minimum": 1, "maximum": 100_000, "description": "pixels (default 600)"}}),
          _op("scroll", "direction", "amount")),
    _tool("wait", "Wait for an element to appear on the page, at most timeout_ms (default 5000). found says whether it did.",
          _object({"selector": _SELECTOR, "timeout_ms": {"type": "integer", "minimum": 0, "maximum": 120_000}}, ("selector",)),
          _op("wait", "selector", "timeout_ms")),
    _tool("run-js", "Run a JavaScript expression on the page (a promise is awaited) and return its JSON value.",
          _object({"expression": {"type": "string", "minLength": 1, "maxLength": 65536}}, ("expression",)),
          _run_js),
    _tool("back", "Go back to the previous page of the history. moved says whether there was one.", NO_ARGUMENTS, _op("back")),
)
