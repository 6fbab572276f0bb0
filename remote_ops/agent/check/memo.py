"""A static check's result, kept in the host's agent cache with the reads it was computed from.

Checking the package's calls against the installed library parses and resolves dozens of library
modules: most of a patch's host CPU (its verification checks the old and the new text) and of a
``check``. The result depends only on the check's arguments, the agent's code, the interpreter and
what the check read from the disk (``reads.Reads``: module locations, file bytes, package listings,
distribution metadata). ``cached(kind, args, compute)`` keeps the result with the log of those
reads, in the agent cache entry of this agent's code (``BOOT["cache_dir"]``, which only this code
uses: other agent code never sees it), under a key made of the arguments and the interpreter. It
is reused only when every read, done again, sees what it saw: the same spec for every module
looked up (a new file that shadows one is a different spec), the same sha256 for every file read,
the same package listings and distributions. Anything else recomputes it; so does a damaged
entry (checked against its own sha256), a directory that is not private, a result whose reads
cannot be replayed (``reads.opaque``: runtime mode, a distribution only importlib.metadata finds),
and a host without the agent cache (``REMOTE_OPS_AGENT_CACHE=off``, an unwritable home).

What an entry trusts is the user's own cache directory (mode 0700, owned by the user): whoever can
write there can already change the agent's code in the same place, and the files being checked.
"""

import os
import stat
import sys

from ..core import jsonio
from ..core.digest import sha256_hex as digest
from ..protocol import BOOT, MEMO
from ..core.reads import Reads, unchanged

STORE = "check-memo"   # in the agent cache entry
LIMIT = 64             # entries kept (a drift check's is ~0.4 MB); the oldest beyond are removed


def _canon(obj):
    """One text per value, whatever the order of a dict's keys (the key of an entry)."""
    if isinstance(obj, dict):
        return "{" + ",".join("%r:%s" % (str(k), _canon(obj[k])) for k in sorted(obj, key=str)) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(_canon(v) for v in obj) + "]"
    return repr(obj)


def key(kind, args):
    return digest(_canon([kind, args, sys.executable, sys.version, list(sys.path)]).encode("utf-8"))


def _private(path):
    st = os.lstat(path)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _count(what):
    MEMO[what] = MEMO.get(what, 0) + 1


def _store_dir():
    """The memo's directory in this agent's cache entry (made on first use), when both are private."""
    base = BOOT.get("cache_dir")
    if not base:
        return None
    d = os.path.join(base, STORE)
    try:
        if not os.path.lexists(d):
            try:
                os.mkdir(d, 0o700)
            except FileExistsError:
                pass
        return d if _private(base) and _private(d) else None
    except OSError:
        return None


def _load(d, k):
    path = os.path.join(d, k + ".json")
    try:
        with open(path, "rb") as fh:
            blob = fh.read()
        head, _, body = blob.partition(b"\n")
        if head != digest(body).encode("ascii"):
            raise ValueError("damaged")
        entry = jsonio.loads(body.decode("utf-8"))
        if entry.get("key") != k or not isinstance(entry.get("reads"), list):
            raise ValueError("not this entry")
        return entry
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        try:
            os.unlink(path)   # damaged: removed, recomputed and stored again
        except OSError:
            pass
        _count("damaged")
        return None


def _save(d, k, log, result):
    body = jsonio.dumps({"key": k, "reads": log, "result": result}, str).encode("utf-8")
    tmp = os.path.join(d, ".tmp-%d-%s" % (os.getpid(), os.urandom(6).hex()))
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(digest(body).encode("ascii") + b"\n" + body)
        os.replace(tmp, os.path.join(d, k + ".json"))
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return
    _prune(d)


def _prune(d):
    try:
        names = [n for n in os.listdir(d) if n.endswith(".json")]
        if len(names) <= LIMIT:
            return
        aged = sorted(names, key=lambda n: os.stat(os.path.join(d, n)).st_mtime_ns)
        for n in aged[:len(names) - LIMIT]:
            os.unlink(os.path.join(d, n))
    except OSError:
        pass


def cached(kind, args, compute):
    """``compute(reads)``'s result, reused from the store while its reads are unchanged.

    ``args`` must hold everything the computation takes besides its reads (JSON values)."""
    d = _store_dir()
    if d is None:
        return compute(Reads())
    k = key(kind, args)
    entry = _load(d, k)
    if entry is not None:
        if unchanged(entry["reads"]):
            _count("hit")
            return entry["result"]
        _count("stale")
    reads = Reads(record=True)
    result = compute(reads)
    _count("miss")
    if reads.opaque is None:
        # stored as the wire carries it: a hit returns exactly what this result becomes there
        _save(d, k, reads.log, result)
    return result
