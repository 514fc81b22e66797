"""Stopping an intent in flight, at whatever stage it is: decided, queued, spawning, running or hosted.

Every intent (roots and children) is tracked from its verification to its answer. A cancel that comes
before the intent has anything to stop (while it is decided, or still writing its decision) waits here,
and the dispatch path applies it as soon as there is something to stop (:meth:`CancelRequests.reason`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from covenant.daemon.scheduler import Scheduler, Withdrawn
from covenant.runtime.runner import Runner
from covenant.workflow import IntentChain

__all__ = ["CancelRequests", "SHUTTING_DOWN", "CALLER_ENDED"]

log = logging.getLogger("covenant.daemon")

SHUTTING_DOWN = "covenant stopped the intent: the daemon is shutting down"
CALLER_ENDED = "covenant stopped the intent: the intent that called it ended"


class CancelRequests:
    """Which intents in flight were asked to stop, and why; :meth:`cancel` stops them."""

    def __init__(self, chain: IntentChain, scheduler: Scheduler, runner: Runner) -> None:
        self._chain = chain
        self._scheduler = scheduler
        self._runner = runner
        self._requests: dict[str, str | None] = {}
        """Intent id -> None, or why it was cancelled, for every intent in flight."""
        self._all = False
        """Set by :meth:`cancel_all`: an intent that starts after it (a child of one still ending) is
        cancelled from its first moment."""

    @contextmanager
    def tracking(self, intent_id: str) -> Iterator[None]:
        """The intent is cancellable for the duration of the block (from its verification to its answer)."""
        self._requests[intent_id] = SHUTTING_DOWN if self._all else None
        try:
            yield
        finally:
            del self._requests[intent_id]

    def reason(self, intent_id: str) -> str | None:
        """Why the tracked intent was cancelled, or None while it was not."""
        return self._requests[intent_id]

    def cancel(self, intent_id: str, reason: str) -> bool:
        """Stop one in-flight intent (outcome ``cancelled``, ``reason`` its record's error) at whatever stage
        it is, and the child intents it is waiting for; logged. False when it is not in flight."""
        found = self.cancel_quietly(intent_id, reason)
        log.info("intent cancel requested", extra={"intent": intent_id, "reason": reason, "in_flight": found})
        return found

    def cancel_quietly(self, intent_id: str, reason: str) -> bool:
        """:meth:`cancel` without the log line (a child stopped with its caller)."""
        if intent_id not in self._requests:
            return False
        if self._requests[intent_id] is None:  # the first reason stays
            self._requests[intent_id] = reason
        link = self._chain.get(intent_id)
        if link is not None:  # a Rune or workflow intent: its run scope
            link.cancel(reason)
            for child in link.children:  # its agent tools' and steps' intents still running end with it
                if child.get("intent") is not None and "outcome" not in child:
                    self.cancel_quietly(child["intent"], CALLER_ENDED)
        self._scheduler.withdraw(intent_id, Withdrawn(reason))  # a process agent's intent waiting for a slot
        self._runner.cancel(intent_id, reason)  # ... or being spawned, or running
        return True

    def cancel_all(self) -> None:
        """Past the drain timeout: stop every intent in flight, and every one that starts from now on (the
        child of one still ending), at whatever stage (outcome ``cancelled``)."""
        self._all = True
        self._runner.cancel_all()  # also the tool processes of Rune intents
        for intent_id in list(self._requests):
            self.cancel_quietly(intent_id, SHUTTING_DOWN)
