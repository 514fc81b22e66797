"""The house has no import circles, and imports run down the layers.

Every ``import`` of a ``covenant`` module counts: at the top of a file, inside
a function (a lazy import is still a dependency) and under ``TYPE_CHECKING``
(a type is still a dependency). The layers, bottom to top, are the ones
docs/architecture.md draws; a module may import its own layer and any layer
below. An import that runs up is allowed only when it is listed in
:data:`ALLOWED_UPWARD` *and* the importing line carries a comment that says
why (``# layers: …``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "covenant"

# Bottom to top. A module belongs to the layer of its longest matching prefix.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("covenant.actions", "covenant.canonical", "covenant.cancellation", "covenant.chainlog",
                    "covenant.clock", "covenant.durable", "covenant.errors", "covenant.keyed_locks", "covenant.keys",
                    "covenant.log_extras", "covenant.outside_json", "covenant.priorities", "covenant.ratelimit",
                    "covenant.sse", "covenant.terminal", "covenant.toml_lines", "covenant.home", "covenant",
                    "covenant.homeinit", "covenant.netpolicy", "covenant.stream_sink")),
    # covenant.toml is read as a whole, so each feature's section model (kept beside its feature, with the
    # pure parsing it validates with) sits here.
    ("config", ("covenant.config", "covenant.a2a.config", "covenant.a2a.remotes", "covenant.triggers.config",
                "covenant.triggers.webhook_config", "covenant.fleet.config", "covenant.logs")),
    ("manifest", ("covenant.manifest",)),
    ("policy", ("covenant.policy",)),
    ("audit", ("covenant.audit",)),
    ("runtime", ("covenant.runtime",)),
    ("capabilities", ("covenant.models", "covenant.tools", "covenant.rune", "covenant.workflow",
                      "covenant.triggers", "covenant.a2a")),
    ("daemon", ("covenant.daemon",)),
    # The fleet process is a top-level process of its own, like the CLI (asyncio + nats-py; docs/fleet.md).
    ("cli", ("covenant.cli", "covenant.client", "covenant.__main__", "covenant.fleet")),
)

# (importer, imported): each also needs a "# layers:" comment on the import line saying why.
ALLOWED_UPWARD: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    justified: bool


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` loads: itself, or the package of a name imported from it."""
    while name not in modules:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    source = path.read_text()
    lines = source.splitlines()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        statement = "\n".join(lines[node.lineno - 1: node.end_lineno])
        justified = "# layers:" in statement
        seen = set()
        for name in names:
            target = _resolve(name, modules) if name.startswith("covenant") else None
            if target is not None and target != module and target not in seen:
                seen.add(target)
                yield Import(module, target, node.lineno, justified)


def _graph() -> list[Import]:
    modules = _modules()
    return [found for module, path in modules.items() for found in _imports(module, path, modules)]


def layer_of(module: str) -> int:
    best, best_length = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS (and docs/architecture.md)"
    return best


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles() -> None:
    edges: dict[str, set[str]] = {}
    for found in _graph():
        edges.setdefault(found.importer, set()).add(found.imported)
    assert _cycles(edges) == []


def test_every_module_has_a_layer() -> None:
    for module in _modules():
        layer_of(module)


def test_imports_run_down_the_layers() -> None:
    upward = sorted({(i.importer, i.imported) for i in _graph() if layer_of(i.imported) > layer_of(i.importer)})
    assert [edge for edge in upward if edge not in ALLOWED_UPWARD] == []
    assert len(ALLOWED_UPWARD) <= 2


def test_allowed_upward_imports_say_why() -> None:
    for found in _graph():
        if (found.importer, found.imported) in ALLOWED_UPWARD:
            assert found.justified, f"{found.importer}:{found.line} imports {found.imported} without '# layers: why'"


def test_the_checks_see_circles_and_layers() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("covenant.daemon.service") > layer_of("covenant.runtime.runner") > layer_of("covenant.config")
    assert layer_of("covenant.a2a.config") < layer_of("covenant.a2a.server")
    imported = {(i.importer, i.imported) for i in _graph()}
    assert ("covenant.daemon.main", "covenant.config") in imported  # the walk sees real imports
