"""Tool schemas named by URL: fetched by the daemon under the web-fetch address rules, cached, pinned by sha256
(issue 37 item 6). A real daemon, a real process tool, a real HTTP server on 127.0.0.1 serving the schema."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of

SCHEMA = json.dumps({"type": "object", "properties": {"texts": {"type": "array", "items": {"type": "string"}}},
                     "required": ["texts"], "additionalProperties": False}).encode()
PIN = hashlib.sha256(SCHEMA).hexdigest()
ECHO = "import json, sys\nprint(json.dumps({'got': json.load(sys.stdin)}))\n"


class SchemaServer:
    def __init__(self) -> None:
        self.body = SCHEMA
        self.hits = 0


@pytest.fixture
def schema_server() -> Iterator[tuple[str, SchemaServer]]:
    state = SchemaServer()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            state.hits += 1
            self.send_response(200)
            self.send_header("Content-Type", "application/schema+json")
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()


def _package(daemon: DaemonProcess, name: str, ref: str) -> None:
    folder = add_rune_agent(daemon, name, toolset=("rune@system-time", "echo_tool"))
    tools = folder / "tools"
    tools.mkdir(mode=0o755)
    (tools / "echo_tool.yaml").write_text(f"name: echo_tool\nruntime: process\nmodule: tools/echo_tool.py\n"
                                          f"input_schema_ref: {ref}\n")
    (tools / "echo_tool.py").write_text(ECHO)
    for path in tools.iterdir():
        path.chmod(0o644)


def _dry_run_reasons(daemon: DaemonProcess, agent: str) -> dict[str, str]:
    plan = json.loads(daemon.cli("dispatch", "x", "--agent", agent, "--dry-run", "--json", check=True).stdout)
    return {t["tool"]: t["reason"] for t in plan["rune"]["unavailable_tools"]}


def test_a_schema_url_is_fetched_cached_pinned_and_held_to_the_address_rules(
    daemon: DaemonProcess, fake_model: FakeModelServer, schema_server: tuple[str, SchemaServer]
) -> None:
    base, served = schema_server
    _package(daemon, "pinned", f"{base}/echo.json#sha256={PIN}")
    _package(daemon, "mismatched", f"{base}/echo.json#sha256={hashlib.sha256(b'another document').hexdigest()}")
    _package(daemon, "badpin", f"{base}/echo.json#md5=abc")
    # The test server is on the host's loopback: refused unless [tools.web_fetch] allow lists it.
    configure(daemon, ("fake", fake_model))
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    refused = _dry_run_reasons(daemon, "pinned@local")
    assert "loopback" in refused["echo_tool"] and "[tools.web_fetch] allow" in refused["echo_tool"], refused
    assert served.hits == 0  # refused before any connection
    assert daemon.stop() == 0

    configure(daemon, ("fake", fake_model), extra='[tools.web_fetch]\nallow = ["127.0.0.1"]\n')
    daemon.start()
    assert _dry_run_reasons(daemon, "pinned@local") == {}
    mismatch = _dry_run_reasons(daemon, "mismatched@local")["echo_tool"]
    assert f"its SHA-256 is {PIN}" in mismatch and "not the pinned" in mismatch, mismatch
    assert "#sha256=<64 lowercase hex>" in _dry_run_reasons(daemon, "badpin@local")["echo_tool"]
    fake_model.script(
        Reply.tools(ToolCall("echo_tool", {"texts": ["a", "b"]})),
        Reply.tools(ToolCall("echo_tool", {"text": "not the schema's shape"})),
        Reply(text="done"),
    )
    outcome = outcome_of(daemon.cli("dispatch", "echo", "--agent", "pinned@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    offered = {t["function"]["name"]: t["function"]["parameters"] for t in fake_model.requests[0].body["tools"]}
    assert offered["echo_tool"] == json.loads(SCHEMA)
    answers = [json.loads([m for m in r.messages if m["role"] == "tool"][-1]["content"]) for r in fake_model.requests[1:3]]
    assert answers[0] == {"got": {"texts": ["a", "b"]}}
    assert answers[1]["error"]["code"] == "invalid_arguments"
    cached = daemon.home / "state" / "schema-cache" / f"{PIN}.json"
    assert cached.read_bytes() == SCHEMA and (cached.stat().st_mode & 0o077) == 0
    hits = served.hits
    assert daemon.stop() == 0

    # A pinned copy is used as kept: the server now answers something else, and is not even asked.
    served.body = b'{"type": "object"}'
    daemon.start()
    assert _dry_run_reasons(daemon, "pinned@local") == {}
    assert served.hits == hits  # the pinned copy was kept: the server is not asked
    assert "not the pinned" in _dry_run_reasons(daemon, "mismatched@local")["echo_tool"]
    assert served.hits == hits + 1  # a mismatching document is never kept: asked again, refused again
    assert [p.name for p in (daemon.home / "state" / "schema-cache").iterdir()] == [f"{PIN}.json"]
    assert daemon.stop() == 0
