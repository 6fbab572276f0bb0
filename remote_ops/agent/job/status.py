"""The job directory on the host and a job's status record, read from its files (stdlib only).

Layout, what the states mean and how a live supervisor is told from a lost one: see ``jobs.py``.
``job_status`` reads a job's files (``job.json``, ``run.json``, ``exit.json``, ``stop.json``,
``watchdog.json``) and the ``run.lock`` its supervisor holds; ``summary`` lists the host's jobs for
``facts.gather`` without creating anything.
"""

import errno
import fcntl
import os
import time

from ..core import statedir
from . import jobfiles as sup   # the job files' helpers (shared with the supervisor script)
from ..protocol import AgentFailure

TERMINAL = ("succeeded", "failed", "stopped", "lost")
_PATTERNS = {}


def _re(name):
    """A pattern of this module, compiled on first use: ``facts`` imports this module on every exec
    and needs none of them on a host without jobs (importing re costs ~6 ms of CPU there)."""
    if not _PATTERNS:
        import re
        _PATTERNS.update(
            key=re.compile(r"[^A-Za-z0-9_.-]+"), job=re.compile(r"^[A-Za-z0-9_.-]+$"),
            err=re.compile(r"(Error|Exception|error:|FAILED|Killed|Aborted|Traceback|CUDA out of memory)"))
    return _PATTERNS[name]


def state_dir():
    return statedir.private_dir("jobs")


def safe_key(key):
    key = _re("key").sub("-", str(key or "")).strip("-.")[:60]
    if not key:
        raise AgentFailure("bad-args", "a job key (the playbook's name) is required")
    return key


def _jobdir(job_id):
    if not isinstance(job_id, str) or not _re("job").match(job_id):
        raise AgentFailure("bad-args", "invalid job id %r" % (job_id,))
    return os.path.join(state_dir(), job_id)

def _lock_held(path):
    """True when another process holds an flock on ``path`` (the live supervisor)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    finally:
        os.close(fd)
    return False

def real_output_dir(output_dir):
    """The output directory as one name: ``~`` expanded, symlinks resolved, absolute."""
    return os.path.realpath(os.path.expanduser(output_dir))


def slot(key, output_dir=None):
    """The name a job is recorded under in the state dir (``<slot>.current``, ``<slot>.lock``): what
    the job is, not which inventory name started it: the playbook's key and, when the job writes an
    output directory, that directory (its real path, hashed). Two inventory names of one machine
    sharing a state dir then each get their own job for their own output directory, and find the
    same job for the same one."""
    key = safe_key(key)
    if not output_dir:
        return key
    import hashlib
    return "%s--%s" % (key, hashlib.sha256(real_output_dir(output_dir).encode()).hexdigest()[:10])


def _read_current(name):
    rec = sup.read_json(os.path.join(state_dir(), name + ".current"))
    job_id = (rec or {}).get("job_id")
    return job_id if isinstance(job_id, str) and _re("job").match(job_id) else None


def _current_id(key, output_dir=None):
    """The latest job of ``key`` writing ``output_dir`` (any output directory when None: the newest
    of the key's jobs). A job recorded before slots existed (``<key>.current``) is found when it
    writes the same directory."""
    if output_dir:
        job_id = _read_current(slot(key, output_dir))
        if job_id:
            return job_id
        legacy = _read_current(safe_key(key))
        if legacy:
            job = sup.read_json(os.path.join(state_dir(), legacy, "job.json")) or {}
            if job.get("output_dir") and real_output_dir(job["output_dir"]) == real_output_dir(output_dir):
                return legacy
        return None
    ids = _slot_ids(key)
    if not ids:
        return None
    return max(ids, key=lambda j: (sup.read_json(os.path.join(state_dir(), j, "job.json")) or {}).get("created_at") or 0)


def _slot_ids(key):
    """The current job of each slot of ``key``."""
    key = safe_key(key)
    out = []
    for name in os.listdir(state_dir()):
        if not name.endswith(".current"):
            continue
        base = name[:-len(".current")]
        if base == key or (base.startswith(key + "--") and len(base) == len(key) + 12):
            job_id = _read_current(base)
            if job_id:
                out.append(job_id)
    return out


def _pid_alive(pid, start_ticks):
    if not pid:
        return False
    ticks = sup.proc_start_ticks(pid)
    if ticks is None:
        return False
    if start_ticks is not None and ticks != start_ticks:
        return False   # the pid was reused by another process
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return data[data.rindex(b")") + 2:data.rindex(b")") + 3] != b"Z"
    except OSError:
        return False


def _read_tail(path, max_bytes):
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read()
    except OSError:
        return b""



def error_lines(log_path, limit=3):
    """The lines that say why a job failed: the final exception of the last traceback, else the
    last lines that look like errors."""
    text = _read_tail(log_path, 65536).decode("utf-8", "replace")
    lines = []
    for raw in text.split("\n"):
        line = raw.split("\r")[-1].rstrip()
        if line.strip() and not line.startswith("[remote-ops]"):
            lines.append(line)
    tb = max((i for i, l in enumerate(lines) if l.startswith("Traceback (most recent call last)")),
             default=None)
    if tb is not None:
        tail = [l for l in lines[tb + 1:] if not l.startswith((" ", "\t"))]
        tail = [l for l in tail if not l.startswith(("During handling", "The above exception"))]
        if tail:
            return tail[:limit]
    errs = [l.strip() for l in lines[-50:] if _re("err").search(l)]
    return errs[-limit:]


PROGRESS_KEYS = ("samples_done", "samples_total", "tokens_done", "tokens_total", "tokens_per_s", "eta_s", "t")


def last_progress(log_path, max_bytes=65536):
    """The last ``extract-progress {json}`` line of the log's last ``max_bytes`` (the shipped
    extraction script prints one every few seconds), as a dict of PROGRESS_KEYS, else None."""
    rec = sup.last_json_line(log_path or "", "extract-progress ", max_bytes=max_bytes)
    return {k: rec.get(k) for k in PROGRESS_KEYS} if rec is not None else None


def _tokens(progress, state, now):
    """status' token fields from the last progress line: done/total, the job's own tokens/s and an
    ETA counted down from when the line was written (none once the job ended)."""
    if progress is None:
        return {"tokens": None, "tokens_per_s": None, "eta_s": None}
    eta = progress.get("eta_s")
    if state not in ("running", "starting"):
        eta = None
    elif isinstance(eta, (int, float)) and isinstance(progress.get("t"), (int, float)):
        eta = round(max(0.0, eta - max(0.0, now - progress["t"])), 1)
    return {"tokens": {"done": progress.get("tokens_done"), "total": progress.get("tokens_total"),
                       "at": progress.get("t")},
            "tokens_per_s": progress.get("tokens_per_s"), "eta_s": eta}


def write_rate(bytes_per_token, tokens_per_s, output_dir):
    """What the job writes per second (its own tokens/s x the plan's bytes per token, recorded at launch)
    next to its output disk's cached write speed (diskspeed.lookup; never measured under a running job).
    The controller says from these which bound the job is at (extract/plan.py bound_of)."""
    from . import diskspeed
    rate = round(tokens_per_s * bytes_per_token) if bytes_per_token and tokens_per_s else None
    disk = diskspeed.lookup(output_dir)
    if disk is not None:
        disk = {k: disk.get(k) for k in ("bytes_per_s", "age_s", "mount", "bytes", "seconds", "method", "source")}
    return {"bytes_per_token": bytes_per_token, "bytes_per_s": rate, "disk": disk}


def job_status(job_id):
    """One job's status, in named phases: its records read, its state and why, its outputs, its samples
    (at its end, or now), its speed."""
    jobdir = _jobdir(job_id)
    job = sup.read_json(os.path.join(jobdir, "job.json"))
    if job is None:
        raise AgentFailure("no-job", "no job %s on this host" % job_id)
    run = sup.read_json(os.path.join(jobdir, "run.json")) or {}
    ext = sup.read_json(os.path.join(jobdir, "exit.json"))
    stop = sup.read_json(os.path.join(jobdir, "stop.json"))
    wd = sup.read_json(os.path.join(jobdir, "watchdog.json"))
    held = _lock_held(os.path.join(jobdir, "run.lock"))
    t = time.time()
    out = {
        "job_id": job_id, "key": job.get("key"), "jobdir": jobdir, "command": job.get("command"),
        "workdir": job.get("workdir"), "output_dir": job.get("output_dir"), "log": job.get("log"),
        "env_names": sorted(job.get("env") or {}), "secret_names": job.get("secret_names") or [],
        "created_at": job.get("created_at"), "started_at": run.get("started_at"),
        "ended_at": (ext or {}).get("ended_at"), "pid": run.get("pid"), "pgid": run.get("pgid"),
        "supervisor_pid": run.get("supervisor_pid"), "supervisor_alive": held,
        "exit_code": None, "signal": None, "signal_name": None, "reason": None, "error_lines": [],
        "stop_requested": bool(stop), "watchdog": None, "warnings": [], "label": job.get("label"),
        # what its supervisor kept of the job's own write speed for the next plan (diskspeed.record_observed)
        "disk_observed": (ext or {}).get("disk_observed"),
    }
    state, reason = _state(out, job, jobdir, run, ext, stop, held)
    out["state"], out["reason"] = state, reason
    if wd and wd.get("stalled") and state == "running":
        out["watchdog"] = {"stalled": True, "stalled_for_s": round(t - wd.get("since", t), 1),
                           "limit_s": wd.get("limit_s")}
        out["warnings"].append("no progress in log or output for %ds (hung NCCL start?)"
                               % (t - wd.get("since", t)))
    dirs = _outputs(out, job, jobdir, run, state)
    elapsed, new, start = _samples(out, job, run, ext, dirs, state, t)
    _speed(out, job, dirs, state, t, elapsed, new, start)
    return out


def _state(out, job, jobdir, run, ext, stop, held):
    """The job's state and why: from its exit record when it ended, else from its supervisor's lock and
    its processes; fills out's exit fields, error lines, refusals and warnings."""
    if ext is not None:
        out.update(exit_code=ext.get("exit_code"), signal=ext.get("signal"),
                   signal_name=ext.get("signal_name"), cleanup=ext.get("cleanup"))
        if ext.get("start_error"):
            state, reason = "failed", ext["start_error"]
        elif stop and (ext.get("before_client") or ext.get("before_healthy")):   # before_healthy: the client ran (launch)
            state, reason = "stopped", "stopped by remote-ops' stop while the server was starting"
        elif stop:
            state = "stopped"
            reason = "stopped by remote-ops' stop; " + (
                "exit code %s" % ext.get("exit_code") if ext.get("exit_code") is not None
                else "killed by %s" % ext.get("signal_name"))
        elif ext.get("exit_code") == 0:
            state, reason = "succeeded", "exit code 0"
        else:
            state = "failed"
            reason = ("exit code %s" % ext.get("exit_code") if ext.get("exit_code") is not None
                      else "killed by %s" % ext.get("signal_name"))
            if ext.get("signal_name") == "SIGKILL":
                reason += " (out of memory? check dmesg)"
        if ext.get("server_failure") and state != "stopped":
            state, reason = "failed", ext["server_failure"]
        if state in ("failed", "stopped"):
            server_failed = ext.get("failed_by") == "server" or bool(ext.get("server_failure"))
            # a server that ended the job: the lines that say why are in its own log
            out["error_lines"] = error_lines(os.path.join(jobdir, "server.log") if server_failed
                                             else job.get("log"))
            if out["error_lines"] and state == "failed":
                reason += ": " + out["error_lines"][-1].strip()
        if ext.get("refused") and not ext["refused"].get("unread"):     # requests refused: job/refused.py
            out["refused"] = ext["refused"]
            if state == "succeeded":
                from . import refused
                state, reason = "failed", refused.reason(ext["refused"])
                out["error_lines"] = list(ext["refused"].get("reasons") or [])
    elif held:
        state, reason = ("running" if run else "starting"), None
    elif run and _pid_alive(run.get("pid"), run.get("start_ticks")):
        state, reason = "running", None
        out["warnings"].append("the supervisor is gone while the job runs: its exit status will "
                               "not be recorded")
    else:
        state = "lost"
        if not run:
            reason = "the supervisor never started the job (launch interrupted)"
        elif run.get("boot_id") and sup.boot_id() and run["boot_id"] != sup.boot_id():
            reason = "the host rebooted while the job ran; no exit status was recorded"
        else:
            reason = ("the job's processes are gone and no exit status was recorded "
                      "(killed with SIGKILL, OOM-killed, or the host rebooted)")
        out["error_lines"] = error_lines(job.get("log"))
    return state, reason


def _outputs(out, job, jobdir, run, state):
    """Where the job writes (its layout, shard, directories and their identity), its server and its
    cold start; returns its output directories."""
    if job.get("layout"):
        out["layout"] = job["layout"]
    out["shard"] = job["shard"] if "shard" in job else _shard_of_command(job.get("command"))
    dirs = sup.output_dirs(job)
    if len(dirs) > 1:
        out["output_dirs"] = job["output_dirs"]
    if dirs:     # which directory this is, whichever name reached it (counted once); several: all of theirs
        from .outputdir import identity as output_identity
        ids = [output_identity(d) for d in dirs]
        out["output_identity"] = ids[0] if len(ids) == 1 else "+".join(str(i) for i in ids)
    if job.get("server"):
        out["server"] = server_status(jobdir, state)
    from . import coldstart     # seconds from launch to the engine's readiness and to the first file
    out["cold_start"] = coldstart.measure(jobdir, job, run, dirs)
    return dirs


def _samples(out, job, run, ext, dirs, state, t):
    """Samples done: an ended job's from its exit record (what it had written by its end: the directory
    may have grown since, by a later job), else (running, or ended under an older remote-ops) the
    directory now; against what the job says it was asked to write. Returns (elapsed, new, start)."""
    # progress: an ended job's from its exit record (what it had written by its end: the directory may
    # have grown since, by a later job), else (running, or ended under an older remote-ops) the directory now
    at_end = (ext or {}).get("samples")
    at_end = at_end if isinstance(at_end, dict) and isinstance(at_end.get("done"), int) else None
    if at_end is not None:
        done, top = at_end["done"], at_end.get("max_index", -1)
    else:
        done, top = sup.count_samples(dirs, job.get("layout")) if dirs else (0, -1)
    start = run.get("started_at")
    end = out["ended_at"] or (t if state in ("running", "starting") else None) or start
    elapsed = (end - start) if start and end else None
    new = done - (run.get("initial_samples") or 0)
    expected, run_size = job.get("expected_samples"), None
    if job.get("output_dir"):     # what the job itself says it was asked to write (min of max_samples and the data)
        from ..outputs.data_config import read_data_config
        cfg = read_data_config(os.path.expanduser(job["output_dir"])) or {}
        asked = cfg.get("num_samples")
        if at_end is not None and at_end.get("num_samples") is not None:    # the run's size at its end
            asked = at_end["num_samples"]
        if isinstance(asked, int) and not isinstance(asked, bool) and asked >= 0:
            expected = run_size = asked
            if cfg.get("shard"):      # a sharded job writes its share of num_samples (agent/shards.py)
                expected = len(range(cfg["shard"][0], asked, cfg["shard"][1]))
            if top >= asked and at_end is None:     # files beyond the run's size (a larger run's leftovers) are not its own
                done, top = sup.count_samples(dirs, job.get("layout"), limit=asked)
    out["samples"] = {"done": done, "expected": expected, "max_index": top,
                      "at_start": run.get("initial_samples"), "counted": "at its end" if at_end else "now",
                      "run_size": run_size}
    out["elapsed_s"] = round(elapsed, 1) if elapsed is not None else None
    out["rate_per_s"] = round(new / elapsed, 3) if elapsed and elapsed > 0 and new > 0 else None
    return elapsed, new, start


def _speed(out, job, dirs, state, t, elapsed, new, start):
    """Rates: samples a second, tokens (the script's progress lines, else the files' token ids), the
    write rate, the log's size."""
    out.update(_tokens(last_progress(job.get("log")), state, t))
    if out["tokens"] is None and job.get("layout") == "hs_safetensors" and dirs:   # no progress lines: the files'
        from ..outputs import layout as layout_mod, prepared
        tokens, new_tokens = prepared.tokens_in(dirs, layout_mod, since=start)
        out["tokens"] = {"done": tokens, "total": None, "at": t, "from": "token_ids of the files"}
        out["tokens_per_s"] = round(new_tokens / elapsed, 1) if elapsed and elapsed > 0 and new_tokens else None
    if job.get("output_dir"):
        out["write"] = write_rate((job.get("plan") or {}).get("bytes_per_token"), out["tokens_per_s"],
                                  job["output_dir"])
    try:
        out["log_size"] = os.path.getsize(job.get("log") or "")
    except OSError:
        out["log_size"] = 0


def _shard_of_command(command):
    """[k, n] of a job recorded before job.json held its shard: its command's ``--shard K/N``."""
    command = command or []
    for i, arg in enumerate(command[:-1]):
        if arg == "--shard":
            k, _, n = str(command[i + 1]).partition("/")
            if k.isdigit() and n.isdigit() and int(k) < int(n):
                return [int(k), int(n)]
            return None
    return None


def server_status(jobdir, state):
    """The server of a two-process job: its state (starting, healthy, exited, failed, stopped), port,
    health URL, pid, log and how long it took to answer its health check."""
    rec = sup.read_json(os.path.join(jobdir, "server.json"))
    if rec is None:
        return {"state": "not started" if state in TERMINAL else "starting", "log": os.path.join(jobdir, "server.log")}
    out = {k: rec.get(k) for k in ("state", "port", "health", "pid", "log", "exit")}
    if rec.get("state") == "healthy" and state in TERMINAL:
        out["state"] = "stopped"   # the supervisor ended (SIGKILL, reboot) before it recorded the stop
    if rec.get("healthy_at") and rec.get("started_at"):
        out["ready_after_s"] = round(rec["healthy_at"] - rec["started_at"], 1)
    return out


STANDIN_MARK = "# remote-ops: STAND-IN"


def standin_label(command, workdir):
    """"STAND-IN ..." when a script on the command line carries the stand-in marker comment in its
    first lines (the sandbox's extract_standin.py does), else None: such a job is labelled STAND-IN
    in status and extract, whatever host runs it. A launcher's target counts too: the first word after
    ``--`` (the sandbox runs client_standin.py through run_clients.py)."""
    after = command[command.index("--") + 1:][:1] if "--" in command else []
    for arg in list(command[1:4]) + after:
        if not arg.endswith(".py"):
            continue
        path = os.path.join(workdir, os.path.expanduser(arg))
        try:
            with open(path, "rb") as fh:
                head = fh.read(1024).decode("utf-8", "replace")
        except OSError:
            continue
        for line in head.splitlines()[:5]:
            if line.startswith(STANDIN_MARK):
                rest = line[len(STANDIN_MARK):].strip(" :")
                return "STAND-IN: " + rest if rest else "STAND-IN"
    return None

def running_job(key):
    """The id of a job of the playbook (any output directory) while it is starting or running, else
    None: the files of its workdir are not swapped under it."""
    for job_id in _slot_ids(key):
        try:
            st = job_status(job_id)
        except AgentFailure:
            continue
        if st["state"] in ("starting", "running"):
            return job_id
    return None

def _jobs_in(root, key=None):
    jobs = []
    for name in sorted(os.listdir(root)):
        if os.path.isdir(os.path.join(root, name)) and _re("job").match(name):
            try:
                st = job_status(name)
            except AgentFailure:
                continue
            if not key or st.get("key") == safe_key(key):
                jobs.append(st)
    jobs.sort(key=lambda j: j.get("created_at") or 0)
    return jobs

def summary(args=None):
    """The host's starting or running jobs for ``facts.gather``, oldest first: id, playbook key, state,
    samples, pid (finished ones: ``jobs.list``). Read-only: a host that never ran a job gets [] and no
    state directory."""
    root = os.path.join(statedir.root(), "jobs")
    if not os.path.isdir(root):
        return []
    return [{k: st.get(k) for k in ("job_id", "key", "state", "samples", "pid", "label")}
            for st in _jobs_in(root) if st["state"] in ("starting", "running")]
