"""Drift, recording: what the call-site analysis (``callsites.Analysis`` with touches on) records of
the library the caller uses: calls (access path, bound parameters, how the result is used) and
functions bound onto library objects. Stdlib only.
"""

import ast

from .drift_facts import _attr_fact, call_facts, replay
from .drift_scan import class_table, dispatch_facts
from .signatures import Signature, dotted


# ----------------------------------------------------------------------------- recording
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
    scope = p
    while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        scope = parents.get(scope)
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
        scope = parents.get(node)
        while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            scope = parents.get(scope)
        if objtext and scope is not None:
            for sub in ast.walk(scope):
                tg = sub.targets if isinstance(sub, ast.Assign) else []
                for t in tg:
                    if isinstance(t, ast.Attribute) and dotted(t.value) == objtext:
                        assigned.add(t.attr)
        used = {k: v for k, v in used.items() if k not in assigned and not k.startswith("__")}
        out.append((node, fn, obj, kind, used, assigned))
    return out


def collect_bound(analysis, tree):
    """Functions of this module bound onto library objects, and what they use on ``self``."""
    for node, fn, obj, kind, used, assigned in bound_functions(tree, analysis.parents):
        fname, objtext = fn.name, dotted(obj)
        src_lines = analysis.text.splitlines() if isinstance(analysis.text, str) else []
        use_lines = {k: src_lines[v - 1] for k, v in used.items() if 0 < v <= len(src_lines)}
        t = {"kind": "bound", "path": analysis.path, "module": analysis.modname, "line": node.lineno,
             "function": fname, "function_line": fn.lineno, "how": kind, "object": objtext,
             "uses": used, "use_lines": use_lines, "own": sorted(assigned)}
        known = analysis._eval(obj, {}, None) if isinstance(obj, (ast.Name, ast.Attribute)) else None
        if known is not None and known.ent.kind == "class":
            t["access"] = [list(s) for s in known.path]
            t["facts"] = {n: _attr_fact(analysis.suggester, known.ent, n) for n in used}
        elif len(used) >= 2:
            lib = sorted(analysis.libs)[0]
            t["library"] = lib
            t["classes"] = class_table(analysis.suggester, lib, sorted(used), len(used) - 1)
        analysis.touches.append(t)
