"""A small evaluator for module-level ``__getattr__`` (PEP 562), the static resolver's lazy
re-export reader (stdlib only).

It follows only the idioms libraries use to re-export names lazily and gives up (None: the name
stays unknown) on anything else; it never runs the code.
"""

import ast

from ..resolve.base import _literal_strings, dotted, missing


class _Opaque(Exception):
    """Raised inside the module-__getattr__ reader when the code does something it does not follow."""


def env_name(env):
    for v in env.values():
        if v and v[0] == "str":
            return v[1]
    return "?"


class GetattrReader:
    """Reads one module ``__getattr__`` for one name; ``res`` resolves what it returns
    (``res.lookup(module, name, seen)``, ``res.module(name)``)."""

    def __init__(self, res):
        self.res = res

    def read(self, m, fn, name, seen):
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
                    return self.res.lookup(v[1], v[2], seen)
                if v[0] == "module":
                    return self.res.module(v[1])
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
                e = self.res.lookup(base[1], base[2])
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
                    e = self.res.lookup(obj[1], obj[2])
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
