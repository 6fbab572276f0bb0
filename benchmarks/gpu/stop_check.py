"""On a machine with a real NVIDIA GPU: does `stop` leave no process holding GPU memory?

Runs the agent exactly as the controller does over SSH (the same bootstrap and stdin protocol,
here through ``sh -c`` on the GPU machine itself, since the SSH layer is covered by the test suite):
1. ``gpu.query`` on the real ``nvidia-smi``;
2. launches a job whose main process and two stubborn workers (own sessions, ignoring SIGTERM,
   one renamed ``VLLM::Worker`` with the job marker stripped from its environment, as vLLM's
   re-parented workers look) each hold CUDA memory;
3. ``jobs.stop`` with a short grace, then reads ``nvidia-smi`` again.

    python3 benchmarks/gpu/stop_check.py [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import provenance  # noqa: E402
from remote_ops.connect import bundle  # noqa: E402  (stdlib-only module)

JOB = r'''
import os, signal, subprocess, sys, time
import torch
role = sys.argv[1] if len(sys.argv) > 1 else "main"
x = torch.empty(int(512 * 2**20), dtype=torch.uint8, device="cuda")   # 512 MiB
x.fill_(1); torch.cuda.synchronize()
if role == "main":
    env_keep = dict(os.environ)
    env_clean = {k: v for k, v in os.environ.items() if k != "REMOTE_OPS_JOB_ID"}
    for env in (env_keep, env_clean):
        subprocess.Popen([sys.executable, __file__, "worker"], env=env, start_new_session=True,
                         stdin=subprocess.DEVNULL)
    print("main and 2 workers hold GPU memory", flush=True)
else:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write("VLLM::Worker")
    except OSError:
        pass
    print(f"worker {os.getpid()} holds GPU memory, ignores SIGTERM", flush=True)
while True:
    time.sleep(1)
'''


def agent(python: str, ops: list[tuple[str, dict]], env: dict) -> list[dict]:
    proc = subprocess.run(["sh", "-c", bundle.agent_command(python)],
                          input=bundle.encode_request([{"op": o, "args": a} for o, a in ops], env),
                          capture_output=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"agent failed: {proc.stderr.decode()[-2000:]}")
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])["results"]


def one(python, op, args, env):
    (res,) = agent(python, [(op, args)], env)
    if not res["ok"]:
        raise SystemExit(f"{op} failed: {res['error']}")
    return res["result"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out")
    ap.add_argument("--grace", type=float, default=3.0)
    ap.add_argument("--code-rev", help="the commit of this checkout (a GPU machine's copy has no .git)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ro-gpu-"))
    (work / "gpu_job.py").write_text(JOB)
    env = {"REMOTE_OPS_STATE_DIR": str(work / "state")}
    report: dict = {}
    t0 = time.time()
    report["gpu_before"] = one(a.python, "gpu.query", {}, env)
    launched = one(a.python, "jobs.launch", {"key": "gpu-check", "command": [a.python, "gpu_job.py"],
                                             "workdir": str(work), "env": {}, "secrets": {},
                                             "output_dir": str(work / "out"), "expected_samples": 1}, env)
    report["launch"] = launched
    job_id = launched.get("job_id") or launched.get("job", {}).get("job_id")
    deadline = time.time() + 120
    while time.time() < deadline:
        g = one(a.python, "gpu.query", {}, env)
        if len(g.get("processes") or []) >= 3:
            break
        time.sleep(1)
    report["gpu_running"] = g
    report["stop"] = one(a.python, "jobs.stop", {"job_id": job_id, "grace": a.grace}, env)
    time.sleep(1)
    report["gpu_after"] = one(a.python, "gpu.query", {}, env)
    report["status_after"] = one(a.python, "jobs.status", {"job_id": job_id}, env)
    report["log_tail"] = (Path(report["status_after"].get("log") or "/dev/null").read_text()[-2000:]
                          if report["status_after"].get("log") else None)
    report["seconds"] = round(time.time() - t0, 1)
    report["written_by"] = provenance.written_by(__file__, a.code_rev)
    running = report["gpu_running"].get("processes") or []
    after = report["gpu_after"].get("processes") or []
    summary = {
        "driver": report["gpu_before"].get("driver"),
        "gpus": [(x.get("index"), x.get("name"), x.get("memory_used_mib"), x.get("memory_total_mib"))
                 for x in report["gpu_before"].get("gpus", [])],
        "gpu_processes_while_running": [(p.get("pid"), p.get("name"), p.get("used_memory_mib")) for p in running],
        "gpu_processes_after_stop": [(p.get("pid"), p.get("name"), p.get("used_memory_mib")) for p in after],
        "state_after": report["status_after"].get("state"),
        "stop_report": {k: report["stop"].get(k) for k in ("terminated", "killed", "remaining", "gpu_holders", "gpu_killed")},
    }
    report["summary"] = summary
    print(json.dumps(summary, indent=2, default=str))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2, default=str))
    ok = bool(running) and not after
    print("RESULT:", "no process left on the GPU" if ok else "PROBLEM: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
