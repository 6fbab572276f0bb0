"""GPU proof of `verify --logits` (issue 50 item 5) on the lent H200, and the prefix-caching control (item 1).

Runs ON a lent GPU machine (offline; ../shared/GPU-NOTES.md) against the carried bundle, through remote-ops
itself over `connection: local` hosts, with benchmarks/gpu/flows_check.py's setup, fixtures and inventory:

  flows      the 0.3.0 flow (`patch`, `extract --tail`, `verify`) on the DeepSeek-V3 tiny checkpoint and the
             Kimi-K2.5-shaped wrapper of the same weights, with layer ids 1,3,5,7: id 7 is the output of the
             last of 8 decoder layers, so the check applies. (The server flow cannot capture the model's last
             state on vLLM 0.20.0's deepseek_v2: aux ids are gathered before a layer, id 8 never; there
             `verify --logits` says "not applicable", shown on the control run below.)
  engines    one plain vLLM 0.20.0 server per checkpoint (`vllm serve`, --no-enable-prefix-caching,
             --max-logprobs 20, --enforce-eager; Kimi with --trust-remote-code): the engine whose prompt
             logprobs the check compares with
  logits     per model: `remote-ops verify HOST --logits 8 --logits-port P` on the run's output (must pass),
             then on copies of it whose last state was replaced (must fail): `wrong-layer` (the last tensor is
             the one before it: decoder layer 5's output, labelled 7), `perturbed` (Gaussian noise of 10% of
             each row's RMS added to the last tensor); `perturbed-small` (2%) is recorded, not judged
  control    (--control, if the budget allows) the server flow on DeepSeek-V3 over the prefix dataset with the
             shipped playbook's command WITHOUT --no-enable-prefix-caching (a copy of the playbook with that
             line removed): files, `verify --all` (every file's header shape against its token ids: vLLM
             #44485's short states would show here), every vector against one float32 forward
             (benchmarks/gpu/flows_compare.py), and `verify --logits 4` on that server-flow output (not applicable)

    python3 benchmarks/gpu/logits_check.py --work /root/e2e --out $OUT/gpu_logits_tp1.json --dataset prefix --control
    python benchmarks/render/gpu_results.py > benchmarks/GPU_RESULTS.md      # here, with the JSON in results/
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu import flows_check as gfc  # noqa: E402
from benchmarks.gpu.lib.connector import NO_CHUNKED  # noqa: E402
from benchmarks.gpu.lib.harness import HOST_ENV, kill_group, sh  # noqa: E402

IDS_LOGITS = "1,3,5,7"             # data_<i>.pt: id 7 = the output of decoder layer 7, the last of 8
ENGINE_PORTS = {"deepseek_v3": 8811, "kimi_k25": 8812}
CONTROL_PORT = 8813
DOCTORED = {"wrong-layer": None, "perturbed": 0.10, "perturbed-small": 0.02}
JUDGED = ("wrong-layer", "perturbed")

DOCTOR = r'''
import json, shutil, sys
from pathlib import Path
import torch
src, dst, how, rel = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])
shutil.rmtree(dst, ignore_errors=True)
dst.mkdir(parents=True)
for name in ("run.json", "data_config.json"):
    if (src / name).exists():
        shutil.copy2(src / name, dst / name)
g = torch.Generator().manual_seed(7)
n = 0
for f in sorted(src.glob("data_*.pt")):
    obj = torch.load(f, map_location="cpu", weights_only=True)
    hs = list(obj["hidden_states"])
    last = hs[-1]
    if how == "wrong-layer":
        new = hs[-2].clone()
    else:
        x = last.float()
        rms = x.pow(2).mean(-1, keepdim=True).sqrt()
        new = (x + rel * rms * torch.randn(x.shape, generator=g)).to(last.dtype)
    hs[-1] = new
    obj["hidden_states"] = hs
    torch.save(obj, dst / f.name)
    n += 1
print(json.dumps({"doctored": how, "files": n, "rel": rel, "dir": str(dst)}))
'''


class LogitsCheck(gfc.FlowsCheck):
    def __init__(self, args):
        args.flows = "030"
        super().__init__(args)
        self.run.doc["check"] = "gpu_logits_check"
        self.engines: dict[str, dict] = {}

    def start_engine(self, m: str, port: int) -> None:
        ck = self.root / "ckpt" / m
        log = self.root / f"engine-{m}.log"
        cmd = [str(self.py("server")), "-m", "vllm.entrypoints.cli.main", "serve", str(ck), "--host", "127.0.0.1",
               "--port", str(port), "--max-model-len", str(gfc.MAX_MODEL_LEN), "--gpu-memory-utilization", "0.25",
               "--no-enable-prefix-caching", "--max-logprobs", "20", "--enforce-eager",
               "--disable-uvicorn-access-log"] + (["--trust-remote-code"] if m in gfc.TRUSTED else [])
        env = {**os.environ, **HOST_ENV, "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
        fh = open(log, "ab")
        p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
        self.engines[m] = {"proc": p, "port": port, "log": log, "command": cmd, "started": time.monotonic()}

    def wait_engines(self, limit: float) -> dict:
        t0, out = time.monotonic(), {}
        pending = set(self.engines)
        while pending and time.monotonic() - t0 < limit:
            for m in sorted(pending):
                e = self.engines[m]
                if e["proc"].poll() is not None:
                    out[m] = {"healthy": False, "exit": e["proc"].returncode}
                    pending.discard(m)
                    continue
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{e['port']}/health", timeout=2) as r:
                        if r.status == 200:
                            out[m] = {"healthy": True, "after_s": round(time.monotonic() - e["started"], 1)}
                            pending.discard(m)
                except OSError:
                    pass
            time.sleep(1)
        for m in pending:
            out[m] = {"healthy": False, "timed_out_s": limit}
        for m, e in self.engines.items():
            out[m].update(port=e["port"], command=e["command"][1:])
            if not out[m]["healthy"]:
                out[m]["log_tail"] = e["log"].read_text(errors="replace")[-3000:]
        return out

    def stop_engines(self) -> None:
        for e in self.engines.values():
            kill_group(e["proc"])
            e["proc"].wait(timeout=30)
        self.engines = {}

    def verify_logits(self, host: str, port: int, out_dir: Path | None, n: int) -> dict:
        args = ["verify", host, *(["--output-dir", str(out_dir)] if out_dir else []), "--logits", str(n),
                "--logits-port", str(port), "--json"]
        r = self.ro(*args, timeout=300)
        j = r["json"] or {}
        lg = j.get("logits") or {}
        keep = ("ok", "applies", "files", "positions", "top1", "mean_abs_delta", "min_top1", "max_mean_delta",
                "without_norm", "why", "problems", "checkpoint_tensors", "layer_ids", "num_layers", "flow",
                "served_model", "compared_logprobs", "top_k")
        return {"argv": r["argv"], "rc": r["rc"], "seconds": r["seconds"], "verify_ok": j.get("ok"),
                "logits": {k: lg.get(k) for k in keep if k in lg},
                "per_file": lg.get("per_file"), "stderr_tail": r["stderr"][-800:] if r["rc"] not in (0, 1) else ""}

    def logits(self) -> None:
        t = time.monotonic()
        for m, port in ENGINE_PORTS.items():
            self.start_engine(m, port)
        ready = self.wait_engines(limit=min(360, max(60, self.left() - 120)))
        self.run.step("engines", ok=all(x["healthy"] for x in ready.values()), seconds=round(time.monotonic() - t, 1),
                      engines=ready)
        for m in gfc.MODELS:
            host = gfc.host_name("030", m)
            if not ready.get(m, {}).get("healthy") or not self.files(host):
                self.run.step(f"logits_{m}", ok=False, skipped="no engine or no files",
                              files=len(self.files(host)))
                continue
            port = ENGINE_PORTS[m]
            res = {"correct": self.verify_logits(host, port, None, 8)}
            for how, rel in DOCTORED.items():
                dst = self.root / f"doctored-{m}-{how}"
                d = sh([str(self.py("models")), "-c", DOCTOR, str(self.out_dir(host)), str(dst), how, str(rel or 0)],
                       timeout=300, log=self.log)
                res[how] = {"doctor": gfc.last_json(d["stdout"]), "doctor_rc": d["rc"],
                            **self.verify_logits(host, port, dst, 8)}
            ok = (res["correct"]["rc"] == 0 and res["correct"]["logits"].get("ok") is True
                  and res["correct"]["logits"].get("applies") is True
                  and all(res[h]["rc"] == 1 and res[h]["logits"].get("ok") is False
                          and res[h]["logits"].get("applies") is True for h in JUDGED))
            self.run.step(f"logits_{m}", ok=ok, model=m, layer_ids=IDS_LOGITS, engine_port=port, **res)
        self.stop_engines()
        self.run.step("engines_stopped", ok=True, gpu_processes_after=self.wait_gpu_free(30))

    def control(self) -> None:
        """The server flow without --no-enable-prefix-caching on DeepSeek-V3 (recorded either way)."""
        if self.left() < 270:
            self.run.step("control_prefix_caching_on", ok=True, skipped=f"{self.left():.0f} s left of --budget")
            return
        # the playbook vLLM 0.20.0 runs (check last-chunk: the no-chunked-prefill one), without the flag
        text = NO_CHUNKED.read_text()
        lines = [line for line in text.splitlines(keepends=True) if '"--no-enable-prefix-caching",' not in line]
        removed = len(text.splitlines()) - len(lines)
        pb = self.root / "eagle3-speculators-0.9.0-prefix-caching-on.yaml"
        pb.write_text("".join(lines).replace(f"name: {NO_CHUNKED.stem}\n",
                                             "name: eagle3-speculators-0.9.0-prefix-caching-on\n", 1))
        inv = json.loads(self.inv.read_text())
        host = gfc.host_name("srv", "deepseek_v3")
        inv["hosts"][host]["playbook"] = str(pb)
        inv["hosts"][host]["vars"]["port"] = CONTROL_PORT
        inv_path = self.root / "inventory-control.yaml"
        inv_path.write_text(json.dumps(inv, indent=2))
        shutil.rmtree(self.out_dir(host), ignore_errors=True)
        ex = self.extract(host, timeout=min(self.args.server_job_timeout, max(60, self.left() - 60)), inv=inv_path)
        ex["server_command"] = self.server_command(host)
        ex["no_enable_prefix_caching"] = "--no-enable-prefix-caching" in (ex.get("server_command") or [])
        v = self.ro("verify", host, "--all", "--json", timeout=240, inv=inv_path)
        vj = v["json"] or {}
        short = [i for i in (vj.get("inconsistent") or []) if "rows for" in str(i.get("problem"))]
        ex["verify"] = {"rc": v["rc"], "ok": vj.get("ok"), "files": vj.get("files"),
                        "inconsistent_count": vj.get("inconsistent_count"), "short_named": short[:20],
                        "unloadable_count": vj.get("unloadable_count")}
        lg = self.verify_logits(host, ENGINE_PORTS["deepseek_v3"], None, 4) if self.files(host) else None
        ex["logits_on_server_flow"] = lg
        cmp_res = None
        if self.files(host) and self.left() > 60:
            res_file = self.root / "control-compare.json"
            cmd = [str(self.py("models")), str(gfc.GPU / "flows_compare.py"),
                   "--ref-model", str(self.root / "ckpt" / "deepseek_v3"), "--dataset", str(self.dataset),
                   "--max-model-len", str(gfc.MAX_MODEL_LEN), "--device", "cuda", "--json", str(res_file),
                   "--output", f"{host}={self.out_dir(host)}:hs:{','.join(map(str, gfc.IDS_SRV))}"]
            r = sh(cmd, timeout=min(300, max(60, self.left())), log=self.log)
            cmp_res = {"rc": r["rc"], "seconds": r["seconds"],
                       "result": json.loads(res_file.read_text()) if res_file.exists() else None,
                       "stderr_tail": r["stderr"][-1500:] if r["rc"] else ""}
        ex["compare"] = cmp_res
        self.run.step("control_prefix_caching_on", ok=True, recorded_not_judged=True, lines_removed=removed,
                      playbook=pb.name, **ex)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/root/e2e")
    ap.add_argument("--out", required=True)
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--resume-rows", type=int, default=8)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--job-timeout", type=float, default=240)
    ap.add_argument("--server-job-timeout", type=float, default=360)
    ap.add_argument("--budget", type=float, default=900)
    ap.add_argument("--dataset", choices=("default", "prefix"), default="prefix")
    ap.add_argument("--control", action="store_true", help="also the server flow without --no-enable-prefix-caching")
    ap.add_argument("--base-python", default=None)
    ap.add_argument("--controller-cache", default=None)
    ap.add_argument("--code-rev", default=None)
    args = ap.parse_args(argv)
    args.steps, args.probes, args.layer_change, args.stop_after_files = "flows", False, False, 0
    if not args.controller_cache and (Path(args.work) / "rocache").is_dir():
        args.controller_cache = str(Path(args.work) / "rocache")
    gfc.IDS_030 = IDS_LOGITS          # the inventory's 0.3.0-flow layer ids: the last one is the model's last
    h = LogitsCheck(args)
    try:
        h.setup()
        h.build()
        h.inventory()
        h.patch()
        h.flows()
        h.logits()
        if args.control:
            h.control()
    except Exception as exc:   # recorded: the steps done so far stand
        h.run.step("crashed", ok=False, error=f"{type(exc).__name__}: {exc}")
    except SystemExit as exc:
        h.run.step("stopped", ok=False, error=str(exc))
    finally:
        h.stop_engines()
    return h.run.finish(("extract_", "logits_", "build", "engines"))


if __name__ == "__main__":
    sys.exit(main())
