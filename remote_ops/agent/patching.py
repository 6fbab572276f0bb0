"""Host side of `remote-ops patch / rollback / history`: stdlib only.

Ops:
  patching.read     facts (python, package versions) + each target's bytes, sha256, mode, owner; with
                    ``data_unless`` (an ``only_if`` state) the bytes are left out when the host is in it;
                    with ``present`` (edits with ``when: {finding: present}``), whether each one's
                    finding is on the host's unpatched modules (the verification's check and matcher).
  patching.apply    one transaction over all targets of a playbook (lock, CAS, verify, backup, atomic write);
                    with ``only_if`` (the host state it was planned for) it first compares that state with
                    the host's and, when anything differs, changes nothing: ``{"skipped": "<what differs>"}``.
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

The parts (agent/patch/): ``targets`` (resolving and describing targets, bytecode), ``tx`` (lock,
intent, backups, atomic replaces, recovery), ``verify`` (re-check before anything changes); and
``core/journal`` (the journal and the durable writes).
"""

import base64
import getpass
import os
import socket
import stat
import subprocess
import sys

from .core.digest import sha256_hex as _sha
from .core.dists import package_info
from .core.journal import _journal_entries, _journal_path, _pending_intents, _read_journal
from .patch.targets import _describe, _resolve
from .patch.running import refuse_while_running
from .patch.tx import _Lock, _recover, _transact
from .patch.verify import _verify, _verify_skip_reason, present as _present
from .protocol import AgentFailure
from .core.statedir import root as _state_dir


def _who(args):
    try:
        remote_user = getpass.getuser()
    except Exception:  # no passwd entry for the uid: still record the uid
        remote_user = "uid%d" % os.geteuid()
    return {"controller": args.get("who"), "remote_user": remote_user, "host": socket.gethostname()}


def op_read(args):
    """Facts and target contents in one round trip. Recovers a half-applied transaction first."""
    recovered = []
    if _pending_intents():
        with _Lock(args.get("lock_timeout")):
            recovered = _recover()
    packages = {}
    for name in args.get("packages") or []:
        info = package_info(name)          # METADATA headers only (facts.find_distribution)
        packages[name] = info.get("version") if info["present"] else None
    targets = []
    journal = _read_journal()[0] if args.get("targets") else []   # as far as it reads: apply refuses a corrupt one
    for t in args.get("targets") or []:
        label = t.get("module") or t.get("path")
        found, real, roots = _resolve(t, args.get("workdir"))
        st, data = _describe(label, found, real)
        folder = os.path.dirname(real)
        sha = _sha(data)
        targets.append({
            "label": label, "module": t.get("module"), "path": found, "real": real,
            "is_link": os.path.islink(found), "data": base64.b64encode(data).decode(),
            "sha256": sha, "size": st.st_size, "mode": stat.S_IMODE(st.st_mode),
            "uid": st.st_uid, "gid": st.st_gid, "nlink": st.st_nlink, "mtime_ns": st.st_mtime_ns,
            "roots": roots, "writable": os.access(real, os.W_OK) or st.st_uid == os.geteuid(),
            "dir_writable": os.access(folder, os.W_OK),
            "written_by": _written_by(real, sha, journal),
        })
    out = {"python": list(sys.version_info[:3]), "executable": sys.executable,
           "packages": packages, "targets": targets, "recovered": recovered,
           "euid": os.geteuid(), "state_dir": _state_dir()}
    if args.get("present"):
        # edits with when: {finding: present}: is their finding on this host (unpatched modules)?
        out["present"] = _present(args["present"])
    cond = args.get("data_unless")
    if cond is not None and _differs(cond, args.get("workdir")) is None:
        # the controller already knows these bytes (the state it planned for, compared as apply's
        # only_if compares it): their sha256 is sent, not the bytes
        for t in targets:
            t["data"] = None
        out["data_omitted"] = True
    return out


def _written_by(real, sha, journal):
    """The journal's latest patch that left ``real`` with exactly these bytes: {txid, playbook, when,
    edits}; None when no patch of this host's journal wrote them (the release's bytes, a hand edit)."""
    for e in reversed(journal):
        if e.get("action") != "patch":
            continue
        for t in e.get("targets") or []:
            if t.get("real") == real and t.get("after") == sha:
                return {k: e.get(k) for k in ("txid", "playbook", "when", "edits")}
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


def _differs(cond, workdir):
    """What of the host differs from ``only_if`` (None: nothing): the state a controller planned this
    apply for without reading it first (its Python major.minor, the exact versions of the packages
    the playbook queries, the resolved path and sha256 of every target of the playbook, changed or not)."""
    if not isinstance(cond, dict) or not cond.get("targets"):
        raise AgentFailure("bad-request", "only_if must be an object naming every target")
    want = list(cond.get("python") or [])[:2]
    if want != list(sys.version_info[:2]):
        return "python %d.%d, not %s" % (sys.version_info[0], sys.version_info[1],
                                         ".".join(str(x) for x in want) or "unknown")
    for name, version in sorted((cond.get("packages") or {}).items()):
        info = package_info(name)
        have = info.get("version") if info["present"] else None
        if have != version:
            return "%s %s, not %s" % (name, have or "absent", version or "absent")
    for t in cond.get("targets") or []:
        spec = t.get("spec") or {}
        label = spec.get("module") or spec.get("path")
        try:
            _found, real, _roots = _resolve(spec, workdir)
            with open(real, "rb") as fh:
                sha = _sha(fh.read())
        except (AgentFailure, OSError) as exc:
            return "%s: %s" % (label, getattr(exc, "message", None) or exc)
        if t.get("real") is not None and os.path.realpath(t["real"]) != real:
            return "%s resolves to %s, not %s" % (label, real, t["real"])
        if sha != t.get("sha256"):
            return "%s has sha256 %s..., not %s..." % (label, sha[:12], str(t.get("sha256"))[:12])
    return None


def op_apply(args):
    """One transaction: lock, recover, CAS, verify, backup, atomic replace, pyc, journal, import check."""
    targets = args.get("targets") or []
    meta = {"playbook": args.get("playbook"), "edits": args.get("edit_ids") or [], "who": _who(args)}
    with _Lock(args.get("lock_timeout")) as lock:
        recovered = _recover()
        if args.get("only_if") is not None:
            differs = _differs(args["only_if"], args.get("workdir"))
            if differs:
                return {"skipped": differs, "recovered": recovered}
        # a job of this interpreter imports these files: refused (nothing written) unless asked for
        beside = refuse_while_running(args.get("while_running"), "patch")
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
                  "verify_skipped": skipped if args.get("verify") else None, "while_running": beside}
        modules = args.get("import_check") or []
        if entry is not None and modules:
            error = _import_check(modules, args.get("workdir"), float(args.get("import_timeout") or 300))
            result["import_check"] = {"modules": modules, "error": error}
            if error:
                undo = _rollback_entry(entry, force=False, meta={"who": meta["who"], "reason": "import-check"})
                raise AgentFailure("patched-import-failed", "importing the patched modules failed: %s; rolled back "
                                   "(journal %s)" % (error, undo["txid"] if undo else "-"),
                                   "the host's files are back to their original bytes",
                                   rolled_back=True, txid=entry["txid"])
    return result


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
        beside = refuse_while_running(args.get("while_running"), "rollback")
        done = []
        for e in reversed(pick):
            undo = _rollback_entry(e, force, {"who": _who(args), "playbook": e.get("playbook"),
                                              "edits": e.get("edits")})
            done.append({"of": e["txid"], "entry": undo})
    return {"changed": any(d["entry"] for d in done), "rolled_back": done, "recovered": recovered,
            "while_running": beside}


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
