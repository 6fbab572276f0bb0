#!/usr/bin/env python3
"""Extract EAGLE-3 training hidden states with speculators' vLLM generator (runs on the GPU host).

Shipped with the playbook eagle3-speculators-0.3.0 (remote_ops/playbook/shipped/); ``remote-ops extract`` uploads it into the
host's workdir and runs it with the host's interpreter. It imports torch, tqdm, transformers (only
to tokenize ``text`` lines and read the model's hidden size) and speculators; never remote_ops.

Input: ``--dataset`` is JSONL, one sample per line: ``{"input_ids": [int, ...]}`` or
``{"text": "..."}`` (tokenized with the model's tokenizer, ``AutoTokenizer.from_pretrained
(--target-model-path)``, special tokens added as the tokenizer does by default), each with an
optional ``"loss_mask": [0|1, ...]`` of the same length (absent: all ones). Blank lines are skipped;
other keys are ignored. Sample N is the N-th non-blank line (0-based); ``--max-samples`` takes the
first N. Every line used is validated before the engine starts.

Engine: ``speculators.data_generation.vllm_hidden_states_generator.VllmHiddenStatesGenerator(
model_path, layer_ids, max_model_len, gpu_memory_utilization, tensor_parallel_size)`` and its
``generate(list[list[int]])``, called once per batch. Prompts are cut to
``max_model_len - 1`` tokens here, before ``generate`` (the generator cuts to the same length, since
vLLM needs room for the one decode token), and ``loss_mask`` is cut with them, so input_ids,
every hidden-states tensor and loss_mask of a file have the same length. Every result is checked
before it is written: the generator must hand back this sample's input_ids and one
``[seq_len, hidden]`` tensor per captured layer with seq_len == len(input_ids); anything else stops
the run with exit status 1 and one line naming the sample (the symptom of vLLM chunked prefill or
prefix caching left on: another sample's rows), and nothing is written for that sample.

Output (``--output-dir``), matched to speculators' own offline data generation,
``scripts/data_generation_offline.py`` and ``src/speculators/data_generation/config_generator.py``
at tag v0.3.0 (commit be6e86e79eee8b2d363399a767194e53f5407331 of vllm-project/speculators), which
``src/speculators/train/data.py`` (``Eagle3SampleFileDataset``, ``standardize_data_v1``) reads:

- ``data_<N>.pt``: ``torch.save`` of ``{"input_ids": LongTensor[seq_len], "hidden_states":
  [Tensor[seq_len, hidden] per captured layer, in the model's dtype, contiguous], "loss_mask":
  LongTensor[seq_len]}``.
- ``data_config.json``: the same document as ``DataGenerationConfig.to_dict()`` of v0.3.0 (version
  "2.0": reproducibility, model, data, hidden_states, generation, format with its schema). Written
  once the generator is up (layer ids and hidden size known), before the first sample.
  ``data.train_data_path`` is the JSONL path; ``generation.cache_dir`` is "" (no HF datasets cache
  is used); ``data.seed`` is 0 (nothing is shuffled).

- ``run.json``: the run identity (``run_identity.py``, shipped beside this script: the dataset's path,
  size and sha256 of the lines used, the model's path and config.json sha256, layer ids,
  max_model_len, shard, package versions, the playbook remote-ops names in $REMOTE_OPS_RUN_PLAYBOOK),
  checked before the tokenizer, torch or the engine load: a directory holding samples of another
  identity (or samples and no run.json) stops the run with one line naming what differs (exit 2);
  ``--overwrite`` moves those files into ``.replaced-<UTC time>/`` in the directory (nothing is
  deleted) and starts over. Written for a new run before the first sample.

Several output directories (one per disk, so that a host with several NVMe drives writes to all of
them at once): ``--output-dir A:B:...`` (':'-separated, as PATH; remote-ops fills it from a playbook's
``output_dir: [A, B]``). Sample N goes to the ((N // n) % k)-th of the k directories, n the shard count
(1 unsharded): the run's own samples alternate over the directories in order, deterministically, so
a resume finds every file (run_identity.py's ``dir_index`` is the rule). Resume lists every
directory: a sample's file counts wherever it is among them (one moved to another of the directories
by hand is not written again; the resume line says how many are not where the rule puts them). Each
directory holds the same run.json (whose identity records the list, in order: a resume with another
list is refused like any other change) and the same data_config.json; stale temporaries are removed
in each. The same directory named twice (a path, a symlink or a bind mount of it) is refused. There
are at least as many writer threads as directories, so each disk has a write in flight.

Batches are packed by tokens: consecutive pending samples (never reordered) until the next one would
pass ``--batch-tokens`` (default: the engine's own scheduler budget, ``max_num_scheduled_tokens`` or
``max_num_batched_tokens`` of the generator's scheduler: ``max(8192, max_model_len)`` in speculators
0.3.0) or the batch would hold ``--batch-size`` samples (default: the scheduler's ``max_num_seqs``, 32
in 0.3.0). With chunked prefill off (the playbook turns it off) vLLM's scheduler takes waiting
prompts in order and stops at the first one that does not fit its budget, so a batch that fits is ONE
forward step, full, and a count-based batch of long prompts is a full step plus a small one.
``--batch-tokens 0`` gives count-only batches (the old behaviour).

Writes overlap the GPU: each checked sample goes to a writer thread through a queue bounded by
``--write-queue-mb`` (default 2048; a sample larger than the bound still goes, alone); the thread
writes each file atomically as below. A crash loses at most the queued samples (their files do not
exist, so the next run redoes exactly them); a failed write stops the run with that error, raised
in the main thread at the next batch or at the end; on any other error the samples already checked
are written before the run stops. ``--write-queue-mb 0`` writes in the main thread (the old way).
While writer threads run, Python's thread switch interval is ``--gil-switch-ms`` (default 0.5; Python's
own is 5): a writer thread takes the GIL back about ten times a file (after each tensor's write, the
fsync, the rename) and, while the main thread runs vLLM's scheduler and RPC in Python, waits up to
that interval each time. At the end one line ``extract-profile {json}`` says where the time went:
the main thread's generate(), result checks, hand-over to the writer (``writer.put_wait_s``: waiting
for room in its queue, i.e. the writing side held the GPU back) and the drain at the end; the
writer threads' saves (count, bytes, seconds, median and 90th percentile of one save); the hand-off
slots the generator mapped.

Hand-off: with the playbook's edits captured-states-through-shared-memory and
captured-states-from-shared-memory, vLLM's rank-0 worker hands each batch's captured layers to this
process through one file in a tmpfs directory instead of pickling CUDA tensors through the executor's
RPC (which took 88 % of the generator's time on an H200: benchmarks/GPU_RESULTS.md). ``--handoff-dir``
(default 'auto': /dev/shm) is where this run makes that directory; it is removed at the end (and a
directory left by a killed run is removed by the next run); 'off' keeps the RPC. After the first batch
one line says which way the states came.

Progress: besides the tqdm bar (samples), a line ``extract-progress {json}`` every
``--progress-seconds`` (default 10), once when the generator is ready and once at the end, with
``samples_done``/``samples_total``, ``tokens_done``/``tokens_total`` (written files, after
truncation; files of an earlier run count as done), ``tokens_per_s`` (tokens written by this run over
the seconds since the generator was ready), ``eta_s`` and ``t`` (unix time). ``remote-ops status`` and
``--tail`` read the last one.

Differences from speculators' script, on purpose: the dataset is read from JSONL instead of
speculators' chat preprocessing (no ``datasets`` dependency, no token-frequency file); resume skips
exactly the samples whose ``data_<N>.pt`` exists (not "everything below the highest index"), and a
file exists only once complete (written to ``.data_<N>.pt.<pid>.tmp``, fsynced, renamed; stale
temporaries are removed at start); one tqdm bar counts samples, its ``mininterval`` is
``$TQDM_MININTERVAL`` (default 0.1 s).

Sharding (``--shard K/N``, given by ``remote-ops extract GROUP --shard``): only the samples i with
i % N == K are written, still named by their global index, so the union of the N shards' directories
is one dataset; resume and the progress bar count the shard's samples, and data_config.json keeps
the dataset's ``num_samples`` and adds ``shard`` {index, count, assignment, samples}.

Exit status: 0 done; 1 the generator returned a result that does not fit its sample; 2 bad
arguments, bad dataset or an output directory of another run (one line: what, where, what to do). Other failures (vLLM, CUDA) end with
their own traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

GENERATOR_MODULE = "speculators.data_generation.vllm_hidden_states_generator"
CONFIG_VERSION = "2.0"          # DataGenerationConfig.VERSION of speculators 0.3.0
TEMP_RE = re.compile(r"^\.data_\d+\.pt\.\d+\.tmp$")
PROG = "extract_hidden_states"
PROGRESS_PREFIX = "extract-progress "
# speculators 0.3.0 vllm_hidden_states_generator: MIN_MAX_BATCHED_TOKENS, MAX_NUM_SEQS (used when the
# generator does not expose its scheduler)
DEFAULT_MIN_BATCH_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 32
# The patched worker hands rank 0's captured states to the generator through a file in this directory
# (playbook edits captured-states-through-shared-memory / captured-states-from-shared-memory)
HANDOFF_ENV = "REMOTE_OPS_HS_SHM_DIR"
HANDOFF_PREFIX = "remote-ops-hs-"
HANDOFF_RE = re.compile(r"^remote-ops-hs-(\d+)-")
PROFILE_PREFIX = "extract-profile "
# sys.setswitchinterval while writer threads run (--gil-switch-ms): Python's default is 5 ms
DEFAULT_GIL_SWITCH_MS = 0.5
# engine steps per generate() call (--batch-steps auto), and how far ahead a step is filled from
# (--pack-window): see pack_batches
DEFAULT_BATCH_STEPS = 4
DEFAULT_PACK_WINDOW = 16
# --batch-steps auto: DEFAULT_BATCH_STEPS, fewer where a call's captured states (kept on the GPU until the
# call ends: steps x step tokens x layers x hidden x 2 bytes) would pass this (auto_batch_steps)
CAPTURE_BUDGET_BYTES = 1 << 30


def auto_batch_steps(step_tokens, layers, hidden, budget=None):
    """Engine steps per generate() call for --batch-steps auto: up to DEFAULT_BATCH_STEPS while the
    call's captured states stay within ``budget`` bytes a GPU, and at least one (Kimi-K2.5's 4 layers x
    7,168 at 8,192 tokens a step: 2; a 2,048-wide model's: 4)."""
    per_step = int(step_tokens) * int(layers) * int(hidden) * 2
    if per_step <= 0:
        return DEFAULT_BATCH_STEPS
    return max(1, min(DEFAULT_BATCH_STEPS, (CAPTURE_BUDGET_BYTES if budget is None else budget) // per_step))


class InputError(Exception):
    """Bad arguments or dataset: one line, exit status 2."""


class ResultError(Exception):
    """The generator returned something that does not fit the sample: one line, exit status 1."""


class DiskFullError(OSError):
    """A sample's file did not fit on the output's filesystem: one line, exit status 1. torch.save
    reports a full disk as a RuntimeError about stream positions ("unexpected pos ..."), which says
    nothing of the cause; save_atomic reads the free space before removing its temporary and says it."""

    def __str__(self):
        return self.strerror     # the line main() prints, without OSError's "[Errno 28] " prefix


# ------------------------------------------------------------------ arguments
def parse_layer_ids(text):
    """"2,4,5,7" or "[2, 4, 5, 7]" (a YAML/JSON list, as a playbook var list is filled into the
    command) -> [2, 4, 5, 7]; "" or "none" -> None (the generator chooses)."""
    if text is None or str(text).strip().lower() in ("", "none", "default", "[]"):
        return None
    body = str(text).strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    out = []
    for part in body.replace(" ", ",").split(","):
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise InputError("--layer-ids %r: %r is not a layer index (write e.g. 2,4,5,7)" % (text, part)) from None
        if value < 0:
            raise InputError("--layer-ids %r: layer indexes are >= 0" % (text,))
        out.append(value)
    return out or None


def _auto_int(text):
    """An integer, or None for "auto" / "" (the engine's own value)."""
    if str(text).strip().lower() in ("", "auto"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a whole number or 'auto'" % (text,)) from None


def build_parser(required=True):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--target-model-path", required=required, help="HF model id or local checkpoint directory")
    p.add_argument("--dataset", required=required,
                   help="JSONL: {\"input_ids\": [...]} or {\"text\": ...} per line")
    p.add_argument("--output-dir", required=True,
                   help="where data_<N>.pt and data_config.json go; several directories (one per disk) are "
                        "written A:B:...: sample N goes to the ((N // shard count) %% k)-th of the k")
    p.add_argument("--max-samples", type=int, default=None, help="first N samples of the dataset (default: all)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="at most this many samples per engine step (default: the scheduler's max_num_seqs)")
    p.add_argument("--batch-tokens", type=_auto_int, default=None,
                   help="pack each engine step up to this many tokens (default or 'auto': the scheduler's "
                        "token budget; 0: generate() calls of --batch-size samples whatever their lengths, "
                        "in order)")
    p.add_argument("--batch-steps", type=_auto_int, default=None,
                   help="engine steps per generate() call (default or 'auto': %d, fewer where a call's "
                        "captured states, kept on the GPU until it ends, would pass %d MiB): the generator "
                        "sends a step while the one before computes, and waits for the GPU once per call"
                        % (DEFAULT_BATCH_STEPS, CAPTURE_BUDGET_BYTES >> 20))
    p.add_argument("--pack-window", type=int, default=DEFAULT_PACK_WINDOW,
                   help="each step is filled with the longest samples that fit among the next N pending "
                        "ones, the oldest always first (default %d; 0: in order). Files are still named by "
                        "sample index; one is written at most N steps out of order" % DEFAULT_PACK_WINDOW)
    p.add_argument("--write-queue-mb", type=float, default=2048,
                   help="bound of the samples waiting for the writer thread, in MiB (default 2048; "
                        "0: write in the main thread, no overlap)")
    p.add_argument("--progress-seconds", type=float, default=10,
                   help="seconds between extract-progress lines (default 10; 0: after every file)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per model (default 1)")
    p.add_argument("--layer-ids", default=None,
                   help="comma list of layers to capture (default: the generator's choice)")
    p.add_argument("--max-model-len", type=int, default=2048, help="vLLM max_model_len (default 2048)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.8, help="vLLM setting (default 0.8)")
    p.add_argument("--writer-threads", type=int, default=8,
                   help="threads writing files (default 8: several files' writes and fsyncs in flight at once)")
    p.add_argument("--gil-switch-ms", type=float, default=DEFAULT_GIL_SWITCH_MS,
                   help="Python's thread switch interval while writer threads run, in ms (default %g; 0: "
                        "Python's own, 5). Each writer thread takes the GIL back about ten times a file (after "
                        "each tensor's write, the fsync, the rename), and waits up to this interval each time "
                        "while the main thread runs vLLM's scheduler and RPC in Python" % DEFAULT_GIL_SWITCH_MS)
    p.add_argument("--copy-threads", type=_auto_int, default=None,
                   help="torch threads of this process, which copies each batch's rows out of the engine's "
                        "hand-off (default or 'auto': half the CPUs, at most 8; vLLM sets 1 when it starts)")
    p.add_argument("--handoff-dir", default="auto",
                   help="tmpfs directory through which the patched vLLM worker hands captured states to this "
                        "process (a fresh subdirectory is made and removed); 'auto' (default): /dev/shm when "
                        "writable; 'off': the executor's RPC, as unpatched")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="write only samples i with i %% N == K (files keep their global index; default: all)")
    p.add_argument("--overwrite", action="store_true",
                   help="start over: move the files of an earlier run in --output-dir into "
                        ".replaced-<UTC time>/ there (nothing is deleted); without it, a directory holding "
                        "another run's samples (run.json) is refused")
    return p


def parse_args(argv=None, parser=None):
    p = parser or build_parser()
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)     # the run identity reads the flags given
    for name, low in (("batch_size", 1), ("batch_tokens", 0), ("batch_steps", 1), ("pack_window", 0),
                      ("tensor_parallel_size", 1), ("max_model_len", 2), ("writer_threads", 1), ("copy_threads", 1)):
        if getattr(args, name) is not None and getattr(args, name) < low:
            raise InputError("--%s must be >= %d, got %d" % (name.replace("_", "-"), low, getattr(args, name)))
    for name in ("write_queue_mb", "progress_seconds", "gil_switch_ms"):
        if getattr(args, name) < 0:
            raise InputError("--%s must be >= 0, got %g" % (name.replace("_", "-"), getattr(args, name)))
    if args.max_samples is not None and args.max_samples < 1:
        raise InputError("--max-samples must be >= 1, got %d" % args.max_samples)
    if not 0 < args.gpu_memory_utilization <= 1:
        raise InputError("--gpu-memory-utilization must be in (0, 1], got %g" % args.gpu_memory_utilization)
    args.layer_ids = parse_layer_ids(args.layer_ids)
    args.shard = parse_shard(args.shard)
    return args


# ------------------------------------------------------------------ dataset
def _int_list(value, what, where, allowed=None):
    if not isinstance(value, list) or not value:
        raise InputError("%s: %s must be a non-empty list of integers" % (where, what))
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (allowed is not None and v not in allowed):
            want = "0 or 1" if allowed is not None else "an integer >= 0"
            raise InputError("%s: %s[%d] is %r, not %s" % (where, what, i, v, want))
    return value


def _parse_line(raw, lineno, path):
    """One dataset line (bytes) as a record {line, where, input_ids | text, loss_mask | None}; None
    for a blank line; InputError naming file:line for a bad one."""
    if not raw.strip():
        return None
    where = "%s:%d" % (path, lineno)
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError("%s: not UTF-8 text (%s at byte %d of the line)"
                         % (where, exc.reason, exc.start + 1)) from None
    try:
        obj = json.loads(line.rstrip("\r\n"))
    except ValueError as exc:
        # the decoder's column, not its "line 1": the file's line is named in front
        what = ("%s at column %d" % (exc.msg, exc.colno)) if isinstance(exc, json.JSONDecodeError) else exc
        raise InputError("%s: not valid JSON (%s)" % (where, what)) from None
    if not isinstance(obj, dict):
        raise InputError("%s: each line must be a JSON object with input_ids or text" % where)
    if ("input_ids" in obj) == ("text" in obj):
        raise InputError("%s: give exactly one of input_ids or text" % where)
    rec = {"line": lineno, "where": where, "input_ids": None, "text": None, "loss_mask": None}
    if "input_ids" in obj:
        rec["input_ids"] = _int_list(obj["input_ids"], "input_ids", where)
    else:
        if not isinstance(obj["text"], str) or not obj["text"]:
            raise InputError("%s: text must be a non-empty string" % where)
        rec["text"] = obj["text"]
    if obj.get("loss_mask") is not None:
        rec["loss_mask"] = _int_list(obj["loss_mask"], "loss_mask", where, allowed=(0, 1))
        if rec["input_ids"] is not None and len(rec["loss_mask"]) != len(rec["input_ids"]):
            raise InputError("%s: loss_mask has %d entries for %d input_ids"
                             % (where, len(rec["loss_mask"]), len(rec["input_ids"])))
    return rec


def _open_dataset(path):
    try:
        return open(path, "rb")     # lines split at b"\n" and decoded one by one: line numbers are the file's
    except OSError as exc:
        raise InputError("cannot read dataset %s: %s" % (path, exc.strerror)) from None


def read_dataset(path, max_samples=None):
    """The first ``max_samples`` samples: dicts {line, input_ids | text, loss_mask | None}."""
    records = []
    with _open_dataset(path) as fh:
        for lineno, raw in enumerate(fh, 1):
            if max_samples is not None and len(records) >= max_samples:
                break
            rec = _parse_line(raw, lineno, path)
            if rec is not None:
                records.append(rec)
    if not records:
        raise InputError("dataset %s has no samples" % path)
    return records


class Dataset:
    """The dataset as ``run`` uses it, in memory that does not grow with the tokens: one pass checks
    every line used (as read_dataset does) and hashes them (run_identity's ``lines_sha256``: the job
    reads its data once for its identity and its samples), keeping per sample only its line's offset,
    number and token count; a sample's tokens are read again when its batch runs (``batch``). Lines
    given as ``text`` are tokenized once (``tokenize``) and their tokens kept compactly, for the
    samples still to run only (``keep``). Indexable like read_dataset's list: ``records[i]`` is a record."""

    def __init__(self, path, max_samples=None):
        import hashlib
        from array import array
        self.path, self.limit, self.cut = path, None, 0
        self.offsets, self.lines, self.counts = array("q"), array("q"), array("q")
        self.tokens = {}        # index -> array of a text line's tokens
        h = hashlib.sha256()
        with _open_dataset(path) as fh:
            size, pos = os.fstat(fh.fileno()).st_size, 0
            for lineno, raw in enumerate(fh, 1):
                start, pos = pos, pos + len(raw)
                if max_samples is not None and len(self.offsets) >= max_samples:
                    break
                rec = _parse_line(raw, lineno, path)
                if rec is None:
                    continue
                h.update(raw.rstrip(b"\r\n"))
                h.update(b"\n")
                self.offsets.append(start)
                self.lines.append(lineno)
                self.counts.append(len(rec["input_ids"]) if rec["input_ids"] is not None else -1)
        if not self.offsets:
            raise InputError("dataset %s has no samples" % path)
        self.facts = {"path": os.path.realpath(path), "size": size, "samples": len(self.offsets),
                      "lines_sha256": h.hexdigest()}
        self._fh = None

    def __len__(self):
        return len(self.offsets)

    def _read(self, i):
        if self._fh is None:
            self._fh = _open_dataset(self.path)
        self._fh.seek(self.offsets[i])
        return _parse_line(self._fh.readline(), self.lines[i], self.path)

    def tokenize(self, load_tokenizer, model_path):
        """Token counts of the ``text`` lines, their tokens kept (tokenize's checks, one pass over them)."""
        texts = [i for i, n in enumerate(self.counts) if n < 0]
        if not texts:
            return
        tok = load_tokenizer(model_path)
        for i in texts:
            rec = self._read(i)
            one = tokenize([rec], lambda _: tok, model_path)[0]
            self.tokens[i] = _compact(one["input_ids"])
            self.counts[i] = len(one["input_ids"])

    def truncate(self, max_model_len):
        """Samples longer than max_model_len - 1 tokens are cut when read (truncate's rule); how many."""
        self.limit = max_model_len - 1
        self.cut = sum(1 for n in self.counts if n > self.limit)
        return self.cut

    @property
    def lengths(self):
        from array import array
        lim = self.limit
        return array("q", self.counts if lim is None else (min(n, lim) for n in self.counts))

    def keep(self, indexes):
        """Only the samples ``indexes`` will be read: a text line's tokens of any other are let go."""
        wanted = set(indexes)
        for i in [i for i in self.tokens if i not in wanted]:
            del self.tokens[i]

    def __getitem__(self, i):
        rec = self._read(i)
        if i in self.tokens:
            rec["input_ids"], rec["text"] = list(self.tokens[i]), None
        if self.limit is not None:
            truncate([rec], self.limit + 1)
        return rec

    def batch(self, indexes):
        return [self[i] for i in indexes]

    def close(self):
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _compact(ids):
    from array import array
    try:
        return array("i", ids)
    except OverflowError:
        return array("q", ids)


def tokenize(records, load_tokenizer, model_path):
    """Fill input_ids of ``text`` records with the model's tokenizer (loaded only if needed)."""
    texts = [r for r in records if r["input_ids"] is None]
    if not texts:
        return records
    tok = load_tokenizer(model_path)
    for r in texts:
        ids = list(tok(r["text"])["input_ids"])
        if not ids:
            raise InputError("%s: text tokenizes to no tokens" % r["where"])
        if r["loss_mask"] is not None and len(r["loss_mask"]) != len(ids):
            raise InputError("%s: loss_mask has %d entries but the text is %d tokens"
                             % (r["where"], len(r["loss_mask"]), len(ids)))
        r["input_ids"] = ids
    return records


def truncate(records, max_model_len):
    """Cut input_ids and loss_mask to ``max_model_len - 1`` tokens (room for vLLM's one decode
    token, as the generator does); returns how many samples were cut."""
    limit = max_model_len - 1
    cut = 0
    for r in records:
        if len(r["input_ids"]) > limit:
            cut += 1
            r["input_ids"] = r["input_ids"][:limit]
            if r["loss_mask"] is not None:
                r["loss_mask"] = r["loss_mask"][:limit]
    return cut


# ------------------------------------------------------------------ output files
def sample_path(output_dir, index):
    return os.path.join(output_dir, "data_%d.pt" % index)


def sample_index(name):
    """The index ``name`` is the sample file of (data_<N>.pt exactly: layout.py, shipped beside
    run_identity.py, is the one rule), else None."""
    return _run_identity_module()._layout().index_of(name)


def output_dirs(value):
    """The output directories ``value`` names: a list, or --output-dir's text ("A:B" names two;
    run_identity.split_dirs is the one rule)."""
    return _run_identity_module().split_dirs(value)


def sample_dir(dirs, index, shard=None):
    """The directory of ``dirs`` where sample ``index`` is written (run_identity.dir_index: the
    samples of this run's share alternate over the directories in order)."""
    return dirs[_run_identity_module().dir_index(index, len(dirs), shard[1] if shard else 1)]


def present_samples(dirs, broken=None):
    """{index: directory} of the whole data_<N>.pt files in any of ``dirs`` (one listing each; a
    file counts wherever it is, first directory first when two hold one index). A file that is not
    whole (layout.whole: its zip end record missing or misplaced, i.e. cut short) does not count: it
    is written again; ``broken``, when given, gets (path, what is wrong) of each."""
    rule = _run_identity_module()._layout()
    found = {}
    for d in dirs:
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        for name in names:
            i = sample_index(name)
            if i is not None and i not in found:
                problem = rule.whole(os.path.join(d, name))
                if problem is None:
                    found[i] = d
                elif broken is not None:
                    broken.append((os.path.join(d, name), problem))
    return found


def parse_shard(text):
    """"K/N" -> (K, N); None -> None (every sample)."""
    if text is None:
        return None
    parts = str(text).split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts) \
            or not 0 <= int(parts[0]) < int(parts[1]):
        raise InputError("--shard %r: write K/N with 0 <= K < N (e.g. 0/3)" % (text,))
    return int(parts[0]), int(parts[1])


def shard_indexes(count, shard=None):
    """The sample indexes of shard K of N: i % N == K (round robin, so every shard gets a mix of
    short and long samples); all of range(count) without a shard. remote-ops' agent/shards.py
    states the same rule."""
    return range(count) if shard is None else range(shard[0], count, shard[1])


def pending_indexes(output_dir, count, shard=None):
    """Samples (of the shard) whose data_<N>.pt is in none of the output directories (``output_dir``:
    --output-dir's text or a list; a file is there only once complete)."""
    present = present_samples(output_dirs(output_dir))
    return [i for i in shard_indexes(count, shard) if i not in present]


def remove_stale_temporaries(output_dir):
    removed = 0
    for d in output_dirs(output_dir):
        for name in os.listdir(d):
            if TEMP_RE.match(name):
                try:
                    os.unlink(os.path.join(d, name))
                    removed += 1
                except OSError:
                    pass
    return removed


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_atomic(torch, obj, path):
    """torch.save to a temporary beside ``path``, fsync, rename: the file is whole or absent.
    torch.save gets the temporary's name, not an open file: it then writes from C++ without calling
    back into Python for every record (a Python file object costs a GIL round trip per write, which
    the writer threads and the main thread's copies contend for: benchmarks/controller/writer_throughput.py)."""
    d, name = os.path.split(path)
    tmp = os.path.join(d, ".%s.%d.tmp" % (name, os.getpid()))
    try:
        torch.save(obj, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        full = _disk_full(exc, d, obj)     # read while the temporary still holds its part
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if full:
            raise DiskFullError(errno.ENOSPC, "no space left on the device of %s: %s needs %s, %s were free "
                                "when its write failed (free space there and run extract again: it resumes "
                                "with exactly the missing files)" % (d, name, _mb(full[0]), _mb(full[1]))) from exc
        raise


def _mb(n):
    return "%.1f MB" % (n / 1e6)


def tensor_bytes(obj):
    """Bytes of tensor data in ``obj`` (tensors, and dicts/lists/tuples of them): a sample's size."""
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _disk_full(exc, directory, obj):
    """(bytes the object needs, bytes free) when ``exc`` is the write running out of room: ENOSPC/EDQUOT
    itself, or any error while the filesystem has less room left than the object's tensor data
    (torch.save turns ENOSPC into a RuntimeError). None otherwise, or when it cannot be told."""
    if not isinstance(exc, Exception):
        return None
    need = tensor_bytes(obj)
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize   # root may use the reserve
    if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or free < need:
        return need, free
    return None


_RUN_IDENTITY = []


def _run_identity_module():
    """run_identity.py, shipped beside this script (remote-ops' agent/outputs/run_identity.py: one definition
    of a run's identity and of the output directories' rules for remote-ops and this script), loaded by
    path, once."""
    if _RUN_IDENTITY:
        return _RUN_IDENTITY[0]
    import importlib.util
    here = os.path.dirname(os.path.realpath(__file__))
    path = os.path.join(here, "run_identity.py")
    if not os.path.isfile(path):
        # run from remote-ops' own copy (remote_ops/playbook/shipped/scripts/): the module where it is defined
        path = os.path.join(here, os.pardir, os.pardir, os.pardir, "agent", "outputs", "run_identity.py")
    if not os.path.isfile(path):
        raise InputError("run_identity.py is not beside %s: copy it from remote-ops (remote_ops/agent/"
                         "outputs/run_identity.py; the playbook's extract.files ships both)" % os.path.join(here, PROG + ".py"))
    spec = importlib.util.spec_from_file_location("run_identity", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _RUN_IDENTITY.append(module)
    return module


def check_run_identity(args, out, dataset=None):
    """Hold --output-dir to one run, before the tokenizer, torch or the engine are loaded: the run's
    identity (run_identity.py: dataset lines, model config, layer ids, max_model_len, shard, package
    versions, the playbook remote-ops gave, the list of several output directories) is compared with
    each directory's run.json; samples of another run in any of them stop this one with one line
    (InputError, exit 2) naming the directory and what differs, unless --overwrite moves them aside.
    Returns (identity, the directories whose run.json ``record_run_identity`` writes)."""
    ri = _run_identity_module()
    dirs = output_dirs(args.output_dir)
    if not dirs:
        raise InputError("--output-dir %r names no directory" % (args.output_dir,))
    twice = ri.same_dirs(dirs)
    if twice:
        raise InputError("--output-dir names one directory twice: %s and %s are the same directory (give each "
                         "disk's directory once)" % twice)
    try:
        ident = ri.identity(ri.command_inputs(getattr(args, "argv", [])), cwd=os.getcwd(), flow="generator",
                            playbook=ri.playbook_from_env(), versions=ri.versions(), dataset=dataset)
    except ri.IdentityError as exc:
        raise InputError(str(exc)) from None
    res = ri.check_dirs(dirs, ident)
    aside = [d for d in dirs if getattr(args, "overwrite", False) and os.path.isdir(d)
             and (ri.sample_files(d) or os.path.exists(os.path.join(d, ri.FILE)))]
    for d in aside:
        moved = ri.move_aside(d)
        print("--overwrite: moved %d file(s) of the earlier run into %s" % (moved["files"], moved["moved_to"]),
              file=out, flush=True)
    if aside:
        return ident, list(dirs)
    if res["problem"]:
        raise InputError(ri.refusal(res["problem"], by_hand=True))
    if res.get("grown"):
        print("the run grows: %s; its run.json is rewritten" % "; ".join(res["grown"]["notes"]), file=out, flush=True)
    return ident, res["write"]


def record_run_identity(ident, dirs):
    """run.json for a new run (``check_run_identity``'s identity) in ``dirs``, before the first sample."""
    for d in dirs:
        _run_identity_module().write(d, ident)


def write_json_atomic(path, obj):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# ------------------------------------------------------------------ captured states' hand-off
def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:     # another user's process: alive
        return True
    return True


def open_handoff(setting, out):
    """Make this run's hand-off directory and name it to the engine's workers ($REMOTE_OPS_HS_SHM_DIR,
    inherited when vLLM starts them): a fresh subdirectory of ``setting`` ('auto': /dev/shm when it is
    a writable directory, else none). Directories left by runs whose process is gone (a SIGKILL) are
    removed first. None, and the variable unset, for 'off'. The path, or None."""
    os.environ.pop(HANDOFF_ENV, None)
    if setting in ("", "off", "none"):
        return None
    base = "/dev/shm" if setting == "auto" else setting
    if not (os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK)):
        if setting == "auto":
            print("note: /dev/shm is not a writable directory: captured states go over vLLM's RPC (slower)",
                  file=out, flush=True)
            return None
        raise InputError("--handoff-dir %s is not a writable directory (give a tmpfs directory, or 'off')" % base)
    for name in os.listdir(base):
        m = HANDOFF_RE.match(name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    path = tempfile.mkdtemp(prefix="%s%d-" % (HANDOFF_PREFIX, os.getpid()), dir=base)
    os.environ[HANDOFF_ENV] = path
    return path


def set_copy_threads(torch, setting):
    """torch's thread count in this process, set after the engine started: vLLM's executor sets it to
    1 (set_multiprocessing_worker_envs, unless OMP_NUM_THREADS is set), and generate() may copy a
    batch's rows (clone, when its hand-off slots are all held) in this process. None: half the CPUs, at most 8. The count set."""
    n = setting if setting else max(1, min(8, (os.cpu_count() or 2) // 2))
    torch.set_num_threads(n)
    return n


def close_handoff(path):
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        if os.environ.get(HANDOFF_ENV) == path:
            del os.environ[HANDOFF_ENV]


# ------------------------------------------------------------------ batches
def engine_budget(generator, max_model_len):
    """(tokens, samples) one scheduler step of the generator's engine takes: its scheduler's
    max_num_scheduled_tokens (else max_num_batched_tokens) and max_num_running_reqs, else its
    vllm_config's, else speculators 0.3.0's constants (max(8192, max_model_len), 32)."""
    sched = getattr(generator, "scheduler", None)
    cfg = getattr(getattr(generator, "vllm_config", None), "scheduler_config", None)
    tokens = (getattr(sched, "max_num_scheduled_tokens", None) or getattr(cfg, "max_num_scheduled_tokens", None)
              or getattr(cfg, "max_num_batched_tokens", None))
    seqs = getattr(sched, "max_num_running_reqs", None) or getattr(cfg, "max_num_seqs", None)
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0   # noqa: E731
    return (tokens if ok(tokens) else max(DEFAULT_MIN_BATCH_TOKENS, max_model_len),
            seqs if ok(seqs) else DEFAULT_MAX_NUM_SEQS)


def pack_steps(todo, lengths, max_tokens, max_samples, window=0):
    """Engine steps: lists of samples of ``todo``, each of at most ``max_samples`` samples and, unless
    ``max_tokens`` is 0, at most ``max_tokens`` tokens (a longer sample goes alone). ``window`` 0:
    consecutive runs, in order. Otherwise a step takes the oldest pending sample, then, while room is
    left, the longest that fits among the next ``window`` pending ones: fuller steps (fewer of them),
    and a sample is taken at most ``window`` steps after its turn. Every sample of ``todo`` comes once."""
    if not window or not max_tokens:
        step, tokens = [], 0
        for i in todo:
            n = lengths[i]
            if step and (len(step) >= max_samples or (max_tokens and tokens + n > max_tokens)):
                yield step
                step, tokens = [], 0
            step.append(i)
            tokens += n
        if step:
            yield step
        return
    rest, ahead = iter(todo), []

    def refill():
        while len(ahead) < window:
            i = next(rest, None)
            if i is None:
                return
            ahead.append(i)
    refill()
    while ahead:
        step = [ahead.pop(0)]
        tokens = lengths[step[0]]
        refill()
        while len(step) < max_samples and ahead:
            room, best = max_tokens - tokens, None
            for j, i in enumerate(ahead):
                if lengths[i] <= room and (best is None or lengths[i] > lengths[ahead[best]]):
                    best = j
            if best is None:
                break
            i = ahead.pop(best)
            step.append(i)
            tokens += lengths[i]
            refill()
        yield step


def pack_batches(todo, lengths, max_tokens, max_samples, steps=1, window=0):
    """generate() calls: ``steps`` consecutive engine steps of ``pack_steps`` each, their samples in
    step order. The generator's scheduler (chunked prefill off) takes waiting prompts in that order
    and stops a step at the first that does not fit, so the steps it runs are these or fuller; the
    rows come back in the call's order either way."""
    call, n = [], 0
    for step in pack_steps(todo, lengths, max_tokens, max_samples, window):
        call.extend(step)
        n += 1
        if n >= steps:
            yield call
            call, n = [], 0
    if call:
        yield call


# ------------------------------------------------------------------ writing behind the GPU
class SaveTimes:
    """The writer's save durations in bounded memory, however many files a run writes: their count and
    sum, and a histogram of buckets RATIO wide (a quantile is its bucket's geometric middle: within 1 %
    of the exact one)."""

    RATIO = 1.02

    def __init__(self):
        self.count, self.total, self._buckets = 0, 0.0, {}

    def add(self, seconds):
        self.count += 1
        self.total += seconds
        k = math.floor(math.log(max(seconds, 1e-9), self.RATIO))
        self._buckets[k] = self._buckets.get(k, 0) + 1

    def quantile(self, f):
        """The duration below which a share ``f`` of the saves fall (the ``int(f * count)``-th, 0-based)."""
        want, seen = min(self.count - 1, int(f * self.count)), 0
        for k in sorted(self._buckets):
            seen += self._buckets[k]
            if seen > want:
                return self.RATIO ** (k + 0.5)
        return None


class Writer:
    """Writes samples (save_atomic) in ``threads`` threads, behind a queue bounded by ``max_bytes`` of
    tensor data (one sample larger than that still goes, alone). ``max_bytes`` 0: put() writes at
    once in the calling thread. Samples are taken in queue order; with several threads one file's
    fsync overlaps the next file's serialisation, so files may be completed out of order (each is
    still whole or absent, and resume redoes exactly the absent ones). ``on_written(index)`` is
    called after each file is in place, one call at a time. The first write error stops every
    thread: no sample is taken after it (one already being written by another thread may finish),
    and put()/close() raise it."""

    def __init__(self, torch, output_dir, max_bytes, on_written, threads=1, shard=None):
        """``output_dir``: one directory, or several (a list or "A:B"): each sample goes to its own
        (``sample_dir``), so consecutive samples, and the threads writing them, go to different disks."""
        self.torch, self.max_bytes, self.on_written = torch, max_bytes, on_written
        self.dirs, self.shard = output_dirs(output_dir), shard
        self.error = None
        self._items, self._bytes, self._busy, self._closed = [], 0, 0, False
        # the profile (profile()): seconds put() waited for room, and each file's save in its thread
        self.put_wait_s, self.save_s, self.saved_bytes = 0.0, SaveTimes(), 0
        self._cond = threading.Condition()
        self._threads = []
        if max_bytes > 0:
            for k in range(max(1, threads)):
                t = threading.Thread(target=self._loop, name="extract-writer-%d" % k, daemon=True)
                t.start()
                self._threads.append(t)

    def _raise(self):
        raise self.error

    def put(self, index, sample):
        if not self._threads:
            t = time.perf_counter()
            self._write(index, sample)
            self.save_s.add(time.perf_counter() - t)
            self.saved_bytes += tensor_bytes(sample)
            self.on_written(index)
            return
        n = tensor_bytes(sample)
        with self._cond:
            if self.error is None and (self._items or self._busy) and self._bytes + n > self.max_bytes:
                t = time.perf_counter()
                while self.error is None and (self._items or self._busy) and self._bytes + n > self.max_bytes:
                    self._cond.wait()
                self.put_wait_s += time.perf_counter() - t
            if self.error is not None:
                self._raise()
            self._items.append((index, sample, n))
            self._bytes += n
            self._cond.notify_all()

    def _write(self, index, sample):
        save_atomic(self.torch, sample, sample_path(sample_dir(self.dirs, index, self.shard), index))

    def _fsync_dirs(self):
        for d in self.dirs:
            _fsync_dir(d)

    def _loop(self):
        while True:
            with self._cond:
                while not self._items and not self._closed and self.error is None:
                    self._cond.wait()
                if self.error is not None or not self._items:
                    return
                index, sample, n = self._items.pop(0)
                self._busy += 1
            try:
                t = time.perf_counter()
                self._write(index, sample)
                took = time.perf_counter() - t
                # let go of the sample at once: its tensors may view the engine's hand-off slot, which the
                # generator reuses only when nothing views it any more
                sample = None
            except BaseException as exc:   # kept for the main thread: put()/close() raise it
                with self._cond:
                    if self.error is None:
                        self.error = exc
                    self._items.clear()
                    self._busy -= 1
                    self._bytes = 0
                    self._cond.notify_all()
                return
            with self._cond:
                self.on_written(index)     # the file is in place, whatever another thread met
                self.save_s.add(took)
                self.saved_bytes += n
                self._busy -= 1
                self._bytes -= n
                self._cond.notify_all()
                idle = not self._items and not self._busy
            if idle:   # the renames of what was queued are durable before the threads wait again
                self._fsync_dirs()

    def batch_done(self):
        if not self._threads:
            self._fsync_dirs()

    def pending(self):
        with self._cond:
            return len(self._items) + self._busy

    def profile(self):
        """What the writing side did: files saved by the threads, their bytes, the seconds of saves
        summed over threads, the median and 90th percentile of one save, and the seconds put() waited
        for room in the queue (the main thread held back by the writers)."""
        with self._cond:
            s = self.save_s
            q = lambda f: round(s.quantile(f) * 1e3, 2) if s.count else None   # noqa: E731
            return {"threads": len(self._threads), "files": s.count, "bytes": self.saved_bytes,
                    "save_s": round(s.total, 3), "save_ms_median": q(0.5), "save_ms_p90": q(0.9),
                    "put_wait_s": round(self.put_wait_s, 3)}

    def close(self):
        """Write everything queued, stop the threads, raise their error if one had one."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()
        self._fsync_dirs()
        if self.error is not None:
            self._raise()


class Progress:
    """Counts written samples and tokens; prints ``extract-progress {json}`` lines. The writer thread
    only counts (``written``); the main thread prints (``poll``, ``emit``), so a progress line never
    lands inside another line of the log (two threads printing to one stream interleave their writes)."""

    def __init__(self, out, lengths, done_indexes, every, bar=None, clock=time.time, indexes=None):
        """``indexes``: the samples this run is for (its shard), default all of ``lengths``."""
        self.out, self.lengths, self.every, self.bar, self.clock = out, lengths, every, bar, clock
        indexes = range(len(lengths)) if indexes is None else indexes
        self.samples_total, self.tokens_total = len(indexes), sum(lengths[i] for i in indexes)
        self.samples_done = len(done_indexes)
        self.tokens_done = sum(lengths[i] for i in done_indexes)
        self.tokens_run = 0
        self.t0 = self.last = None
        self._bar_pending = 0
        self._lock = threading.Lock()

    def start(self):
        self.t0 = self.clock()
        self.emit()

    def written(self, index):
        """A sample's file is complete (the writer thread): counted, printed by the next ``poll``."""
        with self._lock:
            self.samples_done += 1
            self.tokens_done += self.lengths[index]
            self.tokens_run += self.lengths[index]
            self._bar_pending += 1

    def poll(self):
        """The main thread: the bar moved by what was written since, a progress line when one is due."""
        with self._lock:
            n, self._bar_pending = self._bar_pending, 0
        if n and self.bar is not None:
            self.bar.update(n)
        if self.last is None or self.clock() - self.last >= self.every:
            self.emit()

    def record(self):
        now = self.clock()
        secs = now - self.t0 if self.t0 is not None else 0.0
        rate = self.tokens_run / secs if secs > 0 and self.tokens_run else None
        left = self.tokens_total - self.tokens_done
        return {"samples_done": self.samples_done, "samples_total": self.samples_total,
                "tokens_done": self.tokens_done, "tokens_total": self.tokens_total,
                "tokens_per_s": round(rate, 1) if rate else None,
                "eta_s": round(left / rate, 1) if rate else (0.0 if not left else None),
                "elapsed_s": round(secs, 3), "t": round(now, 3)}

    def emit(self):
        self.last = self.clock()
        with self._lock:
            line = PROGRESS_PREFIX + json.dumps(self.record(), separators=(",", ":")) + "\n"
        self.out.write(line)
        self.out.flush()


def _version(dist):
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:   # not installed: recorded as unknown, like any missing fact
        return None


def _gpu_info(torch):
    """speculators' _get_gpu_info: GPU model and count, or "CPU only"."""
    if not torch.cuda.is_available():
        return "CPU only"
    count = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    return name if count == 1 else "%dx %s" % (count, name)


def data_config(torch, args, layer_ids, hidden_size, tensor_parallel_size, num_samples, gpu=None, shard=None):
    """The document DataGenerationConfig.to_dict() of speculators 0.3.0 writes, field for field;
    a sharded run adds ``shard`` (index K, count N, its samples; num_samples stays the dataset's)."""
    from datetime import datetime, timezone
    versions = {"torch": torch.__version__, "vllm": _version("vllm"),
                "transformers": _version("transformers"), "speculators": _version("speculators")}
    layers = len(layer_ids)
    doc = {
        "version": CONFIG_VERSION,
        "generated_at": datetime.now(timezone.utc).isoformat(),
        "speculators_version": versions["speculators"],
        "reproducibility": {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                            "package_versions": versions,
                            "gpu": gpu if gpu is not None else _gpu_info(torch)},
        "model": {"target_model_path": args.target_model_path,
                  "tensor_parallel_size": tensor_parallel_size,
                  "gpu_memory_utilization": args.gpu_memory_utilization,
                  "hidden_size": hidden_size},
        "data": {"train_data_path": args.dataset, "seq_length": args.max_model_len,
                 "max_samples": args.max_samples, "num_samples": num_samples, "seed": 0,
                 "chat_template_note": "Uses tokenizer's built-in chat template"},
        "hidden_states": {"layer_ids": list(layer_ids),
                          "description": "Layers selected for EAGLE3 fusion and target logits"},
        "generation": {"cache_dir": ""},
        "format": {
            "file_pattern": "data_{idx}.pt",
            "data_format_version": 1,
            "schema": {
                "input_ids": {"dtype": "torch.long", "shape": "[seq_len]",
                              "description": "Tokenized input sequence"},
                "hidden_states": {"dtype": "list[torch.bfloat16]",
                                  "shape": "list of [seq_len, %d]" % hidden_size,
                                  "num_tensors": layers,
                                  "description": "Hidden states from %d layers" % layers},
                "loss_mask": {"dtype": "torch.long", "shape": "[seq_len]",
                              "description": "1 for assistant tokens to train on, 0 elsewhere"},
            },
        },
    }
    if shard is not None:
        doc["shard"] = {"index": shard[0], "count": shard[1], "assignment": "i % count == index",
                        "samples": len(shard_indexes(num_samples, shard))}
    return doc


# ------------------------------------------------------------------ results
def build_sample(torch, index, record, result, n_layers):
    """The dict saved as data_<index>.pt, after checking that ``result`` is this sample's."""
    name = "data_%d.pt (%s)" % (index, record["where"])
    ids = torch.as_tensor(record["input_ids"], dtype=torch.long)
    got = result.get("input_ids") if isinstance(result, dict) else None
    if got is None or not torch.is_tensor(got) or got.dim() != 1 or not torch.equal(got.to(torch.long).cpu(), ids):
        raise ResultError("%s: the generator returned other input_ids than this sample's %d tokens "
                          "(results out of order or cut): nothing written" % (name, len(ids)))
    hs = result.get("hidden_states")
    if not isinstance(hs, (list, tuple)) or len(hs) != n_layers:
        raise ResultError("%s: expected hidden states of %d layers, got %s" % (
            name, n_layers, len(hs) if isinstance(hs, (list, tuple)) else type(hs).__name__))
    width = None
    for i, h in enumerate(hs):
        if not torch.is_tensor(h) or h.dim() != 2:
            raise ResultError("%s: hidden_states[%d] is not a 2-D tensor" % (name, i))
        if h.shape[0] != len(ids):
            raise ResultError("%s: hidden_states[%d] has %d rows for %d tokens (another sample's rows: "
                              "is vLLM chunked prefill or prefix caching on?): nothing written"
                              % (name, i, h.shape[0], len(ids)))
        if width is not None and h.shape[1] != width:
            raise ResultError("%s: hidden_states[%d] is %d wide, hidden_states[0] %d" % (name, i, h.shape[1], width))
        width = h.shape[1]
    mask = record["loss_mask"]
    loss_mask = (torch.as_tensor(mask, dtype=torch.long) if mask is not None
                 else torch.ones(len(ids), dtype=torch.long))
    return {"input_ids": ids, "hidden_states": [h.contiguous() for h in hs], "loss_mask": loss_mask}


def emit_profile(out, progress, timing, writer, generator, gil_switch_ms):
    """One ``extract-profile {json}`` line at the end of a run: where the main thread's time went
    (generate(), checking the results, handing samples to the writer, of which waiting for room in its
    queue, and the drain at the end), the writing side (Writer.profile) and the hand-off slots the
    generator mapped (slots, files: new slots and regrown ones, batches that found every slot held)."""
    secs = progress.clock() - progress.t0 if progress.t0 is not None else None
    slots = getattr(generator, "_remote_ops_slots", None)
    doc = {"seconds": round(secs, 3) if secs is not None else None, "tokens": progress.tokens_run,
           **{k: round(v, 3) if isinstance(v, float) else v for k, v in timing.items()},
           "writer": writer.profile(), "gil_switch_ms": gil_switch_ms,
           "slots": {"slots": len(slots), "files": getattr(generator, "_remote_ops_slot_files", None),
                     "all_held": getattr(generator, "_remote_ops_slots_full", 0)}
           if isinstance(slots, dict) else None}
    out.write(PROFILE_PREFIX + json.dumps(doc, separators=(",", ":")) + "\n")
    out.flush()


# ------------------------------------------------------------------ the run
def _load_generator(model_path, layer_ids, max_model_len, gpu_memory_utilization, tensor_parallel_size):
    import importlib
    module = importlib.import_module(GENERATOR_MODULE)
    return module.VllmHiddenStatesGenerator(
        model_path=model_path, layer_ids=layer_ids, max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size)


def _load_tokenizer(model_path):
    """For "text" lines. Trusts the checkpoint's code as the generator does for its config, engine and
    tokenizer (Kimi-K2.5's tokenizer is custom code: tokenization_kimi.py)."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(model_path, trust_remote_code=True)


def _hidden_size(model_path):
    """speculators' _get_hidden_size_from_model: hidden_size, else text_config.hidden_size."""
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
    size = getattr(config, "hidden_size", None) or getattr(getattr(config, "text_config", None), "hidden_size", None)
    if not size:
        raise InputError("cannot find hidden_size in the config of %s" % model_path)
    return int(size)


def _mininterval():
    try:
        return float(os.environ.get("TQDM_MININTERVAL", "0.1"))
    except ValueError:
        return 0.1


def run(args, *, make_generator=_load_generator, load_tokenizer=_load_tokenizer,
        hidden_size_of=_hidden_size, out=None):
    """Extract with ``args`` (parse_args). The three loaders are parameters so that the data path
    can be exercised with a stand-in generator; by default they are speculators' and transformers'.
    Phases: the dataset read and checked, what is left to write (resume), the engine, the batches."""
    out = out or sys.stdout
    records, ident, new_in = _read_dataset(args, out, load_tokenizer)

    import torch
    from tqdm import tqdm

    plan = _resume_plan(args, records, ident, new_in, out)
    if plan is None:
        return 0
    hidden = hidden_size_of(args.target_model_path)      # before the engine starts: a bad model fails fast
    t0 = time.time()
    handoff = open_handoff(getattr(args, "handoff_dir", "off"), out)
    try:
        generator = make_generator(args.target_model_path, args.layer_ids, args.max_model_len,
                                   args.gpu_memory_utilization, args.tensor_parallel_size)
    except BaseException:
        close_handoff(handoff)
        raise
    held = {"bar": None, "writer": None, "switch": None}   # switch: Python's switch interval, put back at the end
    written = [0]
    try:
        _generate(torch, tqdm, args, out, records, plan, generator, hidden, handoff, t0, held, written)
    except BaseException as exc:
        _write_queued(held["writer"], exc)
        raise
    finally:
        _shut_down(held, generator, handoff, records)
    print("wrote %d sample(s) to %s in %.1fs (%d of %d present)"
          % (written[0], plan["where"], time.time() - t0, plan["done"] + written[0], plan["share"]),
          file=out, flush=True)
    return 0


def _read_dataset(args, out, load_tokenizer):
    """The dataset read once (checked, hashed), the run identity checked before the tokenizer, torch
    and the engine, then tokenized and cut to max_model_len - 1: (records, identity, its new dirs)."""
    records = Dataset(args.dataset, args.max_samples)   # one pass: checked, hashed; tokens read per batch
    ident, new_in = check_run_identity(args, out, dataset=records.facts)   # before the tokenizer, torch, the engine
    if args.max_samples is not None and len(records) < args.max_samples:
        print("note: %s has %d samples, fewer than --max-samples %d" % (args.dataset, len(records), args.max_samples),
              file=out, flush=True)
    records.tokenize(load_tokenizer, args.target_model_path)
    cut = records.truncate(args.max_model_len)
    if cut:
        print("note: %d sample(s) cut to %d tokens (max_model_len %d - 1)"
              % (cut, args.max_model_len - 1, args.max_model_len), file=out, flush=True)
    return records, ident, new_in


def _resume_plan(args, records, ident, new_in, out):
    """The output directories made and the run identity recorded; what this share has left to write
    (whole files kept, temporaries of an earlier run removed): {dirs, where, shard, todo, share, done,
    config_paths}, or None when nothing is left."""
    dirs = output_dirs(args.output_dir)
    where = ", ".join(dirs)
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    record_run_identity(ident, new_in)
    stale = remove_stale_temporaries(dirs)
    if stale:
        print("removed %d unfinished temporary file(s) of an earlier run" % stale, file=out, flush=True)
    shard = getattr(args, "shard", None)
    broken = []
    present = present_samples(dirs, broken)
    if broken:
        print("%d sample file(s) are not whole and will be written again, e.g. %s: %s"
              % (len(broken), broken[0][0], broken[0][1]), file=out, flush=True)
    todo = [i for i in shard_indexes(len(records), shard) if i not in present]
    records.keep(todo)
    share = len(shard_indexes(len(records), shard))
    if shard is not None:
        print("shard %d/%d: %d of %d samples (i %% %d == %d)" % (shard[0], shard[1], share, len(records),
                                                                shard[1], shard[0]), file=out, flush=True)
    if len(dirs) > 1:
        print("%d output directories: sample N goes to the ((N // %d) %% %d)-th of %s"
              % (len(dirs), shard[1] if shard else 1, len(dirs), where), file=out, flush=True)
    config_paths = [os.path.join(d, "data_config.json") for d in dirs]
    done = share - len(todo)
    if done:
        # a file in another of the directories than the rule gives (moved by hand) is whole: it counts
        # where it is and is not written again; the line says how many
        mine = set(shard_indexes(len(records), shard))
        astray = sum(1 for i, d in present.items() if i in mine and d != sample_dir(dirs, i, shard)) \
            if len(dirs) > 1 else 0
        print("resuming: %d of %d samples already written, %d to go%s"
              % (done, share, len(todo), "; %d of them in another of the output directories than sample N's "
                 "rule gives (they count where they are)" % astray if astray else ""), file=out, flush=True)
    if not todo and all(os.path.exists(p) for p in config_paths):
        print("all %d samples are already in %s: nothing to do" % (share, where),
              file=out, flush=True)
        return None
    return {"dirs": dirs, "where": where, "shard": shard, "todo": todo, "share": share, "done": done,
            "config_paths": config_paths}


def _engine_settings(torch, args, generator, hidden, n_dirs, t0, out):
    """The batching the engine's budget allows (or the arguments ask), the copy and writer threads,
    said in one line: {layer_ids, max_tokens, max_samples, steps, window, writer_threads}."""
    layer_ids = list(getattr(generator, "layer_ids"))
    budget_tokens, budget_seqs = engine_budget(generator, args.max_model_len)
    max_tokens = budget_tokens if args.batch_tokens is None else args.batch_tokens
    max_samples = budget_seqs if args.batch_size is None else args.batch_size
    # --batch-tokens 0 is the old loop: calls of --batch-size samples, in order
    steps = 1 if not max_tokens else (getattr(args, "batch_steps", None)
                                      or auto_batch_steps(max_tokens, len(layer_ids), hidden))
    window = getattr(args, "pack_window", 0) if max_tokens else 0
    threads = set_copy_threads(torch, getattr(args, "copy_threads", None))
    # at least one writer thread per output directory, so that every disk has a write in flight
    writer_threads = max(getattr(args, "writer_threads", 1), n_dirs)
    print("generator ready in %.1fs: %s, layers %s, hidden size %d, tensor parallel %d; %d step(s) per "
          "generate() call, each of up to %s tokens and %d samples%s (engine step: %d tokens, %d samples%s); "
          "%d copy thread(s), %d writer thread(s)"
          % (time.time() - t0, args.target_model_path, layer_ids, hidden, args.tensor_parallel_size, steps,
             max_tokens or "any", max_samples, ", filled from the next %d pending" % window if window else "",
             budget_tokens, budget_seqs,
             "; auto: %d steps a call keep a call's captured states within %d MiB a GPU"
             % (steps, CAPTURE_BUDGET_BYTES >> 20)
             if max_tokens and not getattr(args, "batch_steps", None) and steps < DEFAULT_BATCH_STEPS else "",
             threads, writer_threads if args.write_queue_mb else 0),
          file=out, flush=True)
    return {"layer_ids": layer_ids, "max_tokens": max_tokens, "max_samples": max_samples, "steps": steps,
            "window": window, "writer_threads": writer_threads}


def _generate(torch, tqdm, args, out, records, plan, generator, hidden, handoff, t0, held, written):
    """data_config.json in each directory, then every batch generated, checked, built and handed to the
    writer (``held``: the bar, the writer and the switch interval, for the caller's ending)."""
    dirs, shard, todo = plan["dirs"], plan["shard"], plan["todo"]
    timing = {"batches": 0, "generate_s": 0.0, "build_s": 0.0, "hand_over_s": 0.0, "drain_s": 0.0}
    eng = _engine_settings(torch, args, generator, hidden, len(dirs), t0, out)
    config = data_config(torch, args, eng["layer_ids"], hidden,
                         getattr(generator, "tensor_parallel_size", args.tensor_parallel_size), len(records),
                         shard=shard)
    for path in plan["config_paths"]:       # each directory describes the samples it holds part of
        write_json_atomic(path, config)
    held["bar"] = bar = tqdm(total=plan["share"], initial=plan["done"], desc="Generating hidden states",
                             unit="sample", mininterval=_mininterval(), file=sys.stderr)
    pending = set(todo)
    mine = shard_indexes(len(records), shard)
    progress = Progress(out, records.lengths, [i for i in mine if i not in pending], args.progress_seconds, bar,
                        indexes=mine)

    def on_written(index):
        written[0] += 1
        progress.written(index)
    held["writer"] = writer = Writer(torch, dirs, int(args.write_queue_mb * (1 << 20)), on_written,
                                     threads=eng["writer_threads"], shard=shard)
    gil_ms = getattr(args, "gil_switch_ms", 0) if writer._threads else None
    if gil_ms:
        held["switch"] = sys.getswitchinterval()
        sys.setswitchinterval(gil_ms / 1000.0)
    progress.start()
    said_handoff = False
    for batch in pack_batches(todo, records.lengths, eng["max_tokens"], eng["max_samples"], eng["steps"],
                              eng["window"]):
        samples = _build_batch(torch, records, batch, generator, len(eng["layer_ids"]), timing)
        if not said_handoff:
            said_handoff = True
            _say_handoff(generator, handoff, out)
        t = time.perf_counter()
        for i, sample in zip(batch, samples):
            writer.put(i, sample)
        samples = sample = None    # the writer holds them now (and frees their hand-off slot)
        writer.batch_done()
        timing["hand_over_s"] += time.perf_counter() - t
        timing["batches"] += 1
        progress.poll()
    t = time.perf_counter()
    writer.close()
    timing["drain_s"] = time.perf_counter() - t
    progress.poll()
    progress.emit()
    emit_profile(out, progress, timing, writer, generator, gil_ms)


def _build_batch(torch, records, batch, generator, n_layers, timing):
    """One generate() call for ``batch``, its results checked and built into samples."""
    t = time.perf_counter()
    recs = records.batch(batch)
    results = generator.generate([r["input_ids"] for r in recs])
    timing["generate_s"] += time.perf_counter() - t
    t = time.perf_counter()
    if not isinstance(results, list) or len(results) != len(batch):
        raise ResultError("generate() returned %s results for a batch of %d samples (data_%d.pt..)"
                          % (len(results) if isinstance(results, list) else type(results).__name__,
                             len(batch), batch[0]))
    samples = [build_sample(torch, i, rec, r, n_layers) for i, rec, r in zip(batch, recs, results)]
    timing["build_s"] += time.perf_counter() - t
    return samples


def _say_handoff(generator, handoff, out):
    """Whether the captured states came through shared memory (said once, after the first batch)."""
    shm = getattr(generator, "_remote_ops_shm_mapped", None)
    # a generator that has no worker to hand over from says so itself (the sandbox's stand-in)
    no_handoff = getattr(generator, "remote_ops_no_handoff", None)
    print("captured states came through shared memory (%s)" % ", ".join(
              [shm[0]] + [x for x in shm[1:] if isinstance(x, str)]) if shm else
          "captured states did not come through shared memory: %s" % (
              no_handoff if isinstance(no_handoff, str) else
              "the vLLM worker is not patched for it, or fell back (its warning says why)"
              if handoff else "no hand-off directory (--handoff-dir)"), file=out, flush=True)


def _write_queued(writer, exc):
    """A run that stops: the samples already checked and queued are written; a second failure is said."""
    if writer is not None and writer.error is None:
        try:    # the samples already checked and queued are written before the run stops
            writer.close()
        except BaseException as also:   # the error already on its way out stays the one raised
            print("warning: writing the queued samples failed too: %s: %s" % (type(also).__name__, also),
                  file=sys.stderr, flush=True)
    elif writer is not None and writer.error is not exc:   # said, never dropped
        print("warning: the writer had failed too: %s: %s" % (type(writer.error).__name__, writer.error),
              file=sys.stderr, flush=True)


def _shut_down(held, generator, handoff, records):
    """The switch interval put back, the bar closed, vLLM's workers stopped now, the hand-off and the
    dataset closed."""
    if held["switch"] is not None:
        sys.setswitchinterval(held["switch"])
    if held["bar"] is not None:
        held["bar"].close()
    shutdown = getattr(getattr(generator, "executor", None), "shutdown", None)
    if callable(shutdown):   # stop vLLM's workers now, not whenever the interpreter collects them
        try:
            shutdown()
        except Exception as exc:   # reported; an error already on its way out must not be hidden
            print("warning: engine shutdown failed: %s: %s" % (type(exc).__name__, exc), file=sys.stderr)
    close_handoff(handoff)
    records.close()


def main(argv=None, parser=None, loaders=None):
    """``loaders(args)`` may return run()'s loader keywords (used by the sandbox's stand-in)."""
    try:
        args = parse_args(argv, parser)
        return run(args, **(loaders(args) if loaders else {}))
    except InputError as exc:
        print("%s: error: %s" % (PROG, exc), file=sys.stderr, flush=True)
        return 2
    except (ResultError, DiskFullError) as exc:
        print("%s: error: %s" % (PROG, exc), file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
