"""The built-in tools this host runs, by ``rune@`` name.

Adding one is one module exposing a :class:`~covenant.tools.builtins.base.Builtin`
and one line below; everything else (offering, validation, capability,
audit, retries, the result cap) is the host's.
"""

from __future__ import annotations

from covenant.tools.builtins import (
    a2a,
    agents,
    ask_user,
    browser,
    canvas,
    channel_send,
    cron,
    docker_exec,
    files,
    images,
    knowledge,
    location,
    media,
    memory,
    processes,
    schedules,
    shell,
    system_time,
    tasks,
    web_fetch,
    web_search,
)
from covenant.tools.builtins.base import Builtin, BuiltinCall

__all__ = ["BUILTINS", "Builtin", "BuiltinCall"]

BUILTINS: dict[str, Builtin] = {
    tool.name: tool
    for tool in (
        system_time.TOOL,
        ask_user.TOOL,
        *memory.TOOLS,
        *files.TOOLS,
        shell.TOOL,
        web_fetch.TOOL,
        *processes.TOOLS,
        *agents.TOOLS, *a2a.TOOLS,
        *knowledge.TOOLS, *tasks.TOOLS,
        web_search.TOOL, channel_send.TOOL,
        *schedules.TOOLS, *cron.TOOLS,
        location.TOOL,
        *media.TOOLS, *images.TOOLS,
        docker_exec.TOOL,
        canvas.TOOL,
        *browser.TOOLS,
    )
}
