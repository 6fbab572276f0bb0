"""The signature model shared by the static and runtime resolvers (runs on the host, stdlib only).

``Parameter`` and ``Signature`` are filled either by parsing (``resolve_*`` modules, mode
"static") or by ``inspect`` (``runtime``, mode "runtime"); ``Unknown(reason)`` stands for a
signature that cannot be known, never a guess. ``bind`` simulates Python's argument binding of a
call against a signature.
"""

POSONLY = "positional-only"
POSKW = "positional-or-keyword"
KWONLY = "keyword-only"
VARPOS = "var-positional"
VARKW = "var-keyword"


class Parameter:
    __slots__ = ("name", "kind", "default", "annotation")

    def __init__(self, name, kind, default=None, annotation=None):
        self.name = name
        self.kind = kind
        self.default = default          # None: required (source text of the default otherwise)
        self.annotation = annotation

    @property
    def required(self):
        return self.default is None and self.kind not in (VARPOS, VARKW)

    def to_json(self):
        return {"name": self.name, "kind": self.kind, "required": self.required,
                "default": self.default, "annotation": self.annotation}

    def render(self):
        s = self.name
        if self.kind == VARPOS:
            s = "*" + s
        elif self.kind == VARKW:
            s = "**" + s
        if self.annotation:
            s += ": " + self.annotation
        if self.default is not None:
            s += (" = " if self.annotation else "=") + self.default
        return s


class Signature:
    def __init__(self, params, mode, origin=None, note=None):
        self.params = list(params)
        self.mode = mode
        self.origin = origin
        self.note = note

    def render(self):
        out, star_done = [], False
        for i, p in enumerate(self.params):
            if p.kind == KWONLY and not star_done:
                out.append("*")
                star_done = True
            if p.kind == VARPOS:
                star_done = True
            out.append(p.render())
            if p.kind == POSONLY and (i + 1 == len(self.params) or self.params[i + 1].kind != POSONLY):
                out.append("/")
        return "(" + ", ".join(out) + ")"

    def to_json(self):
        return {"mode": self.mode, "origin": self.origin, "note": self.note,
                "signature": self.render(), "parameters": [p.to_json() for p in self.params]}

    def drop_first(self):
        params = self.params
        if params and params[0].kind in (POSONLY, POSKW):
            params = params[1:]
        elif params and params[0].kind == VARPOS:
            pass
        return Signature(params, self.mode, self.origin, self.note)


class Unknown:
    def __init__(self, reason):
        self.reason = reason

    def __repr__(self):
        return "Unknown(%r)" % self.reason


def bind(sig, npos, star, keywords, dstar):
    """Simulate Python's argument binding; returns [(kind, name, message)] that are certain.

    ``npos`` positional arguments (``star``: the call also unpacks ``*args`` so the count is
    unknown), ``keywords`` the explicit keyword names, ``dstar``: the call unpacks ``**kw``.
    """
    problems = []
    positional = [p for p in sig.params if p.kind in (POSONLY, POSKW)]
    has_varpos = any(p.kind == VARPOS for p in sig.params)
    has_varkw = any(p.kind == VARKW for p in sig.params)
    by_name = {p.name: p for p in sig.params if p.kind in (POSKW, KWONLY)}
    bound = set()
    if not star:
        if npos > len(positional) and not has_varpos:
            problems.append(("too-many-positional", None,
                             "takes %d positional argument%s but %d %s given" % (
                                 len(positional), "" if len(positional) == 1 else "s", npos,
                                 "was" if npos == 1 else "were")))
        bound.update(p.name for p in positional[:npos])
    else:
        bound.update(p.name for p in positional[:npos])
    for kw in keywords:
        p = by_name.get(kw)
        if p is None:
            if not has_varkw:
                problems.append(("unexpected-keyword", kw, "got an unexpected keyword argument %r" % kw))
            continue
        if kw in bound and not star:
            problems.append(("unexpected-keyword", kw, "got multiple values for argument %r" % kw))
        bound.add(kw)
    if not dstar:
        for p in sig.params:
            if not p.required or p.name in bound:
                continue
            if star and p.kind in (POSONLY, POSKW):
                continue        # *args may fill it
            problems.append(("missing-argument", p.name,
                             "missing required %sargument %r" % (
                                 "keyword-only " if p.kind == KWONLY else "", p.name)))
    return problems
