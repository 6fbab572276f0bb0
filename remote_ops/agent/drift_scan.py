"""Drift, library scans: text searches over a library's class bodies (which classes have the
attributes a bound function uses; which methods a string dispatcher can name) and the path helper
shared by the drift modules. Stdlib only.
"""

import ast
import bisect
import os
import re


MAX_CLASSES = 400

def _rel(path, roots):
    for r in roots:
        if r and path and path.startswith(r.rstrip(os.sep) + os.sep):
            return path[len(r.rstrip(os.sep)) + 1:]
    return path

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
