"""``rune@web-search``: a query sent by the daemon to the SearXNG-compatible endpoint of ``[tools.web_search]``.

Available only when ``[tools.web_search] url`` is set. The model chooses the
query, never the address: the request goes to the operator's endpoint only
(``GET <url>?q=<query>&format=json``, no redirects followed, no credentials
of the daemon), so there is nothing for the web-fetch address policy to judge.
The answer is read up to 2 MiB; its ``results[]`` become ``{title, url, snippet}``.
"""

from __future__ import annotations

from typing import Any

from covenant import outside_json
from covenant.config import Config
from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.result import ToolError

__all__ = ["TOOL", "ANSWER_MAX_BYTES"]

ANSWER_MAX_BYTES = 2 * 1024 * 1024
_SNIPPET_MAX = 500


def _needs(config: Config) -> str | None:
    if config.tools.web_search.url is None:
        return 'needs [tools.web_search] url = "…" (a SearXNG-compatible JSON endpoint) in covenant.toml'
    return None


def _text(value: Any, most: int) -> str:
    return value[:most] if isinstance(value, str) else ""


async def _search(call: BuiltinCall) -> dict[str, Any]:
    import httpx  # loaded by the first search, not with the daemon

    settings = call.services.config.tools.web_search
    assert settings.url is not None  # offered only when configured
    query = call.arguments["query"]
    try:
        async with httpx.AsyncClient(timeout=settings.timeout_s, follow_redirects=False, trust_env=False) as client:
            async with client.stream("GET", settings.url, params={"q": query, "format": "json"},
                                     headers={"Accept": "application/json"}) as response:
                body = b""
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > ANSWER_MAX_BYTES:
                        raise ToolError("tool_failed", f"the search endpoint answered more than {ANSWER_MAX_BYTES} bytes")
                status = response.status_code
    except httpx.HTTPError as exc:
        raise ToolError("tool_failed", f"the search endpoint could not be reached: {type(exc).__name__}: {exc}") from None
    if status != 200:
        raise ToolError("tool_failed", f"the search endpoint answered HTTP {status}")
    try:
        document = outside_json.loads(body)
    except ValueError:
        raise ToolError("tool_failed", "the search endpoint did not answer JSON (is it SearXNG with format=json enabled?)") from None
    results = document.get("results") if isinstance(document, dict) else None
    if not isinstance(results, list):
        raise ToolError("tool_failed", "the search endpoint's answer has no results list")
    found = [
        {"title": _text(r.get("title"), 300), "url": _text(r.get("url"), 2000), "snippet": _text(r.get("content"), _SNIPPET_MAX)}
        for r in results if isinstance(r, dict) and isinstance(r.get("url"), str)
    ][: min(settings.max_results, call.arguments.get("max_results", settings.max_results))]
    return {"query": query, "results": found}


TOOL = Builtin(
    name="rune@web-search",
    description="Search the web; answers titles, URLs and snippets of the top results.",
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 500},
                       "max_results": {"type": "integer", "minimum": 1, "maximum": 50,
                                       "description": "fewer results than the host's [tools.web_search] max_results"}},
        "required": ["query"],
        "additionalProperties": False,
    },
    run=_search,
    needs=_needs,
)
