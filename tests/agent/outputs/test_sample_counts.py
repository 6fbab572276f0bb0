"""Counting sample files with a bit per index (outputs/layout.Indexes, outputs/scan.Listed and Without):
the bitmap against a set at its edges, jobfiles.count_samples over real directories (index 0, gaps,
extras beyond the run's size, one index in two directories, the other layout's files), verify's
dataset lines read as the files are checked, and the memory each holds at 300k names (tracemalloc)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import tracemalloc

import pytest

from remote_ops.agent.job import jobfiles
from remote_ops.agent.outputs import run_identity as ri
from remote_ops.agent.outputs.identity_check import IdentityCheck
from remote_ops.agent.outputs.layout import Indexes
from remote_ops.agent.outputs.scan import Listed, Without, ends_of, scan
from tests.helpers_ops import drain


@pytest.mark.parametrize("members", [
    [0], [7], [8], [0, 1, 2, 3, 4, 5, 6, 7, 8], [5, 3, 5, 0, 3], list(range(0, 1000, 3)),
    [0, 10 ** 12], [10 ** 12, 5, 10 ** 12 + 1, 6], [2 ** 21, 3], [],
])
def test_indexes_hold_what_a_set_holds(members):
    got, ref = Indexes(), set()
    for i in members:
        assert got.add(i) is (i not in ref)          # a duplicate is not counted twice
        ref.add(i)
    assert list(got) == sorted(ref)
    assert len(got) == len(ref) and bool(got) is bool(ref)
    assert got.top == max(ref, default=-1)
    for i in [-1, 0, 1, 7, 8, 9, 999, 1000, 10 ** 12, 10 ** 12 + 1, 2 ** 21] + sorted(ref):
        assert (i in got) is (i in ref)
    assert list(got.absent(0, 20)) == [i for i in range(20) if i not in ref]
    assert list(got.absent(1, 20, 3)) == [i for i in range(1, 20, 3) if i not in ref]


def test_indexes_random_against_a_set():
    rng = random.Random(49)
    for _ in range(300):
        got, ref = Indexes(), set()
        for _ in range(rng.randrange(80)):
            i = rng.choice([rng.randrange(40), rng.randrange(100000), rng.randrange(10 ** 10)])
            assert got.add(i) is (i not in ref)
            ref.add(i)
        assert list(got) == sorted(ref) and len(got) == len(ref) and got.top == max(ref, default=-1)


def test_a_stray_huge_index_costs_no_huge_bitmap():
    got = Indexes([0, 1, 99999999999])
    assert len(got.bits) < 1 << 20 and list(got) == [0, 1, 99999999999]


def test_listed_keeps_the_first_and_counts_all():
    got = Listed(3)
    for i in range(10):
        got.append(i)
    assert got[:50] == [0, 1, 2] and len(got) == 10 and got
    assert not Listed(0) and len(Listed(0)) == 0


@pytest.mark.parametrize("members,skip", [
    (list(range(1000)), [0, 999]), ([3, 9, 700, 701, 5000], [3]), (list(range(0, 5000, 7)), [0, 14, 4998]),
    ([0, 1, 10 ** 12], [0]),
])
def test_without_draws_what_the_list_drew(members, skip):
    """random.sample from Without picks what it picked from the list it replaces (same seed, same files)."""
    whole = Indexes(members)
    rest = Without(whole, skip)
    listed = [i for i in members if i not in set(skip)]
    assert len(rest) == len(listed) and list(rest) == listed and [rest[j] for j in range(len(rest))] == listed
    for seed in range(5):
        k = min(len(listed), 32)
        assert random.Random(seed).sample(rest, k) == random.Random(seed).sample(listed, k)
    assert list(ends_of(whole)) == sorted({members[0], members[-1]})


def _touch(d, *names):
    d.mkdir(exist_ok=True)
    for n in names:
        (d / n).write_bytes(b"x")


def test_count_samples_at_the_edges(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _touch(a, "data_0.pt", "data_2.pt", "data_9.pt", "data_02.pt", "hs_3.safetensors", "notes.txt")
    _touch(b, "data_2.pt", "data_4.pt", "data_100.pt")
    os.symlink(a / "data_0.pt", a / "data_5.pt")                      # a link is never a sample
    assert jobfiles.count_samples(str(a)) == (3, 9)                   # index 0 counted, the gap left out
    assert jobfiles.count_samples(str(a), "hs_safetensors") == (1, 3)
    assert jobfiles.count_samples([str(a), str(b)]) == (5, 100)       # data_2.pt in both: counted once
    assert jobfiles.count_samples([str(a), str(b)], limit=9) == (3, 4)   # 9 and 100 beyond the run's size
    assert jobfiles.count_samples(str(tmp_path / "absent")) == (0, -1)
    (b / "data_config.json").write_text(json.dumps({"data": {"num_samples": 10}}))
    rec = jobfiles.written([str(b), str(a)])
    assert (rec["done"], rec["max_index"], rec["num_samples"]) == (4, 9, 10)   # 0, 2, 4, 9: 100 is beyond


def test_scan_gives_bitmaps(tmp_path):
    _touch(tmp_path, "data_0.pt", "data_3.pt", ".data_4.pt.abctmp")
    (tmp_path / "data_5.pt").write_bytes(b"")
    strays = {}
    indexes, empty, partial = scan(str(tmp_path), "data_pt", strays)
    assert list(indexes) == [0, 3, 5] and list(empty) == [5] and partial == [".data_4.pt.abctmp"]


class _Entry:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def is_file(self, follow_symlinks=True):
        return True


class _Listing:
    def __init__(self, n):
        self.it = (_Entry("data_%d.pt" % i) for i in range(n) if i != 7)

    def __enter__(self):
        return self.it

    def __exit__(self, *exc):
        return False


def _peak(fn):
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    try:
        result = fn()
        return tracemalloc.get_traced_memory()[1] - base, result
    finally:
        tracemalloc.stop()


def test_counting_300k_names_holds_a_bit_per_name(monkeypatch):
    """count_samples over a listing of 300,000 names (one missing) holds a bitmap, not the set of 300k
    indexes it kept before (benchmarks/controller/count_memory.py --rev <before> prints both peaks)."""
    monkeypatch.setattr(os, "scandir", lambda d: _Listing(300000))
    peak, got = _peak(lambda: jobfiles.count_samples("/listing", "data_pt"))
    assert got == (299999, 299999)
    assert peak < 1_000_000, peak


def _run(tmp_path, n, changed=False):
    """An output with a run.json whose dataset has ``n`` lines of token ids (the file of line i holds
    ``ids(i)``)."""
    data = tmp_path / "data.jsonl"
    with data.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"input_ids": [i, i + 1, i + 2]}) + "\n")
            if i == 2:
                fh.write("\n")                      # a blank line is not a line
    h = hashlib.sha256()
    for line in data.read_bytes().splitlines():
        if line.strip():
            h.update(line + b"\n")
    out = tmp_path / "out"
    ri.write(str(out), {"dataset": {"path": str(data), "samples": n, "lines_sha256": h.hexdigest()},
                        "max_model_len": 3})
    if changed:                                     # line 1 edited in place since
        data.write_text(data.read_text().replace("[1, 2, 3]", "[1, 2, 4]", 1))
    return str(out)


def test_the_dataset_is_read_as_the_files_are_checked(tmp_path):
    out = _run(tmp_path, 50)
    ident = IdentityCheck(out, [0, 3, 4, 49])
    assert ident.check(0, [0, 1], None, None) == []                     # cut at max_model_len - 1 = 2
    assert ident.check(3, [3, 4], None, None) == []                     # after the blank line
    assert ident.check(4, [9, 9], None, None) == ["token ids differ from dataset line 4 (2 tokens in the file, "
                                                  "2 in the line)"]
    assert ident.check(60, [1, 2], None, None) == ["sample 60 is beyond the run's 50 samples (run.json)"]
    doc = ident.to_json()
    assert (doc["ids_compared"], doc["ids_differ"], doc["problems"]) == (3, 1, [])


def test_a_dataset_changed_since_the_run_is_found_at_the_end(tmp_path):
    out = _run(tmp_path, 10, changed=True)
    ident = IdentityCheck(out, [1])
    assert ident.check(1, [9, 9], None, None)
    ident.finish()
    assert len(ident.problems) == 1 and "changed since the run" in ident.problems[0]


def test_checking_every_line_keeps_none_of_them(tmp_path):
    """verify --all's identity check over 100,000 lines holds one line at a time, not a digest of every
    line it checked (as it did before)."""
    n = 100000
    out = _run(tmp_path, n)
    chosen = Indexes(range(n))

    def check():
        ident = IdentityCheck(out, chosen)
        for i in chosen:
            assert not ident.check(i, [i, i + 1], None, None)
        return ident.to_json()

    peak, doc = _peak(check)
    assert doc["ids_compared"] == n and doc["problems"] == []
    assert peak < 2_000_000, peak


def _linked_outputs(out, indexes):
    """A small well-formed data_<N>.pt, hard-linked under every index of ``indexes``."""
    torch = pytest.importorskip("torch")
    out.mkdir()
    for k, i in enumerate(indexes):
        if k % 50000 == 0:                  # a new source now and then: a file system caps links per file
            first = out / ("sample%d.pt" % k)
            torch.save({"input_ids": torch.tensor([1, 2, 3]), "loss_mask": torch.ones(3, dtype=torch.long),
                        "hidden_states": [torch.zeros(3, 4), torch.zeros(3, 4)]}, first)
        os.link(first, out / ("data_%d.pt" % i))
    for source in out.glob("sample*.pt"):
        source.unlink()


def test_verify_lists_the_first_gaps_and_counts_the_rest(tmp_path):
    from remote_ops.agent.verify import op_verify
    _linked_outputs(tmp_path / "out", range(0, 400, 2))
    res = drain(op_verify({"output_dir": str(tmp_path / "out"), "expected": 1000}))
    assert res["files"] == 200 and res["max_index"] == 398
    assert res["gaps"] == list(range(1, 100, 2)) and res["gap_count"] == 199
    assert res["missing_after_last"] == 601 and not res["ok"]
    # loaded: the first and last files and the 50 neighbours of the 50 gaps listed (more than the 32 asked)
    assert res["unloadable_count"] == 0 and res["checked"] == 52


def test_sampled_verify_of_60k_files_holds_bits_not_entries(tmp_path):
    """op_verify over 60,000 files (two gaps, one file beyond the run's size): the answer as before,
    from bitmaps; the {index: name} dict, index lists and sorted copies it held before are gone."""
    from remote_ops.agent.verify import op_verify
    n = 60000
    _linked_outputs(tmp_path / "out", [i for i in range(n) if i not in (5, 77)] + [n + 10])
    peak, res = _peak(lambda: drain(op_verify({"output_dir": str(tmp_path / "out"), "expected": n})))
    assert res["files"] == n - 2 and res["gaps"] == [5, 77] and res["gap_count"] == 2
    assert res["extra"] == ["data_%d.pt" % (n + 10)] and res["extra_count"] == 1
    assert res["missing_after_last"] == 0 and res["unloadable_count"] == 0 and res["checked"] == 32
    assert peak < 3_000_000, peak
