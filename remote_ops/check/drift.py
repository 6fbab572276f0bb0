"""Drift, controller side: the baseline's sources and the comparison with what the host reported.

The host's ``compat.check`` (with ``drift``) returns the package's *touches* of the library, each
with the installed version's facts, and the package's declared requirement. Here the baseline
version is chosen (``--baseline VERSION|PATH``, else the package's own pin, e.g. speculators
0.3.0's ``vllm==0.11.0``), its sources are fetched once (``pkgsource``: the wheel, no deps,
cached) and the same static resolver (``agent/resolve/resolver.py``) computes the baseline's facts;
``agent/drift/compare.py`` compares. Nothing is imported on either side.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from remote_ops.agent.drift import compare as drift_compare, facts as drift_facts, scan as drift_scan
from remote_ops.check import baseline_memo
from remote_ops.agent.resolve.resolver import StaticResolver


# A fleet checks its hosts in threads; CPython's ast module is not safe to drive from several
# threads at once (3.11: "AST constructor recursion depth mismatch"), so the baseline analysis,
# which parses on the controller, runs one host at a time.
_PARSE_LOCK = threading.Lock()


def baseline_source(lib: str, arg: str | None, declared: dict) -> dict:
    """{"library", "version", "path", "source"} or {"library", "unavailable": reason}."""
    from remote_ops import pkgsource
    from remote_ops.errors import RemoteOpsError

    if arg:
        p = Path(arg).expanduser()
        if p.exists():
            root = p
            if (p / lib).is_dir() is False and p.name == lib and p.is_dir():
                root = p.parent
            if not (root / lib).exists():
                return {"library": lib, "unavailable": f"--baseline {arg}: no {lib}/ package in that directory"}
            return {"library": lib, "version": _dist_version(root, lib) or str(root), "path": str(root),
                    "source": f"--baseline {arg}"}
        version, source = arg, f"--baseline {arg}"
    else:
        d = (declared or {}).get(lib) or {}
        version = d.get("version")
        if not version:
            if d.get("spec"):
                return {"library": lib, "unavailable": f"{d.get('package')} requires {lib}{d['spec']}, not one "
                                                       f"version: pass --baseline VERSION"}
            return {"library": lib, "unavailable": f"the package declares no {lib} version: pass --baseline "
                                                   f"VERSION|PATH"}
        source = f"declared by {d.get('package')} ({lib}=={version}" + (
            f", extra {d['extra']})" if d.get("extra") else ")")
    try:
        path = pkgsource.unpacked(lib, version)
    except RemoteOpsError as exc:
        return {"library": lib, "unavailable": f"cannot fetch {lib} {version} sources: {exc}"}
    return {"library": lib, "version": version, "path": str(path), "source": source}


def _library_of(touch: dict) -> str:
    if touch.get("library"):
        return touch["library"]
    if touch.get("symbol"):
        return touch["symbol"].split(".")[0]
    access = touch.get("access") or [[None, ""]]
    return str(access[0][1]).split(".")[0]


def _dist_version(root: Path, lib: str) -> str | None:
    for d in root.glob(f"{lib.replace('-', '_')}-*.dist-info"):
        return d.name[len(lib) + 1:-len(".dist-info")]
    return None


def analyse(raw: dict, against: list[str], baseline_arg: str | None) -> dict:
    """{"drift": [...], "baseline": {...}, "drift_notes": [...]} for the host's answer ``raw``."""
    t0 = time.perf_counter()
    touches = raw.get("touches")
    if touches is None:
        return {"drift": [], "drift_notes": [], "baseline": {"unavailable": "the host did not report touches"}}
    out_drift, notes, bases = [], [], []
    versions = raw.get("versions") or {}
    for lib in against:
        mine = [t for t in touches if _library_of(t) == lib]
        b = baseline_source(lib, baseline_arg, raw.get("declared") or {})
        bases.append(b)
        if "unavailable" in b:
            continue
        kept = baseline_memo.entry(b, mine)
        facts = baseline_memo.get(kept)
        with _PARSE_LOCK:
            static = StaticResolver([b["path"]])
            if facts is None:
                # as JSON, as the host's facts arrive and as a kept copy is read back: one shape
                facts = json.loads(json.dumps(drift_facts.replay_facts(static, mine, [b["path"]]), default=str))
                baseline_memo.put(kept, facts)
            _baseline_locations(static, raw, lib, b)
        d, n = drift_compare.compare(mine, facts, (b["version"], versions.get(lib) or "installed"))
        out_drift += d
        notes += n
    base = bases[0] if len(bases) == 1 else {"libraries": bases}
    base = dict(base, elapsed_s=round(time.perf_counter() - t0, 4))
    return {"drift": out_drift, "drift_notes": notes, "baseline": base}


def apply_accepted(result: dict, accepted: list[dict] | None) -> dict:
    """Move drift items a playbook accepted (``check.accepted_drift``, matched on kind, symbol and
    name) from ``drift`` to ``drift_accepted``, each with its reason; entries that matched nothing
    are listed in ``accepted_unmatched`` (a stale review is said, not silently kept)."""
    if not accepted:
        return result
    keep, taken, used = [], [], set()
    for d in result.get("drift") or []:
        hit = next((i for i, a in enumerate(accepted)
                    if (a["kind"], a["symbol"], a["name"]) == (d.get("kind"), d.get("symbol"), d.get("name"))), None)
        if hit is None:
            keep.append(d)
        else:
            used.add(hit)
            taken.append(dict(d, accepted=accepted[hit]["why"]))
    result["drift"] = keep
    result["drift_accepted"] = taken
    result["accepted_unmatched"] = [a for i, a in enumerate(accepted) if i not in used]
    return result


def _baseline_locations(static: StaticResolver, raw: dict, lib: str, b: dict) -> None:
    """``missing-symbol`` findings gain where the baseline defined the symbol."""
    for f in raw.get("findings") or []:
        if f.get("kind") == "missing-symbol" and (f.get("symbol") or "").split(".")[0] == lib:
            mod, _, name = f["symbol"].rpartition(".")
            e = static.lookup(mod, name)
            f["baseline"] = {"version": b["version"],
                             "where": drift_scan._rel(e.where, [b["path"]]) if e.where else None,
                             "status": e.kind}


def explain(d: dict) -> str:
    """A drift record for people: where, what, both versions' locations, the fix."""
    b, i = d.get("baseline") or {}, d.get("installed") or {}
    lines = [f"{d['path']}:{d['line']}  {(d.get('call') or '')[:100]}".rstrip(),
             f"    {d['kind']}: {d['message']}"]
    if b.get("where") or i.get("where"):
        lines.append(f"    {b.get('version')}: {b.get('where') or '-'}   {i.get('version')}: {i.get('where') or 'gone'}")
    if d.get("suggestion"):
        lines.append(f"    fix:     {d['suggestion']}")
    return "\n".join(lines)


def inspect_diff(result: dict, baseline_arg: str) -> dict:
    """``inspect --baseline``: each symbol's signature in the baseline and what differs (parameters
    added/removed, defaults, return annotation), from the baseline's sources with the same resolver."""
    from remote_ops.agent import compat

    tops = sorted({s["symbol"].split(":", 1)[0].split(".")[0] for s in result.get("symbols") or []})
    out = {}
    for lib in tops:
        b = baseline_source(lib, baseline_arg, {})
        if "unavailable" in b:
            out[lib] = {"unavailable": b["unavailable"]}
            continue
        with _PARSE_LOCK:
            base = compat.op_inspect({"symbols": [s["symbol"] for s in result["symbols"]
                                                  if s["symbol"].split(".")[0] == lib], "sys_path": [b["path"]]})
        out[lib] = {"version": b["version"], "source": b["source"], "path": b["path"]}
        for cur, old in zip([s for s in result["symbols"] if s["symbol"].split(".")[0] == lib], base["symbols"]):
            cur["baseline"] = _diff_symbol(cur, old, b)
    return out


def _diff_symbol(cur: dict, old: dict, b: dict) -> dict:
    rec = {"version": b["version"], "kind": old.get("kind")}
    if "parameters" not in old:
        rec["reason"] = old.get("reason")
        return rec
    rec["signature"] = old.get("signature")
    rec["origin"] = drift_scan._rel(old.get("origin") or "", [b["path"]])
    if "parameters" not in cur:
        return rec
    was = {p["name"]: p for p in old["parameters"]}
    now = {p["name"]: p for p in cur["parameters"]}
    changes = []
    for n in was:
        if n not in now:
            changes.append(f"{n}: removed")
    for n, p in now.items():
        if n not in was:
            changes.append(f"{n}: added" + (" (required)" if p["required"] else f" (default {p['default']})"))
        elif (was[n]["default"] or "") != (p["default"] or "") and not drift_compare._same_default(
                was[n]["default"] or "", p["default"] or ""):
            changes.append(f"{n}: default {was[n]['default']} -> {p['default']}")
    if drift_facts.norm_annotation(old.get("returns")) != drift_facts.norm_annotation(cur.get("returns")):
        changes.append(f"returns: {old.get('returns')} -> {cur.get('returns')}")
    rec["changes"] = changes
    return rec
