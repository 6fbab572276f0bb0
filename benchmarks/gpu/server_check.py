"""GPU end-to-end check of the server flow: playbooks/eagle3-speculators-0.9.0.yaml on vLLM 0.20.0.

Runs ON a machine with NVIDIA GPUs (the lent H200s) and drives everything through remote-ops itself over a
``connection: local`` host, as benchmarks/gpu/extract_check.py does: the shipped playbook starts vLLM's OpenAI server
with the speculative method ``extract_hidden_states`` and ExampleHiddenStatesConnector (extract.server),
waits for GET /health, then runs speculators 0.9.0's own ``speculators generate-offline-data`` (the real
client, not a stand-in) against it. Each step's command, exit status, timing and evidence go into --out.

  setup   interpreters over the carried directories (see below); versions of both recorded
  model   the tiny random Llama of benchmarks/gpu/extract_check.py (MODEL_BUILDER, 8 layers, hidden 256; reused when
          /root/e2e/model exists) and Arrow datasets as `speculators prepare-data` writes them (input_ids,
          loss_mask, seq_len; torch format), built with the client's `datasets`
  (c)     `extract --tail`: preflight (both import probes, the port, GPUs, requires), server start, health,
          client; every sample written; no GPU process left once the job ended (the supervisor stops the
          server)
  (d)     `verify --all`: the hs_<N>.safetensors layout speculators' training reads
  (e)     every sample against a float32 transformers forward of the same checkpoint: benchmarks/gpu/extract_check.py's
          COMPARE with layout hs_safetensors (aux layer id k = the hook on layers[k-1]); min per-token cosine
  (f)     a second run stopped mid-way: `stop` while the client runs; nvidia-smi compute processes, the /proc
          marker scan and the server's port afterwards: nothing left
  (g)     relaunch over (f)'s output with a larger --max-samples (with --clients N > 1: the same one, each rank's
          share unchanged): only the missing samples are written
          (speculators' resume), then `verify`
  Issue 52 item 6 (--steps pa,pb,pd,pc): the prepared data written by speculators 0.9.0's REAL
  `speculators prepare-data` (pre-tokenized JSONL rows, --seq-length 4096, no render endpoint), max_samples
  5000 (more than the rows):
  (pa)    a prepared dataset with rows longer than max_model_len (2048): `extract --tail` is refused by the
          preflight: no job, no server process, 0 files
  (pb)    a complete run: `extract --tail`, then `status` reads N/N (expected = the rows, not max_samples)
          with its tokens counted
  (pd)    `verify --all`: every hs_<N>.safetensors file's token_ids compared with its row, 0 differ
  (pc)    the prepared data changed in place (one token of one row): prepare-data --overwrite into the same
          directory (its own refusal recorded), then prepare-data's output of the changed JSONL put in place of
          the directory's Arrow files; a resume (`extract --tail`) is refused before the server starts with 0
          files changed or added, and `verify --all` exits non-zero naming the change

Interpreters (PYTHONPATH over the machine's python with torch 2.11.0 and transformers 5.17.0):
  client    spec090/ : server/ : site/    speculators 0.9.0 (its own dir: site/ holds 0.3.0), datasets ...
  server    tf/ : server/ : site/         vLLM 0.20.0 with transformers 4.57.6, as every earlier GPU run
            (--server-transformers machine: the machine's 5.17.0 instead)
  reference tf/ : site/                   MODEL_BUILDER and COMPARE, as in benchmarks/gpu/extract_check.py
site/ and tf/ are benchmarks/gpu/lib/bundle.py's; server/ and spec090/ are benchmarks/gpu/wheels/server.txt and spec090.txt
(`pip install --no-deps --target /root/e2e/<name>`).

    python3 benchmarks/gpu/server_check.py --work /root/e2e --out result.json [--steps c,d,e,f,g] [--tp 1]
    python3 benchmarks/gpu/server_check.py --work /tmp/x --out /tmp/x.json --dry   # CPU: plan + inventory only
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks.gpu import extract_check as base  # noqa: E402  (MODEL_BUILDER, COMPARE, HOST_ENV, sh, last_json)
from benchmarks.gpu.lib import harness as common  # noqa: E402
from benchmarks.gpu.lib.dataset import DATASET_BUILDER  # noqa: E402
from benchmarks.gpu.lib.harness import run_steps  # noqa: E402
from remote_ops.agent import jobs as agent_jobs  # noqa: E402  (stdlib-only: the host's agent)

# the playbook vLLM 0.20.0 runs since check last-chunk (benchmarks/gpu/lib/connector.py)
PLAYBOOK = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.9.0-no-chunked-prefill.yaml"
KEY = PLAYBOOK.stem
LAYER_IDS = [2, 4, 5, 8]          # launch_vllm.py's [2, n//2, n-3, n] for the 8-layer model
MAX_MODEL_LEN = 2048

PD_SEQ_LENGTH = 4096             # prepare-data's --seq-length: above max_model_len, so long rows stay long
PD_MAX_SAMPLES = 5000            # the job's max_samples: more than the rows (expected = the rows)
PD_FILES = ("state.json", "dataset_info.json")   # with the *.arrow files: what prepare-data writes

# the rows of a prepared directory as the client reads them (datasets.load_from_disk)
PD_READ = r'''
import json, sys
from datasets import load_from_disk
ds = load_from_disk(sys.argv[1])
lens = [int(x) for x in ds["seq_len"]]
lim = int(sys.argv[2])
print(json.dumps({"rows": len(ds), "tokens": sum(lens), "longest": max(lens), "shortest": min(lens),
                  "columns": ds.column_names, "rows_at_or_over_max_model_len": sum(1 for n in lens if n >= lim)}))
'''

VERSIONS = r'''
import json, importlib.metadata as md
out = {}
for n in ("vllm", "speculators", "hs-connectors", "torch", "transformers", "datasets", "pyarrow", "fastapi",
          "starlette", "uvicorn", "openai", "pydantic", "huggingface-hub", "safetensors"):
    try:
        out[n] = md.version(n)
    except md.PackageNotFoundError:
        out[n] = None
print(json.dumps(out))
'''


RANK_LINE = re.compile(r"\[run_clients\] rank (\d+)/(\d+): ([^\n]*)")
PROCESSING_LINE = re.compile(r"Processing (\d+) samples")
EXISTING_LINE = re.compile(r"Found (\d+) existing samples for rank (\d+)")


def shares(target: int, world_size: int) -> list[tuple[int, int]]:
    """Each rank's [start, end) of the first ``target`` rows: speculators 0.9.0's get_indices_to_process
    (speculators/data_generation/offline.py) before it drops the rows already written."""
    size, rem = divmod(target, world_size)
    out = []
    for r in range(world_size):
        start = r * size + min(r, rem)
        out.append((start, start + size + (1 if r < rem else 0)))
    return out


def client_shares(text: str, clients: int, target: int, existing: set[int] | frozenset = frozenset()) -> dict:
    """What a job's log says of its clients: run_clients.py's line per rank (none with one client) and
    speculators' ``Processing K samples`` lines, against the shares ``clients`` ranks of ``target`` rows
    should take given the row indices already written (``existing``; a rank with nothing left logs no
    Processing line). ``ok``: every rank's line once, and the logged counts are the expected ones."""
    ranks = [(int(m.group(1)), int(m.group(2)), m.group(3).strip()) for m in RANK_LINE.finditer(text)]
    processing = sorted(int(m.group(1)) for m in PROCESSING_LINE.finditer(text))
    expected = sorted(k for k in (sum(1 for i in range(a, b) if i not in existing)
                                  for a, b in shares(target, clients)) if k)
    rank_ok = (sorted(r for r, n, _ in ranks) == list(range(clients)) and all(n == clients for _, n, _ in ranks)
               if clients > 1 else not ranks)
    return {"clients": clients, "target": target, "rank_lines": [f"rank {r}/{n}: {rest}" for r, n, rest in ranks],
            "processing": processing, "expected_processing": expected,
            "existing_found": sorted((int(m.group(2)), int(m.group(1))) for m in EXISTING_LINE.finditer(text)),
            "ok": rank_ok and processing == expected}


def rows_main(rng: random.Random) -> list[list[int]]:
    word = lambda: rng.randrange(4, 1024)   # noqa: E731
    rows = [[1] + [word() for _ in range(rng.randrange(300, 500))] for _ in range(40)]
    prefix = [1] + [word() for _ in range(700)]
    rows += [prefix + [word() for _ in range(rng.randrange(50, 200))] for _ in range(16)]   # shared prefix
    rows += [[1] + [word() for _ in range(rng.randrange(1500, MAX_MODEL_LEN - 8))] for _ in range(4)]   # long
    return rows


def rows_long(rng: random.Random, n: int) -> list[list[int]]:
    return [[1] + [rng.randrange(4, 1024) for _ in range(rng.randrange(400, 600))] for _ in range(n)]


def rows_prepared(rng: random.Random) -> list[list[int]]:
    """40 rows of 150-1,200 tokens for the complete run (pb)."""
    return [[1] + [rng.randrange(4, 1024) for _ in range(rng.randrange(150, 1200))] for _ in range(40)]


def sha256_file(path: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def port_free(port: int) -> bool:
    """Whether a server could bind ``port`` on every address: the extract preflight's own test."""
    return agent_jobs.port_free(port)["free"]


def marker_pids(job_id: str | None = None) -> list[int]:
    """Processes whose environment carries the job's marker (any job's without ``job_id``)."""
    needle = f"REMOTE_OPS_JOB_ID={job_id}\0".encode() if job_id else b"REMOTE_OPS_JOB_ID="
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "environ").read_bytes() + b"\0":
                    found.append(int(d.name))
            except OSError:
                pass
    return found


class Harness(common.Harness):
    def __init__(self, args):
        super().__init__(args, "gpu_server_check")
        if os.environ.get("REMOTE_OPS_REHEARSAL"):   # benchmarks/evidence/server_flow_rehearsal.py: not a GPU result
            self.run.doc["rehearsal"] = os.environ["REMOTE_OPS_REHEARSAL"]

    @property
    def clients(self) -> int:
        """The job's client processes: --clients, else the playbook's own default (its var clients)."""
        if self.args.clients is not None:
            return self.args.clients
        import yaml
        return int((yaml.safe_load(PLAYBOOK.read_text()).get("vars") or {}).get("clients", 1))

    def job_log(self, host: str, inv: Path | None = None) -> str:
        logs = self.ro("logs", host, "-n", "20000", "--json", timeout=60, inv=inv)
        return (logs["json"] or {}).get("text") or ""

    # ------------------------------------------------------------------ setup
    def paths(self) -> dict[str, str]:
        w = self.work
        server_tf = f"{w}/tf:" if self.args.server_transformers == "4.57.6" else ""
        return {"client": f"{w}/spec090:{w}/server:{w}/site", "server": f"{server_tf}{w}/server:{w}/site",
                "reference": f"{w}/tf:{w}/site"}

    def python(self, which: str) -> Path:
        # bin/<which>/python: its last word is "python", so remote-ops takes it for an interpreter
        return self.work / "bin" / which / "python"

    def setup(self) -> None:
        t = time.monotonic()
        missing = [d for d in ("site", "tf", "server", "spec090") if not (self.work / d).is_dir()]
        for which, path in self.paths().items():
            f = self.python(which)
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(f"#!/bin/sh\nPYTHONPATH={path} exec {self.base_python} \"$@\"\n")
            f.chmod(0o755)
        versions = {} if self.args.dry else {
            w: base.last_json(base.sh([str(self.python(w)), "-c", VERSIONS], timeout=120)["stdout"])
            for w in ("client", "server")}
        smi = base.sh(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                      timeout=30)
        self.run.doc["versions"] = versions
        self.run.doc["pythonpath"] = self.paths()
        self.run.doc["gpus"] = [l.strip() for l in smi["stdout"].splitlines() if l.strip()]
        self.run.step("setup", ok=not missing, missing_dirs=missing, seconds=round(time.monotonic() - t, 1),
                      base_python=self.base_python, server_transformers=self.args.server_transformers)
        if missing and not self.args.dry:
            raise SystemExit(f"missing under {self.work}: {', '.join(missing)} (benchmarks/gpu/lib/bundle.py + benchmarks/gpu/wheels/*.txt)")

    def build_model_and_data(self) -> None:
        w, t = self.work, time.monotonic()
        model = {"reused": True}
        if not (w / "model" / "config.json").exists() and not self.args.dry:
            r = base.sh([str(self.python("reference")), "-c", base.MODEL_BUILDER, str(w / "model")], timeout=300,
                        log=self.log)
            if r["rc"] != 0:
                self.run.step("model", ok=False, rc=r["rc"], stderr=r["stderr"][-3000:])
                raise SystemExit("model build failed")
            model = base.last_json(r["stdout"])
        rng = random.Random(20261201)
        sets = {"sf_data": rows_main(rng), "sf_data_stop": rows_long(rng, self.args.stop_rows)}
        built = {}
        for name, rows in sets.items():
            if not self.need_old:        # only the prepared-data steps (pa..pc): their data comes from prepare-data
                continue
            d = w / name
            shutil.rmtree(d, ignore_errors=True)
            d.parent.mkdir(parents=True, exist_ok=True)
            jsonl = w / f"{name}.jsonl"
            jsonl.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows))
            if self.args.dry:
                built[name] = {"rows": len(rows), "tokens": sum(map(len, rows))}
                continue
            r = base.sh([str(self.python("client")), "-c", DATASET_BUILDER, str(jsonl), str(d)], timeout=300,
                        log=self.log)
            if r["rc"] != 0:
                self.run.step("model_and_data", ok=False, dataset=name, rc=r["rc"], stderr=r["stderr"][-3000:])
                raise SystemExit("dataset build failed")
            built[name] = base.last_json(r["stdout"])
        self.samples = len(sets["sf_data"])
        self.run.step("model_and_data", ok=True, seconds=round(time.monotonic() - t, 1), model=model,
                      datasets=built, layer_ids=LAYER_IDS, max_model_len=MAX_MODEL_LEN,
                      shared_prefix_rows=16, scheduler_note="rows up to ~2k tokens, 16 sharing a 700-token prefix")

    def inventory(self) -> Path:
        w, tp = self.work, self.args.tp
        clients = {} if self.args.clients is None else {"clients": self.args.clients}

        def host(data: str, max_samples: int, port: int, state: str, concurrency: int = 16) -> dict:
            return {"connection": "local", "python": str(self.python("client")), "workdir": str(w / "wd"),
                    "playbook": str(PLAYBOOK),
                    "env": {**base.HOST_ENV, "REMOTE_OPS_STATE_DIR": str(w / state)},
                    "vars": {"target_model": str(w / "model"), "preprocessed_data": str(w / data),
                             "max_samples": max_samples, "concurrency": concurrency, "layer_ids": LAYER_IDS,
                             "port": port, "tensor_parallel_size": tp, "gpus": 0 if self.args.no_gpu else tp,
                             "max_model_len": MAX_MODEL_LEN,
                             "gpu_memory_utilization": 0.3, "server_python": str(self.python("server")),
                             "server_ready_seconds": 420, **clients}}
        p = self.args.port
        self.stop_samples = self.args.stop_rows
        inv = {"hosts": {"gpu-sf": host("sf_data", self.samples, p, "state-sf"),
                         # 2 requests in flight: the stop must land while the client still runs
                         "gpu-sf-stop": host("sf_data_stop", self.stop_samples, p + 1, "state-sf-stop", 2)},
               "default": "gpu-sf"}
        (w / "wd").mkdir(parents=True, exist_ok=True)
        inv["hosts"]["gpu-pd"] = host("pd_data", PD_MAX_SAMPLES, p + 2, "state-pd")
        inv["hosts"]["gpu-pd-long"] = host("pd_long", PD_MAX_SAMPLES, p + 3, "state-pd-long")
        self.inv = w / "inventory-server.yaml"
        self.inv.write_text(json.dumps(inv, indent=2))
        self.run.doc["playbook"] = str(PLAYBOOK.relative_to(REPO))
        self.run.doc["clients"] = self.clients
        self.run.doc["host_vars"] = {name: h["vars"] for name, h in inv["hosts"].items()}
        return self.inv

    def ro(self, *args: str, timeout: float = 300, inv: Path | None = None) -> dict:
        cmd = [self.controller_python, "-c",
               "import sys; sys.path.insert(0, sys.argv.pop(1)); from remote_ops.cli import main; "
               "sys.exit(main(sys.argv[1:]))", str(REPO), "-i", str(inv or self.inv), *args]
        env = {"PYTHONPATH": str(self.work / "site"), "COLUMNS": "200"}
        r = base.sh(cmd, timeout=timeout, env=env, log=self.log)
        r["argv"] = ["remote-ops", *args]
        r["json"] = base.last_json(r["stdout"]) if "--json" in args else None
        return r

    def gpu_apps(self) -> list[str]:
        smi = base.sh(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                      timeout=30)
        return [l.strip() for l in smi["stdout"].splitlines() if l.strip()]

    def hs_files(self, data: str) -> int:
        return len(list((self.work / data / "hidden_states").glob("hs_*.safetensors")))

    # ------------------------------------------------------------------ steps
    def step_c(self) -> None:
        r = self.ro("extract", "gpu-sf", "--tail", "--json", timeout=self.args.job_timeout)
        events = [json.loads(l) for l in r["stdout"].splitlines() if l.startswith("{")]
        end = next((e for e in reversed(events) if e.get("event") == "end"), {})
        st = self.ro("status", "gpu-sf", "--json", timeout=60)
        job = (st["json"] or {}).get("job") or {}
        text = self.job_log("gpu-sf")
        clients = client_shares(text, self.clients, self.samples)
        server_lines = [l for l in text.splitlines() if l.startswith("[server] ")]
        after, t_gpu = self.gpu_apps(), time.monotonic()
        while after and time.monotonic() - t_gpu < 15:     # the driver's list can lag the process's exit
            time.sleep(1)
            after = self.gpu_apps()
        files = self.hs_files("sf_data")
        self.run.step("c_extract_tail", ok=r["rc"] == 0 and files == self.samples and not after
                      and job.get("state") == "succeeded" and job.get("exit_code") == 0 and clients["ok"],
                      rc=r["rc"], clients=clients, seconds=r["seconds"], files=files,
                      expected=self.samples, end=end.get("status", {}).get("reason") if end else None,
                      status={k: job.get(k) for k in ("state", "reason", "exit_code", "server", "samples",
                                                      "elapsed_s", "rate_per_s", "layout")},
                      preflight=next((e.get("preflight") for e in events if e.get("preflight")), None),
                      server_log_lines=len(server_lines), server_log_head=server_lines[:5],
                      server_log_tail=server_lines[-8:], client_log_tail=[l for l in text.splitlines()
                                                                          if not l.startswith("[server]")][-12:],
                      gpu_processes_after_the_job=after, stderr_tail=r["stderr"][-2000:])

    def step_d(self) -> None:
        r = self.ro("verify", "gpu-sf", "--all", "--json", timeout=300)
        self.run.step("d_verify", ok=r["rc"] == 0 and bool((r["json"] or {}).get("ok")), rc=r["rc"],
                      seconds=r["seconds"], result=r["json"], stderr=r["stderr"][-1000:])

    def step_e(self) -> None:
        w = self.work
        opts = json.dumps({"layout": "hs_safetensors", "layer_ids": LAYER_IDS})
        r = base.sh([str(self.python("reference")), "-c", base.COMPARE, str(w / "model"),
                     str(w / "sf_data" / "hidden_states"), self.args.compare_device, opts], timeout=400, log=self.log)
        j = base.last_json(r["stdout"]) or {}
        self.run.step("e_compare_with_transformers", ok=r["rc"] == 0 and bool(j.get("ok")) and
                      (j.get("min_cosine") or 0) >= 0.999 and j.get("samples") == self.samples, rc=r["rc"],
                      seconds=r["seconds"], result=j, stderr=r["stderr"][-1500:] if r["rc"] else "")

    def step_f(self) -> None:
        launch = self.ro("extract", "gpu-sf-stop", "--json", timeout=300)
        seen_gpu, status_json, t0 = [], None, time.monotonic()
        while time.monotonic() - t0 < self.args.job_timeout:
            seen_gpu = self.gpu_apps()
            st = self.ro("status", "gpu-sf-stop", "--json", timeout=60)
            status_json = (st["json"] or {}).get("job") or {}
            if (seen_gpu or self.args.no_gpu) and self.hs_files("sf_data_stop") >= 32:
                break
            if status_json.get("state") not in ("running", "starting", None):
                break
            time.sleep(0.5)
        files_at_stop = self.hs_files("sf_data_stop")
        server_at_stop = status_json.get("server") if status_json else None
        stop = self.ro("stop", "gpu-sf-stop", "--json", timeout=240)
        after, t_gpu = self.gpu_apps(), time.monotonic()
        while after and time.monotonic() - t_gpu < 15:
            time.sleep(1)
            after = self.gpu_apps()
        job_id = ((launch["json"] or {}).get("job") or {}).get("job_id")
        marker_left = marker_pids(job_id)
        st = self.ro("status", "gpu-sf-stop", "--json", timeout=60)
        job = (st["json"] or {}).get("job") or {}
        self.files_after_stop = self.hs_files("sf_data_stop")
        clients = client_shares(self.job_log("gpu-sf-stop"), self.clients, self.stop_samples)
        self.run.step("f_stop_leaves_no_gpu_process",
                      ok=launch["rc"] == 0 and (bool(seen_gpu) or self.args.no_gpu) and stop["rc"] == 0 and not after and not marker_left
                      and port_free(self.args.port + 1) and job.get("state") == "stopped"
                      and (server_at_stop or {}).get("state") == "healthy"
                      and 0 < files_at_stop < self.stop_samples and clients["ok"],
                      clients=clients, launch_rc=launch["rc"], gpu_processes_while_running=seen_gpu, files_at_stop=files_at_stop,
                      server_at_stop=server_at_stop,
                      stop={"rc": stop["rc"], "clean": (stop["json"] or {}).get("clean"),
                            "terminated": (stop["json"] or {}).get("terminated"),
                            "killed": (stop["json"] or {}).get("killed"), "seconds": stop["seconds"]},
                      gpu_processes_after=after, marker_processes_after=marker_left, job_id=job_id,
                      port_free_after=port_free(self.args.port + 1),
                      status_after={k: job.get(k) for k in ("state", "reason", "server")})

    def step_g(self) -> None:
        done = getattr(self, "files_after_stop", None)
        if done is None:
            done = self.hs_files("sf_data_stop")
        # one client stops with a prefix written, so a relaunch with 64 more rows resumes it; several stop each
        # inside its own share (rank r's rows start at r x max_samples / N), so the stopped run is resumed with
        # its own max_samples: a smaller one would move the shares and leave files beyond it
        target = min(self.stop_samples, done + 64) if self.clients == 1 else self.stop_samples
        inv = json.loads(self.inv.read_text())
        inv["hosts"]["gpu-sf-stop"]["vars"]["max_samples"] = target
        inv_path = self.work / "inventory-server-resume.yaml"
        inv_path.write_text(json.dumps(inv, indent=2))
        before = {p.name: p.stat().st_mtime_ns for p in (self.work / "sf_data_stop" / "hidden_states").glob("hs_*")}
        done_idx = {int(n[3:].split(".")[0]) for n in before if n.endswith(".safetensors")}
        # several clients stop each at a point of its own share: what was written need not be a prefix, so
        # the relaunch writes the first `target` rows' missing ones and keeps every file written before
        want = len(done_idx | set(range(target)))
        r = self.ro("extract", "gpu-sf-stop", "--tail", "--json", timeout=self.args.job_timeout, inv=inv_path)
        clients = client_shares(self.job_log("gpu-sf-stop", inv=inv_path), self.clients, target, done_idx)
        v = self.ro("verify", "gpu-sf-stop", "--all", "--json", timeout=300, inv=inv_path)
        kept = sum(1 for p in (self.work / "sf_data_stop" / "hidden_states").glob("hs_*")
                   if before.get(p.name) == p.stat().st_mtime_ns)
        files = self.hs_files("sf_data_stop")
        self.run.step("g_relaunch_resumes", ok=r["rc"] == 0 and files == want and kept == len(before)
                      and v["rc"] == 0 and clients["ok"], rc=r["rc"], seconds=r["seconds"], files_before=len(before),
                      files_before_beyond_max_samples=sum(1 for i in done_idx if i >= target),
                      max_samples=target, files_after=files, files_expected=want, untouched=kept, clients=clients,
                      verify={"rc": v["rc"], "ok": (v["json"] or {}).get("ok"), "files": (v["json"] or {}).get("files"),
                              "problems": {k: (v["json"] or {}).get(k) for k in ("gap_count", "missing_after_last",
                                                                                "unloadable_count", "name_problems")}},
                      stderr_tail=r["stderr"][-1500:], gpu_processes_after=self.gpu_apps())

    # ------------------------------------------------ issue 52 item 6: prepared data (the real prepare-data)
    def prepare(self, jsonl: Path, out: Path, *, overwrite: bool = False) -> dict:
        """`speculators prepare-data` (speculators 0.9.0's own CLI, the client's interpreter) of ``jsonl``
        (pre-tokenized rows: no render endpoint) into ``out``."""
        cmd = [str(self.python("client")), "-m", "speculators", "prepare-data", "--model", str(self.work / "model"),
               "--data", str(jsonl), "--output", str(out), "--seq-length", str(PD_SEQ_LENGTH),
               "--num-preprocessing-workers", "1"] + (["--overwrite"] if overwrite else [])
        r = base.sh(cmd, timeout=300, env={**base.HOST_ENV, "HF_DATASETS_OFFLINE": "1"}, log=self.log)
        lines = [l for l in (r["stdout"] + r["stderr"]).splitlines() if l.strip()]
        return {"argv": ["speculators", *cmd[3:]], "rc": r["rc"], "seconds": r["seconds"],
                "last_lines": lines[-4:], "error": next((l for l in reversed(lines) if "Error" in l), None)}

    def read_prepared(self, d: Path) -> dict:
        r = base.sh([str(self.python("client")), "-c", PD_READ, str(d), str(MAX_MODEL_LEN)], timeout=120,
                    env={**base.HOST_ENV, "HF_DATASETS_OFFLINE": "1"}, log=self.log)
        return base.last_json(r["stdout"]) or {"rc": r["rc"], "stderr": r["stderr"][-1500:]}

    def build_prepared(self) -> None:
        """Two directories written by the real prepare-data: pd_data (the complete run's rows) and pd_long
        (the same rows plus two of 2,500 and 3,001 tokens, kept by --seq-length 4096)."""
        w, t = self.work, time.monotonic()
        rng = random.Random(20261204)
        rows = rows_prepared(rng)
        long_rows = rows + [[1] + [rng.randrange(4, 1024) for _ in range(n - 1)] for n in (2500, 3001)]
        changed = [list(r) for r in rows]
        changed[3][5] = 4 + (changed[3][5] - 4 + 1) % 1020          # one token of one row, still in the vocabulary
        self.pd_jsonl = {}
        built = {}
        for name, rs in (("pd_data", rows), ("pd_long", long_rows), ("pd_changed", changed)):
            jsonl = w / f"{name}.jsonl"
            jsonl.write_text("".join(json.dumps({"input_ids": r, "loss_mask": [0] + [1] * (len(r) - 1)}) + "\n"
                                     for r in rs))
            self.pd_jsonl[name] = jsonl
            if name == "pd_changed":
                continue     # prepared in step pc, after the complete run
            shutil.rmtree(w / name, ignore_errors=True)
            if self.args.dry:
                built[name] = {"rows": len(rs), "tokens": sum(map(len, rs))}
                continue
            r = self.prepare(jsonl, w / name)
            if r["rc"] != 0:
                self.run.step("prepared_data", ok=False, dataset=name, prepare=r)
                raise SystemExit("prepare-data failed")
            built[name] = {"prepare": r, "read": self.read_prepared(w / name),
                           "files": sorted(p.name for p in (w / name).iterdir())}
        self.pd_rows = len(rows)
        self.pd_tokens = sum(map(len, rows))
        self.run.step("prepared_data", ok=True, seconds=round(time.monotonic() - t, 1), datasets=built,
                      jsonl_rows={"pd_data": len(rows), "pd_long": len(long_rows)},
                      jsonl_tokens={"pd_data": self.pd_tokens, "pd_long": sum(map(len, long_rows))},
                      max_model_len=MAX_MODEL_LEN, seq_length=PD_SEQ_LENGTH, max_samples=PD_MAX_SAMPLES,
                      changed="pd_changed.jsonl: pd_data.jsonl with row 3's token 5 changed")

    def jobdirs(self, state: str) -> list[str]:
        root = self.work / state / "jobs"
        return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.exists() else []

    def hs_state(self, data: str) -> dict:
        """Each sample file's (size, mtime_ns, sha256): what 'nothing changed' is checked against."""
        d = self.work / data / "hidden_states"
        return {p.name: [p.stat().st_size, p.stat().st_mtime_ns, sha256_file(p)]
                for p in sorted(d.glob("hs_*.safetensors"))} if d.is_dir() else {}

    def settle_gpu(self) -> list[str]:
        after, t = self.gpu_apps(), time.monotonic()
        while after and time.monotonic() - t < 15:       # the driver's list can lag the process's exit
            time.sleep(1)
            after = self.gpu_apps()
        return after

    @staticmethod
    def refusal(r: dict) -> dict:
        """The refusal remote-ops printed: its JSON record's error, message and hint, and the plain line."""
        rec = next((j for j in (base.last_json(l) for l in (r["stdout"] + "\n" + r["stderr"]).splitlines()
                                if l.startswith("{") and '"error"' in l) if isinstance(j, dict)), {})
        line = next((l.strip() for l in r["stderr"].splitlines() if l.startswith("remote-ops:")), None)
        return {"error": rec.get("error"), "message": rec.get("message"), "hint": rec.get("hint"),
                "exit_status": rec.get("exit_status"), "line": line}

    @staticmethod
    def notes(r: dict, word: str) -> list[str]:
        """The preflight notes (of the extract --json events) that mention ``word``."""
        for l in r["stdout"].splitlines():
            j = base.last_json(l) if l.startswith("{") else None
            if isinstance(j, dict) and isinstance(j.get("preflight"), dict):
                return [n for n in j["preflight"].get("notes") or [] if word in n]
        return []

    def step_pa(self) -> None:
        before_gpu, markers_before = self.gpu_apps(), set(marker_pids())
        r = self.ro("extract", "gpu-pd-long", "--tail", "--json", timeout=self.args.job_timeout)
        st = self.ro("status", "gpu-pd-long", "--json", timeout=60)
        after = self.settle_gpu()
        files, jobs = self.hs_files("pd_long"), self.jobdirs("state-pd-long")
        refused = self.refusal(r)
        new_markers = sorted(set(marker_pids()) - markers_before)
        self.run.step("pa_rows_too_long_refused",
                      ok=r["rc"] != 0 and files == 0 and jobs == [] and not after and not new_markers
                      and port_free(self.args.port + 3) and "max_model_len" in (refused["message"] or refused["line"] or ""),
                      rc=r["rc"], seconds=r["seconds"], refusal=refused, files=files, job_dirs=jobs,
                      gpu_processes_before=before_gpu, gpu_processes_after=after, new_marker_processes=new_markers,
                      port_free_after=port_free(self.args.port + 3),
                      status={"rc": st["rc"], "job": (st["json"] or {}).get("job")},
                      stdout_tail=r["stdout"][-1500:], stderr_tail=r["stderr"][-2500:])

    def step_pb(self) -> None:
        r = self.ro("extract", "gpu-pd", "--tail", "--json", timeout=self.args.job_timeout)
        events = [json.loads(l) for l in r["stdout"].splitlines() if l.startswith("{")]
        end = next((e for e in reversed(events) if e.get("event") == "end"), {})
        st = self.ro("status", "gpu-pd", "--json", timeout=60)
        job = (st["json"] or {}).get("job") or {}
        text = self.ro("status", "gpu-pd", timeout=60)
        after = self.settle_gpu()
        files = self.hs_files("pd_data")
        run_json = self.work / "pd_data" / "hidden_states" / "run.json"
        ident = (json.loads(run_json.read_text()).get("identity") or {}) if run_json.exists() else {}
        samples, tokens = job.get("samples") or {}, job.get("tokens") or {}
        self.job_id = job.get("job_id")
        self.run.step("pb_complete_run_n_of_n",
                      ok=r["rc"] == 0 and files == self.pd_rows and job.get("state") == "succeeded"
                      and samples.get("done") == samples.get("expected") == self.pd_rows
                      and tokens.get("done") == self.pd_tokens and not after
                      and (ident.get("dataset") or {}).get("rows") == self.pd_rows,
                      rc=r["rc"], seconds=r["seconds"], files=files, rows=self.pd_rows, tokens=self.pd_tokens,
                      max_samples=PD_MAX_SAMPLES, end=end.get("status") if end else None,
                      preflight=next((e.get("preflight") for e in events if e.get("preflight")), None),
                      preflight_notes=self.notes(r, "prepared data"),
                      status={k: job.get(k) for k in ("job_id", "state", "reason", "exit_code", "server", "samples",
                                                      "tokens", "tokens_per_s", "elapsed_s", "layout", "refused")},
                      status_text=[l for l in text["stdout"].splitlines() if l.strip()][:12],
                      run_json_dataset=ident.get("dataset"), gpu_processes_after_the_job=after,
                      stderr_tail=r["stderr"][-2000:])

    def step_pd(self) -> None:
        r = self.ro("verify", "gpu-pd", "--all", "--json", timeout=300)
        t = self.ro("verify", "gpu-pd", "--all", timeout=300)
        j = r["json"] or {}
        ident = j.get("identity") or {}
        files = self.hs_files("pd_data")
        self.run.step("pd_verify_all_every_file",
                      ok=r["rc"] == 0 and bool(j.get("ok")) and j.get("expected") == self.pd_rows
                      and ident.get("ids_compared") == files == self.pd_rows and ident.get("ids_differ") == 0,
                      rc=r["rc"], seconds=r["seconds"], files_on_disk=files, rows=self.pd_rows,
                      result={k: j.get(k) for k in ("ok", "files", "expected", "checked", "gap_count", "gaps",
                                                    "layers_hidden", "dtypes", "non_finite_count",
                                                    "unloadable_count", "layout")},
                      identity={k: ident.get(k) for k in ("recorded", "ids_compared", "ids_differ", "problems",
                                                          "text_lines_not_compared")},
                      text_rc=t["rc"], text=[l for l in t["stdout"].splitlines() if l.strip()][:14],
                      stderr_tail=r["stderr"][-1000:])

    def step_pc(self) -> None:
        w, d = self.work, self.work / "pd_data"
        data_files = lambda: {p.name: sha256_file(p) for p in sorted(d.iterdir())   # noqa: E731
                              if p.is_file() and (p.suffix == ".arrow" or p.name in PD_FILES)}
        before, before_data = self.hs_state("pd_data"), data_files()
        run_json = (d / "hidden_states" / "run.json").read_bytes() if (d / "hidden_states" / "run.json").exists() else b""
        jobs_before = self.jobdirs("state-pd")
        # 1. what a user tries first: prepare-data --overwrite on the changed JSONL into the same directory
        over = self.prepare(self.pd_jsonl["pd_changed"], d, overwrite=True)
        over["hidden_states_untouched"] = self.hs_state("pd_data") == before
        # 2. prepare-data's output of the changed JSONL put in place of the directory's Arrow files
        new = w / "pd_changed"
        shutil.rmtree(new, ignore_errors=True)
        prep = self.prepare(self.pd_jsonl["pd_changed"], new)
        if prep["rc"] != 0:
            self.run.step("pc_changed_data_refused", ok=False, overwrite_attempt=over, prepare=prep)
            return
        for p in list(d.iterdir()):
            if p.is_file() and (p.suffix == ".arrow" or p.name in PD_FILES):
                p.unlink()
        for p in sorted(new.iterdir()):
            if p.is_file() and (p.suffix == ".arrow" or p.name in PD_FILES):
                shutil.copy2(p, d / p.name)
        after_data = data_files()
        read = self.read_prepared(d)
        r = self.ro("extract", "gpu-pd", "--tail", "--json", timeout=self.args.job_timeout)
        gpu_after = self.settle_gpu()
        after = self.hs_state("pd_data")
        jobs_after = self.jobdirs("state-pd")
        run_json_after = (d / "hidden_states" / "run.json").read_bytes() if (d / "hidden_states" / "run.json").exists() else b""
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        v = self.ro("verify", "gpu-pd", "--all", "--json", timeout=300)
        vj = v["json"] or {}
        vi = vj.get("identity") or {}
        self.run.step("pc_changed_data_refused",
                      ok=r["rc"] != 0 and changed == [] and len(after) == len(before) == self.pd_rows
                      and jobs_after == jobs_before and not gpu_after and run_json_after == run_json
                      and after_data != before_data and v["rc"] != 0 and not vj.get("ok")
                      and bool(vi.get("problems")),
                      overwrite_attempt=over, prepare=prep, data_files_before=before_data,
                      data_files_after=after_data, read_after=read,
                      rc=r["rc"], seconds=r["seconds"], refusal=self.refusal(r),
                      files_before=len(before), files_after=len(after), files_changed_or_added=changed,
                      run_json_unchanged=run_json_after == run_json, job_dirs_before=jobs_before,
                      job_dirs_after=jobs_after, gpu_processes_after=gpu_after,
                      verify={"rc": v["rc"], "ok": vj.get("ok"), "problems": vi.get("problems"),
                              "ids_compared": vi.get("ids_compared"), "ids_differ": vi.get("ids_differ")},
                      stderr_tail=r["stderr"][-2500:])


STEP_NAMES = {"c": "c_extract_tail", "d": "d_verify", "e": "e_compare_with_transformers",
              "f": "f_stop_leaves_no_gpu_process", "g": "g_relaunch_resumes",
              "pa": "pa_rows_too_long_refused", "pb": "pb_complete_run_n_of_n", "pd": "pd_verify_all_every_file",
              "pc": "pc_changed_data_refused"}
OLD_STEPS = ("c", "d", "e", "f", "g")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/root/e2e")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--steps", default="c,d,e,f,g")
    ap.add_argument("--port", type=int, default=8765, help="the server's port (the stop run uses the next one)")
    ap.add_argument("--clients", type=int, default=None,
                    help="the playbook's var clients on every host (default: the playbook's own)")
    ap.add_argument("--stop-rows", type=int, default=3000, help="rows of the dataset the stop run works through")
    ap.add_argument("--server-transformers", choices=("4.57.6", "machine"), default="4.57.6")
    ap.add_argument("--job-timeout", type=float, default=300, help="seconds for one extract --tail")
    ap.add_argument("--budget", type=float, default=420, help="skip steps that would start after this many seconds "
                                                           "(the device tool stops a command at 600 s)")
    ap.add_argument("--base-python", default=None, help="the machine's python with torch (default: this one)")
    ap.add_argument("--controller-python", default=None, help="python that runs remote-ops (default: --base-python)")
    ap.add_argument("--compare-device", default="cuda")
    ap.add_argument("--code-rev", default=None)
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--fresh", action="store_true", help="remove outputs and host state of an earlier run")
    ap.add_argument("--dry", action="store_true", help="no GPU: write the interpreters, data and inventory, "
                                                       "print the plan")
    ap.add_argument("--no-gpu", action="store_true", help="CPU rehearsal of the flow (the GPU steps' checks fail): "
                                                          "preflight asks for no GPU")
    args = ap.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    h = Harness(args)
    if args.fresh:
        for d in ("state-sf", "state-sf-stop", "state-pd", "state-pd-long"):
            shutil.rmtree(h.work / d, ignore_errors=True)
    h.need_old = any(s in OLD_STEPS for s in steps)
    h.setup()
    h.build_model_and_data()
    if any(s.startswith("p") for s in steps):
        h.build_prepared()
    h.inventory()
    if args.dry:
        plan = {"steps": steps, "inventory": str(h.inv), "interpreters": h.paths(), "samples": h.samples,
                "commands": [["remote-ops", "extract", "gpu-sf", "--tail", "--json"], ["remote-ops", "verify",
                             "gpu-sf", "--all", "--json"], ["remote-ops", "extract", "gpu-sf-stop", "--json"],
                             ["remote-ops", "stop", "gpu-sf-stop", "--json"]]}
        h.run.step("dry", ok=True, plan=plan)
        print(json.dumps(plan, indent=1))
        return 0
    order = {"c": h.step_c, "d": h.step_d, "e": h.step_e, "f": h.step_f, "g": h.step_g,
             "pa": h.step_pa, "pb": h.step_pb, "pd": h.step_pd, "pc": h.step_pc}
    return run_steps(h.run, steps, order, STEP_NAMES, budget=args.budget)


if __name__ == "__main__":
    sys.exit(main())
