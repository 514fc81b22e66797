"""Every agent.toml rule, with a passing and a failing case."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from covenant.manifest.agent_toml import load_agent_toml
from covenant.toml_lines import key_line
from covenant.manifest.limits import ManifestLimits
from covenant.manifest.problems import ManifestError, Problem
from tests.manifest.helpers import VALID_TOML, write_agent


def _problems(path: Path) -> list[Problem]:
    with pytest.raises(ManifestError) as info:
        load_agent_toml(path)
    return info.value.problems


def test_valid_manifest_loads_every_field(tmp_path: Path) -> None:
    spec = load_agent_toml(write_agent(tmp_path))
    assert spec.id == "demo@local" and spec.name == "demo" and spec.version == "0.1.0"
    assert spec.runtime == "python3" and spec.kind == "agent.toml"
    assert spec.entry == tmp_path / "main.py" and spec.root == tmp_path
    assert spec.manifest_path == tmp_path / "agent.toml"
    assert spec.capabilities.required == ("tool.text_stats",)
    assert spec.capabilities.optional == ("memory.write",)
    assert (spec.resources.cpu_ms_per_task, spec.resources.memory_mb, spec.resources.disk_mb) == (5000, 64, 10)
    assert spec.resources.network == "off"
    assert spec.settlement.budget_credits_per_hour == 10 and spec.settlement.priority == "high"
    assert spec.keywords == ("demo", "count") and spec.warnings == ()


def test_defaults_when_optional_sections_are_absent(tmp_path: Path) -> None:
    text = VALID_TOML.split("[capabilities]")[0]
    spec = load_agent_toml(write_agent(tmp_path, text))
    assert spec.capabilities.required == () and spec.capabilities.optional == ()
    assert spec.resources.cpu_ms_per_task == 30000 and spec.resources.memory_mb == 512
    assert spec.resources.disk_mb == 100 and spec.resources.network == "outbound-https-only"
    assert spec.settlement.budget_credits_per_hour == 0 and spec.settlement.priority == "normal"
    assert spec.keywords == ()


FAILING = [
    # (replace this, with this, expected field, message fragment)
    ('id      = "demo@local"\n', "", "agent.id", "required field is missing"),
    ('name    = "demo"\n', "", "agent.name", "required field is missing"),
    ('version = "0.1.0"\n', "", "agent.version", "required field is missing"),
    ('runtime = "python3"\n', "", "agent.runtime", "required field is missing"),
    ('entry   = "main.py"\n', "", "agent.entry", "required field is missing"),
    ('"demo@local"', '""', "agent.id", "must not be empty"),
    ('name    = "demo"', 'name = "  "', "agent.name", "must not be empty"),
    ('"0.1.0"', '""', "agent.version", "must not be empty"),
    ('"main.py"', '""', "agent.entry", "must not be empty"),
    ('"0.1.0"', "1", "agent.version", "must be a string"),
    ('"demo@local"', '"de mo@local"', "agent.id", "not a valid id"),
    ('"demo@local"', '"demo@"', "agent.id", "not a valid id"),
    ('"demo@local"', '"demo@spawned-3f2a9c01d4e5"', "agent.id", "reserved for agents made by rune@agent-spawn"),
    ('"demo@local"', '"demo@spawned"', "agent.id", "reserved for agents made by rune@agent-spawn"),
    ('"python3"', '"python"', "agent.runtime", "must be one of"),
    ('"python3"', '"rune"', "agent.runtime", "must be one of"),
    ('"main.py"', '"missing.py"', "agent.entry", "does not exist"),
    ('"main.py"', '"."', "agent.entry", "not a regular file"),
    ('entry   = "main.py"\n', 'entry = "main.py"\nentrypoint = "x"\n', "agent.entrypoint", "unknown key"),
    ('["tool.text_stats"]', '["net.fetch"]', "capabilities.required[0]", "outside the reserved namespaces"),
    ('["tool.text_stats"]', '["tool"]', "capabilities.required[0]", "outside the reserved namespaces"),
    ('["tool.text_stats"]', '["tool."]', "capabilities.required[0]", "needs a verb"),
    ('["memory.write"]', '["memory.write", "x.y"]', "capabilities.optional[1]", "outside the reserved namespaces"),
    ('["memory.write"]', '"memory.write"', "capabilities.optional", "must be an array"),
    ('["memory.write"]', "[3]", "capabilities.optional[0]", "non-empty string"),
    ("optional =", "optionals =", "capabilities.optionals", "unknown key"),
    ("cpu_ms_per_task = 5000", "cpu_ms_per_task = 0", "resources.cpu_ms_per_task", "between 1 and"),
    ("cpu_ms_per_task = 5000", "cpu_ms_per_task = 86400001", "resources.cpu_ms_per_task", "between 1 and"),
    ("memory_mb       = 64", 'memory_mb = "512"', "resources.memory_mb", "must be an integer"),
    ("memory_mb       = 64", "memory_mb = 512.0", "resources.memory_mb", "must be an integer"),
    ("memory_mb       = 64", "memory_mb = -1", "resources.memory_mb", "between 1 and"),
    ("memory_mb       = 64", "memroy_mb = 64", "resources.memroy_mb", "did you mean 'memory_mb'"),
    ("disk_mb         = 10", "disk_mb = true", "resources.disk_mb", "must be an integer"),
    ("disk_mb         = 10", "disk_mb = 0", "resources.disk_mb", "between 1 and"),
    ('network         = "off"', 'network = "none"', "resources.network", "must be one of"),
    ("budget_credits_per_hour = 10", "budget_credits_per_hour = -1", "settlement.budget_credits_per_hour", "between 0 and"),
    ("budget_credits_per_hour = 10", "budget_credits_per_hour = 1e3", "settlement.budget_credits_per_hour", "must be an integer"),
    ('priority                = "high"', 'priority = "urgent"', "settlement.priority", "must be one of"),
    ('priority                = "high"', 'priorty = "high"', "settlement.priorty", "unknown key"),
    ('keywords = ["demo", "count"]', 'keywords = "demo"', "routing.keywords", "must be an array"),
    ('keywords = ["demo", "count"]', 'keywords = ["demo", ""]', "routing.keywords[1]", "non-empty string"),
    ('keywords = ["demo", "count"]', 'keyword = ["demo"]', "routing.keyword", "unknown key"),
]


@pytest.mark.parametrize(("old", "new", "field", "fragment"), FAILING, ids=[f"{c[2]}:{c[3]}" for c in FAILING])
def test_rule_violations_name_field_line_and_fix(tmp_path: Path, old: str, new: str, field: str, fragment: str) -> None:
    assert old in VALID_TOML
    path = write_agent(tmp_path, VALID_TOML.replace(old, new, 1))
    problems = _problems(path)
    matching = [p for p in problems if p.field == field]
    assert matching, problems
    assert fragment in matching[0].message
    assert matching[0].path == path


def test_field_problem_points_at_its_line(tmp_path: Path) -> None:
    path = write_agent(tmp_path, VALID_TOML.replace("memory_mb       = 64", 'memory_mb = "64"'))
    (problem,) = _problems(path)
    assert problem.line == VALID_TOML.splitlines().index("memory_mb       = 64") + 1
    assert str(problem).startswith(f"{path}:{problem.line}: resources.memory_mb: ")


def test_all_problems_of_a_file_are_reported_at_once(tmp_path: Path) -> None:
    text = VALID_TOML.replace('"python3"', '"perl"').replace("memory_mb       = 64", "memory_mb = 0")
    fields = {p.field for p in _problems(write_agent(tmp_path, text))}
    assert fields == {"agent.runtime", "resources.memory_mb"}


def test_known_section_given_as_a_value(tmp_path: Path) -> None:
    text = "resources = 5\n" + VALID_TOML.split("[resources]")[0] + "[settlement]" + VALID_TOML.split("[settlement]")[1]
    problems = _problems(write_agent(tmp_path, text))
    assert [(p.field, p.line) for p in problems] == [("resources", 1)]
    assert "must be a table" in problems[0].message


def test_missing_agent_section(tmp_path: Path) -> None:
    text = VALID_TOML.split("[capabilities]")[1]
    (problem,) = _problems(write_agent(tmp_path, "[capabilities]" + text))
    assert problem.field == "agent" and "section is missing" in problem.message


def test_toml_syntax_error_has_line_and_no_field(tmp_path: Path) -> None:
    path = write_agent(tmp_path, VALID_TOML.replace('version = "0.1.0"', 'version = "0.1.0'))
    (problem,) = _problems(path)
    assert problem.field is None and problem.line == 4
    assert problem.message.startswith("parse error:")


def test_duplicate_key_is_a_parse_error(tmp_path: Path) -> None:
    path = write_agent(tmp_path, VALID_TOML.replace("disk_mb         = 10", "disk_mb = 10\ndisk_mb = 11"))
    (problem,) = _problems(path)
    assert problem.message.startswith("parse error:") and problem.line is not None


def test_not_utf8_is_a_parse_error(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(VALID_TOML.encode().replace(b"demo", b"d\xffmo", 1))
    (problem,) = _problems(path)
    assert "not UTF-8" in problem.message


def test_unreadable_file_is_an_io_error(tmp_path: Path) -> None:
    (problem,) = _problems(tmp_path / "absent.toml")
    assert problem.message.startswith("io error:")


def test_bare_id_is_read_as_local_with_a_warning(tmp_path: Path) -> None:
    spec = load_agent_toml(write_agent(tmp_path, VALID_TOML.replace('"demo@local"', '"demo"')))
    assert spec.id == "demo@local"
    assert any("demo@local" in w for w in spec.warnings)


def test_full_id_with_host_is_kept(tmp_path: Path) -> None:
    spec = load_agent_toml(write_agent(tmp_path, VALID_TOML.replace('"demo@local"', '"demo.v2@build-01.example"')))
    assert spec.id == "demo.v2@build-01.example" and spec.warnings == ()


def test_unknown_top_level_section_is_kept_as_a_warning(tmp_path: Path) -> None:
    spec = load_agent_toml(write_agent(tmp_path, VALID_TOML + '\n[future]\nfeature = "x"\n'))
    assert spec.extra_sections == {"future": {"feature": "x"}}
    assert any("[future]" in w for w in spec.warnings)


@pytest.mark.parametrize("runtime", ["python3", "node", "rust-bin"])
def test_each_runtime_is_accepted(tmp_path: Path, runtime: str) -> None:
    spec = load_agent_toml(write_agent(tmp_path, VALID_TOML.replace('"python3"', f'"{runtime}"')))
    assert spec.runtime == runtime


def test_rust_bin_entry_must_be_executable(tmp_path: Path) -> None:
    path = write_agent(tmp_path, VALID_TOML.replace('"python3"', '"rust-bin"'))
    os.chmod(tmp_path / "main.py", 0o644)
    (problem,) = _problems(path)
    assert problem.field == "agent.entry" and "not executable" in problem.message
    os.chmod(tmp_path / "main.py", 0o755)
    assert load_agent_toml(path).runtime == "rust-bin"


def test_missing_rust_binary_suggests_cargo_build(tmp_path: Path) -> None:
    text = VALID_TOML.replace('"python3"', '"rust-bin"').replace('"main.py"', '"target/release/demo"')
    (problem,) = _problems(write_agent(tmp_path, text))
    assert "cargo build --release" in problem.message


def test_entry_resolves_relative_to_the_manifest_folder_or_absolute_when_allowed(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "bin").mkdir(parents=True)
    (tmp_path / "pkg" / "bin" / "run.py").write_text("")
    spec = load_agent_toml(write_agent(tmp_path / "pkg", VALID_TOML.replace('"main.py"', '"bin/run.py"')))
    assert spec.entry == tmp_path / "pkg" / "bin" / "run.py"
    absolute = str(tmp_path / "pkg" / "bin" / "run.py")
    other = write_agent(tmp_path / "other", VALID_TOML.replace('"main.py"', f'"{absolute}"'))
    spec = load_agent_toml(other, ManifestLimits(allow_system_entries=True))
    assert spec.entry == Path(absolute)


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("/bin/sh", "is an absolute path"),
        ("../outside.py", "climbs out with '..'"),
        ("sub/../../outside.py", "climbs out with '..'"),
        ("link.py", "a symlink"),
        ("linkdir/outside.py", "a symlink"),
    ],
)
def test_an_entry_outside_the_package_folder_is_refused(tmp_path: Path, entry: str, fragment: str) -> None:
    (tmp_path / "outside.py").write_text("print('x')\n")
    (tmp_path / "pkg").mkdir()
    os.symlink(tmp_path / "outside.py", tmp_path / "pkg" / "link.py")
    os.symlink(tmp_path, tmp_path / "pkg" / "linkdir")
    manifest = write_agent(tmp_path / "pkg", VALID_TOML.replace('"main.py"', f'"{entry}"'))
    with pytest.raises(ManifestError) as info:
        load_agent_toml(manifest)
    (problem,) = info.value.problems
    assert problem.field == "agent.entry" and fragment in problem.message
    assert "allow_system_entries = true" in problem.message
    assert load_agent_toml(manifest, ManifestLimits(allow_system_entries=True)).entry is not None


def test_key_line_finds_keys_in_their_section() -> None:
    text = '[agent]\nid = "x"\n\n[resources]\nmemory_mb = 1\n[settlement]\n"priority" = "low"\n'
    assert key_line(text, "resources", "memory_mb") == 5
    assert key_line(text, "settlement", "priority") == 7
    assert key_line(text, "resources", "disk_mb") == 4  # absent key: the section header
    assert key_line(text, "routing", "keywords") is None


def test_a_symlink_that_stays_inside_the_package_folder_is_fine(tmp_path: Path) -> None:
    manifest = write_agent(tmp_path / "pkg", VALID_TOML.replace('"main.py"', '"current/main.py"'))
    (tmp_path / "pkg" / "v1").mkdir()
    (tmp_path / "pkg" / "v1" / "main.py").write_text("print(1)\n")
    os.symlink("v1", tmp_path / "pkg" / "current")
    assert load_agent_toml(manifest).entry == tmp_path / "pkg" / "current" / "main.py"
