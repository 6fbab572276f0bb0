"""The patch journal on the host (stdlib only): ``journal/journal.jsonl``, one JSON line per
committed transaction, and the write-ahead ``intent.json`` of a transaction in flight; the exclusive
create + fsync write every backup, temporary file and intent goes through. Layout and crash safety:
see ``patching.py``.
"""

import json
import os

from ..core.atomic import fsync_dir as _fsync_dir
from ..protocol import AgentFailure
from ..core.statedir import ensure_private as _ensure_private_dir
from ..core.statedir import root as _state_dir


def _journal_dir():
    return os.path.join(_state_dir(), "journal")


def _write_new(path, data, mode):
    """Create ``path`` (never overwriting), write, fsync. Removes the partial file on failure."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    os.close(fd)


def _write_json_atomic(path, obj):
    tmp = path + ".tmp-%d" % os.getpid()
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    _write_new(tmp, json.dumps(obj, indent=1).encode(), 0o600)
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _journal_path():
    return os.path.join(_journal_dir(), "journal.jsonl")


def _read_journal():
    """(entries, corrupt): ``corrupt`` lists every line that is not a JSON object, except a torn
    last line (no newline: a crash mid-append, whose transaction still has its intent and is
    recovered), which is skipped."""
    try:
        with open(_journal_path(), "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return [], []
    lines = raw.split(b"\n")
    out, corrupt = [], []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict):
            out.append(entry)
        elif not (i == len(lines) - 1 and entry is None):   # the torn tail has no newline after it
            corrupt.append({"line": i + 1, "text": line[:80].decode("utf-8", "replace")})
    return out, corrupt


def _journal_entries():
    """Every journal entry; a corrupt journal refuses (acting on a partial history could undo a
    committed transaction or roll back the wrong one)."""
    entries, corrupt = _read_journal()
    if corrupt:
        raise AgentFailure("journal-corrupt", "the patch journal %s is corrupt: line %s is not a journal entry "
                           "(%r); refusing to act on a partial history" % (
                               _journal_path(), ", ".join(str(c["line"]) for c in corrupt[:5]), corrupt[0]["text"]),
                           "repair or move that line by hand (remote-ops history lists the readable entries); "
                           "nothing was changed", corrupt=corrupt)
    return entries


def _journal_append(entry):
    _ensure_private_dir(_journal_dir())
    path = _journal_path()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        # a torn tail from a crash mid-append (its transaction was recovered from its intent before
        # this append) is cut off, so that it never becomes a corrupt line in the middle
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as fh:
                data = fh.read()
            if not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
                try:
                    json.loads(data[keep:])
                    os.write(fd, b"\n")          # complete entry, only its newline was lost
                except ValueError:
                    os.truncate(path, keep)
        os.write(fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _pending_intents():
    jd = _journal_dir()
    try:
        names = os.listdir(jd)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(jd, n, "intent.json") for n in names
                  if os.path.exists(os.path.join(jd, n, "intent.json")))
