"""The sharding rule: shard ``k`` of ``n`` holds the global sample indexes ``i`` with ``i % n == k``.

Stdlib only; the controller imports it too (``remote_ops.agent.outputs.shares``), so the rule is written
once for remote-ops (the job script, which never imports remote-ops, has its own three-line copy:
``shard_indexes`` in remote_ops/playbook/shipped/scripts/extract_hidden_states.py). Round robin: every shard gets an even
mix of short and long samples, and shard sizes differ by at most one. Files keep their global index
(``data_<i>.pt``), so the union of the shards' directories is one dataset in speculators' layout. A
directory holding a share moved to another host is named ``shard-<k>-of-<n>`` inside that host's
output directory.
"""

import re


SHARD_DIR_RE = re.compile(r"^shard-(\d+)-of-(\d+)$")


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
