"""One job per output directory: the marker a running job holds in its output directory. Stdlib only.

``<output_dir>/.remote-ops-job.json`` exists while a job writes there. It is created whole, with
``os.link`` of a finished temporary (which fails when the name exists), so two launches racing for
one directory never both get it, whichever state dir, inventory name or machine (over a shared
file system) starts them. It holds the job id, its job directory (so its state dir), key, shard,
output dir, the launcher's and later the supervisor's pid with its start time, and the machine
(``/etc/machine-id``, boot id, host name). The supervisor removes it when the job ends
(``jobfiles.release_output``). A marker left by a job whose supervisor is gone is stale and taken
over: on the same boot of the same machine when its ``run.lock`` is not held (or, when its state dir
cannot be read, its pid is gone); on the same machine after a reboot always. A marker of another
machine is never taken over: the refusal names it and what to do.

The directory's own identity (``.remote-ops-dir``) is outputdir.py's.
"""

import errno
import json
import os
import time

from .outputdir import ensure_identity, machine
from .jobfiles import OUTPUT_MARKER as MARKER   # one name, jobfiles' (the supervisor releases it: release_output)


def read(output_dir):
    """The marker's record, or None (none, or not readable as one)."""
    try:
        with open(os.path.join(output_dir, MARKER), encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _pid_alive(pid, ticks):
    from . import jobfiles
    if not isinstance(pid, int) or pid <= 0:
        return False
    now_ticks = jobfiles.proc_start_ticks(pid)
    return now_ticks is not None and (ticks is None or now_ticks == ticks)


def holder_state(rec):
    """"live", "stale" or "elsewhere" (another machine: cannot be told from here) for a marker."""
    from .status import _lock_held
    here = machine()
    there = rec.get("machine") or {}
    same_machine = (there.get("boot_id") and there.get("boot_id") == here["boot_id"]) or (
        there.get("machine_id") and there.get("machine_id") == here["machine_id"]
        and there.get("hostname") == here["hostname"])
    if not same_machine:
        return "elsewhere"
    if there.get("boot_id") != here["boot_id"]:
        return "stale"          # this machine rebooted since: no process of that job lives
    lock = os.path.join(rec.get("jobdir") or "", "run.lock")
    if rec.get("jobdir") and os.path.exists(lock):
        try:
            return "live" if _lock_held(lock) else "stale"
        except OSError:
            pass
    return "live" if _pid_alive(rec.get("pid"), rec.get("start_ticks")) else "stale"


def shard_text(shard):
    return "shard %d/%d" % (shard[0], shard[1]) if shard else "no shard"


def describe(rec):
    """One phrase naming the job that holds a marker: id, shard, machine, state dir, since when."""
    m = rec.get("machine") or {}
    jobdir = rec.get("jobdir") or ""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec["created_at"])) \
        if isinstance(rec.get("created_at"), (int, float)) else "?"
    return "job %s (%s, machine %s, state dir %s, since %s)" % (
        rec.get("job_id"), shard_text(rec.get("shard")), m.get("hostname") or "?",
        os.path.dirname(os.path.dirname(jobdir)) or "?", since)


def clash(rec, output_dir):
    """The one line for a launch refused because ``rec`` holds ``output_dir``, with what to do."""
    from ..protocol import AgentFailure
    state = holder_state(rec)
    what = "%s is being written by %s" % (output_dir, describe(rec))
    if state == "elsewhere":
        hint = ("one output directory holds one job: give each share its own output_dir (e.g. with {host}); "
                "if that job is gone, remove %s" % os.path.join(output_dir, MARKER))
    else:
        hint = ("one output directory holds one job: give each share its own output_dir (e.g. with {host}), "
                "or wait for that job (remote-ops status HOST --all) or stop it (remote-ops stop HOST --job %s)"
                % rec.get("job_id"))
    return AgentFailure("busy", what, hint)


def _write_new(path, rec):
    """Create ``path`` holding ``rec``, whole; False when it exists."""
    tmp = "%s.%d.%d.tmp" % (path, os.getpid(), int(time.time() * 1e6))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(rec, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                return False
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            # a file system without hard links: O_EXCL on the name itself, then the content
            try:
                fd2 = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd2, "w", encoding="utf-8") as fh:
                json.dump(rec, fh, indent=1, sort_keys=True)
        return True
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def claim(output_dir, rec):
    """Make ``rec`` (job_id, jobdir, key, shard, pid, start_ticks) the marker of ``output_dir``, or
    raise the refusal that names the job holding it. A stale marker is moved aside (kept as
    ``.remote-ops-job.json.stale-<time>``) and the claim tried again."""
    from . import jobfiles
    path = os.path.join(output_dir, MARKER)
    rec = dict(rec, output_dir=output_dir, machine=machine(), created_at=time.time())
    ensure_identity(output_dir)
    for _ in range(5):
        if _write_new(path, rec):
            return rec
        held = read(output_dir)
        if held is None:         # being written this instant, or not ours to read
            time.sleep(0.05)
            held = read(output_dir)
            if held is None:
                from ..protocol import AgentFailure
                raise AgentFailure("busy", "%s holds %s, which cannot be read" % (output_dir, MARKER),
                                   "if no job writes there, remove %s" % path)
        if held.get("job_id") == rec.get("job_id"):
            return rec
        if holder_state(held) != "stale":
            raise clash(held, output_dir)
        aside = "%s.stale-%d" % (path, int(time.time() * 1000))
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            continue
        moved = jobfiles.read_json(aside)
        if (moved or {}).get("job_id") != held.get("job_id"):
            # another launch took over the stale marker between our read and the rename: give it back
            try:
                os.link(aside, path)
            except OSError:
                pass
        try:
            os.unlink(aside)
        except OSError:
            pass
    from ..protocol import AgentFailure
    raise AgentFailure("busy", "cannot claim %s: other launches keep taking it" % output_dir,
                       "run the command again")


def update(output_dir, job_id, **fields):
    """Add ``fields`` to the marker while it is ``job_id``'s (tmp + rename)."""
    rec = read(output_dir)
    if not rec or rec.get("job_id") != job_id:
        return
    rec.update(fields)
    path = os.path.join(output_dir, MARKER)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(rec, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


