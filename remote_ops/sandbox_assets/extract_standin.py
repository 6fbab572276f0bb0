#!/usr/bin/env python3
"""A realistic stand-in for speculators' offline hidden-state generation (runs on the host).

Same arguments and outputs as the real script, with a tiny seeded model instead of vLLM:
one ``data_<N>.pt`` per sample (``{"input_ids", "hidden_states": [one tensor per captured layer],
"loss_mask"}``), a ``data_config.json``, tqdm bars "Generating hidden states" (per batch) and
"Saving files", and resume after the highest existing index. Fault flags make it slow, crash,
hang, or leave stubborn workers behind, for the tests and the sandbox demo.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-model-path", default="tiny-standin")
    p.add_argument("--output-dir", required=False)
    p.add_argument("--max-samples", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--layers", default="1,2,3", help="comma list of layer indexes to capture")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per batch")
    p.add_argument("--crash-at", type=int, default=None, help="raise when reaching sample N")
    p.add_argument("--hang-at", type=int, default=None, help="stop making progress at sample N")
    p.add_argument("--spawn-workers", type=int, default=0, help="start K worker processes")
    p.add_argument("--stubborn", action="store_true", help="workers ignore SIGTERM, own sessions")
    p.add_argument("--clean-env", action="store_true",
                   help="workers start with an empty environment (like a worker whose environ was "
                        "overwritten by setproctitle): only the process tree and GPU list find them")
    p.add_argument("--require-env", action="append", default=[],
                   help="fail unless this variable is set (prints only its length)")
    p.add_argument("--ticks", action="store_true",
                   help="print 'tick <unix time>' per batch (latency measurements)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker_main(stubborn):
    if stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while True:
        time.sleep(1)


def spawn_workers(k, stubborn, clean_env=False):
    procs = []
    for _ in range(k):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker"] + (["--stubborn"] if stubborn else [])
        # New sessions, like vLLM's engine core and TP workers: not in the job's process group.
        procs.append(subprocess.Popen(cmd, start_new_session=stubborn, stdin=subprocess.DEVNULL,
                                      env={} if clean_env else None))
    print("started %d worker(s): %s" % (k, ", ".join(str(p.pid) for p in procs)), flush=True)
    return procs


def highest_index(output_dir):
    top = -1
    for name in os.listdir(output_dir):
        m = re.match(r"^data_(\d+)\.pt$", name)
        if m:
            top = max(top, int(m.group(1)))
    return top


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.stubborn)
    for name in args.require_env:
        if not os.environ.get(name):
            print("error: %s is not set" % name, file=sys.stderr)
            return 2
        print("%s is set (%d characters)" % (name, len(os.environ[name])), flush=True)
    if not args.output_dir:
        print("error: --output-dir is required", file=sys.stderr)
        return 2

    import warnings
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    from tqdm import tqdm

    layers = [int(x) for x in str(args.layers).split(",") if x.strip()]
    n_layers = max(layers) + 1
    torch.manual_seed(args.seed)
    emb = torch.nn.Embedding(args.vocab_size, args.hidden_size)
    blocks = torch.nn.ModuleList(torch.nn.Linear(args.hidden_size, args.hidden_size)
                                 for _ in range(n_layers))
    print("Loaded target model %s: %d layers, hidden size %d, capturing layers %s"
          % (args.target_model_path, n_layers, args.hidden_size, layers), flush=True)

    workers = spawn_workers(args.spawn_workers, args.stubborn, args.clean_env) if args.spawn_workers else []

    os.makedirs(args.output_dir, exist_ok=True)
    start = highest_index(args.output_dir) + 1
    if start:
        print("Resuming after existing sample %d" % (start - 1), flush=True)
    remaining = list(range(start, args.max_samples))
    with open(os.path.join(args.output_dir, "data_config.json"), "w") as fh:
        json.dump({"target_model_path": args.target_model_path, "seq_len": args.seq_len,
                   "layer_ids": layers, "hidden_size": args.hidden_size,
                   "max_samples": args.max_samples, "generator": "remote-ops extract_standin"}, fh,
                  indent=2)

    batches = [remaining[i:i + args.batch_size] for i in range(0, len(remaining), args.batch_size)]
    written = []
    for batch in tqdm(batches, desc="Generating hidden states", unit="batch", mininterval=0.05):
        for idx in batch:
            if args.crash_at is not None and idx == args.crash_at:
                raise RuntimeError("simulated failure while generating sample %d "
                                   "(CUDA error: an illegal memory access was encountered)" % idx)
            if args.hang_at is not None and idx == args.hang_at:
                while True:   # like a hung NCCL collective: alive, silent, no output
                    time.sleep(1)
        g = torch.Generator().manual_seed(args.seed * 100003 + batch[0])
        ids = torch.randint(0, args.vocab_size, (len(batch), args.seq_len), generator=g)
        with torch.no_grad():
            h = emb(ids)
            captured = {}
            for li, block in enumerate(blocks):
                h = torch.tanh(block(h))
                if li in layers:
                    captured[li] = h
        for row, idx in enumerate(batch):
            sample = {"input_ids": ids[row].clone(),
                      "hidden_states": [captured[li][row].clone() for li in layers],
                      "loss_mask": torch.ones(args.seq_len, dtype=torch.long)}
            path = os.path.join(args.output_dir, "data_%d.pt" % idx)
            torch.save(sample, path + ".tmp")
            os.replace(path + ".tmp", path)
            written.append(path)
        if args.ticks:
            print("tick %.6f" % time.time(), flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    for path in tqdm(written, desc="Saving files", unit="file", mininterval=0.05):
        os.path.getsize(path)
    print("Wrote %d samples to %s" % (len(written), args.output_dir), flush=True)
    for w in workers:
        if not args.stubborn:
            w.terminate()
            w.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
