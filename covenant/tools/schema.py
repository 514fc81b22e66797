"""Validating tool arguments against JSON schemas, with regex patterns that cannot stall the daemon.

A package's schema may hold ``pattern`` and ``patternProperties`` regexes,
and the model chooses the strings they are matched against. Python's ``re``
backtracks without bound and holds the GIL (``(x+x+)+y`` against 30 x's runs
for minutes), so the daemon matches them with the ``regex`` module under a
time budget instead: each search at most :data:`SEARCH_TIMEOUT_S`, one whole
validation at most :data:`VALIDATION_BUDGET_S`; a pattern that runs out is a
validation error (``invalid_arguments``), never a stalled event loop.
``unevaluatedProperties`` next to ``patternProperties`` would still reach
``re``: such a schema is refused (:func:`schema_problem`).

jsonschema and regex (≈ 2 MB together) are imported with the first schema
checked: a daemon without Rune tools never loads them.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema import ValidationError

__all__ = ["validator_for", "schema_problem", "first_error", "SEARCH_TIMEOUT_S", "VALIDATION_BUDGET_S"]

SEARCH_TIMEOUT_S = 0.05
VALIDATION_BUDGET_S = 0.25

_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("schema_deadline", default=0.0)


class _OutOfTime(Exception):
    pass


def _search(pattern: str, text: str) -> bool:
    import regex

    left = _deadline.get() - time.monotonic()
    if left <= 0:
        raise _OutOfTime
    try:
        return regex.search(pattern, text, timeout=min(SEARCH_TIMEOUT_S, left)) is not None
    except TimeoutError:
        raise _OutOfTime from None


def _error(message: str) -> ValidationError:
    from jsonschema import ValidationError

    return ValidationError(message)


def _slow(pattern: str) -> ValidationError:
    return _error(f"the value could not be checked against the pattern {pattern!r} in time")


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    try:
        matched = _search(pattern, instance)
    except _OutOfTime:
        yield _slow(pattern)
        return
    if not matched:
        yield _error(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            try:
                matched = _search(pattern, key)
            except _OutOfTime:
                yield _slow(pattern)
                return
            if matched:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    declared = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = []
    for key in instance:
        if key in declared:
            continue
        try:
            if any(_search(pattern, key) for pattern in patterns):
                continue
        except _OutOfTime:
            yield _slow("|".join(patterns))
            return
        extras.append(key)
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif additional is False and extras:
        names = ", ".join(repr(key) for key in sorted(extras))
        yield _error(f"Additional properties are not allowed ({names} unexpected)")


@cache
def _validator_class() -> Any:
    """Draft 2020-12 with the time-bounded pattern keywords (built once, on first use)."""
    from jsonschema import Draft202012Validator
    from jsonschema.validators import extend

    return extend(
        Draft202012Validator,
        {"pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties},
    )


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` cannot validate tool arguments here, or None."""
    import regex
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"not a valid JSON schema: {exc.message}"
    keywords = {key for node in _walk(schema) for key in node}
    if "unevaluatedProperties" in keywords and "patternProperties" in keywords:
        return "unevaluatedProperties together with patternProperties is not supported (its patterns could not be bounded)"
    for node in _walk(schema):
        for pattern in [node.get("pattern"), *node.get("patternProperties", {})]:
            if isinstance(pattern, str):
                try:
                    regex.compile(pattern)
                except regex.error as exc:
                    return f"pattern {pattern!r} is not a regular expression here: {exc}"
    return None


def validator_for(schema: dict[str, Any]) -> Any:
    """A validator whose regex patterns run under the time budget (the schema passed :func:`schema_problem`)."""
    return _validator_class()(schema)


def first_error(validator: Any, instance: Any) -> ValidationError | None:
    """The first error (by path) of ``instance``, the whole validation within :data:`VALIDATION_BUDGET_S` of regex time."""
    token = _deadline.set(time.monotonic() + VALIDATION_BUDGET_S)
    try:
        return next(iter(sorted(validator.iter_errors(instance), key=lambda e: list(e.path))), None)
    finally:
        _deadline.reset(token)
