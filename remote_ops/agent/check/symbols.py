"""One symbol matcher for selection (``compat.check`` ``only_symbols``) and comparison (``patch``'s
``fixes``): stdlib only.

A library object can be spelled by the module that defines it (``vllm.config.scheduler.SchedulerConfig``)
or by any module that re-exports it (``vllm.config.SchedulerConfig``). Both spellings resolve, over
the same search path the check uses, to where the object is defined; two spellings match when they
resolve to the same definition. A spelling that resolves to nothing (a symbol missing from the
installed library: exactly what a ``missing-symbol`` finding is about) matches only the identical
spelling. ``unresolved()`` names the spellings that matched neither way, so a caller can refuse them
instead of passing vacuously.
"""


def resolve(resolver, spelling):
    """The entity a dotted spelling names: its longest importable module prefix, then attributes."""
    parts = [p for p in str(spelling).split(".") if p]
    for i in range(len(parts), 0, -1):
        e = resolver.module(".".join(parts[:i]))
        if getattr(e, "kind", None) != "module":
            continue
        for p in parts[i:]:
            if e.kind in ("missing", "unknown"):
                break
            e = resolver.member(e, p)
        return e
    return None


def canonical(ent):
    """``defining.module.Qual.name`` of an entity, or None when it is not a definition we can place."""
    if ent is None or getattr(ent, "kind", None) in (None, "missing", "unknown"):
        return None
    special = getattr(ent, "special", None)
    if special:
        return special
    mod = getattr(ent, "mod", None)
    name = getattr(mod, "name", None)
    if not name:
        return None
    if ent.kind == "module":
        return name
    qual = getattr(ent, "qual", None)
    return "%s.%s" % (name, qual) if qual else None


class SymbolMatcher:
    """Spellings from a request (``only_symbols``, or the ``symbol`` of each ``fixes`` entry)."""

    def __init__(self, resolver, spellings):
        self.spellings = list(dict.fromkeys(str(s) for s in spellings))
        self.defined = {s: canonical(resolve(resolver, s)) for s in self.spellings}
        self.hit = set()

    def matches(self, spelling, symbol, defined):
        """Does ``spelling`` name the object a call or finding refers to (``symbol`` as the caller
        imported it, ``defined`` where it resolved to)?"""
        want = self.defined.get(spelling)
        ok = (want == defined) if (want and defined) else (spelling == symbol)
        if ok:
            self.hit.add(spelling)
        return ok

    def first(self, symbol, defined):
        """The first requested spelling that names this object, else None."""
        for s in self.spellings:
            if self.matches(s, symbol, defined):
                return s
        return None

    def where(self, spelling):
        return self.defined.get(spelling)

    def unresolved(self):
        """Spellings that name no definition in the installed library."""
        return [s for s in self.spellings if self.defined.get(s) is None]
