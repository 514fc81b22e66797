"""The daemon side of Rune tools: the registry, the capability check, built-ins, process tools, the audit.

The replica asks, the daemon decides and runs: :class:`ToolHost` is the one
entry point (docs/tools.md). Layout, one job per module:

- :mod:`.catalogue` an agent's toolset -> offered tools and unavailable entries
- :mod:`.builtins` the ``rune@`` tools this host runs (one module each)
- :mod:`.unavailable` why the other built-ins are not offered
- :mod:`.process` ``runtime: process`` tools through the runner
- :mod:`.workspace` the file tools' I/O in an agent's workspace, resolved by :mod:`.beneath`
  (openat2 beneath a directory fd); :mod:`.patch` unified diffs
- :mod:`covenant.netpolicy` (below every feature: config validates with it) which addresses web-fetch may reach
- :mod:`.supervised` the ``rune@process-*`` processes of each agent
- :mod:`.capability` the per-call grant check
- :mod:`.retry` ``retry_policy`` and ``timeout_ms``
- :mod:`.audit` the ``tool.call`` event
- :mod:`.result` results, error codes, what the model sees
"""

from covenant.tools.context import AuditSink, ToolCallContext
from covenant.tools.host import ToolHost
from covenant.tools.result import ERROR_CODES, ToolResult, model_content

__all__ = ["ToolHost", "ToolCallContext", "ToolResult", "AuditSink", "ERROR_CODES", "model_content"]
