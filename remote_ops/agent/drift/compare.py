"""Drift, comparison: a touch's facts in the baseline against the installed version, as drift
records (default-changed, return-changed, attribute-gone with a suggested successor). Stdlib only.

Used on both sides of ``check``: on the host, the call-site analysis (``callsites.Analysis`` with
``touches`` switched on) records what the caller *uses* of the library, each with the facts of
the installed version (``call_facts``, ``bound_facts``); on the controller, ``replay_facts``
computes the same facts over the baseline's sources with the same static resolver, and
``compare`` turns the differences into drift records. Nothing is imported on either side.

Kinds: ``default-changed`` (a parameter the call does not pass whose default differs),
``return-changed`` (the return annotation differs and the result is used), ``attribute-gone``
(an attribute used on library objects existed in the baseline, in the class or one of its library
bases, and does not now anywhere in the hierarchy; a successor is suggested when exactly one new
method of the hierarchy has the same parameters and the same place in the same class body or a
similar name).

What it cannot see: defaults computed at run time (``__post_init__`` / validators: reported as a
note when ``__post_init__`` assigns the field), behaviour changes with the same signature,
attributes reached through ``getattr`` with computed names, and what bases outside the library
(torch's ``Module``) give a class (not read: not the library's drift, and the controller does not
have their sources).

The parts, one job each, modules of this folder:
``record`` (what the call-site analysis records), ``facts`` (a touch's facts in one
version), ``scan`` (class-body and dispatcher scans over a library's files), ``classes``
(a class's record through its MRO; the duck-typing table), ``compare`` (baseline against
installed, as drift records).
"""

import ast
import difflib
import re

from ..drift.classes import where_of
from ..drift.facts import norm_annotation


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
    """The drift of one call (``t``, installed; ``b``, its baseline): the defaults it relies on, its
    result's annotation, a name it dispatches on that is gone."""
    out = []
    fi, fb = t.get("facts") or {}, (b or {}).get("facts") or {}
    short = t["symbol"].rsplit(".", 1)[-1]
    if fi.get("status") == "ok" and fb.get("status") == "ok":
        bound = _bound_names(t, fi["params"])
        if not t["dstar"]:
            out += _defaults_changed(t, fi, fb, bound, short, base_v, inst_v, notes)
        out += _return_changed(t, fi, fb, bound, short, base_v, inst_v, notes)
    # a dispatched name the package's own method defines (a worker extension) is not the library's drift
    if t.get("dispatch") and not t.get("package_defines"):
        out += _dispatch_gone(t, b, short, base_v, inst_v)
    return out


def _defaults_changed(t, fi, fb, bound, short, base_v, inst_v, notes):
    """default-changed: a parameter the call does not pass whose default differs (or a note why not)."""
    out = []
    bparams = {p[0]: p for p in fb["params"]}
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
    return out


def _return_changed(t, fi, fb, bound, short, base_v, inst_v, notes):
    """return-changed: the result is used and its annotation differs (or a note why not)."""
    out = []
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
    return out


def _dispatch_gone(t, b, short, base_v, inst_v):
    """attribute-gone: the baseline defines the name the call dispatches on; the installed one does not."""
    out = []
    name = t["dispatch"]
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


def _methods(cls):
    """{method name: header} of a class record: its own body's, then what its library bases give
    it (``inherited``, methods only)."""
    out = {m: v[2] for m, v in (cls.get("inherited") or {}).items() if v[2] is not None}
    out.update({m: (cls.get("headers") or {}).get(m) for m in cls["methods"]})
    return out


def _order(cls, name):
    """(the class that defines ``name`` in a class record: "" for its own body, else the base's
    "module:Class"; that body's methods in order)."""
    if name in cls["methods"]:
        return "", cls["methods"]
    owner = ((cls.get("inherited") or {}).get(name) or [""])[0]
    return owner, (cls.get("bases") or {}).get(owner) or []


def _successor(bcls, icls, name):
    """A method new in the installed class (its own body or its library bases) with the same
    parameters as ``name`` had, at the same place of the same class body (the class's own, or the
    base that defined it) or with a similar name; None unless exactly one fits."""
    old, now = _methods(bcls), _methods(icls)
    bh = old.get(name)
    if bh is None:
        return None
    new = [m for m in now if m not in old and not m.startswith("__")]
    same = [m for m in new if now[m] == bh]
    owner, border = _order(bcls, name)
    iorder = icls["methods"] if not owner else (icls.get("bases") or {}).get(owner) or []
    pos = border.index(name) if name in border else -1
    fits = [m for m in same if (0 <= pos < len(iorder) and iorder[pos] == m)
            or difflib.SequenceMatcher(None, m, name).ratio() >= 0.6]
    return fits[0] if len(fits) == 1 else None


def _rename(t, n, to, why):
    """(suggestion, fix) renaming ``self.n`` to ``self.to`` in the bound function (with the line's
    exact text when the use is on it)."""
    sugg = "rename self.%s to self.%s (%s)" % (n, to, why)
    fix = {"action": "rename-attribute", "attribute": n, "to": to, "function": t["function"]}
    line_text = (t.get("use_lines") or {}).get(n)
    if line_text and ("self." + n) in line_text:
        fix.update(old=line_text.strip(), new=line_text.strip().replace("self." + n, "self." + to))
    return sugg, fix


def _compare_bound(t, b, base_v, inst_v, notes):
    out = []
    where = "%s:%d" % (t["path"], t["line"])
    if "access" in t:
        fb = (b or {}).get("facts") or {}
        bcls, icls = (b or {}).get("class"), t.get("class")
        onto = ("an instance of %s" if t.get("instance") else "%s") % (t.get("class_symbol") or t["object"])
        for n, f in (t.get("facts") or {}).items():
            bf = fb.get(n) or {}
            if f["status"] == "missing" and bf.get("status") == "ok":
                succ = _successor(bcls, icls, n) if bcls and icls else None
                if succ:
                    sugg, fix = _rename(t, n, succ, "same parameters, same place or a similar name: the one new "
                                        "method of %s and its bases that fits" % icls["class"].split(":")[1])
                else:
                    sugg, fix = "find what replaced %s in %s" % (n, inst_v), {"action": "placeholder"}
                out.append(_rec(t, "attribute-gone", n, "self." + n,
                                {"version": base_v, "where": bf.get("where"),
                                 **({"class": bcls["class"]} if bcls else {})},
                                {"version": inst_v, "where": where_of(icls, succ) if succ else None,
                                 "successor": succ},
                                "%s() is bound onto %s (%s at %s) and uses self.%s; %s in %s, gone from "
                                "the class and its bases in %s"
                                % (t["function"], onto, t["how"], where, n,
                                   "it is defined at %s" % bf["where"] if bf.get("where") else "it exists",
                                   base_v, inst_v),
                                sugg, fix, line=t["uses"][n]))
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
        bwhere = where_of(base[ex], n)
        best = max(succ.items(), key=lambda kv: kv[1]) if succ else None
        iex = inst[ex]
        iwhere = where_of(iex, best[0]) if best else iex["where"]
        if best:
            sugg, fix = _rename(t, n, best[0], "same parameters, same place in the class; %d of %d classes"
                                % (best[1], len(gone)))
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
