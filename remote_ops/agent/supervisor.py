"""Detached supervisor of one extraction job (runs on the host as its own script, stdlib only).

``jobs.op_launch`` writes this file into the job directory and starts it as
``PYTHON supervisor.py JOBDIR LOCKFD`` in a new session with stdin/stdout/stderr redirected, so a
dropped SSH connection or a closed laptop never reaches it. It inherits the job directory's
``run.lock`` already locked (``LOCKFD``): the lock is held exactly as long as the supervisor lives,
which is how the agent tells "running" from "lost" without trusting pids.

It starts the job in its own process group with ``REMOTE_OPS_JOB_ID=<id>`` in the environment
(inherited by every descendant, also by workers that start new sessions), delivers secrets from a
0600 file that it deletes before the job starts (never argv), records pid / pgid / start time in
``run.json``, watches for a job that stops advancing (``watchdog.json``), records the real exit
status in ``exit.json`` (tmp + rename), and finally kills anything of the job left behind.
This file must not import anything outside the standard library: it runs outside the agent.
The agent imports it too (``jobstatus``, on every ``facts``): json, re, signal and subprocess are
imported by the functions that use them, so a ``facts`` on a host without jobs imports none of them.
"""

import os
import sys
import time

MARKER = "REMOTE_OPS_JOB_ID"
_SAMPLE_RE = []


def sample_re():
    """``^data_(\\d+)\\.pt$``, compiled on first use."""
    if not _SAMPLE_RE:
        import re
        _SAMPLE_RE.append(re.compile(r"^data_(\d+)\.pt$"))
    return _SAMPLE_RE[0]


def now():
    return time.time()


def write_json(path, data):
    import json
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path, default=None):
    import json
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def load_secrets(path, names):
    """(secrets, problem): the job's secrets.json (removed once read), or why it cannot be used."""
    if not names and not os.path.lexists(path):
        return {}, None
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None, "its secrets file %s is missing (expected %s)" % (path, ", ".join(names))
    except OSError as exc:
        return None, "its secrets file %s cannot be read (%s)" % (path, exc.strerror or exc)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    import json
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return None, "its secrets file %s is corrupt (%s)" % (path, str(exc).split(":")[0])
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        return None, "its secrets file %s is not a mapping of names to strings" % path
    absent = [n for n in names if n not in data]
    if absent:
        return None, "its secrets file %s lacks %s" % (path, ", ".join(absent))
    return data, None


def proc_start_ticks(pid):
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return None


def count_samples(output_dir):
    """(number of data_<N>.pt files, highest N or -1)."""
    count, top = 0, -1
    try:
        with os.scandir(output_dir) as it:
            for entry in it:
                m = sample_re().match(entry.name)
                if m:
                    count += 1
                    top = max(top, int(m.group(1)))
    except OSError:
        pass
    return count, top


def marker_pids(job_id, exclude=()):
    """Live processes whose environment carries this job's marker, whatever their name or session."""
    needle = ("%s=%s" % (MARKER, job_id)).encode() + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in exclude:
            continue
        try:
            with open("/proc/%d/environ" % pid, "rb") as fh:
                env = b"\0" + fh.read()
            with open("/proc/%d/stat" % pid, "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        if b"\0" + needle in env or env.endswith(b"\0" + needle[:-1]):
            state = stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3]
            if state != b"Z":
                found.append(pid)
    return found


def live_stats():
    """(pid, stat fields after the command name) of every live, non-zombie process."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(b")") + 2:].split()
        except (OSError, ValueError):
            continue
        if fields and fields[0] != b"Z":
            yield int(name), fields


def group_pids(pgid, exclude=()):
    return [pid for pid, fields in live_stats() if pid not in exclude and int(fields[2]) == pgid]


def process_table():
    """{pid: (ppid, start_ticks)} of every live, non-zombie process."""
    return {pid: (int(fields[1]), int(fields[19])) for pid, fields in live_stats()}


def track_descendants(root_pid, known):
    """Adds to ``known`` ({pid: start_ticks}) every live descendant of ``root_pid`` or of a known
    process: workers re-parented later (to init) stay known even if they rename themselves and
    their environment is overwritten (setproctitle), so the GPU list can be matched against them."""
    table = process_table()
    changed = False
    grew = True
    while grew:
        grew = False
        for pid, (ppid, ticks) in table.items():
            if pid in known:
                continue
            parent = table.get(ppid)
            if ppid == root_pid or (ppid in known and parent and known[ppid] == parent[1]):
                known[pid] = ticks
                grew = changed = True
    return changed


def known_alive(known):
    """The pids of ``known`` ({pid: start_ticks}) still alive and not reused."""
    return [pid for pid, ticks in known.items() if proc_start_ticks(pid) == ticks]


def kill_all(pids, pgid, sig):
    if pgid:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def log_line(log_fd, text):
    try:
        os.write(log_fd, ("\n[remote-ops] %s %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), text)).encode())
    except OSError:
        pass


class Supervisor:
    def __init__(self, jobdir, lock_fd):
        self.jobdir = jobdir
        self.lock_fd = lock_fd
        self.job = read_json(os.path.join(jobdir, "job.json")) or {}
        self.job_id = self.job.get("job_id") or os.path.basename(jobdir.rstrip("/"))
        self.proc = None
        self.pgid = None

    def path(self, name):
        return os.path.join(self.jobdir, name)

    def _forward(self, signum, frame):
        # Someone signalled the supervisor itself: pass it on to the job, keep recording.
        import signal
        if self.pgid:
            try:
                os.killpg(self.pgid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

    def run(self):
        import signal
        import subprocess
        os.umask(0o077)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        job = self.job
        log_path = job.get("log") or self.path("log")
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        secrets, problem = load_secrets(self.path("secrets.json"), job.get("secret_names") or [])
        if problem:
            # never start a job without the secrets it was launched with: it would run (and perhaps
            # fail much later, or download the wrong thing) for reasons nobody could see
            msg = "cannot start the job: %s" % problem
            log_line(log_fd, msg)
            write_json(self.path("exit.json"), {"exit_code": None, "signal": None, "ended_at": now(),
                                                "start_error": msg, "cleanup": []})
            return 0
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (job.get("env") or {}).items()})
        env.update({str(k): str(v) for k, v in secrets.items()})
        env.setdefault("PYTHONUNBUFFERED", "1")
        env[MARKER] = self.job_id
        secrets = None
        output_dir = job.get("output_dir")
        initial, _ = count_samples(output_dir) if output_dir else (0, -1)
        log_line(log_fd, "job %s starting: %s" % (self.job_id, " ".join(job.get("command") or [])))
        try:
            self.proc = subprocess.Popen(job["command"], cwd=job.get("workdir") or None, env=env,
                                         stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                                         start_new_session=True, close_fds=True)
        except (OSError, KeyError, TypeError, ValueError) as exc:
            env = None
            msg = "cannot start the job: %s" % (exc.strerror if isinstance(exc, OSError) and exc.strerror
                                                else exc)
            if isinstance(exc, OSError) and exc.filename:
                msg += ": %s" % exc.filename
            log_line(log_fd, msg)
            write_json(self.path("exit.json"), {"exit_code": None, "signal": None, "ended_at": now(),
                                                "start_error": msg, "cleanup": []})
            return 0
        env = None
        self.pgid = self.proc.pid   # start_new_session: the job leads its own session and group
        started = now()
        write_json(self.path("run.json"), {
            "job_id": self.job_id, "command": job.get("command"), "log": log_path,
            "pid": self.proc.pid, "pgid": self.pgid, "supervisor_pid": os.getpid(),
            "started_at": started, "start_ticks": proc_start_ticks(self.proc.pid),
            "boot_id": boot_id(), "initial_samples": initial,
        })
        rc = self._wait(log_fd, output_dir, started)
        sig = -rc if rc < 0 else None
        exit_rec = {"exit_code": rc if rc >= 0 else None, "signal": sig,
                    "signal_name": signal.Signals(sig).name if sig else None,
                    "ended_at": now(), "cleanup": None}
        write_json(self.path("exit.json"), exit_rec)
        log_line(log_fd, "job %s ended: %s" % (
            self.job_id, "exit code %d" % rc if rc >= 0 else "killed by %s" % exit_rec["signal_name"]))
        exit_rec["cleanup"] = self._cleanup(log_fd)
        write_json(self.path("exit.json"), exit_rec)
        os.close(log_fd)
        return 0

    def _wait(self, log_fd, output_dir, started):
        import subprocess
        limit = float(self.job.get("watchdog_seconds") or 0)
        poll = max(0.2, min(5.0, limit / 4)) if limit else 5.0

        def progress():
            try:
                size = os.fstat(log_fd).st_size
            except OSError:
                size = None
            return size, (count_samples(output_dir) if output_dir else None)

        last, last_change, stalled = progress(), started, False
        known = {self.proc.pid: proc_start_ticks(self.proc.pid)}
        poll = min(poll, 1.0)
        while True:
            try:
                return self.proc.wait(timeout=poll)
            except subprocess.TimeoutExpired:
                pass
            try:
                if track_descendants(self.proc.pid, known):
                    write_json(self.path("pids.json"), {str(k): v for k, v in known.items()})
            except OSError:
                pass
            if not limit:
                continue
            cur, t = progress(), now()
            if cur != last:
                last_change = t
                if stalled:
                    stalled = False
                    write_json(self.path("watchdog.json"), {"stalled": False, "resumed_at": t,
                                                            "limit_s": limit})
                    log_line(log_fd, "watchdog: progress resumed")
            elif not stalled and t - last_change >= limit:
                stalled = True
                write_json(self.path("watchdog.json"), {"stalled": True, "since": last_change,
                                                        "flagged_at": t, "limit_s": limit})
                log_line(log_fd, "watchdog: no new log output and no new output files for %ds "
                                 "(a hung NCCL start looks like this)" % (t - last_change))
            last = progress()   # our own log lines are not progress

    def _cleanup(self, log_fd):
        """Nothing of the job may outlive it: TERM, grace, KILL whatever still carries the marker."""
        import signal
        me = {os.getpid()}
        known = {int(k): v for k, v in (read_json(self.path("pids.json"), {}) or {}).items()}

        def leftovers():
            return sorted(set(marker_pids(self.job_id, me)) | set(group_pids(self.pgid, me))
                          | (set(known_alive(known)) - me))
        left = leftovers()
        if not left:
            return []
        log_line(log_fd, "stopping %d leftover process(es) of the job: %s" % (
            len(left), ", ".join(map(str, left))))
        kill_all(left, self.pgid, signal.SIGTERM)
        deadline = now() + float(self.job.get("cleanup_grace") or 10)
        first = left
        while now() < deadline:
            time.sleep(0.1)
            left = leftovers()
            if not left:
                break
        if left:
            kill_all(left, self.pgid, signal.SIGKILL)
        return [{"pid": p, "signal": "SIGKILL" if p in left else "SIGTERM"} for p in first]


def main(argv):
    jobdir = argv[1]
    lock_fd = int(argv[2]) if len(argv) > 2 else None
    return Supervisor(jobdir, lock_fd).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
