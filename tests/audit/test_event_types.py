"""Every audit event type the code records is in EVENT_TYPES, and docs/audit.md describes exactly those."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from covenant.audit.events import EVENT_TYPES
from covenant.audit.format import WRITER_TYPES
from tests.conftest import REPO_ROOT

_RECORDING_CALLS = frozenset({"record", "record_many", "_audit"})
_DOCUMENTED = re.compile(r"^\| `([a-z0-9_]+(?:\.[a-z0-9_]+)+)` \|", re.MULTILINE)


def _literal_types() -> dict[str, str]:
    """Event types written as string literals where events are recorded: first arguments of the recording
    calls, and ``("type", {data})`` pairs (record_many's items), each with where it is."""
    found: dict[str, str] = {}
    for path in sorted((REPO_ROOT / "covenant").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            literal = None
            if isinstance(node, ast.Call) and node.args:
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if name in _RECORDING_CALLS and isinstance(node.args[0], ast.Constant):
                    literal = node.args[0].value
            elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[1], ast.Dict) \
                    and isinstance(node.elts[0], ast.Constant) and isinstance(node.elts[0].value, str) \
                    and re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+", node.elts[0].value):
                literal = node.elts[0].value
            if isinstance(literal, str):
                found.setdefault(literal, f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    return found


def test_every_recorded_literal_type_is_a_known_event_type() -> None:
    found = _literal_types()
    assert {"session.loaded", "intent.received", "isolation.sweep"} <= set(found)  # the scan sees them
    unknown = {t: where for t, where in found.items() if t not in EVENT_TYPES}
    assert unknown == {}, f"recorded but not in covenant.audit.events.EVENT_TYPES: {unknown}"


def test_docs_audit_describes_exactly_the_known_event_types() -> None:
    documented = set(_DOCUMENTED.findall((REPO_ROOT / "docs" / "audit.md").read_text()))
    known = EVENT_TYPES | WRITER_TYPES
    assert sorted(known - documented) == [], "known but not described in docs/audit.md"
    assert sorted(documented - known) == [], "described in docs/audit.md but not a known type"
