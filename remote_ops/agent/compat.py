"""Agent ops ``compat.check`` and ``compat.inspect``: API compatibility, computed on the host.

``op_check(args)``
    targets: [module, ...]      caller modules; default: every module of ``package`` whose
                                source imports one of ``against``
    package: str                default "speculators.data_generation"
    against: [str, ...]         library top-level packages, default ["vllm"]
    mode: "static"|"runtime"    default "static" (parse only; runtime imports the library)
    sys_path: [str, ...]        search path, default this interpreter's sys.path
    override_sources: {module: text}
                                analyse this text instead of the installed file (used to
                                re-check edited text in the same round trip, e.g. by patch)
    only_symbols: [str, ...]    check only calls to these callees, spelled by any module that
                                defines or re-exports them (``symbols.SymbolMatcher``); a
                                spelling that names nothing in the library is refused
    trace: bool                 also return every checked call with the signature used
    drift: bool                 also return "touches" (what the package uses of the library, with
                                the installed facts; agent/drift/) and "declared" (the package's
                                own requirement on each library, from its installed metadata)
    Returns {"mode", "python", "versions", "targets": [{module, path}], "findings": [...],
    "unknown": [...], "calls_checked", "elapsed_s"[, "trace"]}. A finding carries path, line,
    col, module, symbol (dotted callee as imported), defined (where it is defined, or null),
    kind, name, message, suggestion, call (the
    source text), signature (+ _mode, _origin) and fix (structured, for playbook emission).

``op_inspect(args)``
    symbols: ["module:qualname", ...], mode, sys_path as above.
    Returns {"mode", "python", "versions", "symbols": [{symbol, kind, mode, signature,
    parameters, origin, note} | {symbol, kind: "missing"|"unknown", reason}]}.

Everything is stdlib; the library is never imported in static mode.
"""

import sys
import time

from .check.calls import _resolver, check, versions
from .protocol import AgentFailure
from .core.reads import Reads
from .resolve.resolver import StaticResolver
from .resolve.sigmodel import Signature, Unknown


def op_check(args):
    """The check, its result reused from the host's check memo while nothing it read changed
    (``memo``; static mode only: runtime mode imports the library, and is always computed)."""
    t0 = time.perf_counter()
    if (args.get("mode") or "static") != "static":
        out = check(args, Reads())
    else:
        from .check import memo
        out = memo.cached("check", args, lambda reads: check(args, reads))
    return dict(out, elapsed_s=round(time.perf_counter() - t0, 4))


def _split_symbol(sym):
    if ":" in sym:
        mod, _, qual = sym.partition(":")
        return mod, qual
    raise AgentFailure("bad-args", "symbol %r must be module:qualname" % sym,
                       "for example vllm.v1.request:Request")


def op_inspect(args):
    t0 = time.perf_counter()
    sys_path = args.get("sys_path") or sys.path
    static = StaticResolver(sys_path)
    resolver = _resolver(args, static)
    out = []
    tops = set()
    for sym in args.get("symbols") or []:
        mod, qual = _split_symbol(sym)
        tops.add(mod.split(".")[0])
        e = resolver.module(mod)
        parts = qual.split(".") if qual else []
        for i, p in enumerate(parts):
            if e.kind in ("missing", "unknown"):
                break
            e = resolver.member(e, p)
        rec = {"symbol": sym, "kind": e.kind}
        if e.kind in ("missing", "unknown"):
            rec["reason"] = e.reason
        elif e.kind in ("class", "function"):
            sig = resolver.signature(e)
            if isinstance(sig, Unknown):
                rec.update({"kind": "unknown", "object": e.kind, "reason": sig.reason})
            else:
                rec.update(sig.to_json())
                rec["object"] = e.kind
                if e.kind == "function" and getattr(e, "node", None) is not None:
                    from .resolve.base import _ann
                    rec["returns"] = _ann(e.node.returns)
        else:
            rec["reason"] = "not a function or class"
        rec["mode"] = getattr(resolver, "mode", "static")
        out.append(rec)
    return {"mode": getattr(resolver, "mode", "static"), "python": sys.executable,
            "versions": versions(sorted(tops), sys_path), "symbols": out,
            "elapsed_s": round(time.perf_counter() - t0, 4)}


__all__ = ["op_check", "op_inspect", "Signature"]
