"""The disk an extraction's outputs will take, from real sizes (stdlib only, runs on the host).

A ``data_<N>.pt`` of the shipped script (remote_ops/playbook/shipped/scripts/extract_hidden_states.py) holds, for a
sample of T tokens: ``hidden_states``, n_layers tensors [T, hidden] in the model's dtype; and
``input_ids`` and ``loss_mask``, two int64 tensors [T]; plus torch.save's zip and pickle framing
(measured with torch 2.13: 1.9-2.8 KiB per file for 1-4 layers; FILE_OVERHEAD is an upper bound).
So the need is ``tokens x (n_layers x hidden x dtype_bytes + 16) + files x FILE_OVERHEAD``, where
tokens are counted after the script's cut to ``max_model_len - 1``.

The caller (the extract preflight) brings hidden_size and n_layers (the number of CAPTURED layers,
``captured_layers(layer_ids, num_hidden_layers)``) from the checkpoint's config.json; ``preflight``
counts the tokens, measures the free bytes at the output directory and gives the verdict, a yes/no
with one line (``verdict`` alone takes the numbers). ``dataset_tokens`` counts the tokens of the samples still to write
from the JSONL itself, bounded in time: ``input_ids`` lines exactly, ``text`` lines estimated at
TEXT_BYTES_PER_TOKEN bytes of UTF-8 per token (no tokenizer here), and lines past the time budget
extrapolated from the mean so far; the result says which.

Several output directories (one per disk: run_identity.dir_index puts sample N in one of them): each
directory's share of the samples still to write is counted, and the directories on one filesystem
(one ``st_dev``) are summed against that filesystem's free space once (``several``).
"""

import json
import os
import time

TEXT_BYTES_PER_TOKEN = 4          # UTF-8 bytes per token of English text with a BPE tokenizer, roughly
INT64_PER_TOKEN = 16              # input_ids + loss_mask, int64 each
MARGIN = 1.05                     # refuse unless free >= need x MARGIN (filesystem reserve, logs)


def file_overhead(n_layers):
    """Upper bound of torch.save's framing per data_<N>.pt (zip records and pickle), in bytes."""
    return 1024 + 448 * (int(n_layers) + 2)


def need_bytes(hidden_size, n_layers, total_tokens, samples, dtype_bytes=2):
    """Bytes the files of ``samples`` samples with ``total_tokens`` tokens in all will take."""
    per_token = int(n_layers) * int(hidden_size) * int(dtype_bytes) + INT64_PER_TOKEN
    return int(total_tokens) * per_token + int(samples) * file_overhead(n_layers)


def verdict(hidden_size, n_layers, total_tokens, samples, free_bytes, *, dtype_bytes=2, where=None,
            estimated=False):
    """{need_bytes, free_bytes, fits, line}: ``line`` is the one-line refusal when it does not fit,
    else the note the preflight shows."""
    need = need_bytes(hidden_size, n_layers, total_tokens, samples, dtype_bytes)
    fits = free_bytes is None or free_bytes >= need * MARGIN
    what = "%d more samples (%s%d tokens x %d layers x %d hidden x %d bytes)" % (
        samples, "~" if estimated else "", total_tokens, n_layers, hidden_size, dtype_bytes)
    if free_bytes is None:
        line = "disk: %s need %s; free space unknown" % (what, _human(need))
    elif fits:
        line = "disk: %s need %s, %s free at %s" % (what, _human(need), _human(free_bytes), where or "the output")
    else:
        line = ("not enough disk at %s: %s need %s, %s free (free space there, or lower max_samples / "
                "max_model_len, or capture fewer layers)" % (where or "the output directory", what,
                                                              _human(need), _human(free_bytes)))
    return {"need_bytes": need, "free_bytes": free_bytes, "fits": fits, "line": line,
            "tokens": total_tokens, "samples": samples, "estimated": bool(estimated)}


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


def captured_layers(layer_ids, num_hidden_layers):
    """How many hidden-state tensors each file holds: the distinct layer ids given (the generator
    keeps them in a frozenset), else speculators 0.3.0's default [2, n//2, n-3, n-1] (which repeats
    for n <= 6). ``layer_ids``: a list of ints, a "2,4,5,7" string, or None/"" for the default."""
    if isinstance(layer_ids, str):
        layer_ids = [int(x) for x in layer_ids.replace(" ", ",").split(",") if x.strip()] or None
    if not layer_ids:
        n = int(num_hidden_layers)
        layer_ids = [2, n // 2, n - 3, n - 1]
    return len(set(layer_ids))


def _existing(path):
    """``path``, or its nearest existing parent (an output directory not made yet)."""
    probe = os.path.expanduser(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe


def _device(path):
    """The filesystem (``st_dev``) ``path`` is on, or would be made on."""
    return os.stat(_existing(path)).st_dev


def free_bytes(path):
    """Free bytes for an unprivileged writer on the filesystem of ``path`` (or of its nearest
    existing parent, for an output directory not made yet)."""
    st = os.statvfs(_existing(path))
    return st.f_bavail * st.f_frsize


def several(hidden_size, n_layers, counts, dirs, *, dtype_bytes=2):
    """The verdict for several output directories: ``counts`` (dataset_tokens with ``dirs``) gives
    each directory's pending samples and tokens; directories on one filesystem (``st_dev`` of the
    directory or its nearest existing parent) are summed and held to that filesystem's free bytes.
    {need_bytes, free_bytes (of the distinct filesystems), fits, line, filesystems: [verdict + dirs]}."""
    groups = {}
    for d, share in zip(dirs, counts["per_dir"]):
        dev = _device(d)
        g = groups.setdefault(dev, {"dirs": [], "samples": 0, "tokens": 0, "free": free_bytes(d)})
        g["dirs"].append(d)
        g["samples"] += share["pending_samples"]
        g["tokens"] += share["pending_tokens"]
    fs = []
    for g in groups.values():
        v = verdict(hidden_size, n_layers, g["tokens"], g["samples"], g["free"], dtype_bytes=dtype_bytes,
                    where=" + ".join(g["dirs"]) + (" (one filesystem)" if len(g["dirs"]) > 1 else ""),
                    estimated=not counts["exact"])
        v["dirs"] = g["dirs"]
        fs.append(v)
    fits = all(v["fits"] for v in fs)
    return {"need_bytes": sum(v["need_bytes"] for v in fs), "free_bytes": sum(v["free_bytes"] for v in fs),
            "fits": fits, "line": "; ".join(v["line"] for v in fs if fits or not v["fits"]),
            "tokens": counts["pending_tokens"], "samples": counts["pending_samples"],
            "estimated": not counts["exact"], "filesystems": fs}


def preflight(hidden_size, n_layers, dataset, output_dir, *, max_samples=None, max_model_len=None,
              dtype_bytes=2, time_budget=10.0, shard=None):
    """The whole disk check for one job: tokens still to write (dataset_tokens), free bytes at the
    output directory (a list: each directory's share on its filesystem, ``several``), and the
    verdict; ``counts`` says how exact the token count is."""
    counts = dataset_tokens(dataset, max_samples, max_model_len, output_dir, time_budget, shard=shard)
    if isinstance(output_dir, (list, tuple)) and len(output_dir) > 1:
        v = several(hidden_size, n_layers, counts, output_dir, dtype_bytes=dtype_bytes)
        v["counts"] = counts
        return v
    one = output_dir[0] if isinstance(output_dir, (list, tuple)) else output_dir
    v = verdict(hidden_size, n_layers, counts["pending_tokens"], counts["pending_samples"],
                free_bytes(one), dtype_bytes=dtype_bytes, where=one, estimated=not counts["exact"])
    v["counts"] = counts
    return v


def hidden_size(cfg):
    """speculators' _get_hidden_size_from_model rule: hidden_size, else text_config.hidden_size."""
    h = cfg.get("hidden_size")
    if h is None and isinstance(cfg.get("text_config"), dict):
        h = cfg["text_config"].get("hidden_size")
    return h if isinstance(h, int) and not isinstance(h, bool) and h > 0 else None


def for_job(need, output_dir):
    """The disk check of jobs.probe: ``need`` = {model, workdir, layer_ids, default_layer_ids, dataset,
    max_samples, max_model_len, shard: [k, n] | None}; ``output_dir``: one directory or the list; the checkpoint's config.json is read by the model preflight's own
    reader (agent/model.py). Returns preflight()'s verdict plus model facts, or {"unknown": why}.
    Hidden states are 2 bytes: speculators' generator runs vLLM with dtype "auto", which keeps bf16/fp16
    and downcasts float32 checkpoints (vllm/config/model.py _resolve_auto_dtype, 0.20.0)."""
    from ..check import checkpoint as model_mod
    from ..core.reads import Reads
    if not need.get("model") or not need.get("dataset"):
        return {"unknown": "no model or dataset given"}
    cfg_path, cfg, problem = model_mod.read_config(str(need["model"]), Reads(), need.get("workdir"))
    if cfg is None:
        return {"unknown": problem or "%s: no local config.json (an HF id not in the hub cache)" % need["model"]}
    hidden, n = hidden_size(cfg), model_mod.num_layers(cfg)
    if hidden is None or n is None:
        return {"unknown": "%s has no hidden_size / num_hidden_layers (nor text_config's)" % cfg_path}
    ids = need.get("layer_ids") or (model_mod.default_layer_ids(need["default_layer_ids"], n)
                                    if need.get("default_layer_ids") else None)
    layers = captured_layers(ids, n)
    dataset = os.path.expanduser(str(need["dataset"]))
    if need.get("workdir") and not os.path.isabs(dataset):
        dataset = os.path.join(os.path.expanduser(need["workdir"]), dataset)
    try:
        v = preflight(hidden, layers, dataset, output_dir, max_samples=need.get("max_samples"),
                      max_model_len=need.get("max_model_len"), time_budget=float(need.get("time_budget", 10)),
                      shard=need.get("shard"))
    except OSError as exc:
        return {"unknown": "cannot read the dataset %s: %s" % (dataset, exc.strerror or exc)}
    from . import activeparams         # the launch plan's compute bound (extract/plan.py)
    v.update(config=cfg_path, hidden_size=hidden, layers=layers, active=activeparams.count(cfg))
    return v


def dataset_tokens(path, max_samples=None, max_model_len=None, output_dir=None, time_budget=10.0,
                   clock=time.monotonic, shard=None):
    """Tokens of the samples the job will write: the first ``max_samples`` non-blank lines of the
    JSONL (the script's sample numbering), each cut to ``max_model_len - 1``, leaving out those
    whose ``data_<N>.pt`` already exists in ``output_dir`` (a list: in any of them). Counted line by
    line for up to ``time_budget`` seconds; the lines after that are counted (newlines only) and
    given the mean of the samples measured. Returns {samples, tokens, pending_samples,
    pending_tokens, text_samples (estimated), extrapolated_samples, exact, per_dir}: ``per_dir``
    the pending samples and tokens of each output directory (run_identity.dir_index; the
    extrapolated ones shared evenly). ``shard`` [k, n]: only its samples (i % n == k) count."""
    from ..outputs.run_identity import dir_index
    limit = max_model_len - 1 if max_model_len else None
    deadline = clock() + time_budget
    samples = tokens = pend_samples = pend_tokens = text_samples = 0
    measured_tokens = 0
    outs = [os.path.expanduser(d) for d in (output_dir if isinstance(output_dir, (list, tuple))
                                            else [output_dir] if output_dir else [])]
    per_dir = [{"pending_samples": 0, "pending_tokens": 0} for _ in outs or [None]]
    k, n_shards = (shard[0], shard[1]) if shard else (0, 1)
    index = -1
    with open(os.path.expanduser(path), "rb") as fh:
        for raw in fh:
            if max_samples is not None and index + 1 >= max_samples:
                break
            if not raw.strip():
                continue
            index += 1
            if index % n_shards != k:
                continue
            if clock() > deadline:
                rest = _count_lines(fh, None if max_samples is None else max_samples - index - 1)
                rest = 1 + len(range(index + 1 + (k - index - 1) % n_shards, index + 1 + rest, n_shards))
                mean = measured_tokens / samples if samples else 0
                extra_tokens = int(round(mean * rest))
                for j, share in enumerate(per_dir):
                    share["pending_samples"] += rest // len(per_dir) + (j < rest % len(per_dir))
                    share["pending_tokens"] += int(round(extra_tokens / len(per_dir)))
                return _counts(samples + rest, tokens + extra_tokens, pend_samples + rest,
                               pend_tokens + extra_tokens, text_samples, rest, per_dir)
            n = _line_tokens(raw)
            if n is None:
                n = 0
            elif n < 0:
                text_samples += 1
                n = -n
            if limit is not None:
                n = min(n, limit)
            measured_tokens += n
            name = "data_%d.pt" % index
            if not any(os.path.exists(os.path.join(d, name)) for d in outs):
                pend_samples += 1
                pend_tokens += n
                share = per_dir[dir_index(index, len(per_dir), n_shards)]
                share["pending_samples"] += 1
                share["pending_tokens"] += n
            samples += 1
            tokens += n
    return _counts(samples, tokens, pend_samples, pend_tokens, text_samples, 0, per_dir)


def _counts(samples, tokens, pend_samples, pend_tokens, text_samples, extrapolated, per_dir):
    return {"samples": samples, "tokens": tokens, "pending_samples": pend_samples, "pending_tokens": pend_tokens,
            "text_samples": text_samples, "extrapolated_samples": extrapolated,
            "exact": not text_samples and not extrapolated, "per_dir": per_dir}


def _line_tokens(raw):
    """len(input_ids), or -(estimated tokens) of a text line, or None for a line the job would
    refuse anyway (the script validates every line before its engine starts)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    ids = obj.get("input_ids")
    if isinstance(ids, list):
        return len(ids)
    text = obj.get("text")
    if isinstance(text, str):
        return -max(1, -(-len(text.encode("utf-8")) // TEXT_BYTES_PER_TOKEN))
    return None


def _count_lines(fh, at_most):
    """Non-blank lines left in ``fh`` (at most ``at_most``), by newlines, without parsing."""
    n = 0
    for raw in fh:
        if at_most is not None and n >= at_most:
            break
        if raw.strip():
            n += 1
    return n
