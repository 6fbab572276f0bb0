#!/usr/bin/env python3
# remote-ops: STAND-IN torch-CPU stand-in for extract_hidden_states.py: no vLLM, no speculators, no GPU
"""STAND-IN for remote_ops/playbook/shipped/scripts/extract_hidden_states.py: the sandbox's extraction job (runs on the host).

What it runs: the shipped script itself (found next to this file, in the working directory, where
``remote-ops extract`` uploads it, or in remote-ops' own remote_ops/playbook/shipped/scripts/; or at
$REMOTE_OPS_EXTRACT_SCRIPT), imported and driven through its own ``main`` - its arguments,
dataset reading and validation, truncation to max_model_len - 1, batching, resume, atomic writes,
tqdm bar, ``data_config.json`` and ``data_<N>.pt`` layout - with ONE part replaced: instead of
speculators' ``VllmHiddenStatesGenerator`` it builds ``StandinGenerator``, a tiny seeded torch model
on the CPU (embedding, then ``--num-layers`` layers of tanh(Linear(h) + causal running mean of h)),
with the generator's constructor and ``generate(list[list[int]])``, the same default layer choice
([2, n/2, n-3, n-1]) and bfloat16 outputs.

What it does NOT do: it imports neither vLLM nor speculators and needs no GPU, so it cannot show
any failure of the real path (the patched generator, vLLM's scheduler, KV cache, chunked prefill,
prefix caching, tensor parallelism, CUDA, worker start methods, the model's tokenizer); its hidden
states are not any real model's; ``text`` lines are tokenized as UTF-8 bytes, not with a real
tokenizer; ``--tensor-parallel-size`` and ``--gpu-memory-utilization`` are only recorded. It prints
a ``STAND-IN`` line first, and remote-ops labels its jobs STAND-IN (the marker comment above).

Without ``--dataset`` it writes a seeded synthetic dataset (``--max-samples`` lines of ``--seq-len``
token ids) to a temporary file. Fault flags make it slow, crash, hang, or leave stubborn workers
behind, for the tests and the sandbox demo.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

STANDIN_LINE = ("STAND-IN: torch-CPU stand-in generator driven by the shipped extract_hidden_states.py "
                "(no vLLM, no speculators, no GPU; hidden states are not a real model's)")


def find_script():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("REMOTE_OPS_EXTRACT_SCRIPT") or "",
                  os.path.join(here, "extract_hidden_states.py"),
                  os.path.join(os.getcwd(), "extract_hidden_states.py"),
                  os.path.join(here, "..", "playbook", "shipped", "scripts", "extract_hidden_states.py")]
    for path in candidates:
        if path and os.path.isfile(path):
            return os.path.realpath(path)
    raise SystemExit("extract_standin: cannot find extract_hidden_states.py (looked in: %s); "
                     "run `remote-ops extract` (it uploads it) or set REMOTE_OPS_EXTRACT_SCRIPT"
                     % ", ".join(c for c in candidates if c))


def load_script():
    path = find_script()
    spec = importlib.util.spec_from_file_location("extract_hidden_states", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def add_standin_arguments(p):
    g = p.add_argument_group("stand-in only")
    g.add_argument("--num-layers", type=int, default=8, help="layers of the stand-in model (default 8)")
    g.add_argument("--hidden-size", type=int, default=64)
    g.add_argument("--vocab-size", type=int, default=1000)
    g.add_argument("--seq-len", type=int, default=32, help="tokens per synthetic sample (no --dataset)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--sleep", type=float, default=0.0, help="seconds per batch")
    g.add_argument("--crash-at", type=int, default=None, help="raise when reaching sample N")
    g.add_argument("--hang-at", type=int, default=None, help="stop making progress at sample N")
    g.add_argument("--spawn-workers", type=int, default=0, help="start K worker processes")
    g.add_argument("--stubborn", action="store_true", help="workers ignore SIGTERM, own sessions")
    g.add_argument("--clean-env", action="store_true",
                   help="workers start with an empty environment (like a worker whose environ was "
                        "overwritten by setproctitle): only the process tree and GPU list find them")
    g.add_argument("--require-env", action="append", default=[],
                   help="fail unless this variable is set (prints only its length)")
    g.add_argument("--ticks", action="store_true",
                   help="print 'tick <unix time>' per batch (latency measurements)")
    g.add_argument("--save-ms", type=float, default=0.0,
                   help="a slow disk: each file's save takes this many milliseconds more")


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


class StandinGenerator:
    """STAND-IN for speculators' VllmHiddenStatesGenerator: same constructor and generate(), a tiny
    seeded torch model on the CPU. ``indexes`` are the data_<N> indexes still to do and ``prompts``
    their prompts: a generated prompt is the first of them with its tokens (for --crash-at / --hang-at;
    without ``prompts``, the n-th generated sample is ``indexes[n]``)."""

    # read by the shipped script's hand-off line: a patch of vLLM's worker cannot change this
    remote_ops_no_handoff = "the STAND-IN generator computes them in this process (no vLLM worker to hand them over)"

    def __init__(self, model_path, layer_ids, max_model_len, gpu_memory_utilization, tensor_parallel_size,
                 *, opts, indexes, prompts=None):
        import torch
        self.torch = torch
        self.model_path = model_path
        self.tensor_parallel_size = tensor_parallel_size
        self.max_model_len = max_model_len
        n = opts.num_layers
        self.layer_ids = list(layer_ids) if layer_ids is not None else [2, n // 2, n - 3, n - 1]
        for layer in self.layer_ids:
            if layer < 0 or layer >= n:
                raise ValueError("Layer index %d out of bounds [0, %d]" % (layer, n - 1))
        self.opts, self.indexes, self.count = opts, indexes, 0
        self.by_prompt = {}
        for i, ids in zip(indexes, prompts or []):
            self.by_prompt.setdefault(tuple(ids), []).append(i)
        torch.manual_seed(opts.seed)
        self.emb = torch.nn.Embedding(opts.vocab_size, opts.hidden_size)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(opts.hidden_size, opts.hidden_size) for _ in range(n))
        print("Loaded stand-in model for %s: %d layers, hidden size %d, capturing layers %s"
              % (model_path, n, opts.hidden_size, self.layer_ids), flush=True)
        self.workers = (spawn_workers(opts.spawn_workers, opts.stubborn, opts.clean_env)
                        if opts.spawn_workers else [])

    def _forward(self, ids):
        torch = self.torch
        h = self.emb(torch.as_tensor(ids, dtype=torch.long) % self.opts.vocab_size)
        steps = torch.arange(1, h.shape[0] + 1, dtype=h.dtype).unsqueeze(1)
        out = {}
        for li, block in enumerate(self.blocks):
            h = torch.tanh(block(h) + h.cumsum(0) / steps)   # causal: token t sees tokens <= t
            if li in self.layer_ids:
                out[li] = h
        return [out[li].to(torch.bfloat16) for li in self.layer_ids]

    def generate(self, token_ids):
        torch = self.torch
        if not token_ids:
            raise ValueError("token_ids cannot be empty")
        limit = self.max_model_len - 1
        results = []
        for ids in token_ids:
            same = self.by_prompt.get(tuple(list(ids)[: self.max_model_len - 1]))
            idx = same.pop(0) if same else (self.indexes[self.count] if self.count < len(self.indexes)
                                            and not self.by_prompt else None)
            self.count += 1
            if self.opts.crash_at is not None and idx == self.opts.crash_at:
                raise RuntimeError("simulated failure while generating sample %d "
                                   "(CUDA error: an illegal memory access was encountered)" % idx)
            if self.opts.hang_at is not None and idx == self.opts.hang_at:
                while True:   # like a hung NCCL collective: alive, silent, no output
                    time.sleep(1)
            ids = list(ids)[:limit]
            with torch.no_grad():
                hs = self._forward(ids)
            results.append({"input_ids": torch.as_tensor(ids, dtype=torch.long), "hidden_states": hs,
                            "loss_mask": None})
        if self.opts.ticks:
            print("tick %.6f" % time.time(), flush=True)
        if self.opts.sleep:
            time.sleep(self.opts.sleep)
        return results

    def shutdown(self):
        for w in self.workers:
            if not self.opts.stubborn:
                w.terminate()
                w.wait()


def byte_tokenizer(model_path):
    """STAND-IN tokenizer: UTF-8 bytes as token ids (the real script loads the model's)."""
    return lambda text: {"input_ids": list(text.encode("utf-8"))}


def standin_batch_steps(argv):
    """``argv`` with --batch-steps auto (or absent, or empty) as 1."""
    out, i, said = [], 0, False
    while i < len(argv):
        a = argv[i]
        if a == "--batch-steps" and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        elif a.startswith("--batch-steps="):
            value, i = a.split("=", 1)[1], i + 1
        else:
            out.append(a)
            i += 1
            continue
        said = True
        out += ["--batch-steps", "1" if value.strip().lower() in ("", "auto") else value]
    return out if said else out + ["--batch-steps", "1"]


def synthetic_dataset(args):
    import random
    fd, path = tempfile.mkstemp(prefix="standin-dataset-", suffix=".jsonl")
    with os.fdopen(fd, "w") as fh:
        for i in range(args.max_samples or 16):
            rng = random.Random(args.seed * 100003 + i)
            fh.write(json.dumps({"input_ids": [rng.randrange(args.vocab_size) for _ in range(args.seq_len)]}) + "\n")
    return path


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in argv:
        return worker_main("--stubborn" in argv)
    print(STANDIN_LINE, flush=True)
    script = load_script()
    parser = script.build_parser(required=False)
    parser.prog = "extract_standin"
    add_standin_arguments(parser)
    pre = parser.parse_known_args(argv)[0]
    for name in pre.require_env:
        if not os.environ.get(name):
            print("error: %s is not set" % name, file=sys.stderr)
            return 2
        print("%s is set (%d characters)" % (name, len(os.environ[name])), flush=True)
    given = list(argv)
    # "auto" steps a generate() call are the engine's choice: this stand-in's engine takes one. The script's
    # several steps a call keep a GPU busy while the host works; here they would only make every batch (and
    # its --sleep, --ticks, files) come in fours. An explicit number is kept.
    if hasattr(pre, "batch_steps"):         # (an older script has no such flag)
        argv = standin_batch_steps(argv)
    synthetic = None
    if not pre.dataset:
        synthetic = synthetic_dataset(pre)
        argv += ["--dataset", synthetic]
        if pre.max_samples is None:
            argv += ["--max-samples", "16"]
    if not pre.target_model_path:
        argv += ["--target-model-path", "tiny-standin"]
    if pre.save_ms > 0 and hasattr(script, "save_atomic"):
        fast_save = script.save_atomic

        def slow_save(*a, **k):
            time.sleep(pre.save_ms / 1000.0)
            return fast_save(*a, **k)
        script.save_atomic = slow_save
    import warnings
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    holder = {}

    def loaders(args):
        # the run identity is the command line's (what remote-ops' preflight reads), not the synthetic
        # dataset or default model name added above
        args.argv = given

        def make(model_path, layer_ids, max_model_len, gpu_memory_utilization, tensor_parallel_size):
            records = script.read_dataset(args.dataset, args.max_samples)
            shard = getattr(args, "shard", None)      # (a script without --shard, e.g. an older one, takes 2 arguments)
            todo = script.pending_indexes(args.output_dir, len(records), *([shard] if shard else []))
            # the script may take samples out of order (--pack-window): which sample a prompt is comes from
            # its tokens, as the script cuts them (samples with the same tokens are taken in order)
            prompts = None
            if hasattr(script, "tokenize") and hasattr(script, "truncate"):
                script.tokenize(records, byte_tokenizer, model_path)
                script.truncate(records, max_model_len)
                prompts = [records[i]["input_ids"] for i in todo]
            holder["gen"] = StandinGenerator(model_path, layer_ids, max_model_len, gpu_memory_utilization,
                                             tensor_parallel_size, opts=args, indexes=todo, prompts=prompts)
            return holder["gen"]
        return {"make_generator": make, "load_tokenizer": byte_tokenizer,
                "hidden_size_of": lambda model_path: args.hidden_size}
    try:
        return script.main(argv, parser, loaders)
    finally:
        if "gen" in holder:
            holder["gen"].shutdown()
        if synthetic:
            os.unlink(synthetic)


if __name__ == "__main__":
    sys.exit(main())
