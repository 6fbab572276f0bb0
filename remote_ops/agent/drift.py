"""Behaviour drift between two versions of a library, where a caller touches it (stdlib only).

Used on both sides of ``check``: on the host, the call-site analysis (``callsites.Analysis`` with
``touches`` switched on) records what the caller *uses* of the library, each with the facts of
the installed version (``call_facts``, ``bound_facts``); on the controller, ``replay_facts``
computes the same facts over the baseline's sources with the same static resolver, and
``compare`` turns the differences into drift records. Nothing is imported on either side.

Touches (JSON-able dicts, each with path/line/module):

- ``call``: a call whose callee resolves to the library: the access path (replayable in another
  version), which parameters the call binds, and how its result is used (indexed, iterated,
  tested for truth). A string literal bound to a parameter named ``method`` (dispatchers such as
  ``collective_rpc("name")``) is kept as ``dispatch``.
- ``bound``: a function of the caller bound onto a library object (``types.MethodType(f, obj)``,
  ``obj.attr = f``), with the attributes it uses on its first parameter. When the object's class
  is not known (the usual case), the classes that have every one of those attributes stand for
  it (duck typing over the library's class bodies).

Kinds: ``default-changed`` (a parameter the call does not pass whose default differs),
``return-changed`` (the return annotation differs and the result is used), ``attribute-gone``
(an attribute used on library objects existed in the baseline and does not now; a successor is
suggested when exactly one new method has the same parameters and the same place or a similar
name).

What it cannot see: defaults computed at run time (``__post_init__`` / validators: reported as a
note when ``__post_init__`` assigns the field), behaviour changes with the same signature,
attributes reached through ``getattr`` with computed names, and classes that inherit the used
attributes without defining any of them in their own body (duck typing reads class bodies).
"""

import ast
import bisect
import difflib
import os
import re

from .signatures import Signature, Unknown, _ann, dotted

MAX_CLASSES = 400


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


def _rel(path, roots):
    for r in roots:
        if r and path and path.startswith(r.rstrip(os.sep) + os.sep):
            return path[len(r.rstrip(os.sep)) + 1:]
    return path


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


# ----------------------------------------------------------------------------- library scans
_CLASS_RE = re.compile(rb"^class[ \t]+(\w+)[ \t]*[(:]", re.M)
_TOP_RE = re.compile(rb"^[^\s#]", re.M)
_DEF_RE = re.compile(rb"^    (?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\(", re.M)


def _classes_in(data):
    """[(name, line, block bytes)] for top-level classes of a file's bytes."""
    out = []
    for m in _CLASS_RE.finditer(data):
        start = m.start()
        nxt = _TOP_RE.search(data, m.end())
        i = nxt.start() if nxt else len(data)
        # decorators/comments at column 0 end a class body too; good enough for a body read
        out.append((m.group(1).decode(), data.count(b"\n", 0, start) + 1, data[start:i]))
    return out


def _header(block, name):
    """(positional param names after self, kw-only names) of method ``name`` in a class block."""
    m = re.search(rb"^    (?:async[ \t]+)?def[ \t]+" + re.escape(name.encode()) + rb"[ \t]*\(", block, re.M)
    if m is None:
        return None
    i, depth = m.end(), 1
    while i < len(block) and depth:
        c = block[i:i + 1]
        if c in (b"(", b"[", b"{"):
            depth += 1
        elif c in (b")", b"]", b"}"):
            depth -= 1
        i += 1
    try:
        fn = ast.parse(b"def f(" + block[m.end():i] + b": pass").body[0]
    except (SyntaxError, ValueError):
        return None
    a = fn.args
    pos = [x.arg for x in a.posonlyargs + a.args][1:]
    return [pos, [x.arg for x in a.kwonlyargs], bool(a.vararg), bool(a.kwarg)]


def _assigns(block, name):
    """Whether a class body binds ``name``: ``self.name = ...`` (also in a tuple target) or a
    class-level ``name = ...`` / ``name: T``."""
    n = re.escape(name.encode())
    return re.search(rb"self\." + n + rb"\b[^\n=()]*(?<![!<>+\-*/%&|^@:])=(?!=)", block) is not None or \
        re.search(rb"^    " + n + rb"[ \t]*[:=]", block, re.M) is not None


def _files_with(blob, starts, needles, need):
    """Indexes of the files (in the package blob) that contain at least ``need`` of ``needles``.
    Such a file misses at most ``len - need`` needles, so it holds one of any ``len - need + 1``
    of them: the longest (usually rarest) are searched through the blob, the rest per file."""
    end = len(blob)
    k = len(needles) - need + 1
    probe = sorted(needles, key=len, reverse=True)[:max(k, 1)]
    cands = set()
    for n in probe:
        pos = blob.find(n)
        while pos >= 0:
            i = bisect.bisect_right(starts, pos) - 1
            cands.add(i)
            nxt = starts[i + 1] if i + 1 < len(starts) else end
            pos = blob.find(n, nxt)
    out = []
    for i in sorted(cands):
        data = blob[starts[i]:starts[i + 1] - 1 if i + 1 < len(starts) else end]
        if sum(1 for n in needles if n in data) >= need:
            out.append(i)
    return out


def class_table(static, package, names, need, roots=()):
    """Classes of ``package`` whose own body has at least ``need`` of ``names`` (methods,
    ``self.x =`` assignments, class-level names): {module:Class: {where, methods, has, headers}}."""
    blob, starts, mods = static._package_files(package)
    enc = [n.encode() for n in names]
    out = {}
    for i in _files_with(blob, starts, enc, need):
        modname = mods[i]
        data = blob[starts[i]:starts[i + 1] - 1 if i + 1 < len(starts) else len(blob)]
        for cname, line, block in _classes_in(data):
            if sum(1 for n in enc if n in block) < need:
                continue
            methods = [m.decode() for m in _DEF_RE.findall(block)]
            has = [n for n in names if n in methods or _assigns(block, n)]
            if len(has) < need:
                continue
            path = static.module_file(modname) or modname
            out[modname + ":" + cname] = {
                "where": "%s:%d" % (_rel(path, roots), line), "methods": methods, "has": has,
                "lines": {m: line + block.count(b"\n", 0, block.find(b"def " + m.encode() + b"("))
                          for m in methods},
                "headers": {m: _header(block, m) for m in methods if not m.startswith("__")}}
            if len(out) >= MAX_CLASSES:
                return out
    return out


def dispatch_facts(static, package, name):
    """Classes of the library that define method ``name`` (a dispatcher's target): module:Class."""
    blob, starts, mods = static._package_files(package)
    needle = b"def " + name.encode() + b"("
    found = []
    pos = blob.find(needle)
    while pos >= 0:
        i = bisect.bisect_right(starts, pos) - 1
        end = starts[i + 1] - 1 if i + 1 < len(starts) else len(blob)
        data = blob[starts[i]:end]
        for cname, _, block in _classes_in(data):
            if re.search(rb"^    (?:async[ \t]+)?def[ \t]+" + re.escape(name.encode()) + rb"[ \t]*\(", block, re.M):
                found.append(mods[i] + ":" + cname)
        pos = blob.find(needle, end)
    return sorted(set(found))


# ----------------------------------------------------------------------------- bound functions
def collect_bound(analysis, tree):
    """Functions of this module bound onto library objects, and what they use on ``self``."""
    funcs = {st.name: st for st in tree.body if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if not funcs:
        return
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
        # attributes the caller itself puts on that object (``obj._ext = self``) are its own
        objtext = dotted(obj)
        scope = analysis.parents.get(node)
        while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            scope = analysis.parents.get(scope)
        if objtext and scope is not None:
            for sub in ast.walk(scope):
                tg = sub.targets if isinstance(sub, ast.Assign) else []
                for t in tg:
                    if isinstance(t, ast.Attribute) and dotted(t.value) == objtext:
                        assigned.add(t.attr)
        used = {k: v for k, v in used.items() if k not in assigned and not k.startswith("__")}
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


def _attr_fact(static, cls, name):
    e = static.class_attr(cls, name, via_instance=True)
    return {"status": e.kind if e.kind in ("missing", "unknown") else "ok", "where": e.where}


def bound_facts_for(static, touch, roots=()):
    """Baseline facts of a bound touch, the same way the host computed the installed ones."""
    if "access" in touch:
        e, _ = replay(static, touch["access"])
        if e is None or e.kind != "class":
            return {"facts": None}
        return {"facts": {n: _attr_fact(static, e, n) for n in touch["uses"]}}
    if "library" in touch:
        return {"classes": class_table(static, touch["library"], sorted(touch["uses"]),
                                       len(touch["uses"]), roots)}
    return {}


# ----------------------------------------------------------------------------- comparison
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


def _same_default(a, b):
    if a == b:
        return True
    for x, y in ((a, b), (b, a)):
        # 'auto' and ModelImpl.AUTO / ModelImpl.AUTO.value: an Enum member named like the string
        m = re.fullmatch(r"[A-Za-z_]\w*\.([A-Za-z_]\w*)(\.value)?", y or "")
        if m and _literal(x) and isinstance(ast.literal_eval(x), str) and \
                ast.literal_eval(x).lower() == m.group(1).lower():
            return True
    try:
        return ast.literal_eval(a) == ast.literal_eval(b)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def _literal(text):
    try:
        ast.literal_eval(text)
        return True
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def compare(touches, baseline, versions):
    """(drift records, notes) from installed touches and their baseline facts."""
    base_v, inst_v = versions
    drift, notes = [], []
    for t, b in zip(touches, baseline):
        if t["kind"] == "call":
            drift += _compare_call(t, b, base_v, inst_v, notes)
        elif t["kind"] == "bound":
            drift += _compare_bound(t, b, base_v, inst_v, notes)
    seen, out = set(), []
    for d in drift:
        key = (d["path"], d["line"], d["kind"], d["symbol"], d["name"])
        if key not in seen:
            seen.add(key)
            out.append(d)
    out.sort(key=lambda d: (d["path"], d["line"], d["kind"], d["name"] or ""))
    return out, notes


def _rec(t, kind, name, symbol, base, inst, message, suggestion, fix, line=None):
    return {"path": t["path"], "line": line or t["line"], "module": t["module"], "symbol": symbol,
            "kind": kind, "name": name, "baseline": base, "installed": inst, "message": message,
            "suggestion": suggestion, "fix": fix, "call": t.get("call"), "source": t.get("source")}


def _bound_names(t, params):
    positional = [p[0] for p in params if p[1] in ("positional-only", "positional-or-keyword")]
    return set(positional[:t["npos"]]) | set(t["keywords"])


def _compare_call(t, b, base_v, inst_v, notes):
    out = []
    fi, fb = t.get("facts") or {}, (b or {}).get("facts") or {}
    short = t["symbol"].rsplit(".", 1)[-1]
    if fi.get("status") == "ok" and fb.get("status") == "ok":
        bparams = {p[0]: p for p in fb["params"]}
        bound = _bound_names(t, fi["params"])
        if not t["dstar"]:
            for p in fi["params"]:
                name, kind, default, ann, loc = p
                if kind in ("var-positional", "var-keyword") or default is None or name in bound:
                    continue
                if t["star"] and kind in ("positional-only", "positional-or-keyword"):
                    continue
                bp = bparams.get(name)
                if bp is None or bp[2] is None or _same_default(bp[2], default):
                    continue
                if bp[2] == "None" and name in fb.get("post_init", []):
                    notes.append("%s:%d %s(): %s's default changed from None (%s) to %s (%s), but %s's "
                                 "__post_init__ computed it: not comparable statically, not reported"
                                 % (t["path"], t["line"], short, name, base_v, default, inst_v, base_v))
                    continue
                if name in fb.get("dead_defaults", []):
                    notes.append("%s:%d %s(): %s's default changed from %s (%s) to %s (%s), but %s does not "
                                 "have what the old default names (it was replaced at run time): not reported"
                                 % (t["path"], t["line"], short, name, bp[2], base_v, default, inst_v, base_v))
                    continue
                if bp[2] == "None" and default.startswith("<factory "):
                    notes.append("%s:%d %s(): %s's default changed from None (%s) to a default-made %s "
                                 "(%s): None is the usual 'make the default' sentinel, not reported"
                                 % (t["path"], t["line"], short, name, base_v, default[9:-1], inst_v))
                    continue
                if fi.get("mode") == "runtime" and not (_literal(default) and _literal(bp[2])):
                    notes.append("%s:%d %s(): %s's default is %s in %s and %s at run time in %s "
                                 "(not comparable as text; not reported)"
                                 % (t["path"], t["line"], short, name, bp[2], base_v, default, inst_v))
                    continue
                extra = ""
                if name in fi.get("post_init", []):
                    extra = " (%s's __post_init__ also assigns it: the effective value may differ)" % short
                keep, guess = bp[2], None
                if bp[2] == "None" and "None" not in (norm_annotation(ann) or "None").split(" | ") and \
                        norm_annotation(ann) == "bool":
                    keep = "False"
                    guess = ("%s types it bool (None is not accepted); False is a guess for %s's None: "
                             "confirm that None meant off there" % (inst_v, base_v))
                sugg = "pass %s=%s to keep the behaviour the code was written for" % (name, keep)
                if guess:
                    sugg += " (%s)" % guess
                out.append(_rec(
                    t, "default-changed", name, t["symbol"],
                    {"version": base_v, "value": bp[2], "annotation": bp[3], "where": bp[4] or fb.get("where")},
                    {"version": inst_v, "value": default, "annotation": ann, "where": loc or fi.get("where")},
                    "%s() does not pass %s; its default changed from %s (%s) to %s (%s)%s"
                    % (short, name, bp[2], base_v, default, inst_v, extra),
                    sugg,
                    {"action": "add-keyword", "keyword": name, "value": keep, "constant": None,
                     "keeps": "baseline-default", **({"guess": guess} if guess else {})}
                    if _literal(keep) else
                    {"action": "add-keyword", "keyword": name, "value": None, "constant": None}))
        ri, rb = fi.get("returns"), fb.get("returns")
        dep = [n for n in fi.get("returns_depend_on") or [] if n in bound]
        if t.get("use") and norm_annotation(ri) != norm_annotation(rb) and (ri or rb) \
                and fi.get("kind") == "function" and fi.get("returns_depend_on") and not dep:
            notes.append("%s:%d %s() is annotated -> %s in %s and -> %s in %s; its docstring ties the "
                         "result to %s, which this call does not pass: not reported"
                         % (t["path"], t["line"], short, rb, base_v, ri, inst_v,
                            ", ".join(fi["returns_depend_on"])))
        elif t.get("use") and norm_annotation(ri) != norm_annotation(rb) and (ri or rb) \
                and fi.get("kind") == "function":
            use, uline = t["use"][:2]
            why = (" (its docstring ties the result to %s, which this call passes)" % ", ".join(dep)) if dep else ""
            sugg_r = "check what %s() returns in %s and adapt the use at line %d" % (short, inst_v, uline)
            fix_r = {"action": "review-use", "line": uline, "use": use}
            nb, ni = norm_annotation(rb) or "", norm_annotation(ri) or ""
            if use == "indexed" and len(t["use"]) == 4 and nb.startswith("list[") and not ni.startswith(
                    ("list[", "tuple[", "Sequence[")) and dep:
                sugg_r = ("this call passes %s: %s returns the single result, not a list; use %s instead of "
                          "%s (line %d)" % (", ".join(dep), inst_v, t["use"][3], t["use"][2], uline))
                fix_r = {"action": "replace-text", "line": uline, "old": t["use"][2], "new": t["use"][3]}
            out.append(_rec(
                t, "return-changed", short, t["symbol"],
                {"version": base_v, "value": rb, "where": fb.get("where")},
                {"version": inst_v, "value": ri, "where": fi.get("where")},
                "%s() is annotated -> %s in %s and -> %s in %s, and its result is %s (line %d)%s"
                % (short, rb, base_v, ri, inst_v, use, uline, why),
                sugg_r, fix_r))
    if t.get("dispatch"):
        name = t["dispatch"]
        if t.get("package_defines"):
            pass        # the package's own method (e.g. a worker extension): not the library's drift
        else:
            di, db = t.get("dispatch_facts") or [], (b or {}).get("dispatch_facts") or []
            if db and not di:
                out.append(_rec(
                    t, "attribute-gone", name, t["symbol"] + "(%r)" % name,
                    {"version": base_v, "where": ", ".join(db[:3])}, {"version": inst_v, "where": None},
                    "%s(%r): %s defines %s in %s; nothing in %s does" % (
                        short, name, ", ".join(x.split(":")[1] for x in db[:3]), name, base_v, inst_v),
                    "find the method's successor in %s" % inst_v,
                    {"action": "placeholder"}))
    return out


def _successor(bcls, icls, name):
    """A method new in the installed class with the same parameters as ``name`` had, at the same
    place or with a similar name; None unless exactly one fits."""
    bh = (bcls.get("headers") or {}).get(name)
    if bh is None:
        return None
    new = [m for m in icls["methods"] if m not in bcls["methods"] and not m.startswith("__")]
    same = [m for m in new if (icls.get("headers") or {}).get(m) == bh]
    try:
        pos = bcls["methods"].index(name)
    except ValueError:
        pos = -1
    fits = [m for m in same if (pos >= 0 and pos < len(icls["methods"]) and icls["methods"][pos] == m)
            or difflib.SequenceMatcher(None, m, name).ratio() >= 0.6]
    return fits[0] if len(fits) == 1 else None


def _compare_bound(t, b, base_v, inst_v, notes):
    out = []
    where = "%s:%d" % (t["path"], t["line"])
    if "access" in t:
        fb = (b or {}).get("facts") or {}
        for n, f in (t.get("facts") or {}).items():
            bf = fb.get(n) or {}
            if f["status"] == "missing" and bf.get("status") == "ok":
                out.append(_rec(t, "attribute-gone", n, "self." + n,
                                {"version": base_v, "where": bf.get("where")}, {"version": inst_v, "where": None},
                                "%s uses self.%s (bound at %s); it existed in %s and is gone in %s"
                                % (t["function"], n, where, base_v, inst_v),
                                "find its successor", {"action": "placeholder"}, line=t["uses"][n]))
        return out
    if "classes" not in t:
        notes.append("%s: %s is bound onto %s but uses fewer than two attributes of it: its class "
                     "cannot be told, not checked" % (where, t["function"], t["object"]))
        return out
    base = (b or {}).get("classes") or {}
    inst = t["classes"]
    uses = t["uses"]
    if not base:
        notes.append("%s: no class of %s %s has all of %s: the object %s is bound onto is not identified"
                     % (where, t.get("library"), base_v, ", ".join(sorted(uses)), t["object"]))
        return out
    for n in sorted(uses):
        gone, kept, succ = [], [], {}
        for q, bc in base.items():
            ic = inst.get(q)
            if ic is None:
                continue
            if n in ic["has"]:
                kept.append(q)
            else:
                gone.append(q)
                s = _successor(bc, ic, n)
                if s:
                    succ[s] = succ.get(s, 0) + 1
        if not gone or len(gone) <= len(kept):
            continue
        ex = gone[0]
        bwhere = base[ex]["where"]
        bline = base[ex].get("lines", {}).get(n)
        if bline:
            bwhere = bwhere.rsplit(":", 1)[0] + ":%d" % bline
        best = max(succ.items(), key=lambda kv: kv[1]) if succ else None
        iex = inst[ex]
        iwhere = iex["where"]
        if best:
            iline = iex.get("lines", {}).get(best[0])
            if iline:
                iwhere = iwhere.rsplit(":", 1)[0] + ":%d" % iline
            sugg = "rename self.%s to self.%s (same parameters, same place in the class; %d of %d classes)" % (
                n, best[0], best[1], len(gone))
            fix = {"action": "rename-attribute", "attribute": n, "to": best[0], "function": t["function"]}
            line_text = (t.get("use_lines") or {}).get(n)
            if line_text and ("self." + n) in line_text:
                fix.update(old=line_text.strip(), new=line_text.strip().replace("self." + n, "self." + best[0]))
        else:
            sugg = "find what replaced %s in %s" % (n, inst_v)
            fix = {"action": "placeholder"}
        out.append(_rec(
            t, "attribute-gone", n, "self." + n,
            {"version": base_v, "where": bwhere, "classes": len(base)},
            {"version": inst_v, "where": iwhere, "successor": best[0] if best else None},
            "%s() is bound onto a library object (%s at line %d) and uses self.%s; %d %s %s classes have "
            "every attribute it uses (%s); in %s, %d of them no longer define %s (e.g. %s)"
            % (t["function"], t["how"], t["line"], n, len(base), t.get("library"), base_v,
               ", ".join(sorted(uses)), inst_v, len(gone), n, ex.split(":")[1]),
            sugg, fix, line=uses[n]))
    return out
