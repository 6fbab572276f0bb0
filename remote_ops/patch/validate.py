"""Local validation of patched text before anything is sent to the host. Pure functions.

- ``check_syntax``: the text parses with the grammar of the host's Python version
  (``ast.parse(feature_version=...)``) and compiles (``compile()``).
- ``undefined_names``: names an edit brings in that resolve nowhere in the module (not a local of the
  enclosing function, not a module-level binding, not a builtin), e.g. ``VLLM_BLOCK_SIZE``. A module
  with a star import cannot be told: the result says so in ``skipped`` instead of passing silently.
"""

from __future__ import annotations

import ast
import builtins
import symtable
from dataclasses import dataclass


@dataclass
class Problem:
    path: str
    line: int | None
    message: str
    edit_id: str | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        who = f" (edit {self.edit_id!r})" if self.edit_id else ""
        return f"{where}: {self.message}{who}"


class NameCheck(list):
    """The problems ``undefined_names`` found (a list of Problem), and ``skipped``: why the check
    could not run on this module (None when it ran)."""

    skipped: str | None = None


def check_syntax(text: str, path: str, python: tuple[int, ...] | list[int] | None) -> Problem | None:
    """None when ``text`` parses for the host's Python (major, minor) and compiles; else the problem."""
    feature = None
    if python and len(python) >= 2 and tuple(python[:2]) >= (3, 4):
        feature = (int(python[0]), int(python[1]))
    try:
        ast.parse(text, filename=path, feature_version=feature)
        compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        ver = f" for Python {feature[0]}.{feature[1]}" if feature else ""
        return Problem(path, exc.lineno, f"does not compile{ver}: {exc.msg}")
    except ValueError as exc:   # e.g. null bytes
        return Problem(path, None, f"does not compile: {exc}")
    return None


def _module_bindings(tree: ast.Module, text: str) -> tuple[set[str], bool]:
    """Names bound at module level, and whether a star import makes that set open-ended."""
    names: set[str] = set()
    star = False
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    star = True
                else:
                    names.add(alias.asname or alias.name.split(".")[0])
    table = symtable.symtable(text, "<module>", "exec")
    for sym in table.get_symbols():
        if sym.is_assigned() or sym.is_imported() or sym.is_namespace():
            names.add(sym.get_name())
    # `global x` assignments inside functions bind at module level too
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.update(node.names)
    names.update({"__name__", "__file__", "__doc__", "__package__", "__spec__", "__loader__",
                  "__builtins__", "__path__", "__annotations__", "__dict__"})
    return names, star


def _unresolved(text: str, path: str) -> dict[str, list[int]] | None:
    """Every name read in ``text`` that resolves nowhere -> lines. None when it cannot be told."""
    tree = ast.parse(text, filename=path)
    module_names, star = _module_bindings(tree, text)
    if star:
        return None
    table = symtable.symtable(text, path, "exec")
    builtin_names = set(dir(builtins))
    unresolved_syms: set[str] = set()

    def walk(t):
        for sym in t.get_symbols():
            name = sym.get_name()
            if not sym.is_referenced():
                continue
            if t.get_type() == "module" or sym.is_global() or sym.is_declared_global():
                if name not in module_names and name not in builtin_names:
                    unresolved_syms.add(name)
        for child in t.get_children():
            walk(child)

    walk(table)
    out: dict[str, list[int]] = {}
    if not unresolved_syms:
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in unresolved_syms:
            out.setdefault(node.id, []).append(node.lineno)
    return out


def undefined_names(old_text: str, new_text: str, path: str, introduced: dict[str, set[str]]
                    ) -> NameCheck:
    """Names the edits introduce (``{edit_id: {names}}``) that do not resolve in the new module.

    A name that was already unresolved in the original text is not blamed on the edit (it is either
    a dynamic global the module relies on, or an existing bug we did not make).
    """
    out = NameCheck()
    try:
        new_bad = _unresolved(new_text, path)
    except SyntaxError:
        return out           # reported by check_syntax
    if new_bad is None:      # star import: cannot tell, do not guess, and say so
        names = sorted(set().union(*introduced.values())) if introduced else []
        out.skipped = (f"{path}: undefined-name check skipped: the module has a star import, so the names it "
                       "binds cannot be told without importing it"
                       + (f"; not checked: {', '.join(names)}" if names else ""))
        return out
    try:
        old_bad = _unresolved(old_text, path) or {}
    except SyntaxError:
        old_bad = {}
    problems = out
    for edit_id, names in introduced.items():
        for name in sorted(names):
            if name in new_bad and name not in old_bad:
                problems.append(Problem(path, new_bad[name][0],
                                        f"name {name!r} is not defined in the patched module", edit_id))
    # anything newly unresolved that no edit declared still is an error
    declared = set().union(*introduced.values()) if introduced else set()
    for name, lines in sorted(new_bad.items()):
        if name not in old_bad and name not in declared:
            problems.append(Problem(path, lines[0], f"name {name!r} is not defined in the patched module"))
    return problems
