"""No import circles among remote_ops modules, counting every import a module can run.

An import inside a function is still an edge: a circle broken only by moving one import into a
function is a circle (issue #27). Edges come from the source with ``ast``: ``import``/``from``
anywhere in the module (``if TYPE_CHECKING:`` blocks excepted: they never run), relative imports,
and ``importlib.import_module`` of a literal name or of an f-string whose literal prefix names a
package (every module under it counts, as cli.py loads ``remote_ops.commands.{name}``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

ROOT = REPO / "remote_ops"


def module_names(root: Path) -> dict[str, Path]:
    """{dotted name: file} for every module of the package at ``root`` (packages by their __init__)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:`` (its ``else`` runs, so it counts)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that importing ``name`` can import (its own package's __init__s too)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]

    def known(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    targets: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        found: list[str] = []
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            # ``from pkg import mod`` imports the module; ``from mod import name`` the module
            found = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) \
                == "import_module" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found = [arg.value]
            elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                prefix = arg.values[0].value
                found = [m for m in modules if m.startswith(prefix)]
        for dotted in found:
            target = known(dotted)
            if target is None:
                continue
            # importing a.b.c runs a/__init__ and a/b/__init__ first
            parts = target.split(".")
            targets.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    targets.discard(name)
    return {t for t in targets if t in modules}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a path that ends where it starts) per strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:     # Tarjan; the package is small, recursion depth is fine
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
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle(graph, g) for g in groups]


def _circle(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return group


def test_remote_ops_has_no_import_circles():
    found = cycles(import_graph(ROOT))
    assert not found, "import circles (an import inside a function counts):\n" + "\n".join(
        "  " + " -> ".join(c) for c in found)


def test_the_graph_sees_the_imports_that_matter():
    graph = import_graph(ROOT)
    # an import inside a function, a relative import in the agent, importlib with an f-string
    assert "remote_ops.connect.mux" in graph["remote_ops.fleet"]
    assert "remote_ops.agent.contract" in graph["remote_ops.agent.check.calls"]
    assert "remote_ops.commands.check" in graph["remote_ops.cli"]


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_a_circle_through_an_import_in_a_function_is_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "def f():\n    from pkg.sub import c\n",
        "sub/__init__.py": "",
        "sub/c.py": "import importlib\ndef g(n):\n    return importlib.import_module(f'pkg.a{n}')\n",
        "typing_only.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",
        "d.py": "from . import typing_only\n",
    })
    graph = import_graph(root)
    assert graph["pkg.b"] == {"pkg", "pkg.sub", "pkg.sub.c"}
    assert graph["pkg.typing_only"] == set() and graph["pkg.d"] == {"pkg", "pkg.typing_only"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]


# The floors of the controller, lowest first: a module imports only from its own floor or below (the
# flow a reader follows, connect -> facts -> check -> patch -> extract, with the playbook below the three
# that read it). A package's __init__ counts as its floor's too.
FLOORS = (
    {"agent", "sandbox_assets", "errors", "units", "yamlsrc", "suggest", "cachedir", "records", "interrupts",
     "pkgsource", "sshd", "termsafe", "again"},
    {"connect"},
    {"facts"},
    {"playbook"},
    {"check"},
    {"patch"},
    {"extract"},
    {"fleet"},
    {"api", "sandbox"},
    {"commands"},
    {"cli", "__main__"},
)


def floor_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) == 1:       # the package's own __init__: below everything
        return -1
    for i, names in enumerate(FLOORS):
        if parts[1] in names:
            return i
    return None


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            fa, fb = floor_of(a), floor_of(b)
            if fa is not None and fb is not None and fb > fa:
                out.append(f"{a} -> {b}")
    return out


def test_every_top_folder_has_a_floor():
    graph = import_graph(ROOT)
    assert not [m for m in graph if floor_of(m) is None], "add the new top-level module or folder to FLOORS"


def test_no_arrow_runs_up_between_the_floors():
    up = arrows_up(import_graph(ROOT))
    assert not up, "imports that run up a floor (move the shared part down):\n" + "\n".join("  " + a for a in up)


def test_an_arrow_up_is_found():
    graph = {"remote_ops.playbook.loader": {"remote_ops.check.model"}, "remote_ops.check.model": set(),
             "remote_ops.extract.jobs": {"remote_ops.check.model"}}
    assert arrows_up(graph) == ["remote_ops.playbook.loader -> remote_ops.check.model"]
