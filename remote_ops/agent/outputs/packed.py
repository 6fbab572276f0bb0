"""A listing of sample files packed for the wire and for memory: columns, not one record per file.

``shards.files`` with ``packed`` answers ``{"packed": {...}}`` instead of a list of dicts: the indexes
as runs ``[start, length]`` of consecutive values (in listing order), each file's directory and mode as
runs ``[value, length]``, the sizes as little-endian int64 (zlib, base64) and the sha256 digests as
32 raw bytes each (base64). The controller decodes it into ``Columns`` (arrays: about 50 bytes a
file) and checks every value before use (``decode`` raises ValueError naming the column). Stdlib
only: the agent ships it.
"""

import array
import base64
import sys
import zlib

from . import layout

DIGEST = 32
MAX_FILES = 50_000_000


def _ints(values, code="q"):
    a = array.array(code, values)
    if sys.byteorder == "big":
        a.byteswap()
    return base64.b64encode(zlib.compress(a.tobytes(), 1)).decode("ascii")


def _unints(text, count, code="q"):
    a = array.array(code)
    if not isinstance(text, str):
        raise ValueError("not a string")
    d = zlib.decompressobj()
    raw = d.decompress(base64.b64decode(text.encode("ascii"), validate=True), count * a.itemsize + 1)
    if len(raw) != count * a.itemsize or d.unconsumed_tail:
        raise ValueError("holds %d bytes, not %d values" % (len(raw), count))
    a.frombytes(raw)
    if sys.byteorder == "big":
        a.byteswap()
    return a


def runs(values):
    """``[[value, length], ...]``: equal neighbours as one run."""
    out = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def index_runs(values):
    """``[[start, length], ...]``: consecutive ascending neighbours as one run."""
    out = []
    for v in values:
        if out and out[-1][0] + out[-1][1] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def encode(rows, dirs, digests=None):
    """``rows``: (index, dir slot, size, mode) in listing order; ``dirs``: the slots' paths;
    ``digests``: the rows' sha256 (32 bytes each, concatenated) or None."""
    out = {"count": len(rows), "dirs": list(dirs),
           "index": index_runs(r[0] for r in rows), "dir": runs(r[1] for r in rows),
           "mode": runs(r[3] for r in rows), "size": _ints(r[2] for r in rows)}
    if digests is not None:
        out["sha256"] = base64.b64encode(bytes(digests)).decode("ascii")
    return out


def _is_int(v, lo, hi):
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _expand(pairs, count, what, check):
    """Runs ``[[value, length], ...]`` as ``count`` values; ``check(value, length)`` holds each run."""
    if not isinstance(pairs, list):
        raise ValueError("%s: not a list of runs" % what)
    total = 0
    for p in pairs:
        if not (isinstance(p, list) and len(p) == 2 and _is_int(p[1], 1, MAX_FILES) and check(p[0], p[1])):
            raise ValueError("%s: a run is not [value, length] with a value of its kind" % what)
        total += p[1]
    if total != count:
        raise ValueError("%s: its runs hold %d values, not %d" % (what, total, count))
    return pairs


class Columns:
    """One directory's listed sample files as columns: ``index``, ``size`` (array 'q'), ``mode``
    (array 'H'), ``slot`` (array 'B': ``dirs[slot]`` is the file's directory), ``sha`` (bytes, 32 a
    file, or None). ``record(k)`` is file k as the dict of the old listing."""

    def __init__(self, dirs, base, index=None, size=None, mode=None, slot=None, sha=None):
        self.dirs, self.base = list(dirs), base
        self.index = index if index is not None else array.array("q")
        self.size = size if size is not None else array.array("q")
        self.mode = mode if mode is not None else array.array("H")
        self.slot = slot if slot is not None else array.array("B")
        self.sha = sha

    def __len__(self):
        return len(self.index)

    def sha256(self, k):
        return self.sha[k * DIGEST:(k + 1) * DIGEST].hex() if self.sha is not None else None

    def dir_of(self, k):
        d = self.dirs[self.slot[k]]
        return None if d == self.base else d

    def record(self, k):
        i = self.index[k]
        rec = {"index": i, "name": layout.name(i), "size": self.size[k], "mode": self.mode[k]}
        d = self.dir_of(k)
        if d is not None:
            rec["dir"] = d
        if self.sha is not None:
            rec["sha256"] = self.sha256(k)
        return rec

    def __iter__(self):
        return (self.record(k) for k in range(len(self)))

    def append(self, rec, slot):
        """One admitted record of the old form (``index``, ``size``, ``mode``, ``sha256``)."""
        self.index.append(rec["index"])
        self.size.append(rec["size"])
        self.mode.append(rec.get("mode", 0o600))
        self.slot.append(slot)
        if self.sha is not None:
            if not isinstance(self.sha, bytearray):
                self.sha = bytearray(self.sha)
            self.sha += bytes.fromhex(rec["sha256"])

    def in_order(self):
        """Whether the columns are ordered by (index, slot) (a pass, nothing kept)."""
        index, slot = self.index, self.slot
        return all(index[k] < index[k + 1] or (index[k] == index[k + 1] and slot[k] <= slot[k + 1])
                   for k in range(len(index) - 1))

    def sorted(self):
        """The columns ordered by (index, slot), as the agent lists them (themselves when they are)."""
        if self.in_order():
            return self
        order = sorted(range(len(self)), key=lambda k: (self.index[k], self.slot[k]))
        out = Columns(self.dirs, self.base, sha=bytearray() if self.sha is not None else None)
        for k in order:
            out.index.append(self.index[k])
            out.size.append(self.size[k])
            out.mode.append(self.mode[k])
            out.slot.append(self.slot[k])
            if self.sha is not None:
                out.sha += self.sha[k * DIGEST:(k + 1) * DIGEST]
        return out


def decode(doc, base, allowed_dirs):
    """The ``packed`` answer as ``Columns``, every value held to its kind: indexes ints >= 0, sizes
    >= 0, modes file modes, directories among ``allowed_dirs`` (clean, the listing's), digests 32
    bytes a file. ValueError names what is wrong."""
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    n = doc.get("count")
    if not _is_int(n, 0, MAX_FILES):
        raise ValueError("count: not an int >= 0")
    dirs = doc.get("dirs")
    if not (isinstance(dirs, list) and 1 <= len(dirs) <= 255 and all(d in allowed_dirs for d in dirs)):
        raise ValueError("dirs: not a list of the output's directories")
    idx = _expand(doc.get("index"), n, "index", lambda v, ln: _is_int(v, 0, (1 << 62) - ln))
    slots = _expand(doc.get("dir"), n, "dir", lambda v, ln: _is_int(v, 0, len(dirs) - 1))
    modes = _expand(doc.get("mode"), n, "mode", lambda v, ln: _is_int(v, 0, 0o7777))
    cols = Columns(dirs, base, size=_sized(doc.get("size"), n))
    for start, ln in idx:
        cols.index.extend(range(start, start + ln))
    for v, ln in slots:
        cols.slot.extend([v] * ln)
    for v, ln in modes:
        cols.mode.extend([v] * ln)
    if "sha256" in doc:
        cols.sha = _digests(doc.pop("sha256"), n)      # taken out: its text is freed as soon as it is read
    return cols


def _digests(text, n, step=1 << 22):
    """``n`` digests from their base64 ``text``, decoded a slice at a time into one bytearray (never
    a second copy of the whole text)."""
    if not isinstance(text, str) or len(text) != 4 * ((n * DIGEST + 2) // 3):
        raise ValueError("sha256: not the base64 of 32 bytes for each of %d files" % n)
    out = bytearray()
    try:
        for k in range(0, len(text), step):
            out += base64.b64decode(text[k:k + step], validate=True)
    except ValueError as exc:
        raise ValueError("sha256: %s" % exc) from None
    if len(out) != n * DIGEST:
        raise ValueError("sha256: %d bytes, not 32 for each of %d files" % (len(out), n))
    return out


def _sized(text, n):
    try:
        sizes = _unints(text, n)
    except (ValueError, zlib.error, UnicodeEncodeError) as exc:
        raise ValueError("size: %s" % exc) from None
    if any(s < 0 for s in sizes):
        raise ValueError("size: a size below 0")
    return sizes
