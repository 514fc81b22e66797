"""The workflow template language: ``{{ input }}`` and ``{{ steps.<id>.output }}``, nothing else.

A substitution, never an evaluation: any other ``{{ … }}`` is left as
written, and a substituted value is never scanned again (a step's output
holding ``{{ input }}`` stays literal text).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["render", "is_template"]

_PLACEHOLDER = re.compile(r"\{\{\s*(input|steps\.([^.\s{}]+)\.output)\s*\}\}")


def render(template: str, input_text: str, outputs: Mapping[str, str]) -> str:
    """``template`` with the intent's text and the named steps' outputs put in (unknown steps: empty)."""

    def value(match: re.Match[str]) -> str:
        if match.group(1) == "input":
            return input_text
        return outputs.get(match.group(2), "")

    return _PLACEHOLDER.sub(value, template)


def is_template(text: str) -> bool:
    """True when ``text`` holds a placeholder (``output_step`` is then a template, not a step id)."""
    return _PLACEHOLDER.search(text) is not None
