"""Host side of `remote-ops patch / rollback / history`: stdlib only.

Ops:
  patching.read     facts (python, package versions) + each target's bytes, sha256, mode, owner.
  patching.apply    one transaction over all targets of a playbook (lock, CAS, verify, backup, atomic write).
  patching.verify   apply's verification alone (re-check of old and new text), for dry runs.
  patching.rollback restore the exact original bytes of a journal entry.
  patching.history  the journal.

State lives under ``$REMOTE_OPS_STATE_DIR`` or ``~/.remote-ops`` (0700):
  lock                      flock'ed by the agent process for the whole transaction; the kernel
                            releases it when the process dies, so a dead controller leaves no stale lock.
  journal/journal.jsonl     one JSON line per committed transaction (0600).
  journal/<txid>/           backups (0600 or less, never overwritten) and, while a transaction is in
                            flight, ``intent.json``: the write-ahead record of every target, its backup,
                            its temporary file and both checksums.

Crash safety: every backup and temporary file is written and fsynced, then ``intent.json`` is made
durable, then the targets are renamed one by one, then the journal line is appended, then the intent is
removed. The next transaction, rollback or read finds any intent without a journal line and undoes it
(targets already renamed get their backup back, temporary files are removed): a target is always either
its original bytes or its fully patched bytes, across all targets of one transaction.
"""

import base64
import errno
import fcntl
import getpass
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import py_compile
import socket
import stat
import subprocess
import sys
import time
import uuid

from .protocol import AgentFailure

LOCK_TIMEOUT = 120.0


# ------------------------------------------------------------------------------ small helpers
def _sha(data):
    return hashlib.sha256(data).hexdigest()


def _state_dir():
    return os.environ.get("REMOTE_OPS_STATE_DIR") or os.path.join(os.path.expanduser("~"), ".remote-ops")


def _journal_dir():
    return os.path.join(_state_dir(), "journal")


def _ensure_private_dir(path):
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _who(args):
    try:
        remote_user = getpass.getuser()
    except Exception:  # no passwd entry for the uid: still record the uid
        remote_user = "uid%d" % os.geteuid()
    return {"controller": args.get("who"), "remote_user": remote_user, "host": socket.gethostname()}


# ------------------------------------------------------------------------------ journal
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


# ------------------------------------------------------------------------------ bytecode
def _invalidate_pyc(path):
    """Remove every cached .pyc of ``path`` and write a fresh hash-checked one.

    A hash-checked pyc is revalidated against the source on every import, so a later rewrite within
    the same second with the same size can never run stale bytecode (cpython #75953).
    """
    notes = []
    if not path.endswith(".py"):
        return notes
    folder, base = os.path.split(path)
    stem = base[:-3]
    cache = os.path.join(folder, "__pycache__")
    try:
        names = os.listdir(cache)
    except FileNotFoundError:
        names = []
    except OSError as exc:
        notes.append("cannot list %s: %s" % (cache, exc.strerror))
        names = []
    for name in names:
        if name.startswith(stem + ".") and name.endswith(".pyc"):   # every interpreter and opt level
            try:
                os.unlink(os.path.join(cache, name))
            except FileNotFoundError:
                pass
            except OSError as exc:
                notes.append("cannot remove stale bytecode %s: %s" % (name, exc.strerror))
    # legacy layout: foo.pyc beside foo.py would be imported without a source check
    legacy = os.path.join(folder, stem + ".pyc")
    if os.path.exists(legacy):
        try:
            os.unlink(legacy)
        except OSError as exc:
            notes.append("cannot remove %s: %s" % (legacy, exc.strerror))
    try:
        py_compile.compile(path, cfile=importlib.util.cache_from_source(path), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    except (OSError, py_compile.PyCompileError) as exc:
        notes.append("bytecode not rewritten (%s); Python will compile the new source on import" % (
            getattr(exc, "strerror", None) or exc))
    return notes


# ------------------------------------------------------------------------------ resolving targets
def _find_module(name, extra_path):
    """(file, package_root) of module ``name`` without importing anything."""
    parts = name.split(".")
    search = list(extra_path) + list(sys.path)
    root = None
    spec = None
    for i, part in enumerate(parts):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            where = "on sys.path of %s" % sys.executable if i == 0 else "in %s" % ".".join(parts[:i])
            raise AgentFailure("no-module", "module %s not found (no %r %s)" % (name, part, where),
                               "is the package installed in the host's interpreter (inventory 'python')?")
        if i == 0:
            locs = list(spec.submodule_search_locations or [])
            root = locs[0] if locs else spec.origin
        if i < len(parts) - 1:
            if not spec.submodule_search_locations:
                raise AgentFailure("no-module", "module %s not found (%s is not a package)" % (
                    name, ".".join(parts[:i + 1])))
            search = list(spec.submodule_search_locations)
    origin = spec.origin if spec is not None else None
    if not origin or origin in ("namespace", "built-in", "frozen") or not origin.endswith(".py"):
        raise AgentFailure("not-source", "module %s is not a Python source file (%s)" % (name, origin),
                           "patch targets must be .py files")
    return origin, root


def _within(path, root):
    root = os.path.realpath(root)
    path = os.path.realpath(path)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _resolve(target, workdir):
    module, path = target.get("module"), target.get("path")
    base = os.path.expanduser(workdir) if workdir else os.path.expanduser("~")
    roots = []
    if module:
        extra = [base] if workdir else []
        found, root = _find_module(module, extra)
        roots.append(root if os.path.isdir(root or "") else os.path.dirname(root or found))
    else:
        p = os.path.expanduser(path)
        found = p if os.path.isabs(p) else os.path.join(base, p)
    if workdir:
        roots.append(os.path.expanduser(workdir))
    real = os.path.realpath(found)
    if not target.get("allow_outside") and not any(_within(real, r) for r in roots):
        raise AgentFailure("outside", "%s resolves to %s, outside %s" % (
            module or path, real, " and ".join(os.path.realpath(r) for r in roots) or "the host's workdir"),
            "set allow_outside: true on this patch in the playbook if that is intended")
    return found, real, roots


def _describe(label, found, real):
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise AgentFailure("no-file", "%s: %s does not exist" % (label, real)) from None
    if not stat.S_ISREG(st.st_mode):
        raise AgentFailure("not-file", "%s: %s is not a regular file" % (label, real))
    try:
        with open(real, "rb") as fh:
            data = fh.read()
    except PermissionError:
        raise AgentFailure("unreadable", "%s: cannot read %s (permission denied)" % (label, real)) from None
    return st, data


def op_read(args):
    """Facts and target contents in one round trip. Recovers a half-applied transaction first."""
    recovered = []
    if _pending_intents():
        with _Lock(args.get("lock_timeout")):
            recovered = _recover()
    packages = {}
    try:
        import importlib.metadata as md
        for name in args.get("packages") or []:
            try:
                packages[name] = md.version(name)
            except md.PackageNotFoundError:
                packages[name] = None
    except ImportError:
        pass
    targets = []
    for t in args.get("targets") or []:
        label = t.get("module") or t.get("path")
        found, real, roots = _resolve(t, args.get("workdir"))
        st, data = _describe(label, found, real)
        folder = os.path.dirname(real)
        targets.append({
            "label": label, "module": t.get("module"), "path": found, "real": real,
            "is_link": os.path.islink(found), "data": base64.b64encode(data).decode(),
            "sha256": _sha(data), "size": st.st_size, "mode": stat.S_IMODE(st.st_mode),
            "uid": st.st_uid, "gid": st.st_gid, "nlink": st.st_nlink, "mtime_ns": st.st_mtime_ns,
            "roots": roots, "writable": os.access(real, os.W_OK) or st.st_uid == os.geteuid(),
            "dir_writable": os.access(folder, os.W_OK),
        })
    return {"python": list(sys.version_info[:3]), "executable": sys.executable,
            "packages": packages, "targets": targets, "recovered": recovered,
            "euid": os.geteuid(), "state_dir": _state_dir()}


# ------------------------------------------------------------------------------ transactions
def _pending_intents():
    jd = _journal_dir()
    try:
        names = os.listdir(jd)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(jd, n, "intent.json") for n in names
                  if os.path.exists(os.path.join(jd, n, "intent.json")))


def _restore_file(real, data, mode, uid, gid, tag):
    """Atomically put ``data`` at ``real`` keeping mode and owner (tmp beside it, fsync, rename)."""
    folder, base = os.path.split(real)
    tmp = os.path.join(folder, ".%s.remote-ops-%s.tmp" % (base, tag))
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    _write_new(tmp, data, 0o600)
    try:
        _chown_like(tmp, uid, gid)
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(folder)


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


def _finding_key(f):
    return (f.get("path"), f.get("line"), f.get("col"), f.get("kind"), f.get("symbol"), f.get("name"))


def _brief(f):
    return {k: f.get(k) for k in ("path", "line", "kind", "symbol", "defined", "name", "message")}


def _fix_text(fix):
    return "%s %s%s" % (fix.get("kind"), fix.get("symbol"), "(%s)" % fix["name"] if fix.get("name") else "")


def _verify(args, todo):
    """Re-check the patched modules, old text and new text, in this process, before anything changes.

    ``args["verify"]``: {"args": compat.check arguments (targets: the patched modules),
    "fixes": [{"edit", "where" (playbook file:line), "kind", "symbol", "name"}] of the edits applied now,
    "allow_findings": bool}. Refuses (``verify-failed`` / ``findings-remain``; nothing written) when
    a ``fixes`` entry names nothing, matches no finding of the unpatched text (nothing to verify),
    still matches one in the new text, or when any finding remains in the patched modules and
    ``allow_findings`` is not set. Returns what was verified.
    """
    verify = args.get("verify")
    if not verify:
        return None
    from . import compat
    from .signatures import StaticResolver
    from .symbols import SymbolMatcher

    vargs = dict(verify.get("args") or {})
    overrides = {t["module"]: base64.b64decode(t["data"]).decode(t.get("encoding") or "utf-8")
                 for t in todo if t.get("module")}
    before = compat.op_check(dict(vargs))
    after = compat.op_check(dict(vargs, override_sources=overrides))
    fixes = verify.get("fixes") or []
    matcher = SymbolMatcher(StaticResolver(vargs.get("sys_path") or sys.path), [f.get("symbol") for f in fixes])

    def hits(fix, findings):
        return [f for f in findings if f.get("kind") == fix.get("kind")
                and (fix.get("name") is None or str(f.get("name")) == str(fix.get("name")))
                and matcher.matches(fix.get("symbol"), f.get("symbol"), f.get("defined"))]

    gone, left = {}, {}
    for fix in fixes:
        where = "edit %s (%s)" % (fix.get("edit"), fix.get("where"))
        was = hits(fix, before["findings"])
        if not was:
            spelled = any(f.get("symbol") == fix.get("symbol") for f in before["findings"])
            if matcher.where(fix.get("symbol")) is None and not spelled:
                raise AgentFailure("verify-failed", "%s: fixes names %s, which is defined nowhere in the installed "
                                   "%s and is no finding's symbol; the verification would pass vacuously" % (
                                       where, fix.get("symbol"), ", ".join(vargs.get("against") or [])),
                                   "spell the symbol by a module that defines or imports it; nothing was changed")
            raise AgentFailure("verify-failed", "%s claims to fix %s, but the unpatched module has no such finding "
                               "on this host (%d finding(s) there), so there is nothing to verify" % (
                                   where, _fix_text(fix), len(before["findings"])),
                               "correct the fixes entry (kind, symbol, name as `remote-ops check` prints them), "
                               "or drop the edit if this version does not need it; nothing was changed")
        for f in was:
            gone[_finding_key(f)] = f
        for f in hits(fix, after["findings"]):
            left[_finding_key(f)] = f
    if left:
        left = list(left.values())
        raise AgentFailure("verify-failed", "the patched text still has %d finding(s) the edits target: %s" % (
            len(left), "; ".join(str(f.get("message") or f) for f in left[:3])),
            "nothing was changed; fix the playbook", findings=[_brief(f) for f in left])
    remaining = after["findings"]
    if remaining and not verify.get("allow_findings"):
        raise AgentFailure("findings-remain", "the patched text still has %d finding(s) in the patched module(s): %s" % (
            len(remaining), "; ".join("%s:%s %s" % (os.path.basename(str(f.get("path"))), f.get("line"),
                                                     f.get("message")) for f in remaining[:3])),
            "nothing was changed; add edits for them to the playbook, or pass --allow-findings to patch anyway",
            findings=[_brief(f) for f in remaining])
    return {"modules": [t["module"] for t in after.get("targets") or []], "versions": after.get("versions") or {},
            "fixes": len(fixes), "targeted_gone": len(gone), "calls_rechecked": after.get("calls_checked") or 0,
            "findings_before": len(before["findings"]), "remaining": [_brief(f) for f in remaining],
            "unknown": len(after.get("unknown") or [])}


def _verify_skip_reason(targets):
    """None when every target still holds the bytes the plan was computed from; else why not."""
    shas = []
    for t in targets:
        try:
            with open(t["real"], "rb") as fh:
                shas.append(_sha(fh.read()))
        except OSError:
            return "a target cannot be read"
    if all(cur == _sha(base64.b64decode(t["data"])) for cur, t in zip(shas, targets)):
        return "the host already holds the patched text (applied by another controller)"
    if any(cur != t["expected"] for cur, t in zip(shas, targets)):
        return "a target changed since it was read"
    return None


def op_verify(args):
    """The verification of ``apply`` alone (for ``patch --dry-run``): no lock, nothing written."""
    return {"verified": _verify(args, args.get("targets") or [])}


def _import_check(modules, workdir, timeout):
    code = "import importlib,sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    cwd = os.path.expanduser(workdir) if workdir else os.path.expanduser("~")
    if not os.path.isdir(cwd):
        cwd = None
    try:
        proc = subprocess.run([sys.executable, "-c", code] + list(modules), cwd=cwd, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "importing %s took more than %ss" % (", ".join(modules), timeout)
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "exit status %d" % proc.returncode
    return None


def op_apply(args):
    """One transaction: lock, recover, CAS, verify, backup, atomic replace, pyc, journal, import check."""
    targets = args.get("targets") or []
    meta = {"playbook": args.get("playbook"), "edits": args.get("edit_ids") or [], "who": _who(args)}
    with _Lock(args.get("lock_timeout")) as lock:
        recovered = _recover()
        for t in targets:
            if not os.path.isabs(t["real"]):
                raise AgentFailure("bad-request", "target path must be absolute: %r" % t["real"])
            # Defence in depth: resolve the playbook's target again here, so that a stale or forged
            # request can never write outside the package or workdir the read step allowed.
            spec = t.get("spec")
            if not isinstance(spec, dict) or not (spec.get("module") or spec.get("path")):
                raise AgentFailure("bad-request", "target %s comes without its playbook spec" % t["real"])
            _found, real, _roots = _resolve(spec, args.get("workdir"))
            if os.path.realpath(t["real"]) != real:
                raise AgentFailure("changed", "%s now resolves to %s, not %s" % (
                    spec.get("module") or spec.get("path"), real, t["real"]),
                    "the host changed since the read step; rerun the patch")
        # verify only what this transaction would write: when another controller already wrote these
        # bytes (or the file changed, which the compare-and-swap below refuses) there is nothing to verify
        skipped = _verify_skip_reason(targets)
        verified = None if skipped else _verify(args, targets)
        changes = [{"real": t["real"], "label": t.get("label"), "module": t.get("module"),
                    "expected": t["expected"], "data": base64.b64decode(t["data"])} for t in targets]
        entry = _transact("patch", changes, meta)
        result = {"changed": entry is not None, "entry": entry, "recovered": recovered,
                  "lock_wait_s": round(lock.waited, 3), "verified": verified,
                  "verify_skipped": skipped if args.get("verify") else None}
        modules = args.get("import_check") or []
        if entry is not None and modules:
            error = _import_check(modules, args.get("workdir"), float(args.get("import_timeout") or 300))
            result["import_check"] = {"modules": modules, "error": error}
            if error:
                undo = _rollback_entry(entry, force=False, meta={"who": meta["who"], "reason": "import-check"})
                raise AgentFailure("import-failed", "importing the patched modules failed: %s; rolled back "
                                   "(journal %s)" % (error, undo["txid"] if undo else "-"),
                                   "the host's files are back to their original bytes",
                                   rolled_back=True, txid=entry["txid"])
    return result


# ------------------------------------------------------------------------------ rollback / history
def _rollback_entry(entry, force, meta):
    changes = []
    for t in entry.get("targets") or []:
        with open(t["backup"], "rb") as fh:
            original = fh.read()
        if _sha(original) != t["before"]:
            raise AgentFailure("backup-corrupt", "backup %s does not match its recorded sha256; refusing" % t["backup"])
        try:
            with open(t["real"], "rb") as fh:
                current = _sha(fh.read())
        except FileNotFoundError:
            raise AgentFailure("no-file", "%s no longer exists" % t["real"]) from None
        if current == t["before"]:
            continue
        if current != t["after"] and not force:
            raise AgentFailure("changed", "%s changed since patch %s (sha256 %s..., patched %s...)" % (
                t["real"], entry["txid"], current[:12], t["after"][:12]),
                "rerun with --force to restore the original anyway", real=t["real"])
        changes.append({"real": t["real"], "label": t.get("label"), "module": t.get("module"),
                        "expected": t["after"], "data": original, "force": force})
    return _transact("rollback", changes, dict(meta, of=entry["txid"]))


def _open_patches(entries):
    undone = {e.get("of") for e in entries if e.get("action") == "rollback"}
    return [e for e in entries if e.get("action") == "patch" and e.get("txid") not in undone]


def op_rollback(args):
    """Undo the latest patch (or every patch back to and including ``to``), newest first."""
    force = bool(args.get("force"))
    with _Lock(args.get("lock_timeout")):
        recovered = _recover()
        entries = _journal_entries()
        open_ = _open_patches(entries)
        to = args.get("to")
        if to:
            ids = [e.get("txid") for e in entries]
            if to not in ids:
                raise AgentFailure("no-entry", "no journal entry %r on this host" % to,
                                   "list them with remote-ops history")
            target = next(e for e in entries if e.get("txid") == to)
            if target.get("action") != "patch":
                raise AgentFailure("no-entry", "journal entry %r is a %s, not a patch" % (to, target.get("action")))
            if target not in open_:
                return {"changed": False, "rolled_back": [], "recovered": recovered,
                        "message": "%s is already rolled back" % to}
            pick = open_[open_.index(target):]
        else:
            if not open_:
                return {"changed": False, "rolled_back": [], "recovered": recovered,
                        "message": "nothing to roll back"}
            pick = open_[-1:]
        done = []
        for e in reversed(pick):
            undo = _rollback_entry(e, force, {"who": _who(args), "playbook": e.get("playbook"),
                                              "edits": e.get("edits")})
            done.append({"of": e["txid"], "entry": undo})
    return {"changed": any(d["entry"] for d in done), "rolled_back": done, "recovered": recovered}


def op_history(args):
    """The journal; a corrupt one is listed as far as it reads, with its bad lines (``corrupt``)."""
    entries, corrupt = _read_journal()
    undone = {e.get("of"): e.get("txid") for e in entries if e.get("action") == "rollback"}
    for e in entries:
        if e.get("action") == "patch":
            e["rolled_back_by"] = undone.get(e.get("txid"))
    limit = args.get("limit")
    if limit:
        entries = entries[-int(limit):]
    return {"entries": entries, "pending": len(_pending_intents()), "state_dir": _state_dir(),
            "journal": _journal_path(), "corrupt": corrupt}
