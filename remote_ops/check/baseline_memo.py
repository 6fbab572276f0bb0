"""The baseline's drift facts, kept on disk between commands.

The baseline `check` compares against is an unpacked PyPI release in the source cache
(``pkgsource.unpacked``), which never changes, so the same touches give the same facts: computing
them (the static resolver over the release, the class-hierarchy scan of issue 27) is done once per
release, touches and version of this package's agent code. A baseline given as a directory of the
user's (``--baseline DIR``) is never kept: it may change. ``REMOTE_OPS_DRIFT_CACHE`` names another
directory; an unreadable or damaged entry is recomputed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

ENV = "REMOTE_OPS_DRIFT_CACHE"
FORMAT = 1


def _dir() -> Path:
    from remote_ops.cachedir import cache_dir

    return Path(os.environ.get(ENV) or cache_dir() / "drift-baseline")


@functools.lru_cache(maxsize=1)
def _code() -> str:
    """The agent code that computes the facts (every module the bundle ships) and the Python."""
    import sys

    from remote_ops.connect.bundle import agent_source_files

    h = hashlib.sha256(f"{FORMAT} {sys.version_info[0]}.{sys.version_info[1]}".encode())
    for key, p in agent_source_files().items():
        h.update(key.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _kept(b: dict) -> bool:
    """Only a release unpacked in the source cache (immutable) is kept."""
    from remote_ops.cachedir import cache_dir

    try:
        Path(b["path"]).resolve().relative_to((cache_dir() / "src").resolve())
    except (KeyError, ValueError, OSError):
        return False
    return True


def entry(b: dict, touches: list) -> Path | None:
    """The file that keeps the facts of these touches against baseline ``b``; None when ``b`` is
    not kept (a directory of the user's)."""
    if not _kept(b):
        return None
    key = json.dumps({"library": b.get("library"), "version": b.get("version"), "path": b.get("path"),
                      "touches": touches, "code": _code()}, sort_keys=True, default=str)
    return _dir() / (hashlib.sha256(key.encode()).hexdigest() + ".json")


def get(f: Path | None):
    """The facts kept in entry ``f``, else None."""
    if f is None:
        return None
    try:
        doc = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return doc.get("facts") if isinstance(doc, dict) and doc.get("format") == FORMAT else None


def put(f: Path | None, facts) -> None:
    """Keep ``facts`` in entry ``f`` (written whole or not at all; a failure to write only costs the
    next run)."""
    if f is None:
        return
    tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"format": FORMAT, "facts": facts}, default=str))
        os.replace(tmp, f)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
