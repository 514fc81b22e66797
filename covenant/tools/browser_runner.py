"""Drives one headless Chromium for the browser tools, as the agent, over the DevTools protocol on a pipe.

Started by the tool runner (the agent's uid, its network namespace, its Landlock rules, its scratch dir
as ``TMPDIR``) as ``python -I browser_runner.py``, never inside the daemon; it imports only the standard
library. It starts Chromium with ``--remote-debugging-pipe``: the protocol runs over fds 3 (commands
in) and 4 (answers and events out), one JSON message each, ended by a NUL byte. No port is opened, so
no other process of the agent's uid or namespace can drive this browser.

Stdin carries one JSON line per request from the daemon (:mod:`covenant.tools.browsers`), stdout one
JSON line per answer, ``{"ok": {...}}`` or ``{"error": {"code", "message"}}``. The first request is
``{"op": "start", ...}`` (Chromium's path, the navigation rules, the caps); the runner ends when stdin
ends, after ``{"op": "close"}`` or when Chromium exits.

Every request Chromium makes (navigations, redirects, subresources, what page scripts fetch) is
paused by the protocol's ``Fetch`` domain and let through only when the navigation rules allow its
address: the same rules as ``rune@web-fetch`` (:mod:`covenant.netpolicy`, restated here because
covenant's package is not on this interpreter's path). The network namespace stays the hard boundary.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ipaddress
import json
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any
from urllib.parse import urlsplit

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.05
_RESOLVED_S = 30.0
"""How long a host name's checked addresses are reused for the requests of one page."""


_NOISE = ("dbus", "crashpad", "cpufreq")
"""Lines of Chromium's stderr that every headless start on a server writes, never why it exited."""


class Refusal(Exception):
    """A request refused or failed: its error answer. ``browser_gone``: Chromium is gone or stuck, so the runner
    ends after answering (``"closed": true`` in the answer), and the daemon starts a fresh browser at the next call."""

    def __init__(self, code: str, message: str, *, browser_gone: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.browser_gone = browser_gone


# -- the navigation rules (those of covenant.netpolicy and rune@web-fetch) -------------------------------


def _embedded_v4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


class Rules:
    """``[tools.browser] allow`` and the agent's network mode, judging one URL at a time."""

    def __init__(self, allow: list[str], network: str) -> None:
        self.hosts: set[str] = set()
        self.networks: list[Any] = []
        for entry in allow:
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self.hosts.add(entry.lower().rstrip("."))
        self.network = network
        self._resolved: dict[tuple[str, int], tuple[float, list[str]]] = {}

    def _listed(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        judged = _embedded_v4(ip)
        return any(a.version == n.version and a in n for n in self.networks for a in (ip, judged))

    def _refusal(self, address: str) -> str | None:
        if self._listed(address):
            return None
        judged = _embedded_v4(ipaddress.ip_address(address.split("%", 1)[0]))
        if judged.is_global and not judged.is_multicast:
            return None
        kind = ("loopback" if judged.is_loopback else "link-local" if judged.is_link_local
                else "private" if judged.is_private else "multicast" if judged.is_multicast else "special-purpose")
        return f"{address} is a {kind} address"

    def _addresses(self, host: str, port: int) -> list[str]:
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            pass
        cached = self._resolved.get((host, port))
        if cached is not None and time.monotonic() - cached[0] < _RESOLVED_S:
            return cached[1]
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise Refusal("fetch_failed", f"cannot resolve {host!r}: {exc.strerror or exc}") from None
        found = list(dict.fromkeys(str(info[4][0]) for info in infos))
        self._resolved[(host, port)] = (time.monotonic(), found)
        return found

    def refusal(self, url: str) -> str | None:
        """Why the browser may not request ``url``, or None."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return f"{url[:200]} is not a URL"
        if parts.scheme not in ("http", "https"):
            return f"only http and https are reached, not {parts.scheme or 'a relative URL'}"
        if self.network == "off":
            return "this browser's network is off"
        host = (parts.hostname or "").rstrip(".")
        if not host:
            return f"{url[:200]} names no host"
        listed = host.lower() in self.hosts
        try:
            addresses = self._addresses(host, port or (443 if parts.scheme == "https" else 80))
        except Refusal as exc:
            return exc.message
        if not addresses:
            return f"{host!r} resolved to no address"
        if not listed:
            for address in addresses:
                why = self._refusal(address)
                if why is not None:
                    return f"{host} resolves to {why}; refused unless covenant.toml lists it in [tools.browser] allow"
        if parts.scheme == "http" and self.network != "full" and not (listed or all(self._listed(a) for a in addresses)):
            return "the network is outbound-https-only, so http is refused (use https, or list the host in [tools.browser] allow)"
        return None


# -- the DevTools protocol over the pipe ---------------------------------------------------------------


class Browser:
    """One Chromium, one page, and the request interception that applies the rules to all it loads."""

    def __init__(self, start: dict[str, Any]) -> None:
        self.rules = Rules(list(start.get("allow") or []), str(start.get("network") or "outbound-https-only"))
        self.text_max = int(start["text_max_chars"])
        self.shot_max = int(start["screenshot_max_bytes"])
        self.refused: list[str] = []
        """URLs refused since the current request began (their reasons), for its answer."""
        self._next_id = 0
        self._buffer = b""
        self._profile = tempfile.mkdtemp(prefix="covenant-browser-")
        self._log = os.path.join(tempfile.gettempdir(), f"{os.path.basename(self._profile)}.log")
        """Chromium's stderr: its last line says why it exited."""
        self._process = self._launch(str(start["chromium"]), int(start["data_mb"]), start.get("width", 1280),
                                     start.get("height", 800))
        deadline = time.monotonic() + float(start.get("timeout_s", 30))
        self.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}, deadline=deadline)
        target = self.call("Target.createTarget", {"url": "about:blank"}, deadline=deadline)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True}, deadline=deadline)["sessionId"]
        self.version = self.call("Browser.getVersion", {}, deadline=deadline).get("product", "")

    def _launch(self, chromium: str, data_mb: int, width: int, height: int) -> subprocess.Popen[bytes]:
        commands_r, self._commands = os.pipe()
        self._events, events_w = os.pipe()
        data = data_mb * 1024 * 1024
        libc = ctypes.CDLL(None, use_errno=True)

        def in_child() -> None:
            os.dup2(commands_r, 3)
            os.dup2(events_w, 4)
            # Chromium reserves far more address space than it uses (RLIMIT_AS stops it at start); its
            # memory is bounded by what it writes to: RLIMIT_DATA.
            resource.setrlimit(resource.RLIMIT_DATA, (data, data))
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

        argv = [
            chromium, "--headless=new", "--no-sandbox", "--remote-debugging-pipe", f"--user-data-dir={self._profile}",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
            "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
            "--disable-domain-reliability", "--disable-breakpad", "--disable-dev-shm-usage", "--metrics-recording-only",
            "--no-pings", "--password-store=basic", "--use-mock-keychain", "--mute-audio", "--hide-scrollbars",
            "--disk-cache-size=16777216",  # the profile is in the scratch dir, which counts against the agent's disk_mb
            "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication",
            f"--window-size={int(width)},{int(height)}", "about:blank",
        ]
        try:
            with open(self._log, "wb") as log:
                # Chromium's singleton socket goes in a new folder of TMPDIR, and a socket's path must fit in 108
                # bytes: the scratch dir's does not always. "." is the profile folder, Chromium's working directory.
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                           cwd=self._profile, env={**os.environ, "TMPDIR": "."},
                                           pass_fds=(3, 4), preexec_fn=in_child)  # noqa: PLW1509 - one thread here
        except OSError as exc:
            raise Refusal("tool_unavailable", f"chromium ({chromium}) cannot be started: {exc.strerror or exc}") from None
        finally:
            os.close(commands_r)
            os.close(events_w)
        return process

    def _last_words(self) -> str:
        """What Chromium last wrote on stderr (its fatal message), for the error."""
        try:
            with open(self._log, "rb") as log:
                log.seek(max(0, os.fstat(log.fileno()).st_size - 2000))
                lines = [line for line in log.read().decode("utf-8", "replace").splitlines() if line.strip()]
        except OSError:
            return ""
        useful = [line for line in lines if not any(noise in line for noise in _NOISE)] or lines
        return ": " + " | ".join(useful[-4:])[-2000:] if useful else ""

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        shutil.rmtree(self._profile, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(self._log)

    # messages

    def _send(self, method: str, params: dict[str, Any], session: str | None = None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        data = json.dumps(message, separators=(",", ":")).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self._commands, data):]
        except OSError:
            raise Refusal("tool_failed", "chromium stopped reading its commands (it exited)", browser_gone=True) from None
        return self._next_id

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None at ``deadline``; raise when Chromium is gone."""
        while b"\0" not in self._buffer:
            # At or past the deadline this still takes what has already arrived: pump(now) between calls must
            # drain the pipe, or the main loop's select finds it readable again at once and spins.
            if not select.select([self._events], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return None
            data = os.read(self._events, 1 << 20)
            if not data:
                raise Refusal("tool_failed", f"chromium exited{self._last_words()}", browser_gone=True)
            self._buffer += data
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def pump(self, deadline: float) -> None:
        """Answer Chromium's paused requests until ``deadline`` (at most; returns at once when nothing waits)."""
        message = self._read(deadline)
        while message is not None:
            self._event(message)
            message = self._read(min(deadline, time.monotonic()))

    def events_fd(self) -> int:
        return self._events

    def call(self, method: str, params: dict[str, Any], *, deadline: float, page: bool = False) -> dict[str, Any]:
        """Send a command and wait for its answer, handling events meanwhile."""
        sent = self._send(method, params, self.session if page else None)
        while True:
            message = self._read(deadline)
            if message is None:
                # A page whose script never yields keeps Chromium from answering anything after: the browser is stuck.
                raise Refusal("tool_timeout", f"chromium did not answer {method} in time", browser_gone=True)
            if message.get("id") == sent:
                if "error" in message:
                    raise Refusal("tool_failed", f"{method}: {message['error'].get('message', 'failed')}")
                return message.get("result") or {}
            self._event(message)

    def _event(self, message: dict[str, Any]) -> None:
        if message.get("method") != "Fetch.requestPaused":
            return
        params = message.get("params") or {}
        url = str((params.get("request") or {}).get("url", ""))
        why = self.rules.refusal(url)
        if why is None:
            self._send("Fetch.continueRequest", {"requestId": params.get("requestId")}, message.get("sessionId"))
        else:
            self.refused.append(f"{url[:200]}: {why}")
            self._send("Fetch.failRequest", {"requestId": params.get("requestId"), "errorReason": "BlockedByClient"},
                       message.get("sessionId"))

    # the page

    def evaluate(self, expression: str, deadline: float, *, await_promise: bool = False) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": await_promise, "userGesture": True},
                           deadline=deadline, page=True)
        details = result.get("exceptionDetails")
        if details is not None:
            exception = details.get("exception") or {}
            text = exception.get("description") or details.get("text") or "the script threw"
            raise Refusal("tool_failed", f"the script threw: {str(text)[:2000]}")
        return (result.get("result") or {}).get("value")

    def settle(self, deadline: float) -> None:
        """Wait (answering requests) until the document has loaded, or ``deadline``."""
        while time.monotonic() < deadline:
            try:
                if self.evaluate("document.readyState", deadline) == "complete":
                    return
            except Refusal as exc:
                if exc.code == "tool_timeout":
                    return
                # a navigation in flight destroyed the context: ask again
            self.pump(min(deadline, time.monotonic() + _POLL_S))

    def where(self, deadline: float) -> dict[str, Any]:
        return self.evaluate("({url: location.href, title: document.title})", deadline) or {}


_FIND = """(() => {
  const wanted = %s;
  let found = null;
  try { found = document.querySelector(wanted); } catch (e) { found = null; }
  if (!found) {
    const text = wanted.trim();
    for (const e of document.querySelectorAll('a, button, input[type=submit], input[type=button], [role=button], label')) {
      if ((e.innerText || e.value || '').trim() === text) { found = e; break; }
    }
  }
  return found;
})()"""
"""The element a selector names: a CSS selector, or else a link or button whose visible text it is
(what the reference runtime's click accepts)."""


def _find(selector: str) -> str:
    return _FIND % json.dumps(selector)


# -- the operations -------------------------------------------------------------------------------------


def _navigate(b: Browser, r: dict[str, Any], deadline: float) -> dict[str, Any]:
    url = str(r["url"])
    why = b.rules.refusal(url)
    if why is not None:
        raise Refusal("address_refused", f"{url[:200]}: {why}")
    answer = b.call("Page.navigate", {"url": url}, deadline=deadline, page=True)
    error = answer.get("errorText")
    if error:
        if b.refused:
            raise Refusal("address_refused", f"the navigation was blocked: {b.refused[-1]}")
        raise Refusal("fetch_failed", f"{url[:200]}: {error}")
    b.settle(deadline)
    return b.where(deadline)


def _read_page(b: Browser, r: dict[str, Any], deadline: float) -> dict[str, Any]:
    page = b.evaluate("({url: location.href, title: document.title, "
                      "text: document.body ? document.body.innerText : ''})", deadline) or {}
    text = str(page.get("text") or "")
    page["chars"] = len(text)
    page["truncated"] = len(text) > b.text_max
    page["text"] = text[: b.text_max]
    return page


def _click(b: Browser, r: dict[str, Any], deadline: float) -> dict[str, Any]:
    point = b.evaluate(f"""(() => {{ const e = {_find(r['selector'])}; if (!e) return null;
        e.scrollIntoView({{block: 'center', inline: 'center'}}); const box = e.getBoundingClientRect();
        return [box.left + box.width / 2, box.top + box.height / 2]; }})()""", deadline)
    if point is None:
        raise Refusal("element_not_found", f"no element matches {r['selector']!r} on {b.where(deadline).get('url')}")
    x, y = point
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        params = {"type": kind, "x": x, "y": y, "button": "left" if kind != "mouseMoved" else "none", "clickCount": 1}
        b.call("Input.dispatchMouseEvent", params, deadline=deadline, page=True)
    b.pump(min(deadline, time.monotonic() + _POLL_S))  # a navigation the click starts begins here
    b.settle(deadline)
    return {"clicked": r["selector"], **b.where(deadline)}


def _type(b: Browser, r: dict[str, Any], deadline: float) -> dict[str, Any]:
    focused = b.evaluate(f"""(() => {{ const e = {_find(r['selector'])}; if (!e) return false;
        e.focus(); if ('value' in e && {json.dumps(bool(r.get('clear', True)))}) e.value = ''; return true; }})()""", deadline)
    if not focused:
        raise Refusal("element_not_found", f"no element matches {r['selector']!r} on {b.where(deadline).get('url')}")
    b.call("Input.insertText", {"text": r["text"]}, deadline=deadline, page=True)
    return {"typed": len(r["text"]), "selector": r["selector"]}


def _screenshot(b: Browser, r: dict[str, Any], deadline: float) -> dict[str, Any]:
    shot = b.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": bool(r.get("full_page"))},
                  deadline=deadline, page=True)
    data = base64.b64decode(shot.get("data", ""))
    if len(data) > b.shot_max:
        raise Refusal("tool_failed", f"the screenshot is {len(data)} bytes, more than [tools.browser] screenshot_max_kb "
                                     f"allows ({b.shot_max} bytes); try without full_page")
    return {"png": base64.b64encode(data).decode("ascii"), **b.where(deadline)}


def _scroll(b: Browser, r: dict[str, Any], deadline: float) -> dict[str, Any]:
    amount = int(r.get("amount", 600))
    dx, dy = {"up": (0, -amount), "down": (0, amount), "left": (-amount, 0), "right": (amount, 0)}[r.get("direction", "down")]
    position = b.evaluate(f"(() => {{ window.scrollBy({dx}, {dy}); return [window.scrollX, window.scrollY]; }})()", deadline)
    return {"direction": r.get("direction", "down"), "amount": amount, "x": position[0], "y": position[1]}


def _wait(b: Browser, r: dict[str, Any], deadline: float) -> dict[str, Any]:
    started = time.monotonic()
    until = min(deadline, started + int(r.get("timeout_ms", 5000)) / 1000)
    probe = f"{_find(r['selector'])} !== null"
    while True:
        if b.evaluate(probe, deadline):
            return {"found": True, "selector": r["selector"], "waited_ms": int((time.monotonic() - started) * 1000)}
        if time.monotonic() >= until:
            return {"found": False, "selector": r["selector"], "waited_ms": int((time.monotonic() - started) * 1000)}
        b.pump(min(until, time.monotonic() + 0.1))


def _run_js(b: Browser, r: dict[str, Any], deadline: float) -> dict[str, Any]:
    value = b.evaluate(str(r["expression"]), deadline, await_promise=True)
    text = json.dumps(value, ensure_ascii=False)
    if len(text) > b.text_max:
        return {"value": text[: b.text_max], "truncated": True}
    return {"value": value, "truncated": False}


def _back(b: Browser, r: dict[str, Any], deadline: float) -> dict[str, Any]:
    history = b.call("Page.getNavigationHistory", {}, deadline=deadline, page=True)
    index = int(history.get("currentIndex", 0))
    entries = history.get("entries") or []
    if index <= 0:
        return {"moved": False, **b.where(deadline)}
    b.call("Page.navigateToHistoryEntry", {"entryId": entries[index - 1]["id"]}, deadline=deadline, page=True)
    b.pump(min(deadline, time.monotonic() + _POLL_S))
    b.settle(deadline)
    return {"moved": True, **b.where(deadline)}


OPS = {"navigate": _navigate, "read": _read_page, "click": _click, "type": _type, "screenshot": _screenshot,
       "scroll": _scroll, "wait": _wait, "run_js": _run_js, "back": _back}


# -- the loop -------------------------------------------------------------------------------------------


def _say(document: dict[str, Any]) -> None:
    """One answer line. A page's text may hold lone surrogates (half an emoji built in JS): replaced, not fatal."""
    line = json.dumps(document, ensure_ascii=False, separators=(",", ":")) + "\n"
    sys.stdout.buffer.write(line.encode("utf-8", "replace"))
    sys.stdout.buffer.flush()


class Lines:
    """stdin read line by line without blocking the event pump."""

    def __init__(self) -> None:
        self._buffer = b""
        self.ended = False

    def next(self) -> bytes | None:
        if b"\n" in self._buffer:
            line, _, self._buffer = self._buffer.partition(b"\n")
            return line
        data = os.read(0, 1 << 20)
        if not data:
            self.ended = True
            return None
        self._buffer += data
        return self.next() if b"\n" in self._buffer else None


def _request(line: bytes) -> dict[str, Any]:
    try:
        request = json.loads(line)
    except ValueError:
        raise Refusal("invalid_arguments", "the request is not JSON") from None
    if not isinstance(request, dict) or request.get("op") not in (*OPS, "close"):
        raise Refusal("invalid_arguments", "unknown request")
    return request


def main() -> int:
    lines = Lines()
    first = None
    while first is None and not lines.ended:
        select.select([0], [], [])
        first = lines.next()
    if first is None:
        return 0
    try:
        start = json.loads(first)
        browser = Browser(start)
    except Refusal as exc:
        _say({"error": {"code": exc.code, "message": exc.message}})
        return 1
    try:
        _say({"ok": {"started": True, "version": browser.version}})
        while True:
            ready = select.select([0, browser.events_fd()], [], [])[0]
            if browser.events_fd() in ready:
                try:
                    browser.pump(time.monotonic())
                except Refusal:
                    return 1  # chromium exited: the daemon starts a fresh browser at the next call
            if 0 not in ready:
                continue
            line = lines.next()
            if line is None:
                if lines.ended:
                    return 0
                continue
            try:
                request = _request(line)
                if request["op"] == "close":
                    _say({"ok": {"closed": True}})
                    return 0
                browser.refused.clear()
                deadline = time.monotonic() + float(request.get("timeout_s", 30))
                _say({"ok": OPS[request["op"]](browser, request, deadline)})
            except Refusal as exc:
                _say({"error": {"code": exc.code, "message": exc.message, **({"closed": True} if exc.browser_gone else {})}})
                if exc.browser_gone:
                    return 1
            except Exception as exc:  # a page this runner did not foresee: that call fails, the browser stays
                _say({"error": {"code": "tool_failed", "message": f"{type(exc).__name__}: {str(exc)[:2000]}"}})
    finally:
        browser.close()


if __name__ == "__main__":
    sys.exit(main())
