"""`compat.check` over a matrix of real speculators x vLLM wheels from PyPI.

    python benchmarks/check_matrix.py [--out benchmarks/CHECK_MATRIX.md] [--json FILE] [--only SPEC:VLLM,...]

Each pair is unpacked (``remote_ops.pkgsource.unpacked``: ``pip download --no-deps``, cached under
~/.cache/remote-ops) and checked in-process with the agent op ``compat.check`` in static mode,
``sys_path`` = [speculators sources, vLLM sources], default targets (the modules of
``speculators.data_generation`` that import vllm). A fresh resolver per run (no cache between
pairs); the time is the op's own ``elapsed_s`` (median of 3). Records per pair: findings (symbol,
kind, name, line), calls checked, unknowns (with reasons), crash (op raised), time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from remote_ops import pkgsource  # noqa: E402
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
    return rec


VERIFIED = """## Findings verified against the vLLM sources (by reading them)

- missing-symbol `vllm.v1.core.kv_cache_utils.{get_kv_cache_config_from_groups,
  _get_kv_cache_groups_uniform_spec}` on 0.10.2: not defined anywhere in vLLM 0.10.2 (they appear
  in 0.11.0); on 0.33.0 these and `unify_hybrid_kv_cache_specs` moved to
  `vllm/v1/core/kv_cache_planning.py` (top-level defs; kv_cache_utils has no `__getattr__` or
  re-export); the finding's fix points there.
- unexpected-keyword `kv_cache_specs` (0.12.0-0.25.0): `get_kv_cache_config_from_groups(vllm_config,
  kv_cache_groups, available_memory[, suppress_log])`.
- missing-argument `block_size` (0.12.0 on): `Scheduler.__init__(vllm_config, kv_cache_config,
  structured_output_manager, block_size: int, ...)`, no default.
- missing-argument `is_encoder_decoder` (0.12.0 on): `@config class SchedulerConfig` has
  `is_encoder_decoder: InitVar[bool]` with no default (0.33.0 adds a `default_factory` staticmethod
  that fills it, but the plain constructor the caller uses still requires it).
- unexpected-keyword `eos_token_id` (0.17.0 on): `Request.__init__` no longer takes it (0.17.0 keeps a
  deprecated property only).
- speculators 0.5.0, 0.7.0, 0.9.0 declare no vllm requirement and no module of theirs imports vllm
  (they drive a vLLM server over HTTP, `data_generation/vllm_client.py`): nothing to bind; the op
  says so in its `note`.

Times are on a shared 2-vCPU machine; most of a run is `ast.parse` of the ~15 vLLM modules the
calls reach, plus one read of the vLLM package when a symbol is missing (to say where it moved)."""


def render(records: list[dict]) -> str:
    lines = ["# `remote-ops check` over real speculators x vLLM wheels", "",
             "Produced by `python benchmarks/check_matrix.py` (static mode, default targets: the modules of",
             "`speculators.data_generation` that import vllm; in-process `compat.check`, median of 3 runs,",
             "%s, Python %s)." % (platform.machine(), platform.python_version()), "",
             "| speculators | vLLM | targets | calls checked | findings | unknown | time (s) |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        if "crash" in r:
            lines.append("| %s | %s | - | - | CRASH | - | - |" % (r["speculators"], r["vllm"]))
            continue
        lines.append("| %s | %s | %d | %d | %d | %d | %.3f |" % (
            r["speculators"], r["vllm"], len(r["targets"]), r["calls_checked"], len(r["findings"]),
            len(r["unknown"]), r["time_s"]))
    lines += ["", VERIFIED, "", "## Per pair", ""]
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
            lines += ["| line | symbol | kind | name |", "|---|---|---|---|"]
            for f in r["findings"]:
                lines.append("| %s:%d | `%s` | %s | %s |" % (f["module"].rsplit(".", 1)[-1], f["line"], f["symbol"],
                                                         f["kind"], f["name"] or ""))
            lines.append("")
        else:
            lines += ["No findings.", ""]
        if r["unknown"]:
            lines.append("Unknown:")
            for u in r["unknown"]:
                lines.append("- %s:%d `%s`: %s" % (u["module"].rsplit(".", 1)[-1], u["line"], u["symbol"], u["reason"]))
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
        status = r.get("crash") or "%d findings, %d unknown, %d calls, %.3fs" % (
            len(r["findings"]), len(r["unknown"]), r["calls_checked"], r["time_s"])
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
