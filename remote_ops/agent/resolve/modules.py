"""Finding and loading modules by parsing only (the static resolver's first part; stdlib only).

``ModuleIndex`` locates modules with ``importlib.machinery.PathFinder`` over a search path (the
interpreter's ``sys.path`` by default), never importing them, and parses each once into a ``ModInfo``:
the names a module binds at top level (defs, imports, assignments, including those under
``if``/``try``/``with``, not under ``if TYPE_CHECKING``), its ``from x import *`` sources, a literal
``__all__``, and whether it has a module ``__getattr__``. ``package_files`` reads every source file
of a package once, as one blob, for text searches over the whole package. Every file-system read
goes through its ``reads`` (``reads.Reads``), which can record them for ``memo``.
"""

import ast
import os
import sys

from ..core.reads import Reads
from ..resolve.base import Ent, _is_type_checking, _literal_strings, _target_names, missing, unknown


class ModInfo:
    def __init__(self, name, path, tree, is_package):
        self.name = name
        self.path = path
        self.tree = tree
        self.is_package = is_package
        self.names = {}          # name -> binding tuple
        self.stars = []          # absolute module names of `from x import *`
        self.all = None          # list from a literal __all__
        self.has_getattr = False
        self.maybe_dynamic = False   # globals().update(...): names we cannot list
        self.maybe = set()       # names bound by means we do not follow (globals(), exec, ...)
        self._collect(tree.body)

    def _abs(self, module, level):
        if not level:
            return module or ""
        base = self.name.split(".")
        if not self.is_package:
            base = base[:-1]
        if level > 1:
            base = base[:len(base) - (level - 1)]
        parts = base + ([module] if module else [])
        return ".".join(parts)

    def _collect(self, body):
        for st in body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.names[st.name] = ("def", st)
                if st.name == "__getattr__":
                    self.has_getattr = True
            elif isinstance(st, ast.Import):
                for a in st.names:
                    if a.asname:
                        self.names[a.asname] = ("module", a.name, st)
                    else:
                        top = a.name.split(".")[0]
                        self.names[top] = ("module", top, st)
            elif isinstance(st, ast.ImportFrom):
                src = self._abs(st.module, st.level)
                for a in st.names:
                    if a.name == "*":
                        self.stars.append(src)
                    else:
                        self.names[a.asname or a.name] = ("from", src, a.name, st)
            elif isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                for t in targets:
                    for n in _target_names(t):
                        if isinstance(st, ast.AnnAssign) and st.value is None:
                            self.names.setdefault(n, ("annotation", st))
                        else:
                            self.names[n] = ("value", st)
                        if n == "__all__":
                            self._set_all(st)
            elif isinstance(st, ast.If):
                if _is_type_checking(st.test):
                    self._collect(st.orelse)
                else:
                    self._collect(st.body)
                    self._collect(st.orelse)
            elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
                self._collect(st.body)
                for h in st.handlers:
                    self._collect(h.body)
                self._collect(st.orelse)
                self._collect(st.finalbody)
            elif isinstance(st, (ast.With, ast.AsyncWith, ast.For, ast.While)):
                self._collect(st.body)
                if isinstance(st, (ast.For, ast.While)):
                    self._collect(st.orelse)
                if isinstance(st, ast.For):
                    for n in _target_names(st.target):
                        self.names[n] = ("value", st)
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
                f = st.value.func
                # __all__.extend([...]) / __all__ += handled loosely; globals().update(...) is opaque
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) and \
                        isinstance(f.value.func, ast.Name) and f.value.func.id == "globals":
                    self.has_getattr = True
                    self.maybe_dynamic = True
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and \
                        f.value.id == "__all__" and self.all is not None and f.attr == "extend":
                    extra = _literal_strings(st.value.args[0]) if st.value.args else None
                    if extra is None:
                        self.all = None
                    else:
                        self.all = self.all + extra

    def _set_all(self, st):
        value = st.value
        if isinstance(st, ast.AugAssign):
            extra = _literal_strings(value)
            self.all = None if (extra is None or self.all is None) else self.all + extra
            return
        self.all = _literal_strings(value)


# Parsed trees, shared by every ModuleIndex of this process (the trees are only read): a patch's
# verification checks the old and the new text with two resolvers over the same installed
# sources, which would otherwise parse every module they visit twice. Keyed by the file's text
# itself (and its name), so an override or a changed file is a different key.
_TREES = {}


def parse_cached(text, origin):
    key = (origin, text)
    tree = _TREES.get(key)
    if tree is None:
        if len(_TREES) >= 2048:   # a long-lived process checking many releases: stay bounded
            _TREES.clear()
        tree = _TREES[key] = ast.parse(text, filename=origin)
    return tree


class ModuleIndex:
    """Module specs and parsed modules over a search path, each computed once."""

    def __init__(self, sys_path=None, override_sources=None, reads=None):
        self.sys_path = list(sys_path if sys_path is not None else sys.path)
        self.overrides = dict(override_sources or {})
        self.reads = reads if reads is not None else Reads()   # every file-system read goes through it
        self._specs = {}
        self._mods = {}

    def find_spec(self, name):
        if name in self._specs:
            return self._specs[name]
        parent, _, _ = name.rpartition(".")
        spec = None
        if parent:
            pspec = self.find_spec(parent)
            if pspec is not None and pspec.submodule_search_locations:
                spec = self.reads.spec(name, pspec.submodule_search_locations)
        else:
            spec = self.reads.spec(name, self.sys_path)
        self._specs[name] = spec
        return spec

    def module_file(self, name):
        spec = self.find_spec(name)
        if spec is None:
            return None
        origin = spec.origin
        if origin in (None, "namespace") or not self.reads.exists(origin or ""):
            return ""       # namespace package
        return origin

    def load(self, name):
        """ModInfo, or an Ent(missing/unknown) explaining why not."""
        if name in self._mods:
            return self._mods[name]
        result = None
        if not name:
            result = missing("empty module name")
        else:
            spec = self.find_spec(name)
            if spec is None and name not in self.overrides:
                result = missing("no module named %r" % name)
            else:
                origin = spec.origin if spec is not None else "<override>"
                is_pkg = bool(spec is not None and spec.submodule_search_locations)
                if name in self.overrides:
                    text = self.overrides[name]
                elif origin in (None, "namespace") or (spec.origin and not self.reads.exists(spec.origin)):
                    text, origin = "", "<namespace %s>" % name
                elif not origin.endswith(".py"):
                    result = unknown("%s is a compiled module (%s)" % (name, os.path.basename(origin)))
                    text = None
                else:
                    try:
                        text = self.reads.data(origin)
                    except OSError as exc:
                        result = unknown("cannot read %s: %s" % (origin, exc))
                        text = None
                if result is None:
                    try:
                        tree = parse_cached(text, origin)
                    except (SyntaxError, ValueError) as exc:
                        result = unknown("cannot parse %s: %s" % (origin, exc))
                    except RecursionError:
                        result = unknown("cannot parse %s: nested too deeply" % origin)
                    else:
                        result = ModInfo(name, origin, tree, is_pkg)
        self._mods[name] = result
        return result

    def module(self, name):
        m = self.load(name)
        if isinstance(m, ModInfo):
            return Ent("module", mod=m, qual="")
        return m

    def package_modules(self, package, spec):
        """(module, path) of every .py file under the package's directories (``spec``: its spec with
        ``submodule_search_locations``), in ``os.walk`` order with sorted names, never imported."""
        out = []
        for root_dir in spec.submodule_search_locations:
            for dirpath, filenames in self.reads.walk_py(root_dir):
                for fn in filenames:
                    path = os.path.join(dirpath, fn)
                    rel = os.path.relpath(path, root_dir)[:-3].split(os.sep)
                    if rel[-1] == "__init__":
                        rel = rel[:-1]
                    out.append((".".join([package] + rel), path))
        return out

    def _package_files(self, package):
        cache = self.__dict__.setdefault("_pkg_files", {})
        if package in cache:
            return cache[package]
        out = []
        spec = self.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            for name, path in self.package_modules(package, spec):
                try:
                    out.append((name, self.reads.data(path)))
                except OSError:
                    continue
        # one blob (files separated by a NUL byte) so a name is searched for once, not per file
        starts, pos = [], 0
        for _, data in out:
            starts.append(pos)
            pos += len(data) + 1
        cache[package] = (b"\0".join(d for _, d in out), starts, [n for n, _ in out])
        return cache[package]

    package_files = _package_files
