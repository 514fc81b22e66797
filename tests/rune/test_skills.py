"""Skill bodies in the system prompt up to [rune] skill_prompt_kb (issue 37 item 6): pure, on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from covenant.rune.skills import SkillError, resolve_skills, skills_prompt


def _skill(root: Path, ref: str, body: str, front: str = "") -> None:
    owner, repo, name = ref.split("/")
    folder = root / owner / repo / "skills" / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text((f"---\n{front}---\n" if front else "") + body)


def test_bodies_join_in_order_until_the_cap_then_the_rest_are_listed(tmp_path: Path) -> None:
    _skill(tmp_path, "a/r/one", "ONE " * 10, "name: one\ndescription: first\n")
    _skill(tmp_path, "a/r/two", "TWO " * 400, "name: two\ndescription: second\n")
    _skill(tmp_path, "a/r/three", "THREE", "name: three\ndescription: third\n")
    skills = resolve_skills(("a/r/one", "a/r/two", "a/r/three"), tmp_path)
    assert skills[0].body == ("ONE " * 10).strip() and skills[0].name == "one"
    prompt = skills_prompt(skills, 1024)
    assert "ONE ONE" in prompt.text and "TWO" not in prompt.text.replace("- a/r/two: two", "")
    # three would fit, but follows a listed skill: bodies keep the author's order, never skip ahead
    assert "THREE" not in prompt.text and [s.ref for s in prompt.listed] == ["a/r/two", "a/r/three"]
    assert "- a/r/two: two — second" in prompt.text and "skill-read" in prompt.text
    assert len(prompt.text.split("More skills")[0].encode()) <= 1024
    everything = skills_prompt(skills, 1024 * 1024)
    assert everything.listed == () and "skill-read" not in everything.text
    assert everything.text.index("ONE") < everything.text.index("TWO") < everything.text.index("THREE")
    nothing = skills_prompt(skills, 0)
    assert len(nothing.listed) == 3 and "ONE" not in nothing.text
    assert skills_prompt([], 0).text == ""


def test_a_skill_without_front_matter_is_all_body_and_a_bad_one_names_its_file(tmp_path: Path) -> None:
    _skill(tmp_path, "a/r/plain", "# Plain\n\nJust text.\n")
    [plain] = resolve_skills(("a/r/plain",), tmp_path)
    assert plain.body == "# Plain\n\nJust text." and plain.name == "plain"
    folder = tmp_path / "a" / "r" / "skills" / "bad"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(SkillError, match="bad/SKILL.md"):
        resolve_skills(("a/r/bad",), tmp_path)
    with pytest.raises(SkillError, match="tried"):
        resolve_skills(("a/r/missing",), tmp_path)
