"""The extraction's write path on this machine's disk, against the disk's own floor, measured in one run.

What (a) of benchmarks/gpu/throughput.py leaves once the generator is fast: on the H200 the shipped script
wrote 1.14 GB/s to a disk that takes 2.03 GB/s from dd (GPU_RESULTS.md), while on a tmpfs it kept up
with the generator. This benchmark needs no GPU: it drives the shipped script's own ``Writer`` and
``save_atomic`` (loaded from playbooks/scripts/extract_hidden_states.py, or from a git revision of it
for the BEFORE figures) with samples of the real format and sizes: per sample, ``--layers`` tensors of
tokens x ``--hidden`` bf16, input_ids and loss_mask, token counts drawn from 200-4,000 like the GPU
benchmark's dataset. The main thread makes each sample the way generate() does (a clone of rows of a
large buffer, with the script's copy threads), then queues it, so the writer threads compete with that
copy for the GIL and the memory bus as they do in the job.

Floors, measured in the same run on the same directory:
  dd        one file of the same bytes, ``dd oflag=direct bs=16M``: the disk's sequential write speed;
  raw       the same files (same count and sizes) written as plain bytes with os.write, each fsynced and
            renamed, by the same number of threads: the cost of keeping every file atomic and durable,
            without torch's serialiser (a reference rather than a bound: on a virtual disk whose
            fsync the host absorbs, the serialiser's smaller writes can come out ahead of it).

Each variant (script x writer threads) is run ``--reps`` times, interleaved (each rep starting with
another variant), and the median is kept; the figures are MB/s of sample bytes and ratios to the floors.
A last part times save_atomic alone on a tmpfs, with and without another thread running pure Python:
the GIL's share, which the disk runs (whose main thread mostly copies, with the GIL released) hide.

  python benchmarks/controller/writer_throughput.py --before-rev 8b7077d --md benchmarks/WRITER_RESULTS.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "remote_ops/playbook/shipped/scripts/extract_hidden_states.py"
OLD_SCRIPT = "playbooks/scripts/extract_hidden_states.py"   # where revisions before remote-ops 0.2.0 keep it
RUN_IDENTITY = "remote_ops/agent/outputs/run_identity.py"   # shipped beside the script (0.3.0 playbook extract.files)
LAYOUT = "remote_ops/agent/outputs/layout.py"               # and the sample-name rule run_identity.py uses


def load_script(rev: str | None, scratch: Path):
    """The shipped script's module, from this checkout or from ``rev`` (git show)."""
    if rev is None:
        path = REPO / SCRIPT
    else:
        d = scratch / f"script_{rev}"      # the script and what the playbook's extract.files ships beside it
        d.mkdir(parents=True, exist_ok=True)
        path = d / "extract_hidden_states.py"
        shown = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{SCRIPT}"], capture_output=True, text=True)
        if shown.returncode != 0:
            shown = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{OLD_SCRIPT}"], check=True,
                                   capture_output=True, text=True)
        path.write_text(shown.stdout)
        for src, name in ((RUN_IDENTITY, "run_identity.py"), (LAYOUT, "layout.py")):
            got = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{src}"], capture_output=True, text=True)
            if got.returncode == 0:        # revisions before the run identity (or the layout module) have none to ship
                (d / name).write_text(got.stdout)
    spec = importlib.util.spec_from_file_location(f"ehs_writer_{rev or 'here'}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def lengths_of(n: int, lo: int, hi: int, cut: int, seed: int = 20261201) -> list[int]:
    rng = random.Random(seed)
    return [min(rng.randint(lo, hi), cut) for _ in range(n)]


def clear(d: Path) -> None:
    for p in d.iterdir():
        p.unlink()
    os.sync()


def dd_floor(d: Path, nbytes: int) -> float:
    clear(d)
    count = max(1, nbytes // (16 << 20))
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={d / 'dd.bin'}", "bs=16M", f"count={count}", "oflag=direct",
                    "status=none"], check=True)
    s = time.perf_counter() - t0
    clear(d)
    return count * (16 << 20) / s


def raw_floor(d: Path, sizes: list[int], threads: int) -> float:
    """The same files as plain bytes, each written, fsynced and renamed, by ``threads`` threads."""
    clear(d)
    blob = os.urandom(1 << 20) * (max(sizes) // (1 << 20) + 1)
    todo = list(enumerate(sizes))
    lock = threading.Lock()

    def loop():
        while True:
            with lock:
                if not todo:
                    return
                i, n = todo.pop(0)
            tmp, final = d / f".raw_{i}.tmp", d / f"raw_{i}.pt"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(blob)[:n]
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=loop) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    fd = os.open(d, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    s = time.perf_counter() - t0
    clear(d)
    return sum(sizes) / s


def writer_run(mod, torch, d: Path, source, lengths: list[int], layers: int, threads: int,
               queue_mb: float, size) -> dict:
    """The script's Writer with ``threads`` threads: samples made by cloning rows of ``source`` (as
    generate() copies each sample out of the engine's hand-off), built and queued as run() does;
    ``size(sample)``: its bytes (this checkout's script's tensor_bytes, whichever script writes)."""
    clear(d)
    done = []
    writer = mod.Writer(torch, str(d), int(queue_mb * (1 << 20)), done.append, threads=threads)
    nbytes, at = 0, 0
    t0 = time.perf_counter()
    for i, n in enumerate(lengths):
        if at + n > source.shape[1]:
            at = 0
        hs = [source[k, at:at + n].clone() for k in range(layers)]
        at += n
        ids = list(range(n))
        record = {"input_ids": ids, "loss_mask": None, "where": "bench"}
        sample = mod.build_sample(torch, i, record, {"input_ids": torch.as_tensor(ids), "hidden_states": hs},
                                  layers)
        nbytes += size(sample)
        writer.put(i, sample)
    writer.close()
    s = time.perf_counter() - t0
    files = sorted(p.name for p in d.iterdir())
    assert len(done) == len(lengths) and files == sorted(f"data_{i}.pt" for i in range(len(lengths))), files[:5]
    check = torch.load(d / "data_0.pt")          # the format is the script's: read one back
    assert check["hidden_states"][0].shape == (lengths[0], source.shape[2])
    clear(d)
    return {"seconds": round(s, 3), "bytes": nbytes, "mb_per_s": round(nbytes / s / 1e6, 1)}


def gil_part(scripts: dict, torch, sample: dict, where: Path, saves: int) -> dict:
    """Milliseconds of the script's save_atomic for one sample into ``where`` (a tmpfs: no disk in the
    figure), alone and while another thread runs pure Python, as the job's main thread does between
    copies (vLLM's scheduler, request objects, the RPC's pickles): how much the serialiser waits for
    the GIL. Medians of ``saves`` saves, the scripts interleaved."""
    where.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            x += 1
    out: dict = {}
    python_default = sys.getswitchinterval()
    # a script that sets the switch interval while its writers run (--gil-switch-ms) is timed at its own
    # default too, beside the Python thread
    short = {name: mod.DEFAULT_GIL_SWITCH_MS for name, mod in scripts.items()
             if getattr(mod, "DEFAULT_GIL_SWITCH_MS", None)}
    cases = [("alone", False, None), ("python_thread", True, None)] + \
        [(f"python_thread_switch_{ms:g}ms", True, ms) for ms in sorted(set(short.values()))]
    try:
        for label, contended, ms in cases:
            spinner = threading.Thread(target=busy, daemon=True)
            sys.setswitchinterval(ms / 1000.0 if ms else python_default)
            if contended:
                stop.clear()
                spinner.start()
            mods = {name: mod for name, mod in scripts.items() if ms is None or short.get(name) == ms}
            times: dict = {name: [] for name in mods}
            for k in range(saves):
                for name, mod in mods.items():
                    t0 = time.perf_counter()
                    mod.save_atomic(torch, sample, str(where / f"data_{k}.pt"))
                    times[name].append(time.perf_counter() - t0)
            if contended:
                stop.set()
                spinner.join()
            for name, ts in times.items():
                out[f"{name}/{label}"] = round(1000 * statistics.median(ts), 1)
    finally:
        sys.setswitchinterval(python_default)
    out["python_switch_interval_ms"] = round(python_default * 1000, 3)
    shutil.rmtree(where, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="directory on the disk to test (default: a fresh one in /var/tmp)")
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--threads", default="1,2,4,8", help="writer thread counts")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--saves", type=int, default=15, help="saves per figure of the GIL part")
    ap.add_argument("--queue-mb", type=float, default=2048, help="the script's --write-queue-mb")
    ap.add_argument("--copy-threads", type=int, default=None, help="torch threads (default: the script's auto)")
    ap.add_argument("--before-rev", default=None, help="git revision whose script gives the BEFORE figures")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "writer_throughput.json"))
    ap.add_argument("--md", default=None, help="also render the result as markdown here")
    ap.add_argument("--from-json", default=None, help="render this earlier result instead of running")
    args = ap.parse_args(argv)
    if args.from_json:
        text = render(json.loads(Path(args.from_json).read_text()), os.path.relpath(args.from_json, REPO))
        print(text)
        if args.md:
            Path(args.md).write_text(text)
        return 0

    import torch
    scratch = Path(tempfile.mkdtemp(prefix="writer-bench-", dir=args.dir or "/var/tmp"))
    out_dir = scratch / "out"
    out_dir.mkdir()
    try:
        scripts = {"after": load_script(None, scratch)}
        if args.before_rev:
            scripts["before"] = load_script(args.before_rev, scratch)
        copy_threads = scripts["after"].set_copy_threads(torch, args.copy_threads)
        lengths = lengths_of(args.samples, 200, 4000, args.max_model_len - 1)
        source = torch.randn(args.layers, args.max_model_len * 4, args.hidden).to(torch.bfloat16)
        sizes = [n * (args.layers * args.hidden * 2 + 16) for n in lengths]
        threads = [int(t) for t in args.threads.split(",")]
        runs: dict = {"dd": [], **{f"raw/{t}": [] for t in threads},
                      **{f"{name}/{t}": [] for name in scripts for t in threads}}
        for rep in range(args.reps):
            runs["dd"].append(round(dd_floor(out_dir, sum(sizes)) / 1e6, 1))
            for t in threads:
                order = ["raw", *scripts]
                k = rep % len(order)           # each rep starts with another variant: no order favours one
                for name in order[k:] + order[:k]:
                    if name == "raw":
                        mb = round(raw_floor(out_dir, sizes, t) / 1e6, 1)
                    else:
                        mb = writer_run(scripts[name], torch, out_dir, source, lengths, args.layers, t,
                                        args.queue_mb, scripts["after"].tensor_bytes)["mb_per_s"]
                    runs[f"{name}/{t}"].append(mb)
                    print(f"rep {rep + 1}: {name} writer threads {t}: {mb} MB/s", flush=True)
        med = {k: statistics.median(v) for k, v in runs.items()}
        n = lengths[0]
        one = {"input_ids": torch.arange(n), "loss_mask": torch.ones(n, dtype=torch.long),
               "hidden_states": [source[k, :n].clone() for k in range(args.layers)]}
        shm = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else scratch
        gil = gil_part(scripts, torch, one, Path(tempfile.mkdtemp(prefix="writer-bench-gil-", dir=shm)), args.saves)
        doc = {
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
                        "torch": torch.__version__, "dir": str(scratch),
                        "fs": subprocess.run(["df", "-T", str(scratch)], capture_output=True, text=True).stdout
                        .splitlines()[-1].split()[1]},
            "code_rev": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip(),
            "before_rev": args.before_rev,
            "samples": args.samples, "tokens": sum(lengths), "layers": args.layers, "hidden": args.hidden,
            "bytes": sum(sizes), "copy_threads": copy_threads, "queue_mb": args.queue_mb, "reps": args.reps,
            "runs_mb_per_s": runs, "median_mb_per_s": med,
            "save_ms": {"sample_bytes": scripts["after"].tensor_bytes(one), "where": str(shm), "saves": args.saves, **gil},
            "ratios": {k: {"of_dd": round(v / med["dd"], 3), "of_raw": round(v / med[f"raw/{k.split('/')[1]}"], 3)}
                       for k, v in med.items() if k != "dd" and not k.startswith("raw/")},
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
        text = render(doc, os.path.relpath(args.out, REPO))
        print(text)
        if args.md:
            Path(args.md).write_text(text)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def render(doc: dict, source: str) -> str:
    m, med = doc["machine"], doc["median_mb_per_s"]
    threads = sorted({int(k.split("/")[1]) for k in med if k.startswith("raw/")})
    names = [n for n in ("before", "after") if f"{n}/{threads[0]}" in med]
    lines = [
        "# The extraction's write path against the disk",
        "",
        f"Generated by `python benchmarks/controller/writer_throughput.py` ({source}). The shipped script's own Writer and "
        "save_atomic write samples of the real format; the main thread makes each one by cloning rows of a "
        "large buffer, as generate() does. Figures are medians of "
        f"{doc['reps']} interleaved reps, MB/s of sample bytes.",
        "",
        f"- machine: {m['cpus']} CPUs, {m['platform']}, python {m['python']}, torch {m['torch']}; "
        f"filesystem {m['fs']}; {doc['copy_threads']} copy thread(s)",
        f"- data: {doc['samples']} samples, {doc['tokens']} tokens, {doc['layers']} layers x hidden "
        f"{doc['hidden']} bf16: {doc['bytes'] / 1e9:.2f} GB per run; write queue {doc['queue_mb']:g} MiB",
        f"- code: {doc['code_rev']}" + (f"; BEFORE: the script at {doc['before_rev']}" if doc["before_rev"] else ""),
        f"- floor dd oflag=direct: {med['dd']:.0f} MB/s [{min(doc['runs_mb_per_s']['dd']):.0f}-"
        f"{max(doc['runs_mb_per_s']['dd']):.0f}]",
        "",
        "| writer threads | raw files | " + " | ".join(f"{n} (of dd, of raw) [min-max of the reps]" for n in names)
        + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for t in threads:
        runs = doc["runs_mb_per_s"]
        cells = [f"{med[f'{n}/{t}']:.0f} ({doc['ratios'][f'{n}/{t}']['of_dd']:.2f}, "
                 f"{doc['ratios'][f'{n}/{t}']['of_raw']:.2f}) [{min(runs[f'{n}/{t}']):.0f}-{max(runs[f'{n}/{t}']):.0f}]"
                 for n in names]
        lines.append(f"| {t} | {med[f'raw/{t}']:.0f} | " + " | ".join(cells) + " |")
    g = doc["save_ms"]
    lines += [
        "",
        f"One sample ({g['sample_bytes'] / 1e6:.1f} MB) through save_atomic into {g['where']} (no disk), "
        f"median of {g['saves']} saves, alone and while another thread runs pure Python (the job's main "
        "thread runs vLLM's scheduler and the RPC in Python between its copies):",
        "",
        "| script | alone, ms | with a Python thread, ms | slowdown |",
        "|---|---|---|---|",
    ]
    for n in names:
        a, c = g[f"{n}/alone"], g[f"{n}/python_thread"]
        lines.append(f"| {n} | {a:.1f} | {c:.1f} | {c / a:.2f}x |")
    short = sorted((k.split("/")[0], k.split("_switch_")[1]) for k in g
                   if "/python_thread_switch_" in k)
    if short:
        lines += ["", f"The same beside the Python thread, with Python's thread switch interval set as the script "
                  f"sets it while its writer threads run (`--gil-switch-ms`; the figures above: Python's own "
                  f"{g.get('python_switch_interval_ms', 5):g} ms):", "",
                  "| script | switch interval | with a Python thread, ms | slowdown against alone |", "|---|---|---|---|"]
        for n, ms in short:
            c = g[f"{n}/python_thread_switch_{ms}"]
            lines.append(f"| {n} | {ms[:-2]} ms | {c:.1f} | {c / g[f'{n}/alone']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
