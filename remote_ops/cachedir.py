"""The controller's cache root: $REMOTE_OPS_CACHE, else $XDG_CACHE_HOME/remote-ops, else ~/.cache/remote-ops.

Holds PyPI wheels and unpacked sources (pkgsource) and computed patch plans (plancache);
``write_private`` is how its JSON entries are written.
Import-light on purpose: the patch command reads it on every run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("REMOTE_OPS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "remote-ops")
    p = Path(root)
    p.mkdir(parents=True, exist_ok=True)
    return p


def write_private(path: Path, entry: dict) -> None:
    """Atomic, private; a cache that cannot be written is only a missed speed-up."""
    try:
        path.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        import tempfile
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(json.dumps(entry).encode())
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
