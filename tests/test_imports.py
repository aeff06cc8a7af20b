"""The import graph of the ``genrec`` modules, read from the source (``ast``, nothing imported):
no import cycles, and the serving layer never imports the commands.

Every import is an edge: the module body's, class bodies', ``try`` / ``if`` / ``with``
blocks', the imports inside functions (a deferred import is still a dependency) and those
under ``if TYPE_CHECKING:`` (a type-only dependency is still one). An import of ``a.b.c`` (or
``from a.b import c`` where ``c`` is a module) is an edge to that module alone, not to the
packages Python initialises before it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import genrec

ROOT = Path(genrec.__file__).parent


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("genrec", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(nodes: list[ast.stmt], functions: bool, type_checking: bool
             ) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if functions:
                yield from _imports(node.body, functions, type_checking)
        elif isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            yield from _imports(node.orelse, functions, type_checking)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    blocks = [c for c in children if isinstance(c, ast.stmt)]
                    blocks += [s for c in children if not isinstance(c, ast.stmt)
                               for s in getattr(c, "body", [])]
                    yield from _imports(blocks, functions, type_checking)


def imported_modules(name: str, path: Path, modules: dict[str, Path], functions: bool = False,
                     type_checking: bool = False) -> set[str]:
    """The ``genrec`` modules that ``name`` imports at import time (``functions``: in
    functions too; ``type_checking``: under ``if TYPE_CHECKING:`` too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _imports(ast.parse(path.read_text()).body, functions, type_checking):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:  # a submodule, else a name defined by the module itself
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph(functions: bool = False, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the ``genrec`` modules it imports (see :func:`imported_modules`)."""
    modules = module_files()
    return {name: imported_modules(name, path, modules, functions, type_checking)
            for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def cyclic_groups(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The modules of ``graph`` that import each other, directly or through others: every
    strongly connected component of more than one module (or a module importing itself)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            group = set()
            while not group or node not in group:
                group.add(stack.pop())
            if len(group) > 1 or node in graph[node]:
                groups.append(frozenset(group))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return groups


def test_the_graph_is_read_from_the_source() -> None:
    graph = import_graph()
    assert {"genrec.serving.endpoints", "genrec.serving.worker"} <= graph["genrec.serving.http_app"]
    assert "genrec.serving.schemas" in graph["genrec.serving.routes"]  # from package import module
    assert "genrec.serving.messages" in graph["genrec.serving.worker"]
    # imports in functions and under TYPE_CHECKING are read only when asked for
    process = "genrec.serving.engine_process"
    assert "genrec.serving.components" not in graph[process]
    assert "genrec.serving.components" in import_graph(functions=True)[process]
    assert "genrec.serving.spec" not in graph[process]
    assert "genrec.serving.spec" in import_graph(type_checking=True)[process]


def test_find_cycle_reports_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_cyclic_groups_finds_every_cycle() -> None:
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"e"}, "f": {"a"}}
    assert set(cyclic_groups(graph)) == {frozenset("ab"), frozenset("cd"), frozenset("e")}
    assert cyclic_groups({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_counting_function_and_type_checking_imports() -> None:
    graph = import_graph(functions=True, type_checking=True)
    groups = cyclic_groups(graph)
    shown = [" -> ".join(find_cycle({m: graph[m] & g for m in g}) or sorted(g)) for g in groups]
    assert not groups, "import cycles: " + "; ".join(sorted(shown))


def test_serving_does_not_import_the_commands() -> None:
    graph = import_graph(functions=True, type_checking=True)
    bad = {name: sorted(m for m in deps if m.startswith("genrec.commands"))
           for name, deps in graph.items() if name.startswith("genrec.serving")}
    assert not {k: v for k, v in bad.items() if v}
