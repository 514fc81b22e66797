"""rune@web-search against a local SearXNG-compatible server, rune@channel-send to a local signed webhook.

Real daemon, real replica, the scripted fake model, real HTTP servers on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from tests.daemon.conftest import DaemonProcess, daemon  # noqa: F401 - the fixture
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import configure, outcome_of

from tests.conftest import rune_examples


class Recorder:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.status = 200


@pytest.fixture
def local_http() -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> bytes:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            recorder.requests.append((self.command, self.path, dict(self.headers), body))
            return body

        def do_GET(self) -> None:  # noqa: N802
            self._record()
            query = parse_qs(urlparse(self.path).query)
            answer = {"query": query.get("q", [""])[0], "results": [
                {"title": "Covenant", "url": "https://example.org/covenant", "content": "a supervisor for agents"},
                {"title": "no url"},
            ]}
            data = json.dumps(answer).encode() if query.get("format") == ["json"] else b"<html>"
            self.send_response(recorder.status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            self._record()
            self.send_response(recorder.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", recorder
    server.shutdown()
    server.server_close()


def _install(daemon: DaemonProcess, name: str) -> None:
    target = daemon.home / "agents" / name
    shutil.copytree(rune_examples() / name, target)
    for folder, _dirs, files in os.walk(target):
        os.chmod(folder, 0o755)
        for file in files:
            os.chmod(os.path.join(folder, file), 0o644)


def _tool_message(request, index: int = -1) -> dict:  # type: ignore[no-untyped-def]
    return json.loads([m for m in request.messages if m["role"] == "tool"][index]["content"])


def test_corpus_agents_report_missing_backends_then_search_through_a_local_searxng(
    daemon: DaemonProcess, fake_model: FakeModelServer, local_http: tuple[str, Recorder]
) -> None:
    base, recorder = local_http
    _install(daemon, "web-researcher")
    _install(daemon, "scheduled-reporter")
    configure(daemon, ("openai", fake_model))
    check = json.loads(daemon.cli("agents", "check", "--json").stdout)
    assert check["valid"] is True
    warned = [w["message"] for w in check["warnings"]]
    assert any("rune@web-search is unavailable here (needs [tools.web_search] url" in w for w in warned)
    listed = json.loads(daemon.cli("tools", "list", "web-researcher", "--json", check=True).stdout)["tools"]
    assert {t["entry"]: t["available"] for t in listed}["rune@web-search"] is False

    configure(daemon, ("openai", fake_model), extra=f'[tools.web_search]\nurl = "{base}/search"\n')
    listed = json.loads(daemon.cli("tools", "list", "--json", check=True).stdout)["tools"]
    available = {(t["agent"], t["entry"]): t["available"] for t in listed}
    assert available[("web-researcher@local", "rune@web-search")] is True
    assert available[("scheduled-reporter@local", "rune@web-search")] is True
    # With a search backend configured, only channel-send (no [channels.NAME] here) is still reported.
    unavailable = [e for (agent, e), ok in available.items() if agent == "scheduled-reporter@local" and not ok]
    assert unavailable == ["rune@channel-send"], available
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.*", check=True)
    fake_model.script(Reply.tools(ToolCall("web-search", {"query": "process supervisors"})), Reply(text="found it"))
    outcome = outcome_of(daemon.cli("dispatch", "research", "--agent", "web-researcher@local", "--json"))
    assert outcome["outcome"] == "ok" and outcome["text"] == "found it", outcome
    assert "web-search" in fake_model.requests[0].tool_names
    answer = _tool_message(fake_model.requests[1])
    assert answer == {"query": "process supervisors", "results": [
        {"title": "Covenant", "url": "https://example.org/covenant", "snippet": "a supervisor for agents"}]}
    [(method, path, _headers, _body)] = recorder.requests
    assert method == "GET" and parse_qs(urlparse(path).query) == {"q": ["process supervisors"], "format": ["json"]}
    recorder.status = 500
    fake_model.script(Reply.tools(ToolCall("web-search", {"query": "x"})), Reply(text="failed"))
    outcome = outcome_of(daemon.cli("dispatch", "again", "--agent", "web-researcher@local", "--json"))
    assert _tool_message(fake_model.requests[-1])["error"]["code"] == "tool_failed"
    assert daemon.stop() == 0


def test_channel_send_posts_an_hmac_signed_body(
    daemon: DaemonProcess, fake_model: FakeModelServer, local_http: tuple[str, Recorder]
) -> None:
    from tests.rune.conftest import add_rune_agent

    base, recorder = local_http
    secret = "whsec-" + os.urandom(8).hex()
    configure(daemon, ("fake", fake_model), extra=(
        '[channels.ops]\nurl_env = "OPS_HOOK_URL"\nsecret_env = "OPS_HOOK_KEY"\n'
        '[channels.unset]\nurl_env = "UNSET_HOOK_URL"\nsecret_env = "UNSET_HOOK_KEY"\n'))
    daemon.env.update(OPS_HOOK_URL=f"{base}/hook", OPS_HOOK_KEY=secret)
    add_rune_agent(daemon, "notifier", toolset=("rune@channel-send",))
    daemon.start()
    daemon.cli("grant", "tester@test", "tool.channel_send", check=True)
    fake_model.script(
        Reply.tools(ToolCall("channel-send", {"channel": "ops", "text": "deploy done"})),
        Reply.tools(ToolCall("channel-send", {"channel": "unset", "text": "x"})),
        Reply.tools(ToolCall("channel-send", {"channel": "nope", "text": "x"})),
        Reply(text="sent"),
    )
    outcome = outcome_of(daemon.cli("dispatch", "tell ops", "--agent", "notifier@local", "--json"))
    assert outcome["outcome"] == "ok", outcome
    assert _tool_message(fake_model.requests[1]) == {"sent": True, "channel": "ops", "status": 200}
    assert _tool_message(fake_model.requests[2])["error"]["code"] == "tool_unavailable"
    assert _tool_message(fake_model.requests[3])["error"]["code"] == "invalid_arguments"
    [(method, path, headers, body)] = recorder.requests
    assert method == "POST" and path == "/hook"
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    assert headers["X-Covenant-Signature"] == expected
    sent = json.loads(body)
    assert sent["text"] == "deploy done" and sent["agent"] == "notifier@local" and sent["intent"] == outcome["intent_id"]
    assert secret.encode() not in body
    assert daemon.stop() == 0
