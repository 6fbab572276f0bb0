"""Static evidence for a playbook's `requires` range: patch + check on the real wheels of each release.

For every vLLM release given, builds a host environment from the real PyPI wheels (speculators
copied so it can be patched, vLLM's sources linked read-only; nothing imported), then runs
remote-ops itself over a local connection: `patch --yes`, `check --strict` (binding findings and
drift against the package's declared baseline, minus the playbook's accepted drift), and a second
`patch` (must change nothing). Writes a JSON record per release and a markdown table.

    python benchmarks/evidence/playbook_evidence.py --playbook playbooks/eagle3-speculators-0.3.0.yaml --vllm all \\
        --json benchmarks/results/playbook_evidence.json
    python benchmarks/evidence/playbook_evidence.py --records benchmarks/results/playbook_evidence.json \\
        --runtime benchmarks/results/runtime_sample_0.16.0_0.25.0.json,benchmarks/results/runtime_sample_0.25.0_pinned.json,benchmarks/results/runtime_sample_0.32.0.json \\
        > benchmarks/PLAYBOOK_EVIDENCE.md

(``--vllm all`` is every final release from the playbook's lowest covered one to the first past its range;
``--records FILE`` prints the report of an earlier run's --json again, e.g. once the runtime sample is in.)

This is the static half of the evidence (what binds, what drifted); what only a GPU shows is in
benchmarks/GPU_RESULTS.md (benchmarks/gpu/extract_check.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import provenance  # noqa: E402
from remote_ops import pkgsource  # noqa: E402

from remote_ops.playbook import loader as playbook  # noqa: E402


def ro(inv: Path, *args: str) -> tuple[int, dict | None, str]:
    p = subprocess.run([sys.executable, "-m", "remote_ops", "-i", str(inv), *args], capture_output=True,
                       text=True, cwd=REPO, timeout=600)
    try:
        doc = json.loads(p.stdout) if p.stdout.strip() else None
    except ValueError:
        doc = None
    return p.returncode, doc, p.stderr.strip()


def one(version: str, pb_path: Path, speculators: str, tmp: Path) -> dict:
    t0 = time.monotonic()
    try:
        python = pkgsource.make_env(tmp / f"env-{version}" / "venv", [("speculators", speculators), ("vllm", version)])
    except Exception as exc:   # a release whose wheel cannot be had is reported, not skipped silently
        return {"vllm": version, "error": f"{type(exc).__name__}: {exc}"}
    inv = tmp / f"inv-{version}.yaml"
    inv.write_text(json.dumps({"hosts": {"h": {"connection": "local", "python": str(python),
                                                "playbook": str(pb_path),
                                                "env": {"REMOTE_OPS_STATE_DIR": str(tmp / f"state-{version}")}}}}))
    before_rc, before, _ = ro(inv, "check", "h", "--json")
    patch_rc, patch, patch_err = ro(inv, "patch", "h", "--yes", "--json")
    check_rc, check, check_err = ro(inv, "check", "h", "--strict", "--json")
    again_rc, again, _ = ro(inv, "patch", "h", "--yes", "--json")
    rec = {
        "vllm": version, "speculators": speculators,
        "before": {"rc": before_rc, "findings": len((before or {}).get("findings") or []),
                   "drift": sorted(f"{d['kind']} {d['name']}" for d in (before or {}).get("drift") or [])},
        "patch": {"rc": patch_rc, "changed": (patch or {}).get("changed"),
                  "edits": {e.get("edit"): e.get("state") for e in (patch or {}).get("edits") or []},
                  "verification": ((patch or {}).get("verification") or {}).get("line"),
                  "error": None if patch_rc == 0 else [ln.removeprefix("remote-ops: ") for ln in patch_err.splitlines()[-1:]]},
        "after": {"rc": check_rc,
                  "findings": [f"{f['kind']} {f.get('symbol')} {f.get('name')}" for f in (check or {}).get("findings") or []],
                  "drift": [f"{d['kind']} {d.get('symbol')} {d.get('name')}" for d in (check or {}).get("drift") or []],
                  "accepted": sorted(d["name"] for d in (check or {}).get("drift_accepted") or []),
                  "accepted_unmatched": sorted(a["name"] for a in (check or {}).get("accepted_unmatched") or []),
                  "unknown": len((check or {}).get("unknown") or []),
                  "baseline": ((check or {}).get("baseline") or {}).get("version"),
                  "error": None if check is not None else check_err.splitlines()[-1:]},
        "rerun_changed": (again or {}).get("changed") if again_rc == 0 else f"exit {again_rc}",
        "seconds": round(time.monotonic() - t0, 1),
    }
    rec["clean"] = (patch_rc == 0 and check_rc == 0 and not rec["after"]["findings"] and not rec["after"]["drift"]
                    and rec["rerun_changed"] is False)
    return rec


def in_range(pb) -> list[str]:
    """Every final vLLM release the playbook's requires covers, plus the first one past it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    spec = SpecifierSet(pb.requires["vllm"])
    out, past = [], None
    for v in pkgsource.releases("vllm"):
        if Version(v) in spec:
            out.append(v)
        elif out and past is None:
            past = v
    return out + ([past] if past else [])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--playbook", default=str(REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"))
    ap.add_argument("--vllm", help="comma list of vLLM releases, or all (the playbook's range + the first past it)")
    ap.add_argument("--records", help="instead of running: the records of an earlier run (its --json)")
    ap.add_argument("--speculators", default="0.3.0")
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--runtime", help="append the runtime sample from these JSON files, comma-separated "
                                      "(benchmarks/evidence/runtime_sample.py)")
    args = ap.parse_args(argv)
    pb_path = Path(args.playbook).resolve()
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    code_rev = rev.stdout.strip() if rev.returncode == 0 else None
    pb = playbook.load(pb_path)
    records = []
    if args.records:   # print the report of an earlier run (its --json) again, e.g. with --runtime added
        saved = json.loads(Path(args.records).read_text())
        records, code_rev = saved["records"], saved["code_rev"]
    else:
        wanted = in_range(pb) if args.vllm == "all" else [x.strip() for x in args.vllm.split(",") if x.strip()]
        with tempfile.TemporaryDirectory(prefix="ro-evidence-") as tmp:
            for v in wanted:
                records.append(one(v, pb_path, args.speculators, Path(tmp)))
                print(f"{v}: {'clean' if records[-1].get('clean') else 'NOT clean'}", file=sys.stderr)
    if args.json and not args.records:
        Path(args.json).write_text(json.dumps({"written_by": provenance.written_by(__file__, code_rev),
                                               "playbook": pb_path.name, "requires": pb.requires, "code_rev": code_rev,
                                               "records": records}, indent=2) + "\n")
    print(f"# Static evidence for {pb_path.name}\n")
    print(f"Generated by `python benchmarks/evidence/playbook_evidence.py` (see its docstring for the exact command). "
          f"The playbook's requires: `{json.dumps(pb.requires)}`. Per release: the real wheels, `patch --yes`, "
          f"`check --strict` over a local connection, then `patch` again. remote-ops commit {code_rev}. "
          f"These hosts hold only the speculators and vLLM sources (nothing imported, no transformers): an edit "
          f"conditioned on another distribution (`when: {{transformers: ...}}`) is not for them; the runtime "
          f"sample below, on real installs, exercises it.\n")
    print("| vLLM | before: findings / drift | patch | edits applied / not for this version | after: findings | "
          "after: drift | accepted drift | rerun changed | clean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in records:
        if "error" in r:
            print(f"| {r['vllm']} | wheel not available: {r['error'][:80]} | | | | | | | no |")
            continue
        b, a, p = r["before"], r["after"], r["patch"]
        states = list(p["edits"].values())
        skipped = [e for e, st in p["edits"].items() if st == "not-applicable"]
        edits = f"{sum(st in ('pending', 'applied') for st in states)} / {len(skipped)}" + (
            f" ({', '.join(skipped)})" if skipped else "") if states else "-"
        outcome = f"exit {p['rc']}" + (f": {' '.join(p['error'])}" if p.get("error") else "")
        print(f"| {r['vllm']} | {b['findings']} / {len(b['drift'])} | {outcome} | {edits} | "
              f"{len(a['findings'])} {'; '.join(a['findings'])} | {len(a['drift'])} {'; '.join(a['drift'])} | "
              f"{len(a['accepted'])} | {r['rerun_changed']} | {'yes' if r['clean'] else 'no'} |")
    clean = [r["vllm"] for r in records if r.get("clean")]
    print(f"\nClean after the patch: {', '.join(clean) if clean else 'none'}.")
    if args.runtime:
        runtime_section([Path(x) for x in args.runtime.split(",")])
    return 0


def runtime_section(paths: list[Path]) -> None:
    """The runtime sample (benchmarks/evidence/runtime_sample.py's JSON files): per release, whether a real install
    was possible here and, where it was, the patched generator's import and `check --runtime`."""
    docs = [json.loads(p.read_text()) for p in paths]
    print("\n## Runtime sample\n")
    for p, doc in zip(paths, docs):
        print(f"- `{doc.get('command')}` ({p.name}, remote-ops commit {doc.get('code_rev')}, {doc.get('when')}): "
              f"{doc.get('summary')}")
    print("\n| vLLM | installed | patch --import-check | patched generator imports | check --runtime --strict | detail |")
    print("|---|---|---|---|---|---|")
    for doc in docs:
        for r in doc.get("records") or []:
            p = r.get("patch") or {}
            states = list((p.get("edits") or {}).values())
            patch = (f"exit {p.get('rc')}: {sum(s == 'pending' for s in states)} applied, "
                     f"{states.count('not-applicable')} not for this version" if p else "-")
            if p.get("error"):
                patch += f" ({p['error']})"
            print(f"| {r['vllm']} | {r.get('installed')} | {patch} | {r.get('imports', '-')} | "
                  f"{r.get('runtime_check', '-')} | {str(r.get('detail') or '').replace('|', '/')[:300]} |")


if __name__ == "__main__":
    sys.exit(main())
