"""Files the controller ships into the host's workdir (the playbook's ``extract.files``).

Each file is written only when its sha256 differs from what is there (an unchanged one only has
its mode set; a link there is replaced, never followed): to a temporary beside the destination,
fsynced, renamed over it, the directory fsynced, then read back and hashed. A reader (a job
starting) sees the old file or the new one, never a part. Names are relative to the workdir and
may not leave it. A file keeps the laptop file's mode capped at 0700; folders made for it are 0700.
"""

import base64
import hashlib
import os
import stat

from .core import atomic
from .core.digest import file_sha256
from .protocol import AgentFailure


def _sha256(path):
    try:
        return file_sha256(path)
    except FileNotFoundError:
        return None


def _held_mode(path):
    return stat.S_IMODE(os.stat(path, follow_symlinks=False).st_mode)


def _dest(workdir, name):
    if not isinstance(name, str) or not name or name.startswith(("/", "~")) or "\x00" in name \
            or any(part in ("", ".", "..") for part in name.split("/")):
        raise AgentFailure("bad-args", "file name %r must be a relative path inside the workdir" % (name,))
    return os.path.join(workdir, name)


def _mode(f):
    """The mode sent (the laptop file's), capped at 0700 again here: a shipped file is its owner's only."""
    return int(f.get("mode") if f.get("mode") is not None else 0o600) & 0o700


def _makedirs(workdir, d):
    """Create the folders between ``workdir`` and ``d`` that are missing, each 0700 (os.makedirs
    gives only the last one its mode)."""
    rel = os.path.relpath(d, workdir)
    if rel == ".":
        return
    cur = workdir
    for part in rel.split(os.sep):
        cur = os.path.join(cur, part)
        try:
            os.mkdir(cur, 0o700)
        except FileExistsError:
            pass


def _write(dest, data, mode):
    d = os.path.dirname(dest)
    tmp = os.path.join(d, ".%s.remote-ops.%d.tmp" % (os.path.basename(dest), os.getpid()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def prepare(path):
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(path, mode)
    atomic.replace(tmp, dest, prepare)


def op_put(args):
    """args: workdir, files [{name, data (base64), sha256, mode}], dry_run, unless_running (a job key).
    Result: {"files": [{name, path, sha256, bytes, mode, action: written|unchanged|chmod|would-write|
    would-chmod}]}. A file gets the mode sent, capped at 0700; folders it creates are 0700."""
    workdir = os.path.expanduser(args.get("workdir") or "~")
    if not os.path.isdir(workdir):
        raise AgentFailure("no-workdir", "workdir %s does not exist on the host" % workdir,
                           "create it, or set the host's workdir in the inventory")
    key = args.get("unless_running")
    if key:
        from .job import status as jobstatus
        running = jobstatus.running_job(key)
        if running:   # never swap the files of a job that is running
            return {"files": [], "skipped": "job %s is running" % running}
    out = []
    for f in args.get("files") or []:
        dest = _dest(workdir, f.get("name"))
        data = base64.b64decode(f.get("data") or "")
        want = hashlib.sha256(data).hexdigest()
        if f.get("sha256") and f["sha256"] != want:
            raise AgentFailure("bad-args", "%s arrived damaged (sha256 %s, sent %s)" % (f["name"], want, f["sha256"]))
        have = None if os.path.islink(dest) else _sha256(dest)
        mode = _mode(f)
        if have == want:
            action = "unchanged"
            held = _held_mode(dest)
            if held != mode:   # e.g. written 0644 by an older remote-ops: brought to the shipped mode
                action = "would-chmod" if args.get("dry_run") else "chmod"
                if not args.get("dry_run"):
                    os.chmod(dest, mode)
        elif args.get("dry_run"):
            action = "would-write"
        else:
            try:
                _makedirs(workdir, os.path.dirname(dest))
                _write(dest, data, mode)
            except OSError as exc:
                raise AgentFailure("write-failed", "cannot write %s: %s" % (dest, exc.strerror or exc),
                                   "check the workdir's permissions and free space")
            got = _sha256(dest)
            if got != want:
                raise AgentFailure("write-failed", "%s reads back with sha256 %s, expected %s" % (dest, got, want))
            action = "written"
        out.append({"name": f["name"], "path": dest, "sha256": want, "bytes": len(data), "action": action,
                    "mode": "%04o" % mode})
    return {"files": out}
