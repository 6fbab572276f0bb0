"""A dataset sharded over hosts: the assignment rule, compact index lists, and op ``shards.files``.

Stdlib only; the controller imports it too (``remote_ops.agent.shards``), so the rule is written
once for remote-ops (the job script, which never imports remote-ops, has its own three-line copy:
``shard_indexes`` in playbooks/scripts/extract_hidden_states.py).

The rule: shard ``k`` of ``n`` holds the global sample indexes ``i`` with ``i % n == k`` (round
robin: every shard gets an even mix of short and long samples, and shard sizes differ by at most
one). Files keep their global index (``data_<i>.pt``), so the union of the shards' directories is
one dataset in speculators' layout. A directory holding a share moved to another host is named
``shard-<k>-of-<n>`` inside that host's output directory.
"""

import os
import re

SHARD_DIR_RE = re.compile(r"^shard-(\d+)-of-(\d+)$")
SAMPLE_RE = re.compile(r"^data_(\d+)\.pt$")


def parse(text):
    """"K/N" -> (k, n) with 0 <= k < n; ValueError otherwise."""
    parts = str(text).strip().split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError("a shard is written K/N (e.g. 0/3), got %r" % (text,))
    k, n = int(parts[0]), int(parts[1])
    if n < 1 or not 0 <= k < n:
        raise ValueError("shard %d/%d: K must be in 0..N-1 and N >= 1" % (k, n))
    return k, n


def share_count(total, k, n):
    """How many of ``range(total)`` belong to shard k of n."""
    return len(range(k, max(0, int(total)), n))


def dir_name(k, n):
    return "shard-%d-of-%d" % (k, n)


def from_config(doc_shard):
    """The (k, n) a data_config.json ``shard`` object records, else None."""
    if not isinstance(doc_shard, dict):
        return None
    k, n = doc_shard.get("index"), doc_shard.get("count")
    if isinstance(k, int) and isinstance(n, int) and not isinstance(k, bool) and not isinstance(n, bool) \
            and n >= 1 and 0 <= k < n:
        return k, n
    return None


def runs(indexes):
    """Sorted distinct indexes as arithmetic runs ``[start, count, step]`` (a complete shard k of n
    is one run ``[k, count, n]``); ``expand`` is the inverse."""
    out = []
    for i in sorted(set(indexes)):
        if out:
            start, count, step = out[-1]
            last = start + (count - 1) * step
            if count == 1 and i > last:
                out[-1] = [start, 2, i - start]
                continue
            if i - last == step:
                out[-1][1] += 1
                continue
        out.append([i, 1, 1])
    return out


def expand(run_list):
    for start, count, step in run_list:
        for j in range(count):
            yield start + j * step


def op_files(args):
    """The output directory's data_<N>.pt files (index, size, and with ``digest`` their sha256),
    data_config.json's text, the ``shard-K-of-N`` subdirectories (moved shares), the directory's
    identity (agent/outputlock.py) and its run identity (``run_identity``). Streams
    ``{"hashed": bytes, "of": bytes}`` progress while hashing."""
    import hashlib
    import time
    out_dir = os.path.expanduser(args.get("output_dir") or "")
    if not out_dir:
        from .protocol import AgentFailure
        raise AgentFailure("bad-args", "output_dir is required")
    if not os.path.isdir(out_dir):
        from .protocol import AgentFailure
        raise AgentFailure("no-output", "output directory %s does not exist on the host" % out_dir)
    files, subdirs = [], []
    with os.scandir(out_dir) as it:
        for entry in it:
            m = SAMPLE_RE.match(entry.name)
            if m and entry.is_file():
                files.append({"index": int(m.group(1)), "name": entry.name, "size": entry.stat().st_size})
            elif SHARD_DIR_RE.match(entry.name) and entry.is_dir():
                subdirs.append(entry.name)
    files.sort(key=lambda f: f["index"])
    config_text = None
    try:
        with open(os.path.join(out_dir, "data_config.json"), encoding="utf-8") as fh:
            config_text = fh.read()
    except OSError:
        pass
    if args.get("digest"):
        total = sum(f["size"] for f in files)
        done, last = 0, time.time()
        for f in files:
            h = hashlib.sha256()
            with open(os.path.join(out_dir, f["name"]), "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
                    done += len(chunk)
                    if time.time() - last > 2:
                        last = time.time()
                        yield {"type": "progress", "hashed": done, "of": total}
            f["sha256"] = h.hexdigest()
    from . import outputlock
    return {"output_dir": out_dir, "files": files, "config_text": config_text, "shard_dirs": sorted(subdirs),
            "identity": outputlock.identity(out_dir), "run": run_identity(out_dir)}


def run_identity(out_dir):
    """What the directory's run.json says its files were made from, for comparing directories:
    ``digest`` (the whole identity, shard included), ``shard`` and ``run`` (sha256 of the identity
    without its shard: one value for every share of one run); None without a readable run.json."""
    import hashlib
    import json
    try:
        with open(os.path.join(out_dir, "run.json"), encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    ident = doc.get("identity")
    run = None
    if isinstance(ident, dict):
        rest = {k: v for k, v in ident.items() if k != "shard"}
        run = hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    shard = ident.get("shard") if isinstance(ident, dict) else None
    return {"digest": doc.get("digest") if isinstance(doc.get("digest"), str) else None,
            "shard": [shard.get("index"), shard.get("count")] if isinstance(shard, dict) else None,
            "run": run, "created": doc.get("created")}
