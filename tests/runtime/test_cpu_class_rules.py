"""The rules of a resource_profile's class: the nice sum and its clamp, group names, no controller."""

from __future__ import annotations

import pytest

from covenant.config import Config, RuneConfig
from covenant.runtime.cpu_class import CpuGroups, _group_name, combined_nice, resource_class
from covenant.runtime.hostnet import table_name


@pytest.mark.parametrize(("base", "priority", "nice"), [
    (10, "normal", 10), (10, "low", 19), (10, "high", 5), (0, "high", -5), (-18, "high", -20), (5, "low", 15),
])
def test_the_nice_is_the_class_plus_the_priority_clamped(base: int, priority: str, nice: int) -> None:
    assert combined_nice(base, priority) == nice


def test_the_classes_come_from_the_rune_table_and_bad_values_are_refused() -> None:
    rune = RuneConfig(nice_medium=3, cpu_medium=0.25)
    assert resource_class(rune, "medium") == ("medium", 3, 0.25, 1024)
    assert resource_class(RuneConfig(), "small") == ("small", 10, 0.5, 256)
    assert resource_class(RuneConfig(), "large") == ("large", 0, 2.0, 4096)
    for bad in ({"nice_small": 20}, {"nice_large": -21}, {"cpu_small": 0}, {"cpu_large": -1}, {"cpu_medium": "1"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Config.model_validate({"rune": bad}, strict=True)


def test_group_names_never_leave_the_parent() -> None:
    assert _group_name("chat@local") == "chat@local"
    for hostile in ("../../escape", "a/b", "..", ".", "x\nnewline", "", "é@local"):
        name = _group_name(hostile)
        assert name.startswith("agent_") and "/" not in name and len(name) == 22, hostile
    # The groups' parent is named like the home's nftables table: one per home.
    assert table_name("/a/state") != table_name("/b/state")
    assert table_name("/a/state").startswith("covenant_") and len(table_name("/a/state")) == 19


def test_without_a_controller_there_is_no_group_and_no_error() -> None:
    groups = CpuGroups(None, "", "no cgroup cpu controller is mounted")
    assert groups.procs_file("chat@local", 0.5) is None
    groups.close()
    assert groups.to_json() == {"controller": None, "parent": None, "problem": "no cgroup cpu controller is mounted"}
