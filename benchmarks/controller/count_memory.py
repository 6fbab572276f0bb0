"""The host side's memory to count sample files (issue 49 item 3), in process, at one code revision or two.

    python benchmarks/controller/count_memory.py                       # this working tree, 300k names
    python benchmarks/controller/count_memory.py --rev 5cfbf37         # that commit and this tree, side by side
    python benchmarks/controller/count_memory.py --rev 5cfbf37 --files 300000 --all-files 20000

Each revision's ``remote_ops`` (``git archive``; the working tree as it is) runs in its own process, and
tracemalloc's peak above the start of each step is printed (Python allocations only, in MB):

- ``count_samples``: agent/job/jobfiles.count_samples, the count status and the job's supervisor make,
  over a listing of ``--files`` names (data_0.pt ...; os.scandir replaced by a generator of entries, so
  no files are made and only the counting's own state is measured);
- ``verify sampled``: agent/verify.op_verify (the host's torch) over ``--files`` real files in a fresh
  directory (/dev/shm when there is one): hard links to one small well-formed sample, so every file
  is whole and loads; the default sample of 32 loaded;
- ``verify --all``: the same over ``--all-files`` files, every one loaded (torch.load each: slow, hence
  fewer), with a run.json and a JSONL dataset whose every line matches, so each file's token ids are
  compared with its dataset line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class _Entry:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def is_file(self, follow_symlinks=True):
        return True


class _Listing:
    """What os.scandir returns, over ``n`` generated sample names."""

    def __init__(self, n):
        self.it = (_Entry("data_%d.pt" % i) for i in range(n))

    def __enter__(self):
        return self.it

    def __exit__(self, *exc):
        return False

    def __iter__(self):
        return self.it


def _peak(fn):
    import tracemalloc
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    try:
        result = fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return round((peak - base) / 1e6, 2), result


def _drain(gen):
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        return stop.value


def _outputs(root, n, lines):
    """``n`` hard links to one small sample in ``root``; with ``lines``, a run.json and its dataset too."""
    import torch
    from remote_ops.agent.outputs import run_identity as ri
    os.makedirs(root)
    ids = [1, 2, 3, 4]
    sample = {"input_ids": torch.tensor(ids), "loss_mask": torch.ones(4, dtype=torch.long),
              "hidden_states": [torch.zeros(4, 8), torch.zeros(4, 8)]}
    first = os.path.join(root, "data_0.pt")
    torch.save(sample, first)
    for i in range(1, n):
        os.link(first, os.path.join(root, "data_%d.pt" % i))
    if lines:
        data = os.path.join(os.path.dirname(root), "data.jsonl")
        with open(data, "w") as fh:
            for _ in range(n):
                fh.write(json.dumps({"input_ids": ids}) + "\n")
        import hashlib
        h = hashlib.sha256()
        with open(data, "rb") as fh:
            for line in fh:
                h.update(line.rstrip(b"\r\n") + b"\n")
        ident = {"dataset": {"path": data, "samples": n, "lines_sha256": h.hexdigest()}, "max_model_len": 64}
        ri.write(root, ident)


def measure(files, all_files, scratch):
    """This process's remote_ops (the revision on sys.path) measured; a JSON line on stdout."""
    from remote_ops.agent.job import jobfiles
    from remote_ops.agent import verify
    out = {}
    real = os.scandir
    os.scandir = lambda d: _Listing(files)
    try:
        out["count_samples"], got = _peak(lambda: jobfiles.count_samples("/nonexistent", "data_pt"))
    finally:
        os.scandir = real
    assert got == (files, files - 1), got
    for key, n, check_all in (("verify sampled", files, False), ("verify --all", all_files, True)):
        root = os.path.join(scratch, key.replace(" ", "_"), "out")
        _outputs(root, n, check_all)
        out[key], res = _peak(lambda: _drain(verify.op_verify({"output_dir": root, "all": check_all})))
        assert res["files"] == n and not res["unloadable_count"] and not res["inconsistent_count"], res
        if check_all:
            assert res["identity"]["ids_compared"] == n and not res["identity"]["problems"], res["identity"]
        shutil.rmtree(os.path.dirname(root))
    print(json.dumps(out))


def _tree(rev, into):
    """``remote_ops`` of ``rev`` extracted under ``into`` (the working tree's own for None)."""
    if rev is None:
        return str(REPO)
    os.makedirs(into)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "remote_ops"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", help="also measure this git revision (e.g. the commit before the change)")
    ap.add_argument("--files", type=int, default=300000, help="names counted, files of the sampled verify")
    ap.add_argument("--all-files", type=int, default=20000, help="files of verify --all")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        sys.path.insert(0, args.measure)
        with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as scratch:
            return measure(args.files, args.all_files, scratch)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rev in ([args.rev] if args.rev else []) + [None]:
            root = _tree(rev, os.path.join(tmp, rev or "tree"))
            env = dict(os.environ, PYTHONPATH=root)
            res = subprocess.run([sys.executable, __file__, "--measure", root, "--files", str(args.files),
                                  "--all-files", str(args.all_files)], env=env, cwd=tmp,
                                 capture_output=True, text=True)
            if res.returncode:
                sys.exit("measuring %s failed:\n%s" % (rev or "the working tree", res.stderr[-3000:]))
            rows.append((rev or "working tree", json.loads(res.stdout.strip().splitlines()[-1])))
    print("peak Python memory (tracemalloc, MB) above each step's start; %d names / files, verify --all over %d"
          % (args.files, args.all_files))
    keys = list(rows[0][1])
    print("%-14s" % "code" + "".join("%18s" % k for k in keys))
    for name, got in rows:
        print("%-14s" % name[:14] + "".join("%18s" % got[k] for k in keys))


if __name__ == "__main__":
    main()
