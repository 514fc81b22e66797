"""Safe YAML reading and pydantic-error translation for Rune package files.

Every YAML document is loaded with a *safe* loader (the C one when PyYAML
was built with libyaml): a ``!!python/object`` tag is a parse error, never
an object. PyYAML is imported with the first YAML file read: a daemon whose
agents are all ``agent.toml`` never loads it. Problems carry one of the
Rune spec's error kinds in their message: ``io error``, ``parse error`` or
``validation error``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Union, get_args

from pydantic import BaseModel, ValidationError

from covenant.manifest.limits import DEFAULT_LIMITS, MAX_DEPTH, ManifestTooLarge, depth_message, read_capped
from covenant.manifest.problems import Problem

__all__ = [
    "safe_loader",
    "Loc",
    "read_yaml",
    "node_line",
    "field_path",
    "validate_model",
    "problem_at",
    "yaml_structure_problem",
    "MAX_YAML_ALIASES",
    "MAX_YAML_NODES",
]

MAX_YAML_ALIASES = 100
MAX_YAML_NODES = 100_000
"""Nodes of a YAML document with every alias counted at its expanded size."""


@cache
def safe_loader() -> type:
    """libyaml's safe loader when available (fast), else the pure-Python safe loader. Never yaml.Loader."""
    import yaml

    return getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


Loc = tuple[Union[str, int], ...]

_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "bool_type": "a boolean (true or false)",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "float_type": "a number",
}


def _type_name(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "mapping"}
    if value is None:
        return "null"
    return names.get(type(value), type(value).__name__)


def read_yaml(
    path: Path, problems: list[Problem], max_bytes: int = DEFAULT_LIMITS.max_bytes
) -> tuple[str, dict[str, Any]] | None:
    """``(text, mapping)`` of one YAML file, or None after recording an io/parse problem.

    The file is refused unread above ``max_bytes``, and before anything is
    constructed when it nests too deep or its aliases would expand too far
    (see :mod:`covenant.manifest.limits`).
    """
    try:
        data = read_capped(path, max_bytes)
    except ManifestTooLarge as exc:
        problems.append(Problem(path, None, None, str(exc)))
        return None
    except OSError as exc:
        problems.append(Problem(path, None, None, f"io error: cannot read the file: {exc.strerror}"))
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        problems.append(Problem(path, line, None, f"parse error: not UTF-8 text ({exc.reason} at byte {exc.start})"))
        return None
    hostile = yaml_structure_problem(text)
    if hostile is not None:
        problems.append(Problem(path, hostile[0], None, hostile[1]))
        return None
    import yaml

    try:
        data = yaml.load(text, Loader=safe_loader())  # noqa: S506 - SafeLoader/CSafeLoader only
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        detail = getattr(exc, "problem", None) or str(exc)
        problems.append(Problem(path, line, None, f"parse error: {detail} (only plain YAML is accepted, no tags)"))
        return None
    if not isinstance(data, dict):
        what = "the file is empty" if data is None else f"got a {_type_name(data)}"
        problems.append(Problem(path, 1, None, f"parse error: expected a mapping of fields at the top level, {what}"))
        return None
    return text, data


def node_line(text: str, loc: Loc) -> int | None:
    """1-based line of the YAML node at ``loc`` (or its nearest existing parent); only called on problems."""
    import yaml

    try:
        node = yaml.compose(text, Loader=safe_loader())
    except yaml.YAMLError:
        return None
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            match = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def field_path(loc: Loc) -> str | None:
    """``('runtime', 'health_probe', 'path')`` -> ``runtime.health_probe.path``; indexes as ``[2]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def problem_at(path: Path, text: str, loc: Loc, message: str) -> Problem:
    return Problem(path, node_line(text, loc), field_path(loc), message)


def _submodel(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def _known_keys(model: type[BaseModel], loc: Loc) -> tuple[str, ...]:
    current: type[BaseModel] = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part)
        sub = _submodel(field.annotation) if field is not None else None
        if sub is None:
            return ()
        current = sub
    return tuple(current.model_fields)


def _message(model: type[BaseModel], error: Any) -> str:
    kind = error["type"]
    value = error.get("input")
    if kind == "missing":
        return "parse error: required field is missing"
    if kind == "extra_forbidden":
        known = _known_keys(model, error["loc"][:-1])
        listing = f" (known keys: {', '.join(known)})" if known else ""
        return f"validation error: unknown key{listing}; unknown keys are rejected so a typo never falls back to a default"
    if kind in _TYPE_WORDS:
        hint = " (quote it)" if kind == "string_type" and isinstance(value, (int, float)) else ""
        return f"validation error: must be {_TYPE_WORDS[kind]}, got {_type_name(value)} {value!r}{hint}"
    if kind == "value_error":
        return "validation error: " + str(error["ctx"]["error"])
    message = error["msg"].replace("Input should be", "should be")
    return f"validation error: {message}, got {value!r}"


def validate_model(
    model: type[BaseModel], data: dict[str, Any], path: Path, text: str, problems: list[Problem]
) -> Any:
    """``model.model_validate(data)``, or None after recording one problem per pydantic error."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            loc = tuple(error["loc"])
            problems.append(Problem(path, node_line(text, loc), field_path(loc), _message(model, error)))
        return None


def yaml_structure_problem(text: str) -> tuple[int, str] | None:
    """``(line, message)`` for a YAML text that nests too deep or whose aliases expand too far.

    Reads the parser's event stream only: nothing is composed or
    constructed, so an alias bomb costs its size on disk. A syntax error is
    left to the loader (which reports it with its line).
    """
    import yaml

    sizes: dict[str, int] = {}  # anchor -> expanded node count
    stack: list[list[Any]] = []  # open collections: [anchor, expanded node count so far]
    total = 0
    aliases = 0
    try:
        for event in yaml.parse(text, Loader=safe_loader()):
            line = event.start_mark.line + 1
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                stack.append([event.anchor, 1])
                total += 1
                if len(stack) > MAX_DEPTH:
                    return line, depth_message()
                continue
            if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                anchor, count = stack.pop()
                if anchor is not None:
                    sizes[anchor] = count
                if stack:
                    stack[-1][1] += count
                continue
            if isinstance(event, yaml.ScalarEvent):
                count = 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_YAML_ALIASES:
                    return line, (
                        f"parse error: more than {MAX_YAML_ALIASES} YAML aliases (*name); refused without expanding "
                        "them (write the values out)"
                    )
                if any(frame[0] == event.anchor for frame in stack):
                    return line, f"parse error: alias *{event.anchor} is inside its own anchor (a recursive structure); refused"
                count = sizes.get(event.anchor, 1)  # an undefined anchor is the loader's error to report
            else:
                continue
            total += count
            if stack:
                stack[-1][1] += count
            if total > MAX_YAML_NODES:
                return line, (
                    f"parse error: YAML aliases would expand this document past {MAX_YAML_NODES} nodes "
                    "(an alias bomb); refused without expanding it"
                )
    except yaml.YAMLError as exc:
        # libyaml >= 0.2.6 refuses deep flow nesting itself, while scanning ahead of the events counted here.
        if "maximum nesting depth" in str(getattr(exc, "problem", "")):
            mark = getattr(exc, "problem_mark", None)
            return (mark.line + 1 if mark is not None else 1), depth_message()
        return None
    return None
