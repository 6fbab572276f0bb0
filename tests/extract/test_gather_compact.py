"""gather's compact state (agent/outputs/packed.py, extract/gather_store.py): the packed listing's round
trip and its refusals (in process and, through the hostile kit, over the real sshd), the manifest's
columns, the destination bitmap, and the pipelined copy's failures (no partial file left, what was
copied counted)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import random
import zipfile

import pytest

from remote_ops.agent.outputs import packed
from remote_ops.extract import gather_store as gstore
from remote_ops.extract import shard as shard_mod
from tests import hostile
from tests.conftest import write_inventory


def _rows(n=40, seed=1):
    rnd = random.Random(seed)
    idx = sorted(rnd.sample(range(200), n))          # gaps
    return [(i, 0, rnd.randrange(1, 1 << 40), 0o644 if i % 7 else 0o600) for i in idx]


def _digests(rows):
    return b"".join(hashlib.sha256(str(r[0]).encode()).digest() for r in rows)


def test_packed_round_trip_gives_the_records_of_the_old_listing():
    rows = _rows()
    doc = json.loads(json.dumps(packed.encode(rows, ["/o"], _digests(rows))))     # through JSON, as on the wire
    cols = packed.decode(doc, "/o", {"/o"})
    assert len(cols) == len(rows)
    assert list(cols) == [{"index": i, "name": f"data_{i}.pt", "size": size, "mode": mode,
                           "sha256": hashlib.sha256(str(i).encode()).hexdigest()} for i, _, size, mode in rows]


def test_packed_several_directories_name_each_files_dir():
    rows = [(0, 0, 5, 0o600), (1, 1, 6, 0o600), (1, 0, 7, 0o600)]
    assert not packed.decode(packed.encode(rows, ["/o", "/p"], bytes(96)), "/o", {"/o", "/p"}).in_order()
    cols = packed.decode(packed.encode(rows, ["/o", "/p"], bytes(96)), "/o", {"/o", "/p"})
    assert [(r["index"], r.get("dir")) for r in cols] == [(0, None), (1, "/p"), (1, None)]
    assert [(r["index"], r.get("dir")) for r in cols.sorted()] == [(0, None), (1, None), (1, "/p")]


BAD = [
    ("count", {"count": -1}, "count"),
    ("index-negative", {"index": [[-3, 40]]}, "index"),
    ("index-short", {"index": [[0, 39]]}, "index"),
    ("index-bool", {"index": [[True, 40]]}, "index"),
    ("dir-slot", {"dir": [[1, 40]]}, "dir"),
    ("foreign-dir", {"dirs": ["/etc"]}, "dirs"),
    ("mode", {"mode": [[0o70000, 40]]}, "mode"),
    ("size-b64", {"size": "%%%"}, "size"),
    ("sha-short", {"sha256": "AAAA"}, "sha256"),
]


@pytest.mark.parametrize("case,change,word", BAD, ids=[c[0] for c in BAD])
def test_a_bad_packed_listing_is_refused_and_refuses_the_gather(case, change, word):
    rows = _rows()
    doc = dict(packed.encode(rows, ["/o"], _digests(rows)), **change)
    with pytest.raises(ValueError) as ei:
        packed.decode(doc, "/o", {"/o"})
    assert word in str(ei.value)
    listing = shard_mod.admit({"output_dir": "/o", "packed": doc, "shard_dirs": [], "config_text":
                               json.dumps({"data": {"num_samples": 200}})})
    assert len(listing["files"]) == 0 and listing["refused"] and "packed listing is refused" in listing["refused"][0]
    _, _, g = shard_mod.plan({"h": [listing]})
    assert g.problems and "break the rule for sample files" in g.problems[0]


def test_plan_over_packed_listings_matches_the_dict_listings():
    rows = _rows()
    cfg = json.dumps({"data": {"num_samples": 200}})
    doc = packed.encode(rows, ["/o"], _digests(rows))
    a = shard_mod.admit({"output_dir": "/o", "packed": json.loads(json.dumps(doc)), "shard_dirs": [], "config_text": cfg})
    b = shard_mod.admit({"output_dir": "/o", "files": list(packed.decode(doc, "/o", {"/o"})), "shard_dirs": [],
                         "config_text": cfg})
    (pa, _, ga), (pb, _, gb) = shard_mod.plan({"h": [a]}), shard_mod.plan({"h": [b]})
    assert not ga.problems and not gb.problems
    assert list(pa["h"]) == list(pb["h"]) and len(pa["h"]) == len(rows)
    assert pa["h"][3]["path"] == f"/o/data_{rows[3][0]}.pt"


def test_bitmap_counts_as_a_set_does():
    rnd = random.Random(3)
    values = [rnd.randrange(0, 5000) for _ in range(3000)] + [1 << 28, 0, 7, 8]
    bm = gstore.Bitmap(values)
    assert len(bm) == len(set(values)) and list(bm) == sorted(set(values))
    assert all((i in bm) == (i in set(values)) for i in range(-2, 5100)) and (1 << 28) in bm


def test_local_indexes_counts_only_sample_files(tmp_path):
    for name in ("data_0.pt", "data_5.pt", "data_12.pt", "data_01.pt", ".data_3.pt.1.tmp", "data_x.pt", "notes"):
        (tmp_path / name).write_bytes(b"x")
    os.symlink(tmp_path / "data_0.pt", tmp_path / "data_3.pt")     # a link is not a sample
    (tmp_path / "data_4.pt").mkdir()
    present, beyond = gstore.local_indexes(str(tmp_path), 5)
    assert list(present) == [0, 5, 12] and beyond == ["data_5.pt", "data_12.pt"]


class _St:
    def __init__(self, size, mtime, ino):
        self.st_size, self.st_mtime_ns, self.st_ino = size, mtime, ino


def test_manifest_round_trip_newest_entry_wins_and_absent_files_leave(tmp_path):
    for i in (0, 1, 2, 9):
        (tmp_path / f"data_{i}.pt").write_bytes(b"x")
    m = gstore.Manifest(str(tmp_path))
    sha = {i: hashlib.sha256(bytes([i])).hexdigest() for i in range(10)}
    for i in (9, 0, 1, 2, 5):            # 5 is not in the directory: not kept
        m.add(f"data_{i}.pt", _St(10 + i, 100 + i, 1000 + i), {"index": i, "sha256": sha[i]}, f"h:/o/data_{i}.pt")
    m.save()
    again = gstore.Manifest(str(tmp_path))
    assert again.quick("data_1.pt", _St(11, 101, 1001), {"index": 1, "sha256": sha[1]})
    assert not again.quick("data_1.pt", _St(11, 102, 1001), {"index": 1, "sha256": sha[1]})     # touched
    assert not again.quick("data_5.pt", _St(15, 105, 1005), {"index": 5, "sha256": sha[5]})
    again.add("data_1.pt", _St(99, 199, 1999), {"index": 1, "sha256": sha[3]}, "g:/p/data_1.pt")
    again.save()
    last = gstore.Manifest(str(tmp_path))
    assert last.entry(1) == {"size": 99, "mtime_ns": 199, "inode": 1999, "sha256": sha[3], "source": "g:/p/data_1.pt"}
    assert last.entry(9)["source"] == "h:/o/data_9.pt" and last.entry(5) is None
    assert not gstore.Manifest(str(tmp_path), checksum=True).quick("data_9.pt", _St(19, 109, 1009),
                                                                  {"index": 9, "sha256": sha[9]})


def test_manifest_reads_the_first_format(tmp_path):
    sha = "ab" * 32
    (tmp_path / ".remote-ops-gather.json").write_text(json.dumps(
        {"format": "remote-ops-gather/1", "files": {"data_4.pt": [3, 44, 444, sha, "h:/o/data_4.pt"]}}))
    m = gstore.Manifest(str(tmp_path))
    assert m.quick("data_4.pt", _St(3, 44, 444), {"index": 4, "sha256": sha})


def _saved(tmp_path, n, slice_bytes=None):
    """A manifest of ``n`` entries added out of order (as copy threads finish), index 7 twice (the newest wins)."""
    for i in range(n):
        (tmp_path / f"data_{i}.pt").write_bytes(b"x")
    m = gstore.Manifest(str(tmp_path))
    order = list(range(n))
    random.Random(3).shuffle(order)
    sha = {i: hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)}
    for i in order:
        m.add(f"data_{i}.pt", _St(i, 1000 + i, 5000 + i), {"index": i, "sha256": sha[i]}, f"h:/o/data_{i}.pt")
    m.add("data_7.pt", _St(77, 777, 7777), {"index": 7, "sha256": sha[8]}, "g:/p/data_7.pt")
    m.save()
    return sha


def test_manifest_is_written_streaming_as_the_json_it_always_was(tmp_path):
    """The digests stream into the file's last field: the file is still one JSON document of the /2
    format (any JSON reader reads it), and what it says is read back entry by entry."""
    n = 3000
    sha = _saved(tmp_path, n)
    raw = (tmp_path / ".remote-ops-gather.json").read_bytes()
    doc = json.loads(raw)
    assert doc["format"] == "remote-ops-gather/2" and doc["count"] == n and list(doc)[-1] == "sha256"
    assert raw == json.dumps(doc, separators=(",", ":")).encode()
    back = gstore.Manifest(str(tmp_path))
    assert back.entry(7) == {"size": 77, "mtime_ns": 777, "inode": 7777, "sha256": sha[8], "source": "g:/p/data_7.pt"}
    for i in (0, 1, 2999, 1500):
        assert back.quick(f"data_{i}.pt", _St(i, 1000 + i, 5000 + i), {"index": i, "sha256": sha[i]})
    with open(tmp_path / ".remote-ops-gather.json", "rb") as fh:      # streamed read == whole read
        streamed, digests = gstore._load(fh)
    assert digests is not None and bytes(digests) == base64.b64decode(doc["sha256"])
    assert {k: v for k, v in streamed.items() if k != "sha256"} == {k: v for k, v in doc.items() if k != "sha256"}


@pytest.mark.parametrize("damage", ["cut in the digests", "cut after them", "bad base64"])
def test_a_damaged_manifest_is_ignored(tmp_path, damage):
    _saved(tmp_path, 200)
    path = tmp_path / ".remote-ops-gather.json"
    raw = path.read_bytes()
    raw = {"cut in the digests": raw[:-500], "cut after them": raw[:-1], "bad base64": raw[:-40] + b"!!!!" + raw[-36:]}[damage]
    path.write_bytes(raw)
    m = gstore.Manifest(str(tmp_path))
    assert len(m.old["index"]) == 0 and m.entry(3) is None


def test_a_manifest_with_a_field_after_its_digests_is_read_whole(tmp_path):
    sha = _saved(tmp_path, 50)
    path = tmp_path / ".remote-ops-gather.json"
    path.write_bytes(path.read_bytes()[:-1] + b',"x":1}')
    assert gstore.Manifest(str(tmp_path)).quick("data_3.pt", _St(3, 1003, 5003), {"index": 3, "sha256": sha[3]})


def test_order_puts_the_newest_addition_of_an_index_first():
    import array
    index = array.array("q", [5, 3, 5, 1, 3, 9])
    assert list(gstore._order(index)) == [3, 4, 1, 2, 0, 5]


class _Host:
    name = "h"


class _Session:
    """open_sample from a dict of bytes; ``fail``: path -> the exception its read raises half-way."""

    host = _Host()

    def __init__(self, files, fail):
        self.files, self.fail, self.slots = files, fail, set()

    def open_sample(self, path, slot=0):
        self.slots.add(slot)
        if path in self.fail:
            exc = self.fail[path]

            class Half(io.BytesIO):
                def read(self, n=-1):
                    if self.tell():
                        raise exc
                    return super().read(3)
            return Half(self.files[path])
        return io.BytesIO(self.files[path])


def _items(n):
    files = {f"/o/data_{i}.pt": os.urandom(64 + i) for i in range(n)}
    items = [{"index": i, "name": f"data_{i}.pt", "size": len(files[f"/o/data_{i}.pt"]), "host": "h",
              "path": f"/o/data_{i}.pt", "sha256": hashlib.sha256(files[f"/o/data_{i}.pt"]).hexdigest()}
             for i in range(n)]
    return files, items


def test_a_file_failing_mid_copy_leaves_no_partial_file_and_the_rest_count(tmp_path):
    files, items = _items(30)
    sess = _Session(files, {"/o/data_7.pt": OSError("read failed"), "/o/data_20.pt": OSError("read failed")})
    seen = []
    part = shard_mod.copy_part(sess, items, str(tmp_path), on_file=lambda h, it: seen.append(it["index"]),
                               manifest=gstore.Manifest(str(tmp_path)))
    assert part.copied == 28 and sorted(seen) == [i for i in range(30) if i not in (7, 20)]
    assert sorted(f["file"] for f in part.failed) == ["/o/data_20.pt", "/o/data_7.pt"]
    assert sorted(os.listdir(tmp_path)) == sorted(f"data_{i}.pt" for i in range(30) if i not in (7, 20))
    assert all((tmp_path / f"data_{i}.pt").read_bytes() == files[f"/o/data_{i}.pt"] for i in seen)
    assert len(sess.slots) > 1          # several channels in flight


def test_a_lost_connection_stops_the_part_and_counts_what_it_copied(tmp_path):
    files, items = _items(200)
    sess = _Session(files, {"/o/data_50.pt": EOFError("connection closed")})
    part = shard_mod.copy_part(sess, items, str(tmp_path), streams=2)
    started = part.copied + len(part.failed)
    assert part.extra["not_started"] == 200 - started and part.extra["not_started"] > 100
    assert any(f["file"] == "/o/data_50.pt" and "connection closed" in f["error"] for f in part.failed)
    names = os.listdir(tmp_path)
    assert not [n for n in names if n.endswith(".tmp")] and len(names) == part.copied
    assert all((tmp_path / n).read_bytes() == files["/o/" + n] for n in names)


def test_a_hostile_packed_listing_over_ssh_refuses_the_gather(tmp_path, sshd, cli):
    out, dest = tmp_path / "out", tmp_path / "to"
    out.mkdir()
    for i in range(3):          # whole files of torch's format (a zip): layout.whole admits them
        with zipfile.ZipFile(out / f"data_{i}.pt", "w") as z:
            z.writestr("archive/data.pkl", b"x" * i)
    (out / "data_config.json").write_text(json.dumps({"data": {"num_samples": 3}}))
    wrapper = hostile.wrapper(tmp_path, {"packed": {"dirs": ["/etc"]}})
    inv = str(write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(
        python=str(wrapper), env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state")})}))
    status, text, err = cli("gather", "h", "--to", str(dest), "--output-dir", str(out), "-i", inv)
    assert hostile.rewrites(wrapper), "the fault never hit an agent answer"
    assert status != 0 and "packed listing is refused" in text + err, text + err
    assert os.listdir(dest) == []
