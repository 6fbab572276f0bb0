"""CPU ceiling of speculators 0.9.0's REAL client (generate-offline-data) against a fast STAND-IN server.

What runs: the client command of the shipped playbook eagle3-speculators-0.9.0.yaml (run_clients.py with
--clients N, --health, --preload, then ``-m speculators generate-offline-data ... --validate-outputs``, as
jobs.parse_spec renders it for the host's vars), with the client interpreter that
benchmarks/evidence/server_flow_rehearsal.py builds (speculators 0.9.0 and its wheels, transformers 5.17.0;
run the rehearsal once first). The server is NOT vLLM: remote_ops/sandbox_assets/server_standin.py's HTTP
handler (/health, /v1/models, /v1/completions, the same answers) with its completion replaced by a fast one:
no per-request delay, no model, each request's file written from a precomputed block of finite bfloat16
bytes ([tokens, layers, hidden] hidden states + int64 token ids, a safetensors file as vLLM's
ExampleHiddenStatesConnector writes it), so what the client does per request (HTTP, JSON, the move, and
--validate-outputs' load and checks of a file of realistic size) is what is measured.

While the client runs, /proc is sampled every --interval s: the hs_<N>.safetensors files written (and
their rows' tokens), the CPU time of the client's processes (run_clients.py and its children) and of the
server, and the machine's busy CPU (/proc/stat). The figures are over the window from the first sample
with >= 10% of the rows written to the first with >= 90%: requests/s, tokens/s, client CPU seconds per
request, client and server CPU in cores, and the rest of the machine's busy CPU (other processes). A
client process near one core is bound by its own CPU (one Python thread holds the GIL for the event
loop); client + server near the machine's cores means the cores were the bound.

    python benchmarks/controller/client_rate.py                 # writes benchmarks/CLIENT_RATE.md + results JSON
    python benchmarks/controller/client_rate.py --clients 1 --rows 60 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402

PLAYBOOK = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.9.0.yaml"
MODEL = "standin-model"
TIMING = re.compile(r"Timing: ([\d.]+)s elapsed, ([\d.]+) samples/s, avg vLLM request (\d+) ms, "
                    r"avg file write (\d+) ms")
RANK_LINE = re.compile(r"\[run_clients\] rank (\d+)/(\d+): imports ([\d.]+) s")
WINDOW = (0.10, 0.90)


# ---------------------------------------------------------------------------------------- pure parts
def proc_stat_fields(text: str) -> tuple[int, int]:
    """(ppid, utime + stime in clock ticks) of a /proc/<pid>/stat line (the command may hold spaces and
    parentheses: fields are counted after the last ')')."""
    rest = text[text.rindex(")") + 2:].split()
    return int(rest[1]), int(rest[11]) + int(rest[12])


def cpu_busy_total(text: str) -> tuple[int, int]:
    """(busy, total) clock ticks of /proc/stat's aggregate ``cpu`` line (idle and iowait are not busy)."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + (v[4] if len(v) > 4 else 0)
            total = sum(v[:8])
            return total - idle, total
    raise ValueError("no aggregate cpu line in /proc/stat")


def descendants(parents: dict[int, int], root: int) -> set[int]:
    """``root`` and every process under it, from a {pid: ppid} map."""
    out, todo = {root}, [root]
    while todo:
        p = todo.pop()
        for c, pp in parents.items():
            if pp == p and c not in out:
                out.add(c)
                todo.append(c)
    return out


def window_figures(samples: list[dict], rows: int, clk: int, cpus: int, lo: float = WINDOW[0],
                   hi: float = WINDOW[1]) -> dict | None:
    """The steady-state figures between the first sample with >= lo x rows files and the first with
    >= hi x rows. Each sample: {t, files, tokens, client_ticks, server_ticks, busy_ticks, total_ticks}.
    None when the run never reached both marks (or they fall on one sample)."""
    a = next((s for s in samples if s["files"] >= lo * rows), None)
    b = next((s for s in samples if s["files"] >= hi * rows), None)
    if a is None or b is None or b["t"] <= a["t"] or b["files"] <= a["files"]:
        return None
    dt, n = b["t"] - a["t"], b["files"] - a["files"]
    client = (b["client_ticks"] - a["client_ticks"]) / clk
    server = (b["server_ticks"] - a["server_ticks"]) / clk
    total_ticks = b["total_ticks"] - a["total_ticks"]
    busy = (b["busy_ticks"] - a["busy_ticks"]) / total_ticks * cpus if total_ticks else None
    return {"seconds": round(dt, 2), "requests": n, "requests_per_s": round(n / dt, 2),
            "tokens_per_s": round((b["tokens"] - a["tokens"]) / dt),
            "client_cpu_s_per_request": round(client / n, 4), "client_cpu_cores": round(client / dt, 2),
            "server_cpu_cores": round(server / dt, 2),
            "machine_busy_cores": round(busy, 2) if busy is not None else None,
            "other_cpu_cores": round(busy - client / dt - server / dt, 2) if busy is not None else None}


def ceiling(fig: dict, clients: int) -> float:
    """Requests/s the client processes would reach with a core each, were their CPU the only bound:
    clients / (client CPU seconds a request). An upper bound read from the CPU cost, not a measured rate."""
    return round(clients / fig["client_cpu_s_per_request"], 1) if fig["client_cpu_s_per_request"] else float("inf")


def bound(fig: dict, clients: int, cpus: int) -> str:
    """Which was the bound in a window, by a stated rule (client processes at >= 85% of a core each; else
    client + server at >= 85% of the machine's cores; else neither)."""
    per = fig["client_cpu_cores"] / clients
    if per >= 0.85:
        return f"client CPU ({per:.2f} of a core per client process)"
    if fig["machine_busy_cores"] is not None and fig["machine_busy_cores"] >= 0.85 * cpus:
        return f"the machine's {cpus} cores ({fig['machine_busy_cores']:.2f} busy)"
    return "neither client nor cores saturated"


def client_timings(text: str) -> list[dict]:
    """speculators' own ``Timing:`` line of each client process (elapsed, samples/s, avg request ms,
    avg file write ms)."""
    return [{"elapsed_s": float(m.group(1)), "samples_per_s": float(m.group(2)), "avg_request_ms": int(m.group(3)),
             "avg_write_ms": int(m.group(4))} for m in TIMING.finditer(text)]


def render(doc: dict) -> str:
    """benchmarks/CLIENT_RATE.md from the result document."""
    p, m = doc["params"], doc["machine"]
    out = ["# speculators 0.9.0's client: its CPU ceiling against a fast stand-in server (CPU only)", "",
           f"Generated by `{doc['command']}` ({doc['written_by']['script']} at {doc['written_by']['commit']}, "
           f"{doc['finished_at']}); do not edit.", "",
           "**What this is:** the REAL client (`python -m speculators generate-offline-data --validate-outputs`, "
           "speculators 0.9.0, through the shipped run_clients.py with the shipped playbook's client command) "
           "against a STAND-IN server that does no model work (remote_ops/sandbox_assets/server_standin.py's "
           "handler with a completion that writes each file from precomputed bytes, no delay). It measures the "
           "client's own cost per request on this machine; it is NOT a measurement of vLLM or of a GPU.", "",
           f"Machine: {m['cpus']} CPUs ({m['platform']}), Python {m['python']}. Client and server share these "
           f"cores; `other` is the rest of the machine's busy CPU in the window (other processes).", "",
           f"Rows: {p['rows']} of {p['min_tokens']}-{p['max_tokens']} tokens ({doc['dataset']['tokens']} tokens); "
           f"each file [tokens, {p['layers']}, {p['hidden']}] bfloat16 + int64 token ids "
           f"({p['layers'] * p['hidden'] * 2 / 1024:.0f} KiB a token, {doc['dataset']['mean_mib']:.1f} MiB a file "
           f"on average); concurrency {p['concurrency']} per client; files under {p['work']}.", "",
           f"Window: from {WINDOW[0]:.0%} to {WINDOW[1]:.0%} of the rows written (/proc sampled every "
           f"{p['interval']} s). Bound rule: a client process at >= 0.85 of a core is CPU-bound; else client + "
           f"server + other at >= 85% of the cores.", "",
           "| clients | run | requests/s | tokens/s | client CPU s / request | client CPU (cores) | server CPU "
           "(cores) | other (cores) | bound | a core per client: requests/s at most | exit | files | "
           "client's own samples/s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        w = r["window"]
        own = ", ".join(f"{t['samples_per_s']}" for t in r["client_timings"]) or "-"
        if w is None:
            out.append(f"| {r['clients']} | {r['repeat']} | - | - | - | - | - | - | no window | - | {r['exit']} | "
                       f"{r['files']} | {own} |")
            continue
        out.append(f"| {r['clients']} | {r['repeat']} | {w['requests_per_s']} | {w['tokens_per_s']} | "
                   f"{w['client_cpu_s_per_request']} | {w['client_cpu_cores']} | {w['server_cpu_cores']} | "
                   f"{w['other_cpu_cores']} | {r['bound']} | {ceiling(w, r['clients'])} | {r['exit']} | "
                   f"{r['files']}/{p['rows']} | {own} |")
    out += ["", "`a core per client: requests/s at most`: clients / (client CPU s a request), what the client "
            "processes could reach with a core each were their own CPU the only bound (an upper bound read from "
            "their CPU cost, not a measured rate). `client's own samples/s`: each client process's `Timing:` "
            "line (its whole run, from its first request; with several clients, one figure per process).", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------- the server
def finite_bf16(nbytes: int, seed: int = 7) -> bytes:
    """``nbytes`` (even) of little-endian bfloat16 values, all finite (the exponent's top bit cleared)."""
    rng = random.Random(seed)
    block = bytearray(rng.getrandbits(8) for _ in range(1 << 16))
    block[1::2] = bytes(b & 0xBF for b in block[1::2])
    reps = -(-nbytes // len(block))
    return (bytes(block) * reps)[:nbytes]


def serve(argv: list[str]) -> int:
    """The fast stand-in server (run as ``client_rate.py serve ...``)."""
    import array
    import types
    from http.server import ThreadingHTTPServer

    from remote_ops.sandbox_assets import server_standin as st
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--hidden-states-path", required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    a = ap.parse_args(argv)
    args = types.SimpleNamespace(model=MODEL, max_model_len=1 << 30, access_log=False, exit_after=0, delay=0,
                                 hidden_states_path=a.hidden_states_path, layers=a.layers, hidden=a.hidden)
    per_token = a.layers * a.hidden * 2
    blob = memoryview(finite_bf16(per_token * a.max_tokens))
    os.makedirs(a.hidden_states_path, exist_ok=True)

    def completion(state, req):          # server_standin.completion's answer, no torch, no delay
        prompt = req["prompt"]
        req_id = "cmpl-%s-0" % uuid.uuid4().hex
        path = os.path.join(args.hidden_states_path, req_id + ".safetensors")
        n = len(prompt)
        st.save_safetensors(path, {"hidden_states": ("BF16", (n, args.layers, args.hidden), blob[:n * per_token]),
                                   "token_ids": ("I64", (n,), array.array("q", prompt).tobytes())})
        nxt = (sum(prompt) * 31) % 1000 + 4
        ids = bool(req.get("return_token_ids"))
        return {"id": req_id, "object": "text_completion", "created": int(time.time()), "model": args.model,
                "choices": [{"index": 0, "text": " w%d" % nxt, "logprobs": None, "finish_reason": "length",
                             "stop_reason": None, "token_ids": [nxt] if ids else None, "prompt_logprobs": None,
                             "prompt_token_ids": prompt if ids else None}],
                "service_tier": None, "system_fingerprint": None,
                "usage": {"prompt_tokens": n, "total_tokens": n + 1, "completion_tokens": 1,
                          "prompt_tokens_details": None},
                "kv_transfer_params": {"hidden_states_path": path}}

    st.completion = completion
    state = types.SimpleNamespace(args=args, ready_at=0.0, lock=threading.Lock(), completions=0, keys=[])

    class Server(ThreadingHTTPServer):
        request_queue_size = 1024          # the default 5 drops connections when 32+ open at once
        daemon_threads = True

    server = Server(("127.0.0.1", a.port), st.handler(state))
    print("STAND-IN fast server (client_rate.py): no vLLM, no model; listening on %d" % a.port, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.serve_forever(poll_interval=0.2)
    return 0


# ---------------------------------------------------------------------------------------- the runs
def build_dataset(client_python: Path, work: Path, p: dict) -> dict:
    from benchmarks.gpu.lib.dataset import DATASET_BUILDER
    rng = random.Random(p["seed"])
    rows = [[1] + [rng.randrange(4, 32000) for _ in range(rng.randrange(p["min_tokens"], p["max_tokens"] + 1) - 1)]
            for _ in range(p["rows"])]
    key = json.dumps({k: p[k] for k in ("rows", "min_tokens", "max_tokens", "seed")}, sort_keys=True)
    data = work / "data"
    stamp = work / "data.key"
    if not (stamp.exists() and stamp.read_text() == key and (data / "dataset_info.json").exists()):
        shutil.rmtree(data, ignore_errors=True)
        jsonl = work / "rows.jsonl"
        jsonl.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows))
        r = subprocess.run([str(client_python), "-c", DATASET_BUILDER, str(jsonl), str(data)], capture_output=True,
                           text=True, timeout=600)
        if r.returncode:
            raise SystemExit(f"client_rate.py: building the dataset failed: {r.stderr.strip().splitlines()[-1:]}")
        stamp.write_text(key)
    lens = [len(r) for r in rows]
    per_token = p["layers"] * p["hidden"] * 2
    return {"path": str(data), "rows": len(rows), "tokens": sum(lens), "lens": lens,
            "mean_mib": sum(lens) / len(lens) * per_token / 2 ** 20}


def client_command(client_python: Path, data: Path, p: dict, clients: int) -> list[str]:
    """The shipped playbook's client command for these vars (jobs.parse_spec, as extract renders it)."""
    from remote_ops.connect.inventory import Host
    from remote_ops.extract import jobs
    from remote_ops.playbook import loader as playbook
    spec = jobs.parse_spec(playbook.load(str(PLAYBOOK)), Host(
        name="client-rate", hostname="localhost", python=str(client_python),
        vars={"clients": clients, "preprocessed_data": str(data), "max_samples": p["rows"],
              "concurrency": p["concurrency"], "port": p["port"]}))
    return list(spec.command)


def read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def sample(launcher: int, server: int, out: Path, lens: list[int]) -> dict:
    parents, ticks = {}, {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            text = read(f"/proc/{d}/stat")
            if text:
                parents[int(d)], ticks[int(d)] = proc_stat_fields(text)
    files = tokens = 0
    try:
        for e in os.scandir(out):
            if e.name.startswith("hs_") and e.name.endswith(".safetensors"):
                i = int(e.name[3:-12])
                files += 1
                tokens += lens[i] if i < len(lens) else 0
    except FileNotFoundError:
        pass
    busy, total = cpu_busy_total(read("/proc/stat") or "")
    return {"t": time.monotonic(), "files": files, "tokens": tokens,
            "client_ticks": sum(ticks.get(p, 0) for p in descendants(parents, launcher)),
            "server_ticks": sum(ticks.get(p, 0) for p in descendants(parents, server)),
            "busy_ticks": busy, "total_ticks": total}


def one_run(client_python: Path, work: Path, ds: dict, p: dict, clients: int, repeat: int) -> dict:
    data = Path(ds["path"])
    out, staging = data / "hidden_states", data / ".hs_staging"
    for d in (out, staging):
        shutil.rmtree(d, ignore_errors=True)
    shutil.copy(REPO / "remote_ops" / "playbook" / "shipped" / "scripts" / "run_clients.py", work / "run_clients.py")
    log = work / f"client_{clients}_{repeat}.log"
    srv_log = work / f"server_{clients}_{repeat}.log"
    srv = subprocess.Popen([sys.executable, __file__, "serve", "--port", str(p["port"]), "--hidden-states-path",
                            str(staging), "--layers", str(p["layers"]), "--hidden", str(p["hidden"]),
                            "--max-tokens", str(p["max_tokens"])], stdout=srv_log.open("w"), stderr=subprocess.STDOUT,
                           start_new_session=True)
    cmd = client_command(client_python, data, p, clients)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_MININTERVAL": "1", "HF_DATASETS_OFFLINE": "1",
           "COLUMNS": "300"}   # rich wraps the client's log lines at 80 columns otherwise
    t0 = time.monotonic()
    cl = subprocess.Popen(cmd, cwd=work, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                          start_new_session=True)
    samples = []
    try:
        while cl.poll() is None:
            samples.append(sample(cl.pid, srv.pid, out, ds["lens"]))
            if time.monotonic() - t0 > p["timeout"]:
                os.killpg(cl.pid, signal.SIGTERM)
                cl.wait(30)
                break
            time.sleep(p["interval"])
    finally:
        wall = time.monotonic() - t0
        if cl.poll() is None:
            os.killpg(cl.pid, signal.SIGKILL)
            cl.wait()
        os.killpg(srv.pid, signal.SIGTERM)
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(srv.pid, signal.SIGKILL)
            srv.wait()
    text = log.read_text(errors="replace")
    files = sum(1 for e in os.scandir(out) if e.name.startswith("hs_")) if out.is_dir() else 0
    cpus = os.cpu_count() or 1
    win = window_figures(samples, p["rows"], os.sysconf("SC_CLK_TCK"), cpus)
    res = {"clients": clients, "repeat": repeat, "exit": cl.returncode, "files": files, "wall_s": round(wall, 1),
           "samples_taken": len(samples), "window": win, "bound": bound(win, clients, cpus) if win else None,
           "client_timings": client_timings(text),
           "rank_lines": [m.group(0) for m in RANK_LINE.finditer(text)],
           "command": ["<client python>" if i == 0 else w for i, w in enumerate(cmd)],
           "log_tail": [l for l in text.splitlines() if l.strip()][-4:]}
    for d in (out, staging):            # GBs of files: gone before the next run
        shutil.rmtree(d, ignore_errors=True)
    return res


def main(argv=None) -> int:
    from remote_ops.cachedir import cache_dir
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rehearsal-work", default=str(cache_dir() / "server-flow-rehearsal"),
                    help="benchmarks/evidence/server_flow_rehearsal.py's --work (its bin/client/python)")
    ap.add_argument("--work", default="/dev/shm/remote-ops-client-rate" if os.path.isdir("/dev/shm") else
                    str(cache_dir() / "client-rate"), help="dataset, outputs and logs (outputs removed after each run)")
    ap.add_argument("--clients", default="1,2", help="comma-separated numbers of client processes (run_clients.py)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--rows", type=int, default=400)
    ap.add_argument("--min-tokens", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=1500)
    ap.add_argument("--hidden", type=int, default=2048, help="hidden size (the 1.1B run's 2048)")
    ap.add_argument("--layers", type=int, default=4, help="hidden-state layers per token (3 aux + the last)")
    ap.add_argument("--concurrency", type=int, default=32, help="requests in flight per client (the playbook's)")
    ap.add_argument("--port", type=int, default=8790)
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between /proc samples")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for one run")
    ap.add_argument("--seed", type=int, default=20261205)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "CLIENT_RATE.md"))
    ap.add_argument("--json", dest="json_out", default=str(REPO / "benchmarks" / "results" / "client_rate.json"))
    ap.add_argument("--no-write", action="store_true", help="print only")
    if argv is None and sys.argv[1:2] == ["serve"]:
        return serve(sys.argv[2:])
    args = ap.parse_args(argv)
    try:
        clients = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        clients = []
    if not clients or min(clients) < 1:
        ap.error(f"--clients: comma-separated numbers >= 1, got {args.clients!r}")
    client_python = Path(args.rehearsal_work) / "bin" / "client" / "python"
    if not client_python.exists():
        print(f"client_rate.py: no client interpreter at {client_python}: run "
              "python benchmarks/evidence/server_flow_rehearsal.py first (it builds it)", file=sys.stderr)
        return 2
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    p = {k: getattr(args, k) for k in ("rows", "min_tokens", "max_tokens", "hidden", "layers", "concurrency", "port",
                                       "interval", "timeout", "seed", "repeats")}
    p["work"] = str(work)
    ds = build_dataset(client_python, work, p)
    runs = []
    for rep in range(1, args.repeats + 1):
        for n in clients:
            r = one_run(client_python, work, ds, p, n, rep)
            runs.append(r)
            w = r["window"] or {}
            print(json.dumps({"clients": n, "repeat": rep, "exit": r["exit"], "files": r["files"],
                              **{k: w.get(k) for k in ("requests_per_s", "tokens_per_s", "client_cpu_s_per_request",
                                                       "client_cpu_cores", "server_cpu_cores", "other_cpu_cores")},
                              "bound": r["bound"], "ceiling_a_core_per_client": ceiling(w, n) if w else None,
                              "client_timings": r["client_timings"]}), flush=True)
    argv_shown = sys.argv[1:] if argv is None else list(argv)
    doc = {"what": "speculators 0.9.0's real client against a fast STAND-IN server (no vLLM, CPU only)",
           "command": " ".join(["python", "benchmarks/controller/client_rate.py", *argv_shown]),
           "written_by": provenance.written_by(__file__), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                        time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
           "params": p, "dataset": {k: v for k, v in ds.items() if k != "lens"}, "runs": runs}
    md = render(doc)
    if args.no_write:
        print(md)
    else:
        Path(args.json_out).write_text(json.dumps(doc, indent=1) + "\n")
        Path(args.out).write_text(md)
        print(f"wrote {args.out} and {args.json_out}")
    ok = all(r["exit"] == 0 and r["files"] == p["rows"] and r["window"] for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
