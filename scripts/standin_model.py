#!/usr/bin/env python3
"""covenant's stand-in model: a deterministic, rule-based, OpenAI-compatible server for the demo.

It is NOT a language model, and says so in every answer ("[stand-in model] …", model
``covenant-stand-in-model``). It exists so ``make demo`` can run a Rune agent end to end offline,
with no key and nothing to download: the agent's loop, a tool call, the daemon's model gateway,
the ``model.call`` audit events and the token budget are all real; only the "thinking" is a rule:

1. If tools are offered and no tool has answered since the last user message, call the one tool
   whose name best matches the words of the system prompt and the user's message (none matches:
   answer directly). Its arguments are built from its JSON schema: a tool without parameters gets
   ``{}``; a string field gets the subject of the message (the text after a short opening
   instruction that ends in a colon, ``Classify this ticket: …``; else the whole message), cut to
   its ``maxLength``; an ``enum`` field the option the message names (else the first); a ``url``
   field the first URL in the message, and a tool whose required URL the message lacks is not
   called; numbers their ``minimum`` (else 1), booleans false, lists and objects empty.
2. Once the tool has answered, reply in one sentence built from its result (or its error).
3. Without tools, reply by describing the user's message.

Usage is reported as one token per 4 bytes of the request and of the answer, so budgets move.

    .venv/bin/python scripts/standin_model.py --port-file /tmp/standin.port

serves on 127.0.0.1 (a random port unless ``--port``) until SIGTERM or SIGINT, writing its port
to ``--port-file`` once it listens. The daemon never starts it; ``make demo`` does
(docs/providers.md). Endpoints: ``POST /v1/chat/completions`` (plain or ``stream: true``),
``GET /v1/models``, ``GET /health``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["MODEL_NAME", "LABEL", "reply", "usage", "serve"]

MODEL_NAME = "covenant-stand-in-model"
LABEL = "[stand-in model]"
_MAX_BODY = 8 * 1024 * 1024
_URL = re.compile(r"https?://[^\s\"'<>]+")
_WORD = re.compile(r"[a-z0-9]+")
# "Classify this support ticket: <the ticket>": an opening instruction of a few words, a colon, the subject.
_INSTRUCTION = re.compile(r"([^\n:]+):\s+(\S.*)", re.S)
_INSTRUCTION_WORDS = 8


# --- the rules (pure) -------------------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) >= 3}


def _name_words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", name).lower()
    return [w for w in re.split(r"[^a-z0-9]+", spaced) if len(w) >= 3]


def _last_user_index(messages: list[dict[str, Any]]) -> int:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return index
    return -1


def _choose_tool(tools: list[dict[str, Any]], context: set[str], user_text: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The best-matching tool whose arguments the message can fill, with those arguments."""
    best, best_score = None, 0
    for tool in tools:
        function = tool.get("function") or {}
        score = sum(1 for word in _name_words(str(function.get("name", ""))) if word in context)
        if score > best_score and (arguments := _arguments(function, user_text)) is not None:
            best, best_score = (function, arguments), score
    return best


def _subject(text: str) -> str:
    """What a message is about: the text after an opening instruction such as ``Classify this ticket:``."""
    match = _INSTRUCTION.match(text)
    if match and len(match.group(1).split()) <= _INSTRUCTION_WORDS:
        return match.group(2).strip()
    return text


def _string(name: str, prop: dict[str, Any], user_text: str) -> str | None:
    """A string argument for ``name``; None when the message has none to give (a URL it does not hold)."""
    options = [o for o in prop.get("enum") or [] if isinstance(o, str)]
    if options:
        lowered = user_text.lower()
        return next((o for o in options if re.search(rf"(?<!\w){re.escape(o.lower())}(?!\w)", lowered)), options[0])
    if name.lower() in ("url", "uri", "link") or prop.get("format") in ("uri", "url"):
        url = _URL.search(user_text)
        return url.group(0).rstrip(".,;:!?)]}") if url else None  # "see https://x/y." means https://x/y
    value = _subject(user_text)
    limit = prop.get("maxLength")
    return value[:limit] if isinstance(limit, int) and limit > 0 else value


def _arguments(function: dict[str, Any], user_text: str) -> dict[str, Any] | None:
    """Arguments for ``function`` from its JSON schema; None when a required one cannot be filled."""
    schema = function.get("parameters") or {}
    properties = {k: v for k, v in (schema.get("properties") or {}).items() if isinstance(v, dict)}
    if not properties:
        return {}  # a tool that takes no arguments
    required = [name for name in schema.get("required") or [] if name in properties]
    strings = [name for name, prop in properties.items() if prop.get("type") == "string"]
    out: dict[str, Any] = {}
    for name in required or strings[:1]:
        prop = properties[name]
        kind = prop.get("type")
        if kind == "string":
            value = _string(name, prop, user_text)
            if value is None:
                if name in required:
                    return None
                continue
            out[name] = value
        elif kind in ("integer", "number"):
            out[name] = prop.get("minimum", 1)
        else:
            out[name] = {"boolean": False, "array": [], "object": {}}.get(kind, _subject(user_text))
    return out


def _summary(content: str) -> tuple[str, str | None]:
    """(what the tool returned, its error message if it failed), both short."""
    text = content.strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    if isinstance(value, dict) and isinstance(value.get("error"), dict):
        return "", str(value["error"].get("message") or value["error"].get("code") or "failed")[:200]
    if isinstance(value, dict) and len(value) == 1:
        value = next(iter(value.values()))
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False)
    return value.strip()[:200], None


def _answer_from_results(messages: list[dict[str, Any]], start: int) -> str:
    names = {}
    for message in messages[start:]:
        for call in message.get("tool_calls") or []:
            names[call.get("id")] = (call.get("function") or {}).get("name", "the tool")
    parts = []
    for message in messages[start:]:
        if message.get("role") != "tool":
            continue
        name = names.get(message.get("tool_call_id"), "the tool")
        result, error = _summary(_text(message.get("content")))
        if error is not None or message.get("is_error"):
            parts.append(f"{name} failed ({error or result}), so I cannot finish this one.")
        elif result and " " not in result:
            parts.append(f"{name} says: {result}. Next step: hand it to the {result} team.")
        else:
            parts.append(f"{name} returned: {result or '(nothing)'}.")
    return f"{LABEL} " + " ".join(parts)


def reply(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message for one chat completions request body."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    last_user = _last_user_index(messages)
    user_text = _text(messages[last_user].get("content")) if last_user >= 0 else ""
    answered = any(m.get("role") == "tool" for m in messages[last_user + 1 :])
    if answered:
        return {"role": "assistant", "content": _answer_from_results(messages, last_user + 1)}
    if tools:
        system = " ".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
        chosen = _choose_tool(tools, _words(system + " " + user_text), user_text)
        if chosen is not None:
            function, arguments = chosen
            turn = sum(1 for m in messages if m.get("role") == "assistant")
            call = {
                "id": f"call_standin_{turn}",
                "type": "function",
                "function": {"name": function["name"], "arguments": json.dumps(arguments)},
            }
            return {"role": "assistant", "content": "", "tool_calls": [call]}
    words = len(user_text.split())
    quoted = user_text if len(user_text) <= 120 else user_text[:117] + "..."
    return {"role": "assistant",
            "content": f"{LABEL} (rule-based, not a language model) You wrote {words} words: \"{quoted}\"."}


def usage(body: dict[str, Any], message: dict[str, Any]) -> dict[str, int]:
    """One token per 4 bytes (rounded up) of what was sent and of the answer."""
    sent = json.dumps([body.get("messages"), body.get("tools")], ensure_ascii=False).encode()
    answer = json.dumps(message, ensure_ascii=False).encode()
    prompt, completion = math.ceil(len(sent) / 4), math.ceil(len(answer) / 4)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# --- HTTP --------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # head and body are two writes: no 40 ms Nagle/delayed-ACK stall
    server_version = "covenant-stand-in-model"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return

    def _json(self, status: int, data: Any) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/health", ""):
            self._json(200, {"status": "ok", "model": MODEL_NAME})
        elif path in ("/v1/models", "/models"):
            self._json(200, {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "owned_by": "covenant"}]})
        else:
            self._json(404, {"error": {"message": f"no route GET {path}", "type": "not_found"}})

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._json(404, {"error": {"message": f"no route POST {path}", "type": "not_found"}})
            return
        length = int(self.headers.get("content-length") or 0)
        if not 0 < length <= _MAX_BODY:
            self.close_connection = True
            self._json(413 if length else 400, {"error": {"message": "a JSON body of at most 8 MiB is required"}})
            return
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._json(400, {"error": {"message": "the body must be a JSON object with a messages list",
                                       "type": "invalid_request_error"}})
            return
        message = reply(body)
        counts = usage(body, message)
        if body.get("stream"):
            self._stream(message, counts, bool((body.get("stream_options") or {}).get("include_usage")))
            return
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        self._json(200, {
            "id": "chatcmpl-standin", "object": "chat.completion", "created": 0, "model": MODEL_NAME,
            "system_fingerprint": "covenant-stand-in",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": counts,
        })

    def _stream(self, message: dict[str, Any], counts: dict[str, int], include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True

        def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
            data = {"id": "chatcmpl-standin", "object": "chat.completion.chunk", "created": 0, "model": MODEL_NAME,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else [],
                    **extra}
            return f"data: {json.dumps(data)}\n\n".encode()

        out = [chunk({"role": "assistant", "content": ""})]
        out += [chunk({"content": piece}) for piece in re.findall(r"\s*\S+", message.get("content") or "")]
        for index, call in enumerate(message.get("tool_calls") or []):
            out.append(chunk({"tool_calls": [{"index": index, **call}]}))
        out.append(chunk({}, "tool_calls" if message.get("tool_calls") else "stop"))
        if include_usage:
            out.append(chunk(None, usage=counts))
        out.append(b"data: [DONE]\n\n")
        try:
            for piece in out:
                self.wfile.write(piece)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


def _write_port_file(path: str, port: int) -> None:
    """Atomically, so a reader never sees a half-written number."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(dir=folder, prefix=".standin-port.")
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{port}\n")
    os.replace(temp, path)


def serve(port: int = 0, port_file: str | None = None) -> None:
    """Serve on 127.0.0.1 until SIGTERM/SIGINT; then stop cleanly."""
    ThreadingHTTPServer.request_queue_size = 1024  # listen backlog; the default 5 resets bursts
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    server.daemon_threads = True
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    bound = server.server_address[1]
    if port_file:
        _write_port_file(port_file, bound)
    print(f"{LABEL} {MODEL_NAME} (rule-based, not a language model) on http://127.0.0.1:{bound}/v1",
          file=sys.stderr, flush=True)
    stop.wait()
    server.shutdown()
    server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--port-file", help="write the port here once listening")
    args = parser.parse_args()
    serve(args.port, args.port_file)


if __name__ == "__main__":
    main()
