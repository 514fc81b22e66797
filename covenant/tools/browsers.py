"""The agents' browsers of ``rune@browser-*``: one headless Chromium per (agent, session), run as the agent.

A browser is one run of :mod:`covenant.tools.browser_runner` through the runner's tool mode (the
agent's uid, its network namespace of ``[tools.browser] network`` — never the host's —, its Landlock
rules, its process group and kill ladder), whose stdin stays open: each tool call is one JSON line
in and one JSON line out. The runner starts Chromium and drives it over the DevTools protocol on a
pipe. The registry is the daemon's; a browser is keyed by the dispatch's session when its caller
named one (it then outlives the intent, so a conversation keeps its page), else by the intent (it
ends with it). It is stopped through the kill ladder, which takes Chromium's whole tree with it, on
``browser-close``, after ``[tools.browser] idle_s`` without a call, after ``lifetime_s``, when its
intent ends (intent-keyed), when its agent's replica stops (stopped, reloaded, withdrawn) and when
the daemon stops. At most ``[tools.browser] max_per_agent`` per agent.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from covenant.config import BrowserToolConfig
from covenant.manifest.model import AgentSpec
from covenant.runtime.run_state import RunState
from covenant.runtime.runner import Runner
from covenant.runtime.tool_files import ToolFiles
from covenant.runtime.toolrun import ToolRun
from covenant.tools.result import ToolError, runner_answer
from covenant.tools.runner_python import RunnerCommand

__all__ = ["BrowserKey", "BrowserRegistry"]

BrowserKey = tuple[str, str]
"""(agent id, ``session:<id>`` or ``intent:<id>``)."""

_START_S = 20.0
"""How long Chromium may take to start and answer, at most (also bounded by the call's time)."""
_GONE_KEPT = 256
"""Browsers that ended on their own whose key has not called since: why each ended is kept for that call, the
oldest let go past this many."""


@dataclass
class _Browser:
    key: BrowserKey
    intent_id: str
    """The intent that started it (an intent-keyed browser ends with it)."""
    by_intent: bool
    last_used: float = field(default_factory=trio.current_time)
    state: RunState | None = None
    record: ToolRun | None = None
    started: trio.Event = field(default_factory=trio.Event)
    ended: trio.Event = field(default_factory=trio.Event)
    ready: bool = False
    """The runner answered its start request: Chromium runs."""
    lock: trio.Lock = field(default_factory=trio.Lock)
    """One request at a time: the runner answers in order, one line each."""

    stop_reason: str | None = None
    """Why it was stopped, kept so that a stop that comes while the runner is still being spawned takes
    effect as soon as it runs (:meth:`started_as`)."""

    def stop(self, why: str) -> None:
        self.stop_reason = self.stop_reason or why
        if self.state is not None:
            self.state.decide("cancelled", why)

    def started_as(self, state: RunState) -> None:
        """The runner runs as ``state``; stopped at once when a stop came first."""
        state.keep_stdin_open = True
        self.state = state
        if self.stop_reason is not None:
            state.decide("cancelled", self.stop_reason)
        self.started.set()

    def why_ended(self) -> str:
        record = self.record
        if record is None:
            return "the browser ended"
        if record.outcome in ("ok", "no_result", "protocol_error", "crashed") and record.signal is not None:
            return f"the browser runner was killed by signal {record.signal}"
        said = [line for line in record.stderr_tail.splitlines() if line.strip()]
        detail = "; ".join(filter(None, (record.error, said[-1][-300:] if said else None)))
        return f"the browser ended ({record.outcome}{': ' + detail[:600] if detail else ''})"


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


class BrowserRegistry:
    """Every browser of the daemon, by (agent, session or intent)."""

    def __init__(self, runner: Runner, config: BrowserToolConfig) -> None:
        self.runner = runner
        self.config = config
        self._browsers: dict[BrowserKey, _Browser] = {}
        self._gone: dict[BrowserKey, str] = {}
        """Why the browser of a key ended on its own (crashed, killed, its lifetime over), told to that key's
        next call (which then starts a fresh one) instead of keeping the whole ended browser."""
        self._started = 0

    def set_limits(self, config: BrowserToolConfig) -> None:
        """Take a reloaded ``[tools.browser]``: ``idle_s``, ``max_per_agent`` and ``timeout_ms`` apply to every browser
        at once; a change of what a browser is started with (its program, network, rules, memory, caps, lifetime)
        closes the open ones, so none keeps the rules the reload replaced (the next call starts a fresh one)."""
        live = ("idle_s", "max_per_agent", "timeout_ms")
        started_with = config.model_dump(exclude=set(live)) != self.config.model_dump(exclude=set(live))
        self.config = config
        if started_with:
            for browser in list(self._browsers.values()):
                self._close(browser, "[tools.browser] changed by a reload")

    def count(self, agent_id: str) -> int:
        """The agent's browsers still running."""
        return sum(1 for key, b in self._browsers.items() if key[0] == agent_id and b.record is None)

    def _forget(self, browser: _Browser) -> None:
        if self._browsers.get(browser.key) is browser:
            del self._browsers[browser.key]

    def _close(self, browser: _Browser, why: str) -> None:
        """Stop ``browser`` and take it out of the registry: the next call of its key starts a fresh one."""
        self._forget(browser)
        browser.stop(why)

    @staticmethod
    def key(agent_id: str, session_id: str | None, intent_id: str) -> BrowserKey:
        return (agent_id, f"session:{session_id}" if session_id else f"intent:{intent_id}")

    async def request(
        self, agent: AgentSpec, key: BrowserKey, intent_id: str, backend: RunnerCommand, start: dict[str, Any],
        request: dict[str, Any], ends: float,
    ) -> dict[str, Any]:
        """Send ``request`` to the key's browser (started first when it has none) and return its ``ok`` answer.

        ``start`` is the runner's start request (Chromium's path, the rules, the caps); ``ends`` (trio time)
        bounds the call. Raises ToolError: the runner's error, ``browser_limit``, ``tool_timeout``, or
        ``tool_failed`` when the browser ended (the next call starts a fresh one).
        """
        browser = self._browsers.get(key)
        if browser is None:
            if (why := self._gone.pop(key, None)) is not None:
                raise ToolError("tool_failed", f"{why}; the next call starts a fresh browser")
            browser = await self._start(agent, key, intent_id, backend, start, ends)
        async with browser.lock:
            if browser.record is not None:  # it ended while this call waited for it
                self._forget(browser)
                self._gone.pop(key, None)
                raise ToolError("tool_failed", f"{browser.why_ended()}; the next call starts a fresh browser")
            browser.last_used = trio.current_time()
            try:
                return await self._exchange(browser, request, ends)
            finally:
                browser.last_used = trio.current_time()

    async def _start(
        self, agent: AgentSpec, key: BrowserKey, intent_id: str, backend: RunnerCommand, start: dict[str, Any],
        ends: float,
    ) -> _Browser:
        config = self.config
        if self.count(agent.id) >= config.max_per_agent:
            raise ToolError("browser_limit", f"this agent has {self.count(agent.id)} browsers open, the most [tools.browser] "
                                             "max_per_agent allows; close one with browser-close (or let it idle out)")
        browser = _Browser(key=key, intent_id=intent_id, by_intent=key[1].startswith("intent:"))
        browser.lock.acquire_nowait()  # held until it answered its start: a concurrent call of the key waits for that
        self._browsers[key] = browser
        self._started += 1
        # The browser's own memory budget stands in for the agent's class's (Chromium alone wants more than a
        # small profile's 256 MiB): the sampler holds its tree's resident size to [tools.browser] memory_mb and the
        # runner sets RLIMIT_DATA on Chromium (never RLIMIT_AS: Chromium reserves far more address space than it
        # uses and would not start). The class's nice and CPU group still apply.
        run_id = f"{intent_id}:browser:{self._started}"
        # Chromium's own folder too: one installed outside the system's (/opt/google/chrome) must be executable.
        chromium_dir = os.path.dirname(os.path.realpath(str(start["chromium"])))
        files = self.runner.tool_confinement.where_possible(ToolFiles(read_only=(*backend.read_only, chromium_dir)))
        first = json.dumps(start, separators=(",", ":")).encode() + b"\n"

        async def supervise() -> None:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._idle_watch, browser)
                    browser.record = await self.runner.run_tool(
                        agent, backend.prefix, first, run_id=run_id, wall_ms=config.lifetime_s * 1000,
                        network=config.network, on_started=browser.started_as, files=files, memory_mb=config.memory_mb,
                        priority="normal",  # it outlives the intent that started it: its class's nice, no offset
                    )
                    nursery.cancel_scope.cancel()
            finally:
                if browser.record is None:
                    browser.record = ToolRun.spawn_failed(list(backend.prefix), "the daemon stopped", time.monotonic())
                if browser.ready and self._browsers.get(key) is browser:  # it ended on its own, not closed
                    self._remember_gone(browser)
                self._forget(browser)
                browser.started.set()
                browser.ended.set()

        trio.lowlevel.spawn_system_task(supervise, name=f"covenant-browser-{run_id}")
        try:
            await browser.started.wait()
            if browser.state is None:
                raise ToolError("tool_unavailable", f"the browser could not be started: {browser.why_ended()}")
            await self._answer(browser, min(ends, trio.current_time() + _START_S))
        except BaseException:
            self._close(browser, "it did not start")  # also while it is still being spawned (_Browser.started_as)
            with trio.CancelScope(shield=True):
                await browser.ended.wait()
            raise
        finally:
            browser.lock.release()
        browser.ready = True
        return browser

    def _remember_gone(self, browser: _Browser) -> None:
        self._gone[browser.key] = browser.why_ended()
        while len(self._gone) > _GONE_KEPT:
            del self._gone[next(iter(self._gone))]

    def _drop_gone(self, which: Callable[[BrowserKey], bool]) -> None:
        for key in [key for key in self._gone if which(key)]:
            del self._gone[key]

    async def _idle_watch(self, browser: _Browser) -> None:
        """Stop the browser once it has had no call for ``[tools.browser] idle_s``."""
        while True:
            idle_until = browser.last_used + self.config.idle_s
            if trio.current_time() >= idle_until and not browser.lock.locked():
                self._close(browser, f"no call for [tools.browser] idle_s = {self.config.idle_s} s")
                return
            # at least once a second: a reload may shorten idle_s
            await trio.sleep_until(max(min(idle_until, trio.current_time() + 1.0), trio.current_time() + 0.05))

    async def _exchange(self, browser: _Browser, request: dict[str, Any], ends: float) -> dict[str, Any]:
        assert browser.state is not None
        left_s = ends - trio.current_time() if math.isfinite(ends) else self.config.timeout_ms / 1000
        if left_s <= 0:
            raise ToolError("tool_timeout", "the call has no time left")
        line = json.dumps({**request, "timeout_s": max(0.1, left_s - 0.25)}, ensure_ascii=False,
                          separators=(",", ":")).encode() + b"\n"
        try:
            await browser.state.launched.stdin.send_all(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await self._ended(browser)
        return await self._answer(browser, ends)

    async def _answer(self, browser: _Browser, ends: float) -> dict[str, Any]:
        """The runner's next answer line; its error raised as a ToolError."""
        state = browser.state
        assert state is not None
        with trio.move_on_at(ends) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when_set, browser.ended, nursery.cancel_scope)
                while b"\n" not in state.stdout:
                    await state.wait_stdout()  # the run's watch wakes it for each chunk and at stdout's end
                nursery.cancel_scope.cancel()
            if b"\n" not in state.stdout:  # the runner ended before it answered
                await self._ended(browser)
        if scope.cancelled_caught:
            # The runner is mid-request: its answer would be read as the next call's. A fresh browser is next.
            self._close(browser, "a call ran out of time")
            raise ToolError("tool_timeout", "the browser did not answer in time (it is closed; the next call starts a "
                                            "fresh one)")
        line, _, rest = bytes(state.stdout).partition(b"\n")
        state.stdout[:] = rest
        try:
            answer = json.loads(line)
        except ValueError:
            self._close(browser, "it answered something other than JSON")
            raise ToolError("tool_failed", "the browser runner answered something other than JSON") from None
        error = answer.get("error") if isinstance(answer, dict) else None
        if isinstance(error, dict) and error.get("closed") is True:  # Chromium gone or stuck: the runner ends
            self._forget(browser)
            with trio.CancelScope(shield=True):
                await browser.ended.wait()
            error = {**error, "message": f"{str(error.get('message'))[:1900]} (the browser is closed; the next call "
                                         "starts a fresh one)"}
            answer = {"error": error}
        return runner_answer(answer, "browser runner")

    async def _ended(self, browser: _Browser) -> None:
        with trio.CancelScope(shield=True):
            await browser.ended.wait()
        self._forget(browser)
        self._gone.pop(browser.key, None)  # told now: the next call starts a fresh one
        raise ToolError("tool_failed", f"{browser.why_ended()}; the next call starts a fresh browser")

    async def close(self, key: BrowserKey) -> bool:
        """Stop the key's browser and wait until its whole tree is gone; False when it had none."""
        browser = self._browsers.get(key)
        if browser is None:
            return False
        self._close(browser, "closed by browser-close")
        with trio.CancelScope(shield=True):
            await browser.ended.wait()
        return True

    async def _stop_all(self, browsers: list[_Browser], why: str) -> None:
        if not browsers:  # the usual intent's end: no scope to open
            return
        for browser in browsers:
            self._close(browser, why)
        with trio.CancelScope(shield=True):
            for browser in browsers:
                await browser.ended.wait()

    async def intent_ended(self, intent_id: str) -> None:
        """Stop the browsers kept for ``intent_id`` (a dispatch without a session)."""
        self._drop_gone(lambda key: key[1] == f"intent:{intent_id}")
        await self._stop_all([b for b in self._browsers.values() if b.by_intent and b.intent_id == intent_id],
                             "its intent ended")

    async def agent_stopped(self, agent_id: str) -> None:
        """Stop every browser of the agent (its replica stopped: stopped, reloaded, withdrawn, daemon stopping)."""
        self._drop_gone(lambda key: key[0] == agent_id)
        await self._stop_all([b for k, b in self._browsers.items() if k[0] == agent_id], "its agent stopped")
