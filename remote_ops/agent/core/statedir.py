"""The agent's private state directory on the host: ``$REMOTE_OPS_STATE_DIR``, default ``~/.remote-ops``.

Jobs live in ``jobs/``, the patch journal, lock and transactions beside it (``agent/jobs.py``,
``agent/patching.py``). Every directory is private (0700); one of ours found with group or other
bits is tightened, one of another user is left as it is (the operation then fails on its files).
"""

import os
import stat


def root():
    return os.environ.get("REMOTE_OPS_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".remote-ops")


def ensure_private(path):
    """Create ``path`` (and missing parents) 0700; tighten it when it is ours and readable by others."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def private_dir(*parts):
    """``root()/parts...``, each level private."""
    path = ensure_private(root())
    for part in parts:
        path = ensure_private(os.path.join(path, part))
    return path
