"""What is wrong with a manifest, located as precisely as the parser allows.

A :class:`Problem` is one finding (file, line, field, message); a
:class:`ManifestError` carries every problem of one manifest so an operator
fixes them in one pass instead of one per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from covenant.errors import CovenantError, ExitCode

__all__ = ["Problem", "ManifestError"]


@dataclass(frozen=True)
class Problem:
    """One finding: ``path:line: field: message`` (absent parts omitted)."""

    path: Path
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = str(self.path)
        if self.line is not None:
            where += f":{self.line}"
        if self.field:
            return f"{where}: {self.field}: {self.message}"
        return f"{where}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "line": self.line, "field": self.field, "message": self.message}


class ManifestError(CovenantError):
    """A manifest (agent.toml or Rune package) was rejected; ``.problems`` says why."""

    code = "bad_manifest"
    exit_code = ExitCode.USAGE

    def __init__(self, problems: list[Problem]) -> None:
        if not problems:
            raise ValueError("ManifestError needs at least one problem")
        self.problems = list(problems)
        message = str(self.problems[0])
        if len(self.problems) > 1:
            message += f" (and {len(self.problems) - 1} more problem(s): run `covenant agents check {self.problems[0].path}`)"
        super().__init__(message, problems=[p.to_json() for p in self.problems])
