"""gather's compact state on the controller: the hosts' listings as columns, the chosen files per host,
the destination's sample indexes as a bitmap and the manifest beside the gathered files, each a few
bytes a file (arrays), never a dict per file; a file's dict exists only while it is copied."""

from __future__ import annotations

import array
import base64
import binascii
import bisect
import heapq
import json
import os
import tempfile
import threading

from remote_ops.agent.outputs import layout, packed

DIGEST = packed.DIGEST


class ListColumns:
    """A listing's files given as dicts (tests, hand-made listings): the ``packed.Columns`` reading
    interface over them, ordered by index (stably)."""

    def __init__(self, files: list, base: str):
        self.files = sorted(files, key=lambda f: f["index"])
        self.index = [f["index"] for f in self.files]
        self.base = base

    def __len__(self):
        return len(self.files)

    def record(self, k: int) -> dict:
        return self.files[k]

    def __iter__(self):
        return iter(self.files)


def columns(files, base: str):
    """``files`` as columns: admitted ``packed.Columns`` as they are, a list of dicts wrapped."""
    return files if isinstance(files, packed.Columns) else ListColumns(list(files), base)


def holders(cols_list: list) -> "iter":
    """``(index, [(n, k), ...])`` in index order: for each index, the directories ``n`` holding it and
    the position ``k`` of its first file there (each directory's columns sorted by index)."""
    def stream(n, c):
        index = c.index
        return ((index[k], n, k) for k in range(len(c)))
    streams = [stream(n, c) for n, c in enumerate(cols_list)]
    cur_i, cur = None, []
    for i, n, k in (streams[0] if len(streams) == 1 else heapq.merge(*streams)):
        if i != cur_i:
            if cur:
                yield cur_i, cur
            cur_i, cur = i, []
        if not cur or cur[-1][0] != n:      # an index twice in one output (two of its dirs): the first
            cur.append((n, k))
    if cur:
        yield cur_i, cur


class Items:
    """The chosen files, as (directory, position) pairs in index order; ``per_host`` splits them into
    each host's ``HostItems`` (a sequence of item dicts made on demand)."""

    def __init__(self, dirs: list[dict], file_path):
        self.dirs, self.file_path = dirs, file_path
        # 2 + 4 bytes a chosen file (directories and positions are small: a listing holds < 50M files)
        self.dref, self.pos = array.array("H" if len(dirs) < 1 << 16 else "l"), array.array("I")

    def add(self, n: int, k: int) -> None:
        self.dref.append(n)
        self.pos.append(k)

    def per_host(self, listings) -> dict:
        out = {h: HostItems(self) for h in listings}
        for j in range(len(self.dref)):
            out[self.dirs[self.dref[j]]["host"]].refs.append(j)
        return out


class HostItems:
    """One host's chosen files: ``items[j]`` is ``{index, name, size, mode, sha256, [dir], host,
    path}``, made when asked."""

    def __init__(self, items: Items):
        self.items, self.refs = items, array.array("I")

    def __len__(self):
        return len(self.refs)

    def __getitem__(self, j: int) -> dict:
        it = self.items
        d = it.dirs[it.dref[self.refs[j]]]
        rec = d["cols"].record(it.pos[self.refs[j]])
        return {**rec, "host": d["host"], "path": it.file_path(d, rec)}

    def __iter__(self):
        return (self[j] for j in range(len(self)))


class Bitmap:
    """A set of sample indexes, one bit each (indexes past 2^27 in a set of their own)."""

    LIMIT = 1 << 27

    def __init__(self, values=()):
        self.bits, self.far, self.n = bytearray(), set(), 0
        for v in values:
            self.add(v)

    def add(self, i: int) -> None:
        if i >= self.LIMIT:
            if i not in self.far:
                self.far.add(i)
                self.n += 1
            return
        b = i >> 3
        if b >= len(self.bits):
            self.bits.extend(bytes(max(b + 1 - len(self.bits), len(self.bits))))
        if not self.bits[b] & (1 << (i & 7)):
            self.bits[b] |= 1 << (i & 7)
            self.n += 1

    def __contains__(self, i) -> bool:
        if not isinstance(i, int) or i < 0:
            return False
        if i >= self.LIMIT:
            return i in self.far
        b = i >> 3
        return b < len(self.bits) and bool(self.bits[b] & (1 << (i & 7)))

    def __len__(self):
        return self.n

    def __iter__(self):
        for b, byte in enumerate(self.bits):
            if byte:
                for j in range(8):
                    if byte & (1 << j):
                        yield b * 8 + j
        yield from sorted(self.far)


def local_indexes(to: str, beyond: int | None = None) -> tuple[Bitmap, list[str]]:
    """The sample files in the local destination (regular files with exactly a sample's name:
    layout.py; a link there is not a sample) as a bitmap of their indexes, and the names of those at
    or past ``beyond`` (sorted by index)."""
    out, far = Bitmap(), []
    with os.scandir(to) as it:
        for entry in it:
            i = layout.index_of(entry.name)
            if i is not None and entry.is_file(follow_symlinks=False):
                out.add(i)
                if beyond is not None and i >= beyond:
                    far.append((i, entry.name))
    return out, [n for _, n in sorted(far)]


class Manifest:
    """What a gather wrote into ``--to``: ``.remote-ops-gather.json`` beside the files, one entry per
    sample (size, sha256, the file's mtime and inode as gather left it, its source), kept as columns
    (``remote-ops-gather/2``; a ``/1`` file of a dict per name is read too). A rerun takes a
    destination file whose size, mtime and inode are still the entry's, and whose entry's sha256 is the
    host's, as already there without reading it (rsync's quick check); ``checksum`` hashes every one."""

    NAME = ".remote-ops-gather.json"
    COLS = ("size", "mtime", "ino")

    def __init__(self, to: str, checksum: bool = False):
        self.to, self.checksum, self.lock = to, checksum, threading.Lock()
        self.sources: list[str] = []
        self._source_id: dict[str, int] = {}
        self.old = self._empty()
        self.new = self._empty()
        try:
            fd = os.open(os.path.join(to, self.NAME), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                doc, sha = _load(fh)
            self.old = self._read(doc, sha)
        except (OSError, ValueError, TypeError, KeyError, binascii.Error):
            self.old = self._empty()
        self.changed = False

    @staticmethod
    def _empty() -> dict:
        return {"index": array.array("q"), "size": array.array("q"), "mtime": array.array("q"),
                "ino": array.array("q"), "source": array.array("I"), "sha": bytearray()}

    def _source(self, where: str) -> int:
        k = self._source_id.get(where)
        if k is None:
            k = self._source_id[where] = len(self.sources)
            self.sources.append(where)
        return k

    def _put(self, cols: dict, i: int, size: int, mtime: int, ino: int, sha: bytes, source: str) -> None:
        cols["index"].append(i)
        cols["size"].append(size)
        cols["mtime"].append(mtime)
        cols["ino"].append(ino)
        cols["source"].append(self._source(source.rsplit("/", 1)[0]))
        cols["sha"] += sha

    def _read(self, doc, sha: bytearray | None = None) -> dict:
        cols = self._empty()
        if not isinstance(doc, dict):
            return cols
        if doc.get("format") == "remote-ops-gather/1" and isinstance(doc.get("files"), dict):
            rows = []
            for name, e in doc["files"].items():
                i = layout.index_of(name)
                if i is not None and isinstance(e, list) and len(e) >= 5:
                    rows.append((i, e))
            for i, e in sorted(rows, key=lambda r: r[0]):
                self._put(cols, i, int(e[0]), int(e[1]), int(e[2]), bytes.fromhex(e[3]), str(e[4]))
            return cols
        if doc.get("format") != "remote-ops-gather/2":
            return cols
        n = doc["count"]
        idx = packed._expand(doc["index"], n, "index", lambda v, ln: packed._is_int(v, 0, (1 << 62) - ln))
        for start, ln in idx:
            cols["index"].extend(range(start, start + ln))
        for key in self.COLS:
            cols[key] = packed._unints(doc[key], n)
        self.sources = [str(s) for s in doc["sources"]]
        self._source_id = {s: k for k, s in enumerate(self.sources)}
        for v, ln in packed._expand(doc["source"], n, "source",
                                    lambda v, ln: packed._is_int(v, 0, len(self.sources) - 1)):
            cols["source"].extend([v] * ln)
        cols["sha"] = sha if sha is not None else bytearray(base64.b64decode(doc["sha256"]))
        index = cols["index"]
        if len(cols["sha"]) != n * DIGEST or any(index[k] >= index[k + 1] for k in range(len(index) - 1)):
            return self._empty()
        return cols

    def quick(self, name: str, st, it: dict) -> bool:
        if self.checksum:
            return False
        old, i = self.old, it["index"]
        k = bisect.bisect_left(old["index"], i)
        return (k < len(old["index"]) and old["index"][k] == i and old["size"][k] == st.st_size
                and old["mtime"][k] == st.st_mtime_ns and old["ino"][k] == st.st_ino
                and old["sha"][k * DIGEST:(k + 1) * DIGEST] == bytes.fromhex(it["sha256"]))

    def add(self, name: str, st, it: dict, source: str) -> None:
        with self.lock:
            self._put(self.new, it["index"], st.st_size, st.st_mtime_ns, st.st_ino, bytes.fromhex(it["sha256"]),
                      source)
            self.changed = True

    def _merged(self, present: Bitmap, sha: bool = True):
        """(index, size, mtime, ino, source id, sha) of every entry whose file is present, in index
        order: the newest entry of an index wins (``sha`` False: None for the sha)."""
        new, old = self.new, self.old
        order = _order(new["index"])
        a = b = 0
        while a < len(order) or b < len(old["index"]):
            ka = order[a] if a < len(order) else None
            ia = new["index"][ka] if ka is not None else None
            ib = old["index"][b] if b < len(old["index"]) else None
            if ib is None or (ia is not None and ia <= ib):
                src, k, a = new, ka, a + 1
                while a < len(order) and new["index"][order[a]] == ia:
                    a += 1          # older additions of the same index
                if ib == ia:
                    b += 1
            else:
                src, k, b = old, b, b + 1
            i = src["index"][k]
            if i in present:
                yield (i, src["size"][k], src["mtime"][k], src["ino"][k], src["source"][k],
                       bytes(src["sha"][k * DIGEST:(k + 1) * DIGEST]) if sha else None)

    def save(self, present: Bitmap | None = None) -> None:
        """The manifest written whole (temporary + rename): the entries' integer columns gathered in
        one pass, then the digests streamed from a second pass into the file's last field (never the
        whole base64 text in memory)."""
        if not self.changed:
            return
        if present is None:
            present = local_indexes(self.to)[0]
        cols = {"index": array.array("q"), "size": array.array("q"), "mtime": array.array("q"),
                "ino": array.array("q"), "source": array.array("I")}
        for i, size, mtime, ino, src, _ in self._merged(present, sha=False):
            for key, v in (("index", i), ("size", size), ("mtime", mtime), ("ino", ino), ("source", src)):
                cols[key].append(v)
        count = len(cols["index"])
        head = json.dumps({"format": "remote-ops-gather/2", "count": count, "sources": self.sources,
                           "index": packed.index_runs(cols["index"]), "source": packed.runs(cols["source"]),
                           **{key: packed._ints(cols[key]) for key in self.COLS}}, separators=(",", ":"))
        del cols

        def write(fh):
            fh.write(head[:-1].encode("utf-8") + b',"sha256":"')
            buf, n = bytearray(), 0
            for *_, sha in self._merged(present):
                buf += sha
                n += 1
                if len(buf) >= 3 * DIGEST * 8192:        # a multiple of 3 bytes: base64 without padding
                    fh.write(base64.b64encode(buf))
                    buf = bytearray()
            if n != count:
                raise RuntimeError("the manifest's entries changed while it was written")
            fh.write(base64.b64encode(buf) + b'"}')
        write_file(self.to, self.NAME, write)

    def entry(self, i: int) -> dict | None:
        """The entry of sample ``i`` as last saved or added: {size, mtime_ns, inode, sha256, source}."""
        for cols in (self.new, self.old):
            ks = [k for k in range(len(cols["index"])) if cols["index"][k] == i]
            if ks:
                k = ks[-1]
                return {"size": cols["size"][k], "mtime_ns": cols["mtime"][k], "inode": cols["ino"][k],
                        "sha256": bytes(cols["sha"][k * DIGEST:(k + 1) * DIGEST]).hex(),
                        "source": f"{self.sources[cols['source'][k]]}/{layout.name(i)}"}
        return None


_TRIM = []


def release_freed() -> None:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing): a
    gather frees large transients (the listing's text, the manifest's) and its copy threads' arenas
    keep what they freed, so without this the process's RSS holds the high-water mark of each phase."""
    if not _TRIM:
        try:
            import ctypes
            _TRIM.append(ctypes.CDLL(None).malloc_trim)
        except (OSError, AttributeError):
            _TRIM.append(None)
    if _TRIM[0] is not None:
        _TRIM[0](0)


def _order(index: array.array) -> array.array:
    """The positions of ``index`` sorted by (index, position descending): the newest addition of an
    index first. One int a position while sorting (index and position packed in one int), not a tuple."""
    n = len(index)
    if n and (max(index) >= 1 << 36 or n >= 1 << 26):        # beyond what one 63-bit key holds
        return array.array("q", sorted(range(n), key=lambda k: (index[k], -k)))
    span = 1 << 26
    keys = sorted(index[k] * span + (span - 1 - k) for k in range(n))
    out = array.array("q", (span - 1 - (key % span) for key in keys))
    return out


def _load(fh) -> tuple:
    """The manifest's JSON (``fh`` binary) as (doc, its digests): our own file's last field, ``sha256``'s
    base64, decoded a slice at a time into one bytearray (its text is never held whole); any other
    shape is parsed whole (doc, None)."""
    mark, head = b'"sha256":"', bytearray()
    while True:
        chunk = fh.read(1 << 20)
        if not chunk:
            return json.loads(bytes(head)), None
        start = max(0, len(head) - len(mark) + 1)
        head += chunk
        at = head.find(mark, start)
        if at >= 0:
            break
    rest = bytearray(head[at + len(mark):])
    del head[at + len(mark):]
    try:
        doc = json.loads(bytes(head) + b'"}')
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("sha256") != "":      # not our last field: parse the whole file
        fh.seek(0)
        return json.loads(fh.read()), None
    del head
    sha = bytearray()
    while True:
        q = rest.find(b'"')
        if q >= 0:
            if (bytes(rest[q + 1:]) + fh.read(64)).strip() != b"}":      # more after it: parse the whole file
                fh.seek(0)
                return json.loads(fh.read()), None
            sha += base64.b64decode(bytes(rest[:q]), validate=True)
            return doc, sha
        chunk = fh.read(1 << 20)
        if not chunk:
            raise ValueError("the manifest's sha256 is cut short")
        cut = len(rest) - len(rest) % 4
        sha += base64.b64decode(bytes(rest[:cut]), validate=True)
        rest = rest[cut:] + chunk


def write_file(to: str, name: str, write) -> None:
    """``name`` in ``to`` written whole by ``write(binary file)``: a fresh temporary (mkstemp: never
    through a pre-made link), fsynced, renamed onto it, the directory fsynced."""
    from remote_ops.agent.core import atomic
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=to)

    def done(path):
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
    atomic.replace(tmp, os.path.join(to, name), done)


def write_json(to: str, name: str, doc, **dump) -> None:
    """``name`` in ``to`` written whole as JSON (``write_file``)."""
    write_file(to, name, lambda fh: fh.write(json.dumps(doc, **dump).encode("utf-8")))
