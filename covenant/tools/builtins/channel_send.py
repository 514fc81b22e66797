"""``rune@channel-send``: a message posted by the daemon to a ``[channels.NAME]`` webhook, HMAC-signed.

Available when covenant.toml has at least one ``[channels.NAME]``. The URL
and the key are read from the daemon's environment (``url_env``,
``secret_env``) at each send, never written anywhere. The body is the
canonical JSON ``{"agent", "channel", "intent", "sent_at", "text"}``, with ``recipient`` when the
call names one (who on that channel the receiver should deliver to: a chat id, a handle); the
header ``X-Covenant-Signature: sha256=<hex HMAC-SHA256 of the body with the
key>`` lets the receiver check it. No redirects are followed; a 2xx answer
is a success.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from typing import Any


from covenant.canonical import canonical_bytes
from covenant.clock import iso_ms, now_ms
from covenant.config import Config
from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.result import ToolError

__all__ = ["TOOL", "TEXT_MAX_BYTES", "SIGNATURE_HEADER", "signature"]

TEXT_MAX_BYTES = 16 * 1024
SIGNATURE_HEADER = "X-Covenant-Signature"
_URL = re.compile(r"^https?://[^/\s?#]+(/\S*)?$")


def signature(secret: bytes, body: bytes) -> str:
    """The header value for ``body``: ``sha256=<hex>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def _needs(config: Config) -> str | None:
    if not config.channels:
        return "needs a [channels.NAME] table (a webhook channel) in covenant.toml"
    return None


async def _send(call: BuiltinCall) -> dict[str, Any]:
    name, text = call.arguments["channel"], call.arguments["text"]
    channels = call.services.config.channels
    channel = channels.get(name)
    if channel is None:
        raise ToolError("invalid_arguments", f"no channel {name!r} (configured: {', '.join(sorted(channels))})")
    if len(text.encode("utf-8", "surrogatepass")) > TEXT_MAX_BYTES:
        raise ToolError("invalid_arguments", f"text is over {TEXT_MAX_BYTES} bytes of UTF-8")
    url, secret = os.environ.get(channel.url_env, ""), os.environ.get(channel.secret_env, "")
    if not _URL.match(url) or not secret:
        raise ToolError("tool_unavailable", f"channel {name!r} is not usable: the daemon's {channel.url_env} must hold an "
                        f"http(s) URL and {channel.secret_env} a key")
    message = {"agent": call.ctx.agent.id, "channel": name, "intent": call.ctx.intent_id,
               "sent_at": iso_ms(now_ms()), "text": text}
    if "recipient" in call.arguments:
        message["recipient"] = call.arguments["recipient"]
    body = canonical_bytes(message)
    import httpx  # loaded by the first message, not with the daemon

    headers = {"Content-Type": "application/json", SIGNATURE_HEADER: signature(secret.encode(), body)}
    try:
        async with httpx.AsyncClient(timeout=channel.timeout_s, follow_redirects=False, trust_env=False) as client:
            response = await client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        raise ToolError("tool_failed", f"channel {name!r} could not be reached: {type(exc).__name__}") from None
    if not 200 <= response.status_code < 300:
        raise ToolError("tool_failed", f"channel {name!r} answered HTTP {response.status_code}")
    answer: dict[str, Any] = {"sent": True, "channel": name, "status": response.status_code}
    if "recipient" in message:
        answer["recipient"] = message["recipient"]
    return answer


TOOL = Builtin(
    name="rune@channel-send",
    description=("Send a text message to one of the operator's configured channels (a signed webhook), "
                 "optionally for a recipient on it."),
    parameters={
        "type": "object",
        "properties": {"channel": {"type": "string", "minLength": 1, "maxLength": 63},
                       "text": {"type": "string", "minLength": 1, "maxLength": TEXT_MAX_BYTES},
                       "recipient": {"type": "string", "minLength": 1, "maxLength": 256}},
        "required": ["channel", "text"],
        "additionalProperties": False,
    },
    run=_send,
    needs=_needs,
)
