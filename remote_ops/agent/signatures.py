"""Static signature model and resolver over installed sources (runs on the host, stdlib only).

Nothing here imports the packages it looks at: modules are located with
``importlib.machinery.PathFinder`` over a search path (the interpreter's ``sys.path`` by
default) and parsed with ``ast``. One ``Parameter`` model is shared with the runtime path
(``runtime_sigs``); every signature says which mode produced it.

What a class costs to construct is worked out the way Python does it: an explicit
``__init__`` on the class or inherited through its bases (across modules, C3 order),
``@dataclass`` fields (InitVar, ClassVar, ``field(init=False)``, defaults, ``KW_ONLY``,
``kw_only=True``) including pydantic dataclasses and decorators that wrap one (vLLM's
``@config``), pydantic ``BaseModel``, ``msgspec.Struct`` and ``NamedTuple`` fields. Anything
else (an ``Enum``, ``__new__``, a metaclass, an unknown decorator, a base that cannot be
found) becomes ``Unknown(reason)``: never a guess.
"""

import ast
import bisect
import importlib.machinery
import os
import sys

POSONLY = "positional-only"
POSKW = "positional-or-keyword"
KWONLY = "keyword-only"
VARPOS = "var-positional"
VARKW = "var-keyword"


class Parameter:
    __slots__ = ("name", "kind", "default", "annotation")

    def __init__(self, name, kind, default=None, annotation=None):
        self.name = name
        self.kind = kind
        self.default = default          # None: required (source text of the default otherwise)
        self.annotation = annotation

    @property
    def required(self):
        return self.default is None and self.kind not in (VARPOS, VARKW)

    def to_json(self):
        return {"name": self.name, "kind": self.kind, "required": self.required,
                "default": self.default, "annotation": self.annotation}

    def render(self):
        s = self.name
        if self.kind == VARPOS:
            s = "*" + s
        elif self.kind == VARKW:
            s = "**" + s
        if self.annotation:
            s += ": " + self.annotation
        if self.default is not None:
            s += (" = " if self.annotation else "=") + self.default
        return s


class Signature:
    def __init__(self, params, mode, origin=None, note=None):
        self.params = list(params)
        self.mode = mode
        self.origin = origin
        self.note = note

    def render(self):
        out, star_done = [], False
        for i, p in enumerate(self.params):
            if p.kind == KWONLY and not star_done:
                out.append("*")
                star_done = True
            if p.kind == VARPOS:
                star_done = True
            out.append(p.render())
            if p.kind == POSONLY and (i + 1 == len(self.params) or self.params[i + 1].kind != POSONLY):
                out.append("/")
        return "(" + ", ".join(out) + ")"

    def to_json(self):
        return {"mode": self.mode, "origin": self.origin, "note": self.note,
                "signature": self.render(), "parameters": [p.to_json() for p in self.params]}

    def drop_first(self):
        params = self.params
        if params and params[0].kind in (POSONLY, POSKW):
            params = params[1:]
        elif params and params[0].kind == VARPOS:
            pass
        return Signature(params, self.mode, self.origin, self.note)


class Unknown:
    def __init__(self, reason):
        self.reason = reason

    def __repr__(self):
        return "Unknown(%r)" % self.reason


def bind(sig, npos, star, keywords, dstar):
    """Simulate Python's argument binding; returns [(kind, name, message)] that are certain.

    ``npos`` positional arguments (``star``: the call also unpacks ``*args`` so the count is
    unknown), ``keywords`` the explicit keyword names, ``dstar``: the call unpacks ``**kw``.
    """
    problems = []
    positional = [p for p in sig.params if p.kind in (POSONLY, POSKW)]
    has_varpos = any(p.kind == VARPOS for p in sig.params)
    has_varkw = any(p.kind == VARKW for p in sig.params)
    by_name = {p.name: p for p in sig.params if p.kind in (POSKW, KWONLY)}
    bound = set()
    if not star:
        if npos > len(positional) and not has_varpos:
            problems.append(("too-many-positional", None,
                             "takes %d positional argument%s but %d %s given" % (
                                 len(positional), "" if len(positional) == 1 else "s", npos,
                                 "was" if npos == 1 else "were")))
        bound.update(p.name for p in positional[:npos])
    else:
        bound.update(p.name for p in positional[:npos])
    for kw in keywords:
        p = by_name.get(kw)
        if p is None:
            if not has_varkw:
                problems.append(("unexpected-keyword", kw, "got an unexpected keyword argument %r" % kw))
            continue
        if kw in bound and not star:
            problems.append(("unexpected-keyword", kw, "got multiple values for argument %r" % kw))
        bound.add(kw)
    if not dstar:
        for p in sig.params:
            if not p.required or p.name in bound:
                continue
            if star and p.kind in (POSONLY, POSKW):
                continue        # *args may fill it
            problems.append(("missing-argument", p.name,
                             "missing required %sargument %r" % (
                                 "keyword-only " if p.kind == KWONLY else "", p.name)))
    return problems


# ----------------------------------------------------------------------------- entities
class Ent:
    """A resolved name: kind is module, class, function, value, missing or unknown."""

    __slots__ = ("kind", "mod", "node", "qual", "reason", "owner", "bound", "special", "decos")

    def __init__(self, kind, mod=None, node=None, qual="", reason=None, owner=None, bound=False,
                 special=None):
        self.kind = kind
        self.mod = mod          # ModInfo defining it (or the module itself)
        self.node = node
        self.qual = qual
        self.reason = reason
        self.owner = owner      # the class Ent a method was found on
        self.bound = bound      # accessed through an instance / classmethod: drop first param
        self.special = special  # canonical dotted name of a well-known outside object
        self.decos = None

    @property
    def where(self):
        if self.mod is not None and self.node is not None:
            return "%s:%d" % (self.mod.path, getattr(self.node, "lineno", 0))
        if self.mod is not None:
            return self.mod.path
        return None


def missing(reason):
    return Ent("missing", reason=reason)


def unknown(reason):
    return Ent("unknown", reason=reason)


# Well-known objects outside the analysed packages, by canonical dotted name.
TRANSPARENT_BASES = {"object", "builtins.object", "typing.Generic", "typing.Protocol",
                     "typing_extensions.Protocol", "typing_extensions.Generic", "abc.ABC",
                     "collections.abc.Hashable"}
ENUM_BASES = {"enum.Enum", "enum.IntEnum", "enum.StrEnum", "enum.Flag", "enum.IntFlag",
              "enum.ReprEnum"}
STRUCT_BASES = {"msgspec.Struct"}
MODEL_BASES = {"pydantic.BaseModel", "pydantic.main.BaseModel"}
NAMEDTUPLE_BASES = {"typing.NamedTuple", "typing_extensions.NamedTuple"}
TYPEDDICT_BASES = {"typing.TypedDict", "typing_extensions.TypedDict"}
DATACLASS_MAKERS = {"dataclasses.dataclass", "pydantic.dataclasses.dataclass"}
FIELD_MAKERS = {"dataclasses.field", "pydantic.Field", "pydantic.fields.Field", "msgspec.field"}
CLASSVAR = {"typing.ClassVar", "typing_extensions.ClassVar"}
INITVAR = {"dataclasses.InitVar"}
KW_ONLY = {"dataclasses.KW_ONLY"}
TRANSPARENT_CLASS_DECOS = {"typing.final", "typing_extensions.final", "functools.total_ordering",
                           "typing.runtime_checkable", "typing_extensions.runtime_checkable",
                           "typing.type_check_only", "typing_extensions.deprecated",
                           "warnings.deprecated"}
PRESERVING_FUNC_DECOS = {"typing.overload", "typing.override", "typing_extensions.override",
                         "typing.final", "typing_extensions.final", "abc.abstractmethod",
                         "functools.cache", "functools.lru_cache", "functools.wraps",
                         "contextlib.contextmanager", "contextlib.asynccontextmanager",
                         "torch.no_grad", "torch.inference_mode", "torch.compiler.disable",
                         "typing_extensions.deprecated", "warnings.deprecated",
                         "typing.no_type_check"}
BUILTIN_NAMES = set(dir(__builtins__) if isinstance(__builtins__, dict) is False
                    else __builtins__.keys())
ENUM_ATTRS = {"name", "value", "_name_", "_value_", "_missing_", "_generate_next_value_",
              "_member_map_", "_member_names_", "_value2member_map_", "_ignore_", "_order_"}


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


def _literal_strings(node):
    if isinstance(node, (ast.List, ast.Tuple)):
        out = []
        for e in node.elts:
            if isinstance(e, ast.Constant) and isinstance(e.value, str):
                out.append(e.value)
            else:
                return None
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal_strings(node.left), _literal_strings(node.right)
        return None if a is None or b is None else a + b
    return None


def _target_names(t):
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, (ast.Tuple, ast.List)):
        out = []
        for e in t.elts:
            out.extend(_target_names(e.value if isinstance(e, ast.Starred) else e))
        return out
    return []


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def dotted(node):
    """'a.b.c' for Name/Attribute chains, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _unparse(node):
    try:
        s = ast.unparse(node)
    except Exception:  # very old/odd nodes: a default we cannot print is still a default
        s = "..."
    return s if len(s) <= 60 else s[:57] + "..."


class StaticResolver:
    """Resolves names to entities and signatures over a search path, by parsing only."""

    mode = "static"

    def __init__(self, sys_path=None, override_sources=None):
        self.sys_path = list(sys_path if sys_path is not None else sys.path)
        self.overrides = dict(override_sources or {})
        self._specs = {}
        self._mods = {}
        self._sig_cache = {}

    # ------------------------------------------------------------------ modules
    def find_spec(self, name):
        if name in self._specs:
            return self._specs[name]
        parent, _, _ = name.rpartition(".")
        spec = None
        if parent:
            pspec = self.find_spec(parent)
            if pspec is not None and pspec.submodule_search_locations:
                spec = importlib.machinery.PathFinder.find_spec(
                    name, list(pspec.submodule_search_locations))
        else:
            spec = importlib.machinery.PathFinder.find_spec(name, self.sys_path)
        self._specs[name] = spec
        return spec

    def module_file(self, name):
        spec = self.find_spec(name)
        if spec is None:
            return None
        origin = spec.origin
        if origin in (None, "namespace") or not os.path.exists(origin or ""):
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
                elif origin in (None, "namespace") or (spec.origin and not os.path.exists(spec.origin)):
                    text, origin = "", "<namespace %s>" % name
                elif not origin.endswith(".py"):
                    result = unknown("%s is a compiled module (%s)" % (name, os.path.basename(origin)))
                    text = None
                else:
                    try:
                        with open(origin, "rb") as fh:
                            text = fh.read()
                    except OSError as exc:
                        result = unknown("cannot read %s: %s" % (origin, exc))
                        text = None
                if result is None:
                    try:
                        tree = ast.parse(text, filename=origin)
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

    # ------------------------------------------------------------------ names
    def lookup(self, modname, name, _seen=None):
        """The object ``modname.name`` (attribute of a module, or its submodule)."""
        full = modname + "." + name if modname else name
        special = _special(full)
        if special:
            return Ent("value", special=special, qual=name)
        m = self.load(modname)
        if not isinstance(m, ModInfo):
            if m.kind == "missing" and _outside_special(modname):
                return Ent("value", special=full, qual=name)
            return m
        return self._lookup_in(m, name, _seen or set())

    def _lookup_in(self, m, name, seen):
        special = _special(m.name + "." + name)
        if special:
            return Ent("value", special=special, qual=name)
        key = (m.name, name)
        if key in seen:
            return unknown("import cycle through %s.%s" % (m.name, name))
        seen = seen | {key}
        b = m.names.get(name)
        if b is not None:
            return self._follow(m, name, b, seen)
        for star in m.stars:
            sm = self.load(star)
            if not isinstance(sm, ModInfo):
                if sm.kind == "unknown":
                    return unknown("%s does `from %s import *` and %s" % (m.name, star, sm.reason))
                continue
            public = sm.all if sm.all is not None else [
                n for n in self._star_names(sm) if not n.startswith("_")]
            if name in public:
                return self._lookup_in(sm, name, seen)
        if m.is_package or m.path.startswith("<namespace"):
            sub = self.find_spec(m.name + "." + name)
            if sub is not None:
                return self.module(m.name + "." + name)
        if m.has_getattr:
            b = m.names.get("__getattr__")
            if b is not None and b[0] == "def" and isinstance(b[1], ast.FunctionDef) and not m.maybe_dynamic:
                e = self._module_getattr(m, b[1], name, seen)
                if e is not None:
                    return e
            return unknown("%s defines a module __getattr__ whose result for %r is not known statically"
                           % (m.name, name))
        if name.startswith("__") and name.endswith("__"):
            return Ent("value", mod=m, qual=name)
        return missing("%s has no attribute %r" % (m.name, name))

    # ---------------------------------------------------------------- module __getattr__
    def _module_getattr(self, m, fn, name, seen):
        """What ``m.<name>`` is when a module-level ``__getattr__`` makes it (PEP 562), for the
        lazy re-export idioms: ``if name == "X": from .a import X; return X``, ``if name in MAP:
        mod, attr = MAP[name].split(":"); return getattr(import_module(mod, __package__), attr)``,
        ``return getattr(import_module(MAP[name]), name)``, ``raise AttributeError``. None when
        the function does anything else on the way (then the name stays unknown)."""
        args = fn.args.posonlyargs + fn.args.args
        if len(args) != 1:
            return None
        env = {args[0].arg: ("str", name)}
        try:
            return self._getattr_block(m, fn.body, env, seen)
        except _Opaque:
            return None

    def _getattr_block(self, m, body, env, seen):
        for st in body:
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
                continue
            if isinstance(st, (ast.Pass, ast.Global, ast.Nonlocal)):
                continue
            if isinstance(st, ast.If):
                cond = self._getattr_test(m, st.test, env)
                r = self._getattr_block(m, st.body if cond else st.orelse, env, seen)
                if r is not None:
                    return r
                continue
            if isinstance(st, ast.ImportFrom):
                src = m._abs(st.module, st.level)
                for a in st.names:
                    if a.name == "*":
                        raise _Opaque()
                    env[a.asname or a.name] = ("from", src, a.name)
                continue
            if isinstance(st, ast.Import):
                for a in st.names:
                    if a.name == "importlib":
                        env[a.asname or "importlib"] = ("importlib",)
                    elif a.asname:
                        env[a.asname] = ("module", a.name)
                    else:
                        env[a.name.split(".")[0]] = ("module", a.name.split(".")[0])
                continue
            if isinstance(st, ast.Assign) and len(st.targets) == 1:
                t, v = st.targets[0], self._getattr_eval(m, st.value, env)
                if isinstance(t, ast.Name):
                    env[t.id] = v
                elif isinstance(t, (ast.Tuple, ast.List)) and v[0] == "strs" and len(v[1]) == len(t.elts) \
                        and all(isinstance(x, ast.Name) for x in t.elts):
                    for x, val in zip(t.elts, v[1]):
                        env[x.id] = ("str", val)
                else:
                    raise _Opaque()
                continue
            if isinstance(st, ast.Return):
                v = self._getattr_eval(m, st.value, env) if st.value is not None else ("opaque",)
                if v[0] == "from":
                    return self.lookup(v[1], v[2], seen)
                if v[0] == "module":
                    return self.module(v[1])
                if v[0] == "ent":
                    return v[1]
                raise _Opaque()
            if isinstance(st, ast.Raise):
                exc = st.exc.func if isinstance(st.exc, ast.Call) else st.exc
                if dotted(exc) == "AttributeError":
                    return missing("%s has no attribute %r (its __getattr__ raises AttributeError)" % (m.name, env_name(env)))
                raise _Opaque()
            raise _Opaque()
        return None

    def _getattr_test(self, m, test, env):
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            left = self._getattr_eval(m, test.left, env)
            op = test.ops[0]
            if isinstance(op, (ast.In, ast.NotIn)):
                keys = self._getattr_keys(m, test.comparators[0])
                if left[0] == "str" and keys is not None:
                    return (left[1] in keys) == isinstance(op, ast.In)
            elif isinstance(op, (ast.Eq, ast.NotEq)):
                right = self._getattr_eval(m, test.comparators[0], env)
                if left[0] == "str" and right[0] == "str":
                    return (left[1] == right[1]) == isinstance(op, ast.Eq)
        raise _Opaque()

    def _getattr_keys(self, m, node):
        """Literal string keys of a module-level dict/list/tuple/set (or ``__all__``)."""
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return _literal_strings(ast.List(elts=node.elts)) if node.elts else []
        if isinstance(node, ast.Name):
            if node.id == "__all__":
                return m.all
            d = self._module_literal(m, node.id)
            if isinstance(d, dict):
                return list(d)
            if isinstance(d, (list, tuple, set, frozenset)) and all(isinstance(x, str) for x in d):
                return list(d)
        return None

    def _module_literal(self, m, varname):
        b = m.names.get(varname)
        if b is None or b[0] != "value" or getattr(b[1], "value", None) is None:
            return None
        st = b[1]
        # only a single plain binding counts (no later mutation we would miss)
        for other in ast.walk(m.tree):
            if isinstance(other, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and other is not st:
                tg = other.targets if isinstance(other, ast.Assign) else [other.target]
                for t in tg:
                    base = t.value if isinstance(t, ast.Subscript) else t
                    if isinstance(base, ast.Name) and base.id == varname:
                        return None
            if isinstance(other, ast.Call) and isinstance(other.func, ast.Attribute) and \
                    isinstance(other.func.value, ast.Name) and other.func.value.id == varname and \
                    other.func.attr in ("update", "setdefault", "pop", "__setitem__", "append", "extend", "add"):
                return None
        try:
            return ast.literal_eval(st.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None

    def _getattr_eval(self, m, node, env):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return ("str", node.value)
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id == "__package__":
                return ("str", m.name if m.is_package else m.name.rpartition(".")[0])
            if node.id == "__name__":
                return ("str", m.name)
            raise _Opaque()
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            key = self._getattr_eval(m, node.slice, env)
            d = self._module_literal(m, node.value.id)
            if key[0] == "str" and isinstance(d, dict) and isinstance(d.get(key[1]), str):
                return ("str", d[key[1]])
            if key[0] == "str" and isinstance(d, dict) and isinstance(d.get(key[1]), tuple) and \
                    all(isinstance(x, str) for x in d[key[1]]):
                return ("strs", list(d[key[1]]))
            raise _Opaque()
        if isinstance(node, ast.Attribute):
            base = self._getattr_eval(m, node.value, env)
            if base[0] == "module":
                return ("from", base[1], node.attr)
            if base[0] == "from":
                e = self.lookup(base[1], base[2])
                if e.kind == "module":
                    return ("from", e.mod.name, node.attr)
            if base[0] == "ent" and base[1].kind == "module":
                return ("from", base[1].mod.name, node.attr)
            raise _Opaque()
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("split", "rsplit") and len(node.args) == 1 \
                    and not node.keywords:
                base = self._getattr_eval(m, f.value, env)
                sep = self._getattr_eval(m, node.args[0], env)
                if base[0] == "str" and sep[0] == "str" and sep[1]:
                    return ("strs", base[1].split(sep[1]) if f.attr == "split" else base[1].rsplit(sep[1]))
                raise _Opaque()
            fname = None
            if isinstance(f, ast.Name) and f.id in env and env[f.id] == ("from", "importlib", "import_module"):
                fname = "import_module"
            elif isinstance(f, ast.Attribute) and f.attr == "import_module" and isinstance(f.value, ast.Name) \
                    and env.get(f.value.id) == ("importlib",):
                fname = "import_module"
            elif isinstance(f, ast.Attribute) and f.attr == "import_module" and dotted(f.value) == "importlib":
                b = m.names.get("importlib")
                if b is not None and b[0] == "module" and b[1] == "importlib":
                    fname = "import_module"
            elif isinstance(f, ast.Name) and f.id == "import_module" and f.id not in env:
                b = m.names.get("import_module")
                if b is not None and b[0] == "from" and b[1] == "importlib" and b[2] == "import_module":
                    fname = "import_module"
            elif isinstance(f, ast.Name) and f.id == "getattr" and "getattr" not in env \
                    and "getattr" not in m.names and len(node.args) == 2:
                obj = self._getattr_eval(m, node.args[0], env)
                attr = self._getattr_eval(m, node.args[1], env)
                if obj[0] == "from":
                    e = self.lookup(obj[1], obj[2])
                    if e.kind == "module":
                        obj = ("module", e.mod.name)
                if obj[0] == "module" and attr[0] == "str":
                    return ("from", obj[1], attr[1])
                raise _Opaque()
            if fname == "import_module" and node.args and not node.keywords and len(node.args) <= 2:
                target = self._getattr_eval(m, node.args[0], env)
                if target[0] != "str":
                    raise _Opaque()
                modname = target[1]
                if modname.startswith("."):
                    if len(node.args) != 2:
                        raise _Opaque()
                    pkg = self._getattr_eval(m, node.args[1], env)
                    if pkg[0] != "str":
                        raise _Opaque()
                    level = len(modname) - len(modname.lstrip("."))
                    parts = pkg[1].split(".")
                    if level > 1:
                        parts = parts[:len(parts) - (level - 1)]
                    rest = modname[level:]
                    modname = ".".join(parts + ([rest] if rest else []))
                return ("module", modname)
        raise _Opaque()

    def _star_names(self, m, _seen=None):
        seen = _seen or set()
        if m.name in seen:
            return []
        seen.add(m.name)
        names = [n for n, b in m.names.items()]
        for star in m.stars:
            sm = self.load(star)
            if isinstance(sm, ModInfo):
                names += sm.all if sm.all is not None else self._star_names(sm, seen)
        return names

    def _follow(self, m, name, b, seen):
        kind = b[0]
        if kind == "def":
            node = b[1]
            k = "class" if isinstance(node, ast.ClassDef) else "function"
            return Ent(k, mod=m, node=node, qual=name)
        if kind == "module":
            if _outside_special(b[1]):
                return Ent("value", special=b[1], qual=name)
            return self.module(b[1]) if self.find_spec(b[1]) is not None or b[1] in self.overrides \
                else (Ent("value", special=b[1], qual=name) if _outside_special(b[1])
                      else missing("no module named %r" % b[1]))
        if kind == "from":
            src, attr = b[1], b[2]
            special = _special(src + "." + attr)
            if special:
                return Ent("value", special=special, qual=attr)
            sm = self.load(src)
            if not isinstance(sm, ModInfo):
                if sm.kind == "missing" and _outside_special(src):
                    return Ent("value", special=src + "." + attr, qual=attr)
                if sm.kind == "missing":
                    return unknown("%s imports %s from %s, which is not installed" % (m.name, attr, src))
                return sm
            return self._lookup_in(sm, attr, seen)
        if kind == "value":
            st = b[1]
            value = getattr(st, "value", None)
            # `Alias = OtherClass` keeps the class
            if isinstance(value, (ast.Name, ast.Attribute)) and isinstance(st, (ast.Assign, ast.AnnAssign)):
                d = dotted(value)
                if d and d != name:
                    e = self.resolve_dotted(m, d, seen)
                    if e.kind in ("class", "function", "module"):
                        return e
            return Ent("value", mod=m, node=st, qual=name)
        return Ent("value", mod=m, node=b[1], qual=name)

    def resolve_dotted(self, m, text, seen=frozenset()):
        """Resolve a dotted expression as written inside module ``m``."""
        parts = text.split(".")
        head = parts[0]
        if head in m.names or any(True for _ in ()):
            e = self._lookup_in(m, head, set(seen))
        else:
            e = None
            for star in m.stars:
                sm = self.load(star)
                if isinstance(sm, ModInfo) and head in (sm.all if sm.all is not None else self._star_names(sm)):
                    e = self._lookup_in(sm, head, set(seen))
                    break
            if e is None:
                if head in BUILTIN_NAMES:
                    e = Ent("value", special="builtins." + head, qual=head)
                else:
                    e = unknown("name %r is not defined in %s" % (head, m.name))
        for p in parts[1:]:
            e = self.member(e, p)
        return e

    def member(self, e, name):
        """``e.name`` accessed on the object itself (module attribute or class attribute)."""
        if e.special:
            sp = e.special + "." + name
            s = _special(sp)
            return Ent("value", special=s or sp, qual=name)
        if e.kind == "module":
            return self._lookup_in(e.mod, name, set())
        if e.kind == "class":
            return self.class_attr(e, name, via_instance=False)
        if e.kind in ("missing", "unknown"):
            return e
        return unknown("attribute %r of a %s is not followed" % (name, e.kind))

    # ------------------------------------------------------------------ classes
    def base_ents(self, cls):
        out = []
        for b in cls.node.bases:
            expr = b.value if isinstance(b, ast.Subscript) else b
            d = dotted(expr)
            if d is None:
                out.append(unknown("base %s is an expression" % _unparse(b)))
                continue
            out.append(self.resolve_dotted(cls.mod, d))
        return out

    def mro(self, cls, _depth=0):
        """C3 linearisation; list of Ents (classes, or specials/unknowns as leaves)."""
        if _depth > 40:
            return [cls, unknown("class hierarchy too deep")]
        bases = self.base_ents(cls)
        seqs = []
        for b in bases:
            if b.kind == "class":
                seqs.append(self.mro(b, _depth + 1))
            else:
                seqs.append([b])
        seqs.append(list(bases))
        result = [cls]
        seqs = [list(s) for s in seqs if s]
        while seqs:
            for s in seqs:
                head = s[0]
                if not any(_same(head, x) for t in seqs for x in t[1:]):
                    break
            else:
                # inconsistent: fall back to depth-first order
                for s in seqs:
                    for x in s:
                        if not any(_same(x, r) for r in result):
                            result.append(x)
                return result
            result.append(head)
            seqs = [[x for x in t if not _same(x, head)] for t in seqs]
            seqs = [t for t in seqs if t]
        return result

    def class_kind(self, cls):
        """('plain'|'dataclass'|'enum'|'struct'|'model'|'namedtuple'|'typeddict', options) or Unknown."""
        opts = self._class_decorators(cls)
        if isinstance(opts, Unknown):
            return opts
        for b in self.mro(cls)[1:]:
            if b.kind == "class":
                continue
            s = b.special or ""
            if s in ENUM_BASES:
                return ("enum", None)
            if s in STRUCT_BASES:
                return ("struct", None)
            if s in MODEL_BASES:
                return ("model", None)
            if s in NAMEDTUPLE_BASES:
                return ("namedtuple", None)
            if s in TYPEDDICT_BASES:
                return ("typeddict", None)
        if opts is not None:
            return ("dataclass", opts)
        return ("plain", None)

    def _class_decorators(self, cls):
        """dataclass options dict if the class is made a dataclass, None if plain, Unknown."""
        opts = None
        for d in cls.node.decorator_list:
            call = d if isinstance(d, ast.Call) else None
            expr = d.func if call else d
            name = dotted(expr)
            if name is None:
                return Unknown("decorator %s is an expression" % _unparse(d))
            e = self.resolve_dotted(cls.mod, name)
            s = e.special
            kws = {k.arg: k.value for k in (call.keywords if call else []) if k.arg}
            if s in DATACLASS_MAKERS:
                opts = {"kw_only": _const(kws.get("kw_only")) is True,
                        "init": _const(kws.get("init")) is not False, "maker": s,
                        "forbid": _forbids_extra(call) if call else False}
                continue
            if s in TRANSPARENT_CLASS_DECOS or (s and s.startswith("typing_extensions.dataclass_transform")):
                continue
            if e.kind == "function":
                how = self._decorator_effect(e)
                if how == "identity":
                    continue
                if how and how.startswith("dataclass:"):
                    opts = {"kw_only": _const(kws.get("kw_only")) is True,
                            "init": _const(kws.get("init")) is not False,
                            "maker": how.split(":")[1],
                            "forbid": how.endswith(":forbid") or (call is not None and _forbids_extra(call))}
                    continue
            if e.kind == "class" and call is not None:
                # e.g. @SomeRegistry.register(...) returning the class: unknown
                pass
            return Unknown("class is decorated with %s, whose effect is not known statically" % name)
        return opts

    def _decorator_effect(self, fn):
        """'identity', 'dataclass:<maker>' or None for a library decorator function."""
        node = fn.node
        args = node.args.posonlyargs + node.args.args
        first = args[0].arg if args else None
        body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                d = dotted(sub.func)
                if d:
                    e = self.resolve_dotted(fn.mod, d) if d.split(".")[0] in fn.mod.names else None
                    if e is not None and e.special in DATACLASS_MAKERS:
                        return "dataclass:" + e.special + (":forbid" if _forbids_extra(node) else "")
        if first and body and all(isinstance(s, ast.Return) for s in body) and all(
                isinstance(s.value, ast.Name) and s.value.id == first for s in body):
            return "identity"
        return None

    def class_attr(self, cls, name, via_instance):
        """Attribute ``name`` of class ``cls`` (through its MRO)."""
        mro = self.mro(cls)
        for c in mro:
            if c.kind != "class":
                s = c.special or ""
                if s in TRANSPARENT_BASES:
                    continue
                if s in ENUM_BASES:
                    if name in ENUM_ATTRS or (name.startswith("__") and name.endswith("__")):
                        return Ent("value", qual=name)
                    continue        # members are assignments in the class body
                if c.kind in ("unknown", "missing"):
                    return unknown("%s: a base cannot be resolved (%s)" % (cls.qual, c.reason))
                return unknown("%s.%s may come from base %s" % (cls.qual, name, s or c.qual))
            for st in c.node.body:
                hit = _class_body_binding(st, name)
                if hit is None:
                    continue
                if isinstance(hit, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    e = Ent("function", mod=c.mod, node=hit, qual=c.qual + "." + name, owner=c)
                    kinds = self._func_deco_kinds(e)
                    if "property" in kinds:
                        return Ent("value", mod=c.mod, node=hit, qual=e.qual, owner=c)
                    if "classmethod" in kinds or (via_instance and "staticmethod" not in kinds):
                        e.bound = True
                    return e
                if isinstance(hit, ast.ClassDef):
                    return Ent("class", mod=c.mod, node=hit, qual=c.qual + "." + name)
                if isinstance(hit, (ast.Import, ast.ImportFrom)):
                    return unknown("%s.%s is imported inside the class body" % (c.qual, name))
                return Ent("value", mod=c.mod, node=hit, qual=c.qual + "." + name, owner=c)
        # instance attributes, dataclass/struct fields
        for c in mro:
            if c.kind == "class" and name in self.instance_names(c):
                return Ent("value", qual=cls.qual + "." + name, owner=c)
        for c in mro:
            if c.kind == "class" and any(_class_body_binding(st, n) is not None
                                         for st in c.node.body for n in ("__getattr__", "__getattribute__")):
                return unknown("%s defines __getattr__" % c.qual)
        if name.startswith("__") and name.endswith("__"):
            return Ent("value", qual=name)
        return missing("%s has no attribute %r" % (cls.qual, name))

    def instance_names(self, c):
        names = set()
        for st in c.node.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                names.add(st.target.id)
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                selfname = (st.args.posonlyargs + st.args.args)[:1]
                if not selfname:
                    continue
                sn = selfname[0].arg
                for sub in ast.walk(st):
                    tgt = []
                    if isinstance(sub, (ast.Assign,)):
                        tgt = sub.targets
                    elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
                        tgt = [sub.target]
                    for t in tgt:
                        for x in ([t] if not isinstance(t, (ast.Tuple, ast.List)) else t.elts):
                            if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id == sn:
                                names.add(x.attr)
                    if isinstance(sub, ast.Call) and dotted(sub.func) in ("setattr", "object.__setattr__"):
                        return names | {"*"}
            if isinstance(st, ast.Assign):
                for t in st.targets:
                    if isinstance(t, ast.Name) and t.id == "__slots__":
                        names.update(_literal_strings(st.value) or [])
        return names

    def _func_deco_kinds(self, fn):
        kinds = set()
        for d in fn.node.decorator_list:
            expr = d.func if isinstance(d, ast.Call) else d
            name = dotted(expr) or ""
            last = name.rsplit(".", 1)[-1]
            if name in ("staticmethod", "classmethod", "property"):
                kinds.add(name)
            elif last in ("setter", "getter", "deleter") or name in ("functools.cached_property", "cached_property"):
                kinds.add("property")
            elif last == "overload":
                kinds.add("overload")
            else:
                e = self.resolve_dotted(fn.mod, name) if name else unknown("expression")
                if e.special and (e.special in PRESERVING_FUNC_DECOS):
                    continue
                if e.special in ("functools.cached_property",):
                    kinds.add("property")
                    continue
                if e.kind == "function" and self._preserves(e):
                    continue
                kinds.add("unknown:" + (name or _unparse(d)))
        return kinds

    def _preserves(self, deco):
        if self._decorator_effect(deco) == "identity":
            return True
        for sub in ast.walk(deco.node):
            if isinstance(sub, ast.Call):
                d = dotted(sub.func) or ""
                if d.endswith("wraps") or d.endswith("update_wrapper"):
                    return True
        return False

    # ------------------------------------------------------------------ signatures
    def function_signature(self, fn):
        kinds = self._func_deco_kinds(fn)
        bad = [k for k in kinds if k.startswith("unknown:")]
        if bad:
            return Unknown("%s is decorated with %s, which may change its signature" % (
                fn.qual, bad[0].split(":", 1)[1]))
        a = fn.node.args
        params = []
        pos_defaults = [None] * (len(a.posonlyargs) + len(a.args) - len(a.defaults)) + \
            [_unparse(d) for d in a.defaults]
        for i, arg in enumerate(a.posonlyargs + a.args):
            params.append(Parameter(arg.arg, POSONLY if i < len(a.posonlyargs) else POSKW,
                                    pos_defaults[i], _ann(arg.annotation)))
        if a.vararg:
            params.append(Parameter(a.vararg.arg, VARPOS, None, _ann(a.vararg.annotation)))
        for arg, d in zip(a.kwonlyargs, a.kw_defaults):
            params.append(Parameter(arg.arg, KWONLY, None if d is None else _unparse(d), _ann(arg.annotation)))
        if a.kwarg:
            params.append(Parameter(a.kwarg.arg, VARKW, None, _ann(a.kwarg.annotation)))
        sig = Signature(params, "static", fn.where)
        if "staticmethod" in kinds:
            return sig
        if fn.owner is not None and (fn.bound or "classmethod" in kinds):
            return sig.drop_first()
        return sig

    def signature(self, e):
        """Signature of calling ``e`` (a class: constructing it), or Unknown."""
        if e.kind == "function":
            return self.function_signature(e)
        if e.kind == "class":
            key = (e.mod.name, e.qual, e.node.lineno)
            if key not in self._sig_cache:
                self._sig_cache[key] = Unknown("recursive signature")
                self._sig_cache[key] = self._class_signature(e)
            return self._sig_cache[key]
        if e.kind in ("missing", "unknown"):
            return Unknown(e.reason)
        if e.special:
            return Unknown("%s is outside the analysed sources" % e.special)
        return Unknown("%s is not a function or class" % (e.qual or "value"))

    def _class_signature(self, cls):
        kind = self.class_kind(cls)
        if isinstance(kind, Unknown):
            return kind
        k, opts = kind
        if k == "enum":
            return Unknown("%s is an Enum (called with a value, not constructed)" % cls.qual)
        if k == "typeddict":
            return Unknown("%s is a TypedDict" % cls.qual)
        mro = self.mro(cls)
        # a metaclass (declared here or inherited from any base) may replace construction
        for c in mro:
            if c.kind != "class":
                continue
            for kw in c.node.keywords:
                if kw.arg == "metaclass":
                    why = self._metaclass_effect(c, kw.value)
                    if why is not None:
                        return Unknown("%s%s" % (cls.qual, why if c is cls else
                                                 " inherits from %s, which%s" % (c.qual, why)))
        for i, c in enumerate(mro):
            if c.kind != "class":
                s = c.special or ""
                if s in TRANSPARENT_BASES:
                    continue
                if s in STRUCT_BASES:
                    return self._fields_signature(cls, "struct", opts)
                if s in MODEL_BASES:
                    return self._fields_signature(cls, "model", opts)
                if s in NAMEDTUPLE_BASES:
                    return self._fields_signature(cls, "namedtuple", opts)
                if c.kind in ("unknown", "missing"):
                    return Unknown("%s: a base cannot be resolved (%s)" % (cls.qual, c.reason))
                if s.startswith("builtins."):
                    return Unknown("%s derives from the builtin %s" % (cls.qual, s[9:]))
                return Unknown("%s derives from %s, outside the analysed sources" % (cls.qual, s or c.qual))
            init = _body_def(c.node, "__init__")
            new = _body_def(c.node, "__new__")
            c_opts = opts if c is cls else self._class_decorators(c)
            if isinstance(c_opts, Unknown):
                return Unknown("%s inherits from %s: %s" % (cls.qual, c.qual, c_opts.reason))
            if init is not None:
                # a __new__ further up also receives the arguments: only (*args, **kwargs) is neutral
                if new is None:
                    for later in mro[i + 1:]:
                        if later.kind == "class":
                            lnew = _body_def(later.node, "__new__")
                            if lnew is not None and not (lnew.args.vararg and lnew.args.kwarg):
                                return Unknown("%s: %s defines __new__, which also receives the arguments"
                                               % (cls.qual, later.qual))
                e = Ent("function", mod=c.mod, node=init, qual=c.qual + ".__init__", owner=c, bound=True)
                sig = self.function_signature(e)
                if isinstance(sig, Signature):
                    sig.origin = e.where
                return sig
            if c_opts is not None and c_opts.get("init", True):
                return self._fields_signature(c, "dataclass", c_opts)
            if new is not None:
                return Unknown("%s defines __new__" % c.qual)
        return Signature([], "static", cls.where, note="object() takes no arguments")

    def _metaclass_effect(self, c, expr):
        """None when metaclass ``expr`` (written in class ``c``) constructs instances the normal
        way (type / ABCMeta, or a class of the sources deriving from them without __call__);
        else the reason it is not known."""
        d = dotted(expr)
        if d is None:
            return " has metaclass %s (an expression)" % _unparse(expr)
        e = self.resolve_dotted(c.mod, d)
        if e.special in ("builtins.type", "abc.ABCMeta") or (e.kind != "class" and d.rsplit(".", 1)[-1]
                                                             in ("ABCMeta", "type") and not e.special):
            return None
        if e.kind != "class":
            return " has metaclass %s, outside the analysed sources" % d
        for m in self.mro(e):
            if m.kind != "class":
                if m.special in ("builtins.type", "abc.ABCMeta", "builtins.object", "object"):
                    continue
                return " has metaclass %s, which derives from %s" % (d, m.special or m.reason or m.qual)
            for hook in ("__call__", "__new__", "__init__", "__prepare__"):
                if any(_class_body_binding(st, hook) is not None for st in m.node.body):
                    return " has metaclass %s, which defines %s" % (d, hook)
        return None

    def fields(self, cls, how):
        """Ordered init fields: list of (Parameter, kw_only) walking dataclass-like bases."""
        out = {}
        for c in reversed(self.mro(cls)):
            if c.kind != "class":
                continue
            if c is not cls:
                ck = self.class_kind(c)
                if isinstance(ck, Unknown) or ck[0] not in ("dataclass", "struct", "model", "namedtuple"):
                    continue
                copts = ck[1] or {}
            else:
                copts = None
            kw_default = False
            if how == "dataclass":
                dec = copts if c is not cls else self._class_decorators(c)
                kw_default = bool(dec and dec.get("kw_only"))
            elif how == "struct":
                for kw in c.node.keywords:
                    if kw.arg == "kw_only":
                        kw_default = _const(kw.value) is True
            kw_mode = kw_default
            for st in c.node.body:
                if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                    if isinstance(st, ast.Assign) and how in ("model",):
                        continue
                    continue
                name = st.target.id
                ann = st.annotation
                ann_e = self._ann_kind(c.mod, ann)
                if ann_e == "classvar":
                    continue
                if ann_e == "kw_only":
                    kw_mode = True
                    continue
                if how == "model" and (name.startswith("_") or name == "model_config"):
                    continue
                default, init, kwo = self._field_default(c.mod, st.value)
                if kwo is None:
                    kwo = kw_mode
                if not init:
                    out.pop(name, None)
                    continue
                p = Parameter(name, POSKW, default, _ann(ann))
                if name in out:
                    out[name] = (p, kwo)     # keeps the base's position, as dataclasses do
                else:
                    out[name] = (p, kwo)
        return list(out.values())

    def _ann_kind(self, mod, ann):
        base = ann.value if isinstance(ann, ast.Subscript) else ann
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            text = ann.value.split("[", 1)[0].strip()
        else:
            text = dotted(base)
        if not text:
            return None
        last = text.rsplit(".", 1)[-1]
        if last in ("ClassVar", "KW_ONLY", "InitVar"):
            e = self.resolve_dotted(mod, text)
            s = e.special or ""
            if s in CLASSVAR or (e.kind != "class" and last == "ClassVar"):
                return "classvar"
            if s in KW_ONLY or (last == "KW_ONLY" and e.kind != "class"):
                return "kw_only"
        return None

    def _field_default(self, mod, value):
        """(default text or None, init?, kw_only or None)"""
        if value is None:
            return None, True, None
        if isinstance(value, ast.Call):
            d = dotted(value.func)
            e = self.resolve_dotted(mod, d) if d else None
            if e is not None and (e.special in FIELD_MAKERS or (d or "").rsplit(".", 1)[-1] in ("field", "Field")
                                  and e.kind != "class" and e.kind != "function"):
                kws = {k.arg: k.value for k in value.keywords if k.arg}
                init = _const(kws.get("init")) is not False
                kwo = _const(kws.get("kw_only")) if "kw_only" in kws else None
                default = None
                if "default" in kws:
                    default = _unparse(kws["default"])
                elif "default_factory" in kws:
                    default = "<factory %s>" % _unparse(kws["default_factory"])
                elif value.args and (e.special or "").startswith(("pydantic", "msgspec")):
                    a0 = value.args[0]
                    if not (isinstance(a0, ast.Constant) and a0.value is Ellipsis):
                        default = _unparse(a0)
                if "factory" in kws:
                    default = "<factory %s>" % _unparse(kws["factory"])
                return default, init, kwo if isinstance(kwo, bool) else None
        return _unparse(value), True, None

    def _fields_signature(self, cls, how, opts):
        fields = self.fields(cls, how)
        if how == "model":
            params = [Parameter(p.name, KWONLY, p.default, p.annotation) for p, _ in fields]
            # model_config extra=allow accepts anything
            for c in self.mro(cls):
                if c.kind == "class":
                    for st in c.node.body:
                        if isinstance(st, ast.Assign) and any(
                                isinstance(t, ast.Name) and t.id == "model_config" for t in st.targets):
                            pass
            if not any(_body_forbids(c) for c in self.mro(cls) if c.kind == "class"):
                params.append(Parameter("data", VARKW))
            return Signature(params, "static", cls.where, note="pydantic model fields")
        pos = [Parameter(p.name, POSKW, p.default, p.annotation) for p, kwo in fields if not kwo]
        kwo = [Parameter(p.name, KWONLY, p.default, p.annotation) for p, k in fields if k]
        note = {"dataclass": "dataclass fields", "struct": "msgspec.Struct fields",
                "namedtuple": "NamedTuple fields"}[how]
        if how == "dataclass" and opts and opts.get("maker", "").startswith("pydantic"):
            note = "pydantic dataclass fields"
            if not opts.get("forbid") and not _body_forbids(cls):
                kwo.append(Parameter("extra", VARKW))
                note += " (extra keywords are ignored)"
        return Signature(pos + kwo, "static", cls.where, note=note)

    # ------------------------------------------------------------------ suggestions
    def find_definitions(self, package, name, limit=400):
        """Modules of ``package`` (files on the search path) that define top-level ``name``.

        The package's files are read once per resolver (every missing name of a check searches
        the same bytes); only files holding ``def name``/``class name``/``name =``/``name:`` are
        parsed, to confirm a top-level binding.
        """
        hits, count = [], 0
        needle = name.encode()
        pats = (b"def " + needle, b"class " + needle, needle + b" =", needle + b":")
        blob, starts, names = self._package_files(package)
        candidates, pos = [], blob.find(needle)
        while pos >= 0:
            i = bisect.bisect_right(starts, pos) - 1
            candidates.append(i)
            pos = blob.find(needle, starts[i + 1] if i + 1 < len(starts) else len(blob))
        for i in candidates:
            data = blob[starts[i]:starts[i + 1] if i + 1 < len(starts) else len(blob)]
            modname = names[i]
            if not any(p in data for p in pats):
                continue
            m = self.load(modname)
            if isinstance(m, ModInfo):
                b = m.names.get(name)
                if b is not None and b[0] in ("def", "value"):
                    hits.append(modname)
            count += 1
            if count > limit:
                break
        return hits

    def _package_files(self, package):
        cache = self.__dict__.setdefault("_pkg_files", {})
        if package in cache:
            return cache[package]
        out = []
        spec = self.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            for root_dir in spec.submodule_search_locations:
                for dirpath, dirnames, filenames in os.walk(root_dir):
                    dirnames[:] = sorted(d for d in dirnames if d.isidentifier())
                    for fn in sorted(filenames):
                        if not fn.endswith(".py"):
                            continue
                        path = os.path.join(dirpath, fn)
                        try:
                            with open(path, "rb") as fh:
                                data = fh.read()
                        except OSError:
                            continue
                        rel = os.path.relpath(path, root_dir)[:-3].split(os.sep)
                        if rel[-1] == "__init__":
                            rel = rel[:-1]
                        out.append((".".join([package] + rel), data))
        # one blob (files separated by a NUL byte) so a name is searched for once, not per file
        starts, pos = [], 0
        for _, data in out:
            starts.append(pos)
            pos += len(data) + 1
        cache[package] = (b"\0".join(d for _, d in out), starts, [n for n, _ in out])
        return cache[package]


class _Opaque(Exception):
    """Raised inside the module-__getattr__ reader when the code does something it does not follow."""


def env_name(env):
    for v in env.values():
        if v and v[0] == "str":
            return v[1]
    return "?"


def _forbids_extra(node):
    """Whether an expression/function sets pydantic's extra="forbid" somewhere inside."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.keyword) and sub.arg == "extra" and _const(sub.value) == "forbid":
            return True
        if isinstance(sub, ast.Dict):
            for k, v in zip(sub.keys, sub.values):
                if _const(k) == "extra" and _const(v) == "forbid":
                    return True
    return False


def _body_forbids(cls):
    for st in cls.node.body:
        if isinstance(st, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in ("model_config", "__pydantic_config__")
                for t in st.targets):
            return _forbids_extra(st.value)
    return False


def _class_body_binding(st, name):
    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and st.name == name:
        return st
    if isinstance(st, ast.Assign):
        for t in st.targets:
            if name in _target_names(t):
                return st
    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id == name \
            and st.value is not None:
        return st
    if isinstance(st, (ast.Import, ast.ImportFrom)):
        for a in st.names:
            if (a.asname or a.name.split(".")[0]) == name:
                return st
    if isinstance(st, ast.If):
        for sub in st.body + st.orelse:
            hit = _class_body_binding(sub, name)
            if hit is not None:
                return hit
    return None


def _body_def(node, name):
    found = None
    for st in node.body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) and st.name == name:
            if any((dotted(d) or "").endswith("overload") for d in st.decorator_list):
                continue
            found = st
        elif isinstance(st, ast.Assign) and any(name in _target_names(t) for t in st.targets):
            found = None
    return found


def _same(a, b):
    if a is b:
        return True
    if a.kind == "class" and b.kind == "class":
        return a.node is b.node
    if a.special and b.special:
        return a.special == b.special
    return False


def _const(node):
    if isinstance(node, ast.Constant):
        return node.value
    return None


def _ann(node):
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return _unparse(node)


def _special(full):
    """Canonical name for a few well-known objects (so stdlib/typing need not be parsed)."""
    aliases = {"typing_extensions.KW_ONLY": "dataclasses.KW_ONLY",
               "pydantic.dataclasses.Field": "pydantic.Field"}
    full = aliases.get(full, full)
    if full in (TRANSPARENT_BASES | ENUM_BASES | STRUCT_BASES | MODEL_BASES | NAMEDTUPLE_BASES
                | TYPEDDICT_BASES | DATACLASS_MAKERS | FIELD_MAKERS | CLASSVAR | INITVAR | KW_ONLY
                | TRANSPARENT_CLASS_DECOS | PRESERVING_FUNC_DECOS | {"functools.cached_property"}):
        return full
    if full.startswith("typing_extensions.dataclass_transform") or full == "typing.dataclass_transform":
        return "typing_extensions.dataclass_transform"
    return None


def _outside_special(modname):
    """Modules we recognise by name even when they are not on the search path."""
    top = modname.split(".")[0]
    return top in ("typing", "typing_extensions", "dataclasses", "enum", "abc", "functools",
                   "msgspec", "pydantic", "contextlib", "warnings", "builtins", "collections")
