"""Name resolution of the static resolver: what ``module.name`` and a dotted expression written
inside a module are (stdlib only).

Follows imports, ``from x import *`` (limited by a literal ``__all__``), aliases (``A = B``),
submodules, and module ``__getattr__`` (``getattrs``). Mixed into ``StaticResolver``:
uses ``load``/``module``/``find_spec``/``overrides`` (``ModuleIndex``) and ``class_attr``
(``ClassModel``).
"""

import ast

from ..resolve.base import BUILTIN_NAMES, Ent, _outside_special, _special, dotted, missing, unknown
from ..resolve.getattrs import GetattrReader
from ..resolve.modules import ModInfo


class NameResolution:
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
                e = GetattrReader(self).read(m, b[1], name, seen)
                if e is not None:
                    return e
            return unknown("%s defines a module __getattr__ whose result for %r is not known statically"
                           % (m.name, name))
        if name.startswith("__") and name.endswith("__"):
            return Ent("value", mod=m, qual=name)
        return missing("%s has no attribute %r" % (m.name, name))

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
            if src == m.name and attr == name and self.find_spec(src + "." + attr) is not None:
                return self.module(src + "." + attr)    # `from . import sub` in a package's __init__
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
