"""The MCP SDK, imported on first use and in a worker thread.

Importing ``mcp`` and ``mcp_types`` costs about half a second of CPU: a daemon whose agents name no
MCP server never pays it, and one that does pays it once, off the event loop. After
:func:`load_sdk` the modules are in ``sys.modules`` and local imports of them are lookups.
"""

from __future__ import annotations

import trio

__all__ = ["load_sdk"]


def _import_sdk() -> None:
    import mcp  # noqa: F401
    import mcp.client.streamable_http  # noqa: F401
    import mcp.shared.message  # noqa: F401
    import mcp_types  # noqa: F401


async def load_sdk() -> None:
    """Import the SDK's modules the hub and the stdio transport use (a no-op once done)."""
    await trio.to_thread.run_sync(_import_sdk)
