"""GPU proof of the user's model on both flows, by measures that count every vector (issue 34 item 6), and
the resume checks of issue 32 on the GPU.

Runs ON a lent GPU machine (offline; ../shared/GPU-NOTES.md) against the carried bundle, through
remote-ops itself over `connection: local` hosts, as benchmarks/gpu/model_check.py and benchmarks/gpu/server_check.py do:

  setup      interpreters over the bundle: models (tf/ : a copy of site/speculators : site/ : model/), the
             server (tf/ : server/ : site/ : model/) and speculators 0.9.0's client (spec090/ : server/ : site/)
  build      benchmarks/gpu/lib/models.py --unambiguous-routing: a tiny random DeepSeek-V3 (MLA, 2 dense + 6 MoE
             layers, noaux_tc) and the Kimi-K2.5-shaped wrapper of the same text weights; every router weight
             x0.01 and every correction bias 0.25 apart, seeded by the key without `language_model.`, so
             bf16 and float32 choose the same experts. The text tensors of both are compared BY HASH before
             anything runs: a wrong fixture stops the check here. Arrow copies of the dataset for the server
             flow (as `speculators prepare-data` writes them).
  flows      per model (deepseek_v3, kimi_k25) and flow: the 0.3.0 flow (`patch`, then `extract --tail`,
             layer ids 1,3,5,6) and the server flow (speculators 0.9.0 + vLLM's extract_hidden_states,
             `extract --tail`, aux layer ids 2,4,6,7: the same decoder layers), then `verify`
  compare    benchmarks/gpu/flows_compare.py: every token vector of the four outputs against ONE float32
             transformers forward of the DeepSeek-V3 checkpoint (n_total, n >= 0.999, min cosine), the
             wrapper against the plain model in each flow, the server flow against the 0.3.0 flow for each
             model, a negative control (rows rolled by one token must fail), the routers' float32 margins
  resume     (issue 32) the 0.3.0 flow on the DeepSeek-V3 checkpoint over a long dataset: `extract`, `stop`
             once files are written, `extract --tail` again with more samples: only the missing files are
             written (the earlier ones untouched), `verify`; with --layer-change, a relaunch with other
             layer ids over that output must be refused before the engine starts (no file changes)
  The server flow's Kimi-K2.5 run sets the shipped playbook's var trust_remote_code: true (the server runs
  with --trust-remote-code): vLLM loads the wrapper's image processor (auto_map, custom code) at start;
  speculators 0.3.0's generator passes trust_remote_code=True to its AutoConfig and ModelConfig itself.
  --probes runs Kimi with the var left false too and records what happens (extract's preflight refuses it,
  naming the var, before the server starts).
  n_probe    (--probes) the server flow on DeepSeek-V3 with launch_vllm.py's default form of ids, the last
             one = the number of layers ([2, 4, 5, 8]): what happens (vLLM 0.20.0's deepseek_v2.py gathers
             an aux state only before a layer, so id 8 of 8 layers is never gathered; extract's preflight
             refuses it, with that file and line, before the server starts)

  --dataset prefix (issue 50 item 1): the flows run on prefix_rows() instead of benchmarks/gpu/lib/models.py's rows: rows
             sharing two long system-prompt-like prefixes (one row IS the prefix alone), exact duplicate rows
             (next to their original, so in flight together, and far after it, so its blocks were computed
             before), and plain rows; the shipped server command passes --no-enable-prefix-caching, and each
             server-flow step records the command the job ran (its job.json) and the server's log lines on
             prefix caching

Every step writes into --out (rewritten after each), and a step that would start after --budget seconds is
recorded as skipped.

    python3 benchmarks/gpu/flows_check.py --work /root/e2e --out $OUT/gpu_flows_tp1.json --code-rev REV
    python benchmarks/render/gpu_results.py > benchmarks/GPU_RESULTS.md      # here, with the JSON in results/
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks.gpu.lib.connector import CONNECTORS, server_setup  # noqa: E402
from benchmarks.gpu.lib.dataset import DATASET_BUILDER  # noqa: E402
from benchmarks.gpu.lib.harness import (HOST_ENV, Run, gpu_names, kill_group, last_json, remote_ops, sh,  # noqa: E402,F401
                                        unpack_bundle)
from benchmarks.gpu.model_check import pristine_package_copy  # noqa: E402
from benchmarks.gpu.server_check import marker_pids, port_free  # noqa: E402

GPU = REPO / "benchmarks" / "gpu"
PB030 = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"
PB090 = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.9.0.yaml"
MODELS = ("deepseek_v3", "kimi_k25")
# the outputs compared with each other (host names, host_name(flow, model)): the wrapper and the plain
# checkpoint in each flow, then each checkpoint across the flows
PAIRS = (("030-kimi_k25", "030-deepseek_v3"), ("srv-kimi_k25", "srv-deepseek_v3"),
         ("srv-deepseek_v3", "030-deepseek_v3"), ("srv-kimi_k25", "030-kimi_k25"))
IDS_030 = "1,3,5,6"              # data_<i>.pt: the output of decoder layer i
IDS_SRV = [2, 4, 6, 7]           # hs_<i>.safetensors: aux id k = the output of decoder layer k-1 (same layers)
IDS_PROBE = [2, 4, 5, 8]         # launch_vllm.py's [2, n//2, n-3, n] for n = 8
MAX_MODEL_LEN = 1024
PORTS = {"deepseek_v3": 8801, "kimi_k25": 8802, "probe": 8803, "kimi_shipped": 8804}
# the server-flow hosts whose checkpoint's custom code the server must run (the playbook var trust_remote_code)
TRUSTED = ("kimi_k25",)


def prefix_rows(seed: int = 20261205, words: tuple[int, int] = (4, 1000)) -> tuple[list[list[int]], dict]:
    """Rows rich in shared prefixes and exact duplicates, all below MAX_MODEL_LEN (nothing is cut):
    40 rows = a 640-token prefix A + 8-360 tokens, 24 rows = a 400-token prefix B + 8-500 tokens, prefix A
    alone and prefix A + 1 token (every block of the row shared), 12 rows sharing prefix A's first 320 tokens,
    8 plain rows; then 12 exact duplicates next to their original and 12 at the end of the dataset."""
    rng = random.Random(seed)
    w = lambda n: [rng.randrange(*words) for _ in range(n)]   # noqa: E731
    a, b = [1] + w(639), [1] + w(399)
    rows = [a + w(rng.randrange(8, 360)) for _ in range(40)] + [b + w(rng.randrange(8, 500)) for _ in range(24)]
    rows += [list(a), a + w(1)] + [a[:320] + w(rng.randrange(50, 600)) for _ in range(12)]
    rows += [[1] + w(rng.randrange(100, 900)) for _ in range(8)]
    rng.shuffle(rows)
    near = sorted(rng.sample(range(len(rows)), 12), reverse=True)
    for i in near:                                # the copy right after its original: both in flight at once
        rows.insert(i + 1, list(rows[i]))
    far = rng.sample(range(len(rows) // 2), 12)   # copies of rows of the first half, at the end
    rows += [list(rows[i]) for i in far]
    assert max(map(len, rows)) < MAX_MODEL_LEN
    seen, dups = {}, 0
    for r in rows:
        dups += tuple(r) in seen
        seen[tuple(r)] = 1
    facts = {"rows": len(rows), "tokens": sum(map(len, rows)), "longest": max(map(len, rows)),
             "shortest": min(map(len, rows)), "distinct_rows": len(seen), "exact_duplicate_rows": dups,
             "duplicates_adjacent": 12, "duplicates_at_end": 12,
             "rows_with_prefix_a_640": sum(1 for r in rows if r[:640] == a),
             "rows_with_prefix_b_400": sum(1 for r in rows if r[:400] == b),
             "rows_sharing_first_320_of_a": sum(1 for r in rows if r[:320] == a[:320]),
             "row_equal_to_prefix_a": sum(1 for r in rows if r == a), "seed": seed}
    return rows, facts


def host_name(flow: str, model: str) -> str:
    return f"{flow}-{model}"


class FlowsCheck:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work).resolve()
        self.root = self.work / "flows-check"
        self.base_python = args.base_python or sys.executable
        self.run = Run(Path(args.out), 1, args.code_rev, False, check="gpu_flows_check")
        self.run.doc["budget_s"] = args.budget
        given = [x.strip() for x in getattr(args, "flows", "030,srv").split(",") if x.strip()]
        self.flow_names = [f for f in ("030", "srv") if f in given]
        if not self.flow_names or set(given) - {"030", "srv"}:
            raise SystemExit(f"--flows {','.join(given)!r}: give 030, srv or 030,srv")
        self.run.doc["flows"] = self.flow_names
        given = [x.strip() for x in getattr(args, "models", ",".join(MODELS)).split(",") if x.strip()]
        self.models = [m for m in MODELS if m in given]
        if not self.models or set(given) - set(MODELS):
            raise SystemExit(f"--models {','.join(given)!r}: give {' or '.join(MODELS)} or both")
        self.server_vars = json.loads(getattr(args, "server_vars", "{}") or "{}")
        if not isinstance(self.server_vars, dict):
            raise SystemExit(f"--server-vars {args.server_vars!r}: a JSON object of playbook vars")
        self.log = self.root / "commands.log"
        self.t0 = time.monotonic()

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.t0)

    def ro(self, *args: str, timeout: float, inv: Path | None = None) -> dict:
        return remote_ops(self.base_python, inv or self.inv, args, work=self.work, timeout=max(5.0, timeout),
                          log=self.log, controller_cache=self.args.controller_cache)

    def py(self, name: str) -> Path:
        return self.work / "bin" / name / "python"   # last word "python": remote-ops takes it for one

    # ------------------------------------------------------------------ steps
    def setup(self) -> None:
        t = time.monotonic()
        w = self.work
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        unpack_bundle(w, self.args.bundle)
        # as installed: files an earlier harness patched in place come back from the bundle
        copy = pristine_package_copy(w / "site", self.root / "spec",
                                     Path(self.args.bundle) if self.args.bundle else w / "bundle.tar.gz")
        model_dir = [f"{w}/model"] if (w / "model").is_dir() else []
        paths = {"models": [f"{w}/tf", str(self.root / "spec"), f"{w}/site"] + model_dir,
                 "server": [f"{w}/tf", f"{w}/server", f"{w}/site"] + model_dir,
                 "client": [f"{w}/spec090", f"{w}/server", f"{w}/site"]}
        for name, path in paths.items():
            f = self.py(name)
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(f"#!/bin/sh\nPYTHONPATH={':'.join(path)} exec {self.base_python} \"$@\"\n")
            f.chmod(0o755)
        missing = [d for d in ("site", "tf", "server", "spec090", "model") if not (w / d).is_dir()]
        self.run.doc["gpus"] = gpu_names()
        versions = {}
        for name in ("models", "server", "client"):
            versions[name] = last_json(sh([str(self.py(name)), "-c", VERSIONS], timeout=120)["stdout"])
        self.run.doc["versions"] = versions
        self.run.step("setup", ok=not missing and copy.get("copied", False), missing=missing,
                      seconds=round(time.monotonic() - t, 1), interpreters={k: ":".join(v) for k, v in paths.items()},
                      speculators_copy=copy)
        if missing:
            raise SystemExit(f"missing under {w}: {missing}")

    def build(self) -> None:
        ck = self.root / "ckpt"
        r = sh([str(self.py("models")), str(GPU / "lib" / "models.py"), str(ck), "--which", ",".join(MODELS),
                "--samples", str(self.args.samples), "--unambiguous-routing"], timeout=300,
               env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, log=self.log)
        lines = [json.loads(l) for l in r["stdout"].splitlines() if l.startswith("{")]
        shared = next((x["shared_tensors"] for x in lines if "shared_tensors" in x), None)
        routing = [x["routing"] for x in lines if "routing" in x]
        built = {x["model"]: x for x in lines if "model" in x}
        ds = next((x["dataset"] for x in lines if "dataset" in x), None)
        ok = r["rc"] == 0 and bool(shared and shared["ok"]) and len(routing) == 2 and set(built) == set(MODELS)
        self.run.step("build", ok=ok, rc=r["rc"], seconds=r["seconds"], models=built, dataset=ds, routing=routing,
                      shared_tensors=shared, stderr_tail=r["stderr"][-2000:] if not ok else "")
        if not ok:   # a wrong fixture must fail loudly, before any run
            raise SystemExit(f"fixture check failed: rc {r['rc']}, shared tensors {shared}; see steps.build")
        self.dataset = ck / "dataset.jsonl"
        self.rows = [json.loads(l)["input_ids"] for l in self.dataset.read_text().splitlines() if l.strip()]
        if self.args.dataset == "prefix":        # issue 50 item 1: shared prefixes and exact duplicates
            self.rows, facts = prefix_rows()
            self.dataset = ck / "prefix_dataset.jsonl"
            self.dataset.write_text("".join(json.dumps({"input_ids": x}) + "\n" for x in self.rows))
            self.run.doc["dataset"] = {"kind": "prefix", "path": str(self.dataset), **facts}
            self.run.step("prefix_dataset", ok=True, **facts)
        # the resume run's dataset: long enough that a stop lands while files are being written
        rng = random.Random(20261202)
        self.resume_rows = [[1] + [rng.randrange(4, 1000) for _ in range(rng.randrange(50, 600))]
                            for _ in range(self.args.resume_rows)]
        self.resume_dataset = ck / "resume.jsonl"
        self.resume_dataset.write_text("".join(json.dumps({"input_ids": x}) + "\n" for x in self.resume_rows))
        t = time.monotonic()
        arrow = {}
        wanted = (list(MODELS) if "flows" in self.args.steps else []) + \
            (["probe", "kimi_shipped"] if self.args.probes else [])
        for m in wanted:
            d = self.root / f"srv-data-{m}"
            r = sh([str(self.py("client")), "-c", DATASET_BUILDER, str(self.dataset), str(d)], timeout=300,
                   log=self.log)
            arrow[m] = {"rc": r["rc"], "dir": str(d), "built": last_json(r["stdout"]),
                        "stderr_tail": r["stderr"][-1500:] if r["rc"] else ""}
        self.run.step("server_datasets", ok=all(a["rc"] == 0 for a in arrow.values()),
                      seconds=round(time.monotonic() - t, 1), datasets=arrow)

    def inventory(self) -> None:
        ck = self.root / "ckpt"
        hosts = {}

        def env(name):
            return {**HOST_ENV, "REMOTE_OPS_STATE_DIR": str(self.root / f"state-{name}")}
        for m in MODELS:
            hosts[host_name("030", m)] = {
                "connection": "local", "python": str(self.py("models")), "workdir": str(self.root / "wd030"),
                "playbook": str(PB030), "env": env(host_name("030", m)),
                "vars": {"target_model": str(ck / m), "dataset": str(self.dataset),
                         "output_dir": str(self.root / f"out030-{m}"), "max_samples": len(self.rows),
                         "batch_size": 8, "layer_ids": IDS_030, "max_model_len": MAX_MODEL_LEN,
                         "gpu_memory_utilization": self.args.gpu_memory_utilization, "gpus": 1,
                         "tensor_parallel_size": 1}}
        # --server-connector async: the server loads benchmarks/gpu/lib/hs_async_connector.py (issue 47 item 2)
        pb090, server_py = server_setup(self.args.server_connector, self.py("server"), self.root)
        for m in list(MODELS) + (["probe", "kimi_shipped"] if self.args.probes else []):
            target = ck / {"probe": "deepseek_v3", "kimi_shipped": "kimi_k25"}.get(m, m)
            hosts[host_name("srv", m)] = {
                "connection": "local", "python": str(self.py("client")), "workdir": str(self.root / "wdsrv"),
                "playbook": str(pb090), "env": env(host_name("srv", m)),
                "vars": {"target_model": str(target), "preprocessed_data": str(self.root / f"srv-data-{m}"),
                         "max_samples": len(self.rows), "concurrency": 16,
                         "layer_ids": IDS_PROBE if m == "probe" else IDS_SRV, "port": PORTS[m],
                         "max_model_len": MAX_MODEL_LEN, "gpu_memory_utilization": self.args.gpu_memory_utilization,
                         "server_python": str(server_py), "server_ready_seconds": 300,
                         "tensor_parallel_size": 1, "gpus": 1, "trust_remote_code": m in TRUSTED,
                         **self.server_vars}}
        resume = json.loads(json.dumps(hosts[host_name("030", "deepseek_v3")]))
        resume["env"] = env("resume")
        # one sample per generate() call: the run lasts long enough for a stop to land mid-way
        resume["vars"].update({"dataset": str(self.resume_dataset), "output_dir": str(self.root / "out-resume"),
                               "max_samples": len(self.resume_rows), "batch_size": 1})
        hosts["resume"] = resume
        for d in ("wd030", "wdsrv"):
            (self.root / d).mkdir(exist_ok=True)
        self.inv = self.root / "inventory.yaml"
        self.inv.write_text(json.dumps({"hosts": hosts, "default": host_name("030", "deepseek_v3")}, indent=2))
        self.hosts = hosts
        self.run.step("inventory", ok=True, path=str(self.inv), hosts=sorted(hosts),
                      playbooks={h: Path(x["playbook"]).name for h, x in hosts.items()},
                      server_connector=self.args.server_connector, server_vars=self.server_vars,
                      models=list(self.models),
                      server_trust_remote_code=sorted(h for h, x in hosts.items()
                                                      if x["vars"].get("trust_remote_code")),
                      layer_ids={"0.3.0": IDS_030, "server": IDS_SRV}, max_model_len=MAX_MODEL_LEN)

    def patch(self) -> None:
        p = self.ro("patch", host_name("030", "deepseek_v3"), "--yes", "--json", timeout=180)
        j = p["json"] or {}
        self.run.step("patch", ok=p["rc"] == 0, rc=p["rc"], seconds=p["seconds"],
                      edits=[f"{e.get('edit')}: {e.get('state')}" for e in j.get("edits", [])],
                      stderr_tail=p["stderr"][-1500:])
        if p["rc"] != 0:
            raise SystemExit("patch failed")

    def out_dir(self, host: str) -> Path:
        v = self.hosts[host]["vars"]
        return Path(v["output_dir"]) if "output_dir" in v else Path(v["preprocessed_data"]) / "hidden_states"

    def files(self, host: str) -> list[Path]:
        d = self.out_dir(host)
        return sorted(d.glob("hs_*.safetensors" if host.startswith("srv") else "data_*.pt"))

    def gpu_apps(self) -> list[str]:
        smi = sh(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                 timeout=30)
        return [l.strip() for l in smi["stdout"].splitlines() if l.strip()]

    def wait_gpu_free(self, limit: float = 20.0) -> list[str]:
        t, apps = time.monotonic(), self.gpu_apps()
        while apps and time.monotonic() - t < limit:
            time.sleep(1)
            apps = self.gpu_apps()
        return apps

    def extract(self, host: str, timeout: float, inv: Path | None = None, skip_check: bool = False) -> dict:
        shutil.rmtree(self.out_dir(host), ignore_errors=True) if inv is None else None
        r = self.ro("extract", host, "--tail", "--json", *(["--skip-check"] if skip_check else []),
                    timeout=timeout, inv=inv)
        events = [x for x in (last_json(l) for l in r["stdout"].splitlines() if l.startswith("{")) if x]
        end = next((e for e in reversed(events) if e.get("event") == "end"), {})
        st = self.ro("status", host, "--json", timeout=60, inv=inv)
        job = (st["json"] or {}).get("job") or {}
        out = {"rc": r["rc"], "seconds": r["seconds"], "files": len(self.files(host)),
               "expected": self.hosts[host]["vars"]["max_samples"],
               "state": job.get("state"), "reason": job.get("reason"), "server": job.get("server"),
               "end": (end.get("status") or {}).get("reason") if end else None,
               "preflight": next((e.get("preflight") for e in events if e.get("preflight")), None),
               "stderr_tail": r["stderr"][-1500:] if r["rc"] else ""}
        if r["rc"] == 124:
            s = self.ro("stop", host, "--json", timeout=120, inv=inv)
            out["stopped_after_timeout"] = {"rc": s["rc"]}
        logs = self.ro("logs", host, "-n", "4000", "--json", timeout=60, inv=inv)
        lines = ((logs["json"] or {}).get("text") or "").splitlines()
        out["handoff_line"] = next((l for l in lines if l.startswith("captured states ")), None)
        if host.startswith("srv"):   # the server command the job ran (its job.json), and what vLLM said of it
            out["server_command"] = self.server_command(host)
            out["server_prefix_caching_lines"] = [l[-600:] for l in lines if "prefix_caching" in l
                                                  or "prefix caching" in l.lower()][:6]
        if r["rc"] != 0:
            out["error_lines"] = [l for l in lines if "Error" in l or "error" in l][-10:]
            out["log_tail"] = lines[-25:]
        out["gpu_processes_after"] = self.wait_gpu_free()
        return out

    def server_command(self, host: str) -> list | None:
        """The server command of the host's newest job, as the job recorded it (jobs/<id>/job.json)."""
        found = sorted((self.root / f"state-{host}").glob("**/job.json"), key=lambda p: p.stat().st_mtime)
        for f in reversed(found):
            try:
                srv = json.loads(f.read_text()).get("server") or {}
            except (OSError, ValueError):
                continue
            cmd = srv.get("command") if isinstance(srv, dict) else None
            if cmd:
                return cmd
        return None

    def flows(self) -> None:
        self.results = {}
        for flow in self.flow_names:
            for m in self.models:
                host = host_name(flow, m)
                need = 90 if flow == "030" else 150
                if self.left() < need:
                    self.run.step(f"extract_{host}", ok=False, skipped=f"{self.left():.0f} s left of --budget")
                    continue
                limit = self.args.job_timeout if flow == "030" else self.args.server_job_timeout
                ex = self.extract(host, timeout=min(limit, max(30, self.left())))
                v = self.ro("verify", host, *(["--all"] if flow == "srv" else []), "--json", timeout=180)
                ex["verify"] = {"rc": v["rc"], "result": v["json"], "stderr_tail": v["stderr"][-600:]}
                ok = ex["rc"] == 0 and ex["files"] == len(self.rows) and v["rc"] == 0
                if flow == "srv" and self.args.dataset == "prefix":   # the shipped flag, in the command run
                    ex["no_enable_prefix_caching"] = "--no-enable-prefix-caching" in (ex.get("server_command") or [])
                    ok = ok and ex["no_enable_prefix_caching"]
                self.results[host] = ok
                self.run.step(f"extract_{host}", ok=ok, flow="0.3.0" if flow == "030" else "server (0.9.0)",
                              model=m, **ex)

    def compare(self) -> None:
        outs = []
        for flow in self.flow_names:
            for m in self.models:
                host = host_name(flow, m)
                if self.files(host):
                    ids = IDS_030 if flow == "030" else ",".join(map(str, IDS_SRV))
                    outs += ["--output", f"{host}={self.out_dir(host)}:{'pt' if flow == '030' else 'hs'}:{ids}"]
        pairs = []
        for a, b in PAIRS:
            if f"{a}=" in " ".join(outs) and f"{b}=" in " ".join(outs):
                pairs += ["--pair", f"{a},{b}"]
        res_file = self.root / "compare.json"
        neg = "030-deepseek_v3" if "030-deepseek_v3=" in " ".join(outs) else None
        cmd = [str(self.py("models")), str(GPU / "flows_compare.py"),
               "--ref-model", str(self.root / "ckpt" / "deepseek_v3"), "--dataset", str(self.dataset),
               "--max-model-len", str(MAX_MODEL_LEN), "--device", "cuda", "--json", str(res_file), *outs, *pairs,
               *(["--negative", neg] if neg else [])]
        r = sh(cmd, timeout=min(400, max(60, self.left())), log=self.log)
        res = json.loads(res_file.read_text()) if res_file.exists() else None
        # every output of the flows run (2 models each), and every pair whose two outputs are among them
        want_pairs = sum(1 for a, b in PAIRS if {a.split("-")[0], b.split("-")[0]} <= set(self.flow_names)
                         and {a.split("-", 1)[1], b.split("-", 1)[1]} <= set(self.models))
        every = (res is not None and len(res.get("outputs") or {}) == len(self.flow_names) * len(self.models)
                 and len(res.get("pairs") or {}) == want_pairs)
        self.run.step("compare", ok=bool(res and res.get("ok")) and every, rc=r["rc"], seconds=r["seconds"],
                      flows=list(self.flow_names), all_outputs=every,
                      **({"all_four_outputs": every} if len(self.flow_names) == 2 else {}),
                      result=res, stderr_tail=r["stderr"][-2000:] if r["rc"] else "")

    def resume(self) -> None:
        host = "resume"
        out = self.out_dir(host)
        shutil.rmtree(out, ignore_errors=True)
        launch = self.ro("extract", host, "--json", timeout=300)
        if launch["rc"] != 0:
            self.run.step("resume_after_stop", ok=False, launch_rc=launch["rc"], launch=launch["json"],
                          stderr_tail=launch["stderr"][-1500:])
            return
        t0, seen, job, asked = time.monotonic(), [], {}, 0.0
        while time.monotonic() - t0 < 240:
            if len(self.files(host)) >= self.args.stop_after_files:
                break
            if time.monotonic() - asked > 5:       # the job's state now and then; the files every 0.2 s
                asked = time.monotonic()
                st = self.ro("status", host, "--json", timeout=60)
                job = ((st["json"] or {}).get("job") or {})
                if st["rc"] != 0 or job.get("state") not in ("running", "starting"):
                    break
            time.sleep(0.2)
        seen = self.gpu_apps()
        stop = self.ro("stop", host, "--json", timeout=240)
        after = self.wait_gpu_free()
        job_id = ((launch["json"] or {}).get("job") or {}).get("job_id")
        files_at_stop = self.files(host)
        # what a stop may leave: the files written whole; a file being written is a temporary, never data_<N>
        before = {p.name: p.stat().st_mtime_ns for p in files_at_stop}
        stopped = {"launch_rc": launch["rc"], "files_at_stop": len(before), "gpu_processes_while_running": seen,
                   "stop_rc": stop["rc"], "stop": {k: (stop["json"] or {}).get(k) for k in ("clean", "terminated", "killed")},
                   "gpu_processes_after": after, "marker_processes_after": marker_pids(job_id),
                   "state_after": ((self.ro("status", host, "--json", timeout=60)["json"] or {}).get("job") or {}).get("state")}
        # the same command again (a run identity, issue 32, covers max_samples: the relaunch is the same run)
        target = len(self.resume_rows)
        inv = json.loads(self.inv.read_text())
        inv_path = self.inv
        r = self.extract(host, timeout=min(self.args.job_timeout, max(30, self.left())), inv=inv_path)
        now_files = self.files(host)
        untouched = sum(1 for p in now_files if before.get(p.name) == p.stat().st_mtime_ns)
        indexes = sorted(int(p.stem.split("_")[1]) for p in now_files)
        v = self.ro("verify", host, "--json", timeout=180, inv=inv_path)
        ok = (launch["rc"] == 0 and 0 < len(before) < len(self.resume_rows) and stop["rc"] == 0 and not after
              and r["rc"] == 0 and len(now_files) == target and untouched == len(before)
              and indexes == list(range(target)) and v["rc"] == 0)
        logs = self.ro("logs", host, "-n", "400", "--json", timeout=60)
        said = [l for l in ((logs["json"] or {}).get("text") or "").splitlines() if "resum" in l.lower()][-3:]
        self.run.step("resume_after_stop", ok=ok, stopped=stopped, relaunch=r, max_samples=target, resume_lines=said,
                      files_after=len(now_files), untouched_of_before=untouched, indexes_contiguous=indexes == list(range(target)),
                      verify={"rc": v["rc"], "result": v["json"]})
        if not self.args.layer_change:
            self.run.step("resume_layer_change_refused", ok=False,
                          skipped="not run: this code has no run identity (issue 32 item 1 not merged)")
            return
        inv["hosts"][host]["vars"]["layer_ids"] = "1,3,5,7"   # other ids over the same output
        inv_path2 = self.root / "inventory-layer-change.yaml"
        inv_path2.write_text(json.dumps(inv, indent=2))
        mt = {p.name: p.stat().st_mtime_ns for p in self.files(host)}
        t = time.monotonic()
        x = self.ro("extract", host, "--tail", "--json", timeout=240, inv=inv_path2)
        j = last_json(x["stdout"]) or {}
        changed = [p.name for p in self.files(host) if mt.get(p.name) != p.stat().st_mtime_ns]
        said = (x["stderr"] or "") + json.dumps(j, default=str)
        engine_started = "generator ready" in said or "Loading" in said
        self.run.step("resume_layer_change_refused", ok=x["rc"] != 0 and not changed and not engine_started
                      and len(self.files(host)) == len(mt), rc=x["rc"], seconds=round(time.monotonic() - t, 1),
                      files_changed_or_added=changed[:10] + [f"{len(self.files(host)) - len(mt)} added"],
                      message=(j.get("message") or j.get("error") or "")[:800] if isinstance(j, dict) else None,
                      stderr_tail=x["stderr"][-1500:], gpu_processes_after=self.wait_gpu_free())

    def probes(self) -> None:
        """Recorded, not judged: the server flow with launch_vllm.py's id n on DeepSeek-V3, and the shipped
        playbook with the var trust_remote_code false (its default) on the Kimi-K2.5-shaped checkpoint. Each:
        what extract's preflight says (--dry-run), then what vLLM itself does (--skip-check, which skips the
        served-model checks that refuse both)."""
        for m, step, extra in (("probe", "n_probe_server_default_ids", {"layer_ids": IDS_PROBE, "model": "deepseek_v3"}),
                               ("kimi_shipped", "probe_kimi_shipped_server_command",
                                {"model": "kimi_k25", "playbook": PB090.name, "trust_remote_code": False})):
            if self.left() < 60:
                self.run.step(step, ok=True, skipped=f"{self.left():.0f} s left of --budget")
                continue
            dry = self.ro("extract", host_name("srv", m), "--dry-run", "--json", timeout=120)
            pre = {"rc": dry["rc"], "message": (dry["json"] or {}).get("message") if isinstance(dry["json"], dict)
                   else None, "problems": ((dry["json"] or {}).get("preflight") or {}).get("problems")
                   if isinstance(dry["json"], dict) else None}
            ex = self.extract(host_name("srv", m), timeout=min(240, max(30, self.left())), skip_check=True)
            self.run.step(step, ok=True, **extra, preflight_dry_run=pre, **ex)


VERSIONS = r'''
import json, importlib.metadata as md
out = {}
for n in ("vllm", "speculators", "torch", "transformers", "compressed-tensors", "datasets", "pyarrow", "safetensors"):
    try:
        out[n] = md.version(n)
    except md.PackageNotFoundError:
        out[n] = None
print(json.dumps(out))
'''


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/root/e2e")
    ap.add_argument("--out", required=True)
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--resume-rows", type=int, default=600)
    ap.add_argument("--stop-after-files", type=int, default=48)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--job-timeout", type=float, default=240, help="seconds for one 0.3.0-flow extract --tail")
    ap.add_argument("--server-job-timeout", type=float, default=360, help="seconds for one server-flow extract --tail")
    ap.add_argument("--budget", type=float, default=1200, help="seconds for the whole check")
    ap.add_argument("--steps", default="flows,compare,resume")
    ap.add_argument("--flows", default="030,srv",
                    help="which flows the flows and compare steps run: 030 (speculators 0.3.0's generator), srv "
                         "(the server flow of speculators 0.9.0), or both (default)")
    ap.add_argument("--server-connector", choices=CONNECTORS, default="vllm-no-chunked",
                    help="the server flow's playbook on vLLM 0.20.0 (benchmarks/gpu/lib/connector.py): the shipped "
                         "no-chunked-prefill one (default), the shipped main one, async (hs_async_connector.py: vLLM "
                         "0.22's write path) or vllm-chunked (vLLM's connector with chunked prefill on)")
    ap.add_argument("--server-vars", default="{}", help="JSON: playbook vars every server-flow host also gets, "
                                                         "e.g. '{\"max_num_batched_tokens\": 1024}'")
    ap.add_argument("--models", default=",".join(MODELS), help="which checkpoints the flows and compare steps run "
                                                               "(default: both)")
    ap.add_argument("--dataset", choices=("default", "prefix"), default="default",
                    help="prefix: rows rich in shared prefixes and exact duplicates (prefix_rows, issue 50 item 1)")
    ap.add_argument("--layer-change", action="store_true", help="also check that other layer ids are refused "
                                                                "on resume (needs issue 32's run identity)")
    ap.add_argument("--probes", action="store_true", help="also run the server flow with ids [2, 4, 5, 8] on "
                                                           "DeepSeek-V3 and the shipped command on Kimi (recorded)")
    ap.add_argument("--base-python", default=None)
    ap.add_argument("--controller-cache", default=None)
    ap.add_argument("--code-rev", default=None)
    args = ap.parse_args(argv)
    if not args.controller_cache and (Path(args.work) / "rocache").is_dir():
        args.controller_cache = str(Path(args.work) / "rocache")
    h = FlowsCheck(args)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    try:
        h.setup()
        h.build()
        h.inventory()
        if "flows" in steps:
            h.patch()
            h.flows()
        if "compare" in steps:
            h.compare()
        if "resume" in steps:
            if "flows" not in steps:
                h.patch()
            h.resume()
        if args.probes:
            h.probes()
    except Exception as exc:   # recorded: the steps done so far stand
        h.run.step("crashed", ok=False, error=f"{type(exc).__name__}: {exc}")
    except SystemExit as exc:
        h.run.step("stopped", ok=False, error=str(exc))
    return h.run.finish(("extract_", "compare", "resume", "build"))


if __name__ == "__main__":
    sys.exit(main())
