"""Drift, recording: what the call-site analysis (``callsites.Analysis`` with touches on) records of
the library the caller uses: calls (access path, bound parameters, how the result is used) and
functions bound onto library objects. Stdlib only.

Touches (JSON-able dicts, each with path/line/module):

- ``call``: a call whose callee resolves to the library: the access path (replayable in another
  version), which parameters the call binds, and how its result is used (indexed, iterated,
  tested for truth). A string literal bound to a parameter named ``method`` (dispatchers such as
  ``collective_rpc("name")``) is kept as ``dispatch``.
- ``bound``: a function of the caller bound onto a library object (``types.MethodType(f, obj)``,
  ``obj.attr = f``), with the attributes it uses on its first parameter. When the object is a
  library class, or an instance a library constructor made (``m = lib.Model()``, ``self.m =
  lib.Model()``), those attributes are looked up on that class through its MRO (bases in other
  modules too) and the class's record (``classes``) goes with them; when it is not known
  (speculators' ``model.model``), the classes that have every one of those attributes through
  their MRO stand for it (duck typing over the library's classes, their bases included).
"""

import ast

from ..drift.classes import class_record, hierarchy_table
from ..drift.facts import _attr_fact, call_facts, replay
from ..drift.scan import dispatch_facts
from ..resolve.base import own_nodes
from ..resolve.sigmodel import Signature
from ..resolve.base import dotted


# ----------------------------------------------------------------------------- recording
def _scope_of(parents, node):
    """The function (or module) whose body holds ``node``."""
    scope = parents.get(node)
    while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        scope = parents.get(scope)
    return scope


def result_use(analysis, node):
    """How the value of call ``node`` is used: 'indexed', 'iterated', 'tested' (with the line),
    following one assignment to a local name; None when it is not used that way."""
    parents = analysis.parents
    p = parents.get(node)
    direct = _use_of(node, p)
    if direct:
        return [direct, node.lineno] + _index_text(analysis, node, p, direct)
    name = None
    if isinstance(p, ast.Assign) and len(p.targets) == 1 and isinstance(p.targets[0], ast.Name):
        name = p.targets[0].id
    elif isinstance(p, ast.NamedExpr):
        name = p.target.id
    if name is None:
        return None
    scope = _scope_of(parents, node)
    if scope is None:
        return None
    for sub in ast.walk(scope):
        if isinstance(sub, ast.Name) and sub.id == name and isinstance(sub.ctx, ast.Load) \
                and sub.lineno >= node.lineno:
            u = _use_of(sub, parents.get(sub))
            if u:
                return [u, sub.lineno] + _index_text(analysis, sub, parents.get(sub), u)
    return None


def _index_text(analysis, node, p, use):
    """[exact source of ``x[i]``, exact source of ``x``] for a constant index, else []."""
    if use != "indexed" or not isinstance(p.slice, ast.Constant):
        return []
    try:
        return [analysis._source_segment(p), analysis._source_segment(node)]
    except Exception:  # odd positions: no mechanical fix, the finding stays
        return []


def _use_of(node, p):
    if isinstance(p, ast.Subscript) and p.value is node:
        return "indexed"
    if isinstance(p, (ast.For, ast.AsyncFor, ast.comprehension)) and p.iter is node:
        return "iterated"
    if isinstance(p, (ast.If, ast.While, ast.IfExp, ast.Assert)) and p.test is node:
        return "tested"
    if isinstance(p, ast.UnaryOp) and isinstance(p.op, ast.Not):
        return "tested"
    if isinstance(p, ast.BoolOp):
        return "tested"
    return None


def record_call(analysis, node, callee, e, sig):
    """Called by the call-site analysis for every library call it binds (touches switched on)."""
    npos = sum(1 for a in node.args if not isinstance(a, ast.Starred))
    t = {"kind": "call", "path": analysis.path, "module": analysis.modname, "line": node.lineno,
         "end_line": getattr(node, "end_lineno", node.lineno), "symbol": callee.symbol,
         "access": [list(s) for s in callee.path], "npos": npos,
         "star": any(isinstance(a, ast.Starred) for a in node.args),
         "keywords": [k.arg for k in node.keywords if k.arg],
         "dstar": any(k.arg is None for k in node.keywords),
         "use": result_use(analysis, node), "call": analysis._segment(node), "source": analysis._exact(node)}
    static = analysis.suggester
    if getattr(analysis.r, "mode", "static") != "static":
        se, _ = replay(static, callee.path)
        t["facts"] = call_facts(static, se, sig)
        if se is not None and se.kind in ("class", "function") and t["facts"].get("status") == "ok":
            # defaults as the runtime resolver saw them; locations from the sources
            t["facts"]["mode"] = sig.mode
    else:
        t["facts"] = call_facts(static, e, sig)
    if isinstance(sig, Signature) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        first = next((p for p in sig.params if p.kind in ("positional-only", "positional-or-keyword")), None)
        if first is not None and first.name in ("method", "method_name"):
            name = node.args[0].value
            t["dispatch"] = name
            t["dispatch_facts"] = dispatch_facts(static, callee.symbol.split(".")[0], name)
    analysis.touches.append(t)

# ----------------------------------------------------------------------------- bound functions
def bound_functions(tree, parents=None):
    """Functions of a module bound onto other objects (``types.MethodType(fn, obj)`` or
    ``obj.attr = fn``): [(call or assignment node, function node, obj expr, how, {attr: first line}
    it loads on ``self``, attributes assigned on it)]. Attributes the binding code itself puts on that
    object (``obj._ext = self``) count as assigned: they are the caller's own, not the library's."""
    funcs = {st.name: st for st in tree.body if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if not funcs:
        return []
    if parents is None:
        parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    out = []
    for node in ast.walk(tree):
        fname, obj, kind = None, None, None
        if isinstance(node, ast.Call) and (dotted(node.func) or "").endswith("MethodType") and \
                len(node.args) == 2 and isinstance(node.args[0], ast.Name) and node.args[0].id in funcs:
            fname, obj, kind = node.args[0].id, node.args[1], "types.MethodType"
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in funcs \
                and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute):
            fname, obj, kind = node.value.id, node.targets[0].value, "assignment"
        if fname is None:
            continue
        fn = funcs[fname]
        args = fn.args.posonlyargs + fn.args.args
        if not args:
            continue
        selfname = args[0].arg
        used, assigned = {}, set()
        for sub in ast.walk(fn):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == selfname:
                if isinstance(sub.ctx, ast.Load):
                    used.setdefault(sub.attr, sub.lineno)
                else:
                    assigned.add(sub.attr)
        objtext = dotted(obj)
        scope = _scope_of(parents, node)
        if objtext and scope is not None:
            for sub in ast.walk(scope):
                tg = sub.targets if isinstance(sub, ast.Assign) else []
                for t in tg:
                    if isinstance(t, ast.Attribute) and dotted(t.value) == objtext:
                        assigned.add(t.attr)
        used = {k: v for k, v in used.items() if k not in assigned and not k.startswith("__")}
        out.append((node, fn, obj, kind, used, assigned))
    return out


def bound_object(analysis, node, obj):
    """The Val of the library object that ``node`` binds a function onto: a class, or an instance
    made by a library constructor and kept in a name or an attribute (``m = lib.Model()``,
    ``self.m = lib.Model()``, ``holder.m = lib.Model()``) in the binding's scope (a function, with
    its locals, or the module), or made right there (``MethodType(f, lib.Model())``); None when not
    known."""
    if not isinstance(obj, (ast.Name, ast.Attribute, ast.Call)):
        return None
    scope = _scope_of(analysis.parents, node)
    local, cls_ctx = {}, None
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        local = analysis._locals(scope, {})
        owner = analysis.parents.get(scope)
        args = scope.args.posonlyargs + scope.args.args
        if isinstance(owner, ast.ClassDef) and args:
            cls_ctx = (owner.name, args[0].arg, None)
    v = analysis._eval(obj, local, cls_ctx)
    if v is not None:
        return v
    # a name or attribute assigned in this scope from a library constructor (every assignment agrees)
    text, found = dotted(obj), []
    for sub in own_nodes(scope) if scope is not None else ():
        if isinstance(sub, ast.Assign) and any(dotted(t) == text for t in sub.targets):
            found.append(analysis._eval(sub.value, local, cls_ctx))
    if found and all(f is not None and f.instance and f.symbol == found[0].symbol for f in found):
        return found[0]
    return None


def collect_bound(analysis, tree):
    """Functions of this module bound onto library objects, and what they use on ``self``. When
    the object is known (a library class, or an instance a library constructor made), its
    attributes are looked up through its class's MRO (``facts``) and its class's record goes with
    them (``class``: own methods and what its library bases give it, for a successor); else the
    classes that have the attributes through their MRO stand for it (``classes``)."""
    static = analysis.suggester
    for node, fn, obj, kind, used, assigned in bound_functions(tree, analysis.parents):
        fname, objtext = fn.name, dotted(obj)
        src_lines = analysis.text.splitlines() if isinstance(analysis.text, str) else []
        use_lines = {k: src_lines[v - 1] for k, v in used.items() if 0 < v <= len(src_lines)}
        t = {"kind": "bound", "path": analysis.path, "module": analysis.modname, "line": node.lineno,
             "function": fname, "function_line": fn.lineno, "how": kind, "object": objtext,
             "uses": used, "use_lines": use_lines, "own": sorted(assigned)}
        known = bound_object(analysis, node, obj)
        ent = None
        if known is not None and known.ent.kind == "class":
            ent = known.ent if getattr(analysis.r, "mode", "static") == "static" else replay(static, known.path)[0]
        if ent is not None and ent.kind == "class" and getattr(ent, "node", None) is not None:
            t["access"] = [list(s) for s in known.path]
            t["instance"] = bool(known.instance)
            t["class_symbol"] = known.symbol
            t["facts"] = {n: _attr_fact(static, ent, n) for n in used}
            t["class"] = class_record(static, ent, known.path[0][1].split(".")[0])
        elif len(used) >= 2:
            lib = sorted(analysis.libs)[0]
            t["library"] = lib
            t["classes"] = hierarchy_table(static, lib, sorted(used), len(used) - 1)
        analysis.touches.append(t)
