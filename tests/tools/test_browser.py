"""rune@browser-* on the distribution's headless Chromium, through a real daemon and a real Rune agent.

The page is served by a web server in a network namespace of the test's own behind a veth pair
("the internet", tests/veth.py); the browser runs as the agent's uid in its own namespace and reaches
it through the agent's network. One daemon and one fake model serve the whole module. Hostile cases:
the host's loopback (a listener there must see no connection) by navigation, by a redirect of the
allowed site and by the page's own script; a runner killed under the browser; no Chromium of the
agent's uid left after any end (close, intent end, idle).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.daemon.conftest import DaemonProcess, daemon_home
from tests.fakes import FakeModelServer, Reply, ToolCall
from tests.rune.conftest import add_rune_agent, configure, outcome_of
from tests.veth import Internet, far_namespace

_SERVE = r"""
import http.server, sys
far, trap = sys.argv[1], sys.argv[2]
PAGE = b'''<!doctype html><html><head><title>Order form</title></head><body>
<h1>Orders</h1>
<form><input id="name" name="name"><button id="go" type="button"
 onclick="document.getElementById('out').innerText = 'Hello ' + document.getElementById('name').value">Greet</button></form>
<p id="out">nobody yet</p>
<a id="next" href="/next.html">the next page</a>
<script>setTimeout(() => { const e = document.createElement('div'); e.id = 'late'; e.innerText = 'late';
 document.body.appendChild(e); }, 300);</script>
<div style="height: 4000px">tall</div>
</body></html>'''
PAGES = {"/page.html": PAGE, "/next.html": b"<html><title>Next</title><body>second page</body></html>"}

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def do_GET(self):
        if self.path == "/away":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{trap}/stolen")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = PAGES.get(self.path)
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

server = http.server.ThreadingHTTPServer((far, 8080), Handler)
print("serving", flush=True)
server.serve_forever()
"""

TOOLSET = tuple(f"rune@browser-{name}" for name in (
    "navigate", "click", "type", "screenshot", "read-page", "close", "scroll", "wait", "run-js", "back"))
_IDLE_S = 600
"""Long enough that no browser idles out by accident; the idle test reloads a short one."""


@dataclass
class Site:
    daemon: DaemonProcess
    model: FakeModelServer
    web: Internet
    trap: socket.socket
    """A listener on the host's loopback: the browser must never reach it."""

    @property
    def page(self) -> str:
        return f"http://{self.web.far}:8080/page.html"

    def run(self, *replies: Reply, session: str | None = None) -> tuple[dict[str, Any], list[Any]]:
        """Dispatch to the surfer with the model scripted to ``replies``; the outcome and the tool results in order."""
        self.model.script(*replies)
        before = len(self.model.requests)
        extra = ("--session", session) if session else ()
        outcome = outcome_of(self.daemon.cli("dispatch", "browse", "--agent", "surfer@local", *extra, "--json"))
        last = self.model.requests[len(self.model.requests) - 1]
        assert len(self.model.requests) - before == len(replies), outcome
        messages = last.messages
        asked = max(i for i, m in enumerate(messages) if m["role"] == "user")  # a session's history comes before
        results = [json.loads(m["content"]) for m in messages[asked:] if m["role"] == "tool"]
        return outcome, results


def _chromium_of(d: DaemonProcess) -> list[psutil.Process]:
    """Live Chromium processes (and browser runners) of the daemon's agent uids."""
    low, high = d.uid_range
    found = []
    for process in psutil.process_iter(["uids", "cmdline"]):
        uids, cmdline = process.info.get("uids"), " ".join(process.info.get("cmdline") or ())
        if uids and low <= uids.real < high and ("chromium" in cmdline or "browser_runner" in cmdline):
            found.append(process)
    return found


def _netns(pid: int) -> str | None:
    """The network namespace of a process, None once it is gone (Chromium starts and ends helpers)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except FileNotFoundError:
        return None


def _until_none_left(d: DaemonProcess, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while _chromium_of(d):
        assert time.monotonic() < deadline, [p.info for p in _chromium_of(d)]
        time.sleep(0.1)


def _trap_untouched(trap: socket.socket) -> None:
    trap.setblocking(False)
    with pytest.raises(BlockingIOError):
        trap.accept()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if shutil.which("chromium") is None:
        pytest.skip("needs chromium (apt-get install chromium)")
    with socket.create_server(("127.0.0.1", 0)) as trap:
        trap.listen(16)
        port = trap.getsockname()[1]
        with far_namespace("w", 214, _SERVE, str(port)) as web, FakeModelServer() as model, \
                daemon_home(tmp_path_factory.mktemp("browser")) as d:
            configure(d, ("fake", model), extra=f"""
[tools.browser]
network = "full"
allow = ["{web.far}"]
idle_s = {_IDLE_S}
max_per_agent = 1
""")
            add_rune_agent(d, "surfer", toolset=TOOLSET, max_steps=16)
            d.start()
            d.cli("grant", "tester@test", "tool.*", check=True)
            yield Site(d, model, web, trap)
            _until_none_left(d)
            assert d.stop() == 0
            assert not _chromium_of(d)


def test_a_session_drives_a_real_page_and_keeps_its_browser_until_closed(site: Site, tmp_path: Path) -> None:
    outcome, results = site.run(
        Reply.tools(ToolCall("browser-navigate", {"url": site.page})),
        Reply.tools(ToolCall("browser-read-page", {})),
        Reply.tools(ToolCall("browser-type", {"selector": "#name", "text": "Ada"})),
        Reply.tools(ToolCall("browser-click", {"selector": "#go"})),
        Reply.tools(ToolCall("browser-run-js", {"expression": "document.getElementById('out').innerText"})),
        Reply.tools(ToolCall("browser-wait", {"selector": "#late", "timeout_ms": 5000})),
        Reply.tools(ToolCall("browser-scroll", {"direction": "down", "amount": 500})),
        Reply.tools(ToolCall("browser-screenshot", {})),
        Reply.tools(ToolCall("browser-click", {"selector": "the next page"})),  # the reference's "visible text"
        Reply.tools(ToolCall("browser-back", {})),
        Reply.tools(ToolCall("browser-click", {"selector": "#missing"})),
        Reply.tools(ToolCall("browser-run-js", {"expression": "null.x"})),
        Reply(text="Browsed."),
        session="s-drive",
    )
    assert outcome["outcome"] == "ok", outcome
    (navigated, read, typed, clicked, value, waited, scrolled, shot, linked, back, missing, thrown) = results
    assert navigated == {"url": site.page, "title": "Order form"}
    assert read["title"] == "Order form" and "nobody yet" in read["text"] and read["truncated"] is False
    assert typed["typed"] == 3 and clicked["clicked"] == "#go"
    assert value == {"value": "Hello Ada", "truncated": False}
    assert waited["found"] is True
    assert scrolled["y"] == 500
    assert linked["title"] == "Next" and back == {"moved": True, "url": site.page, "title": "Order form"}
    assert missing["error"]["code"] == "element_not_found"
    assert thrown["error"]["code"] == "tool_failed" and "TypeError" in thrown["error"]["message"]

    # The screenshot is an artifact of the intent: in its record, and saved by `covenant show --save`.
    artifact = shot["artifact"]
    assert artifact["name"] == "screenshot.png" and artifact["media_type"] == "image/png"
    record = site.daemon.api("GET", f"/v1/dispatches/{outcome['intent_id']}")
    assert record["artifacts"] == [artifact]  # type: ignore[index]
    site.daemon.cli("show", outcome["intent_id"], "--save", str(tmp_path), check=True)
    png = (tmp_path / "screenshot.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and hashlib.sha256(png).hexdigest() == artifact["sha256"]

    # The session's browser outlives the intent: the next dispatch of the session finds the page as it was.
    # Chromium runs as the agent's uid (what _chromium_of looks for), off the host's network namespace.
    namespaces = {_netns(p.pid) for p in _chromium_of(site.daemon)} - {None}
    assert namespaces and os.readlink("/proc/self/ns/net") not in namespaces
    # In the agent's class (resource_profile small: nice 10; Chromium may only lower its renderers' priority more).
    nices = {p.pid: p.nice() for p in _chromium_of(site.daemon)}
    assert nices and all(nice >= 10 for nice in nices.values()), nices
    _, (again, closed, closed_twice) = site.run(
        Reply.tools(ToolCall("browser-run-js", {"expression": "document.getElementById('out').innerText"})),
        Reply.tools(ToolCall("browser-close", {})),
        Reply.tools(ToolCall("browser-close", {})),
        Reply(text="Closed."),
        session="s-drive",
    )
    assert again["value"] == "Hello Ada" and closed == {"closed": True} and closed_twice == {"closed": False}
    assert not _chromium_of(site.daemon)  # browser-close waits until Chromium's whole tree is gone

    # Stopping the agent closes its browsers (its replica stops for good).
    config = site.daemon.home / "covenant.toml"
    before = config.read_text()
    try:
        site.run(Reply.tools(ToolCall("browser-navigate", {"url": site.page})), Reply(text="."), session="s-stop")
        assert _chromium_of(site.daemon)
        site.daemon.cli("stop", "surfer@local", check=True)
        _until_none_left(site.daemon)
        site.daemon.cli("start", "surfer@local", check=True)
        # A reload that changes the navigation rules closes the open browsers: none keeps the old ones.
        site.run(Reply.tools(ToolCall("browser-navigate", {"url": site.page})), Reply(text="."), session="s-stop")
        assert _chromium_of(site.daemon)
        config.write_text(config.read_text().replace("allow = [", 'allow = ["192.0.2.1", '))
        site.daemon.cli("reload", check=True)
        _until_none_left(site.daemon)
    finally:
        config.write_text(before)
        site.daemon.cli("reload", check=True)


def test_the_host_loopback_is_never_reached_and_an_intent_browser_ends_with_its_intent(site: Site) -> None:
    port = site.trap.getsockname()[1]
    outcome, (together, read_together, direct, redirected, scripted, other) = site.run(
        # Two calls of one turn run at once: the second waits for the browser the first starts.
        Reply.tools(ToolCall("browser-run-js", {"expression": "1 + 1"}), ToolCall("browser-read-page", {})),
        Reply.tools(ToolCall("browser-navigate", {"url": f"http://127.0.0.1:{port}/"})),
        Reply.tools(ToolCall("browser-navigate", {"url": f"http://{site.web.far}:8080/away"})),
        Reply.tools(ToolCall("browser-run-js", {"expression":
                    f"fetch('http://127.0.0.1:{port}/').then(() => 'reached', e => 'refused: ' + e)"})),
        Reply.tools(ToolCall("browser-navigate", {"url": "file:///etc/passwd"})),
        Reply(text="Tried."),
    )
    assert outcome["outcome"] == "ok", outcome
    assert together == {"value": 2, "truncated": False} and read_together["url"] == "about:blank", (together, read_together)
    assert direct["error"]["code"] == "address_refused" and "loopback" in direct["error"]["message"]
    assert redirected["error"]["code"] == "address_refused", redirected
    assert f"127.0.0.1:{port}" in redirected["error"]["message"] and "[tools.browser] allow" in redirected["error"]["message"]
    assert str(scripted.get("value")).startswith("refused: "), scripted
    assert other["error"]["code"] == "address_refused" and "http and https" in other["error"]["message"]
    _trap_untouched(site.trap)
    assert not _chromium_of(site.daemon)  # no session: the browser ended with the intent


def test_a_killed_runner_fails_clearly_and_an_idle_browser_is_closed(site: Site) -> None:
    _, (navigated,) = site.run(Reply.tools(ToolCall("browser-navigate", {"url": site.page})), Reply(text="."),
                               session="s-kill")
    assert navigated["title"] == "Order form", navigated
    # At most [tools.browser] max_per_agent (1 here): another session's browser is refused while this one lives.
    _, (limited,) = site.run(Reply.tools(ToolCall("browser-read-page", {})), Reply(text="."), session="s-other")
    assert limited["error"]["code"] == "browser_limit", limited
    killed = _chromium_of(site.daemon)
    (runner,) = [p for p in killed if "browser_runner" in " ".join(p.cmdline())]
    os.kill(runner.pid, signal.SIGKILL)
    _, (failed, fresh, big_value, big_page) = site.run(
        Reply.tools(ToolCall("browser-read-page", {})),
        Reply.tools(ToolCall("browser-run-js", {"expression": "location.href"})),
        Reply.tools(ToolCall("browser-run-js", {"expression": "document.body.innerText = 'é'.repeat(200000)"})),
        Reply.tools(ToolCall("browser-read-page", {})),
        Reply(text="."), session="s-kill",
    )
    assert failed["error"]["code"] == "tool_failed" and "next call starts a fresh browser" in failed["error"]["message"]
    assert fresh == {"value": "about:blank", "truncated": False}  # a fresh browser, not the killed one's page
    # Past text_max_chars, and past what one tool result holds (64 KiB of JSON): cut, and said so.
    assert big_value["truncated"] is True and big_value["value"].startswith('"éé'), str(big_value)[:200]  # its JSON text
    assert big_page["truncated"] is True and big_page["chars"] == 200000 and big_page["text"].startswith("éé")
    assert len(json.dumps(big_page, ensure_ascii=False, separators=(",", ":")).encode()) <= 64 * 1024
    alive = _chromium_of(site.daemon)
    assert alive and not {p.pid for p in alive} & {p.pid for p in killed}  # the killed browser's tree is gone, and
    config = site.daemon.home / "covenant.toml"
    before = config.read_text()
    # the session's fresh browser outlives the intent…
    config.write_text(before.replace(f"idle_s = {_IDLE_S}", "idle_s = 1"))  # (applies to open browsers at once)
    site.daemon.cli("reload", check=True)
    try:
        _until_none_left(site.daemon)  # …until [tools.browser] idle_s without a call
    finally:
        config.write_text(before)
        site.daemon.cli("reload", check=True)

    # A page script that never returns: the call ends at [tools.browser] timeout_ms (live on reload; 9 s a call with
    # the runner's margin, room for a fresh Chromium to start on a loaded box), the stuck
    # browser is closed, and the next call gets a fresh one that answers, under the caps of the reloaded
    # configuration (a screenshot over screenshot_max_kb is refused, saying which key).
    config.write_text(before.replace("[tools.browser]", "[tools.browser]\ntimeout_ms = 8000\nscreenshot_max_kb = 1"))
    site.daemon.cli("reload", check=True)
    try:
        _, (hung, waited, after, too_big, closed) = site.run(
            Reply.tools(ToolCall("browser-run-js", {"expression": "while (true) {}"})),
            Reply.tools(ToolCall("browser-wait", {"selector": "#never", "timeout_ms": 200})),
            Reply.tools(ToolCall("browser-run-js", {"expression": "6 * 7"})),
            Reply.tools(ToolCall("browser-screenshot", {})),
            Reply.tools(ToolCall("browser-close", {})),
            Reply(text="."), session="s-hang",
        )
    finally:
        config.write_text(before)
        site.daemon.cli("reload", check=True)
    assert hung["error"]["code"] == "tool_timeout" and "next call starts a fresh one" in hung["error"]["message"], hung
    assert waited["found"] is False, waited  # a bounded wait for what never comes
    assert after == {"value": 42, "truncated": False}, after
    assert too_big["error"]["code"] == "tool_failed" and "screenshot_max_kb" in too_big["error"]["message"], too_big
    assert closed == {"closed": True}, closed  # the fresh browser; the stuck one was gone already
    assert not _chromium_of(site.daemon)  # nothing of either is left
    logged = site.daemon.log()
    assert "Traceback" not in logged, logged[-3000:]


def test_without_chromium_the_browser_tools_say_what_to_install(site: Site) -> None:
    home = site.daemon.home
    config = (home / "covenant.toml").read_text()
    (home / "covenant.toml").write_text(config.replace("[tools.browser]", '[tools.browser]\nchromium = "no-such-chromium"'))
    try:
        listed = json.loads(site.daemon.cli("tools", "list", "--builtins", "--json", check=True).stdout)["builtins"]
    finally:
        (home / "covenant.toml").write_text(config)
    browser = [b for b in listed if b["entry"].startswith("rune@browser-")]
    assert len(browser) == 10 and all(not b["available"] for b in browser), browser
    assert all("apt-get install chromium" in b["reason"] for b in browser), browser

