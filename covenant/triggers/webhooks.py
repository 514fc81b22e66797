"""Signed HTTP triggers: ``[[webhooks.routes]]`` served on ``[webhooks] listen`` (docs/triggers.md).

A request is accepted only with ``Covenant-Signature: t=<unix s>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>``
(compared in constant time), ``t`` within ``skew_s``, a signature never accepted before and the route
under its rate. Order: body cap (413), signature (401 ``bad_signature``), age (401 ``stale_signature``),
replay (409 ``replayed_signature``), rate (429 ``rate_limited``). An accepted request is audited as
``webhook.request`` with its signature before it is dispatched, so the audit log is the durable replay
store (restored at start, like intent ids). The secret is read from the daemon's environment by name
and never written anywhere.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from covenant import outside_json
from covenant.audit.recent import records_since
from covenant.audit.refusals import RefusalThrottle
from covenant.clock import now_ms
from covenant.errors import ConfigProblems, CovenantError, error_document
from covenant.ratelimit import MinuteRate
from covenant.triggers.onbehalf import Dispatcher, OnBehalfSigner, issuer_pubkey, secret_from_env
from covenant.triggers.webhook_config import WebhookRoute, WebhooksConfig, rate_per_minute

__all__ = ["WebhookApp", "answer_of", "signature_header", "resolve_routes"]

log = logging.getLogger("covenant.daemon")

_HEADER = re.compile(r"^t=(\d{1,12}),v1=([0-9a-f]{64})$")
_REQUEST = frozenset({"webhook.request"})


def signature_header(secret: bytes, t: int, body: bytes) -> str:
    """The ``Covenant-Signature`` value a sender computes (tests, docs' worked example)."""
    mac = hmac.new(secret, str(t).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


class _Route:
    def __init__(self, config: WebhookRoute, secret: bytes, pubkey: str) -> None:
        self.config = config
        self.secret = secret
        self.pubkey = pubkey
        self.rate = MinuteRate(rate_per_minute(config.rate))


def resolve_routes(config: WebhooksConfig, known: dict[str, str], environ: Mapping[str, str]) -> dict[str, _Route]:
    """path -> route; ConfigError naming each route with an unknown issuer or an unset secret variable."""
    routes, problems = {}, ConfigProblems()
    for route in config.routes:
        where = f"[[webhooks.routes]] {route.path}"
        pubkey = secret = None
        with problems.gathered():
            pubkey = issuer_pubkey(known, route.issuer, where=where, field="webhooks.routes.issuer")
        with problems.gathered():
            secret = secret_from_env(environ, route.secret_env, where=where, field="webhooks.routes.secret_env",
                                     what="the route's secret")
        if pubkey is not None and secret is not None:
            routes[route.path] = _Route(route, secret.encode(), pubkey)
    problems.raise_any()
    return routes


class _ClientGone(Exception):
    """The client hung up, or was too slow, before its body was whole: there is no one to answer."""


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


Audit = Callable[[str, dict[str, Any]], Awaitable[Any]]


class WebhookApp:
    """The ASGI app of the webhook listener."""

    def __init__(self, config: WebhooksConfig, routes: dict[str, _Route], signer: OnBehalfSigner,
                 audit: Audit, daemon: Dispatcher) -> None:
        self.config = config
        self.routes = routes
        self.signer = signer
        self.audit = audit
        self.daemon = daemon
        self.skew_s = config.skew_s
        self.max_body = config.max_body_kb * 1024
        self.seen: dict[str, int] = {}
        self.refusals = RefusalThrottle(config.audit_refusals_per_minute)

    def set_routes(self, config: WebhooksConfig, routes: dict[str, _Route]) -> None:
        """Take a reloaded ``[webhooks]`` (its listener and ``skew_s`` stay as started): the requests that
        arrive from now on find the new routes; a route whose table and secret are unchanged keeps its rate
        count, and the accepted signatures are still remembered."""
        kept = {path: old for path, old in self.routes.items()
                if (new := routes.get(path)) is not None and new.config == old.config and new.secret == old.secret}
        self.routes = {**routes, **kept}
        self.max_body = config.max_body_kb * 1024
        if config.audit_refusals_per_minute != self.config.audit_refusals_per_minute:
            self.refusals = RefusalThrottle(config.audit_refusals_per_minute)
        self.config = config

    async def restore(self, audit_dir: Any) -> int:
        """Reload the signatures accepted within the skew window from the audit log; call before serving."""
        since = now_ms() - 2 * self.skew_s * 1000 - 60_000
        records = await trio.to_thread.run_sync(records_since, audit_dir, since, _REQUEST)
        for data in (r["data"] for r in records):
            if data.get("outcome") == "accepted" and isinstance(data.get("signature"), str) and type(data.get("t")) is int:
                self.seen[data["signature"]] = data["t"]
        return len(self.seen)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        route = self.routes.get(path)
        try:
            if route is None:
                raise _Refused(404, "no_route", f"no webhook route {path!r}")
            if scope.get("method") != "POST":
                raise _Refused(405, "method_not_allowed", "webhooks accept POST only")
            body = await self._body(scope, receive)
            t, signature = self._verify(route, scope, body)
            text = _intent_text(body)
            self.seen[signature] = t  # before any await: two copies of one request cannot both pass
            if route.rate.over(time.monotonic()):
                del self.seen[signature]
                raise _Refused(429, "rate_limited", f"route {path} accepts {route.config.rate}; try again later")
        except _ClientGone:
            return
        except _Refused as refused:
            suppressed = self.refusals.admit((route and path, refused.code))
            if suppressed is not None:
                log.warning("webhook request refused", extra={"route": path[:256], "code": refused.code,
                                                              "status": refused.status})
                await self.audit("webhook.request", {"route": path[:256], "outcome": refused.code,
                                                     "status": refused.status, "suppressed": suppressed})
            await _send(send, refused.status, error_document(refused.code, refused.message))
            return
        request = self.signer.body(text, agent=route.config.agent, issuer_display=route.config.issuer,
                                   issuer_pubkey=route.pubkey, now_ms=now_ms())
        await self.audit("webhook.request", {"route": path, "outcome": "accepted", "status": None, "t": t,
                                             "signature": signature, "intent": request["intent"]["id"]})
        try:
            document = await self.signer.dispatch(self.daemon, request)
        except CovenantError as exc:
            await _send(send, exc.http_status, exc.to_json())
            return
        await _send(send, 200, answer_of(document))

    async def _body(self, scope: dict, receive: Any) -> bytes:
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body:
                raise _Refused(413, "body_too_large", f"the body is over max_body_kb = {self.config.max_body_kb}")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise _Refused(413, "body_too_large", f"the body is over max_body_kb = {self.config.max_body_kb}")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    def _verify(self, route: _Route, scope: dict, body: bytes) -> tuple[int, str]:
        header = next((v for k, v in scope.get("headers", []) if k == b"covenant-signature"), b"")
        match = _HEADER.match(header.decode("latin-1"))
        if match is None:
            raise _Refused(401, "bad_signature", "Covenant-Signature must read t=<unix seconds>,v1=<64 hex>")
        t, given = int(match.group(1)), match.group(2)
        expected = hmac.new(route.secret, match.group(1).encode() + b"." + body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, given):
            raise _Refused(401, "bad_signature", "the signature does not match this route's secret and the body")
        now = int(time.time())
        if abs(now - t) > self.skew_s:
            raise _Refused(401, "stale_signature", f"t is {abs(now - t)} s from the daemon's clock; "
                                                   f"the accepted skew is {self.skew_s} s")
        horizon = now - self.skew_s
        for old in [s for s, seen_t in self.seen.items() if seen_t < horizon]:
            del self.seen[old]
        if given in self.seen:
            raise _Refused(409, "replayed_signature", "this signature was accepted before; sign each request afresh")
        return t, given


def answer_of(document: dict[str, Any]) -> dict[str, Any]:
    """What a sender learns of its dispatch: the intent id, the outcome and the agent's text. Never the dispatch
    record (argv, paths, pid, uid, stderr), which is for the home's operators (``covenant show``)."""
    return {"intent_id": document["intent_id"], "outcome": document["outcome"], "text": document.get("text")}


def _intent_text(body: bytes) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _Refused(400, "bad_body", "the body must be UTF-8 text or a JSON object {\"text\": …}") from None
    if text.lstrip().startswith("{"):
        try:
            document = outside_json.loads(text, surrogates="refuse")
        except outside_json.LoneSurrogate:
            raise _Refused(400, "bad_body", "the body holds a lone surrogate (such as \\ud800): send valid "
                                            "Unicode text") from None
        except ValueError as exc:
            raise _Refused(400, "bad_body", f"the body starts with {{ but is not JSON: {exc}") from None
        if not isinstance(document, dict) or not isinstance(document.get("text"), str):
            raise _Refused(400, "bad_body", 'a JSON body must be an object with "text": a string')
        return document["text"]
    return text


async def _send(send: Any, status: int, document: Any) -> None:
    data = json.dumps(document).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
