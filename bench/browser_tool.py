"""Browser tool calls: ``ToolHost.call`` of ``rune@browser-read-page`` against the same read done directly.

Issue 37's figure: a browser-read-page of a local page, p50, over the same work done directly; goal
<= 50 ms added. The page (a heading, a form, a link and ~8 KB of text) is served on 127.0.0.1 and
loaded once on each side; then read-page is measured, the two sides interleaved in blocks of five so
load from elsewhere on the box hits both alike.

The direct side is covenant's browser runner (its own DevTools client over the pipe) driving the same
Chromium, started from a plain ``subprocess.Popen`` as this user and asked with the same request line:
the work of the read itself. The hosted side is everything a Rune agent's call costs the daemon on top:
name lookup, argument validation, the grant check, the browser registry, the request and answer through
the runner's tool mode (the agent's uid, its private /tmp, the Landlock ruleset, limits, sampler) and
the ``tool.call`` event (to an in-memory sink). The agent's browser runs in the agent uid's network
namespace (``full``), which reaches the page only because ``[isolation] host_allow`` lists its port (at
10.0.2.2, and ``[tools.browser] allow`` that address); the direct one reaches it on 127.0.0.1. Needs root, chromium, slirp4netns and nft.

    sudo .venv/bin/python bench/browser_tool.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from covenant.clock import now_ms  # noqa: E402
from covenant.config import BrowserToolConfig, Config, IsolationConfig, ToolsConfig  # noqa: E402
from covenant.home import Home  # noqa: E402
from covenant.homeinit import init_home  # noqa: E402
from covenant.keys import load_private_key, public_key_hex  # noqa: E402
from covenant.manifest.runefile import load_rune_package  # noqa: E402
from covenant.policy.grants import GrantStore  # noqa: E402
from covenant.runtime.isolation import open_isolation  # noqa: E402
from covenant.runtime.runner import Runner  # noqa: E402
from covenant.tools import ToolCallContext, ToolHost  # noqa: E402
from covenant.tools.builtins.browser import RUNNER  # noqa: E402

BLOCK = 5
RANGE = (703000, 703999)
HOST_ALIAS = "10.0.2.2"
"""The host as an agent's namespace reaches it (slirp4netns), for the services ``[isolation] host_allow`` lists."""
PAGE = ("<!doctype html><html><head><title>Bench page</title></head><body><h1>Orders</h1>"
        "<form><input id='name'><button type='button'>Go</button></form><a href='/'>again</a>"
        + "".join(f"<p>Paragraph {i}: the quick brown fox jumps over the lazy dog.</p>" for i in range(150))
        + "</body></html>").encode()
RUNEFILE = """\
name: bench
version: 0.1.0
instructions: bench
default_model: default
toolset: [rune@browser-navigate, rune@browser-read-page]
models:
  model_mapping:
    default: m
"""


class Page(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)


class DirectBrowser:
    """The runner driving Chromium with no covenant around it."""

    def __init__(self, start: dict[str, Any], url: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-I", RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir())
        assert "ok" in self.ask(start), "the runner did not start"
        assert self.ask({"op": "navigate", "url": url})["ok"]["title"] == "Bench page"

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def read_once(self) -> float:
        started = time.perf_counter()
        answer = self.ask({"op": "read", "timeout_s": 30})
        elapsed = time.perf_counter() - started
        assert answer["ok"]["title"] == "Bench page", answer
        return elapsed

    def close(self) -> None:
        self.ask({"op": "close"})
        self.process.wait(timeout=30)


async def measure(root: Path, runs: int, port: int, chromium: str) -> dict[str, float]:
    home = Home(root / "home")
    home.root.mkdir()
    init_home(home)
    url, agent_url = f"http://127.0.0.1:{port}/", f"http://{HOST_ALIAS}:{port}/"
    browser = BrowserToolConfig(chromium=chromium, network="full", allow=(HOST_ALIAS,))
    config = Config(tools=ToolsConfig(browser=browser))
    daemon_key = load_private_key(home.daemon_key_path)
    issuer = public_key_hex(Ed25519PrivateKey.generate())
    store = GrantStore(home.grants_path, daemon_key.public_key())
    store.add(daemon_key, issuer, ["tool.*"], None, None)
    grants = store.load()
    package = home.root / "agents" / "bench"
    package.mkdir(parents=True, mode=0o755)
    (package / "Runefile").write_text(RUNEFILE)
    agent = load_rune_package(package).to_agent_spec()

    async def sink(type_: str, data: dict[str, Any]) -> None:
        pass

    start = {"op": "start", "chromium": chromium, "allow": ["127.0.0.1"], "network": "full",
             "data_mb": browser.memory_mb, "text_max_chars": browser.text_max_chars,
             "screenshot_max_bytes": browser.screenshot_max_kb * 1024}
    direct = DirectBrowser(start, url)
    isolation = open_isolation(IsolationConfig(uid_range=RANGE, host_allow=(f"127.0.0.1:{port}",)), home.state_dir)
    try:
        async with Runner.open(config.runtime, scratch_root=home.state_dir / "scratch", isolation=isolation) as runner:
            host = ToolHost(home, config, runner, sink)
            await host.load(agent)
            ctx = ToolCallContext("bench-intent", agent, issuer, grants, now_ms(), trio.current_time() + 3600,
                                  session_id="bench")

            async def hosted(name: str, arguments: dict[str, Any]) -> tuple[float, Any]:
                started = time.perf_counter()
                result = await host.call(ctx, name, arguments)
                elapsed = time.perf_counter() - started
                assert result.ok, result
                return elapsed, result

            first, _ = await hosted("browser-navigate", {"url": agent_url})  # starts the agent's browser
            for _ in range(3):
                direct.read_once()
                await hosted("browser-read-page", {})
            raw: list[float] = []
            through_host: list[float] = []
            while len(raw) < runs:
                raw.extend(direct.read_once() for _ in range(BLOCK))
                for _ in range(BLOCK):
                    through_host.append((await hosted("browser-read-page", {}))[0])
            await host.services.browsers.agent_stopped(agent.id)
    finally:
        direct.close()
    return {"direct_p50": statistics.median(raw), "host_p50": statistics.median(through_host),
            "first_navigate": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the browser runs as an agent uid")
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("needs chromium (apt-get install chromium)")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="covenant-bench-") as tmp:
        os.chmod(tmp, 0o755)  # agent uids reach the package through it
        out = trio.run(measure, Path(tmp), args.runs, server.server_address[1], chromium)
    server.shutdown()
    added_ms = (out["host_p50"] - out["direct_p50"]) * 1000
    print(f"{platform.node()} python {platform.python_version()}, 1-minute load {load:.1f}, {args.runs} reads each side")
    print(f"browser-read-page of a local page ({len(PAGE)} bytes of HTML)")
    print(f"  direct (runner + chromium, no covenant)  p50 {out['direct_p50'] * 1000:7.2f} ms")
    print(f"  through ToolHost.call                    p50 {out['host_p50'] * 1000:7.2f} ms")
    print(f"  added                                        {added_ms:+7.2f} ms   (goal <= 50 ms)")
    print(f"  first call (starts the agent's browser, navigates) {out['first_navigate'] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
