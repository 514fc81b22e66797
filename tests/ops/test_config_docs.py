"""docs/configuration.md documents every covenant.toml key with its current default."""

from __future__ import annotations

import re

from pydantic import BaseModel

from covenant.config import Config, ProviderConfig
from tests.conftest import REPO_ROOT

DOC = (REPO_ROOT / "docs" / "configuration.md").read_text()


def leaf_fields(model: type[BaseModel], section: str = "") -> list[tuple[str, str, object]]:
    out = []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += leaf_fields(field.annotation, f"{section}.{name}" if section else name)
        else:
            out.append((section, name, field))
    return out


def section_text(section: str) -> str:
    if not section:
        return DOC.split("## `[")[0]
    match = re.search(rf"## `\[{re.escape(section)}\]`.*?(?=\n## |\Z)", DOC, re.S)
    assert match, f"docs/configuration.md has no '## `[{section}]`' section"
    return match.group(0)


def toml_default(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_default(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_every_key_has_a_row_with_its_default() -> None:
    problems = []
    for section, name, field in leaf_fields(Config):
        rows = [line for line in section_text(section).splitlines() if line.startswith(f"| `{name}` |")]
        if not rows:
            problems.append(f"{section or '(top)'}.{name}: no table row")
            continue
        if field.default_factory is not None or field.default is None:
            continue  # computed or unset by default: the row explains it in words
        if toml_default(field.default) not in rows[0]:
            problems.append(f"{section or '(top)'}.{name}: default {toml_default(field.default)} not in its row")
    assert not problems, "\n".join(problems)


def test_every_provider_key_has_a_row_with_its_default() -> None:
    problems = []
    rows = section_text("providers.NAME").splitlines()
    for name, field in ProviderConfig.model_fields.items():
        row = [line for line in rows if line.startswith(f"| `{name}` |")]
        if not row:
            problems.append(f"providers.NAME.{name}: no table row")
        elif field.is_required():
            if "required" not in row[0]:
                problems.append(f"providers.NAME.{name}: the row does not say it is required")
        elif field.default is not None and toml_default(field.default) not in row[0]:
            problems.append(f"providers.NAME.{name}: default {toml_default(field.default)} not in its row")
    assert not problems, "\n".join(problems)


def test_the_sample_file_is_a_valid_config() -> None:
    import tomllib

    sample = re.search(r"```toml\n(.*?)```", DOC, re.S)
    assert sample
    parsed = Config.model_validate(tomllib.loads(sample.group(1)))
    for section, name, field in leaf_fields(Config):
        if field.default_factory is None and field.default is not None:
            owner = parsed
            for part in section.split(".") if section else ():
                owner = getattr(owner, part)
            value = getattr(owner, name)
            assert value == field.default, f"{section}.{name}: sample says {value!r}, default is {field.default!r}"
