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
This file must not import anything outside the standard library: it runs outside the agent. Its
helpers (records, counts, processes) are ``jobfiles.py``, loaded from beside it (``_sibling``).
"""

import os
import sys
import time


def _sibling(name):
    """A module of this folder: imported as a package module inside the agent, loaded from the file
    beside this one when this file runs as its own script (jobs.op_launch writes both there)."""
    if __package__:
        import importlib
        return importlib.import_module("%s.%s" % (__package__, name))
    import importlib.util
    sys.dont_write_bytecode = True      # no __pycache__ in the job directory (0600 files only)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    spec = importlib.util.spec_from_file_location("remote_ops_job_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


jf = _sibling("jobfiles")


class Supervisor:
    def __init__(self, jobdir, lock_fd):
        self.jobdir = jobdir
        self.lock_fd = lock_fd
        self.job = jf.read_json(os.path.join(jobdir, "job.json")) or {}
        self.job_id = self.job.get("job_id") or os.path.basename(jobdir.rstrip("/"))
        self.proc = None
        self.pgid = None
        self.known = {}               # the client's processes and their descendants ({pid: start_ticks})
        self.server = None            # Server, when the playbook's extract has a server
        self.server_failure = None    # why the server ended the job (exit.json "server_failure")

    def path(self, name):
        return os.path.join(self.jobdir, name)

    def written(self):
        """What the job's output holds at its end (``written``), for its exit record; None without one."""
        dirs = jf.output_dirs(self.job)
        return jf.written(dirs, self.job.get("layout")) if dirs else None

    def _forward(self, signum, frame):
        # Someone signalled the supervisor itself: pass it on to the job (and its server), keep recording.
        import signal
        for pgid in (self.pgid, self.server.pgid if self.server else None):
            if pgid:
                try:
                    os.killpg(pgid, signal.SIGTERM)
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
        self.log_start = os.fstat(log_fd).st_size      # this job's part of the log starts here
        secrets, problem = jf.load_secrets(self.path("secrets.json"), job.get("secret_names") or [])
        if problem:
            # never start a job without the secrets it was launched with: it would run (and perhaps
            # fail much later, or download the wrong thing) for reasons nobody could see
            msg = "cannot start the job: %s" % problem
            jf.log_line(log_fd, msg)
            jf.write_json(self.path("exit.json"), {"exit_code": None, "signal": None, "ended_at": jf.now(),
                                                "start_error": msg, "cleanup": [], "samples": self.written()})
            return 0
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (job.get("env") or {}).items()})
        env.update({str(k): str(v) for k, v in secrets.items()})
        env.setdefault("PYTHONUNBUFFERED", "1")
        env[jf.MARKER] = self.job_id
        secrets = None
        output_dir = jf.output_dirs(job)
        layout = job.get("layout")
        initial, _ = jf.count_samples(output_dir, layout) if output_dir else (0, -1)
        if job.get("server"):
            # the server first (same marker, its own process group and log); the client once it is healthy,
            # or (client_start: launch) right after it, so that the client's own start overlaps the server's
            self.server = Server(self, job["server"], env, log_fd)
            if not self.server.start() or (not self.server.launch and self.server.wait_healthy() != "healthy"):
                env = None
                return 0
        import shlex   # the command as a shell would take it back: copyable, empty arguments kept
        jf.log_line(log_fd, "job %s starting: %s" % (self.job_id, shlex.join(job.get("command") or [])))
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
            jf.log_line(log_fd, msg)
            if self.server:
                self.server.stop()
            jf.write_json(self.path("exit.json"), {"exit_code": None, "signal": None, "ended_at": jf.now(),
                                                "start_error": msg, "cleanup": [], "samples": self.written()})
            return 0
        env = None
        self.pgid = self.proc.pid   # start_new_session: the job leads its own session and group
        self.known = {self.proc.pid: jf.proc_start_ticks(self.proc.pid)}
        started = jf.now()
        jf.write_json(self.path("run.json"), {
            "job_id": self.job_id, "command": job.get("command"), "log": log_path,
            "pid": self.proc.pid, "pgid": self.pgid, "supervisor_pid": os.getpid(),
            "started_at": started, "start_ticks": jf.proc_start_ticks(self.proc.pid),
            "boot_id": jf.boot_id(), "initial_samples": initial,
            "server": self.server.record() if self.server else None,
        })
        if self.server and self.server.launch:
            # the client runs while the server starts (it waits for the server itself): the same health
            # wait, watching the client as well
            ready = self.server.wait_healthy(client=self.proc)
            if ready == "ended":       # the server failed or the job was stopped: both stopped, exit.json written
                return 0
            # "client": it ended before the server answered. The server had not failed, so this is the end
            # of the client as any other (below: the server stopped, the client's exit status recorded), not
            # a server failure. "healthy": from here as when the client starts after the health check, the
            # watchdog counting from then (the client only waited before)
            rc = self.proc.wait() if ready == "client" else self._wait(log_fd, output_dir, self.server.healthy_at)
        else:
            rc = self._wait(log_fd, output_dir, started)
        sig = -rc if rc < 0 else None
        exit_rec = {"exit_code": rc if rc >= 0 else None, "signal": sig,
                    "signal_name": signal.Signals(sig).name if sig else None,
                    "ended_at": jf.now(), "cleanup": None, "samples": self.written()}
        if self.server_failure:
            exit_rec["server_failure"] = self.server_failure
        if self.server:
            # the job has ended when its server has: stopped before the exit is recorded, so a follower that
            # returns on the recorded exit finds the server's GPU memory released
            jf.log_line(log_fd, "client %s" % jf.describe_rc(rc))
            exit_rec["server"] = self.server.stop()
            try:      # requests the server refused and the client skipped: never "succeeded" (job/refused.py)
                exit_rec["refused"] = _sibling("refused").scan(log_path, self.log_start)
            except Exception as exc:     # noqa: BLE001 (reading the log must not lose the job's end)
                exit_rec["refused"] = {"count": 0, "indexes": [], "reasons": ["log not read: %s" % exc],
                                       "server_refusals": 0, "unread": True}
        jf.write_json(self.path("exit.json"), exit_rec)
        jf.log_line(log_fd, "job %s ended: %s" % (
            self.job_id, "exit code %d" % rc if rc >= 0 else "killed by %s" % exit_rec["signal_name"]))
        exit_rec["cleanup"] = self._cleanup(log_fd)
        exit_rec["disk_observed"] = self._disk_observed(log_path, output_dir)
        jf.write_json(self.path("exit.json"), exit_rec)
        os.close(log_fd)
        return 0

    def _disk_observed(self, log_path, output_dir):
        """The job's own write speed kept for the next launch plan (diskspeed.record_observed), from
        its ``extract-profile`` line: {recorded, why?, observed?}. Never fails the job's ending."""
        cache = self.job.get("diskspeed_cache")
        if not cache:
            return {"recorded": False, "why": "no output directory (or launched by an older remote-ops, which kept no job speeds)"}
        try:
            profile = jf.last_json_line(log_path, "extract-profile ", self.log_start, max_bytes=262144)
            if profile is None:
                return {"recorded": False, "why": "the job printed no extract-profile line"}
            return _sibling("diskspeed").record_observed(output_dir, profile, self.job_id, cache=cache)
        except Exception as exc:     # noqa: BLE001 (a cache problem must not turn into a lost job)
            return {"recorded": False, "why": "%s: %s" % (type(exc).__name__, exc)}

    def _wait(self, log_fd, output_dir, started):
        import subprocess
        limit = float(self.job.get("watchdog_seconds") or 0)
        poll = max(0.2, min(5.0, limit / 4)) if limit else 5.0

        def progress():
            try:
                size = os.fstat(log_fd).st_size
            except OSError:
                size = None
            if size is not None and self.server:
                size -= self.server.relayed   # the server's lines copied into the log are not progress
            return size, (jf.count_samples(output_dir, self.job.get("layout")) if output_dir else None)

        last, last_change, stalled = progress(), started, False
        poll = min(poll, 1.0)
        while True:
            try:
                return self.proc.wait(timeout=poll)
            except subprocess.TimeoutExpired:
                pass
            self.track()
            if self.server:
                self.server.relay()
                died = self.server.proc.poll()
                if died is not None and self.proc.poll() is None:
                    self.server_failure = self.server.died_while_client_ran(died)
                    return self._end_client()
            if not limit:
                continue
            cur, t = progress(), jf.now()
            if cur != last:
                last_change = t
                if stalled:
                    stalled = False
                    jf.write_json(self.path("watchdog.json"), {"stalled": False, "resumed_at": t,
                                                            "limit_s": limit})
                    jf.log_line(log_fd, "watchdog: progress resumed")
            elif not stalled and t - last_change >= limit:
                stalled = True
                jf.write_json(self.path("watchdog.json"), {"stalled": True, "since": last_change,
                                                        "flagged_at": t, "limit_s": limit})
                jf.log_line(log_fd, "watchdog: no new log output and no new output files for %ds "
                                 "(a hung NCCL start looks like this)" % (t - last_change))
            last = progress()   # our own log lines are not progress

    def track(self):
        """Record the new descendants of the client and of the server (a worker that leaves its group is
        still the job's); ``pids.json``, which stop and the cleanup read, rewritten when either grew."""
        try:
            grew = self.proc is not None and jf.track_descendants(self.proc.pid, self.known)
            if self.server and self.server.proc is not None \
                    and jf.track_descendants(self.server.proc.pid, self.server.known):
                grew = True
            if grew:
                both = {**(self.server.known if self.server else {}), **self.known}
                jf.write_json(self.path("pids.json"), {str(k): v for k, v in both.items()})
        except OSError:
            pass

    def _end_client(self):
        """The server is gone: TERM the client's group, KILL it after the cleanup grace; its status."""
        import signal
        import subprocess
        jf.kill_all([], self.pgid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=float(self.job.get("cleanup_grace") or 10))
        except subprocess.TimeoutExpired:
            jf.kill_all([], self.pgid, signal.SIGKILL)
            return self.proc.wait()

    def _cleanup(self, log_fd):
        """Nothing of the job may outlive it: TERM, grace, KILL whatever still carries the marker."""
        import signal
        me = {os.getpid()}
        known = {int(k): v for k, v in (jf.read_json(self.path("pids.json"), {}) or {}).items()}

        def leftovers():
            return sorted(set(jf.marker_pids(self.job_id, me)) | set(jf.group_pids(self.pgid, me))
                          | (set(jf.known_alive(known)) - me))
        left = leftovers()
        if not left:
            return []
        jf.log_line(log_fd, "stopping %d leftover process(es) of the job: %s" % (
            len(left), ", ".join(map(str, left))))
        jf.kill_all(left, self.pgid, signal.SIGTERM)
        deadline = jf.now() + float(self.job.get("cleanup_grace") or 10)
        first = left
        while jf.now() < deadline:
            time.sleep(0.1)
            left = leftovers()
            if not left:
                break
        if left:
            jf.kill_all(left, self.pgid, signal.SIGKILL)
        return [{"pid": p, "signal": "SIGKILL" if p in left else "SIGTERM"} for p in first]


class Server:
    """The job's server (a two-process job: ``extract.server`` of the playbook): started by the
    supervisor before the client, in its own process group, with the job's marker and environment plus
    its own, its output in ``server.log`` (relayed into the job's log as ``[server] ...`` lines), ready
    when ``GET http://127.0.0.1:PORT/PATH`` answers 200 (stdlib urllib, loopback). ``server.json``
    records pid, group, port and state for status and stop. ``client_start``: the client is started once
    the server is healthy (``healthy``, the default), or right after the server (``launch``: the client
    waits for the server itself, and the health wait watches the client too)."""

    def __init__(self, sup, spec, env, log_fd):
        self.sup, self.spec, self.log_fd = sup, spec, log_fd
        self.env = dict(env)
        self.env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
        self.log = sup.path("server.log")
        self.proc = self.pgid = None
        self.offset = 0           # how far server.log has been relayed
        self.relayed = 0          # bytes written into the job's log by the relay
        self.partial = b""
        self.known = {}
        self.state = "starting"
        self.started_at = self.healthy_at = None
        self.launch = spec.get("client_start") == "launch"

    def record(self):
        return {"pid": self.proc.pid if self.proc else None, "pgid": self.pgid,
                "start_ticks": jf.proc_start_ticks(self.proc.pid) if self.proc else None,
                "port": self.spec.get("port"), "health": self.url(), "log": self.log,
                "command": self.spec.get("command"), "state": self.state,
                "started_at": self.started_at, "healthy_at": self.healthy_at}

    def save(self, **extra):
        rec = self.record()
        rec.update(extra)
        jf.write_json(self.sup.path("server.json"), rec)

    def url(self):
        path = self.spec.get("health_path") or "/health"
        return "http://127.0.0.1:%d%s" % (int(self.spec.get("port") or 0), path if path.startswith("/") else "/" + path)

    def relay(self, final=False):
        """Copy server.log's new complete lines into the job's log as ``[server] LINE``."""
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(1 << 20)
        except OSError:
            return
        if not data and not (final and self.partial):
            return
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = b"" if final else lines.pop()
        out = [b"[server] " + l.split(b"\r")[-1] + b"\n" for l in lines if l.split(b"\r")[-1].strip()]
        if not out:
            return
        block = b"".join(out)
        try:
            with open(self.sup.job.get("log") or self.sup.path("log"), "rb") as fh:
                fh.seek(0, os.SEEK_END)
                if fh.tell():
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        block = b"\n" + block   # after a client's unfinished (tqdm) line
            os.write(self.log_fd, block)
            self.relayed += len(block)
        except OSError:
            pass

    def healthy(self):
        import urllib.error
        import urllib.request
        # no proxy: the server is on loopback, and an http_proxy in the host's environment must not carry the
        # check elsewhere (run_clients.py's wait does the same)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(self.url(), timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def start(self):
        """Start the server (``server.json``: state starting); False when it cannot start (exit.json written)."""
        import subprocess
        spec, sup = self.spec, self.sup
        import shlex
        jf.log_line(self.log_fd, "server starting: %s" % shlex.join(spec.get("command") or []))
        slog = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.proc = subprocess.Popen(spec["command"], cwd=sup.job.get("workdir") or None, env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=slog, stderr=slog,
                                         start_new_session=True, close_fds=True)
        except (OSError, KeyError, TypeError, ValueError) as exc:
            msg = "cannot start the server: %s" % (exc.strerror if isinstance(exc, OSError) and exc.strerror
                                                   else exc)
            if isinstance(exc, OSError) and exc.filename:
                msg += ": %s" % exc.filename
            self._fail(msg)
            return False
        finally:
            os.close(slog)
            self.env = None
        self.pgid = self.proc.pid
        self.started_at = jf.now()
        self.known = {self.proc.pid: jf.proc_start_ticks(self.proc.pid)}
        self.save()
        return True

    def wait_healthy(self, client=None):
        """Poll the health check until it answers 200: "healthy" (``server.json`` records when), or "ended"
        when the job cannot go on (the server exited, did not answer in time, or the job was stopped;
        exit.json written, nothing of the job left). With ``client`` (client_start: launch, the client
        already running): also "client" when the client ended first; the job's end stops the client too."""
        sup = self.sup
        timeout = float(self.spec.get("health_timeout") or 600)
        jf.log_line(self.log_fd, "waiting for %s (up to %ds)" % (self.url(), timeout))
        deadline = self.started_at + timeout
        while True:
            self.relay()
            sup.track()
            rc = self.proc.poll()
            if rc is not None:
                self.relay(final=True)
                if os.path.exists(sup.path("stop.json")):
                    return self._stopped()
                return self._fail("the server exited (%s) before it answered %s" % (jf.describe_rc(rc), self.url()),
                                  rc)
            if os.path.exists(sup.path("stop.json")):
                self.stop()
                return self._stopped()
            # a client that ended after the server answered (a short job, within one poll) still saw it healthy:
            # the check comes first, so the readiness is recorded
            ended = client is not None and client.poll() is not None
            if self.healthy():
                self.healthy_at = jf.now()
                self.state = "healthy"
                self.save()
                jf.log_line(self.log_fd, "server healthy after %.1fs: %s" % (self.healthy_at - self.started_at,
                                                                          self.url()))
                return "healthy"
            if ended:
                return "client"
            if jf.now() >= deadline:
                self.stop()
                return self._fail("the server did not answer %s with 200 within %ds" % (self.url(), timeout))
            # with the client running (launch) its rate is timed from healthy_at: a finer poll
            time.sleep(0.5 if client is None else 0.1)

    def died_while_client_ran(self, rc):
        self.relay(final=True)
        self.state = "exited"
        self.save(exit=jf.describe_rc(rc), ended_at=jf.now())
        msg = "the server exited (%s) while the client ran" % jf.describe_rc(rc)
        jf.log_line(self.log_fd, msg + "; stopping the client")
        return msg

    def _fail(self, msg, rc=None):
        """The server ended the job before it was healthy: exit.json says why (as for a job whose client never
        started, whether or not it had: client_start launch); "ended"."""
        self.state = "failed"
        if self.proc is not None:
            self.save(exit=jf.describe_rc(rc) if rc is not None else None, ended_at=jf.now())
        jf.log_line(self.log_fd, msg)
        self._stop_client()
        jf.write_json(self.sup.path("exit.json"), {"exit_code": None, "signal": None, "ended_at": jf.now(),
                                                "start_error": msg, "failed_by": "server", "cleanup": [],
                                                "samples": self.sup.written()})
        self.sup._cleanup(self.log_fd)
        return "ended"

    def _stopped(self):
        """remote-ops' stop came while the server started: "ended". exit.json says so by ``before_client``, or
        ``before_healthy`` when the client was already running (launch): status says the same of both."""
        self.state = "stopped"
        self.save(ended_at=jf.now())
        ran = self._stop_client()
        jf.log_line(self.log_fd, "stopped while the server was starting" if ran else "stopped before the client started")
        jf.write_json(self.sup.path("exit.json"), {"exit_code": None, "signal": None, "ended_at": jf.now(),
                                                "before_healthy" if ran else "before_client": True, "cleanup": [],
                                                "samples": self.sup.written()})
        self.sup._cleanup(self.log_fd)
        return "ended"

    def _stop_client(self):
        """With client_start launch the client runs while the server starts: a job that ends then ends it
        too (TERM to its group, KILL after the grace), before exit.json is written. Whether it had started."""
        sup = self.sup
        if sup.proc is None:
            return False
        if sup.proc.poll() is None:
            jf.log_line(self.log_fd, "stopping the client (process group %d)" % sup.pgid)
        jf.log_line(self.log_fd, "client %s" % jf.describe_rc(sup._end_client()))
        return True

    def stop(self):
        """TERM the server's group, KILL it after the cleanup grace; what happened."""
        import signal
        import subprocess
        if self.proc is None:
            return None
        rc = self.proc.poll()
        how = "had exited (%s)" % jf.describe_rc(rc) if rc is not None else None
        if rc is None:
            jf.log_line(self.log_fd, "stopping the server (process group %d)" % self.pgid)
            jf.kill_all(jf.known_alive(self.known), self.pgid, signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=float(self.sup.job.get("cleanup_grace") or 10))
                how = "stopped with SIGTERM (%s)" % jf.describe_rc(rc)
            except subprocess.TimeoutExpired:
                jf.kill_all(jf.known_alive(self.known), self.pgid, signal.SIGKILL)
                rc = self.proc.wait()
                how = "killed with SIGKILL"
        self.relay(final=True)
        if self.state not in ("failed", "exited", "stopped"):
            self.state = "stopped"
            self.save(exit=jf.describe_rc(rc), ended_at=jf.now())
        return {"exit": jf.describe_rc(rc), "how": how}


def main(argv):
    jobdir = argv[1]
    lock_fd = int(argv[2]) if len(argv) > 2 else None
    try:
        return Supervisor(jobdir, lock_fd).run()
    finally:      # exit.json is written: the output directory is free for the next job
        job = jf.read_json(os.path.join(jobdir, "job.json")) or {}
        for d in jf.output_dirs(job):
            jf.release_output(d, job.get("job_id"))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
