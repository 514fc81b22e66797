"""``rune@web-fetch``: one HTTP(S) GET made by the daemon for the agent, checked before every connect.

For each hop (the URL, then every redirect target):

1. the scheme must be ``https`` (``http`` too when the agent's ``network`` is
   ``full`` or the host is in ``[tools.web_fetch] allow``); ``network = off``
   refuses every fetch;
2. the host is resolved once; every address it resolves to must pass
   :class:`~covenant.netpolicy.AddressPolicy`;
3. the connection goes to the checked addresses, in turn until one
   connects (the URL's host is replaced by it; ``Host`` and TLS
   SNI/certificate checks keep the name), so a second DNS answer
   (rebinding) is never used.

The client is made per call with ``trust_env=False``: no proxy, netrc or
certificate settings from the daemon's environment, no cookies kept, no
credentials of any kind sent. The body is asked for and read without content
coding (never decompressed), up to ``max_bytes``; the rest is never read.
"""

from __future__ import annotations

import base64
import ipaddress
import math
from typing import TYPE_CHECKING, Any

import trio

from covenant.config import Config
from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.netpolicy import AddressPolicy
from covenant.tools.result import ToolError

if TYPE_CHECKING:
    import httpx

__all__ = ["TOOL", "checked_addresses"]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript", "+json", "+xml")
_USER_AGENT = "covenant-web-fetch/1"


def _call_timeout_ms(config: Config, arguments: dict[str, Any]) -> int:
    return config.tools.web_fetch.timeout_ms + 1000  # the fetch's own deadline fires first, with its message


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _addresses(host: str, port: int) -> list[str]:
    if _is_ip(host):
        return [host]
    try:
        infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    except OSError as exc:
        raise ToolError("fetch_failed", f"cannot resolve {host!r}: {exc.strerror or exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def checked_addresses(url: httpx.URL, policy: AddressPolicy, network: str, table: str = "[tools.web_fetch]",
                            network_key: str = "[resources] network") -> list[str]:
    """The addresses to connect to for ``url``; raise ``address_refused`` when any of them is refused.

    ``table`` names the config table whose ``allow`` lists exceptions, ``network_key`` the setting ``network``
    comes from: the browser's navigations are judged here too (:mod:`covenant.tools.builtins.browser`)."""
    if network == "off":
        raise ToolError("address_refused", f"the network is off ({network_key} = \"off\"); nothing may be fetched")
    if url.scheme not in ("http", "https"):
        raise ToolError("address_refused", f"only http and https URLs can be fetched, not {url.scheme or 'a relative URL'}")
    host = url.host
    if not host:
        raise ToolError("address_refused", f"{url} names no host")
    listed = policy.host_allowed(host)
    addresses = await _addresses(host, url.port or (443 if url.scheme == "https" else 80))
    if not addresses:
        raise ToolError("fetch_failed", f"{host!r} resolved to no address")
    if not listed:
        for address in addresses:
            why = policy.refusal(address)
            if why is not None:
                raise ToolError(
                    "address_refused",
                    f"{url}: {host} resolves to {why}; refused unless covenant.toml lists it in {table} allow",
                )
    if url.scheme == "http" and network != "full" and not (listed or all(policy.listed(a) for a in addresses)):
        raise ToolError(
            "address_refused",
            f"{url}: {network_key} is outbound-https-only, so http is refused (use https, or list the host "
            f"in {table} allow)",
        )
    return addresses


def _body(data: bytes, content_type: str, charset: str | None) -> tuple[str, str]:
    if any(t in content_type for t in _TEXT_TYPES):
        try:
            return data.decode(charset or "utf-8", "replace"), "utf-8"
        except LookupError:  # the server named a charset Python does not know
            return data.decode("utf-8", "replace"), "utf-8"
    return base64.b64encode(data).decode("ascii"), "base64"


def _why(exc: BaseException) -> str:
    """The innermost cause with something to say (trio wraps TLS errors in an empty BrokenResourceError)."""
    text, seen = str(exc), 0
    inner: BaseException | None = exc
    while inner is not None and seen < 8:
        text = str(inner) or text
        inner, seen = inner.__cause__ or inner.__context__, seen + 1
    return text or type(exc).__name__


async def _connect(client: httpx.AsyncClient, url: httpx.URL, addresses: list[str]) -> httpx.Response:
    """Send the GET to the checked addresses in turn (never to a name): the first that connects answers."""
    import httpx  # loaded by the first fetch, not with the daemon

    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    # identity: the body is read raw, never decompressed, so a compression bomb costs at most max_bytes
    headers = {"Host": url.netloc.decode("ascii"), "User-Agent": _USER_AGENT, "Accept": "*/*", "Accept-Encoding": "identity"}
    failures: list[str] = []
    for address in addresses:
        request = client.build_request("GET", url.copy_with(host=address), headers=headers, extensions=extensions)
        try:
            return await client.send(request, stream=True)
        except httpx.ConnectError as exc:
            failures.append(f"{address}: {_why(exc)}")
        except httpx.HTTPError as exc:
            raise ToolError("fetch_failed", f"{url}: {type(exc).__name__}: {_why(exc)}") from None
    raise ToolError("fetch_failed", f"{url}: cannot connect ({'; '.join(failures)})")


async def _fetch(url: str, call: BuiltinCall) -> dict[str, Any]:
    import httpx  # loaded by the first fetch, not with the daemon

    limits = call.services.config.tools.web_fetch
    policy = AddressPolicy.from_config(limits.allow)
    network = call.ctx.agent.resources.network
    chain: list[str] = []
    current = httpx.URL(url)
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=None) as client:
        for _hop in range(limits.max_redirects + 1):
            response = await _connect(client, current, await checked_addresses(current, policy, network))
            try:
                location = response.headers.get("location")
                if response.status_code in _REDIRECTS and location:
                    chain.append(str(current))
                    current = current.join(location)
                    continue
                body = bytearray()
                truncated = False
                try:
                    async for chunk in response.aiter_raw():
                        body += chunk
                        if len(body) > limits.max_bytes:
                            del body[limits.max_bytes:]
                            truncated = True
                            break
                except httpx.HTTPError as exc:
                    raise ToolError("fetch_failed", f"{current}: the body broke off: {exc}") from None
            finally:
                await response.aclose()
            content_type = response.headers.get("content-type", "").lower()
            coded = response.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity")
            content, encoding = _body(bytes(body), "" if coded else content_type, response.charset_encoding)
            return {
                "url": str(current),
                "status": response.status_code,
                "content_type": content_type,
                "encoding": encoding,
                "content": content,
                "bytes": len(body),
                "truncated": truncated,
                "redirects": chain,
            }
    raise ToolError("fetch_failed", f"more than [tools.web_fetch] max_redirects = {limits.max_redirects} redirects")


async def _run(call: BuiltinCall) -> dict[str, Any]:
    import httpx  # loaded by the first fetch, not with the daemon

    limits = call.services.config.tools.web_fetch
    url = call.arguments["url"]
    ends = min(trio.current_time() + limits.timeout_ms / 1000, call.ends if math.isfinite(call.ends) else math.inf)
    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ToolError("invalid_arguments", f"url is not a URL: {exc}") from None
    with trio.move_on_at(ends) as scope:
        return await _fetch(url, call)
    assert scope.cancelled_caught
    raise ToolError("tool_timeout", f"the fetch did not finish within {limits.timeout_ms} ms (or the intent's time)")


TOOL = Builtin(
    name="rune@web-fetch",
    description=(
        "Fetch a web page or file with an HTTP GET (https; http only where the host allows it). Redirects are followed. "
        "Returns status, content type and the body (text, or base64 when binary), cut to a few tens of KiB."
    ),
    parameters={
        "type": "object",
        "properties": {"url": {"type": "string", "minLength": 1, "maxLength": 8192, "description": "an http(s) URL"}},
        "required": ["url"],
        "additionalProperties": False,
    },
    run=_run,
    timeout_ms=_call_timeout_ms,
)
