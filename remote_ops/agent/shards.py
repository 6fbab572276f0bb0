"""Op ``shards.files``: an output directory's ``data_<N>.pt`` files, its data_config.json and its moved shares.

Only regular files count (a link is never followed, never hashed, never listed as a sample); names
are outputs/layout.py's rule: a name that only looks like a sample, and a sample name that is a link,
are listed apart (``odd``, ``links``) as problems, and so is a sample file that is not whole
(``broken``: layout.whole, a few bytes read).

The sharding rule itself (which indexes a shard holds, compact index lists) is ``outputs/shares.py``.
"""

import os

from .outputs import layout
from .outputs.shares import SHARD_DIR_RE

MAX_LISTED = 50


def op_files(args):
    """The output directory's data_<N>.pt files (index, size, and with ``digest`` their sha256),
    data_config.json's text, the ``shard-K-of-N`` subdirectories (moved shares), the directory's
    identity (agent/job/outputdir.py) and its run identity (``run_identity``). Streams
    ``{"hashed": bytes, "of": bytes}`` progress while hashing. With ``packed`` the files are columns
    (outputs/packed.py: about 50 bytes a file on the wire) instead of a dict each."""
    out_dir = os.path.expanduser(args.get("output_dir") or "")
    if not out_dir:
        from .protocol import AgentFailure
        raise AgentFailure("bad-args", "output_dir is required")
    if not os.path.isdir(out_dir):
        from .protocol import AgentFailure
        raise AgentFailure("no-output", "output directory %s does not exist on the host" % out_dir)
    from .outputs.run_identity import output_of
    dirs = output_of(out_dir)      # one output spread over several directories: all of them, as one
    # with digests, a file unchanged since it was hashed was whole then (only whole files are listed):
    # only the others are read for layout.whole (_digests)
    rows, subdirs, odd, links, broken = _scan(out_dir, dirs, check=not args.get("digest"))
    config_text = None
    try:
        with open(os.path.join(out_dir, "data_config.json"), encoding="utf-8") as fh:
            config_text = fh.read()
    except OSError:
        pass
    digests, reuse = None, None
    if args.get("digest"):
        digests = bytearray()
        reuse = yield from _digests(out_dir, dirs, rows, digests, broken)
    from .job import outputdir
    for d in dirs:
        try:      # a directory from before identities gets one now: one value whichever host name lists it
            outputdir.ensure_identity(d)
        except OSError:
            pass      # read-only: this boot's device and inode still tell a path listed twice on one machine
    # several directories: the output is the list of theirs (in run.json's order, whichever one was named)
    ident = "+".join(str(outputdir.identity(d)) for d in dirs) if len(dirs) > 1 else outputdir.identity(out_dir)
    if args.get("packed"):
        from .outputs import packed
        listed = {"packed": packed.encode(rows, dirs, digests)}
    else:
        listed = {"files": [_record(r, k, dirs, out_dir, digests) for k, r in enumerate(rows)]}
    return {"output_dir": out_dir, **({"output_dirs": dirs} if len(dirs) > 1 else {}), **listed,
            "config_text": config_text, "shard_dirs": sorted(subdirs),
            "odd": sorted(odd)[:MAX_LISTED], "odd_count": len(odd), "links": sorted(links)[:MAX_LISTED],
            "links_count": len(links), "broken": broken[:MAX_LISTED], "broken_count": len(broken),
            **({"digests": reuse} if reuse is not None else {}),
            "identity": ident, "run": run_identity(out_dir), "run_text": _run_text(out_dir)}


def _record(row, k, dirs, out_dir, digests):
    i, slot, size, mode = row[:4]
    rec = {"index": i, "name": layout.name(i), "size": size, "mode": mode,
           **({"dir": dirs[slot]} if dirs[slot] != out_dir else {})}
    if digests is not None:
        rec["sha256"] = bytes(digests[k * 32:(k + 1) * 32]).hex()
    return rec


def _scan(out_dir, dirs, check=True):
    """The directories' sample files as rows (index, dir slot, size, mode, mtime_ns, ctime_ns, inode)
    sorted by (index, slot); the moved shares' subdirectories; the odd names, links and broken files
    (``check`` False: whole or not is left to the caller)."""
    rows, subdirs, odd, links, broken = [], [], [], [], []
    for slot, d in enumerate(dirs):
        try:
            it = os.scandir(d)
        except FileNotFoundError:
            continue       # verify names a missing directory of the output
        with it:
            for entry in it:
                i = layout.index_of(entry.name)
                if i is not None:
                    st = entry.stat(follow_symlinks=False)
                    if not entry.is_file(follow_symlinks=False):
                        links.append(os.path.join(d, entry.name))
                        continue
                    problem = layout.whole(os.path.join(d, entry.name)) if check else None
                    if problem is not None:      # cut short: never listed as a sample to copy
                        broken.append({"file": os.path.join(d, entry.name), "problem": problem})
                        continue
                    rows.append((i, slot, st.st_size, st.st_mode & 0o777, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
                elif layout.is_odd(entry.name):
                    odd.append(os.path.join(d, entry.name))
                elif SHARD_DIR_RE.match(entry.name) and entry.is_dir(follow_symlinks=False) and d == out_dir:
                    subdirs.append(entry.name)
    rows.sort(key=lambda r: (r[0], r[1]))
    return rows, subdirs, odd, links, broken


def _digests(out_dir, dirs, rows, digests, broken=None):
    """Each row's sha256 appended to ``digests`` (32 bytes a row): the kept digest when the file's
    (size, mtime, ctime, inode) are still those it was hashed at (outputs/digestcache.py), else hashed
    now (progress events every 2 s). With ``broken`` (a list), each file not kept is first checked
    whole (layout.whole) and one that is not leaves ``rows`` for ``broken``. Returns {"reused",
    "hashed"}."""
    import hashlib
    import time
    from .outputs import digestcache

    def path(r):
        return os.path.join(dirs[r[1]], layout.name(r[0]))
    todo, unmatched = digestcache.reuse(out_dir, dirs, rows, digests, path)
    if broken is not None:
        todo = _drop_broken(rows, digests, todo, broken, path)
    total = sum(rows[k][2] for k in todo)
    done, last = 0, time.time()
    for k in todo:
        h = hashlib.sha256()
        fd = os.open(path(rows[k]), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
                done += len(chunk)
                if time.time() - last > 2:
                    last = time.time()
                    yield {"type": "progress", "hashed": done, "of": total}
        digests[k * 32:(k + 1) * 32] = h.digest()
    if todo or unmatched:
        digestcache.save(out_dir, dirs, rows, digests)
    return {"reused": len(rows) - len(todo), "hashed": len(todo)}


def _drop_broken(rows, digests, todo, broken, path):
    """The rows at ``todo`` that are not whole (layout.whole) moved from ``rows`` (and their 32 bytes
    from ``digests``) into ``broken``; ``todo`` of the rows left."""
    bad = set()
    for k in todo:
        problem = layout.whole(path(rows[k]))
        if problem is not None:      # cut short: never listed as a sample to copy
            broken.append({"file": path(rows[k]), "problem": problem})
            bad.add(k)
    if not bad:
        return todo
    keep = [k for k in range(len(rows)) if k not in bad]
    new_of = {k: j for j, k in enumerate(keep)}       # (some file is cut short: rare)
    digests[:] = b"".join(bytes(digests[k * 32:(k + 1) * 32]) for k in keep)
    rows[:] = [rows[k] for k in keep]
    return [new_of[k] for k in todo if k not in bad]


def _run_text(out_dir):
    """run.json's text (the whole run identity: gather writes the union's from it), or None."""
    try:
        with open(os.path.join(out_dir, "run.json"), encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def run_identity(out_dir):
    """What the directory's run.json says its files were made from, for comparing directories:
    ``digest`` (the whole identity, shard included), ``shard`` and ``run`` (sha256 of the identity
    without its shard and output directories: one value for every share of one run, wherever each
    host put its files); None without a readable run.json."""
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
    if isinstance(ident, dict):      # where the files are (output_dirs) is not what they are
        rest = {k: v for k, v in ident.items() if k not in ("shard", "output_dirs")}
        run = hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    shard = ident.get("shard") if isinstance(ident, dict) else None
    return {"digest": doc.get("digest") if isinstance(doc.get("digest"), str) else None,
            "shard": [shard.get("index"), shard.get("count")] if isinstance(shard, dict) else None,
            "run": run, "created": doc.get("created")}
