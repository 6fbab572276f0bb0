"""README's "Which playbook for which versions" table, rendered from the evidence JSON (not by hand).

Rows: every vLLM release from 0.16.0 to 0.33.0 that the evidence holds. Columns: speculators 0.3.0
(the in-process flow, benchmarks/results/playbook_evidence.json: patch + check --strict per release)
and speculators 0.9.0 (the server flow, benchmarks/results/server_flow_evidence.json: the agent op
serverflow.check per release and playbook). A cell says applies (the playbook), refused (why), or
untested (the evidence has no record of that release).

    python benchmarks/render/versions_table.py            # print the table
    python benchmarks/render/versions_table.py --write    # replace the table in README.md (between its markers)

tests/project/test_versions_table.py checks that README.md holds exactly what this renders.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.render import readme_section  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK_EVIDENCE = REPO / "benchmarks" / "results" / "playbook_evidence.json"
SERVER_EVIDENCE = REPO / "benchmarks" / "results" / "server_flow_evidence.json"
README = REPO / "README.md"
START, END = "<!-- versions-table: start (benchmarks/render/versions_table.py --write) -->", "<!-- versions-table: end -->"
FIRST, LAST = (0, 16, 0), (0, 33, 0)


def _v(s: str) -> tuple:
    return tuple(int(x) for x in s.split("."))


def cell_030(rec: dict | None) -> str:
    if rec is None:
        return "untested"
    if str(rec.get("clean")) == "True":
        return "applies (`eagle3-speculators-0.3.0`: patched, check --strict clean)"
    err = " ".join(rec.get("patch", {}).get("error") or []) if isinstance(rec.get("patch"), dict) else str(rec.get("patch"))
    m = re.search(r"\(there: ([^)]*)\)", err)
    why = m.group(1) if m else (err.split(": ", 1)[-1][:160] or "not clean after the patch")
    return f"refused ({why})"


def cell_090(version: str, doc: dict) -> str:
    row = next((r for r in doc["vllm"] if r["version"] == version), None)
    if row is None:
        return "untested"
    for c in doc["claims"]:
        if version in c["claimed_and_checked"] and row["playbooks"][c["playbook"]]["ok"]:
            return f"applies (`{c['playbook']}`: every check holds)"
    main = doc["claims"][0]["playbook"]
    failed = [f.get("detail") or f["what"] for f in row["playbooks"][main]["failed"]]
    why = "; ".join(failed[:2]) + (f"; {len(failed) - 2} more" if len(failed) > 2 else "")
    return f"refused ({why or 'no playbook claims it'})"


GPU_CONTROL = REPO / "benchmarks" / "results" / "gpu_logits_tp1.json"
SHORT = {"prefix-caching": ("#44485", "prefix caching off"), "abort-safe": ("#56841", "client --request-timeout 86400"),
         "mla-tp-page-size": ("#51016", "MLA at TP > 1: check says"), "mla-kv-groups": ("MLA KV groups", "at TP > 1: check says"),
         "last-chunk": ("last chunk", "chunked prefill off")}


def gpu_prefix_control(path: Path = GPU_CONTROL) -> dict | None:
    """The GPU run of the server flow WITHOUT --no-enable-prefix-caching (benchmarks/gpu/logits_check.py --control): its
    vLLM version, vectors checked and those >= 0.999, or None when there is none."""
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    c = (d.get("steps") or {}).get("control_prefix_caching_on") or {}
    out = next(iter((((c.get("compare") or {}).get("result") or {}).get("outputs") or {}).values()), None)
    if not out or c.get("no_enable_prefix_caching") is not False:
        return None
    return {"vllm": ((d.get("versions") or {}).get("server") or {}).get("vllm"), "n_total": out.get("n_total"),
            "n_ok": out.get("n_within_0_999"), "short_files": (c.get("verify") or {}).get("inconsistent_count"),
            "file": path.name}


def cell_guards(version: str, sf: dict, gpu: dict | None = None) -> str:
    """vLLM's own bugs the server flow guards on this release (server_flow_evidence.json's guards: the check
    without the shipped guard), and the last aux layer of DeepSeek/Kimi not captured (#46973)."""
    row = next((r for r in sf["vllm"] if r["version"] == version), None)
    if row is None or not row.get("guards"):
        return "-"
    parts = []
    for cid, g in row["guards"].items():
        num, guard = SHORT.get(cid, (cid, ""))
        if g.get("ok") is False:
            parts.append(f"{num} bug: {guard}")
        elif g.get("ok") is None and cid in ("prefix-caching",):
            seen = ""
            if gpu and gpu.get("vllm") == version and gpu.get("n_total"):
                seen = (f", harmless on the GPU: {gpu['n_ok']}/{gpu['n_total']} vectors >= 0.999, "
                        f"{gpu['short_files']} short files ({gpu['file']})")
            parts.append(f"{num} undecided{seen}: {guard}")
        elif g.get("ok") is None:
            parts.append(f"{num} undecided ({guard})")
    ds = (row.get("aux_capture") or {}).get("deepseek_v2")
    if isinstance(ds, dict) and not ds.get("last_id"):
        parts.append("#46973 id n not captured on DeepSeek/Kimi: preflight refuses it")
    return "; ".join(parts) or "none"


def render(pe: dict, sf: dict) -> str:
    by_030 = {r["vllm"]: r for r in pe["records"]}
    versions = sorted({v for v in list(by_030) + [r["version"] for r in sf["vllm"]] if FIRST <= _v(v) <= LAST},
                      key=_v)
    gpu = gpu_prefix_control()
    lines = ["| vLLM | speculators 0.3.0 (in-process, patched) | speculators 0.9.0 (server flow) | vLLM bugs the server "
             "flow guards |", "|---|---|---|---|"]
    for v in versions:
        lines.append(f"| {v} | {cell_030(by_030.get(v))} | {cell_090(v, sf)} | {cell_guards(v, sf, gpu)} |")
    lines += ["", f"Rendered by `python benchmarks/render/versions_table.py` from the static evidence "
              f"(PLAYBOOK_EVIDENCE.md, remote-ops commit {pe.get('code_rev', '?')}; SERVER_FLOW_EVIDENCE.md, "
              f"{sf.get('generated_at', '?')}). Static: the real sources of each release, nothing run on a GPU; "
              "the GPU runs (vLLM 0.20.0) are in benchmarks/GPU_RESULTS.md. Guarded bugs: SERVER_FLOW_EVIDENCE.md's "
              "checks without the shipped guard (bug: the release has it; undecided: its source does not tell), "
              "and check/extract's refusal of aux id n where DeepSeek-V2/V3's forward does not capture it."]
    return "\n".join(lines)


def load() -> tuple[dict, dict]:
    return json.loads(PLAYBOOK_EVIDENCE.read_text()), json.loads(SERVER_EVIDENCE.read_text())


def readme_table(text: str) -> str | None:
    return readme_section.read(text, START, END)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="replace the table in README.md")
    args = ap.parse_args(argv)
    table = render(*load())
    if not args.write:
        print(table)
        return 0
    text = readme_section.replace(README.read_text(), START, END, table)
    if text is None:
        sys.stderr.write(f"README.md has no {START} ... {END} markers\n")
        return 1
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
