"""The call-site check of a package against the installed library, computed on the host (stdlib only).

``check(args, reads)`` is what op ``compat.check`` computes (arguments and result: ``compat.py``);
a patch's verification (``patch/verify.py``) and ``candidates.check`` run the same function.
"""

import os
import re
import sys

from . import callsites
from .symbols import SymbolMatcher
from ..contract import DEFAULT_AGAINST, DEFAULT_PACKAGE
from ..protocol import AgentFailure
from ..core.reads import Reads
from ..resolve.resolver import StaticResolver


def _resolver(args, static):
    mode = args.get("mode") or "static"
    if mode == "static":
        return static
    if mode == "runtime":
        from ..resolve.runtime import RuntimeResolver
        return RuntimeResolver(static)
    raise AgentFailure("bad-args", "unknown mode %r (static or runtime)" % mode)


def versions(names, sys_path, reads=None):
    """{name: version} of the distributions installed on ``sys_path`` (absent names left out); reads
    only the named distributions' METADATA headers (facts.find_distribution), not every package's."""
    reads = reads or Reads()
    out = {}
    for n in names:
        found = reads.distribution(n, sys_path)
        if found is not None:
            out[n] = found[0]
    return out


def _norm(n):
    return n.replace("-", "_").replace(".", "_").lower()


def _package_modules(static, package):
    """(module, path) of every .py module in ``package`` (installed files, not imported)."""
    spec = static.find_spec(package)
    if spec is None:
        raise AgentFailure("missing-target", "package %r is not installed for %s" % (package, sys.executable),
                           "install it into the host's environment, or name --target modules")
    if not spec.submodule_search_locations:
        return [(package, spec.origin)]
    return static.package_modules(package, spec)


def check(args, reads):
    """``op_check`` computed, every file-system read through ``reads``: the resolver, the caller modules
    (targets), the symbols asked for, each module analysed, then the drift touches when asked."""
    sys_path = args.get("sys_path") or sys.path
    overrides = args.get("override_sources") or {}
    against = list(args.get("against") or DEFAULT_AGAINST)
    static = StaticResolver(sys_path, reads=reads)
    resolver = _resolver(args, static)
    if resolver is not static:
        _runtime_imports(resolver, against, reads)
    targets = _targets(args, static, overrides, against, reads.text)
    note = _nothing_imports(args, static, against, reads.text) if not targets and not args.get("targets") else None
    only = _only_symbols(args, static, against)
    findings, unknown, checked, trace, touches = _analyse(args, targets, overrides, against, reads.text, resolver,
                                                          static, only)
    findings.sort(key=lambda f: (f["path"], f["line"], f["col"], f["kind"], f["name"] or ""))
    pkgs = sorted(set(against) | {t.split(".")[0] for t, _ in targets})
    extra = {}
    if args.get("drift"):
        package = (args.get("package") or DEFAULT_PACKAGE) if not args.get("targets") else \
            (targets[0][0] if targets else "")
        _mark_own_methods(static, package.split(".")[0], touches, overrides)
        extra = {"touches": touches,
                 "declared": declared_requirements(package.split(".")[0], against, sys_path, reads)}
    return {"mode": getattr(resolver, "mode", "static"), "python": sys.executable,
            "versions": versions(pkgs, sys_path, reads),
            "targets": [{"module": m, "path": p} for m, p in targets],
            "findings": findings, "unknown": unknown, "calls_checked": checked,
            **({"note": note} if note else {}),
            **({"only_unmatched": [x for x in only.spellings if x not in only.hit]} if only else {}),
            **({"trace": trace} if args.get("trace") else {}), **extra}


def _runtime_imports(resolver, against, reads):
    """Runtime mode: every library imported in this process, or the failure that says which cannot be."""
    reads.not_replayable("runtime mode imports the library")
    for lib in against:
        e = resolver.module(lib)
        if e.kind == "unknown":
            raise AgentFailure("runtime-import-failed", "--runtime cannot import %s on this host: %s" % (lib, e.reason),
                               "run the static check (the default), or install %s's dependencies "
                               "into the host's environment" % lib)


def _targets(args, static, overrides, against, _read):
    """The caller modules: the files that will actually run on this host, [(module, path)]."""
    targets = []
    if args.get("targets"):
        for mod in args["targets"]:
            spec = static.find_spec(mod)
            if spec is None and mod not in overrides:
                raise AgentFailure("missing-target", "module %r is not installed for %s" % (mod, sys.executable),
                                   "check the target name and the host's python")
            path = spec.origin if spec is not None else "<override %s>" % mod
            targets.append((mod, path))
        return targets
    package = args.get("package") or DEFAULT_PACKAGE
    for mod, path in _package_modules(static, package):
        text = overrides.get(mod)
        if text is None:
            try:
                text = _read(path)
            except (OSError, UnicodeDecodeError, ValueError):
                targets.append((mod, path))     # reported as unreadable below, not skipped
                continue
        if callsites.imports_library(text, against):
            targets.append((mod, path))
    return targets


def _nothing_imports(args, static, against, _read):
    """The note when no module of the package imports the libraries (and which elsewhere in it do)."""
    package = args.get("package") or DEFAULT_PACKAGE
    top = package.split(".")[0]
    elsewhere = []
    if top != package:
        for mod, path in _package_modules(static, top):
            try:
                text = _read(path)
            except (OSError, UnicodeDecodeError, ValueError):
                continue
            if any(lib in text for lib in against) and callsites.imports_library(text, against):
                elsewhere.append(mod)
    note = "no module of %s imports %s: nothing was checked" % (package, ", ".join(against))
    if elsewhere:
        note += " (modules elsewhere in %s that do: %s; name them with targets)" % (
            top, ", ".join(elsewhere[:5]))
    else:
        note += " (no module of %s imports it at all)" % top
    return note


def _only_symbols(args, static, against):
    """The SymbolMatcher of ``only_symbols`` (None without), refused when a spelling names nothing."""
    if not args.get("only_symbols"):
        return None
    only = SymbolMatcher(static, args["only_symbols"])
    if only.unresolved():
        raise AgentFailure("bad-args", "only_symbols: %s name(s) nothing in the installed %s" % (
            ", ".join(only.unresolved()), ", ".join(against)),
            "spell each symbol by a module that defines or imports it")
    return only


def _analyse(args, targets, overrides, against, _read, resolver, static, only):
    """Each target's call sites analysed: (findings, unknown, calls checked, trace, drift touches)."""
    findings, unknown, checked, trace, touches = [], [], 0, [], []
    for mod, path in targets:
        text = overrides.get(mod)
        if text is None:
            try:
                text = _read(path)
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                unknown.append({"path": path, "line": 0, "module": mod, "symbol": None,
                                "reason": "cannot read: %s" % exc})
                continue
        a = callsites.Analysis(resolver, mod, path, text, against, suggester=static)
        if args.get("drift"):
            a.touches = []
        a.only = only
        try:
            a.run()
        except RecursionError:
            a.unknown.append({"path": path, "line": 0, "module": mod, "symbol": None,
                              "reason": "analysis gave up on this module: the code nests too deeply"})
        except Exception as exc:  # the rest of the modules are still checked; say what failed
            a.unknown.append({"path": path, "line": 0, "module": mod, "symbol": None,
                              "reason": "analysis error in this module (%s: %s)" % (
                                  type(exc).__name__, str(exc)[:120])})
        findings += a.findings
        unknown += a.unknown
        if a.touches:
            touches += a.touches
        checked += a.calls_checked
        if args.get("trace"):
            trace += [dict(c, module=mod) for c in a.checked]
    return findings, unknown, checked, trace, touches


def _mark_own_methods(static, top, touches, overrides):
    """Dispatcher names that the package defines itself (a worker extension's method, say)."""
    wanted = {t["dispatch"] for t in touches if t.get("dispatch")}
    if not wanted or not top:
        return
    own = set()
    texts = list(overrides.values())
    try:
        mods = _package_modules(static, top)
    except AgentFailure:
        mods = []
    for mod, path in mods:
        if mod in overrides:
            continue
        try:
            texts.append(static.reads.text(path))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
    for text in texts:
        for name in wanted:
            if ("def " + name + "(") in text:
                own.add(name)
    for t in touches:
        if t.get("dispatch"):
            t["package_defines"] = t["dispatch"] in own


def declared_requirements(package, libs, sys_path, reads=None):
    """{lib: {"spec": "==0.11.0", "version": "0.11.0" or None, "extra": ...}} from the installed
    package's metadata (Requires-Dist), read without importing anything."""
    import importlib.metadata as md

    reads = reads or Reads()
    out = {}
    try:
        found = reads.distribution(package, sys_path)
        if found is not None:   # the one distribution, not a scan of every installed one
            import pathlib
            # what PathDistribution reads (an .egg-info may be one file: it is then read itself)
            for path in [found[1]] + [os.path.join(found[1], n) for n in ("METADATA", "PKG-INFO", "requires.txt")]:
                try:
                    reads.data(path)
                except OSError:
                    pass
            dists = [md.PathDistribution(pathlib.Path(found[1]))]
        else:
            reads.not_replayable("%s is found only by importlib.metadata's scan" % package)
            dists = [d for d in md.distributions(path=list(sys_path))
                     if _norm(d.metadata.get("Name") or "") == _norm(package)]
    except Exception as exc:  # a broken dist-info: say so, drift runs without a baseline
        return {"_error": "%s: %s" % (type(exc).__name__, exc)}
    if not dists:
        return {}
    for req in dists[0].requires or []:
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*\(?([^;)]*)\)?\s*(?:;(.*))?$", req)
        if not m:
            continue
        name = _norm(m.group(1))
        for lib in libs:
            if _norm(lib) == name and lib not in out:
                spec = m.group(3).strip()
                pin = re.fullmatch(r"===?\s*([0-9][A-Za-z0-9.+!\-]*)", spec)
                extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)", m.group(4) or "")
                out[lib] = {"spec": spec, "version": pin.group(1) if pin else None,
                            "extra": extra.group(1) if extra else None,
                            "package": "%s %s" % (package, dists[0].version)}
    return out
