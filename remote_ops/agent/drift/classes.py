"""Drift, class hierarchies: what a class of the library has through its bases (its MRO, bases in
other modules resolved by the static resolver), for the functions a caller binds onto library
objects. Stdlib only.

A class's record (JSON-able, the same on the host and on the controller) holds its own body
(``methods`` in order, their ``headers`` and ``lines``) and ``inherited``: {name: [owner
"module:Class", "path:line", header or None]} for what the library's classes of its MRO define
(methods, class-level names, ``self.x =`` in their methods), the first in MRO order winning. Bases
outside the library (torch's ``Module``, typing's ``Protocol``) are not read: they are not the
library's drift, and the controller does not have their sources.
"""

import ast

from ..drift.scan import MAX_CLASSES, _rel, ast_header, class_row, hierarchy_candidates, row_headers
from ..resolve.base import _target_names


def _qual(c):
    return c.mod.name + ":" + c.qual


def _in_package(c, package):
    name = getattr(c.mod, "name", "") or ""
    return name == package or name.startswith(package + ".")


def _body_names(static, c):
    """[(name, line, header or None, is a method)] of what class ``c``'s own body binds: methods
    (with their header), class-level names, then ``self.x`` assigned in its methods. Once per class
    and resolver (many classes share their bases)."""
    cache = static.__dict__.setdefault("_drift_body_names", {})
    hit = cache.get(id(c.node))
    if hit is not None and hit[0] is c.node:
        return hit[1]
    out, seen = [], set()
    for st in c.node.body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            hits = [(st.name, st.lineno, ast_header(st), True)]
        elif isinstance(st, ast.Assign):
            hits = [(n, st.lineno, None, False) for t in st.targets for n in _target_names(t)]
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            hits = [(st.target.id, st.lineno, None, False)]
        else:
            hits = []
        for h in hits:
            if h[0] not in seen:
                seen.add(h[0])
                out.append(h)
    for n in sorted(static.instance_names(c) - seen):
        out.append((n, c.node.lineno, None, False))
    cache[id(c.node)] = (c.node, out)
    return out


def inherited(static, cls, package, roots=()):
    """{"inherited": {name: [owner, where, header]}, "bases": {owner: [its methods in body order]}}
    of class Ent ``cls``: what the library's other classes of its MRO (in MRO order) give it."""
    got, bases = {}, {}
    for c in static.mro(cls)[1:]:
        if c.kind != "class" or not _in_package(c, package):
            continue            # outside the library (or not resolved): not the library's drift
        q = _qual(c)
        path = _rel(c.mod.path, roots)
        bases[q] = []
        for n, line, header, is_method in _body_names(static, c):
            if is_method:
                bases[q].append(n)
            if n not in got:
                got[n] = [q, "%s:%d" % (path, line), header]
    return {"inherited": got, "bases": bases}


def class_record(static, cls, package, roots=()):
    """The record of class Ent ``cls``: {class, where, methods, headers, lines} of its own body,
    then ``inherited`` and ``bases``."""
    methods, headers, lines = [], {}, {}
    for n, line, header, is_method in _body_names(static, cls):
        if is_method:
            methods.append(n)
            lines[n] = line
            if not n.startswith("__"):
                headers[n] = header
    rec = {"class": _qual(cls), "where": "%s:%d" % (_rel(cls.mod.path, roots), cls.node.lineno),
           "methods": methods, "headers": headers, "lines": lines}
    rec.update(inherited(static, cls, package, roots))
    return rec


def where_of(rec, name):
    """"path:line" of ``name`` in a class record (own body or the base that defines it)."""
    inh = (rec.get("inherited") or {}).get(name)
    if name not in rec.get("methods", ()) and inh:
        return inh[1]
    line = (rec.get("lines") or {}).get(name)
    where = rec.get("where") or ""
    return where.rsplit(":", 1)[0] + ":%d" % line if line and where else where


# ----------------------------------------------------------------------------- duck typing
def hierarchy_table(static, package, names, need, roots=()):
    """Classes of ``package`` that have at least ``need`` of ``names`` through their MRO (own body
    or the library's bases, in other modules too): {module:Class: class_row + inherited, bases
    (where the class has library bases); ``has`` counts what the bases give}. The candidates come from a text scan
    (``scan.hierarchy_candidates``); each is confirmed with the resolver's MRO."""
    out = {}
    for modname, cname, line, block, lib_bases in hierarchy_candidates(static, package, names, need):
        row = class_row(static, modname, line, block, names, roots)
        cls = static.lookup(modname, cname) if lib_bases else None
        if cls is not None and cls.kind == "class" and getattr(cls, "node", None) is not None \
                and cls.node.lineno == line:
            row.update(inherited(static, cls, package, roots))
            row["has"] = [n for n in names if n in row["has"] or n in row["inherited"]]
        if len(row["has"]) >= need:
            out[modname + ":" + cname] = row_headers(row, block)
            if len(out) >= MAX_CLASSES:
                break
    return out

