"""What wrote a results file: the script, as a path in this repository, and the commit of the checkout it ran in.

Every writer under benchmarks/ records both (``written_by``: a JSON key, or a report's first lines); a renderer
shows them for each file it reads, and says "commit: not recorded" for a file written before they were recorded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def script(path: str | Path | None = None) -> str:
    """``path`` (default: the script this process runs) as a path in the repository: benchmarks/gpu/throughput.py."""
    p = Path(path or getattr(sys.modules.get("__main__"), "__file__", None) or sys.argv[0]).resolve()
    try:
        return p.relative_to(REPO).as_posix()
    except ValueError:
        return p.name


def commit() -> str | None:
    """The checkout's commit (short), "+uncommitted" when tracked files differ from it; None without git (a copy)."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+uncommitted" if dirty else "")


def written_by(path: str | Path | None = None, rev: str | None = None) -> dict:
    """The ``written_by`` of a results file: its script and commit (``rev`` when the run was told it: a GPU machine's
    copy of the checkout has no .git)."""
    return {"script": script(path), "commit": rev or commit() or "not recorded"}


def shown(doc: dict, script_then: str | None = None) -> str:
    """A results document's writer for a report: "`script`, commit C". A document from before ``written_by`` names
    ``script_then`` (the script's path when it ran) and its ``code_rev`` when it has one, else "commit: not recorded"."""
    w = doc.get("written_by") or {}
    name = w.get("script") or script_then or "script not recorded"
    rev = w.get("commit") or doc.get("code_rev")
    return f"`{name}`, " + (f"commit {rev}" if rev else "commit: not recorded")
