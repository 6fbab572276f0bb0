"""GPU proof for the user's model family (issue 22): DeepSeek-V3, a Kimi-K2.5-shaped wrapper and Qwen3.

Runs ON a lent GPU machine (offline; ../shared/GPU-NOTES.md) against the carried bundle (vLLM 0.20.0 with
``_moe_C`` + speculators 0.3.0 in site/, transformers 4.57.6 in tf/) and drives remote-ops itself over a
``connection: local`` host, as benchmarks/gpu/extract_check.py does. Everything lives under
``WORK/models-check`` and its own interpreter ``WORK/bin/python-models``: transformers 4.57.6 first, then a
copy of site/speculators (so this check's `patch` starts from the package as installed and does not touch
site/), then site/, then WORK/model/ (benchmarks/gpu/wheels/model.txt: compressed-tensors for kimi_k25.py).
docs/GPU_MODEL_CHECK.md explains the comparison.

Steps (each one's commands, exit statuses, timings and evidence go into --out, rewritten after every step):
  setup      bundle, interpreter, versions, GPUs; whether the speculators copy is as installed (its RECORD)
  build      benchmarks/gpu/lib/models.py: tiny random deepseek_v3 (MLA, 2 dense + 6 MoE layers, noaux_tc),
             kimi_k25 (KimiK25ForConditionalGeneration around the same text weights, minimal vision tower,
             image processor, configuration_kimi_k25.py) and qwen3, bf16 safetensors; a 24-sample dataset
  kimi_check_before_patch   `check kimi_k25 --model DIR --json` on the files as installed
  patch      `patch` with the shipped playbook (once: every host here shares the interpreter)
  per model  `check --model DIR --json`, `extract --tail --json` (layer ids 1,3,5,7), `logs` when it
             failed, `verify --json`, then benchmarks/gpu/routing_compare.py in the background (bf16 + float32
             transformers references with router margins; negative control on a corrupted copy) while the
             next model's job runs. kimi_k25 is compared with the deepseek_v3 checkpoint's forward (same
             text weights) at the same layer ids.
Each subprocess has a timeout and is killed by process group; a job whose `extract --tail` times out is
stopped with `remote-ops stop`. A model is skipped when the time left (--budget) is too short for it.

    # on the GPU machine: bash benchmarks/gpu/session.sh run model --copy-logs "$OUT/model-logs", or, with the
    # bundle unpacked at /root/e2e (site/, tf/, model/, rocache/), from the checkout:
    python3 benchmarks/gpu/model_check.py --work /root/e2e --out "$OUT/gpu_models_tp1.json" \
        --controller-cache /root/e2e/rocache --code-rev REV --copy-logs "$OUT/model-logs"
    # here, after copying the file back:
    python benchmarks/render/gpu_results.py > benchmarks/GPU_RESULTS.md

    # CPU rehearsal (no vLLM): checkpoints, the compare against an engine stand-in made from the bf16
    # reference, and the negative control; every remote-ops step is marked skipped
    python benchmarks/gpu/model_check.py --dry --work /tmp/mc --out /tmp/mc.json --extra-path TF_DIR
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu.lib.harness import (HOST_ENV, PLAYBOOK, Run, gpu_names, kill_group, remote_ops, sh,  # noqa: E402
                        unpack_bundle, versions_of, write_interpreter)

GPU = Path(__file__).resolve().parent          # benchmarks/gpu: the harnesses, lib/ their library
MODELS = ("deepseek_v3", "kimi_k25", "qwen3")
REFERENCE = {"deepseek_v3": "deepseek_v3", "kimi_k25": "deepseek_v3", "qwen3": "qwen3"}
FAMILY = {"deepseek_v3": "DeepSeek-V3 (MLA, routed + shared experts, noaux_tc)",
          "kimi_k25": "Kimi-K2.5 (KimiK25ForConditionalGeneration: DeepSeek-V3 text model + vision tower)",
          "qwen3": "Qwen3 (dense)"}
LAYER_IDS = "1,3,5,7"
GEN_FILES = ("speculators/data_generation/vllm_hidden_states_generator.py",
             "speculators/data_generation/custom_worker.py")
# seconds a model needs at least to be worth starting (check + extract + verify; compare runs after)
MODEL_MIN_SECONDS = 100


def record_hashes(site: Path, package: str = "speculators") -> dict:
    """{relative path: sha256 (urlsafe b64, as RECORD writes it)} of ``package``'s installed files."""
    out = {}
    for rec in site.glob(f"{package}-*.dist-info/RECORD"):
        for line in rec.read_text().splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) == 3 and parts[0].startswith(package + "/") and parts[1].startswith("sha256="):
                out[parts[0]] = parts[1][len("sha256="):]
    return out


def file_hash(path: Path) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


def copy_package_as_installed(site: Path, dest: Path) -> dict:
    """Copy site/speculators to dest/speculators; say whether the copy's files match the wheel's RECORD."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    src = site / "speculators"
    if not src.is_dir():
        return {"copied": False, "error": f"{src} is missing"}
    shutil.copytree(src, dest / "speculators", ignore=shutil.ignore_patterns("__pycache__"))
    hashes = record_hashes(site)
    differ = [rel for rel, h in sorted(hashes.items()) if rel.endswith(".py")
              and (dest / rel).exists() and file_hash(dest / rel) != h]
    return {"copied": True, "record_entries": len(hashes), "as_installed": bool(hashes) and not differ,
            "differ_from_record": differ, "generator_files_as_installed": not any(f in differ for f in GEN_FILES)}


def pristine_package_copy(site: Path, dest: Path, bundle: Path | None) -> dict:
    """copy_package_as_installed, then, when files of the copy differ from the wheel's RECORD (an earlier
    harness patched ``site`` in place), those files restored from the bundle's tar (members
    site/<path>) and checked again: a run that patches its own copy starts from the release as installed,
    whatever ran before it on the machine."""
    copy = copy_package_as_installed(site, dest)
    if not copy.get("copied") or copy.get("as_installed") or not bundle or not Path(bundle).is_file():
        return copy
    import tarfile
    want = {f"{site.name}/{rel}": rel for rel in copy["differ_from_record"]}
    restored = []
    with tarfile.open(bundle, "r:*") as tf:
        for m in tf:
            if m.name in want and m.isfile():
                (dest / want[m.name]).write_bytes(tf.extractfile(m).read())
                restored.append(want[m.name])
    hashes = record_hashes(site)
    differ = [rel for rel in copy["differ_from_record"] if file_hash(dest / rel) != hashes.get(rel)]
    return {**copy, "restored_from_bundle": sorted(restored), "differ_from_record": differ,
            "as_installed": not differ, "generator_files_as_installed": not any(f in differ for f in GEN_FILES),
            "site_differed_from_record": copy["differ_from_record"]}


def _short(r: dict, n: int = 1500) -> dict:
    return {"rc": r["rc"], "seconds": r["seconds"], "stderr_tail": (r.get("stderr") or "")[-n:]}


class ModelCheck:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work).resolve()
        self.root = self.work / "models-check"
        self.base_python = args.base_python or sys.executable
        self.controller_python = args.controller_python or self.base_python
        self.run = Run(Path(args.out), args.tp, args.code_rev, args.append, check="gpu_model_check")
        self.run.doc.setdefault("models", {})
        self.run.doc["budget_s"] = args.budget
        self.t0 = time.monotonic()
        self.log = self.root / "commands.log"
        self.background: dict[str, tuple[subprocess.Popen, float, Path, Path]] = {}

    # ------------------------------------------------------------------ helpers
    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.t0)

    def model_doc(self, name: str) -> dict:
        return self.run.doc["models"].setdefault(name, {"family": FAMILY[name]})

    def save_model(self, name: str, **data) -> None:
        self.model_doc(name).update(data)
        self.run.save()

    def ro(self, *args: str, timeout: float) -> dict:
        return remote_ops(self.controller_python, self.inv, args, work=self.work, timeout=max(5.0, timeout),
                          log=self.log, controller_cache=self.args.controller_cache)

    def check_with_model(self, host: str, model_dir: Path, timeout: float) -> dict:
        """`check HOST --model DIR --json`; where --model is unknown to this checkout, `check` without it
        (the host's target_model var names the model) and the refusal recorded."""
        r = self.ro("check", host, "--no-drift", "--model", str(model_dir), "--json", timeout=timeout)
        out = {"argv": r["argv"], "rc": r["rc"], "seconds": r["seconds"]}
        said = (r["stderr"] or "") + json.dumps(r["json"] or {}, default=str)
        if r["rc"] == 2 and "unrecognized arguments: --model" in said:
            out["model_option"] = "not accepted by this checkout: " + (r["stderr"] or "").strip()[-300:]
            r = self.ro("check", host, "--no-drift", "--json", timeout=timeout)
            out.update({"argv": r["argv"], "rc": r["rc"], "seconds": r["seconds"]})
        j = r["json"] or {}
        out["model"] = j.get("model")
        out["findings"] = [f"{f.get('kind')} {f.get('symbol')} {f.get('name')}" for f in j.get("findings") or []]
        out["unknown"] = len(j.get("unknown") or [])
        out["json_keys"] = sorted(j) if isinstance(j, dict) else None
        out["json"] = j if len(json.dumps(j, default=str)) < 20000 else {"truncated": True}
        if r["rc"] not in (0, 1):
            out["stderr_tail"] = (r["stderr"] or "")[-1500:]
        return out

    # ------------------------------------------------------------------ steps
    def setup(self) -> None:
        t = time.monotonic()
        w = self.work
        self.root.mkdir(parents=True, exist_ok=True)
        # a fresh start for the models of this run: the speculators copy is made anew below, so its patch
        # journal (state-*) and every earlier output go too
        for m in self.args.models:
            for d in (f"state-{m}", f"out-{m}", f"neg-{m}"):
                shutil.rmtree(self.root / d, ignore_errors=True)
        if not self.args.append:
            for d in self.root.glob("state-*"):
                shutil.rmtree(d, ignore_errors=True)
        extra = [str(Path(p).resolve()) for p in self.args.extra_path]
        if self.args.dry:
            path = extra
            copy = {"copied": False, "dry": True}
        else:
            unpack_bundle(w, self.args.bundle)
            copy = copy_package_as_installed(w / "site", self.root / "spec")
            # model/: benchmarks/gpu/wheels/model.txt (compressed-tensors, which vLLM's kimi_k25.py imports at
            # module level), after site/ so that the bundle's own packages win
            path = [f"{w}/tf", str(self.root / "spec"), f"{w}/site"] + \
                ([f"{w}/model"] if (w / "model").is_dir() else []) + extra
        self.python = write_interpreter(w, "python-models", self.base_python, path)
        self.run.doc["versions"] = versions_of(self.python)
        self.run.doc["gpus"] = gpu_names() if not self.args.dry else []
        self.run.doc["dry"] = bool(self.args.dry)
        self.run.step("setup", ok=True, seconds=round(time.monotonic() - t, 1), interpreter_path=path,
                      speculators_copy=copy, base_python=self.base_python)

    def build(self) -> bool:
        r = sh([str(self.python), str(GPU / "lib" / "models.py"), str(self.root / "ckpt"),
                "--which", ",".join(self.models_to_build()), "--samples", str(self.args.samples)],
               timeout=240, env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, log=self.log)
        built = [json.loads(line) for line in r["stdout"].splitlines() if line.startswith("{")]
        self.dataset = self.root / "ckpt" / "dataset.jsonl"
        self.built = {b["model"]: b for b in built if "model" in b}
        ds = next((b["dataset"] for b in built if "dataset" in b), None)
        ok = r["rc"] == 0 and all(m in self.built for m in self.models_to_build())
        self.run.step("build", ok=ok, rc=r["rc"], seconds=r["seconds"], models=self.built, dataset=ds,
                      layer_ids=LAYER_IDS, stderr_tail=r["stderr"][-2000:] if r["rc"] else "")
        self.samples = (ds or {}).get("samples", self.args.samples)
        return ok

    def models_to_build(self) -> list[str]:
        wanted = self.args.models
        return [m for m in MODELS if m in wanted or (m == "deepseek_v3" and "kimi_k25" in wanted)]

    def inventory(self) -> Path:
        hosts = {}
        for m in self.args.models:
            hosts[m] = {"connection": "local", "python": str(self.python), "workdir": str(self.root / "wd"),
                        "playbook": str(PLAYBOOK),
                        "env": {**HOST_ENV, "REMOTE_OPS_STATE_DIR": str(self.root / f"state-{m}")},
                        "vars": {"target_model": str(self.root / "ckpt" / m), "dataset": str(self.dataset),
                                 "output_dir": str(self.root / f"out-{m}"),
                                 "max_samples": self.args.max_samples, "batch_size": self.args.batch_size,
                                 "tensor_parallel_size": self.args.tp, "gpus": self.args.tp,
                                 "layer_ids": LAYER_IDS, "max_model_len": self.args.max_model_len,
                                 "gpu_memory_utilization": self.args.gpu_memory_utilization}}
        (self.root / "wd").mkdir(exist_ok=True)
        self.inv = self.root / "inventory.yaml"
        self.inv.write_text(json.dumps({"hosts": hosts, "default": self.args.models[0]}, indent=2))
        self.run.step("inventory", ok=True, path=str(self.inv), hosts=sorted(hosts),
                      vars={k: v for k, v in hosts[self.args.models[0]]["vars"].items()
                            if k not in ("target_model", "output_dir")})
        return self.inv

    def kimi_before_patch(self) -> None:
        if "kimi_k25" not in self.args.models:
            return
        c = self.check_with_model("kimi_k25", self.root / "ckpt" / "kimi_k25", timeout=min(120, self.left()))
        self.run.step("kimi_check_before_patch", ok=True, check=c)
        self.save_model("kimi_k25", check_before_patch=c)

    def patch(self) -> bool:
        host = self.args.models[0]
        p = self.ro("patch", host, "--yes", "--json", timeout=min(180, self.left()))
        again = self.ro("patch", host, "--yes", "--json", timeout=min(180, self.left()))
        pj = p["json"] or {}
        self.run.step("patch", ok=p["rc"] == 0 and again["rc"] == 0, rc=p["rc"], seconds=p["seconds"],
                      edits=[f"{e.get('edit')}: {e.get('state')}" for e in pj.get("edits", [])],
                      verification=pj.get("verification"), stderr_tail=p["stderr"][-1500:],
                      rerun={"rc": again["rc"], "changed": (again["json"] or {}).get("changed")})
        return p["rc"] == 0

    def one_model(self, name: str) -> None:
        ckpt = self.root / "ckpt" / name
        out_dir = self.root / f"out-{name}"
        shutil.rmtree(out_dir, ignore_errors=True)
        doc = self.model_doc(name)
        doc.update({"checkpoint": self.built.get(name), "layer_ids": LAYER_IDS, "reference": REFERENCE[name]})
        if self.left() < MODEL_MIN_SECONDS:
            self.save_model(name, skipped=f"{self.left():.0f} s left of --budget {self.args.budget}: not started")
            return
        c = self.check_with_model(name, ckpt, timeout=min(120, self.left()))
        self.save_model(name, check=c)
        timeout = min(self.args.job_timeout, self.left() - 10)
        r = self.ro("extract", name, "--tail", "--json", timeout=timeout)
        j = r["json"] or {}
        files = sorted(out_dir.glob("data_*.pt"))
        extract = {"rc": r["rc"], "seconds": r["seconds"], "files": len(files), "expected": self.samples,
                   "error": j.get("error"), "message": j.get("message"), "preflight": j.get("preflight"),
                   "result": {k: j.get(k) for k in ("state", "exit_code", "reason", "job_id") if k in j}
                   or {k: (j.get("status") or {}).get(k) for k in ("state", "exit_code", "reason")},
                   "stderr_tail": r["stderr"][-2000:]}
        if r["rc"] == 124:   # the job is detached: stop it, or it holds the GPU for the next model
            s = self.ro("stop", name, "--json", timeout=120)
            extract["stopped_after_timeout"] = {"rc": s["rc"], "json": s["json"]}
        self.save_model(name, extract=extract)
        logs = self.ro("logs", name, "--json", timeout=60)
        lines = ((logs["json"] or {}).get("text") or "").splitlines()
        # how the captured states reached the script (the shared-memory hand-off or vLLM's RPC), as it said
        extract["handoff_line"] = next((l for l in lines if l.startswith("captured states ")), None)
        self.save_model(name, extract=extract)
        if r["rc"] != 0:
            self.save_model(name, job_log={"error_lines": [l for l in lines if "Error" in l or "error" in l][-8:],
                                           "tail": lines[-30:]})
        v = self.ro("verify", name, "--json", timeout=min(120, max(10, self.left())))
        self.save_model(name, verify={"rc": v["rc"], "seconds": v["seconds"], "result": v["json"],
                                      "stderr_tail": v["stderr"][-800:]})
        if files:
            self.start_compare(name, out_dir)

    def start_compare(self, name: str, out_dir: Path, fake: bool = False) -> None:
        res_file = self.root / f"compare-{name}.json"
        res_file.unlink(missing_ok=True)
        log = self.root / f"compare-{name}.log"
        cmd = [str(self.python), str(GPU / "routing_compare.py"),
               "--ref-model", str(self.root / "ckpt" / REFERENCE[name]), "--hs-dir", str(out_dir),
               "--dataset", str(self.dataset), "--neg-dir", str(self.root / f"neg-{name}"),
               "--device", self.args.compare_device, "--margin", str(self.args.margin),
               "--max-model-len", str(self.args.max_model_len), "--layer-ids", LAYER_IDS, "--json", str(res_file)]
        if fake:
            cmd.append("--fake-engine")
        with open(log, "w") as fh:
            p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        self.background[name] = (p, time.monotonic(), res_file, log)
        self.save_model(name, compare={"state": "running", "argv": cmd[1:]})

    def collect(self, name: str, wait: bool) -> None:
        p, started, res_file, log = self.background[name]
        limit = self.args.compare_timeout
        while wait and p.poll() is None and time.monotonic() - started < limit and self.left() > -60:
            time.sleep(1)
        if p.poll() is None:
            if not wait:
                return
            kill_group(p)
            p.wait()
            state = "killed (timeout)"
        else:
            state = "done"
        res = json.loads(res_file.read_text()) if res_file.exists() else None
        tail = log.read_text()[-2000:] if log.exists() else ""
        self.save_model(name, compare={"state": state, "rc": p.returncode,
                                       "seconds": round(time.monotonic() - started, 1), "result": res,
                                       "log_tail": tail if (p.returncode or res is None) else ""})
        del self.background[name]

    def copy_logs(self, dest: Path) -> None:
        """Every log under models-check (commands, compares, the jobs' own) to ``dest``, for a look later."""
        copied = []
        for f in sorted(self.root.rglob("*")):
            if (f.suffix == ".log" or f.name == "log") and f.is_file() and f.stat().st_size < 8 * 2**20 \
                    and "spec" not in f.relative_to(self.root).parts[:1]:
                target = dest / f.relative_to(self.root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)
                copied.append(str(f.relative_to(self.root)))
        self.run.doc["logs_copied"] = {"to": str(dest), "files": copied}
        self.run.save()

    def verdict(self) -> None:
        v = {}
        for name in self.args.models:
            d = self.run.doc["models"].get(name) or {}
            ex = d.get("extract") or {}
            res = (d.get("compare") or {}).get("result") or {}
            data_ok = bool(res.get("ok")) and bool(res.get("negative_control_fails"))
            ran = ex.get("rc") == 0 and ex.get("files") == self.samples
            said = [ex.get("message")] + list((ex.get("preflight") or {}).get("problems") or [])
            refused = ex.get("rc") in (8, 9) and any("KimiK25ForConditionalGeneration" in str(x) for x in said)
            if self.args.dry:
                outcome = "works" if data_ok else "failed"
            elif ran and data_ok:
                outcome = "works"
            elif name == "kimi_k25" and refused:
                outcome = "refused before the engine started"
            elif d.get("skipped"):
                outcome = "skipped"
            else:
                outcome = "failed"
            d["outcome"] = outcome
            v[name] = outcome in ("works", "refused before the engine started")
            if not self.args.dry and outcome == "works":
                v[f"{name}_verify"] = (d.get("verify") or {}).get("rc") == 0
        self.run.doc["verdict"] = v
        self.run.doc["all_ok"] = bool(v) and all(v.values())
        self.run.save()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/root/e2e", help="the unpacked bundle (site/, tf/); outputs go to "
                                                         "WORK/models-check")
    ap.add_argument("--out", required=True, help="result JSON, rewritten after every step")
    ap.add_argument("--bundle", default=None, help="tar(.gz) with site/ and tf/, when WORK has none yet")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--max-samples", type=int, default=1000,
                    help="the playbook var; larger than the dataset on purpose (verify's count, issue 22)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--margin", default="auto", help="routing margin of a clear router (benchmarks/gpu/routing_compare.py; "
                                                     "default: calibrated on the bf16 reference)")
    ap.add_argument("--budget", type=float, default=470, help="seconds for the whole check")
    ap.add_argument("--job-timeout", type=float, default=200, help="seconds for one `extract --tail`")
    ap.add_argument("--compare-timeout", type=float, default=150)
    ap.add_argument("--compare-device", default="cuda")
    ap.add_argument("--base-python", default=None, help="the machine's python with torch (default: this one)")
    ap.add_argument("--controller-python", default=None, help="python that runs remote-ops (default: --base-python)")
    ap.add_argument("--controller-cache", default=None,
                    help="REMOTE_OPS_CACHE for the controller (default: WORK/rocache when it exists)")
    ap.add_argument("--extra-path", action="append", default=[], help="more PYTHONPATH for the host interpreter")
    ap.add_argument("--code-rev", default=None, help="the remote-ops commit this checkout is (recorded)")
    ap.add_argument("--copy-logs", default=None, help="copy every log of the run here at the end (e.g. $OUT/logs)")
    ap.add_argument("--append", action="store_true",
                    help="add these models to an existing --out (e.g. a second call with --models qwen3)")
    ap.add_argument("--dry", action="store_true", help="CPU rehearsal: no remote-ops steps; the compare runs "
                                                       "against an engine stand-in made from the bf16 reference")
    args = ap.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    if args.dry and args.compare_device == "cuda":
        args.compare_device = "cpu"
    if not args.controller_cache and (Path(args.work) / "rocache").is_dir():
        args.controller_cache = str(Path(args.work) / "rocache")   # drift's baseline offline (benchmarks/gpu/lib/bundle.py)
    if args.dry:   # torch on a shared CPU: the GPU's limits do not apply
        args.budget, args.compare_timeout = max(args.budget, 7200), max(args.compare_timeout, 3600)
    h = ModelCheck(args)
    try:
        h.setup()
        if not h.build():
            raise SystemExit("checkpoint build failed (see --out: steps.build)")
        h.inventory()
        if args.dry:
            for m in args.models:
                h.model_doc(m).update({"checkpoint": h.built.get(m), "layer_ids": LAYER_IDS,
                                       "reference": REFERENCE[m], "skipped_remote_ops": "dry run"})
                h.start_compare(m, h.root / f"out-{m}", fake=True)
                h.collect(m, wait=True)
        else:
            h.kimi_before_patch()
            if not h.patch():
                raise SystemExit("patch failed (see --out: steps.patch)")
            for m in args.models:
                try:
                    h.one_model(m)
                except Exception as exc:   # one model's crash must not hide the others' results
                    h.save_model(m, crashed=f"{type(exc).__name__}: {exc}")
                for other in list(h.background):
                    h.collect(other, wait=False)
        for m in list(h.background):
            h.collect(m, wait=True)
    finally:
        for p, *_ in h.background.values():
            kill_group(p)
        h.verdict()
        if args.copy_logs:
            h.copy_logs(Path(args.copy_logs))
    print(json.dumps({"verdict": h.run.doc["verdict"], "all_ok": h.run.doc["all_ok"],
                      "elapsed_s": h.run.doc["elapsed_s"], "out": str(args.out)}))
    return 0 if h.run.doc["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
