"""The per-call capability check: does the issuer hold the tool's action right now?"""

from __future__ import annotations

from covenant.clock import now_ms
from covenant.policy.check import grant_hint
from covenant.tools.context import ToolCallContext
from covenant.tools.result import ToolResult

__all__ = ["capability_refusal"]


def capability_refusal(ctx: ToolCallContext, action: str) -> ToolResult | None:
    """None when an active grant of the issuer covers ``action``; else the ``capability_denied`` result.

    Judged at the later of ``ctx.now_ms`` and the wall clock: a grant that
    expired since the intent started no longer counts.
    """
    when = max(ctx.now_ms, now_ms())
    if ctx.grants.covering(ctx.issuer_pubkey, action, when):
        return None
    return ToolResult.failure(
        "capability_denied",
        f"the issuer of this intent holds no active grant of {action}, so this tool may not run for it "
        f"(an operator can allow it with: {grant_hint(ctx.issuer_pubkey, [action])})",
    )
