"""Drift, facts of one version: what a touch of the library finds in a version (a call's access
path replayed, its parameters, defaults, return annotation; a bound function's attributes), the
same way on the host (installed) and on the controller (baseline). Stdlib only.
"""

import ast
import re

from ..drift.classes import class_record, hierarchy_table
from ..drift.scan import _rel, dispatch_facts
from ..resolve.sigmodel import Unknown
from ..resolve.base import _ann, dotted


# ----------------------------------------------------------------------------- replay
def replay(resolver, path):
    """(entity, instance) reached by an access path in ``resolver``'s version of the library."""
    if not path:
        return None, False
    head = path[0]
    if head[0] == "mod":
        e = resolver.module(head[1])
    else:
        e = resolver.lookup(head[1], head[2])
    instance = False
    for step in path[1:]:
        if e.kind in ("missing", "unknown"):
            return e, False
        if step[0] == "new":
            if e.kind != "class":
                return None, False
            instance = True
        else:
            if instance:
                e = resolver.class_attr(e, step[1], via_instance=True)
            elif e.kind in ("module", "class") or e.special:
                e = resolver.member(e, step[1])
            else:
                return None, False
            instance = False
    return e, instance

def _param_lines(resolver, e):
    """{parameter name: line} where the callee defines each parameter/field."""
    out = {}
    if e.kind == "function":
        a = e.node.args
        for arg in a.posonlyargs + a.args + a.kwonlyargs:
            out[arg.arg] = arg.lineno
        return out, e.mod.path
    if e.kind == "class":
        paths = {}
        for c in reversed(resolver.mro(e)):
            if c.kind != "class":
                continue
            init = None
            for st in c.node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    out[st.target.id] = st.lineno
                    paths[st.target.id] = c.mod.path
                if isinstance(st, ast.FunctionDef) and st.name == "__init__":
                    init = st
            if init is not None:
                for arg in init.args.posonlyargs + init.args.args + init.args.kwonlyargs:
                    out[arg.arg] = arg.lineno
                    paths[arg.arg] = c.mod.path
        return out, paths
    return out, None


def _post_init_assigns(resolver, e):
    """Fields that a ``__post_init__`` of the class (or a base) assigns: their default is not the
    whole story."""
    names = set()
    if e.kind != "class":
        return names
    for c in resolver.mro(e):
        if c.kind != "class":
            continue
        for st in c.node.body:
            if isinstance(st, ast.FunctionDef) and st.name == "__post_init__":
                for sub in ast.walk(st):
                    tg = sub.targets if isinstance(sub, ast.Assign) else (
                        [sub.target] if isinstance(sub, (ast.AnnAssign, ast.AugAssign)) else [])
                    for t in tg:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            names.add(t.attr)
    return names


def call_facts(static, e, sig, roots=()):
    """What drift compares about one callee in one version (JSON-able)."""
    if e is None:
        return {"status": "unknown", "reason": "not reachable the same way"}
    if e.kind in ("missing", "unknown"):
        return {"status": e.kind, "reason": e.reason}
    if isinstance(sig, Unknown) or sig is None:
        return {"status": "unknown", "reason": getattr(sig, "reason", "no signature")}
    lines, paths = ({}, None)
    post, depends = set(), []
    returns = None
    where = e.where
    if getattr(e, "node", None) is not None and getattr(e, "mod", None) is not None:
        lines, paths = _param_lines(static, e)
        post = _post_init_assigns(static, e)
        if e.kind == "function":
            returns = _ann(e.node.returns)
            depends = _returns_depend_on(e.node, [p.name for p in sig.params])
    params = []
    for p in sig.params:
        pth = paths.get(p.name) if isinstance(paths, dict) else paths
        loc = "%s:%d" % (_rel(pth, roots), lines[p.name]) if pth and p.name in lines else None
        params.append([p.name, p.kind, p.default, p.annotation, loc])
    return {"status": "ok", "kind": e.kind, "where": _rel(where, roots) if where else None,
            "mode": sig.mode, "params": params, "returns": returns, "post_init": sorted(post),
            "returns_depend_on": depends}


def _returns_depend_on(fn, names):
    """Parameters that the docstring's sentences about the return value name ("Returns a single
    result if unique_reply_rank is given"): the result's shape depends on them."""
    doc = ast.get_docstring(fn) or ""
    out = []
    for sentence in re.split(r"(?<=[.:;])\s+|\n\s*\n", doc):
        if "return" not in sentence.lower():
            continue
        for n in names:
            if n not in out and re.search(r"\b%s\b" % re.escape(n), sentence):
                out.append(n)
    return out


_ALIASES = {"List": "list", "Dict": "dict", "Tuple": "tuple", "Set": "set", "FrozenSet": "frozenset",
            "Type": "type"}


def norm_annotation(text):
    """Canonical text of an annotation: typing.X -> X, List -> list, Optional[X]/Union[...] ->
    sorted ``A | B`` members, so spellings of one type compare equal."""
    if text is None:
        return None
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return " ".join(text.split())
    return _canon(node)


def _canon(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _canon(ast.parse(node.value, mode="eval").body)
        except (SyntaxError, ValueError):
            return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return " | ".join(sorted(set(_members(node))))
    if isinstance(node, ast.Subscript):
        base = _canon(node.value)
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base == "Optional":
            return " | ".join(sorted(set(_members(elts[0])) | {"None"}))
        if base == "Union":
            ms = set()
            for x in elts:
                ms |= set(_members(x))
            return " | ".join(sorted(ms))
        return "%s[%s]" % (base, ", ".join(_canon(x) for x in elts))
    if isinstance(node, ast.Attribute) and dotted(node) and dotted(node).split(".")[0] in ("typing", "typing_extensions"):
        return _ALIASES.get(node.attr, node.attr)
    if isinstance(node, ast.Name):
        return _ALIASES.get(node.id, node.id)
    if isinstance(node, ast.Constant) and node.value is None:
        return "None"
    return ast.unparse(node)


def _members(node):
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _members(node.left) + _members(node.right)
    c = _canon(node)
    return c.split(" | ")

def _attr_fact(static, cls, name):
    e = static.class_attr(cls, name, via_instance=True)
    return {"status": e.kind if e.kind in ("missing", "unknown") else "ok", "where": e.where}


def bound_facts_for(static, touch, roots=()):
    """Baseline facts of a bound touch, the same way the host computed the installed ones."""
    if "access" in touch:
        e, _ = replay(static, touch["access"])
        if e is None or e.kind != "class" or getattr(e, "node", None) is None:
            return {"facts": None}
        return {"facts": {n: _attr_fact(static, e, n) for n in touch["uses"]},
                "class": class_record(static, e, str(touch["access"][0][1]).split(".")[0], roots)}
    if "library" in touch:
        return {"classes": hierarchy_table(static, touch["library"], sorted(touch["uses"]),
                                           len(touch["uses"]), roots)}
    return {}

def _dead_path(static, text, lib):
    """Whether a string default names a dotted path into ``lib`` that this version lacks."""
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", v) or v.split(".")[0] != lib:
        return False
    mod, _, name = v.rpartition(".")
    return static.lookup(mod, name).kind == "missing"


def replay_facts(static, touches, roots=()):
    """Baseline facts for every touch (controller side, over the baseline's sources)."""
    out = []
    for t in touches:
        if t["kind"] == "call":
            e, _ = replay(static, [tuple(s) for s in t["access"]])
            sig = static.signature(e) if e is not None and e.kind in ("class", "function") else None
            f = {"facts": call_facts(static, e, sig, roots)}
            lib = t["symbol"].split(".")[0]
            if f["facts"].get("status") == "ok":
                f["facts"]["dead_defaults"] = [p[0] for p in f["facts"]["params"]
                                               if p[2] and _dead_path(static, p[2], lib)]
            if t.get("dispatch"):
                f["dispatch_facts"] = dispatch_facts(static, t["symbol"].split(".")[0], t["dispatch"])
            out.append(f)
        elif t["kind"] == "bound":
            out.append(bound_facts_for(static, t, roots))
        else:
            out.append({})
    return out
