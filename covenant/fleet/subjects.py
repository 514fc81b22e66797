"""The fleet's fixed names (design/fleet.md §3): other tools and tests rely on them.

Pure; no I/O. A name that goes into a subject is written as a *token*: every
character outside ``[A-Za-z0-9_-]`` becomes ``_XX`` (its UTF-8 bytes in hex), so
``echo@local`` is ``echo_40local`` and no id can add a ``.``, ``*`` or ``>`` to
a subject. Plain hostnames and the CLI's intent ids (UUIDs) are their own token.
``_`` stays as it is (fleet.md fixes the encoding), so two ids can share a token
(``a_2eb@c`` and ``a.b@c``): the fleet process refuses to serve the second of
two loaded agents that do (see :func:`token_clashes`).
"""

from __future__ import annotations

__all__ = [
    "INTENTS_STREAM",
    "RESULTS_STREAM",
    "AUDIT_STREAM",
    "HOSTS_BUCKET",
    "INTENT_SUBJECTS",
    "RESULT_SUBJECTS",
    "AUDIT_SUBJECTS",
    "REPLY_HEADER",
    "MSG_ID_HEADER",
    "ADVISORY_MAX_DELIVERIES",
    "WORKER_QUEUE",
    "token",
    "token_clashes",
    "intent_subject",
    "result_subject",
    "audit_subject",
    "consumer_name",
]

INTENTS_STREAM = "COVENANT_INTENTS"
RESULTS_STREAM = "COVENANT_RESULTS"
AUDIT_STREAM = "COVENANT_AUDIT"
HOSTS_BUCKET = "COVENANT_HOSTS"

INTENT_SUBJECTS = "covenant.intent.>"
RESULT_SUBJECTS = "covenant.result.>"
AUDIT_SUBJECTS = "covenant.audit.>"

REPLY_HEADER = "Covenant-Reply"
MSG_ID_HEADER = "Nats-Msg-Id"

ADVISORY_MAX_DELIVERIES = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{INTENTS_STREAM}.*"
"""JetStream says here when an intent was delivered ``max_deliver`` times without an acknowledgement."""
WORKER_QUEUE = "covenant-fleet"
"""The queue group of every fleet process: one of them handles each advisory."""

_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def token(name: str) -> str:
    """``name`` as one subject token: ``echo@local`` -> ``echo_40local``."""
    return "".join(c if c in _SAFE else "".join(f"_{b:02x}" for b in c.encode("utf-8")) for c in name)


def token_clashes(names: list[str]) -> dict[str, str]:
    """Each name whose token an earlier name (in sorted order) already has -> that earlier name."""
    first: dict[str, str] = {}
    clashes: dict[str, str] = {}
    for name in sorted(names):
        earlier = first.setdefault(token(name), name)
        if earlier != name:
            clashes[name] = earlier
    return clashes


def intent_subject(agent_id: str) -> str:
    return f"covenant.intent.{token(agent_id)}"


def result_subject(intent_id: str) -> str:
    return f"covenant.result.{token(intent_id)}"


def audit_subject(host: str) -> str:
    return f"covenant.audit.{token(host)}"


def consumer_name(agent_id: str) -> str:
    """The durable pull consumer every host running ``agent_id`` shares."""
    return f"agent_{token(agent_id)}"
