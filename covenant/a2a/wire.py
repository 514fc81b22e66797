"""The A2A protocol's JSON, as covenant reads and writes it.

A2A 1.0 is the JSON mapping of its protobuf schema: camelCase fields, enum
names as strings (``ROLE_USER``, ``TASK_STATE_COMPLETED``), parts as
``{"text": …}``, results wrapped by kind (``{"task": …}``,
``{"artifactUpdate": …}``). A2A 0.3 tags objects with ``kind`` instead, and
spells states and roles in lower case. Requests are read in either version;
answers are written in the version the request used.

Only what covenant serves is modelled here: a message's text comes in, a task
with one text artifact goes out, and a file artifact for each file the intent's
tools handed back. Text, data (as JSON text) and raw-byte parts of
a text media type (``text/*``, ``application/json``; decoded as UTF-8) are read;
any other media type and every URL part are refused with
``ContentTypeNotSupported`` — the daemon fetches no URL a client names.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "V1", "V03", "Version", "RpcError", "IncomingMessage", "read_message", "task", "status_update",
    "artifact_update", "file_artifact", "file_update", "stream_result", "send_result", "rpc_result", "rpc_error", "agent_message", "TERMINAL",
    "ERROR_INFO_TYPE", "INPUT_REQUIRED", "STREAM_ENDS", "RAW_TEXT_MAX_BYTES", "returns_immediately",
]

V1 = "1.0"
V03 = "0.3"
Version = Literal["1.0", "0.3"]

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELED", "REJECTED"})
"""Task states (without the ``TASK_STATE_`` prefix) after which nothing changes."""

INPUT_REQUIRED = "INPUT_REQUIRED"
"""The interrupted state: the agent asked the user a question (``rune@ask-user``); a message naming the task
continues it."""

STREAM_ENDS = TERMINAL | {INPUT_REQUIRED}
"""States at which a stream of the task closes: nothing more comes until the client speaks again."""

RAW_TEXT_MAX_BYTES = 256 * 1024
"""Largest decoded raw part taken as text."""

_TEXT_MEDIA = ("application/json",)
_URL_SAFE = str.maketrans("-_", "+/")
_CHARSETS = ("utf-8", "utf8", "us-ascii")

_STATES_03 = {"SUBMITTED": "submitted", "WORKING": "working", "COMPLETED": "completed", "FAILED": "failed",
              "CANCELED": "canceled", "REJECTED": "rejected", "INPUT_REQUIRED": "input-required"}


class RpcError(Exception):
    """A JSON-RPC error answer: ``code`` from JSON-RPC or A2A, and the HTTP+JSON status that goes with it."""

    def __init__(self, code: int, message: str, http_status: int, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.http_status, self.data = code, message, http_status, data

    @classmethod
    def parse(cls, message: str) -> RpcError:
        return cls(-32700, message, 400)

    @classmethod
    def invalid_request(cls, message: str) -> RpcError:
        return cls(-32600, message, 400)

    @classmethod
    def method_not_found(cls, method: str) -> RpcError:
        return cls(-32601, f"method {method!r} is not served here", 404)

    @classmethod
    def invalid_params(cls, message: str) -> RpcError:
        return cls(-32602, message, 400)

    @classmethod
    def task_not_found(cls, task_id: str) -> RpcError:
        return cls(-32001, f"no task {task_id!r} for this client", 404)

    @classmethod
    def not_cancelable(cls, task_id: str, state: str) -> RpcError:
        return cls(-32002, f"task {task_id!r} is {state} and cannot be canceled", 409)

    @classmethod
    def push_not_supported(cls) -> RpcError:
        return cls(-32003, "push notifications are not supported by covenant", 400)

    @classmethod
    def unsupported(cls, message: str) -> RpcError:
        return cls(-32004, message, 400)

    @classmethod
    def content_type(cls, message: str) -> RpcError:
        return cls(-32005, message, 415)

    @classmethod
    def version(cls, given: str) -> RpcError:
        return cls(-32009, f"A2A-Version {given!r} is not supported; use 1.0 (or 0.3)", 400)

    @property
    def reason(self) -> str:
        """The ``google.rpc.ErrorInfo`` reason A2A names for this code."""
        return _REASONS.get(self.code, "INTERNAL_ERROR")

    def error_info(self) -> dict[str, Any]:
        """The ErrorInfo entry A2A errors carry (JSON-RPC ``error.data``, HTTP+JSON ``error.details``)."""
        info: dict[str, Any] = {"@type": ERROR_INFO_TYPE, "reason": self.reason, "domain": "a2a-protocol.org"}
        if self.data:
            info["metadata"] = {key: str(value) for key, value in self.data.items()}
        return info

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "data": [self.error_info()]}


ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
_REASONS = {
    -32700: "PARSE_ERROR", -32600: "INVALID_REQUEST", -32601: "METHOD_NOT_FOUND", -32602: "INVALID_PARAMS",
    -32603: "INTERNAL_ERROR", -32001: "TASK_NOT_FOUND", -32002: "TASK_NOT_CANCELABLE",
    -32003: "PUSH_NOTIFICATION_NOT_SUPPORTED", -32004: "UNSUPPORTED_OPERATION", -32005: "CONTENT_TYPE_NOT_SUPPORTED",
    -32006: "INVALID_AGENT_RESPONSE", -32007: "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
    -32008: "EXTENSION_SUPPORT_REQUIRED", -32009: "VERSION_NOT_SUPPORTED",
}


@dataclass(frozen=True)
class IncomingMessage:
    """What covenant takes from a client's message."""

    text: str
    message_id: str
    context_id: str | None
    task_id: str | None


def read_message(params: Any, version: Version) -> IncomingMessage:
    """The ``message`` of SendMessage params (1.0) or message/send params (0.3); RpcError when unusable."""
    if not isinstance(params, dict):
        raise RpcError.invalid_params("params must be an object holding a message")
    message = params.get("message")
    if not isinstance(message, dict):
        raise RpcError.invalid_params("params.message must be an object")
    role = message.get("role")
    if role not in (("ROLE_USER", 1) if version == V1 else ("user",)):
        raise RpcError.invalid_params(f"message.role must be {'ROLE_USER' if version == V1 else 'user'}")
    message_id = message.get("messageId")
    if not isinstance(message_id, str) or not message_id:
        raise RpcError.invalid_params("message.messageId must be a non-empty string")
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts:
        raise RpcError.invalid_params("message.parts must be a non-empty list")
    texts = [_part_text(part, index, version) for index, part in enumerate(parts)]
    context_id, task_id = message.get("contextId"), message.get("taskId")
    for name, value in (("contextId", context_id), ("taskId", task_id)):
        if value is not None and (not isinstance(value, str) or not value):
            raise RpcError.invalid_params(f"message.{name} must be a non-empty string when given")
    return IncomingMessage("\n".join(texts), message_id, context_id or None, task_id or None)


def returns_immediately(params: Any, version: Version) -> bool:
    """SendMessage's ``configuration.returnImmediately`` (1.0), or ``configuration.blocking: false`` (0.3)."""
    configuration = params.get("configuration") if isinstance(params, dict) else None
    if configuration is None:
        return False
    if not isinstance(configuration, dict):
        raise RpcError.invalid_params("params.configuration must be an object")
    name, immediate_when = ("returnImmediately", True) if version == V1 else ("blocking", False)
    value = configuration.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RpcError.invalid_params(f"configuration.{name} must be true or false")
    return value is immediate_when


def _part_text(part: Any, index: int, version: Version) -> str:
    where = f"message.parts[{index}]"
    if not isinstance(part, dict):
        raise RpcError.invalid_params(f"{where} must be an object")
    kind = part.get("kind") if version == V03 else None
    if isinstance(part.get("text"), str) and kind in (None, "text"):
        return part["text"]
    if "data" in part and kind in (None, "data"):
        return json.dumps(part["data"], ensure_ascii=False, sort_keys=True)
    if version == V1 and "raw" in part:
        return _raw_text(part["raw"], part.get("mediaType"), where, "raw", "mediaType")
    file = part.get("file") if version == V03 and kind == "file" else None
    if isinstance(file, dict) and "bytes" in file:
        return _raw_text(file["bytes"], file.get("mimeType"), f"{where}.file", "bytes", "mimeType")
    if (version == V1 and "url" in part) or (isinstance(file, dict) and "uri" in file):
        raise RpcError.content_type(f"{where} is a URL part: covenant fetches no URL a client names (the daemon "
                                    "would reach what it can reach for anyone who holds a token); send the "
                                    "content itself as a text or raw part")
    raise RpcError.content_type(f"{where}: covenant's agents take text, data and text-typed raw parts only")


def _raw_text(raw: Any, media_type: Any, where: str, field: str, type_field: str) -> str:
    """A raw part of a text media type, decoded: base64 of at most RAW_TEXT_MAX_BYTES bytes of UTF-8."""
    media = media_type.split(";")[0].strip().lower() if isinstance(media_type, str) else ""
    if not (media.startswith("text/") or media in _TEXT_MEDIA):
        said = f"{type_field} {str(media_type)[:80]!r} is not one covenant's agents read" if media_type else f"no {type_field}"
        raise RpcError.content_type(f"{where} has {said}: a raw part must be text/* or application/json")
    charset = next((p.split("=", 1)[1].strip().strip('"').lower() for p in media_type.split(";")[1:]
                    if p.strip().lower().startswith("charset=")), "utf-8")
    if charset not in _CHARSETS:
        raise RpcError.content_type(f"{where}: charset {charset[:40]!r} is not read; send UTF-8")
    if not isinstance(raw, str) or len(raw) > (RAW_TEXT_MAX_BYTES + 2) // 3 * 4:
        raise RpcError.invalid_params(f"{where}.{field} must be base64 of at most {RAW_TEXT_MAX_BYTES} bytes")
    try:  # proto3's JSON mapping: standard or URL-safe alphabet, padding optional
        data = base64.b64decode(raw.translate(_URL_SAFE) + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise RpcError.invalid_params(f"{where}.{field} is not valid base64") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RpcError.invalid_params(f"{where}.{field} is not UTF-8 text (byte {exc.start} of the decoded "
                                      "content); send text, or a media type that is not text") from None


def _parts(text: str, version: Version) -> list[dict[str, Any]]:
    return [{"text": text}] if version == V1 else [{"kind": "text", "text": text}]


def _state(state: str, version: Version) -> str:
    return f"TASK_STATE_{state}" if version == V1 else _STATES_03[state]


def agent_message(text: str, *, task_id: str, context_id: str, version: Version) -> dict[str, Any]:
    """A message from the agent: a failed task's reason, a rejected one's denial."""
    message = {"messageId": uuid.uuid4().hex, "contextId": context_id, "taskId": task_id,
               "role": "ROLE_AGENT" if version == V1 else "agent", "parts": _parts(text, version)}
    if version == V03:
        message["kind"] = "message"
    return message


def _status(state: str, *, task_id: str, context_id: str, timestamp: str, note: str | None,
            version: Version) -> dict[str, Any]:
    status: dict[str, Any] = {"state": _state(state, version), "timestamp": timestamp}
    if note:
        status["message"] = agent_message(note, task_id=task_id, context_id=context_id, version=version)
    return status


def _artifact(text: str, *, artifact_id: str, version: Version) -> dict[str, Any]:
    return {"artifactId": artifact_id, "name": "answer", "parts": _parts(text, version)}


def file_artifact(task_id: str, name: str, media_type: str, data: bytes, version: Version) -> dict[str, Any]:
    """A file the intent's tools handed back (rune@canvas-present, a screenshot) as an artifact with one file
    part: 1.0 ``{raw, mediaType, filename}``, 0.3 ``{kind: file, file: {name, mimeType, bytes}}``."""
    content = base64.b64encode(data).decode("ascii")
    part = ({"raw": content, "mediaType": media_type, "filename": name} if version == V1
            else {"kind": "file", "file": {"name": name, "mimeType": media_type, "bytes": content}})
    return {"artifactId": f"{task_id}-file-{name}", "name": name, "parts": [part]}


def task(task_id: str, context_id: str, state: str, *, timestamp: str, answer: str | None = None,
         note: str | None = None, files: tuple[dict[str, Any], ...] = (), version: Version) -> dict[str, Any]:
    """A task: its state (``COMPLETED`` …), the answer as its text artifact followed by ``files``
    (:func:`file_artifact`), a note as the status message."""
    document: dict[str, Any] = {
        "id": task_id, "contextId": context_id,
        "status": _status(state, task_id=task_id, context_id=context_id, timestamp=timestamp, note=note,
                          version=version),
    }
    if answer is not None or files:
        document["artifacts"] = ([] if answer is None else
                                 [_artifact(answer, artifact_id=f"{task_id}-answer", version=version)]) + list(files)
    if version == V03:
        document["kind"] = "task"
    return document


def status_update(task_id: str, context_id: str, state: str, *, timestamp: str, note: str | None = None,
                  version: Version) -> dict[str, Any]:
    event: dict[str, Any] = {
        "taskId": task_id, "contextId": context_id,
        "status": _status(state, task_id=task_id, context_id=context_id, timestamp=timestamp, note=note,
                          version=version),
    }
    if version == V03:
        event.update(kind="status-update", final=state in STREAM_ENDS)
    return event


def artifact_update(task_id: str, context_id: str, text: str, *, append: bool, last: bool,
                    version: Version) -> dict[str, Any]:
    event: dict[str, Any] = {"taskId": task_id, "contextId": context_id,
                             "artifact": _artifact(text, artifact_id=f"{task_id}-answer", version=version),
                             "append": append, "lastChunk": last}
    if version == V03:
        event["kind"] = "artifact-update"
    return event


def file_update(task_id: str, context_id: str, artifact: dict[str, Any], *, version: Version) -> dict[str, Any]:
    """A streamed :func:`file_artifact`, whole in one event."""
    event: dict[str, Any] = {"taskId": task_id, "contextId": context_id, "artifact": artifact,
                             "append": False, "lastChunk": True}
    if version == V03:
        event["kind"] = "artifact-update"
    return event


def send_result(task_document: dict[str, Any], version: Version) -> dict[str, Any]:
    """The result of SendMessage (1.0: wrapped by kind) or message/send (0.3: the task itself)."""
    return {"task": task_document} if version == V1 else task_document


_KINDS = {"task": "task", "status-update": "statusUpdate", "artifact-update": "artifactUpdate"}


def stream_result(kind: Literal["task", "status-update", "artifact-update"], event: dict[str, Any],
                  version: Version) -> dict[str, Any]:
    """One streamed event: 1.0 wraps it by kind (a StreamResponse), 0.3 sends it as is (tagged by ``kind``)."""
    return {_KINDS[kind]: event} if version == V1 else event


def rpc_result(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def rpc_error(request_id: Any, error: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": error.body()}
