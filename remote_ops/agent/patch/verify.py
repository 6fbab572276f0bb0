"""The verification of a patch before anything changes (stdlib only): the patched modules are
re-checked, old text and new text, in this process (``compat.op_check`` with the new texts as
overrides); an edit's ``fixes`` must name a finding of the old text that is gone from the new one.
"""

import base64
import os
import sys

from ..core.digest import sha256_hex as _sha
from ..protocol import AgentFailure


def _finding_key(f):
    return (f.get("path"), f.get("line"), f.get("col"), f.get("kind"), f.get("symbol"), f.get("name"))


def _brief(f):
    return {k: f.get(k) for k in ("path", "line", "kind", "symbol", "defined", "name", "message")}


def _fix_text(fix):
    return "%s %s%s" % (fix.get("kind"), fix.get("symbol"), "(%s)" % fix["name"] if fix.get("name") else "")


def _verify(args, todo):
    """Re-check the patched modules, old text and new text, in this process, before anything changes.

    ``args["verify"]``: {"args": compat.check arguments (targets: the patched modules),
    "fixes": [{"edit", "where" (playbook file:line), "kind", "symbol", "name"}] of the edits applied now,
    "allow_findings": bool}. Refuses (``verify-failed`` / ``findings-remain``; nothing written) when
    a ``fixes`` entry names nothing, matches no finding of the unpatched text (nothing to verify),
    still matches one in the new text, or when any finding remains in the patched modules and
    ``allow_findings`` is not set. Returns what was verified.
    """
    verify = args.get("verify")
    if not verify:
        return None
    from ..check import memo

    overrides = {t["module"]: base64.b64decode(t["data"]).decode(t.get("encoding") or "utf-8")
                 for t in todo if t.get("module")}
    # reused from the host's check memo while nothing the verification read has changed (a refusal
    # is never kept: it is computed again, and says so again)
    return memo.cached("verify", {"verify": verify, "new_texts": overrides},
                       lambda reads: _verified(verify, overrides, reads))


def _verified(verify, overrides, reads):
    from ..check import calls as compat
    from ..resolve.resolver import StaticResolver
    from ..check.symbols import SymbolMatcher

    vargs = dict(verify.get("args") or {})
    before = compat.check(dict(vargs), reads)
    after = compat.check(dict(vargs, override_sources=overrides), reads)
    fixes = verify.get("fixes") or []
    hits = _hits_with(SymbolMatcher(StaticResolver(vargs.get("sys_path") or sys.path, reads=reads),
                                    [f.get("symbol") for f in fixes]))
    matcher = hits.matcher

    gone, left = {}, {}
    for fix in fixes:
        where = "edit %s (%s)" % (fix.get("edit"), fix.get("where"))
        was = hits(fix, before["findings"])
        if not was:
            spelled = any(f.get("symbol") == fix.get("symbol") for f in before["findings"])
            if matcher.where(fix.get("symbol")) is None and not spelled:
                raise AgentFailure("verify-failed", "%s: fixes names %s, which is defined nowhere in the installed "
                                   "%s and is no finding's symbol; the verification would pass vacuously" % (
                                       where, fix.get("symbol"), ", ".join(vargs.get("against") or [])),
                                   "spell the symbol by a module that defines or imports it; nothing was changed")
            raise AgentFailure("verify-failed", "%s claims to fix %s, but the unpatched module has no such finding "
                               "on this host (%d finding(s) there), so there is nothing to verify" % (
                                   where, _fix_text(fix), len(before["findings"])),
                               "correct the fixes entry (kind, symbol, name as `remote-ops check` prints them), "
                               "or drop the edit if this version does not need it; nothing was changed")
        for f in was:
            gone[_finding_key(f)] = f
        for f in hits(fix, after["findings"]):
            left[_finding_key(f)] = f
    if left:
        left = list(left.values())
        raise AgentFailure("verify-failed", "the patched text still has %d finding(s) the edits target: %s" % (
            len(left), "; ".join(str(f.get("message") or f) for f in left[:3])),
            "nothing was changed; fix the playbook", findings=[_brief(f) for f in left])
    remaining = after["findings"]
    if remaining and not verify.get("allow_findings"):
        raise AgentFailure("findings-remain", "the patched text still has %d finding(s) in the patched module(s): %s" % (
            len(remaining), "; ".join("%s:%s %s" % (os.path.basename(str(f.get("path"))), f.get("line"),
                                                     f.get("message")) for f in remaining[:3])),
            "nothing was changed; add edits for them to the playbook, or pass --allow-findings to patch anyway",
            findings=[_brief(f) for f in remaining])
    return {"modules": [t["module"] for t in after.get("targets") or []], "versions": after.get("versions") or {},
            "fixes": len(fixes), "targeted_gone": len(gone), "calls_rechecked": after.get("calls_checked") or 0,
            "findings_before": len(before["findings"]), "remaining": [_brief(f) for f in remaining],
            "unknown": len(after.get("unknown") or [])}


def _hits_with(matcher):
    """``hits(fix, findings)``: the findings a ``fixes`` entry names (kind, name, and the symbol
    through ``matcher``, so any spelling of the same definition matches)."""
    def hits(fix, findings):
        return [f for f in findings if f.get("kind") == fix.get("kind")
                and (fix.get("name") is None or str(f.get("name")) == str(fix.get("name")))
                and matcher.matches(fix.get("symbol"), f.get("symbol"), f.get("defined"))]
    hits.matcher = matcher
    return hits


def present(spec):
    """For ``patching.read``'s ``present`` (edits with ``when: {finding: present}``): the unpatched
    modules checked as the verification checks them; returns {edit id: whether one of its fixes
    entries matches a finding}. ``spec``: {"args": compat.check arguments, "fixes": [{"edit",
    "kind", "symbol", "name"}]}. Reused from the host's check memo while its reads are unchanged."""
    from ..check import memo

    def compute(reads):
        from ..check import calls as compat
        from ..resolve.resolver import StaticResolver
        from ..check.symbols import SymbolMatcher

        vargs = dict(spec.get("args") or {})
        fixes = spec.get("fixes") or []
        found = compat.check(dict(vargs), reads)["findings"]
        hits = _hits_with(SymbolMatcher(StaticResolver(vargs.get("sys_path") or sys.path, reads=reads),
                                        [f.get("symbol") for f in fixes]))
        out = {}
        for fix in fixes:
            out[fix["edit"]] = out.get(fix["edit"], False) or bool(hits(fix, found))
        return out

    return memo.cached("present", spec, compute)


def _verify_skip_reason(targets):
    """None when every target still holds the bytes the plan was computed from; else why not."""
    shas = []
    for t in targets:
        try:
            with open(t["real"], "rb") as fh:
                shas.append(_sha(fh.read()))
        except OSError:
            return "a target cannot be read"
    if all(cur == _sha(base64.b64decode(t["data"])) for cur, t in zip(shas, targets)):
        return "the host already holds the patched text (applied by another controller)"
    if any(cur != t["expected"] for cur, t in zip(shas, targets)):
        return "a target changed since it was read"
    return None
