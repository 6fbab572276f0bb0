"""The host's kept sha256 of sample files (agent/outputs/digestcache.py, used by agent/shards.py's listing):
reused while a file's stat values hold, hashed again when they change, the old JSON dict read once and
replaced, a cut-short or foreign file ignored (everything hashed again) and replaced."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from remote_ops.agent import shards
from remote_ops.agent.outputs import digestcache, layout
from tests.helpers_ops import drain


@pytest.fixture
def outdir(tmp_path, monkeypatch):
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(tmp_path / "state"))
    out = tmp_path / "out"
    out.mkdir()
    for i in (0, 1, 2, 5, 9):
        (out / layout.name(i)).write_bytes(b"sample %d " % i * (i + 1))
    return out


def _rows(out):
    rows = []
    for name in os.listdir(out):
        i = layout.index_of(name)
        if i is not None:
            st = os.stat(out / name)
            rows.append((i, 0, st.st_size, st.st_mode & 0o777, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return sorted(rows)


def _listing(out):
    """(the rows' digests, {"reused", "hashed"}) as the listing computes them."""
    rows, digests = _rows(out), bytearray()
    counts = drain(shards._digests(str(out), [str(out)], rows, digests))
    truth = b"".join(hashlib.sha256((out / layout.name(r[0])).read_bytes()).digest() for r in rows)
    assert bytes(digests) == truth          # reused or hashed, every digest is the file's
    return counts


def test_a_second_listing_hashes_nothing_and_a_changed_mtime_is_hashed_again(outdir):
    assert _listing(outdir) == {"reused": 0, "hashed": 5}
    kept = digestcache.path_of(str(outdir))
    assert open(kept, "rb").read().startswith(digestcache.MAGIC)
    assert _listing(outdir) == {"reused": 5, "hashed": 0}
    st = os.stat(outdir / "data_2.pt")
    os.utime(outdir / "data_2.pt", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert _listing(outdir) == {"reused": 4, "hashed": 1}
    assert _listing(outdir) == {"reused": 5, "hashed": 0}
    (outdir / "data_5.pt").unlink()                        # a file gone, another new: the kept file follows
    (outdir / "data_7.pt").write_bytes(b"seven")
    assert _listing(outdir) == {"reused": 4, "hashed": 1}
    assert _listing(outdir) == {"reused": 5, "hashed": 0}
    with open(kept, "rb") as fh:
        fh.readline(), fh.readline()
        assert len(fh.read()) == 5 * digestcache.RECORD.size      # one record a file, nothing else kept


def test_the_old_json_dict_is_read_once_then_replaced(outdir):
    rows = _rows(outdir)
    old = {os.path.join(str(outdir), layout.name(r[0])): [r[2], r[4], r[5], r[6],
                                                          hashlib.sha256((outdir / layout.name(r[0])).read_bytes()).hexdigest()]
           for r in rows}
    old[os.path.join(str(outdir), "data_9.pt")][0] += 1         # its size no longer the file's: hashed again
    legacy = digestcache.path_of(str(outdir), ".json")
    with open(legacy, "w") as fh:
        json.dump(old, fh)
    assert _listing(outdir) == {"reused": 4, "hashed": 1}
    assert not os.path.exists(legacy) and os.path.exists(digestcache.path_of(str(outdir)))
    assert _listing(outdir) == {"reused": 5, "hashed": 0}


@pytest.mark.parametrize("damage", ["garbage", "cut", "bad header", "empty"])
def test_a_damaged_kept_file_is_ignored_and_replaced(outdir, damage):
    assert _listing(outdir) == {"reused": 0, "hashed": 5}
    kept = digestcache.path_of(str(outdir))
    data = open(kept, "rb").read()
    bad = {"garbage": b"\x00\xffnot a digest file\n" * 10, "cut": data[:-7],
           "bad header": digestcache.MAGIC + b"{not json\n" + data.split(b"\n", 2)[2],
           "empty": b""}[damage]
    with open(kept, "wb") as fh:
        fh.write(bad)
    assert _listing(outdir) == {"reused": 0, "hashed": 5}
    assert _listing(outdir) == {"reused": 5, "hashed": 0}


def test_the_kept_file_is_private(outdir):
    """What the kept file says for a file whose (size, mtime, ctime, inode) hold is taken: only its owner
    may write it (the agent's private state directory, the file 0600)."""
    _listing(outdir)
    kept = digestcache.path_of(str(outdir))
    assert os.stat(os.path.dirname(kept)).st_mode & 0o777 == 0o700 and os.stat(kept).st_mode & 0o777 == 0o600


def _answer(out):
    return drain(shards.op_files({"output_dir": str(out), "digest": True, "packed": True}))


def test_a_listing_with_digests_reads_only_changed_files_for_wholeness(tmp_path, monkeypatch):
    """A file unchanged since it was hashed was whole then: not read again; a file cut short since
    (other size) is checked, named broken and never listed nor kept."""
    import zipfile
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(tmp_path / "state"))
    out = tmp_path / "out"
    out.mkdir()
    for i in range(6):
        with zipfile.ZipFile(out / layout.name(i), "w") as z:
            z.writestr("data.pkl", b"sample %d" % i * 50)
    first = _answer(out)
    assert first["digests"] == {"reused": 0, "hashed": 6} and first["broken_count"] == 0
    data = (out / "data_4.pt").read_bytes()
    (out / "data_4.pt").write_bytes(data[:-10])                   # cut short
    checked = []
    real = layout.whole
    monkeypatch.setattr(layout, "whole", lambda path, *a: checked.append(os.path.basename(path)) or real(path, *a))
    second = _answer(out)
    assert checked == ["data_4.pt"]
    assert second["digests"] == {"reused": 5, "hashed": 0} and second["broken_count"] == 1
    assert second["broken"][0]["file"].endswith("data_4.pt") and second["packed"]["count"] == 5
    assert second["packed"]["index"] == [[0, 4], [5, 1]]
    import base64
    assert base64.b64decode(second["packed"]["sha256"]) == b"".join(
        hashlib.sha256((out / layout.name(i)).read_bytes()).digest() for i in (0, 1, 2, 3, 5))
