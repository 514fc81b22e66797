"""The agents in agents.d load valid, and each honours the one-line JSON contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from covenant.manifest.registry import scan_agents
from tests.conftest import EXAMPLES_DIR, require_tool

SEARCH_BIN = EXAMPLES_DIR / "search-rs" / "target" / "release" / "search-rs"

def _intent(text: str) -> str:
    return json.dumps(
        {
            "id": "0f8c6a4e-intent",
            "text": text,
            "issuer": {"display": "tester@local", "pubkey": "00" * 32},
            "issued_at": 1714938000000,
            "priority": "normal",
            "parent": None,
        }
    ) + "\n"


def _call(argv: list[str], cwd: Path, text: str) -> dict[str, object]:
    proc = subprocess.run(argv, input=_intent(text), capture_output=True, text=True, cwd=cwd, timeout=30)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0])
    assert set(result) == {"intent_id", "status", "text", "sources"}
    assert result["intent_id"] == "0f8c6a4e-intent"
    return result


def test_every_example_loads_valid(built_examples: Path) -> None:
    registry = scan_agents(built_examples)
    assert registry.problems == []
    assert sorted(registry.agents) == ["calc@local", "search@local", "triage@local", "wordcount@local"]
    runtimes = {spec.runtime for spec in registry.agents.values()}
    assert runtimes == {"python3", "node", "rust-bin", "rune"}
    assert all(spec.keywords for spec in registry.agents.values())
    triage = registry.rune_packages["triage@local"]
    assert triage.workflow is not None and len(triage.workflow.steps) >= 3
    assert registry.agents["triage@local"].capabilities.required == ("tool.web_fetch", "tool.classify_ticket")


def test_example_scripts_are_not_writable_by_others(built_examples: Path) -> None:
    for path in built_examples.rglob("*"):
        if "target" not in path.parts:
            assert not path.stat().st_mode & 0o022, path


def test_wordcount_python(built_examples: Path) -> None:
    folder = built_examples / "wordcount-py"
    result = _call([sys.executable, "wordcount.py"], folder, "The cat and the hat.\nThe end")
    assert result["status"] == "ok"
    assert result["text"] == "words: 7, lines: 2, characters: 28; most frequent: the (3), and (1), cat (1)"


def test_calc_node(built_examples: Path) -> None:
    node = require_tool("node")
    folder = built_examples / "calc-node"
    ok = _call([node, "calc.js"], folder, "what is 2 + 3 * (4 - 1)?")
    assert ok["status"] == "ok" and ok["text"] == "2 + 3 * (4 - 1) = 11"
    assert _call([node, "calc.js"], folder, "2^3^2 - -1")["text"] == "2^3^2 - -1 = 513"
    for bad in ("7 / 0", "hello there", "(1 + 2"):
        assert _call([node, "calc.js"], folder, bad)["status"] == "error"


def test_search_rust(built_examples: Path) -> None:
    folder = built_examples / "search-rs"
    result = _call([str(SEARCH_BIN)], folder, "what is the grace period of the teardown ladder?")
    assert result["status"] == "ok"
    assert result["sources"][0] == "corpus/limits.txt:6"
    assert "SIGTERM" in str(result["text"])
    none = _call([str(SEARCH_BIN)], folder, "xylophone")
    assert none["status"] == "ok" and none["sources"] == []
    assert _call([str(SEARCH_BIN)], folder, "a b")["status"] == "error"


def test_search_rust_finds_its_corpus_from_any_directory(built_examples: Path, tmp_path: Path) -> None:
    result = _call([str(SEARCH_BIN)], tmp_path, "wildcard namespace")
    assert result["sources"] == ["corpus/capabilities.txt:5", "corpus/capabilities.txt:1", "corpus/limits.txt:5"]


def test_triage_classifier_tool(built_examples: Path) -> None:
    tool = built_examples / "triage-rune" / "tools" / "classify_ticket.py"
    def run(text: str) -> dict[str, str]:
        document = json.dumps({"ticket": text})
        return json.loads(subprocess.run([sys.executable, str(tool)], input=document, capture_output=True, text=True).stdout)

    assert run("I was charged twice, please refund") == {"category": "billing"}
    assert run("the server returns 500") == {"category": "technical"}
