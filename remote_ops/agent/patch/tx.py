"""The patch transaction on the host (stdlib only): the host-wide lock, the write-ahead intent,
backups, compare-and-swap, atomic replaces, recovery of an interrupted transaction, and the test
hook that kills the agent at a named point. Crash safety: see ``patching.py``.
"""

import errno
import fcntl
import json
import os
import stat
import sys
import time
import uuid

from ..core import atomic
from ..core.atomic import fsync_dir as _fsync_dir
from ..core.digest import sha256_hex as _sha
from ..core.journal import (_journal_append, _journal_dir, _journal_entries, _pending_intents,
                      _write_json_atomic, _write_new)
from ..patch.targets import _invalidate_pyc
from ..protocol import AgentFailure
from ..core.statedir import ensure_private as _ensure_private_dir
from ..core.statedir import root as _state_dir


LOCK_TIMEOUT = 120.0


def _fault(point):
    """Test hook: ``REMOTE_OPS_FAULT=<point>`` kills the agent at that point (crash-safety tests);
    ``REMOTE_OPS_FAULT_MARK=<file>`` records that it fired (so a trial can tell a fault that hit a
    transaction from one whose point was never reached)."""
    if os.environ.get("REMOTE_OPS_FAULT") == point:
        mark = os.environ.get("REMOTE_OPS_FAULT_MARK")
        if mark:
            fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(fd, (point + "\n").encode())
            os.fsync(fd)
            os.close(fd)
        os._exit(137)


class _Lock:
    """fcntl.flock on the state dir's lock file, held by this process."""

    def __init__(self, timeout=None):
        self.timeout = LOCK_TIMEOUT if timeout is None else float(timeout)
        self.fd = None
        self.waited = 0.0

    def __enter__(self):
        _ensure_private_dir(_state_dir())
        path = os.path.join(_state_dir(), "lock")
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() - start > self.timeout:
                os.close(self.fd)
                raise AgentFailure("locked", "another remote-ops transaction holds the lock on this host "
                                   "for more than %gs" % self.timeout, "wait for it to finish, then rerun")
            time.sleep(0.05)
        self.waited = time.monotonic() - start
        return self

    def __exit__(self, *exc):
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)


def _restore_file(real, data, mode, uid, gid, tag):
    """Atomically put ``data`` at ``real`` keeping mode and owner (tmp beside it, fsync, rename)."""
    folder, base = os.path.split(real)
    tmp = os.path.join(folder, ".%s.remote-ops-%s.tmp" % (base, tag))
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    _write_new(tmp, data, 0o600)

    def prepare(path):
        _chown_like(path, uid, gid)
        os.chmod(path, mode)
    atomic.replace(tmp, real, prepare)


def _chown_like(path, uid, gid):
    st = os.stat(path)
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(path, uid, gid)


def _recover():
    """Undo every transaction that has a write-ahead intent but no journal line."""
    done = []
    committed = {e.get("txid") for e in _journal_entries()}
    for intent_path in _pending_intents():
        txdir = os.path.dirname(intent_path)
        try:
            with open(intent_path) as fh:
                intent = json.load(fh)
        except (OSError, ValueError):
            intent = {"txid": os.path.basename(txdir), "targets": [], "state": "torn"}
        txid = intent.get("txid")
        restored = []
        if txid not in committed and intent.get("state") == "ready":
            for t in intent.get("targets") or []:
                try:
                    with open(t["real"], "rb") as fh:
                        current = _sha(fh.read())
                except FileNotFoundError:
                    current = None
                if current == t["after"] and t["after"] != t["before"]:
                    with open(t["backup"], "rb") as fh:
                        original = fh.read()
                    if _sha(original) != t["before"]:
                        raise AgentFailure("backup-corrupt", "recovery of %s: backup %s does not match its "
                                           "checksum; left as is" % (txid, t["backup"]))
                    _restore_file(t["real"], original, t["mode"], t["uid"], t["gid"], "recover-" + txid)
                    _invalidate_pyc(t["real"])
                    restored.append(t["real"])
        for t in intent.get("targets") or []:
            tmp = t.get("tmp")
            if tmp and os.path.exists(tmp):
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        if txid not in committed:
            _journal_append({"id": txid + "-recovered", "txid": txid + "-recovered", "action": "recovered",
                             "of": txid, "of_action": intent.get("action"), "when": time.time(),
                             "restored": restored})
        os.unlink(intent_path)
        _fsync_dir(txdir)
        done.append({"txid": txid, "committed": txid in committed, "restored": restored})
    return done


def _new_txid():
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def _prepare_target(t):
    """Checks made before anything is written; returns the stat of the real file."""
    real = t["real"]
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise AgentFailure("not-file", "%s is not a regular file" % real)
    if st.st_nlink > 1:
        raise AgentFailure("hardlinked", "%s has %d hard links; replacing it would split them" % (
            real, st.st_nlink), "patch a copy, or break the links first")
    if os.geteuid() != 0 and st.st_uid != os.geteuid():
        raise AgentFailure("other-owner", "%s belongs to uid %d, not to the SSH user (uid %d): its owner "
                           "cannot be kept" % (real, st.st_uid, os.geteuid()),
                           "connect as the file's owner")
    folder = os.path.dirname(real)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise AgentFailure("read-only", "cannot write in %s (needed for an atomic replace of %s)" % (
            folder, os.path.basename(real)), "make the directory writable for the SSH user")
    return st


def _transact(action, changes, meta, lock_timeout=None):
    """Apply ``changes`` ([{real, label, expected, data(bytes), [ module ]}]) as one transaction.

    Caller holds the lock. Returns the journal entry, or None when every target already has its new bytes.
    """
    todo = []
    for c in changes:
        st = os.stat(c["real"])
        with open(c["real"], "rb") as fh:
            current = fh.read()
        cur_sha = _sha(current)
        after = _sha(c["data"])
        if cur_sha == after:
            continue                       # already in place (a concurrent controller did it)
        if cur_sha != c["expected"] and not c.get("force"):
            raise AgentFailure("changed", "%s changed underneath: sha256 %s..., expected %s..." % (
                c["real"], cur_sha[:12], c["expected"][:12]),
                "nothing was changed; rerun to compute the edits from the current file")
        st = _prepare_target(c)
        try:
            compile(c["data"], c["real"], "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            raise AgentFailure("compile", "new text of %s does not compile on the host's Python %s: %s" % (
                c["real"], ".".join(map(str, sys.version_info[:3])), exc))
        todo.append(dict(c, before=cur_sha, after=after, original=current, st=st))
    if not todo:
        return None
    txid = _new_txid()
    txdir = os.path.join(_journal_dir(), txid)
    _ensure_private_dir(_journal_dir())
    os.mkdir(txdir, 0o700)
    intent_path = os.path.join(txdir, "intent.json")
    records = []
    for i, c in enumerate(todo):
        folder, base = os.path.split(c["real"])
        mode = stat.S_IMODE(c["st"].st_mode)
        records.append({
            "label": c.get("label"), "module": c.get("module"), "real": c["real"],
            "before": c["before"], "after": c["after"], "mode": mode,
            "uid": c["st"].st_uid, "gid": c["st"].st_gid,
            "backup": os.path.join(txdir, "%d-%s.orig" % (i, base)),
            "tmp": os.path.join(folder, ".%s.remote-ops-%s.tmp" % (base, txid)),
        })
    intent = {"txid": txid, "action": action, "state": "prepare", "targets": records}
    _write_json_atomic(intent_path, intent)
    try:
        for c, r in zip(todo, records):
            # backup: never more readable than the original, never overwritten (O_EXCL, unique txid)
            _write_new(r["backup"], c["original"], 0o600 & (r["mode"] | 0o200))
            _write_new(r["tmp"], c["data"], 0o600)
            _chown_like(r["tmp"], r["uid"], r["gid"])
            os.chmod(r["tmp"], r["mode"])
        _fsync_dir(txdir)
        intent["state"] = "ready"
        _write_json_atomic(intent_path, intent)
    except OSError as exc:
        for r in records:
            for p in (r["tmp"], r["backup"]):
                try:
                    os.unlink(p)
                except OSError:
                    pass
        os.unlink(intent_path)
        os.rmdir(txdir)
        kind = "disk-full" if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "write-failed"
        raise AgentFailure(kind, "could not stage the new files: %s (%s); nothing was changed" % (
            exc.strerror, getattr(exc, "filename", "") or ""), "free space on the host and rerun")
    _fault("after-intent")
    notes = []
    for n, r in enumerate(records):
        os.replace(r["tmp"], r["real"])
        _fsync_dir(os.path.dirname(r["real"]))
        _fault("after-rename-%d" % n)
    for r in records:
        notes.extend(_invalidate_pyc(r["real"]))
    entry = dict(meta, id=txid, txid=txid, action=action, when=time.time(),
                 targets=[{k: r[k] for k in ("label", "module", "real", "before", "after", "backup", "mode")}
                          for r in records])
    _fault("before-journal")
    _journal_append(entry)
    _fault("after-journal")
    os.unlink(intent_path)
    _fsync_dir(txdir)
    entry["notes"] = notes
    return entry
