"""The intent ids a daemon has accepted, remembered so that a replay is refused.

Memory is the point of this module's shape: a busy daemon holds every id of
the last ``skew_s`` window, up to ``replay_cache`` (100,000 by default). An
id is kept as a 60-bit keyed hash in a set (a small Python int), not as its
text; its ``issued_at`` and its place in arrival order live in two arrays.
That is ≈ 95 bytes and one Python object per id, where the id's text, a dict
and a heap took ≈ 220 bytes and three objects. The count of objects matters
as much as their size: long-lived small objects scattered among a dispatch's
short-lived ones keep the allocator's pools from being reused, and an
earlier version with a dict of int keys and int values (≈ 130 bytes, two
objects per id) grew the daemon's RSS faster than the heap had.

Two ids whose hashes agree make the second one a ``replayed_intent``: the
cache fails closed. The key is random per process, so nobody can aim for a
collision, and by chance one is a few in a billion for a full default cache.

Ids leave in arrival order, which is ``issued_at`` order up to the clients'
clock skew. That changes how much is remembered, never what is refused:

- an expired id leaves only once every id that arrived before it has left,
  so an id with an old ``issued_at`` that arrived late is kept a little
  longer than it needs to be;
- a full cache forgets the id that arrived first and raises the floor to its
  ``issued_at``: from then on an id at or below the floor that is not
  remembered cannot be proven fresh and is refused (``cache_full``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from array import array
from collections.abc import Iterable

from covenant.policy.errors import ReplayedIntent

__all__ = ["ReplayCache"]

_KEY_BITS = 60
"""Below 2**60 a Python int takes two 30-bit digits: 32 bytes, where 64 bits take 36 (40 allocated)."""
_COMPACT_AFTER = 1024
"""Forgotten slots at the front of the arrival arrays before they are cut off."""


class ReplayCache:
    """Accepted intent ids of the last ``window_ms`` (at most ``size`` of them). Safe from several threads."""

    def __init__(self, window_ms: int, size: int) -> None:
        if window_ms <= 0 or size <= 0:
            raise ValueError("window_ms and size must be positive")
        self.window_ms = window_ms
        self.size = size
        self._hash_key = os.urandom(16)
        self._keys: set[int] = set()
        # The same keys with their issued_at, in the order they arrived, from index _first on: two arrays,
        # so that the one Python object kept per id is its key in the set.
        self._arrived_keys = array("Q")
        self._arrived_at = array("q")
        self._first = 0
        self._floor_ms = -1
        """The highest issued_at among ids forgotten while still inside the window (a full cache)."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._keys)

    def _key(self, intent_id: str) -> int:
        # surrogatepass: an id read back from the audit log is any JSON string, a lone surrogate included
        data = intent_id.encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(data, digest_size=8, key=self._hash_key).digest()
        return int.from_bytes(digest, "little") >> (64 - _KEY_BITS)

    def remember(self, intent_id: str, issued_at: int, now_ms: int) -> None:
        """Remember an accepted id; raise ReplayedIntent if it was seen, or cannot be proven fresh."""
        key = self._key(intent_id)
        with self._lock:
            self._forget_expired(now_ms)
            if key in self._keys:
                raise ReplayedIntent(
                    f"intent {intent_id} was already received; sign a new intent (a fresh id) to dispatch again",
                    intent_id=intent_id,
                )
            if issued_at <= self._floor_ms:
                raise ReplayedIntent(
                    f"intent {intent_id}: the replay cache is full and this intent is older than ids it had "
                    f"to forget, so it cannot be proven fresh; dispatch again with a new intent "
                    f"(or raise policy.replay_cache)",
                    intent_id=intent_id,
                    cache_full=True,
                )
            self._add(key, issued_at)

    def restore(self, seen: Iterable[tuple[str, int]], now_ms: int) -> int:
        """Remember ``(id, issued_at)`` pairs accepted before a restart, oldest arrival first; returns how many
        are kept. Ids already outside the window are skipped (their replay fails the skew check)."""
        horizon = now_ms - self.window_ms
        with self._lock:
            for intent_id, issued_at in seen:
                # No accepted intent is issued past 2**53 (the intent model's bound); a record that says so
                # did not come from an accepted intent, and would not fit the array.
                if not horizon <= issued_at < 2**63:
                    continue
                key = self._key(intent_id)
                if key not in self._keys:
                    self._add(key, issued_at)
            return len(self._keys)

    def _add(self, key: int, issued_at: int) -> None:
        self._keys.add(key)
        self._arrived_keys.append(key)
        self._arrived_at.append(issued_at)
        while len(self._keys) > self.size:
            self._floor_ms = max(self._floor_ms, self._forget_first())

    def _forget_expired(self, now_ms: int) -> None:
        # An id older than the window may go: its replay now fails the skew check before this cache is
        # asked. Only from the front, so nothing still inside the window is ever dropped.
        horizon = now_ms - self.window_ms
        while self._keys and self._arrived_at[self._first] < horizon:
            self._forget_first()

    def _forget_first(self) -> int:
        """Forget the id that arrived first; returns its issued_at."""
        first = self._first
        self._keys.remove(self._arrived_keys[first])
        issued_at = self._arrived_at[first]
        self._first = first + 1
        if self._first >= _COMPACT_AFTER and 2 * self._first >= len(self._arrived_keys):
            del self._arrived_keys[: self._first]  # amortised: at most once per as many forgotten ids
            del self._arrived_at[: self._first]
            self._first = 0
        return issued_at
