#!/usr/bin/env python3
"""The demo's last line: what ran, counted from the audit log's records.

Reads the records as JSON lines on stdin, as ``covenant audit tail --json --type '*' -n N`` prints them
(``--type '*'`` keeps the checkpoints, so the count is the one ``covenant audit verify`` reports), and
prints one line: the agents that ran, the intents (and how many were workflow steps) and denials, the
models with their calls, the tool calls, and the records. Nothing is assumed: every number is a count
of records. A line that is not a JSON record stops it with exit 1, naming the line.

    covenant audit tail --json --type '*' -n 1000000 | python3 scripts/demo_summary.py
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable
from typing import Any

__all__ = ["summarise", "main"]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def summarise(records: Iterable[dict[str, Any]]) -> str:
    """One line from the audit records (each ``{"type", "data", …}``)."""
    records = list(records)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_type.setdefault(record["type"], []).append(record.get("data") or {})
    completed = by_type.get("intent.completed", [])
    agents = sorted({str(data.get("agent")) for data in completed if data.get("agent")})
    steps = sum(1 for data in by_type.get("intent.received", []) if data.get("via") == "workflow")
    denied = sum(1 for data in by_type.get("policy.decision", []) if data.get("allowed") is False)
    models = Counter(str(data.get("model")) for data in by_type.get("model.call", []))
    tools = by_type.get("tool.call", [])
    model_text = "; ".join(f"model {name}: {_plural(n, 'call')}" for name, n in sorted(models.items())) or "no model calls"
    return (f"what ran: {_plural(len(agents), 'agent')} ({', '.join(agents) or 'none'}), "
            f"{_plural(len(completed), 'intent')} ({steps} of them workflow steps), {denied} denied; "
            f"{model_text}; {_plural(len(tools), 'tool call')}; {_plural(len(records), 'audit record')}")


def _read(lines: Iterable[str]) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"stdin line {number} is not JSON ({exc})") from None
        if not isinstance(record, dict) or not isinstance(record.get("type"), str):
            raise ValueError(f"stdin line {number} is not an audit record (it has no type)")
        records.append(record)
    return records


def main() -> None:
    try:
        records = _read(sys.stdin)
    except ValueError as exc:
        sys.exit(f"demo_summary: {exc}")  # exit status 1
    print(summarise(records))


if __name__ == "__main__":
    main()
