"""Call-site analysis of caller modules against a library (runs on the host, stdlib only).

For every import of the library and every call whose callee resolves to it (imported names,
attribute chains through imported modules, nested calls, and methods called on attributes
assigned from library constructors: ``self.s = Scheduler(...)`` then ``self.s.add(x)``), the
argument list is bound against the remote signature. Only certain problems become findings;
what cannot be decided goes to ``unknown`` with the reason.
"""

import ast
import difflib

from ..check.records import Findings
from ..resolve.base import own_nodes as _walk_own, self_assignments
from ..resolve.sigmodel import Signature, Unknown, bind
from ..resolve.base import dotted
from ..check.symbols import canonical


class Val:
    """What an expression in the caller evaluates to, as far as we follow it."""

    __slots__ = ("ent", "symbol", "instance", "path")

    def __init__(self, ent, symbol, instance=False, path=()):
        self.ent = ent
        self.symbol = symbol
        self.instance = instance   # an instance of class ``ent``
        # how the caller reached it, replayable in another version of the library (drift):
        # ("mod", name) | ("from", module, name), then ("attr", name) / ("new",) steps
        self.path = path


class Analysis(Findings):
    def __init__(self, resolver, modname, path, text, libs, suggester=None):
        self.only = None        # a symbols.SymbolMatcher of the callees to check; None: every call
        self.r = resolver
        self.modname = modname
        self.path = path
        self.text = text
        self.libs = set(libs)
        self.suggester = suggester or resolver
        self.findings = []
        self.unknown = []
        self.env = {}
        self.constants = {}
        self.class_attrs = {}
        self.seen = set()
        self.calls_checked = 0
        self.checked = []
        self.touches = None     # a list when drift is wanted: what the caller uses (agent/drift/)
        self.parents = {}

    # ------------------------------------------------------------------ driver
    def run(self):
        try:
            tree = ast.parse(self.text, filename=self.path)
        except (SyntaxError, ValueError) as exc:
            self.unknown.append({"path": self.path, "line": getattr(exc, "lineno", 0) or 0,
                                 "module": self.modname, "symbol": None,
                                 "reason": "cannot parse: %s" % (getattr(exc, "msg", None) or exc)})
            return self
        self.tree = tree
        if self.touches is not None:
            for parent in ast.walk(tree):
                for child in ast.iter_child_nodes(parent):
                    self.parents[child] = parent
        for st in tree.body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                n = st.targets[0].id
                if n.isupper() or (n.upper() == n and "_" in n):
                    self.constants[n] = st.lineno
        self._imports(tree)
        if not any(isinstance(v, Val) for v in self.env.values()):
            return self
        self._collect_class_attrs(tree)
        self._walk_scope(tree.body, {}, None)
        if self.touches is not None:
            from ..drift.record import collect_bound
            collect_bound(self, tree)
        return self

    def _is_lib(self, modname):
        return bool(modname) and modname.split(".")[0] in self.libs

    def _imports(self, tree):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if not self._is_lib(a.name):
                        continue
                    e = self.r.module(a.name)
                    if e.kind == "missing":
                        self._missing_module(node, a.name)
                        continue
                    if e.kind == "unknown":
                        self.add_unknown(node, a.name, e.reason)
                    if a.asname:
                        self.env[a.asname] = Val(e, a.name, path=(("mod", a.name),))
                    else:
                        top = a.name.split(".")[0]
                        self.env[top] = Val(self.r.module(top), top, path=(("mod", top),))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and self._is_lib(node.module):
                m = self.r.module(node.module)
                if m.kind == "missing":
                    self._missing_module(node, node.module)
                    continue
                for a in node.names:
                    if a.name == "*":
                        self.add_unknown(node, node.module, "star import from the library is not followed")
                        continue
                    sym = node.module + "." + a.name
                    e = self.r.lookup(node.module, a.name)
                    if e.kind == "missing":
                        self._missing_symbol(node, node.module, a.name)
                        continue
                    if e.kind == "unknown":
                        self.add_unknown(node, sym, e.reason)
                    self.env[a.asname or a.name] = Val(e, sym, path=(("from", node.module, a.name),))

    def _missing_module(self, node, modname):
        parent, _, last = modname.rpartition(".")
        where = self.suggester.find_definitions(modname.split(".")[0], last) if parent else []
        sugg = "the module is gone in the installed version"
        if where:
            sugg = "its contents may have moved to %s" % ", ".join(where[:3])
        self.add(node, modname, "missing-module", modname,
                 "cannot import module %s: it does not exist in the installed %s" % (
                     modname, modname.split(".")[0]), sugg,
                 fix={"action": "replace-module", "module": modname, "candidates": where[:3]})

    def _missing_symbol(self, node, modname, name):
        where = [w for w in self.suggester.find_definitions(modname.split(".")[0], name) if w != modname]
        if where:
            sugg = "import %s from %s instead" % (name, where[0])
            if len(where) > 1:
                sugg += " (also defined in %s)" % ", ".join(where[1:3])
        else:
            sugg = "nothing in the installed %s defines %s (removed, or not there yet)" % (
                modname.split(".")[0], name)
        self.add(node, modname + "." + name, "missing-symbol", name,
                 "cannot import name %r from %s" % (name, modname), sugg,
                 fix={"action": "move-import", "name": name, "from": modname,
                      "to": where[0] if where else None, "candidates": where[:3]})

    # ------------------------------------------------------------------ instances
    def _collect_class_attrs(self, tree):
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef):
                continue
            for fn in cls.body:
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if not (fn.args.posonlyargs + fn.args.args):
                    continue
                local = self._locals(fn, {})
                for attr, value in self_assignments(fn):
                    key = (cls.name, attr)
                    if isinstance(value, ast.Constant) and value.value is None:
                        continue
                    v = self._eval(value, local, None)
                    v = v if (v is not None and v.instance) else None
                    if key in self.class_attrs and not _same_val(self.class_attrs[key], v):
                        v = None
                    self.class_attrs[key] = v

    def _locals(self, fn, outer):
        """Names local to ``fn``: an instance Val where assigned from a library constructor,
        else None (shadows the module's name)."""
        local = dict(outer)
        a = fn.args
        for arg in a.posonlyargs + a.args + a.kwonlyargs + ([a.vararg] if a.vararg else []) + \
                ([a.kwarg] if a.kwarg else []):
            local[arg.arg] = None
        assigned = {}
        for sub in _walk_own(fn):
            if isinstance(sub, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                value = getattr(sub, "value", None)
                for t in targets:
                    if isinstance(t, ast.Name):
                        assigned.setdefault(t.id, []).append(
                            value if not isinstance(sub, ast.AugAssign) else None)
                    else:
                        for n in _names_in_target(t):
                            assigned.setdefault(n, []).append(None)
            elif isinstance(sub, (ast.For, ast.AsyncFor, ast.comprehension)):
                for n in _names_in_target(sub.target):
                    assigned.setdefault(n, []).append(None)
            elif isinstance(sub, (ast.With, ast.AsyncWith)):
                for item in sub.items:
                    if item.optional_vars is not None:
                        for n in _names_in_target(item.optional_vars):
                            assigned.setdefault(n, []).append(None)
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and sub is not fn:
                assigned.setdefault(sub.name, []).append(None)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                for al in sub.names:
                    n = al.asname or al.name.split(".")[0]
                    if n in self.env and isinstance(sub, ast.ImportFrom) and self._is_lib(sub.module):
                        continue
                    if n in self.env and isinstance(sub, ast.Import) and self._is_lib(al.name):
                        continue
                    assigned.setdefault(n, []).append(None)
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                assigned.setdefault(sub.name, []).append(None)
        for n, values in assigned.items():
            vals = [self._eval(v, local, None) if v is not None else None for v in values]
            vals = [v if (v is not None and v.instance) else None for v in vals]
            first = vals[0]
            local[n] = first if all(_same_val(first, v) for v in vals) else None
        return local

    # ------------------------------------------------------------------ evaluation
    def _eval(self, expr, local, cls_ctx):
        """Val for an expression, or None when it is not (provably) the library's."""
        if isinstance(expr, ast.Name):
            if expr.id in local:
                return local[expr.id]
            return self.env.get(expr.id)
        if isinstance(expr, ast.Attribute):
            if cls_ctx is not None and isinstance(expr.value, ast.Name) and expr.value.id == cls_ctx[1]:
                return self.class_attrs.get((cls_ctx[0], expr.attr))
            base = self._eval(expr.value, local, cls_ctx)
            if base is None or base.ent.kind in ("missing", "unknown") or \
                    (base.ent.kind == "value" and not base.instance):
                return None
            return Val(self._member(base, expr.attr), base.symbol + "." + expr.attr,
                       path=base.path + (("attr", expr.attr),))
        if isinstance(expr, ast.Call):
            callee = self._eval(expr.func, local, cls_ctx)
            if callee is not None and not callee.instance and callee.ent.kind == "class":
                return Val(callee.ent, callee.symbol, instance=True, path=callee.path + (("new",),))
            return None
        return None

    def _member(self, base, attr):
        if base.instance:
            return self.r.class_attr(base.ent, attr, via_instance=True)
        return self.r.member(base.ent, attr)

    # ------------------------------------------------------------------ walking
    def _walk_scope(self, body, local, cls_ctx):
        for st in body:
            self._visit(st, local, cls_ctx)

    def _visit(self, node, local, cls_ctx):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for d in getattr(node, "decorator_list", []):
                self._visit(d, local, cls_ctx)
            for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                self._visit(d, local, cls_ctx)
            if isinstance(node, ast.Lambda):
                inner = dict(local)
                for arg in node.args.args:
                    inner[arg.arg] = None
                self._visit(node.body, inner, cls_ctx)
                return
            inner = self._locals(node, local)
            ctx = cls_ctx
            if cls_ctx is not None and cls_ctx[2] is node:
                args = node.args.posonlyargs + node.args.args
                ctx = (cls_ctx[0], args[0].arg, None) if args else None
            elif cls_ctx is not None and cls_ctx[2] == "class-body":
                args = node.args.posonlyargs + node.args.args
                ctx = (cls_ctx[0], args[0].arg, None) if args else None
            self._walk_scope(node.body, inner, ctx)
            return
        if isinstance(node, ast.ClassDef):
            for d in node.decorator_list + node.bases + [k.value for k in node.keywords]:
                self._visit(d, local, cls_ctx)
            self._walk_scope(node.body, local, (node.name, None, "class-body"))
            return
        if isinstance(node, ast.Call):
            self._check_call(node, local, cls_ctx)
            self._visit_expr_children(node.func, local, cls_ctx, is_callee=True)
            for a in node.args:
                self._visit(a, local, cls_ctx)
            for k in node.keywords:
                self._visit(k.value, local, cls_ctx)
            return
        if isinstance(node, ast.Attribute):
            if isinstance(node.ctx, ast.Load):
                self._check_attribute(node, local, cls_ctx)
            self._visit_expr_children(node.value, local, cls_ctx, is_callee=False)
            return
        for child in ast.iter_child_nodes(node):
            self._visit(child, local, cls_ctx)

    def _visit_expr_children(self, expr, local, cls_ctx, is_callee):
        # the callee's own attribute chain is checked by _check_call; look inside it only
        if isinstance(expr, ast.Attribute):
            self._visit_expr_children(expr.value, local, cls_ctx, is_callee)
        else:
            self._visit(expr, local, cls_ctx)

    def _check_attribute(self, node, local, cls_ctx):
        try:
            self._check_attribute_inner(node, local, cls_ctx)
        except RecursionError:
            self.add_unknown(node, dotted(node) or _safe_unparse(node),
                             "analysis gave up: the library's code nests too deeply")
        except Exception as exc:  # one odd attribute must not fail the op
            self.add_unknown(node, dotted(node) or _safe_unparse(node), "analysis error (%s: %s)" % (
                type(exc).__name__, str(exc)[:120]))

    def _check_attribute_inner(self, node, local, cls_ctx):
        base = self._eval(node.value, local, cls_ctx)
        if base is None or base.ent.kind in ("missing", "unknown", "value", "function"):
            return
        e = self._member(base, node.attr)
        if e.kind == "missing":
            self._missing_attr(node, base, node.attr, e)
        else:
            # a deeper chain a.b.c: report the first missing link only
            pass

    def _missing_attr(self, node, base, attr, e):
        symbol = base.symbol + "." + attr
        names = self._attr_names(base)
        close = difflib.get_close_matches(attr, names, n=1, cutoff=0.75) if names else []
        sugg = ("use %r instead?" % close[0]) if close else \
            "%s no longer has %r; check the library's changelog for its replacement" % (base.symbol, attr)
        self.add(node, symbol, "missing-attribute", attr, e.reason or ("%s has no attribute %r" % (base.symbol, attr)),
                 sugg, fix={"action": "replace-attribute", "attribute": attr,
                            "candidates": close})

    def _attr_names(self, base):
        ent = base.ent
        node = getattr(ent, "node", None)
        if ent.kind == "class" and isinstance(node, ast.ClassDef):
            out = []
            for st in node.body:
                if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    out.append(st.name)
                elif isinstance(st, ast.Assign):
                    out += [t.id for t in st.targets if isinstance(t, ast.Name)]
                elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    out.append(st.target.id)
            return out
        mod = getattr(ent, "mod", None)
        if ent.kind == "module" and mod is not None and hasattr(mod, "names"):
            return list(mod.names)
        return []

    def _check_call(self, node, local, cls_ctx):
        try:
            self._check_call_inner(node, local, cls_ctx)
        except RecursionError:
            self.add_unknown(node, self._callee_text(node), "analysis gave up: the library's code nests too deeply")
        except Exception as exc:  # one odd call must not fail the op: say which and why
            self.add_unknown(node, self._callee_text(node), "analysis error (%s: %s)" % (
                type(exc).__name__, str(exc)[:120]))

    def _callee_text(self, node):
        return dotted(node.func) or _safe_unparse(node.func)

    def _check_call_inner(self, node, local, cls_ctx):
        callee = self._eval(node.func, local, cls_ctx)
        if callee is None:
            if self.only is None:
                self._skipped_shape(node, local, cls_ctx)
            return
        if self.only is not None and self.only.first(callee.symbol, canonical(callee.ent)) is None:
            return          # a narrowed re-check (patch verification): other callees are not asked for
        if callee.instance:
            self.add_unknown(node, callee.symbol, "calls an instance of %s: its __call__ is not followed"
                             % callee.symbol)
            return
        e = callee.ent
        symbol = callee.symbol
        if e.kind == "missing":
            if isinstance(node.func, ast.Attribute):
                base = self._eval(node.func.value, local, cls_ctx)
                if base is not None:
                    self._missing_attr(node, base, node.func.attr, e)
            return
        if e.kind == "unknown":
            self.add_unknown(node, symbol, e.reason)
            return
        if e.kind == "module":
            return
        if e.kind == "value" and getattr(e, "special", None):
            return          # outside the library (e.g. re-exported typing helpers)
        sig = self.r.signature(e)
        self.calls_checked += 1
        self.checked.append({"line": node.lineno, "symbol": symbol,
                             "signature": sig.render() if isinstance(sig, Signature) else None,
                             "mode": sig.mode if isinstance(sig, Signature) else None})
        if self.touches is not None:
            from ..drift.record import record_call
            record_call(self, node, callee, e, sig)
        if isinstance(sig, Unknown):
            self.add_unknown(node, symbol, sig.reason)
            return
        npos = sum(1 for a in node.args if not isinstance(a, ast.Starred))
        star = any(isinstance(a, ast.Starred) for a in node.args)
        keywords = [k.arg for k in node.keywords if k.arg]
        dstar = any(k.arg is None for k in node.keywords)
        for kind, name, message in bind(sig, npos, star, keywords, dstar):
            sugg, fix = self._suggest(kind, name, sig, node, npos)
            self.add(node, symbol, kind, name, "%s() %s" % (symbol.rsplit(".", 1)[-1], message),
                     sugg, sig=sig, fix=fix, ent=e)

    def _skipped_shape(self, node, local, cls_ctx):
        """A method call on something of the library that the analysis does not follow: an
        unknown with the reason (never silence)."""
        f = node.func
        if not isinstance(f, ast.Attribute):
            return
        if isinstance(f.value, ast.Call):
            inner = self._eval(f.value.func, local, cls_ctx)
            if inner is not None and not inner.instance and inner.ent.kind == "function":
                self.add_unknown(node, inner.symbol + "()." + f.attr,
                                 "method %r called on the result of %s(): what it returns is not followed"
                                 % (f.attr, inner.symbol))
            return
        base = self._eval(f.value, local, cls_ctx)
        if base is not None and base.ent.kind == "value" and not base.instance and \
                not getattr(base.ent, "special", None):
            self.add_unknown(node, base.symbol + "." + f.attr,
                             "method %r of the library's module-level object %s: its class is not followed"
                             % (f.attr, base.symbol))


def _safe_unparse(node):
    try:
        return ast.unparse(node)[:80]
    except Exception:  # unprintable node: still name something
        return type(node).__name__


def _same_val(a, b):
    if a is None or b is None:
        return a is b
    return a.symbol == b.symbol and a.instance == b.instance


def _names_in_target(t):
    out = []
    for sub in ast.walk(t):
        if isinstance(sub, ast.Name):
            out.append(sub.id)
    return out


def imports_library(text, libs):
    """Whether the source imports any of ``libs`` (anywhere in the module)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        # unparsable: a target if it names the library (the analysis then reports why it stopped)
        return any(("import " + lib) in text or ("from " + lib) in text for lib in libs)
    libs = set(libs)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in libs for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] in libs:
            return True
    return False


def analyse(resolver, modname, path, text, libs, suggester=None):
    return Analysis(resolver, modname, path, text, libs, suggester).run()


__all__ = ["Analysis", "analyse", "imports_library", "dotted"]
