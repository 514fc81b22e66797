"""A scripted fake model provider: a real HTTP server on 127.0.0.1 for tests.

It speaks the two wire formats covenant's gateway uses:

- OpenAI chat completions, ``POST …/chat/completions`` (``/v1/chat/completions`` or, when a
  provider's ``base_url`` has no ``/v1``, ``/chat/completions``);
- Anthropic messages, ``POST …/messages``;
- OpenAI image generation, ``POST …/images/generations``, answering ``{"data": [{"b64_json"}]}`` with a
  scripted reply's ``image`` bytes (``Reply(image=png)``);

each plain JSON or streamed (server-sent events) when the request body says ``"stream": true``,
exactly as the real services frame them (OpenAI ``data: {chunk}`` lines ending with
``data: [DONE]`` and, when asked with ``stream_options.include_usage``, a usage chunk; Anthropic
``message_start`` … ``message_stop`` events).

A test scripts the answers, in order::

    fake.script(
        Reply.tools(ToolCall("classify_ticket", {"text": "refund please"})),
        Reply(text="It is a billing ticket."),
    )

and afterwards reads ``fake.requests`` (method, path, lower-cased headers, JSON body) to check
what was sent: the key header, the tool schemas, the messages. When the script is used up the
server answers with ``default`` if one is set, otherwise 500 and the request is listed in
``fake.unscripted``: the ``fake_model`` fixture then fails the test at teardown (loudly, never a
silent pass). A reply can also be an HTTP error (``Reply.error(429, retry_after="1")``), a delay
before the answer (``delay_s``), a hang-up without an answer, explicit usage counts, or an answer
with no usage at all.

``FakeModelServer(tls=context)`` serves HTTPS with that server-side ``ssl.SSLContext``.

The server runs in its own threads (``http.server``), so it serves sync tests, trio tests and
daemon subprocesses alike; ``close()`` stops it, wakes any reply still sleeping in a delay and
joins every thread. ``python -m tests.fakes.model_server --text T`` serves one fixed answer
until killed (for benchmarks that want the fake out of their own process).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

__all__ = ["FakeModelServer", "Reply", "ToolCall", "RecordedRequest", "Api"]

Api = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class ToolCall:
    """One tool call in a scripted answer. ``arguments`` as a dict is JSON-encoded; a str is sent as is."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)

    def arguments_object(self) -> Any:
        return json.loads(self.arguments) if isinstance(self.arguments, str) else self.arguments


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    ``usage`` is (input_tokens, output_tokens); unset, the fake counts one token per 4 bytes of
    the request's messages and of the answer (never 0). ``no_usage`` leaves usage out entirely.
    ``delay_s`` waits before the response head; ``chunk_delay_s`` between streamed chunks.
    ``hangup`` closes the connection without answering; ``cut_after_events`` ends a streamed
    answer (closes the connection) after that many events; ``end_marker=False`` ends a stream
    cleanly but without ``data: [DONE]`` / ``message_stop``. ``pause_after_events`` with ``resume``
    (a ``threading.Event`` the test sets) sends that many events of a stream, then waits for the
    test: what a client shows before ``resume`` is set was streamed, whatever the timing. ``raw_body`` is sent as the whole 200
    answer, as is (a provider answering something malformed).
    """

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    status: int = 200
    retry_after: str | None = None
    delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    usage: tuple[int, int] | None = None
    no_usage: bool = False
    hangup: bool = False
    cut_after_events: int | None = None
    end_marker: bool = True
    pause_after_events: int | None = None
    resume: threading.Event | None = None
    error_message: str = "scripted error"
    raw_body: bytes | None = None
    image: bytes | None = None
    """The image an ``/images/generations`` request is answered with (base64 in ``data[0].b64_json``)."""

    @classmethod
    def tools(cls, *calls: ToolCall, text: str = "", **kw: Any) -> Reply:
        """An answer that calls one or several tools in one turn (optionally with some text)."""
        return cls(text=text, tool_calls=tuple(calls), **kw)

    @classmethod
    def error(cls, status: int, *, retry_after: str | None = None, message: str = "scripted error", **kw: Any) -> Reply:
        """An HTTP error in the provider's own error format, e.g. ``Reply.error(429, retry_after="1")``."""
        return cls(status=status, retry_after=retry_after, error_message=message, **kw)

    @classmethod
    def hang_up(cls, **kw: Any) -> Reply:
        return cls(hangup=True, **kw)


@dataclass(frozen=True)
class RecordedRequest:
    """What the fake received: ``headers`` keys are lower-case; ``body`` the parsed JSON (or None)."""

    method: str
    path: str
    api: Api | None
    headers: dict[str, str]
    body: Any
    raw: bytes

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list((self.body or {}).get("messages", []))

    @property
    def tool_names(self) -> list[str]:
        tools = (self.body or {}).get("tools") or []
        if self.api == "anthropic":
            return [tool["name"] for tool in tools]
        return [tool["function"]["name"] for tool in tools]


def _estimate_tokens(data: Any) -> int:
    return max(1, len(json.dumps(data, ensure_ascii=False).encode()) // 4)


def _pieces(text: str, size: int = 0) -> list[str]:
    """Text split the way a model streams it: word by word (or fixed-size for JSON arguments)."""
    if not text:
        return []
    if size:
        return [text[i : i + size] for i in range(0, len(text), size)]
    return re.findall(r"\s*\S+|\s+$", text)


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # close() joins them: no thread outlives the test
    block_on_close = True
    request_queue_size = 1024  # listen backlog: the default 5 resets a burst of 100 connections
    fake: FakeModelServer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
            self.fake.connections_seen += 1
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.connections_lock:
                self.connections.discard(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up or failed the TLS handshake: expected in hostile tests, kept, not printed."""
        import sys

        self.fake.handler_errors.append(repr(sys.exc_info()[1]))

    def hang_up_everyone(self) -> None:
        """End idle keep-alive connections, whose handler threads would otherwise wait for the client."""
        with self.connections_lock:
            for connection in self.connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # head and body are two writes: no 40 ms Nagle/delayed-ACK stall
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return

    # --- routing -----------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.rstrip("/").endswith("/models"):
            self._send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        else:
            self._send_json(404, {"error": {"message": f"no route GET {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        fake = self.server.fake
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        path = self.path.split("?", 1)[0]
        images = path.endswith("/images/generations")
        api: Api | None = (
            "openai" if path.endswith("/chat/completions") or images else "anthropic" if path.endswith("/messages") else None
        )
        recorded = RecordedRequest(
            method="POST",
            path=path,
            api=api,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            raw=raw,
        )
        reply = fake._take(recorded)
        if api is None:
            self._send_json(404, {"error": {"message": f"no route POST {path}"}})
            return
        if not isinstance(body, dict):
            self._send_error(api, 400, "request body is not a JSON object", None)
            return
        if reply is None:
            self._send_error(api, 500, f"fake model server: no scripted reply left for POST {path}", None)
            return
        if reply.delay_s and fake._stopping.wait(reply.delay_s):
            self.close_connection = True
            return
        if reply.hangup:
            self.close_connection = True
            return
        if reply.status != 200:
            self._send_error(api, reply.status, reply.error_message, reply.retry_after)
            return
        if reply.raw_body is not None:
            self._send_raw(reply.raw_body)
            return
        if images:
            encoded = base64.b64encode(reply.image or b"").decode("ascii")
            self._send_json(200, {"created": int(time.time()), "data": [{"b64_json": encoded}]})
            return
        usage = reply.usage or (_estimate_tokens(body.get("messages")), _estimate_tokens([reply.text, [c.arguments_json() for c in reply.tool_calls]]))
        model = str(body.get("model", "fake-model"))
        if body.get("stream"):
            self._stream(api, reply, model, usage, body)
        elif api == "openai":
            self._send_json(200, _openai_completion(reply, model, None if reply.no_usage else usage))
        else:
            self._send_json(200, _anthropic_message(reply, model, None if reply.no_usage else usage))

    # --- writing -----------------------------------------------------------------------------

    def _send_json(self, status: int, data: Any, extra: dict[str, str] | None = None) -> None:
        self._send_raw(json.dumps(data).encode(), status, extra)

    def _send_raw(self, payload: bytes, status: int = 200, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(payload)

    def _send_error(self, api: Api, status: int, message: str, retry_after: str | None) -> None:
        if api == "anthropic":
            kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
            data: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
        else:
            data = {"error": {"message": message, "type": "server_error" if status >= 500 else "invalid_request_error"}}
        self._send_json(status, data, {"retry-after": retry_after} if retry_after is not None else None)

    def _stream(self, api: Api, reply: Reply, model: str, usage: tuple[int, int], body: dict[str, Any]) -> None:
        """Server-sent events in HTTP/1.1 chunks on a kept-alive connection, as the real services send them."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        events = (
            _openai_stream(reply, model, usage, include_usage=bool((body.get("stream_options") or {}).get("include_usage")))
            if api == "openai"
            else _anthropic_stream(reply, model, usage)
        )
        stopping = self.server.fake._stopping
        try:
            if not reply.end_marker:
                events = events[:-1]
            for index, event in enumerate(events):
                if index == reply.cut_after_events or (index and reply.chunk_delay_s and stopping.wait(reply.chunk_delay_s)):
                    self.close_connection = True  # no terminating chunk: the client sees a cut stream
                    return
                if index == reply.pause_after_events and reply.resume is not None and not _paused(reply.resume, stopping):
                    self.close_connection = True  # the server closed while paused
                    return
                data = event.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def _paused(resume: threading.Event, stopping: threading.Event) -> bool:
    """Wait until the test sets ``resume`` (True) or the server closes (False)."""
    while not resume.wait(0.05):
        if stopping.is_set():
            return False
    return True


# --- the two wire formats ------------------------------------------------------------------------


def _openai_tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [
        {"id": call.id or f"call_{i}", "type": "function", "function": {"name": call.name, "arguments": call.arguments_json()}}
        for i, call in enumerate(reply.tool_calls)
    ]


def _openai_completion(reply: Reply, model: str, usage: tuple[int, int] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text if reply.text or not reply.tool_calls else None}
    if reply.tool_calls:
        message["tool_calls"] = _openai_tool_calls(reply)
    out: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
    }
    if usage is not None:
        out["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return out


def _openai_stream(reply: Reply, model: str, usage: tuple[int, int], *, include_usage: bool) -> list[str]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        data = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(data)}\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": piece}) for piece in _pieces(reply.text)]
    for index, call in enumerate(_openai_tool_calls(reply)):
        head = {"index": index, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": ""}}
        out.append(chunk({"tool_calls": [head]}))
        out += [chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                for piece in _pieces(call["function"]["arguments"], 7)]
    out.append(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
    if include_usage and not reply.no_usage:
        data = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [],
                "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}
        out.append(f"data: {json.dumps(data)}\n\n")
    out.append("data: [DONE]\n\n")
    return out


def _anthropic_blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    blocks += [
        {"type": "tool_use", "id": call.id or f"toolu_{i}", "name": call.name, "input": call.arguments_object()}
        for i, call in enumerate(reply.tool_calls)
    ]
    return blocks


def _anthropic_message(reply: Reply, model: str, usage: tuple[int, int] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _anthropic_blocks(reply),
        "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        "stop_sequence": None,
    }
    if usage is not None:
        out["usage"] = {"input_tokens": usage[0], "output_tokens": usage[1]}
    return out


def _anthropic_stream(reply: Reply, model: str, usage: tuple[int, int]) -> list[str]:
    def event(name: str, data: dict[str, Any]) -> str:
        return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

    start_usage = {} if reply.no_usage else {"usage": {"input_tokens": usage[0], "output_tokens": 1}}
    out = [
        event("message_start", {"message": {"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
                                             "content": [], "stop_reason": None, **start_usage}}),
        event("ping", {}),
    ]
    for index, block in enumerate(_anthropic_blocks(reply)):
        if block["type"] == "text":
            out.append(event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}))
            out += [event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": piece}})
                    for piece in _pieces(block["text"])]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            out.append(event("content_block_start", {"index": index, "content_block": start}))
            out += [event("content_block_delta", {"index": index, "delta": {"type": "input_json_delta", "partial_json": piece}})
                    for piece in _pieces(json.dumps(block["input"]), 7)]
        out.append(event("content_block_stop", {"index": index}))
    end_usage = {} if reply.no_usage else {"usage": {"output_tokens": usage[1]}}
    out.append(event("message_delta", {"delta": {"stop_reason": "tool_use" if reply.tool_calls else "end_turn",
                                                 "stop_sequence": None}, **end_usage}))
    out.append(event("message_stop", {}))
    return out


# --- the server ----------------------------------------------------------------------------------


class FakeModelServer:
    """A scripted provider on ``127.0.0.1:<random port>``; a context manager (or ``start``/``close``)."""

    def __init__(self, *, default: Reply | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.default = default
        self._tls = tls
        self.requests: list[RecordedRequest] = []
        self.unscripted: list[RecordedRequest] = []
        self.connections_seen = 0
        self.handler_errors: list[str] = []
        """TCP connections accepted so far (to check a client reuses its connections)."""
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle

    def start(self) -> FakeModelServer:
        server = _Server(("127.0.0.1", 0), _Handler)
        if self._tls is not None:
            server.socket = self._tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-model-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, wake replies sleeping in a delay, and join every handler thread."""
        if self._server is None:
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.hang_up_everyone()
        self._server.server_close()  # joins the handler threads (block_on_close)
        assert self._thread is not None
        self._thread.join(timeout=30)
        self._server = None

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # where it listens

    @property
    def port(self) -> int:
        assert self._server is not None, "FakeModelServer is not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (``https://`` when serving TLS; no path)."""
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: the base_url of a provider pointed at this fake."""
        return f"{self.url}/v1"

    def provider_toml(self, name: str, kind: Api = "openai", *, api_key_env: str | None = None,
                      timeout_s: float | None = None) -> str:
        """A ``[providers.NAME]`` table pointing at this fake, for a test's covenant.toml."""
        lines = [f"[providers.{name}]", f'kind = "{kind}"', f'base_url = "{self.base_url}"']
        if api_key_env:
            lines.append(f'api_key_env = "{api_key_env}"')
        if timeout_s is not None:
            lines.append(f"timeout_s = {timeout_s}")
        return "\n".join(lines) + "\n"

    # the script

    def script(self, *replies: Reply) -> None:
        """Append answers to the queue; each request takes the next one."""
        with self._lock:
            self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """Scripted answers not yet taken."""
        with self._lock:
            return len(self._queue)

    def wait_for_requests(self, count: int, timeout: float = 30.0) -> list[RecordedRequest]:
        """Block until at least ``count`` requests arrived (a sync helper; from trio use to_thread)."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"fake model server: {len(self.requests)} requests after {timeout} s, wanted {count}")
                self._arrived.wait(left)
            return list(self.requests)

    def _take(self, recorded: RecordedRequest) -> Reply | None:
        with self._arrived:
            self.requests.append(recorded)
            self._arrived.notify_all()
            if recorded.api is None:
                return None
            if self._queue:
                return self._queue.popleft()
            if self.default is None:
                self.unscripted.append(recorded)
            return self.default


def main() -> None:
    """Serve one fixed answer until killed; print the port on stdout when ready."""
    parser = argparse.ArgumentParser(description="covenant's fake model server with one fixed answer")
    parser.add_argument("--text", default="ok", help="the answer's text")
    parser.add_argument("--input-tokens", type=int, default=10)
    parser.add_argument("--output-tokens", type=int, default=5)
    parser.add_argument("--delay-s", type=float, default=0.0, help="wait this long before each answer")
    args = parser.parse_args()
    fake = FakeModelServer(default=Reply(text=args.text, usage=(args.input_tokens, args.output_tokens), delay_s=args.delay_s))
    fake.start()
    print(fake.port, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        fake.close()


if __name__ == "__main__":
    main()
