"""GPU_RESULTS.md's section for benchmarks/gpu/logits_check.py (issue 50 items 5 and 1): every figure read from
the result JSON.

    python benchmarks/render/gpu_results.py > benchmarks/GPU_RESULTS.md     # calls render() for gpu_logits_*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import provenance  # noqa: E402

CASES = (("correct", "the run's files", "pass"), ("wrong-layer", "last tensor = decoder layer 5's output", "fail"),
         ("perturbed", "last tensor + noise of 10% of each row's RMS", "fail"),
         ("perturbed-small", "last tensor + noise of 2% of each row's RMS", "recorded"))


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def _num(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def render(path: Path) -> str:
    d = json.loads(Path(path).read_text())
    st = d.get("steps") or {}
    v = d.get("versions") or {}
    out = [f"## verify --logits on the GPU: {Path(path).name}\n",
           f"- written by {provenance.shown(d, 'benchmarks/gpu_logits_check.py')}; GPUs: {', '.join(d.get('gpus') or ['-'])}; wall time {d.get('elapsed_s')} s"]
    for k in ("models", "server", "client"):
        x = v.get(k) or {}
        if x:
            out.append(f"- {k} interpreter: vllm {x.get('vllm')}, speculators {x.get('speculators')}, torch "
                       f"{x.get('torch')}, transformers {x.get('transformers')}")
    ds = st.get("prefix_dataset") or {}
    if ds:
        out.append(f"- dataset (`--dataset prefix`): {ds.get('rows')} rows, {ds.get('tokens')} tokens, "
                   f"{ds.get('exact_duplicate_rows')} exact duplicate rows, {ds.get('rows_with_prefix_a_640')} rows "
                   f"sharing a 640-token prefix, {ds.get('rows_with_prefix_b_400')} a 400-token prefix")
    for m in ("deepseek_v3", "kimi_k25"):
        ex = st.get(f"extract_030-{m}") or {}
        if ex:
            out.append(f"- 0.3.0 flow on {m}, layer ids 1,3,5,7 (id 7: the output of the last of 8 decoder layers): "
                       f"exit {ex.get('rc')}, {ex.get('files')}/{ex.get('expected')} files, {ex.get('seconds')} s, "
                       f"verify exit {(ex.get('verify') or {}).get('rc')}")
    eng = (st.get("engines") or {}).get("engines") or {}
    for m, e in eng.items():
        out.append(f"- engine for {m}: `vllm serve` ({' '.join(map(str, (e.get('command') or [])[3:]))}), healthy "
                   f"{'after ' + str(e.get('after_s')) + ' s' if e.get('healthy') else 'NO'}")
    out.append("")
    first = ((st.get("logits_deepseek_v3") or {}).get("correct") or {}).get("logits") or {}
    out.append("Each row: `remote-ops verify HOST [--output-dir COPY] --logits 8 --logits-port P --json`; the last "
               "captured state through the checkpoint's final norm and lm_head, against the engine's prompt logprobs "
               f"(top {first.get('top_k')} and the prompt's token per position); the check's thresholds: top-1 >= "
               f"{_pct(first.get('min_top1'))} and mean |delta logprob| <= {first.get('max_mean_delta')}.\n")
    out.append("| model | files | expected | verify exit | logits ok | top-1 | mean abs delta logprob | positions | "
               "logprobs compared | without the norm: top-1 / mean abs delta | as expected |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    tensors = []
    for m in ("deepseek_v3", "kimi_k25"):
        s = st.get(f"logits_{m}") or {}
        for key, label, want in CASES:
            c = s.get(key)
            if not c:
                continue
            lg = c.get("logits") or {}
            wn = lg.get("without_norm") or {}
            as_expected = {"pass": lg.get("ok") is True and c.get("rc") == 0,
                           "fail": lg.get("ok") is False and c.get("rc") == 1}.get(want)
            out.append(f"| {m} | {label} | {want} | {c.get('rc')} | {'yes' if lg.get('ok') else 'NO'} | "
                       f"{_pct(lg.get('top1'))} | {_num(lg.get('mean_abs_delta'))} | {lg.get('positions')} | "
                       f"{lg.get('compared_logprobs')} | {_pct(wn.get('top1'))} / {_num(wn.get('mean_abs_delta'))} | "
                       f"{'-' if as_expected is None else ('yes' if as_expected else 'NO')} |")
        t = (s.get("correct") or {}).get("logits", {}).get("checkpoint_tensors") if s else None
        if t:
            tensors.append(f"- {m}: tensors read from the checkpoint: {t.get('norm')}, {t.get('lm_head')} (from "
                           f"{', '.join(t.get('files') or [])})")
    out += [""] + tensors + [""]
    c = st.get("control_prefix_caching_on") or {}
    if c.get("skipped"):
        out.append(f"Control without --no-enable-prefix-caching: not run ({c['skipped']}).")
    elif c:
        vf = c.get("verify") or {}
        res = ((c.get("compare") or {}).get("result") or {}).get("outputs") or {}
        o = next(iter(res.values()), {})
        lg = (c.get("logits_on_server_flow") or {}).get("logits") or {}
        out.append("Control (issue 50 item 1, recorded, not judged): the server flow on deepseek_v3 over the same "
                   "dataset with the shipped playbook's server command less `--no-enable-prefix-caching` "
                   f"(flag in the command the job ran: {c.get('no_enable_prefix_caching')}): exit {c.get('rc')}, "
                   f"{c.get('files')}/{c.get('expected')} files; `verify --all` exit {vf.get('rc')}, "
                   f"{vf.get('inconsistent_count')} file(s) whose shape differs from their token ids; against one "
                   f"float32 forward: {o.get('n_within_0_999')} of {o.get('n_total')} vectors >= 0.999 (min cosine "
                   f"{o.get('min_cosine')}), shape mismatches {o.get('shape_mismatch_count')}. "
                   f"`verify --logits 4` there: {lg.get('why') or lg}.")
        log = Path(path).with_name(Path(path).stem + "_control_server.log")
        if log.exists():
            text = log.read_text(errors="replace")
            flag = sorted({w.strip(",;)") for w in text.split() if w.startswith("enable_prefix_caching=")})
            rates = [line.split("Prefix cache hit rate:")[1].split(",")[0].strip()
                     for line in text.splitlines() if "Prefix cache hit rate:" in line]
            out.append(f"The server's log ({log.name}): {', '.join(flag) or 'no enable_prefix_caching line'}; prefix "
                       f"cache hit rate as vLLM logged it: {', '.join(rates) or 'not logged'}.")
    out.append("")
    verdict = d.get("verdict") or {}
    out.append(f"Verdict: {'all ok' if d.get('all_ok') else 'NOT all ok'} "
               f"({', '.join(f'{k}: {v}' for k, v in verdict.items())}).")
    return "\n".join(out)
