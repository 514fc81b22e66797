"""Skills of a Rune package: resolved under ``[rune] skills_dir``, their bodies appended to the instructions.

``skills: [owner/repo/skill]`` resolves to ``<skills_dir>/<owner>/<repo>/skills/<skill>/SKILL.md``
or ``<skills_dir>/<owner>/<repo>/<skill>/SKILL.md``. As the Rune spec says, each SKILL.md body is
appended to the instructions at load — here up to ``[rune] skill_prompt_kb`` in all, each skill whole
or not at all (a body cut mid-way would be an instruction half given). A skill past the cap is listed
by its front matter (``name``, ``description``) and read on demand by the model through the
``skill-read`` tool, offered only then and confined to that skill's folder (as Agent Skills do it).
A missing skill is a load error naming every path tried.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from covenant import outside_json

__all__ = ["Skill", "SkillError", "SkillPrompt", "resolve_skills", "skills_prompt", "SKILL_TOOL", "skill_tool",
           "read_skill_file", "with_skills"]

SKILL_TOOL = "skill-read"
_MAX_READ_BYTES = 256 * 1024
_MAX_SKILL_BYTES = 1024 * 1024
"""The largest SKILL.md read at load (the prompt cap is at most 1 MiB too)."""


class SkillError(Exception):
    """A skill cannot be resolved; the message names the paths tried."""


@dataclass(frozen=True)
class Skill:
    ref: str
    folder: Path
    name: str
    description: str
    body: str = ""
    """SKILL.md after its front matter, stripped."""


def _front_matter(text: str) -> tuple[dict[str, Any], str]:
    """(the front matter's mapping, the body after it); no front matter: ({}, the whole text)."""
    if not text.startswith("---"):
        return {}, text.strip()
    end = text.find("\n---", 3)
    if end < 0:
        return {}, text.strip()
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(text[3:end], Loader=loader)  # noqa: S506 - a safe loader
    body = text[end + 4:].partition("\n")[2]  # past the closing --- line
    return (data if isinstance(data, dict) else {}), body.strip()


def skill_folders(ref: str, skills_dir: Path) -> tuple[Path, Path]:
    """Where skill ``ref`` (``owner/repo/skill``) may live, in the order they are tried."""
    owner, repo, name = ref.split("/")
    return skills_dir / owner / repo / "skills" / name, skills_dir / owner / repo / name


def resolve_skills(refs: tuple[str, ...], skills_dir: Path) -> list[Skill]:
    """Every skill of ``refs``, or SkillError naming the paths tried for the first missing one."""
    out = []
    for ref in refs:
        name = ref.rsplit("/", 1)[1]
        tried = [folder / "SKILL.md" for folder in skill_folders(ref, skills_dir)]
        found = next((p for p in tried if p.is_file()), None)
        if found is None:
            raise SkillError(f"skill {ref!r} not found; tried {', '.join(str(p) for p in tried)}")
        try:
            with open(found, "rb") as f:
                data = f.read(_MAX_SKILL_BYTES + 1)
            if len(data) > _MAX_SKILL_BYTES:
                raise ValueError(f"it is over {_MAX_SKILL_BYTES} bytes")
            meta, body = _front_matter(data.decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise SkillError(f"skill {ref!r}: cannot read {found}: {exc}") from None
        out.append(Skill(ref, found.parent, str(meta.get("name") or name), str(meta.get("description") or ""), body))
    return out


@dataclass(frozen=True)
class SkillPrompt:
    text: str
    """What follows the instructions in the system prompt."""
    listed: tuple[Skill, ...]
    """The skills past the cap: named in ``text``, read with ``skill-read``."""


def skills_prompt(skills: list[Skill], cap_bytes: int) -> SkillPrompt:
    """The system prompt's part about skills: each body in order while the total stays within ``cap_bytes``
    (UTF-8), then name and description of each skill left, with how to read one."""
    text = ""
    listed: list[Skill] = []
    for skill in skills:
        section = f"\n\n## Skill: {skill.name} ({skill.ref})\n\n{skill.body}"
        # In order: once one is listed the later ones are too, so the bodies keep the author's order.
        if not listed and len((text + section).encode("utf-8")) <= cap_bytes:
            text += section
        else:
            listed.append(skill)
    if listed:
        lines = ["", "", "More skills (read one with the skill-read tool before using it):"]
        lines += [f"- {s.ref}: {s.name} — {s.description}".rstrip(" —") for s in listed]
        text += "\n".join(lines)
    return SkillPrompt(text, tuple(listed))


def skill_tool() -> dict[str, Any]:
    """The OpenAI tool offered to the model when the package has skills."""
    return {
        "type": "function",
        "function": {
            "name": SKILL_TOOL,
            "description": "Read a skill's SKILL.md, or another file inside that skill's folder.",
            "parameters": {
                "type": "object",
                "properties": {"skill": {"type": "string"}, "path": {"type": "string"}},
                "required": ["skill"],
            },
        },
    }


def read_skill_file(skills: dict[str, str], arguments: dict[str, Any]) -> tuple[bool, str]:
    """``(ok, content or error message)``; ``skills`` maps ref -> folder. Never leaves the folder."""
    folder = skills.get(str(arguments.get("skill")))
    if folder is None:
        return False, f"no skill {arguments.get('skill')!r}; known: {', '.join(sorted(skills)) or 'none'}"
    relative = str(arguments.get("path") or "SKILL.md")
    if os.path.isabs(relative):
        return False, "path must be relative to the skill folder"
    real_folder = os.path.realpath(folder)
    target = os.path.realpath(os.path.join(real_folder, relative))
    if os.path.commonpath([real_folder, target]) != real_folder:
        return False, f"path {relative!r} leaves the skill folder"
    try:
        with open(target, "rb") as f:
            data = f.read(_MAX_READ_BYTES + 1)
    except OSError as exc:
        return False, f"cannot read {relative}: {exc.strerror or exc}"
    if len(data) > _MAX_READ_BYTES:
        return False, f"{relative} is over {_MAX_READ_BYTES} bytes"
    return True, data.decode("utf-8", "replace")


class _SkillReader:
    """A loop backend that answers ``skill-read`` itself and passes everything else on."""

    def __init__(self, inner: Any, skills: dict[str, str]) -> None:
        self._inner = inner
        self._skills = skills

    async def chat(self, messages: Any, tools: Any, on_token: Any) -> dict[str, Any]:
        return await self._inner.chat(messages, tools, on_token)

    async def tool(self, call_id: str, name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
        if name != SKILL_TOOL:
            return await self._inner.tool(call_id, name, arguments)
        if isinstance(arguments, str):
            try:
                arguments = outside_json.loads(arguments or "{}")
            except ValueError:
                arguments = {}
        ok, text = read_skill_file(self._skills, arguments if isinstance(arguments, dict) else {})
        if ok:
            return {"ok": True, "content": text}
        return {"ok": False, "error_code": "skill_read_failed", "error_message": text}


def with_skills(backend: Any, skills: dict[str, str]) -> Any:
    """``backend`` with the skill reader in front when the package has skills."""
    return _SkillReader(backend, skills) if skills else backend
