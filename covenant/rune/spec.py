"""From a Rune package to what its loop needs: the system prompt, the tools, the limits.

Used by the daemon (the replica spec it hands each replica on stdin) and by
``covenant run`` (the same loop in one process), so both run an agent alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from covenant.rune.skills import resolve_skills, skill_tool, skills_prompt

if TYPE_CHECKING:
    from covenant.manifest.runefile import RunePackage

__all__ = ["loop_settings"]


def loop_settings(
    package: RunePackage, *, skills_dir: Path, offered_tools: list[dict[str, Any]], standard_turns: int,
    skill_prompt_kb: int,
) -> dict[str, Any]:
    """The agent's part of a replica spec (raises SkillError for a missing skill).

    Skill bodies join the instructions up to ``skill_prompt_kb`` KiB (``[rune] skill_prompt_kb``); the
    ``skill-read`` tool is offered, and reads, only the skills past it.
    """
    rf = package.runefile
    prompt = skills_prompt(resolve_skills(rf.skills, skills_dir), skill_prompt_kb * 1024)
    tools = list(offered_tools) + ([skill_tool()] if prompt.listed else [])
    return {
        "agent": package.id,
        "system_prompt": rf.instructions.rstrip() + prompt.text,
        "skills": {s.ref: str(s.folder) for s in prompt.listed},
        "tools": tools,
        "max_steps": rf.max_steps,
        "memory_profile": rf.memory_profile,
        "standard_turns": standard_turns,
        "token_budget": rf.models.token_budget,
        "checkpoint_policy": rf.runtime.checkpoint_policy,
        "safety_policy": rf.models.safety_policy,
        "loop": rf.loop,
    }
