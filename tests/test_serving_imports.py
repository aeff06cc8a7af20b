"""The import graph of the ``genrec`` modules, read from the source (``ast``, nothing imported):
no cycles among module-level imports, and the serving layer never imports the commands.

Edges of the cycle check: the imports that run when a module is imported, i.e. the module
body, class bodies, ``try`` / ``if`` / ``with`` blocks included; not the imports inside
functions (they run later, on call) nor those under ``if TYPE_CHECKING:`` (never at run
time). Inside ``genrec.serving`` the ``TYPE_CHECKING`` imports count too (a type-only
dependency is still one). An import of ``a.b.c`` (or ``from a.b import c`` where ``c`` is a
module) is an edge to that module alone, not to the packages Python initialises before it.
The layering check reads every import, functions and ``TYPE_CHECKING`` blocks included.
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


def test_the_graph_is_read_from_the_source() -> None:
    graph = import_graph()
    assert {"genrec.serving.service", "genrec.serving.worker"} <= graph["genrec.serving.app"]
    assert "genrec.serving.schemas" in graph["genrec.serving.app"]  # from package import module
    assert "genrec.serving.messages" in graph["genrec.serving.worker"]
    # deferred and type-only imports are not edges of the cycle check
    assert "genrec.serving.launch" not in graph["genrec.serving.engine_process"]
    assert "genrec.serving.launch" in import_graph(functions=True)[
        "genrec.serving.engine_process"]
    assert "genrec.serving.launch" in import_graph(type_checking=True)[
        "genrec.serving.engine_process"]


def test_find_cycle_reports_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_cycles_in_serving_even_through_type_checking_imports() -> None:
    graph = import_graph(type_checking=True)
    serving = {name: {m for m in deps if m.startswith("genrec.serving")}
               for name, deps in graph.items() if name.startswith("genrec.serving")}
    cycle = find_cycle(serving)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_serving_does_not_import_the_commands() -> None:
    graph = import_graph(functions=True, type_checking=True)
    bad = {name: sorted(m for m in deps if m.startswith("genrec.commands"))
           for name, deps in graph.items() if name.startswith("genrec.serving")}
    assert not {k: v for k, v in bad.items() if v}
