"""The class model of the static resolver: bases, C3 MRO, what kind of class it is (plain,
dataclass, enum, msgspec struct, pydantic model, NamedTuple, TypedDict), class and function
decorators, metaclasses, and attribute lookup through the MRO (stdlib only).

Mixed into ``StaticResolver``: uses ``resolve_dotted`` (``NameResolution``).
"""

import ast

from ..resolve.base import (DATACLASS_MAKERS, ENUM_ATTRS, ENUM_BASES, MODEL_BASES, NAMEDTUPLE_BASES,
                           PRESERVING_FUNC_DECOS, STRUCT_BASES, TRANSPARENT_BASES, TRANSPARENT_CLASS_DECOS,
                           TYPEDDICT_BASES, Ent, _const, _literal_strings, _same, _target_names, _unparse,
                           dotted, missing, unknown)
from ..resolve.fields import _forbids_extra
from ..resolve.sigmodel import Unknown


class ClassModel:
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
