"""Skills of a Rune package: resolved under ``[rune] skills_dir``, disclosed progressively.

``skills: [owner/repo/skill]`` resolves to ``<skills_dir>/<owner>/<repo>/skills/<skill>/SKILL.md``
or ``<skills_dir>/<owner>/<repo>/<skill>/SKILL.md``. Its front matter (``name``,
``description``) goes into the system prompt; the body is read on demand by
the model through the ``skill-read`` tool, confined to the skill's folder
(as Agent Skills do it). A missing skill is a load error naming every path tried.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from covenant import outside_json

__all__ = ["Skill", "SkillError", "resolve_skills", "skills_prompt", "SKILL_TOOL", "skill_tool", "read_skill_file", "with_skills"]

SKILL_TOOL = "skill-read"
_MAX_READ_BYTES = 256 * 1024


class SkillError(Exception):
    """A skill cannot be resolved; the message names the paths tried."""


@dataclass(frozen=True)
class Skill:
    ref: str
    folder: Path
    name: str
    description: str


def _front_matter(text: str) -> dict[str, Any]:
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        return {}
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(text[3:end], Loader=loader)  # noqa: S506 - a safe loader
    return data if isinstance(data, dict) else {}


def resolve_skills(refs: tuple[str, ...], skills_dir: Path) -> list[Skill]:
    """Every skill of ``refs``, or SkillError naming the paths tried for the first missing one."""
    out = []
    for ref in refs:
        owner, repo, name = ref.split("/")
        tried = [skills_dir / owner / repo / "skills" / name / "SKILL.md", skills_dir / owner / repo / name / "SKILL.md"]
        found = next((p for p in tried if p.is_file()), None)
        if found is None:
            raise SkillError(f"skill {ref!r} not found; tried {', '.join(str(p) for p in tried)}")
        try:
            meta = _front_matter(found.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise SkillError(f"skill {ref!r}: cannot read {found}: {exc}") from None
        out.append(Skill(ref, found.parent, str(meta.get("name") or name), str(meta.get("description") or "")))
    return out


def skills_prompt(skills: list[Skill]) -> str:
    """The system prompt's part about skills: name and description of each, and how to read one."""
    if not skills:
        return ""
    lines = ["", "", "Skills available (read one with the skill-read tool before using it):"]
    lines += [f"- {s.ref}: {s.name} — {s.description}".rstrip(" —") for s in skills]
    return "\n".join(lines)


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
