"""The daemon-held model gateway: every model call of every Rune agent goes through here.

The replica sends its turn (neutral OpenAI-format messages and tools); the gateway picks the
provider and model (:mod:`covenant.models.plan`), adds the key (read from the daemon's
environment at call time, sent only as the provider's auth header), enforces the intent's token
budget from the providers' usage, falls back between providers, and records one ``model.call``
audit event per provider attempt. The key never appears in an audit event, a log line or an error
message.

Failure rules (docs/providers.md):

- the budget already spent (``used >= limit``) → ``ModelError("token_budget_exceeded")`` and no
  request; an answer that crosses the limit is returned, and the *next* call is refused;
- no provider can be tried → ``provider_unavailable``;
- connect error, timeout (``timeout_s``, connect to last byte), 429 or 5xx → with
  ``next_provider`` the next provider is tried (a 429 whose ``retry-after`` is at most
  :data:`RETRY_AFTER_MAX_S` is first retried once on the same provider); with ``fail``, or after
  the last provider, ``provider_error`` naming every attempt;
- any other HTTP error (400, 401, 404 …) or a malformed answer → ``provider_error`` at once;
- a streamed answer that fails after text was already passed to ``on_token`` is not retried
  elsewhere (the reader has seen it) → ``provider_error``.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import trio

from covenant import outside_json
from covenant.audit.events import MODEL_CALL
from covenant.config import ProviderConfig
from covenant.models.adapter import Adapter, StreamAssembler
from covenant.models.anthropic import AnthropicAdapter
from covenant.models.http import HttpResponse, ProviderHttp, ProviderImpostor, TransportError
from covenant.models.openai import OpenAIAdapter
from covenant.models.plan import ModelPlan, PlannedProvider, plan_models, usable_key
from covenant.sse import SseEvent, SseParser
from covenant.models.validate import check_request
from covenant.runtime.sockets import local_peer_uid
from covenant.models.types import (
    AgentModels,
    Answer,
    AuditSink,
    CallObserver,
    ChatResult,
    ModelCall,
    ModelError,
    ProviderProtocolError,
)

__all__ = ["ModelGateway", "MODEL_CALL", "RETRY_AFTER_MAX_S", "TokenCallback"]

RETRY_AFTER_MAX_S = 2.0
"""A 429 is retried on the same provider only when its retry-after asks for at most this long."""

TokenCallback = Callable[[str], Awaitable[None]]

_ADAPTERS: dict[str, Adapter] = {"openai": OpenAIAdapter(), "anthropic": AnthropicAdapter()}
_EXCERPT = 300
_SHIELDED_RECORD_S = 10.0
log = logging.getLogger("covenant.models")


@dataclass
class _Attempt:
    """How one provider request ended."""

    answer: Answer | None = None
    http_status: int | None = None
    reason: str = ""
    may_fall_back: bool = False
    retry_after: float | None = None
    text_delivered: bool = False
    error_code: str | None = None
    """``provider_impostor`` when the daemon refused the connection before sending anything."""
    failure: str = "bad_answer"
    """How it failed, for metrics (covenant.models.types.CallObserver); meaningless when ``answer`` is set."""


def _retry_after(value: str | None) -> float | None:
    """Seconds from a retry-after header (delta-seconds or an HTTP date); None when absent or garbled."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _estimate(data: Any) -> int:
    """Tokens by the common rule of thumb (one per 4 bytes), for a provider that reports no usage."""
    return max(1, len(json.dumps(data, ensure_ascii=False).encode()) // 4)


class ModelGateway:
    """Model calls for every Rune agent of one daemon.

    Example::

        gateway = ModelGateway(config.providers, environ=os.environ, audit=audit_sink)
        budget = TokenBudget(limit=50_000)
        call = ModelCall(intent_id, "triage@local", AgentModels.from_runefile(runefile), budget)
        result = await gateway.chat(call, messages, tools)
        ...
        await gateway.aclose()

    ``environ`` is read at every call (a key set or rotated later is picked up). ``observe`` is
    the metrics hook, called once per provider attempt. One :class:`ProviderHttp` per provider,
    made on first use, keeps connections open between calls.
    """

    def __init__(
        self,
        providers: Mapping[str, ProviderConfig],
        *,
        environ: Mapping[str, str],
        audit: AuditSink,
        store_text: bool = False,
        observe: CallObserver | None = None,
        is_agent_uid: Callable[[int], bool] | None = None,
    ) -> None:
        self._providers = dict(providers)
        self._is_agent_uid = is_agent_uid
        """Owners a provider's connection must not have: agent uids (of this home or any other)."""
        self._environ = environ
        self._audit = audit
        self._store_text = store_text
        self._observe = observe
        # Keyed by name and config, so a call that began before a reload keeps the client it
        # planned with; clients of replaced configs are retired, and closed by aclose().
        self._clients: dict[tuple[str, ProviderConfig], ProviderHttp] = {}
        self._retired: list[ProviderHttp] = []

    # --- configuration ---------------------------------------------------------------------------

    def plan(self, models: AgentModels, alias: str | None = None) -> ModelPlan:
        """Which provider and model a call would use now, which are skipped and why (for dry-run)."""
        return plan_models(models, self._providers, self._environ, alias)

    def reconfigure(self, providers: Mapping[str, ProviderConfig]) -> None:
        """Take a reloaded ``[providers]`` for the calls that start from now on.

        Calls already under way finish with the config they started with; the clients of changed
        or removed providers are retired (closed by :meth:`aclose`, not under a running request).
        """
        self._providers = dict(providers)
        for key in [key for key in self._clients if self._providers.get(key[0]) != key[1]]:
            self._retired.append(self._clients.pop(key))

    async def aclose(self) -> None:
        """Close every HTTP client (and so every connection to a provider)."""
        clients = [*self._clients.values(), *self._retired]
        self._clients, self._retired = {}, []
        for client in clients:
            await client.aclose()

    def _client(self, name: str, config: ProviderConfig) -> ProviderHttp:
        client = self._clients.get((name, config))
        if client is None:
            guard = self._refuse_agent_peer if self._is_agent_uid is not None else None
            client = ProviderHttp(config.base_url, max_connections=config.max_connections, peer_guard=guard)
            self._clients[(name, config)] = client
        return client

    async def _refuse_agent_peer(self, sock: trio.socket.SocketType) -> str | None:
        """Why a new connection must not carry a key: its other end is a process of an agent uid on this
        host (an agent listening where a provider should be, e.g. on a free loopback port)."""
        assert self._is_agent_uid is not None
        uid = await trio.to_thread.run_sync(local_peer_uid, sock)
        if uid is not None and self._is_agent_uid(uid):
            return f"the server listening there runs as agent uid {uid}, not as the provider"
        return None

    # --- calls -----------------------------------------------------------------------------------

    async def chat(
        self,
        call: ModelCall,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        on_token: TokenCallback | None = None,
    ) -> ChatResult:
        """One assistant turn for ``messages`` with ``tools`` offered; raises :class:`ModelError`.

        ``messages`` and ``tools`` come from the replica and are checked first
        (``protocol_error``, no request made).

        With ``on_token`` the provider streams and each text delta is awaited through it as it
        arrives; the returned :class:`ChatResult` is the same either way.
        """
        check_request(messages, tools)
        budget = call.budget
        if budget.spent:
            raise ModelError(
                "token_budget_exceeded",
                f"agent {call.agent_id}: the intent's token budget is spent ({budget.used} of {budget.limit} tokens used)",
            )
        providers = self._providers  # this call's view, whatever a reload does meanwhile
        plan = plan_models(call.models, providers, self._environ, call.alias)
        if not plan.attempts:
            raise ModelError("provider_unavailable", f"agent {call.agent_id}: {plan.problem}")
        failures: list[str] = []
        number = 0
        for planned in plan.attempts:
            planned, lora = _with_adapter(planned, providers[planned.provider], call.adapter)
            if lora is _NO_ADAPTER:
                failures.append(f"{planned.provider}: its [providers.{planned.provider}] adapters has no {call.adapter!r}")
                continue
            retried = False
            while True:
                number += 1
                attempt = await self._attempt(call, planned, providers[planned.provider], number, messages, tools, on_token,
                                              lora=lora)
                if attempt.answer is not None:
                    answer = attempt.answer
                    return ChatResult(answer.message, answer.input_tokens or 0, answer.output_tokens or 0,
                                      planned.provider, planned.model)
                failures.append(f"{planned.provider} ({planned.model}): {attempt.reason}")
                wait = attempt.retry_after
                if wait is not None and wait <= RETRY_AFTER_MAX_S and not retried and not attempt.text_delivered:
                    retried = True
                    await trio.sleep(wait)
                    continue
                break
            if not attempt.may_fall_back or attempt.text_delivered or call.models.fallback_policy == "fail":
                break
        raise ModelError("provider_error", f"agent {call.agent_id}: " + "; ".join(failures))

    async def generate_image(self, call: ModelCall, provider: str, model: str, prompt: str, size: str | None) -> bytes:
        """One image from ``[providers.<provider>]``'s OpenAI-compatible images endpoint; raises :class:`ModelError`.

        ``POST {base_url}/images/generations`` with ``{model, prompt, n: 1, response_format: "b64_json"}`` (and
        ``size``), the key in the auth header as for chat; one ``model.call`` event (no tokens: images are not
        counted against the token budget). No fallback: the operator named this one provider for images.
        """
        config = self._providers.get(provider)
        if config is None or config.kind != "openai":
            raise ModelError("provider_unavailable", f"[providers.{provider}] is not an openai-kind provider of this daemon")
        key = self._environ.get(config.api_key_env) if config.api_key_env else None
        if config.api_key_env and not usable_key(key):
            raise ModelError("provider_unavailable", f"the daemon's environment variable {config.api_key_env} is not set or "
                                                     "not usable")
        planned = PlannedProvider(provider, config.kind, config.base_url, model)
        body: dict[str, Any] = {"model": model, "prompt": prompt, "n": 1, "response_format": "b64_json"}
        if size is not None:
            body["size"] = size
        headers = {"content-type": "application/json", "accept": "application/json", **_ADAPTERS["openai"].headers(config, key)}
        attempt = _Attempt()
        started = time.perf_counter()
        image = b""
        try:
            with trio.fail_after(config.timeout_s):
                path = urlsplit(config.base_url.rstrip("/") + "/images/generations").path
                async with self._client(provider, config).post(path, headers, json.dumps(body).encode()) as response:
                    attempt.http_status = response.status
                    if response.status != 200:
                        await self._refused(_ADAPTERS["openai"], response, attempt)
                    else:
                        image = _image_of(outside_json.loads(await response.aread()))
                        attempt.answer = Answer({"role": "assistant", "content": ""}, 0, 0)
        except trio.TooSlowError:
            attempt.reason = f"no image within timeout_s = {config.timeout_s:g} s"
        except (TransportError, ProviderImpostor) as exc:
            attempt.reason = str(exc)[:_EXCERPT]
        except (ProviderProtocolError, ValueError) as exc:
            attempt.reason = f"the answer is not an images response: {exc}"[:_EXCERPT]
        if key:
            attempt.reason = attempt.reason.replace(key, "[redacted]")
        await self._record(call, planned, 1, attempt, int((time.perf_counter() - started) * 1000),
                           [{"role": "user", "content": prompt}])
        if attempt.answer is None:
            raise ModelError("provider_error", f"agent {call.agent_id}: {provider} ({model}): {attempt.reason}")
        return image

    async def _attempt(
        self,
        call: ModelCall,
        planned: PlannedProvider,
        config: ProviderConfig,
        number: int,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_token: TokenCallback | None,
        *,
        lora: str | None = None,
    ) -> _Attempt:
        """One provider request, its audit event and metrics; never raises for provider trouble."""
        adapter = _ADAPTERS[config.kind]
        key = self._environ.get(config.api_key_env) if config.api_key_env else None
        if config.api_key_env and not usable_key(key):
            # Unset since plan() looked: like a skipped provider, no request and no event.
            reason = f"the daemon's environment variable {config.api_key_env} is not set or not usable"
            return _Attempt(reason=reason, may_fall_back=True)
        started = time.perf_counter()
        attempt = _Attempt()
        url, headers, body = adapter.request(config, planned.model, messages, tools, key=key, stream=on_token is not None)
        if lora is not None:
            body["lora"] = lora
        try:
            await self._send(config, planned, adapter, url, headers, body, on_token, attempt)
        except BaseException:
            # Cancelled (the intent's timeout, a reader that went away) or on_token failed:
            # the request was made, so it is still recorded, shielded from that cancellation.
            attempt.answer, attempt.reason, attempt.failure = None, "interrupted", "interrupted"
            ms = int((time.perf_counter() - started) * 1000)
            with trio.CancelScope(shield=True), trio.move_on_after(_SHIELDED_RECORD_S):
                await self._record(call, planned, number, attempt, ms, messages)
            raise
        if attempt.answer is not None:
            answer = attempt.answer
            if answer.input_tokens is None:
                answer.input_tokens = _estimate([body.get("messages"), tools])
            if answer.output_tokens is None:
                answer.output_tokens = _estimate(answer.message)
            call.budget.used += answer.input_tokens + answer.output_tokens
        ms = int((time.perf_counter() - started) * 1000)
        if key:
            attempt.reason = attempt.reason.replace(key, "[redacted]")
        await self._record(call, planned, number, attempt, ms, messages)
        if attempt.answer is None:
            log.warning("model call failed: agent=%s intent=%s provider=%s attempt=%d: %s",
                        call.agent_id, call.intent_id, planned.provider, number, attempt.reason)
        return attempt

    async def _send(
        self,
        config: ProviderConfig,
        planned: PlannedProvider,
        adapter: Adapter,
        url: str,
        headers: dict[str, str],
        body: dict[str, Any],
        on_token: TokenCallback | None,
        attempt: _Attempt,
    ) -> None:
        """Make the request and fill in ``attempt``; provider trouble is recorded there, not raised."""
        client = self._client(planned.provider, config)
        content = json.dumps(body, ensure_ascii=False).encode()
        try:
            with trio.fail_after(config.timeout_s):
                async with client.post(urlsplit(url).path, headers, content) as response:
                    attempt.http_status = response.status
                    if response.status != 200:
                        await self._refused(adapter, response, attempt)
                    elif on_token is None:
                        attempt.answer = adapter.answer(outside_json.loads(await response.aread()))
                    else:
                        attempt.answer = await self._stream(adapter, response, on_token, attempt)
        except trio.TooSlowError:
            attempt.reason = f"no complete answer within timeout_s = {config.timeout_s:g} s"
            attempt.failure = "timeout"
            attempt.may_fall_back = True
        except ProviderImpostor as exc:
            attempt.reason = str(exc)[:_EXCERPT]
            attempt.error_code = "provider_impostor"
            attempt.failure = "impostor"
            attempt.may_fall_back = True
            log.error("provider impostor refused: %s", exc, extra={"provider": planned.provider})
        except TransportError as exc:
            attempt.reason = str(exc)[:_EXCERPT]
            attempt.failure = "unreachable"
            attempt.may_fall_back = True
        except (ProviderProtocolError, ValueError) as exc:
            attempt.reason = f"the answer does not follow the {config.kind} format: {exc}"[:_EXCERPT]
        if attempt.answer is None and not attempt.reason:
            attempt.reason = "the stream ended before the answer was complete"
            attempt.may_fall_back = True

    async def _refused(self, adapter: Adapter, response: HttpResponse, attempt: _Attempt) -> None:
        status = response.status
        raw = await response.aread()
        try:
            detail = adapter.error_message(outside_json.loads(raw))
        except ValueError:
            detail = None
        if detail is None:
            detail = raw[:_EXCERPT].decode("utf-8", "replace").strip()
        attempt.reason = f"HTTP {status}" + (f": {detail[:_EXCERPT]}" if detail else "")
        attempt.failure = "rate_limited" if status == 429 else "http_error"
        attempt.may_fall_back = status == 429 or status >= 500
        if status == 429:
            attempt.retry_after = _retry_after(response.headers.get("retry-after"))

    async def _stream(
        self, adapter: Adapter, response: HttpResponse, on_token: TokenCallback, attempt: _Attempt
    ) -> Answer | None:
        assembler = adapter.assembler()
        parser = SseParser()
        # Read on past the end marker to the end of the body (within timeout_s), so the
        # connection goes back to the pool instead of being closed half-read.
        while (data := await response.chunk()) is not None:
            for event in parser.feed(data):
                if not assembler.done:
                    await self._take(assembler, event, on_token, attempt)
        for event in parser.end():
            if not assembler.done:
                await self._take(assembler, event, on_token, attempt)
        return assembler.answer() if assembler.done else None

    @staticmethod
    async def _take(assembler: StreamAssembler, event: SseEvent, on_token: TokenCallback, attempt: _Attempt) -> None:
        """Feed one event to the assembler and pass the text it adds on."""
        text = assembler.feed(event)
        if text:
            attempt.text_delivered = True
            await on_token(text)

    async def _record(
        self,
        call: ModelCall,
        planned: PlannedProvider,
        number: int,
        attempt: _Attempt,
        ms: int,
        messages: list[dict[str, Any]],
    ) -> None:
        answer = attempt.answer
        input_tokens = (answer.input_tokens or 0) if answer else 0
        output_tokens = (answer.output_tokens or 0) if answer else 0
        outcome = "ok" if answer is not None else "error"
        data: dict[str, Any] = {
            "intent": call.intent_id,
            "agent": call.agent_id,
            "provider": planned.provider,
            "model": planned.model,
            "attempt": number,
            "http_status": attempt.http_status,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "outcome": outcome,
            "error_code": attempt.error_code,
            "ms": ms,
        }
        if self._store_text:
            data["prompt"] = json.dumps(messages, ensure_ascii=False)
            data["answer"] = json.dumps(answer.message, ensure_ascii=False) if answer else None
        if self._observe is not None:
            self._observe(call.agent_id, planned.provider, outcome if answer is not None else attempt.failure,
                          input_tokens, output_tokens, number)
        await self._audit(MODEL_CALL, data)


def _image_of(data: Any) -> bytes:
    """The first image of an OpenAI images response (``data[0].b64_json``), decoded."""
    items = data.get("data") if isinstance(data, dict) else None
    encoded = items[0].get("b64_json") if isinstance(items, list) and items and isinstance(items[0], dict) else None
    if not isinstance(encoded, str) or not encoded:
        raise ProviderProtocolError("no data[0].b64_json in it")
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error as exc:
        raise ProviderProtocolError(f"data[0].b64_json is not base64: {exc}") from None


_NO_ADAPTER = "\0no adapter"
"""What :func:`_with_adapter` answers for a provider that maps no such adapter id (never a LoRA name: a NUL)."""


def _with_adapter(planned: PlannedProvider, config: ProviderConfig, adapter: str | None) -> tuple[PlannedProvider, str | None]:
    """The provider attempt for ``adapter`` and the ``lora`` field to send: its ``adapters`` name sent as the model
    (``adapter_field = "model"``) or as ``lora`` beside the usual model; ``_NO_ADAPTER`` when it maps none."""
    if adapter is None:
        return planned, None
    name = dict(config.adapters or ()).get(adapter)
    if name is None:
        return planned, _NO_ADAPTER
    if config.adapter_field == "model":
        return replace(planned, model=name), None
    return planned, name
