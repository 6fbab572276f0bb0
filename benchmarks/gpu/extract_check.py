"""GPU end-to-end check: the shipped playbook and extraction script produce correct hidden states.

Runs ON a machine with NVIDIA GPUs (the lent H200s) and drives everything through remote-ops itself,
as a user would: `check`, `patch`, `extract --tail`, `verify`, `status`, `stop`, over a
``connection: local`` host (the GPU machines have no sshd; the agent, its JSON request and every
operation are the same as over SSH, see tests/connect/test_local_connection.py). The result JSON says so.

What it does (each step's command, exit status, timing and evidence go into the result JSON):
  setup   unpack the carried bundle (slim vLLM 0.20.0 wheel + small deps + speculators 0.3.0, and
          transformers 4.57.6 in its own path), write two host interpreters: ``python`` (transformers
          4.57.6 first on the path) and ``python-notf`` (the machine's transformers 5.x)
  model   a tiny random Llama (8 layers, hidden 256, vocab 1024, bf16 safetensors) and a tokenizer
          built with `tokenizers` on the spot: nothing is downloaded
  data    a JSONL dataset with batches larger than the scheduler's token budget (8,192 tokens),
          prompts sharing a 700-token prefix, and prompts longer than max_model_len (truncated)
  (a)     the original files: `check` reports findings; `extract` is refused by its preflight;
          `extract --skip-check` runs the job, which fails (the error line is recorded)
  (b)     `patch` with the shipped playbook, then `check`: no findings
  (trap)  `extract --dry-run` on the interpreter with transformers 5.x: refused by the import probe
  (c)     `extract --tail` with the shipped script
  (d)     `verify`
  (e)     every sample's hidden states against a plain transformers forward of the same checkpoint
          (float32 reference, forward hooks on the decoder layers): shapes equal, min per-token cosine
  (f)     `stop` during a run, then nvidia-smi's compute processes and /proc: no process left

    python benchmarks/gpu/lib/bundle.py --out .gpu          # here: the bundle, in parts, and the drift baseline
    # on the GPU machine, after carrying .gpu/part.NN (one per call) and .gpu/baseline.tar.gz:
    cat part.* > bundle.tar.gz; mkdir -p rocache/src; tar xzf baseline.tar.gz -C rocache/src
    python3 benchmarks/gpu/extract_check.py --bundle /root/e2e/bundle.tar.gz --work /root/e2e \\
        --tp 1 --steps a,b,trap,c,d,e,f --controller-cache /root/e2e/rocache --out result.json
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu.lib import harness as common  # noqa: E402
from benchmarks.gpu.lib.harness import (HOST_ENV, PLAYBOOK, drift_line as _drift_line, gpu_names, last_json,  # noqa: E402
                        WORD_TOKENIZER, remote_ops, run_steps, sh, unpack_bundle, versions_of,
                        write_interpreter)

GEN_MODULE = "speculators/data_generation/vllm_hidden_states_generator.py"

MODEL_BUILDER = WORD_TOKENIZER + r'''
import json, sys, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
save_word_tokenizer(out, 1024, 4096)
torch.manual_seed(1234)
cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  rms_norm_eps=1e-5, initializer_range=0.05, bos_token_id=1, eos_token_id=2,
                  pad_token_id=3, tie_word_embeddings=False, torch_dtype="bfloat16")
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
print(json.dumps({"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
                  "params": sum(p.numel() for p in model.parameters())}))
'''

COMPARE = r'''
import json, math, sys, torch
from pathlib import Path
from transformers import AutoModelForCausalLM
model_dir, out_dir, device = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
# optional 4th argument (benchmarks/gpu/server_check.py): {"layout": "hs_safetensors", "layer_ids": [...]}:
# hs_<N>.safetensors files (token_ids, hidden_states [seq, L, hidden]) whose layer id k is vLLM's aux hidden
# state k, the residual stream after decoder layer k-1 (0: the embeddings), i.e. the hook on layers[k-1]
opts = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
cfg_file = out_dir / "data_config.json"
data_cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).to(device).eval()
n_layers = model.config.num_hidden_layers
layer_ids = (opts.get("layer_ids") or (data_cfg.get("hidden_states") or {}).get("layer_ids")
             or data_cfg.get("layer_ids") or [2, n_layers // 2, n_layers - 3, n_layers - 1])
captured = {}
def hook(i):
    def fn(mod, inp, out):
        captured[i] = (out[0] if isinstance(out, tuple) else out).detach()
    return fn
server_flow = opts.get("layout") == "hs_safetensors"
for i in layer_ids:
    if server_flow and i == 0:
        model.model.embed_tokens.register_forward_hook(hook(i))
    else:
        model.model.layers[i - 1 if server_flow else i].register_forward_hook(hook(i))
if server_flow:
    from safetensors.torch import load_file
    files = sorted(out_dir.glob("hs_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))
    def load(f):
        d = load_file(str(f))
        return {"input_ids": d["token_ids"], "hidden_states": list(d["hidden_states"].unbind(1))}
else:
    files = sorted(out_dir.glob("data_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    def load(f):
        return torch.load(f, map_location="cpu")
res = {"layer_ids": layer_ids, "samples": 0, "comparisons": 0, "shape_mismatches": [], "below_0_999": [],
       "min_cosine": None, "min_cosine_at": None, "mean_cosine": None, "reference": "transformers float32 forward"}
total, count, worst = 0.0, 0, 2.0
for f in files:
    d = load(f)
    ids = d["input_ids"].to(torch.long)
    hs = d["hidden_states"]
    captured.clear()
    with torch.no_grad():
        model(input_ids=ids.unsqueeze(0).to(device))
    res["samples"] += 1
    if len(hs) != len(layer_ids):
        res["shape_mismatches"].append({"file": f.name, "layers": len(hs), "expected": len(layer_ids)})
        continue
    for k, i in enumerate(layer_ids):
        ref = captured[i][0].float().cpu()
        got = hs[k].float()
        if tuple(got.shape) != tuple(ref.shape):
            res["shape_mismatches"].append({"file": f.name, "layer": i, "shape": list(got.shape),
                                            "expected": list(ref.shape)})
            continue
        cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
        m = float(cos.min())
        total += float(cos.sum()); count += cos.numel()
        res["comparisons"] += 1
        if m < worst:
            worst = m; res["min_cosine_at"] = {"file": f.name, "layer": i, "token": int(cos.argmin())}
        if m < 0.999:
            res["below_0_999"].append({"file": f.name, "layer": i, "min_cosine": round(m, 6)})
res["below_0_999_count"] = len(res["below_0_999"])
res["below_0_999"] = res["below_0_999"][:20]
res["shape_mismatches_count"] = len(res["shape_mismatches"])
res["shape_mismatches"] = res["shape_mismatches"][:20]
res["min_cosine"] = None if worst > 1.5 else round(worst, 6)
res["mean_cosine"] = None if not count else round(total / count, 6)
res["tokens_compared"] = count
res["ok"] = bool(res["samples"]) and not res["shape_mismatches_count"] and not res["below_0_999_count"] and \
    res["comparisons"] == res["samples"] * len(layer_ids)
print(json.dumps(res))
'''

class Harness(common.Harness):
    def __init__(self, args):
        super().__init__(args, "gpu_extract_check")

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        w = self.work
        w.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        unpack_bundle(w, self.args.bundle)
        python = write_interpreter(w, "python", self.base_python, [f"{w}/tf", f"{w}/site"])
        python_notf = write_interpreter(w, "python-notf", self.base_python, [f"{w}/site"])
        self.run.doc["versions"] = versions_of(python)
        self.run.doc["versions_python_notf"] = versions_of(python_notf)
        self.run.doc["gpus"] = gpu_names()
        self.run.step("setup", seconds=round(time.monotonic() - t, 1), base_python=self.base_python)

    def build_model_and_data(self) -> None:
        w = self.work
        t = time.monotonic()
        r = sh([str(w / "bin" / "python"), "-c", MODEL_BUILDER, str(w / "model")], timeout=300, log=self.log)
        if r["rc"] != 0:
            self.run.step("model", ok=False, rc=r["rc"], stderr=r["stderr"][-3000:])
            raise SystemExit("model build failed")
        model = last_json(r["stdout"])
        rng = random.Random(20261130)
        rows: list[list[int]] = []
        word = lambda: rng.randrange(4, 1024)   # noqa: E731
        rows += [[1] + [word() for _ in range(rng.randrange(300, 500))] for _ in range(40)]   # > token budget
        prefix = [1] + [word() for _ in range(700)]
        rows += [prefix + [word() for _ in range(rng.randrange(50, 200))] for _ in range(16)]  # shared prefix
        rows += [[1] + [word() for _ in range(2100)] for _ in range(6)]                          # > max_model_len
        data = w / "dataset.jsonl"
        with open(data, "w") as fh:
            for ids in rows:
                fh.write(json.dumps({"input_ids": ids}) + "\n")
        long_rows = [[1] + [word() for _ in range(rng.randrange(400, 600))] for _ in range(3000)]
        with open(w / "dataset_long.jsonl", "w") as fh:
            for ids in long_rows:
                fh.write(json.dumps({"input_ids": ids}) + "\n")
        self.run.step("model_and_data", ok=True, seconds=round(time.monotonic() - t, 1), model=model,
                      dataset={"samples": len(rows), "tokens": sum(map(len, rows)),
                               "batch_size": self.args.batch_size,
                               "tokens_per_batch": [sum(map(len, rows[i:i + self.args.batch_size]))
                                                    for i in range(0, len(rows), self.args.batch_size)],
                               "scheduler_token_budget": 8192, "shared_prefix_tokens": len(prefix),
                               "longer_than_max_model_len": 6, "max_model_len": 2048})
        self.samples = len(rows)

    def inventory(self) -> Path:
        w = self.work
        tp = self.args.tp

        def host(python: str, out: str, dataset: str, state: str) -> dict:
            return {"connection": "local", "python": str(w / "bin" / python), "workdir": str(w / "wd"),
                    "playbook": str(PLAYBOOK),
                    "env": {**HOST_ENV, "REMOTE_OPS_STATE_DIR": str(w / state)},
                    "vars": {"target_model": str(w / "model"), "dataset": str(w / dataset),
                             "output_dir": str(w / out), "max_samples": self.samples if dataset ==
                             "dataset.jsonl" else 3000,
                             "batch_size": self.args.batch_size, "tensor_parallel_size": tp, "gpus": tp,
                             "max_model_len": 2048, "gpu_memory_utilization": 0.3}}
        inv = {"hosts": {"gpu": host("python", "hidden_states", "dataset.jsonl", "state"),
                         "gpu-notf": host("python-notf", "hidden_states_notf", "dataset.jsonl", "state-notf"),
                         "gpu-stop": host("python", "hidden_states_stop", "dataset_long.jsonl", "state-stop"),
                         "gpu-orig": host("python", "hidden_states_orig", "dataset.jsonl", "state-orig")},
               "default": "gpu"}
        (w / "wd").mkdir(exist_ok=True)
        path = w / "inventory.yaml"
        path.write_text(json.dumps(inv, indent=2))   # JSON is YAML
        self.inv = path
        return path

    def ro(self, *args: str, timeout: float = 300) -> dict:
        """remote-ops itself: this checkout's CLI in a fresh process."""
        return remote_ops(self.controller_python, self.inv, args, work=self.work, timeout=timeout, log=self.log,
                          controller_cache=self.args.controller_cache)

    # ------------------------------------------------------------------ steps
    def step_a(self) -> None:
        check = self.ro("check", "gpu-orig", "--json", timeout=120)
        findings = (check["json"] or {}).get("findings") or []
        drift = (check["json"] or {}).get("drift")
        refused = self.ro("extract", "gpu-orig", "--dry-run", "--json", timeout=300)
        run = self.ro("extract", "gpu-orig", "--skip-check", "--tail", "--json", timeout=420)
        logs = self.ro("logs", "gpu-orig", "--json", timeout=60)
        log_text = (logs["json"] or {}).get("text") or ""
        errors = [l for l in log_text.splitlines() if "Error" in l][-5:]
        self.run.step("a_original_files", ok=check["rc"] == 1 and bool(findings) and refused["rc"] == 8
                      and run["rc"] != 0,
                      check={"rc": check["rc"], "findings": [f"{f.get('kind')} {f.get('symbol')} {f.get('name')}"
                                                             for f in findings],
                             "drift": None if drift is None else [_drift_line(d) for d in drift],
                             "baseline": (check["json"] or {}).get("baseline"),
                             "seconds": check["seconds"]},
                      preflight_refused={"rc": refused["rc"], "error": (refused["json"] or {}).get("error"),
                                         "seconds": refused["seconds"]},
                      job={"rc": run["rc"], "seconds": run["seconds"], "stderr_tail": run["stderr"][-1500:],
                           "error_lines": errors,
                           "is_encoder_decoder_error": "is_encoder_decoder" in log_text})

    def step_b(self) -> None:
        patch = self.ro("patch", "gpu", "--yes", "--json", timeout=180)
        check = self.ro("check", "gpu", "--json", timeout=120)
        again = self.ro("patch", "gpu", "--yes", "--json", timeout=180)
        cj = check["json"] or {}
        self.run.step("b_patch_then_check", ok=patch["rc"] == 0 and check["rc"] == 0 and
                      not cj.get("findings") and again["rc"] == 0 and not (again["json"] or {}).get("changed"),
                      patch={"rc": patch["rc"], "seconds": patch["seconds"],
                             "edits": [f"{e.get('edit')}: {e.get('state')}" for e in (patch["json"] or {}).get("edits", [])],
                             "verification": (patch["json"] or {}).get("verification"),
                             "stderr": patch["stderr"][-1500:]},
                      check={"rc": check["rc"], "findings": cj.get("findings"),
                             "drift": None if cj.get("drift") is None else [_drift_line(d) for d in cj["drift"]],
                             "baseline": cj.get("baseline"),
                             "drift_accepted": [_drift_line(d) for d in cj.get("drift_accepted") or []],
                             "unknown": len(cj.get("unknown") or []), "calls_checked": cj.get("calls_checked"),
                             "seconds": check["seconds"]},
                      rerun={"rc": again["rc"], "changed": (again["json"] or {}).get("changed")})

    def step_trap(self) -> None:
        r = self.ro("extract", "gpu-notf", "--dry-run", "--json", timeout=300)
        j = r["json"] or {}
        text = json.dumps(j)
        self.run.step("trap_transformers5", ok=r["rc"] in (8, 9) and "transformers" in text,
                      rc=r["rc"], seconds=r["seconds"], error=j.get("error"),
                      problems=(j.get("preflight") or {}).get("problems"), stderr=r["stderr"][-1000:],
                      transformers_of_that_interpreter=(self.run.doc.get("versions_python_notf") or {})
                      .get("transformers"))

    def step_c(self) -> None:
        r = self.ro("extract", "gpu", "--tail", "--json", timeout=540)
        j = r["json"] or {}
        files = sorted((self.work / "hidden_states").glob("data_*.pt"))
        self.run.step("c_extract_tail", ok=r["rc"] == 0 and len(files) == self.samples, rc=r["rc"],
                      seconds=r["seconds"], files=len(files), expected=self.samples,
                      result={k: j.get(k) for k in ("state", "exit_code", "reason", "job_id") if k in j} or
                      {k: (j.get("status") or {}).get(k) for k in ("state", "exit_code", "reason")},
                      stderr_tail=r["stderr"][-2000:])

    def step_d(self) -> None:
        r = self.ro("verify", "gpu", "--json", timeout=300)
        self.run.step("d_verify", ok=r["rc"] == 0, rc=r["rc"], seconds=r["seconds"], result=r["json"],
                      stderr=r["stderr"][-1000:])

    def step_e(self) -> None:
        w = self.work
        r = sh([str(w / "bin" / "python"), "-c", COMPARE, str(w / "model"), str(w / "hidden_states"),
                self.args.compare_device], timeout=400, log=self.log)
        j = last_json(r["stdout"]) or {}
        self.run.step("e_compare_with_transformers", ok=r["rc"] == 0 and bool(j.get("ok")) and
                      (j.get("min_cosine") or 0) >= 0.999, rc=r["rc"], seconds=r["seconds"], result=j,
                      stderr=r["stderr"][-1500:] if r["rc"] else "")

    def step_f(self) -> None:
        launch = self.ro("extract", "gpu-stop", "--json", timeout=300)
        seen_gpu, status_json, t0 = [], None, time.monotonic()
        while time.monotonic() - t0 < 240:
            smi = sh(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                      "--format=csv,noheader"], timeout=30)
            seen_gpu = [l.strip() for l in smi["stdout"].splitlines() if l.strip()]
            st = self.ro("status", "gpu-stop", "--json", timeout=60)
            status_json = st["json"]
            done = list((self.work / "hidden_states_stop").glob("data_*.pt"))
            if seen_gpu and done:
                break
            if st["rc"] != 0 and status_json and (status_json.get("state") not in ("running", None)):
                break
            time.sleep(2)
        files_at_stop = len(list((self.work / "hidden_states_stop").glob("data_*.pt")))
        stop = self.ro("stop", "gpu-stop", "--json", timeout=180)
        time.sleep(3)
        smi = sh(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                 timeout=30)
        after = [l.strip() for l in smi["stdout"].splitlines() if l.strip()]
        marker_left = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if b"REMOTE_OPS_JOB_ID=" in (d / "environ").read_bytes():
                        marker_left.append(int(d.name))
                except OSError:
                    pass
        st = self.ro("status", "gpu-stop", "--json", timeout=60)
        self.run.step("f_stop_leaves_no_gpu_process",
                      ok=launch["rc"] == 0 and bool(seen_gpu) and stop["rc"] == 0 and not after and not marker_left,
                      launch_rc=launch["rc"], gpu_processes_while_running=seen_gpu, files_written_before_stop=files_at_stop,
                      stop={"rc": stop["rc"], "json": stop["json"], "seconds": stop["seconds"]},
                      gpu_processes_after=after, marker_processes_after=marker_left,
                      status_after=st["json"])

STEP_NAMES = {"a": "a_original_files", "b": "b_patch_then_check", "trap": "trap_transformers5",
              "c": "c_extract_tail", "d": "d_verify", "e": "e_compare_with_transformers",
              "f": "f_stop_leaves_no_gpu_process"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True, help="tar(.xz) with site/ and tf/ (see GPU-NOTES.md)")
    ap.add_argument("--work", default="/root/e2e")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--steps", default="a,b,trap,c,d,e,f")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--base-python", default=None, help="the machine's python with torch (default: this one)")
    ap.add_argument("--controller-python", default=None,
                    help="python that runs remote-ops (default: --base-python; needs pyyaml, rich, packaging)")
    ap.add_argument("--compare-device", default="cuda")
    ap.add_argument("--controller-cache", default=None,
                    help="REMOTE_OPS_CACHE for the controller (holds drift's baseline sources offline)")
    ap.add_argument("--code-rev", default=None, help="the remote-ops commit this checkout is (recorded)")
    ap.add_argument("--append", action="store_true", help="add these steps to an existing result file")
    ap.add_argument("--fresh", action="store_true", help="remove outputs and host state of an earlier run")
    args = ap.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    h = Harness(args)
    if args.fresh:
        for d in ("hidden_states", "hidden_states_stop", "hidden_states_orig", "hidden_states_notf",
                  "state", "state-notf", "state-stop", "state-orig"):
            shutil.rmtree(h.work / d, ignore_errors=True)
    h.setup()
    h.build_model_and_data()
    h.inventory()
    order = {"a": h.step_a, "b": h.step_b, "trap": h.step_trap, "c": h.step_c, "d": h.step_d,
             "e": h.step_e, "f": h.step_f}
    return run_steps(h.run, steps, order, STEP_NAMES)


if __name__ == "__main__":
    sys.exit(main())
