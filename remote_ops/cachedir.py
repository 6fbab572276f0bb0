"""The controller's cache root: $REMOTE_OPS_CACHE, else $XDG_CACHE_HOME/remote-ops, else ~/.cache/remote-ops.

Holds PyPI wheels and unpacked sources (pkgsource) and computed patch plans (plancache).
Import-light on purpose: the patch command reads it on every run.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("REMOTE_OPS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "remote-ops")
    p = Path(root)
    p.mkdir(parents=True, exist_ok=True)
    return p
