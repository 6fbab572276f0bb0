"""Drift, library scans: text searches over a library's class bodies (a class body's record; which
classes may have the attributes a bound function uses, through their bases written by name; which
methods a string dispatcher can name) and the path helper shared by the drift modules. Stdlib only.
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
# the same over a package's blob (its files joined by a NUL byte), after a newline or a file's start:
# a literal first byte keeps the search fast (^ with re.M is not)
_BLOB_CLASS_RES = (re.compile(rb"\n(class[ \t]+(\w+)[ \t]*[(:])"), re.compile(rb"\0(class[ \t]+(\w+)[ \t]*[(:])"))
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


def _closing(data, start, limit=None):
    """The index just after the bracket that closes the one opened just before ``start``."""
    i, depth = start, 1
    end = len(data) if limit is None else min(len(data), start + limit)
    while i < end and depth:
        c = data[i:i + 1]
        if c in (b"(", b"[", b"{"):
            depth += 1
        elif c in (b")", b"]", b"}"):
            depth -= 1
        i += 1
    return i


def ast_header(fn):
    """[positional parameter names after self, kw-only names, *args?, **kwargs?] of a method."""
    a = fn.args
    return [[x.arg for x in a.posonlyargs + a.args][1:], [x.arg for x in a.kwonlyargs],
            bool(a.vararg), bool(a.kwarg)]


def _header(block, name):
    """``ast_header`` of method ``name`` in a class block, read from its ``def`` line(s) only."""
    m = re.search(rb"^    (?:async[ \t]+)?def[ \t]+" + re.escape(name.encode()) + rb"[ \t]*\(", block, re.M)
    if m is None:
        return None
    try:
        fn = ast.parse(b"def f(" + block[m.end():_closing(block, m.end())] + b": pass").body[0]
    except (SyntaxError, ValueError):
        return None
    return ast_header(fn)


def _assigns(block, name):
    """Whether a class body binds ``name``: ``self.name = ...`` (also in a tuple target) or a
    class-level ``name = ...`` / ``name: T``."""
    n = re.escape(name.encode())
    return re.search(rb"self\." + n + rb"\b[^\n=()]*(?<![!<>+\-*/%&|^@:])=(?!=)", block) is not None or \
        re.search(rb"^    " + n + rb"[ \t]*[:=]", block, re.M) is not None


def class_row(static, modname, line, block, names, roots=()):
    """A class's own-body record: {where, methods, has (which of ``names`` its body binds), lines};
    ``headers`` are added by ``row_headers``."""
    methods = [m.decode() for m in _DEF_RE.findall(block)]
    path = static.module_file(modname) or modname
    return {"where": "%s:%d" % (_rel(path, roots), line), "methods": methods,
            "has": [n for n in names if n in methods or _assigns(block, n)],
            "lines": {m: line + block.count(b"\n", 0, block.find(b"def " + m.encode() + b"("))
                      for m in methods}}


def row_headers(row, block):
    """``row`` with ``headers``: {method: its parameters} of the class body ``block``."""
    row["headers"] = {m: _header(block, m) for m in row["methods"] if not m.startswith("__")}
    return row


_SIMPLE_BASES = re.compile(rb"([\w., \t]*)\)[ \t]*:")


def _base_names(blob, start):
    """Simple names (last dotted part) of the bases written from ``start`` (just after ``(``)."""
    m = _SIMPLE_BASES.match(blob, start)
    if m:
        return [p.strip().rsplit(b".", 1)[-1].decode() for p in m.group(1).split(b",") if p.strip()]
    text = blob[start:_closing(blob, start, 4000) - 1]
    prev = None
    while prev != text:
        prev, text = text, re.sub(rb"[\[(][^\[\]()]*[\])]", b"", text)
    out = []
    for part in text.split(b","):
        part = part.split(b"#")[0].strip()
        m = re.search(rb"(\w+)$", part)
        if m and b"=" not in part:
            out.append(m.group(1).decode())
    return out


def hierarchy_candidates(static, package, names, need):
    """[(module, class name, line, own body block, library bases?)] of the classes of ``package``
    that may have at least ``need`` of ``names`` in their own body or through their bases: a text
    approximation (bases by simple name; a name anywhere in a class body counts) for the resolver's
    MRO to confirm. ``library bases?``: a base is named like a class of the package (else the MRO
    adds nothing of the library's and need not be resolved). In file order; at most MAX_CLASSES."""
    blob, starts, mods = static._package_files(package)
    first = _CLASS_RE.match(blob)
    heads = sorted([(m.start(1), m.group(2).decode(), m.end()) for rx in _BLOB_CLASS_RES for m in rx.finditer(blob)]
                   + ([(0, first.group(1).decode(), first.end())] if first else []))
    if not heads:
        return []
    cstarts = [h[0] for h in heads]
    ends = {}

    def end_of(k):
        if k not in ends:
            nxt = _TOP_RE.search(blob, heads[k][2])
            eof = blob.find(b"\0", heads[k][2])
            ends[k] = min(nxt.start() if nxt else len(blob), eof if eof >= 0 else len(blob))
        return ends[k]

    own = {}        # class index -> the needles in its body; each needle's hits visit a class once
    for n in (x.encode() for x in names):
        pos = blob.find(n)
        while pos >= 0:
            k = bisect.bisect_right(cstarts, pos) - 1
            if k >= 0 and pos < end_of(k):
                own.setdefault(k, set()).add(n)
                pos = blob.find(n, end_of(k))
            elif k + 1 < len(heads):
                pos = blob.find(n, cstarts[k + 1])
            else:
                break
    by_name, bases_of = {}, {}
    for k, (pos, name, hend) in enumerate(heads):
        if k in own:
            by_name.setdefault(name, set()).update(own[k])
        bases_of.setdefault(name, []).extend(_base_names(blob, hend) if blob[hend - 1:hend] == b"(" else [])
    memo = {}

    def approx(name, depth=0):
        if name not in memo:
            memo[name] = set(by_name.get(name, ()))      # a cycle through one simple name stops here
            s = set(memo[name])
            if depth < 30:
                for b in bases_of.get(name, ()):
                    if b != name:
                        s |= approx(b, depth + 1)
            memo[name] = s
        return memo[name]

    out = []
    for k, (pos, name, hend) in enumerate(heads):
        if len(approx(name)) < need:
            continue
        i = bisect.bisect_right(starts, pos) - 1
        bases = _base_names(blob, hend) if blob[hend - 1:hend] == b"(" else []
        out.append((mods[i], name, blob.count(b"\n", starts[i], pos) + 1, blob[pos:end_of(k)],
                    any(b in bases_of for b in bases)))
        if len(out) >= MAX_CLASSES:
            break
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
