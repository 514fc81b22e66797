"""The three priorities, shared by manifests, intents, the queue and the CLI.

No imports: the click-free ``covenant dispatch`` path reads it too.
"""

from __future__ import annotations

__all__ = ["PRIORITIES", "PRIORITY_ORDER"]

PRIORITIES: tuple[str, ...] = ("low", "normal", "high")
"""The accepted values, in the order help texts list them."""

PRIORITY_ORDER: dict[str, int] = {"high": 0, "normal": 1, "low": 2}
"""Queue order: lower runs first."""
