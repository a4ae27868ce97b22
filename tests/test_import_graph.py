"""No import cycle between the library's modules.

The graph: one node per module of each library package (a top-level folder of the repository with an
`__init__.py`, other than tests/ and benchmarks/), one edge per `import` or `from ... import` statement that
names another library module, relative imports resolved. Every statement counts, wherever it stands: at module
level, inside a function (an import deferred to dodge a cycle is still a cycle) and under `if TYPE_CHECKING:`.
`from package import name` is an edge to the submodule `package.name` where there is one, else to the package.
Not edges: the parent packages' `__init__` that Python runs before a submodule (every submodule would then be
in a cycle with its package), and `importlib.import_module` on a string (the registries' lazy tables).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOT_LIBRARY = {"tests", "benchmarks"}


def library_modules(root: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the library packages under `root`."""
    modules = {}
    for init in sorted(root.glob("*/__init__.py")):
        if init.parent.name in NOT_LIBRARY:
            continue
        for path in sorted(init.parent.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imported(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]
) -> set[str]:
    """The library modules that one import statement of `module` names."""
    def known(name: str) -> str | None:  # the longest prefix of `name` that is a library module
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    if isinstance(node, ast.Import):
        names = [known(alias.name) for alias in node.names]
    else:
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            base = package[:len(package) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else known(source)
                 for alias in node.names]
    return {name for name in names if name is not None and name != module}


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported library module: line of the first statement that imports it}."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(node, module, path.name == "__init__.py", modules):
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
        graph[module] = edges
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (`[a, b, ..., a]`) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the library's import depth is far below the recursion limit
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)

    cycles = []
    for component in components:  # the shortest path from the component's first module back to itself
        inside, start = set(component), component[0]
        came_from: dict[str, str] = {}  # breadth first from `start`: each module's predecessor
        frontier = [start]
        while start not in came_from:
            reached = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w in inside and w not in came_from:
                        came_from[w] = v
                        reached.append(w)
            frontier = reached
        path = [start, came_from[start]]
        while path[-1] != start:
            path.append(came_from[path[-1]])
        cycles.append(path[::-1])
    return cycles


def _describe(
    cycle: list[str], graph: dict[str, dict[str, int]], modules: dict[str, Path], root: Path
) -> str:
    steps = [
        f"  {a} -> {b}  ({modules[a].relative_to(root)}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])
    ]
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_the_library_has_no_import_cycle():
    modules = library_modules()
    graph = import_graph(modules)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles between library modules:\n" + "\n".join(
        _describe(c, graph, modules, REPO) for c in cycles)


def test_the_graph_sees_the_library_and_its_imports():
    """Not vacuous: every library package is read, and known edges are there (a top-level import, one inside a
    function, a `from package import submodule`)."""
    modules = library_modules()
    assert {"orchestrator", "workers", "objectives"} <= {m.split(".")[0] for m in modules}
    assert "orchestrator.calibration.spread" in modules and "workers.records" in modules
    graph = import_graph(modules)
    assert "workers.records" in graph["orchestrator.config.schema"]
    assert "workers.records" in graph["orchestrator.cli"]  # imported inside `_error`
    assert "objectives.registry" in graph["workers.evaluate"]  # imported inside functions


def test_a_cycle_through_a_deferred_relative_import_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text("import pkg.b\n")
    (pkg / "b.py").write_text("def f():\n    from .sub.a import g\n")
    (pkg / "c.py").write_text("from pkg import b\n")  # into the cycle, not part of it
    modules = library_modules(tmp_path)
    graph = import_graph(modules)
    assert graph["pkg.sub"] == {"pkg.sub.a": 1} and graph["pkg.c"] == {"pkg.b": 1}
    assert find_cycles(graph) == [["pkg.b", "pkg.sub.a", "pkg.b"]]
    text = _describe(find_cycles(graph)[0], graph, modules, tmp_path)
    assert "pkg/b.py:2" in text and "pkg/sub/a.py:1" in text
