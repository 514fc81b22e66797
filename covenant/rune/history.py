"""Which earlier turns of a session the model sees: the Runefile's ``memory_profile``.

- ``minimal``: none, only the current user turn;
- ``standard``: the last ``standard_turns`` turns (``[rune] standard_turns``);
- ``extended``: every turn, the oldest dropped while the estimate of their
  tokens exceeds half the token budget (the other half is the intent's own).

A turn is the messages one intent added (its user message, the assistant's
answers and tool results). Tokens are estimated at 4 characters each: the real
count comes from the provider after the call, and the gateway enforces the
budget with it; this only keeps an old conversation from eating it whole.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["window", "estimate_tokens"]

_CHARS_PER_TOKEN = 4


def estimate_tokens(messages: list[dict[str, Any]]) -> int:
    return len(json.dumps(messages, ensure_ascii=False)) // _CHARS_PER_TOKEN + 1


def window(
    turns: list[list[dict[str, Any]]], *, profile: str, standard_turns: int, token_budget: int
) -> list[dict[str, Any]]:
    """The earlier messages to send, oldest first, for ``profile``."""
    if profile == "minimal" or not turns:
        return []
    if profile == "standard":
        kept = turns[-standard_turns:] if standard_turns > 0 else []
    else:
        kept = list(turns)
        allowance = token_budget // 2
        while kept and sum(estimate_tokens(t) for t in kept) > allowance:
            kept.pop(0)
    return [message for turn in kept for message in turn]
