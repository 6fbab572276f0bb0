"""docs/ARCHITECTURE.md stays true: every module path and folder its tree lists exists where it says, every
class it credits to a module is defined there, and every constructor it spells out has those parameters.

The tree is the fenced block that starts with ``remote_ops/``: a line ``<indent>name/`` opens a folder, a
line ``<indent>a.py[, b.py]  text`` lists modules of the folder above it. In a folder's own line (and its
continuation lines) the ``x.py`` names are that folder's modules (the agent's subpackages are described
that way). Anywhere in the document, a path such as ``agent/job/status.py`` or ``tests/test_x.py`` exists.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from tests.conftest import REPO

PKG = REPO / "remote_ops"
DOC = REPO / "docs" / "ARCHITECTURE.md"

ENTRY = re.compile(r"^(?P<indent> +)(?P<names>(?:[A-Za-z_][\w]*\.py|[A-Za-z_]\w*/)(?:, [A-Za-z_][\w]*\.py)*)(?:\s{2,}(?P<text>.*)|\s*$)")
PY_NAME = re.compile(r"(?<![\w/.])([A-Za-z_]\w*\.py)\b")
PATH = re.compile(r"(?<![\w/.-])((?:remote_ops/|tests/|benchmarks/|playbooks/|scripts/|docs/)?"
                  r"(?:agent|connect|check|patch|playbook|extract|commands)(?:/[A-Za-z_]\w*)*/[A-Za-z_]\w*\.py)\b")
TOP_PATH = re.compile(r"(?<![\w/.-])((?:tests|benchmarks|scripts)/[\w./-]+\.(?:py|sh))\b")
CAMEL = re.compile(r"(?<![\w.])([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[A-Z][a-z]{2,})(?![\w(])")


def tree_lines() -> list[str]:
    text = DOC.read_text()
    start = text.index("```\nremote_ops/\n") + 4
    end = text.index("```", start)
    return text[start:end].splitlines()


def entries():
    """(folder path relative to remote_ops, names on the entry line, its text incl. continuation lines)."""
    lines = tree_lines()
    stack: list[tuple[int, str]] = []          # (indent, folder)
    out = []
    for i, line in enumerate(lines[1:], 1):
        m = ENTRY.match(line)
        if not m:
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        folder = "/".join(f for _, f in stack)
        text = [m["text"] or ""]
        for nxt in lines[i + 1:]:
            if ENTRY.match(nxt) or len(nxt) - len(nxt.lstrip()) <= indent:
                break
            text.append(nxt.strip())
        names = m["names"].split(", ")
        out.append((folder, names, " ".join(text)))
        if names[0].endswith("/"):
            stack.append((indent, names[0][:-1]))
    return out


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return out


def all_classes() -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(p)
    return out


def test_the_tree_is_found_and_covers_the_package():
    found = entries()
    assert len(found) > 60
    listed = {(folder, n) for folder, names, _ in found for n in names}
    # every folder of the package is in the tree
    for d in sorted(p for p in PKG.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        rel = d.relative_to(PKG)
        parent = "/".join(rel.parts[:-1])
        assert (parent, rel.name + "/") in listed, f"docs/ARCHITECTURE.md's tree does not list remote_ops/{rel}/"


@pytest.mark.parametrize("folder,names,text", entries(), ids=lambda v: v if isinstance(v, str) else None)
def test_each_listed_module_exists(folder, names, text):
    base = PKG / folder if folder else PKG
    for n in names:
        assert (base / n).exists(), f"ARCHITECTURE.md lists {folder + '/' if folder else ''}{n}, which does not exist"
    if len(names) == 1 and names[0].endswith("/"):
        # a folder described by its modules: each x.py named in its text is one of them
        d = base / names[0]
        for mod in PY_NAME.findall(text):
            assert (d / mod).exists(), f"ARCHITECTURE.md: {folder}/{names[0]} names {mod}, not in that folder"


def test_every_path_in_the_document_exists():
    text = DOC.read_text()
    missing = []
    for m in PATH.finditer(text):
        p = m.group(1)
        candidates = [REPO / p, PKG / p]
        if not any(c.exists() for c in candidates):
            missing.append(p)
    for m in TOP_PATH.finditer(text):
        if not (REPO / m.group(1)).exists():
            missing.append(m.group(1))
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {sorted(set(missing))}"


def test_classes_are_credited_to_the_module_that_defines_them():
    classes = all_classes()
    wrong = []
    for folder, names, text in entries():
        if len(names) != 1 or not names[0].endswith(".py"):
            continue
        path = (PKG / folder / names[0]) if folder else PKG / names[0]
        first = re.sub(r"\([^)]*\)", "", text.split(";")[0].split(":")[0])   # what the module holds (no bases)
        here = defined_names(path)
        for name in CAMEL.findall(first):
            if name in classes and name not in here:
                wrong.append(f"{folder}/{names[0]}: {name} lives in "
                             + ", ".join(str(p.relative_to(PKG)) for p in classes[name]))
    assert not wrong, "ARCHITECTURE.md credits classes to modules that do not define them:\n" + "\n".join(wrong)


def test_spelled_out_constructors_match_their_signatures():
    from remote_ops.fleet import Fleet, HostResult

    text = DOC.read_text()
    checked = 0
    for cls in (Fleet, HostResult):
        for m in re.finditer(r"`%s\(([^`]*)\)`" % cls.__name__, text):
            doc_params = [a.strip().split("=")[0].strip() for a in m.group(1).split(",") if a.strip()]
            real = [n for n in inspect.signature(cls).parameters if n != "self"]
            assert doc_params == real, f"ARCHITECTURE.md spells {cls.__name__}({', '.join(doc_params)}); it is ({', '.join(real)})"
            checked += 1
    assert checked >= 2


def test_the_modules_said_to_know_ssh_are_those_that_import_paramiko():
    line = re.search(r"paramiko is imported by ([^(]*)only", " ".join(DOC.read_text().split())).group(1)
    said = set(re.findall(r"(\w+\.py)", line))
    real = set()
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(m.split(".")[0] == "paramiko" for m in mods):
                assert p.parent.name == "connect", f"{p.relative_to(PKG)} imports paramiko outside connect/"
                real.add(p.name)
    assert said == real
