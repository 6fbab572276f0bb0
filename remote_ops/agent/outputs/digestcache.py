"""The sha256 this host computed before for an output directory's sample files, kept between gathers.

One file per output directory in the agent's private state directory (``digests/<key>.bin``): a
header line ``remote-ops-digests/2``, a JSON line naming the directories, then one fixed-size record
a file (index, directory, size, mtime_ns, ctime_ns, inode, 32 raw digest bytes) in the listing's
order (index, directory). It is read streaming, merged with the listing in one pass, and written
whole (temporary + rename) from the listing: a few dozen bytes a file on disk and nothing per file
in memory. A job's atomic writes give a rewritten file another inode and ctime, so a record whose
stat values are still the file's is the same bytes. The ``.json`` dict of earlier versions
({path: [size, mtime_ns, ctime_ns, inode, hex]}) is still read once, then replaced. A file that
does not parse is ignored (everything is hashed again) and replaced. Stdlib only: the agent ships it.
"""

import json
import os
import struct

MAGIC = b"remote-ops-digests/2\n"
RECORD = struct.Struct("<qHqqqQ32s")       # index, directory, size, mtime_ns, ctime_ns, inode, sha256
CHUNK = 4096                               # records read at a time


def path_of(out_dir, ext=".bin"):
    import hashlib
    from ..core import statedir
    key = hashlib.sha256(os.path.realpath(out_dir).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(statedir.private_dir("digests"), key + ext)


def _records(fh, slot_of):
    """(index, slot, size, mtime, ctime, inode, digest) of each record whose directory is one of the
    listing's (``slot_of``: the file's directory number -> the listing's slot)."""
    while True:
        block = fh.read(RECORD.size * CHUNK)
        if len(block) % RECORD.size:
            raise ValueError("a record cut short")
        if not block:
            return
        for i, d, size, mtime, ctime, ino, sha in RECORD.iter_unpack(block):
            slot = slot_of.get(d)
            if slot is not None:
                yield i, slot, size, mtime, ctime, ino, sha


def _open(out_dir, dirs):
    """The kept file opened past its header, with the map of its directory numbers to ``dirs``'
    slots; None when there is none, or it is not of this format, or its directories' order differs."""
    try:
        fh = open(path_of(out_dir), "rb")
    except OSError:
        return None
    try:
        if fh.readline() != MAGIC:
            raise ValueError("not a digest file")
        names = json.loads(fh.readline().decode("utf-8", "surrogateescape"))
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise ValueError("no directories")
        slot = {d: k for k, d in enumerate(dirs)}
        slot_of = {n: slot[d] for n, d in enumerate(names) if d in slot}
        kept = [slot_of[n] for n in sorted(slot_of)]
        if kept != sorted(kept):        # the listing's order is another: nothing merges (hashed again)
            raise ValueError("directories reordered")
        return fh, slot_of
    except (ValueError, UnicodeError):
        fh.close()
        return None


def reuse(out_dir, dirs, rows, digests, key):
    """Each row's kept digest into ``digests`` (32 bytes a row; zeros where none) when the file's
    (size, mtime, ctime, inode) are still those it was hashed at. ``rows``: (index, dir slot, size,
    mode, mtime_ns, ctime_ns, inode) sorted by (index, slot); ``key(row)`` its path (for the old
    format). Returns (the positions of the rows to hash, how many records the file held that did not
    match: a positive count or a file to replace means it must be written again)."""
    opened = _open(out_dir, dirs)
    if opened is None:
        return _reuse_json(out_dir, rows, digests, key)
    fh, slot_of = opened
    start, todo, unmatched = len(digests), [], 0
    try:
        with fh:
            kept = _records(fh, slot_of)
            cur = next(kept, None)
            for k, r in enumerate(rows):
                while cur is not None and (cur[0], cur[1]) < (r[0], r[1]):
                    unmatched += 1
                    cur = next(kept, None)
                if cur is not None and cur[:2] == (r[0], r[1]) and cur[2:6] == (r[2], r[4], r[5], r[6]):
                    digests += cur[6]
                    cur = next(kept, None)
                else:
                    digests += bytes(32)
                    todo.append(k)
            unmatched += sum(1 for _ in kept) + (cur is not None)
    except (OSError, ValueError):       # cut short or unreadable: every file is hashed, the file replaced
        del digests[start:]
        digests += bytes(32 * len(rows))
        return list(range(len(rows))), 1
    return todo, unmatched


def _reuse_json(out_dir, rows, digests, key):
    """``reuse`` from the ``.json`` of earlier versions, when there is one (always rewritten)."""
    try:
        with open(path_of(out_dir, ".json"), encoding="utf-8") as fh:
            known = json.load(fh)
    except (OSError, ValueError):
        known = None
    if not isinstance(known, dict):      # none kept (or a file that does not parse: replaced)
        digests += bytes(32 * len(rows))
        return list(range(len(rows))), int(os.path.exists(path_of(out_dir)))
    todo = []
    for k, r in enumerate(rows):
        e = known.get(key(r))
        raw = _raw(e[4]) if isinstance(e, list) and len(e) == 5 and e[:4] == [r[2], r[4], r[5], r[6]] else None
        digests += raw if raw is not None else bytes(32)
        if raw is None:
            todo.append(k)
    return todo, 1


def _raw(v):
    """A kept digest's 32 bytes, or None when it is not 64 hex digits."""
    try:
        raw = bytes.fromhex(v) if isinstance(v, str) else b""
    except ValueError:
        return None
    return raw if len(raw) == 32 else None


def save(out_dir, dirs, rows, digests):
    """The rows' digests kept (the file written whole: temporary + rename; the old ``.json`` removed).
    A read-only state directory keeps nothing: the next gather hashes again."""
    try:
        path = path_of(out_dir)
        tmp = "%s.%d.tmp" % (path, os.getpid())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(MAGIC)
            fh.write(json.dumps(list(dirs)).encode("utf-8", "surrogateescape") + b"\n")
            buf = bytearray()
            for k, r in enumerate(rows):
                buf += RECORD.pack(r[0], r[1], r[2], r[4], r[5], r[6], bytes(digests[k * 32:(k + 1) * 32]))
                if len(buf) >= RECORD.size * CHUNK:
                    fh.write(buf)
                    buf = bytearray()
            fh.write(buf)
        os.replace(tmp, path)
    except (OSError, struct.error):
        return
    try:
        os.unlink(path_of(out_dir, ".json"))
    except OSError:
        pass
