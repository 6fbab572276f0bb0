"""`compat.check` over a matrix of real speculators x vLLM wheels from PyPI.

    python benchmarks/evidence/check_matrix.py [--out benchmarks/CHECK_MATRIX.md] [--json FILE] [--only SPEC:VLLM,...]

Each pair is unpacked (``remote_ops.pkgsource.unpacked``: ``pip download --no-deps``, cached under
~/.cache/remote-ops) and checked in-process with the agent op ``compat.check`` in static mode,
``sys_path`` = [speculators sources, vLLM sources], default targets (the modules of
``speculators.data_generation`` that import vllm). A fresh resolver per run (no cache between
pairs); the time is the op's own ``elapsed_s`` (median of 3). Records per pair: findings (symbol,
kind, name, line), calls checked, unknowns (with reasons), crash (op raised), time; and drift
against the vLLM version the speculators release pins in its metadata (``remote_ops.check.drift``: the
baseline's sources fetched once, analysed with the same static resolver), with its own time (check
with touches + baseline analysis, median of 3, warm wheel cache).

Every statement in the Markdown is generated from the records of the run (no fixed prose).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import provenance  # noqa: E402
from remote_ops import pkgsource  # noqa: E402

from remote_ops.check import drift  # noqa: E402
from remote_ops.agent.compat import op_check  # noqa: E402

SPEC_030_AGAINST = ["0.10.2", "0.11.0", "0.12.0", "0.13.0", "0.14.0", "0.15.0", "0.16.0", "0.17.0",
                    "0.18.0", "0.20.0", "0.25.0", "0.33.0"]
# speculators version -> vLLM versions (its pin or pin range ends, then the newest)
NEWER = {"0.4.0": ["0.12.0", "0.16.0", "0.33.0"], "0.5.0": ["0.33.0"], "0.7.0": ["0.33.0"],
         "0.9.0": ["0.33.0"]}
PINS = {}


def pairs():
    out = [("0.3.0", v) for v in SPEC_030_AGAINST]
    for s, vs in NEWER.items():
        out += [(s, v) for v in vs]
    return out


def pin_of(spec_dir: Path) -> str:
    for meta in spec_dir.glob("*.dist-info/METADATA"):
        reqs = [ln.split(":", 1)[1].strip() for ln in meta.read_text().splitlines()
                if ln.lower().startswith("requires-dist:") and ln.split(":", 1)[1].strip().lower().startswith("vllm")]
        return "; ".join(reqs) or "(no vllm requirement)"
    return "?"


def run_pair(spec: str, vllm: str, reps: int = 3) -> dict:
    rec = {"speculators": spec, "vllm": vllm}
    try:
        sdir = pkgsource.unpacked("speculators", spec)
        vdir = pkgsource.unpacked("vllm", vllm)
    except Exception as exc:
        rec["crash"] = "download: %s" % exc
        return rec
    rec["pin"] = pin_of(sdir)
    times, res = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        try:
            res = op_check({"sys_path": [str(sdir), str(vdir)]})
        except Exception as exc:
            rec["crash"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            rec["traceback"] = traceback.format_exc()
            return rec
        times.append(time.perf_counter() - t0)
    rec.update({
        "versions": res["versions"],
        "targets": [t["module"] for t in res["targets"]],
        "calls_checked": res["calls_checked"],
        "findings": [{"module": f["module"], "line": f["line"], "symbol": f["symbol"], "kind": f["kind"],
                      "name": f["name"], "signature": f.get("signature")} for f in res["findings"]],
        "unknown": [{"module": u["module"], "line": u["line"], "symbol": u["symbol"], "reason": u["reason"]}
                    for u in res["unknown"]],
        "time_s": round(statistics.median(times), 3),
        "note": res.get("note"),
    })
    dtimes, out = [], None
    for _ in range(reps):
        # every run computes the baseline's facts (no kept copy: remote_ops/check/baseline_memo.py),
        # as a first `check` against a release does
        kept = tempfile.TemporaryDirectory(prefix="cm-drift-")
        os.environ["REMOTE_OPS_DRIFT_CACHE"] = kept.name
        t0 = time.perf_counter()
        try:
            raw = op_check({"sys_path": [str(sdir), str(vdir)], "drift": True})
            out = drift.analyse(raw, ["vllm"], None)
        except Exception as exc:
            rec["drift_crash"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            rec["traceback"] = traceback.format_exc()
            return rec
        dtimes.append(time.perf_counter() - t0)
    where = {(f["line"], f["symbol"]): (f.get("baseline") or {}).get("where") for f in raw["findings"]}
    for f in rec["findings"]:
        if where.get((f["line"], f["symbol"])):
            f["baseline_where"] = where[(f["line"], f["symbol"])]
    rec.update({
        "baseline": {k: v for k, v in out["baseline"].items() if k != "path"},
        "drift": [{"module": d["module"], "line": d["line"], "symbol": d["symbol"], "kind": d["kind"],
                   "name": d["name"], "baseline": d["baseline"], "installed": _strip(d["installed"], vdir),
                   "suggestion": d["suggestion"]} for d in out["drift"]],
        "drift_notes": [n.replace(str(sdir) + "/", "") for n in out["drift_notes"]],
        "check_and_drift_s": round(statistics.median(dtimes), 3),
        "drift_baseline_s": out["baseline"].get("elapsed_s"),
    })
    return rec


def _strip(side: dict, root: Path) -> dict:
    out = dict(side)
    if isinstance(out.get("where"), str):
        out["where"] = out["where"].replace(str(root) + "/", "")
    return out


def _ranges(versions: list[str], seen: set[str]) -> str:
    """'0.12.0-0.25.0, 0.33.0' over the run's ordered versions."""
    runs, cur = [], []
    for v in versions:
        if v in seen:
            cur.append(v)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return ", ".join(r[0] if len(r) == 1 else "%s-%s" % (r[0], r[-1]) for r in runs)


def summary(records: list[dict]) -> list[str]:
    """Statements generated from the run: per distinct finding and drift item, the vLLM versions of
    this run where it was reported and what the analysed sources say there."""
    ok = [r for r in records if "crash" not in r and r["speculators"] == "0.3.0"]
    order = [r["vllm"] for r in ok]
    lines = ["## What this run found for speculators 0.3.0 (generated from the records below)", ""]
    if not ok:
        return lines + ["No speculators 0.3.0 pair ran.", ""]
    groups: dict = {}
    for r in ok:
        for f in r["findings"]:
            g = groups.setdefault((f["kind"], f["symbol"], f["name"]), {"versions": set(), "sigs": {}})
            g["versions"].add(r["vllm"])
            if f.get("signature"):
                g["sigs"].setdefault(f["signature"], set()).add(r["vllm"])
    lines.append("Binding findings (kind, callee, name: vLLM versions of this run where reported; the "
                 "installed signature the check bound against):")
    lines.append("")
    for (kind, symbol, name), g in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2] or "")):
        sig = "; ".join("`%s` (%s)" % (s, _ranges(order, vs)) for s, vs in g["sigs"].items())
        lines.append("- %s `%s` %s: %s%s" % (kind, symbol, "`%s`" % name if name else "",
                                             _ranges(order, g["versions"]), (". " + sig) if sig else ""))
    lines.append("")
    dgroups: dict = {}
    for r in ok:
        for d in r.get("drift") or []:
            g = dgroups.setdefault((d["kind"], d["symbol"], d["name"], d["module"], d["line"]),
                                   {"versions": set(), "values": {}})
            g["versions"].add(r["vllm"])
            key = "%s -> %s" % (d["baseline"].get("value") or d["baseline"].get("where"),
                                d["installed"].get("value") or d["installed"].get("successor") or "gone")
            g["values"].setdefault(key, set()).add(r["vllm"])
            g["base_where"] = d["baseline"].get("where")
            g["suggestion"] = d["suggestion"]
    bases = sorted({"%s (%s)" % (r["baseline"].get("version"), r["baseline"].get("source"))
                    for r in ok if r.get("baseline") and "unavailable" not in r["baseline"]})
    lines.append("Drift against the baseline %s, per item: call site, vLLM versions of this run where "
                 "reported, baseline -> installed, baseline location, suggested fix:" % ", ".join(bases))
    lines.append("")
    for (kind, symbol, name, module, line), g in sorted(dgroups.items(),
                                                         key=lambda kv: (kv[0][3], kv[0][4], kv[0][2] or "")):
        vals = "; ".join("%s (%s)" % (k, _ranges(order, vs)) for k, vs in g["values"].items())
        lines.append("- %s:%d %s `%s` %s: %s. %s. Baseline: %s. Fix: %s" % (
            module.rsplit(".", 1)[-1], line, kind, symbol, name or "", _ranges(order, g["versions"]), vals,
            g.get("base_where"), g.get("suggestion")))
    lines.append("")
    quiet = [r for r in records if "crash" not in r and not r["targets"]]
    for r in quiet:
        lines.append("- speculators %s x vLLM %s: %s." % (r["speculators"], r["vllm"], r.get("note")))
    if quiet:
        lines.append("")
    ts = [r["time_s"] for r in records if "crash" not in r]
    ds = [r["check_and_drift_s"] for r in records if "check_and_drift_s" in r]
    if ts:
        lines.append("Binding check time per pair in this run: %.3f-%.3f s; check with drift (touches on the "
                     "host side plus the baseline analysis): %s, on %s with %d CPU(s)." % (
                         min(ts), max(ts), ("%.3f-%.3f s" % (min(ds), max(ds))) if ds else "not run",
                         platform.machine(), os.cpu_count() or 0))
    return lines


def render(records: list[dict]) -> str:
    lines = ["# `remote-ops check` over real speculators x vLLM wheels", "",
             "Produced by `python benchmarks/evidence/check_matrix.py` on commit %s (static mode, default targets: the "
             "modules of" % (provenance.commit() or "not recorded"),
             "`speculators.data_generation` that import vllm; in-process `compat.check`, median of 3 runs,",
             "%s, Python %s)." % (platform.machine(), platform.python_version()), "",
             "| speculators | vLLM | targets | calls checked | findings | unknown | drift (baseline) "
             "| time (s) | with drift (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "crash" in r:
            lines.append("| %s | %s | - | - | CRASH | - | - | - | - |" % (r["speculators"], r["vllm"]))
            continue
        b = r.get("baseline") or {}
        if "drift_crash" in r:
            dcol = "CRASH"
        elif "unavailable" in b:
            dcol = "no baseline"
        else:
            dcol = "%d (%s)" % (len(r.get("drift") or []), b.get("version"))
        lines.append("| %s | %s | %d | %d | %d | %d | %s | %.3f | %s |" % (
            r["speculators"], r["vllm"], len(r["targets"]), r["calls_checked"], len(r["findings"]),
            len(r["unknown"]), dcol, r["time_s"],
            "%.3f" % r["check_and_drift_s"] if "check_and_drift_s" in r else "-"))
    lines += [""] + summary(records) + ["", "## Per pair", ""]

    for r in records:
        lines.append("### speculators %s x vLLM %s" % (r["speculators"], r["vllm"]))
        lines.append("")
        if "crash" in r:
            lines += ["CRASH: `%s`" % r["crash"], ""]
            continue
        lines.append("speculators requires: `%s`. Targets: %s." % (
            r.get("pin"), ", ".join("`%s`" % t for t in r["targets"]) or
            "none (no module of speculators.data_generation imports vllm: nothing to check)"))
        lines.append("")
        if r.get("note"):
            lines += ["Note from the check: %s." % r["note"], ""]
        if r["findings"]:
            lines += ["| line | symbol | kind | name | in the baseline |", "|---|---|---|---|---|"]
            for f in r["findings"]:
                lines.append("| %s:%d | `%s` | %s | %s | %s |" % (
                    f["module"].rsplit(".", 1)[-1], f["line"], f["symbol"], f["kind"], f["name"] or "",
                    f.get("baseline_where") or ""))
            lines.append("")
        else:
            lines += ["No findings.", ""]
        if r["unknown"]:
            lines.append("Unknown:")
            for u in r["unknown"]:
                lines.append("- %s:%d `%s`: %s" % (u["module"].rsplit(".", 1)[-1], u["line"], u["symbol"], u["reason"]))
            lines.append("")
        b = r.get("baseline") or {}
        if "drift_crash" in r:
            lines += ["Drift: CRASH `%s`" % r["drift_crash"], ""]
        elif "unavailable" in b:
            lines += ["Drift: no baseline (%s)." % b["unavailable"], ""]
        elif b:
            lines.append("Drift against vLLM %s (%s): %d item(s)." % (b.get("version"), b.get("source"),
                                                                      len(r.get("drift") or [])))
            lines.append("")
            if r.get("drift"):
                lines += ["| line | kind | symbol | name | baseline | installed | fix |",
                          "|---|---|---|---|---|---|---|"]
                for d in r["drift"]:
                    lines.append("| %s:%d | %s | `%s` | %s | %s %s | %s %s | %s |" % (
                        d["module"].rsplit(".", 1)[-1], d["line"], d["kind"], d["symbol"], d["name"] or "",
                        d["baseline"].get("value") or "", d["baseline"].get("where") or "",
                        d["installed"].get("value") or d["installed"].get("successor") or "",
                        d["installed"].get("where") or "gone", (d["suggestion"] or "").replace("|", "/")))
                lines.append("")
            if r.get("drift_notes"):
                lines.append("Differences seen and not reported as drift (the rule that set each aside):")
                for n in r["drift_notes"]:
                    lines.append("- %s" % n)
                lines.append("")

    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "CHECK_MATRIX.md"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None, help="comma list of SPEC:VLLM pairs")
    a = ap.parse_args(argv)
    todo = pairs()
    if a.only:
        todo = [tuple(p.split(":")) for p in a.only.split(",")]
    records = []
    for spec, vllm in todo:
        r = run_pair(spec, vllm)
        records.append(r)
        status = r.get("crash") or "%d findings, %d unknown, %d calls, %.3fs; drift %s, %.3fs with drift" % (
            len(r["findings"]), len(r["unknown"]), r["calls_checked"], r["time_s"],
            r.get("drift_crash") or (len(r["drift"]) if "drift" in r else "-"), r.get("check_and_drift_s") or 0)
        print("speculators %s x vllm %s: %s" % (spec, vllm, status), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(records, indent=1))
    if a.out and not a.only:
        Path(a.out).write_text(render(records))
    elif a.out and a.only and a.out != str(ROOT / "benchmarks" / "CHECK_MATRIX.md"):
        Path(a.out).write_text(render(records))
    return 1 if any("crash" in r for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
