"""``rune@image-analyze`` and ``rune@image-generate``: images through the agent's providers, files in its workspace.

- image-analyze sends the image to the agent's own model as one user turn (an OpenAI-compatible
  ``image_url`` part holding a data URL; the Anthropic adapter makes it an image block), through the
  daemon's gateway like any model call of the intent (its providers, its token budget, a ``model.call``
  event). Whether the model can see images is the provider's to say: a refusal is the call's error.
- image-generate asks the one provider ``[tools.media] images_provider`` names at its OpenAI-compatible
  images endpoint (``POST {base_url}/images/generations``); without it the tool is unavailable, saying so.

The daemon neither decodes nor renders an image: it reads or writes the workspace file as file-read and
file-write do (:class:`~covenant.tools.workspace.Workspace`: beneath the workspace, never through a
symlink, the agent's own files, written as the agent's uid) and checks the format by its first bytes.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from typing import Any

import trio

from covenant.config import Config
from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.context import IntentModels
from covenant.tools.result import ToolError

__all__ = ["TOOLS", "ask_about_image", "image_type", "read_image"]

_DEFAULT_QUESTION = "Describe this image: what it shows, any text in it, and anything notable."
_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"WEBP", 8, "image/webp"),
)


def image_type(data: bytes) -> str | None:
    """The media type of PNG, JPEG, GIF or WebP bytes by their signature, or None (any other bytes)."""
    for signature, offset, media_type in _SIGNATURES:
        if data[offset:offset + len(signature)] == signature and (media_type != "image/webp" or data[:4] == b"RIFF"):
            return media_type
    return None


def _models(call: BuiltinCall, tool: str) -> IntentModels:
    if call.ctx.models is None:
        raise ToolError("tool_unavailable", f"{tool} calls the agent's providers through the daemon's gateway, which this "
                                            "run has not (covenant run); dispatch it to the daemon")
    return call.ctx.models


async def read_image(call: BuiltinCall, path: str) -> tuple[bytes, str]:
    """The workspace image at ``path`` and its media type (as file-read opens it, at most ``image_max_bytes``)."""
    limits = call.services.config.tools.media
    workspace = await trio.to_thread.run_sync(call.services.workspace, call.ctx.agent.id)
    data = await trio.to_thread.run_sync(workspace.read_bytes, path, limits.image_max_bytes, "[tools.media] image_max_bytes")
    media_type = image_type(data)
    if media_type is None:
        raise ToolError("media_unreadable", f"{path!r} is not a PNG, JPEG, GIF or WebP image")
    return data, media_type


async def ask_about_image(models: IntentModels, data: bytes, media_type: str, question: str | None) -> str:
    """The agent's model's answer to ``question`` (default: describe it) about the image, in one user turn."""
    url = f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"
    return await models.ask([{"role": "user", "content": [
        {"type": "text", "text": question or _DEFAULT_QUESTION},
        {"type": "image_url", "image_url": {"url": url}},
    ]}])


async def _analyze(call: BuiltinCall) -> dict[str, Any]:
    models = _models(call, "image-analyze")
    path = call.arguments["path"]
    data, media_type = await read_image(call, path)
    answer = await ask_about_image(models, data, media_type, call.arguments.get("prompt"))
    return {"path": path, "media_type": media_type, "bytes": len(data), "analysis": answer}


def _images_problem(config: Config) -> str | None:
    media = config.tools.media
    if media.images_provider is None:
        return ("needs [tools.media] images_provider: an openai-kind [providers.NAME] whose base_url serves "
                "POST /images/generations (and images_model, unless the provider sets model)")
    provider = config.providers.get(media.images_provider)
    if provider is None:
        return f"[tools.media] images_provider names {media.images_provider!r}, which is no [providers.NAME] of this daemon"
    if provider.kind != "openai":
        return (f"[tools.media] images_provider {media.images_provider!r} is kind {provider.kind!r}; the images endpoint "
                "is OpenAI's (kind openai)")
    if media.images_model is None and provider.model is None:
        return f"[tools.media] images_model is unset and [providers.{media.images_provider}] sets no model"
    return None


async def _generate(call: BuiltinCall) -> dict[str, Any]:
    models = _models(call, "image-generate")
    config = call.services.config
    problem = _images_problem(config)
    if problem is not None:  # changed by a reload since the toolset was resolved
        raise ToolError("tool_unavailable", problem)
    media = config.tools.media
    provider = str(media.images_provider)
    model = media.images_model or str(config.providers[provider].model)
    data = await models.generate_image(provider, model, call.arguments["prompt"], call.arguments.get("size"))
    media_type = image_type(data)
    if media_type is None:
        raise ToolError("tool_failed", f"{provider} answered bytes that are not a PNG, JPEG, GIF or WebP image")
    path = call.arguments.get("path") or f"image-{secrets.token_hex(4)}.{media_type.split('/')[1]}"
    workspace = await trio.to_thread.run_sync(call.services.workspace, call.ctx.agent.id)
    await trio.to_thread.run_sync(workspace.write_bytes, path, data, media.output_max_bytes, "[tools.media] output_max_bytes")
    return {"path": path, "media_type": media_type, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "provider": provider, "model": model}


TOOLS = (
    Builtin(
        name="rune@image-analyze",
        description=("Look at a PNG, JPEG, GIF or WebP image in your workspace with your own model and answer prompt "
                     "about it (default: describe it). Returns the analysis text."),
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1, "maxLength": 4096, "description": "the image in your workspace"},
                "prompt": {"type": "string", "minLength": 1, "maxLength": 4000, "description": "what to ask about it"},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        run=_analyze,
        timeout_ms=lambda config, arguments: config.tools.media.timeout_ms,
    ),
    Builtin(
        name="rune@image-generate",
        description=("Generate an image from a text prompt with the provider the operator configured, saved in your "
                     "workspace. Returns its path, media type, bytes and sha256."),
        parameters={
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "minLength": 1, "maxLength": 4000, "description": "what the image shows"},
                "path": {"type": "string", "minLength": 1, "maxLength": 4096,
                         "description": "where to save it in your workspace (default: image-<random>.png)"},
                "size": {"type": "string", "pattern": "^([0-9]{2,5}x[0-9]{2,5}|auto)$", "description": "e.g. 1024x1024"},
            },
            "required": ["prompt"],
            "additionalProperties": False,
        },
        run=_generate,
        timeout_ms=lambda config, arguments: config.tools.media.timeout_ms,
        needs=_images_problem,
    ),
)
