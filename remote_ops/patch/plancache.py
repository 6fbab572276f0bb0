"""Compute a patch plan once: cached by (the playbook's edits, the target's sha256, the host's Python).

A target's plan is what ``patching.compute`` derives from its bytes with libcst and validation:
the new text, each edit's state and lines, and the diff body. It depends on nothing else (not
the host, not the file's path), so a rerun and every further host of a fleet holding the same
bytes reuse it: no libcst import, no edit, no validation. Nothing is trusted beyond that: the
host still compares the target's sha256 before it writes (compare-and-swap), so an entry can
never be applied to bytes other than those it was computed from.

Two levels:
- in the process: N hosts with the same file in one run compute the plan once (the first
  computes, the others wait for it);
- on disk, ``<cache>/plans/<playbook fingerprint>/<key>.json`` (cachedir.cache_dir(), dirs 0700,
  files 0600, written atomically); an entry must match its key and the sha256 of its new bytes,
  anything else is ignored and recomputed. ``REMOTE_OPS_PLAN_CACHE`` names another directory,
  or ``off`` turns this level off.

The same directory holds, per host, the state the host was in when a plan of this playbook last
changed something (``host-<key>.state``, hoststate.py): what a repeated patch sends its apply for.

Keys cover the code that computes plans (edits.py, validate.py, patching.py, this file, the module of
every registered edit kind, the installed libcst, the controller's Python minor version), so an
upgrade never reuses an old plan.
Failures (a refused or invalid edit) are never cached: they are recomputed and reported per host.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from remote_ops.cachedir import write_private

FORMAT = 2
ENV = "REMOTE_OPS_PLAN_CACHE"

_mem: dict[str, dict] = {}
_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _jsonable(o: Any):
    return sorted(o) if isinstance(o, (set, frozenset)) else str(o)


def code_fingerprint() -> str:
    """What computes a plan: this package's edit/validate code, the module of every registered edit
    kind (one registered outside edits.py included), libcst's install, the Python."""
    from remote_ops.playbook.edits import KINDS

    files = {getattr(sys.modules.get(k.__module__), "__file__", None) for k in KINDS.values()}
    return _code_fingerprint(tuple(sorted(f for f in files if f)))


@functools.lru_cache(maxsize=8)
def _code_fingerprint(kind_files: tuple[str, ...]) -> str:
    import importlib.util

    h = hashlib.sha256(f"{FORMAT} {sys.version_info[0]}.{sys.version_info[1]}".encode())
    here = Path(__file__).parent
    paths = [here.parent / "playbook" / "edits.py"] + [here / name for name in ("validate.py", "patching.py", "plancache.py")]
    for path in paths + [p for p in map(Path, kind_files) if p not in paths]:
        h.update(path.read_bytes())
    spec = importlib.util.find_spec("libcst")   # located, not imported
    if spec is not None and spec.origin:
        st = os.stat(spec.origin)
        h.update(f"{spec.origin} {st.st_size} {st.st_mtime_ns}".encode())
    return h.hexdigest()


_fps: dict[int, tuple[Any, str]] = {}   # id(patch) -> (patch, its edits' fingerprint)


def edits_fingerprint(patch) -> str:
    """The content of one patch target's edits (what the plan is computed from). Computed once
    per loaded target: a fleet's N hosts ask for it N times (a loaded playbook is never changed;
    the entry holds the target, so its id cannot be reused while it is there)."""
    hit = _fps.get(id(patch))
    if hit is not None and hit[0] is patch:
        return hit[1]
    data = [patch.label] + [dict(asdict(e), kind=e.kind) for e in patch.edits]
    fp = _sha(json.dumps(data, sort_keys=True, default=_jsonable).encode())
    with _guard:
        if len(_fps) >= 1024:
            _fps.clear()
        _fps[id(patch)] = (patch, fp)
    return fp


def book_fingerprint(pb) -> str:
    return _sha((code_fingerprint() + "".join(edits_fingerprint(p) for p in pb.patches)).encode())


def key(patch, target_sha256: str, python) -> str:
    py = ".".join(str(x) for x in list(python or [3, 10])[:2])
    return _sha(f"{code_fingerprint()} {edits_fingerprint(patch)} {target_sha256} {py}".encode())


_roots: dict[tuple, Path] = {}   # (the environment naming it) -> the default root, created once


def _disk_root() -> Path | None:
    where = os.environ.get(ENV, "")
    if where.lower() == "off":
        return None
    if where:
        return Path(where)
    env = tuple(os.environ.get(k) for k in ("REMOTE_OPS_CACHE", "XDG_CACHE_HOME", "HOME"))
    root = _roots.get(env)
    if root is None:   # (asked a few times per host of a fleet: cache_dir() makes the directory)
        from remote_ops.cachedir import cache_dir
        root = _roots[env] = cache_dir() / "plans"
    return root


def clear_memory() -> None:
    """Forget the in-process level (tests; a long-lived process that wants to recompute)."""
    with _guard:
        _mem.clear()
        _locks.clear()
        _fps.clear()
        _seen.clear()


_seen: set[str] = set()   # (root, book fingerprint) found to have plans on disk in this process


def seen(pb) -> bool:
    """Whether plans of this playbook (this code) are on disk: a hint that libcst will not be needed
    (asked once per host of a fleet; a yes is remembered, a no is asked again)."""
    root = _disk_root()
    if root is None:
        return False
    d = root / book_fingerprint(pb)[:32]
    if str(d) in _seen:
        return True
    try:
        found = any(n.endswith(".json") for n in os.listdir(d))
    except OSError:
        return False
    if found:
        _seen.add(str(d))
    return found


def _valid(entry: Any, k: str) -> bool:
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != k:
        return False
    if entry.get("same"):
        return True
    text, enc = entry.get("new_text"), entry.get("encoding")
    if not isinstance(text, str) or not isinstance(enc, str):
        return False
    from remote_ops.playbook.edits import encode_source
    try:
        return _sha(encode_source(text, enc)) == entry.get("new_sha256")
    except (LookupError, UnicodeError):
        return False


def _load(path: Path, k: str) -> dict | None:
    try:
        with open(path, "rb") as fh:
            entry = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    return entry if _valid(entry, k) else None


def book_dir(pb) -> Path | None:
    """The directory of this playbook's plans (None: the disk level is off)."""
    root = _disk_root()
    return None if root is None else root / book_fingerprint(pb)[:32]


_PATH = "\x00target\x00"   # the target's path in cached notes (it differs between hosts)


def entry_for(k: str, result, encoding: str, new_bytes: bytes, *, notes: list[str] = (), path: str = "") -> dict:
    """The cacheable part of a computed target plan (``result``: edits.FileResult; ``notes``:
    what validation said it could not check, naming ``path``)."""
    out = {"format": FORMAT, "key": k, "same": not result.changed, "encoding": encoding,
           "results": [{"edit_id": r.edit_id, "state": r.state, "sites": list(r.sites),
                        "introduced": sorted(r.introduced)} for r in result.results],
           "notes": [n.replace(path, _PATH) if path else n for n in notes]}
    if result.changed:
        out.update(new_text=result.new_text, new_sha256=_sha(new_bytes), diff_body=result.diff_body())
    return out


def notes(entry: dict, path: str) -> list[str]:
    """The entry's validation notes, naming this host's path of the target."""
    return [str(n).replace(_PATH, path) for n in entry.get("notes") or []]


def file_result(entry: dict, path: str, old_text: str):
    """Rebuild the edits.FileResult of a target from its entry and the target's own text."""
    from remote_ops.playbook.edits import EditResult, FileResult

    results = [EditResult(r["edit_id"], r["state"], list(r["sites"]), set(r["introduced"]))
               for r in entry["results"]]
    new_text = old_text if entry.get("same") else entry["new_text"]
    return FileResult(path, old_text, new_text, results, cached_diff_body=entry.get("diff_body"))


def cached(pb, patch, target_sha256: str, python) -> dict | None:
    """The entry for ``patch`` on a target whose sha256 is ``target_sha256``, from memory or disk;
    None when it was never computed (nothing is computed here: the bytes are not known)."""
    k = key(patch, target_sha256, python)
    with _guard:
        if k in _mem:
            return _mem[k]
    d = book_dir(pb)
    entry = _load(d / f"{k}.json", k) if d is not None else None
    if entry is not None:
        _keep(k, entry)
    return entry


def _keep(k: str, entry: dict) -> None:
    with _guard:
        if len(_mem) >= 256:   # a long-lived API process patching many files: stay bounded
            _mem.clear()
        _mem[k] = entry


def plan(pb, patch, data: bytes, python, compute: Callable[[str], dict]) -> tuple[dict, bool]:
    """The entry for ``patch`` on a target holding ``data``: from memory, disk, or ``compute(key)``
    (which raises on a refused edit: nothing is cached then). Returns (entry, computed_here)."""
    k = key(patch, _sha(data), python)
    with _guard:
        if k in _mem:
            return _mem[k], False
        lock = _locks.setdefault(k, threading.Lock())
    with lock:
        if k in _mem:
            return _mem[k], False
        d = book_dir(pb)
        path = d / f"{k}.json" if d is not None else None
        entry = _load(path, k) if path is not None else None
        computed = entry is None
        if computed:
            entry = compute(k)
            if path is not None:
                write_private(path, entry)
        _keep(k, entry)
        return entry, computed
