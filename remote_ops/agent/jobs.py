"""Long-running jobs on the host: launch under a detached supervisor, status, tail, logs, stop.

Layout (private: directories 0700, files 0600)::

    $REMOTE_OPS_STATE_DIR/jobs/           (default ~/.remote-ops/jobs/)
        <slot>.lock                       serialises launches of one job slot (flock)
        <slot>.current                    {"job_id": ...} of the slot's latest job (tmp + rename)
        <job-id>/job.json                 what to run (no secret values, only their names), its shard
        <job-id>/run.json                 written by the supervisor: pid, pgid, start time
        <job-id>/run.lock                 flock held by the live supervisor, and only by it
        <job-id>/exit.json                real exit status, written by the supervisor
        <job-id>/stop.json, watchdog.json, log, supervisor.py (jobfiles.py, layout.py, diskspeed.py, refused.py beside it), supervisor.log
    <output_dir>/.remote-ops-job.json     the job writing there now (job/outputlock.py)

A slot is what the job is (``job/status.slot``): the playbook's key and the real path of its output
directory, ``<key>--<hash>``; not the inventory name, so one machine under two names with one state
dir runs one job per output directory. A launch takes ``<slot>.lock``, and if the slot's current job's
supervisor still holds its ``run.lock`` the launch attaches instead of starting a second copy, when
that job is the one asked for (same shard), and is refused otherwise. The new job's ``run.lock`` is
locked *before* the supervisor starts and handed to it as an inherited descriptor, so there is no
instant at which a started job looks unclaimed: a controller killed at any point of the launch leaves
either no job, a job that never started (reported lost, replaced by the next launch) or one running
job. The output directory's marker is claimed under that lock, after ``run.lock``: a job of another
slot, state dir or machine writing there refuses the launch.
"""

import errno
import fcntl
import os
import sys
import time

from . import gpu
from .job import jobfiles
from .job.filewait import FileWait
from .job.status import (TERMINAL, _current_id, _jobdir, _jobs_in, _pid_alive, _read_tail, job_status, safe_key,
                         real_output_dir, slot, standin_label, state_dir)
from .protocol import AgentFailure


# ------------------------------------------------------------------ launching
def _module_source(mod):
    """A module's source (the supervisor and the files beside it), to run it as its own script outside
    the agent."""
    path = getattr(mod, "__file__", "") or ""
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    # shipped by the bootstrap (bundle.py): its importer is the module's loader and serves the source
    loader = getattr(mod, "__loader__", None)
    if loader is not None and hasattr(loader, "get_source"):
        try:
            src = loader.get_source(mod.__name__)
            if src:
                return src
        except ImportError:
            pass
    raise AgentFailure("internal", "cannot find the source of %s to start the job" % mod.__name__)


def write_job_scripts(jobdir):
    """The supervisor and the files it loads from beside itself, written into ``jobdir`` (each new,
    0600): jobfiles.py (its helpers), layout.py (sample names, through jobfiles), diskspeed.py and
    refused.py (read when the job ends). The supervisor script's path."""
    from .job import diskspeed, refused, supervisor
    from .outputs import layout
    for mod, fname in ((supervisor, "supervisor.py"), (jobfiles, "jobfiles.py"), (layout, "layout.py"),
                       (diskspeed, "diskspeed.py"), (refused, "refused.py")):
        fd = os.open(os.path.join(jobdir, fname), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(_module_source(mod))
    return os.path.join(jobdir, "supervisor.py")


class _LaunchLock:
    def __init__(self, path, timeout):
        self.path, self.timeout, self.fd = path, timeout, None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.time() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if time.time() > deadline:
                os.close(self.fd)
                raise AgentFailure("busy", "another launch of this job is in progress on the host",
                                   "wait a few seconds and run the command again")
            time.sleep(0.05)

    def __exit__(self, *exc):
        os.close(self.fd)


# ------------------------------------------------------------------ status
def _resolve(args):
    if args.get("job_id"):
        return args["job_id"]
    if args.get("key"):
        job_id = _current_id(args["key"], args.get("output_dir"))
        if job_id:
            return job_id
        where = " writing %s" % args["output_dir"] if args.get("output_dir") else ""
        raise AgentFailure("no-job", "no job of %s%s on this host" % (safe_key(args["key"]), where),
                           "start one with: remote-ops extract HOST (remote-ops status HOST --all lists the jobs)")
    raise AgentFailure("bad-args", "key or job_id is required")


def op_status(args):
    return job_status(_resolve(args))


def op_probe(args):
    """Preflight facts in one go: the playbook's current job and free disk at the output dir."""
    out = {"job": None, "disk": None}
    job_id = _current_id(args["key"], args.get("output_dir")) if args.get("key") else None
    if job_id:
        try:
            out["job"] = job_status(job_id)
        except AgentFailure:
            out["job"] = None
    if args.get("port"):
        out["port"] = port_free(int(args["port"]))
    dirs = _output_dirs(args)
    if out["job"] and out["job"].get("state") in ("starting", "running"):
        out["other_dirs"] = _other_dirs(out["job"], dirs)
    if dirs:
        path = dirs[0]
        probe = path
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        try:
            st = os.statvfs(probe)
            done, top = jobfiles.count_samples(dirs, args.get("layout"))
            sizes = []
            if done:
                for i in range(max(0, top - 20), top + 1):
                    for d in dirs:
                        try:
                            sizes.append(os.path.getsize(os.path.join(d, jobfiles.sample_name(args.get("layout"), i))))
                            break
                        except OSError:
                            pass
            out["disk"] = {"path": path, "measured_at": probe, "free_bytes": st.f_bavail * st.f_frsize,
                           "existing_samples": done, "max_index": top,
                           "mean_sample_bytes": int(sum(sizes) / len(sizes)) if sizes else None}
            if len(dirs) > 1:
                from .outputs.run_identity import same_dirs
                out["disk"]["dirs"] = dirs
                twice = same_dirs(dirs)
                if twice:
                    out["disk"]["twice"] = ("output_dir names one directory twice: %s and %s are the same "
                                            "directory on the host (a symlink or a mount of it)" % twice)
            from .outputs.data_config import read_data_config      # the shard its data_config.json records
            out["disk"]["shard"] = (read_data_config(path) or {}).get("shard")
            from .job import outputlock     # a job writing there now (any state dir, any machine), in any of them
            for d in dirs:
                held = outputlock.read(d)
                if held and held.get("job_id") != job_id:
                    state = outputlock.holder_state(held)
                    if state != "stale":
                        out["disk"]["held_by"] = {"job_id": held.get("job_id"), "shard": held.get("shard"),
                                                  "state": state, "line": outputlock.clash(held, d).message,
                                                  "hint": outputlock.clash(held, d).hint}
                        break
        except OSError as exc:
            out["disk"] = {"path": path, "error": str(exc)}
        if args.get("need") and not out["disk"].get("error"):   # from real sizes: agent/job/diskneed.py
            from .job import diskneed
            out["disk"]["need"] = diskneed.for_job(args["need"], dirs if len(dirs) > 1 else path)
        if args.get("speed") is not None and not out["disk"].get("error"):   # agent/job/diskspeed.py
            from .job import diskspeed
            running = (out["job"] or {}).get("state") in ("starting", "running")
            fits = (out["disk"].get("need") or {}).get("fits") is True
            # measured only for a job that fits (a full disk is not written to) and never under a running
            # job; a tenth of the free space at most
            if running or not fits:
                out["disk"]["speed"] = diskspeed.lookup(path) or {"error": "not measured: %s" % (
                    "a job writes there" if running else "no disk need that fits")}
            else:
                out["disk"]["speed"] = diskspeed.for_dir(path, refresh=bool(args["speed"].get("refresh")),
                                                         size=min(diskspeed.TEST_BYTES, out["disk"]["free_bytes"] // 10))
        if args.get("identity"):
            out["identity"] = identity_check(args["identity"], dirs)
    if args.get("prepared"):
        out["prepared"] = prepared_check(args["prepared"])
    return out


def _other_dirs(st, dirs):
    """The one line when the running job ``st`` (of this slot: same first directory) writes another list
    of output directories than ``dirs``, else None: attaching to it would not be the job asked for."""
    theirs = [real_output_dir(d) for d in (st.get("output_dirs") or [st.get("output_dir")]) if d]
    if theirs == [real_output_dir(d) for d in dirs]:
        return None
    return "%s is being written by job %s into %s; this launch names %s" % (
        dirs[0] if dirs else theirs[0], st.get("job_id"), ", ".join(theirs), ", ".join(dirs) or "no directory")


def _output_dirs(args):
    """The output directories a request names: ``output_dirs`` (several, in order), else
    [``output_dir``], else []; ``~`` expanded."""
    dirs = args.get("output_dirs") or ([args["output_dir"]] if args.get("output_dir") else [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) and d for d in dirs):
        raise AgentFailure("bad-args", "output_dirs must be a list of directories")
    return [os.path.expanduser(d) for d in dirs]


def identity_check(req, output_dirs):
    """The run identity of the job ``req`` describes ({command, workdir, flow, playbook, python, env,
    fallback}: run_identity.py) against the run.json of each of ``output_dirs``: run_identity.check_dirs's
    record plus the identity and, for another run's samples, the one line that refuses the launch."""
    from .outputs import run_identity as ri
    try:
        ident = job_identity(req)
    except ri.IdentityError as exc:
        return {"error": str(exc)}
    if req.get("tasks"):          # a Slurm array: each task's own share directory (agent/slurm.py)
        return _task_identities(ident, output_dirs[0], req["tasks"])
    res = ri.check_dirs(output_dirs, ident)
    res["identity"] = ident
    res["line"] = ri.refusal(res["problem"]) if res["problem"] else None
    return res


def _task_identities(ident, output_dir, n):
    """Each array task k of a Slurm job of ``n`` tasks against the run.json of its directory
    ``output_dir``/shard-k-of-n, with its shard in the identity (the one it computes for itself): the
    tasks, the first task refused and its line (another run's samples: move it aside or a new path,
    since --overwrite is not offered for Slurm), else the note saying what each task will do."""
    from .outputs import run_identity as ri
    from .outputs.shares import dir_name
    tasks = []
    for k in range(n):
        d = os.path.join(output_dir, dir_name(k, n))
        r = ri.check(d, dict(ident, shard={"index": k, "count": n}))
        tasks.append(dict(r, task=k, output_dir=d))
    bad = [t for t in tasks if t["problem"]]
    res = {"identity": ident, "digest": ri.digest(ident), "tasks": tasks, "state": bad[0]["state"] if bad else
           "same" if all(t["state"] == "same" for t in tasks) else "new",
           "samples": sum(t["samples"] for t in tasks), "problem": bad[0]["problem"] if bad else None,
           "recorded": None, "differences": bad[0]["differences"] if bad else []}
    if bad:
        more = (" (also task(s) %s: %s)" % (", ".join(str(t["task"]) for t in bad[1:]),
                                            ", ".join(t["output_dir"] for t in bad[1:])) if bad[1:] else "")
        res["line"] = "array task %d: %s%s: %s" % (bad[0]["task"], bad[0]["problem"], more,
                                                  ri.refusal(None, slurm=[t["output_dir"] for t in bad]))
        return res
    resumed = [t for t in tasks if t["state"] == "same" and t["samples"]]
    res["line"] = ("run identity %s: %s" % (res["digest"][:12], "; ".join(
        ["task(s) %s resume their %d sample file(s) (run.json)" % (", ".join(str(t["task"]) for t in resumed),
                                                                    sum(t["samples"] for t in resumed))]
        * bool(resumed) + ["task(s) %s record it in their shard-K-of-%d/run.json as they start"
                           % (", ".join(str(t["task"]) for t in tasks if t not in resumed), n)]
        * bool(len(resumed) < n))))
    return res


def _server_inputs(server_command, fallback):
    """A server flow's identity inputs: the server's flags (--max-model-len), its model (``serve
    MODEL``) and captured layers (``eagle_aux_hidden_state_layer_ids`` in its JSON), then ``fallback``."""
    import re
    from .outputs import run_identity as ri
    out = ri.command_inputs(server_command)
    if "serve" in server_command[:-1] and out.get("model") is None:
        out["model"] = server_command[server_command.index("serve") + 1]
    for word in server_command:
        m = re.search(r'"eagle_aux_hidden_state_layer_ids"\s*:\s*\[([^\]]*)\]', word)
        if m and out.get("layer_ids") is None:
            out["layer_ids"] = ri.layer_ids(m.group(1))
    for key, value in fallback.items():
        if out.get(key) is None and value not in (None, ""):
            out[key] = ri.layer_ids(value) if key == "layer_ids" and isinstance(value, str) else value
    return out


def job_identity(req):
    """The identity the job will compute for itself (extract_hidden_states.py's check_run_identity):
    its command's flags, its working directory, the versions its interpreter sees with its env. A
    server flow's command does not name the dataset or model by those flags: ``fallback`` (the
    playbook's extract.disk) fills what it lacks."""
    import json
    import subprocess
    from .outputs import run_identity as ri
    command = req.get("command") or []
    workdir = os.path.realpath(os.path.expanduser(req.get("workdir") or "~"))
    inputs = ri.command_inputs(command)
    if req.get("flow") == "server":
        for key, value in _server_inputs(req.get("server_command") or [], req.get("fallback") or {}).items():
            if inputs.get(key) is None and value not in (None, ""):
                inputs[key] = value
    python = req.get("python") or sys.executable
    env = dict(os.environ)
    env.update(req.get("env") or {})
    env.pop(jobfiles.MARKER, None)
    prepared = None
    if req.get("flow") == "server":
        # the server refuses a row of max_model_len tokens or more and never cuts one: max_model_len changes
        # no file it writes, so raising it (the fix for refused rows) resumes the same run
        inputs["max_model_len"] = None
        prepared = prepared_path(command, inputs.get("dataset"), workdir)
        if prepared is not None:      # an Arrow directory (prepare-data): hashed by its data files
            inputs["dataset"] = None
    try:
        proc = subprocess.run([python, "-c", ri.VERSIONS_CODE, json.dumps(list(ri.PACKAGES))], cwd=workdir,
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        versions = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as exc:
        raise ri.IdentityError("cannot read the package versions of %s: %s" % (python, exc)) from None
    ident = ri.identity(inputs, cwd=workdir, flow=req.get("flow") or "generator", playbook=req.get("playbook"),
                        versions=versions)
    if prepared is not None:
        from .outputs import prepared as prep
        try:
            ident["dataset"] = prep.facts(prepared, python, env)
        except OSError as exc:
            raise ri.IdentityError("cannot read the prepared data %s: %s" % (prepared, exc.strerror or exc)) from None
    return ident


def prepared_path(command, dataset, workdir):
    """The server flow's prepared data directory (the client's ``--preprocessed-data``, else the
    identity's dataset) as an absolute real path, when it is one that ``save_to_disk`` wrote; else None."""
    from .outputs import prepared as prep
    from .outputs import run_identity as ri
    path = ri.command_inputs([w.replace("--preprocessed-data", "--dataset", 1) if w.startswith("--preprocessed-data")
                              else w for w in command]).get("dataset") or dataset
    if not path:
        return None
    full = os.path.realpath(os.path.join(workdir, os.path.expanduser(path)))
    return full if os.path.isdir(full) and prep.is_prepared(full) else None


def prepared_check(req):
    """The preflight's reading of the server flow's prepared data ({command, workdir, python, env,
    max_samples, max_model_len}): outputs/prepared.py long_rows, with the path; None when the client's
    data is not an Arrow directory."""
    from .outputs import prepared as prep
    workdir = os.path.realpath(os.path.expanduser(req.get("workdir") or "~"))
    path = prepared_path(req.get("command") or [], None, workdir)
    if path is None:
        return None
    env = dict(os.environ)
    env.update(req.get("env") or {})
    env.pop(jobfiles.MARKER, None)
    out = prep.long_rows(path, req.get("python") or sys.executable, env, req.get("max_model_len"),
                         req.get("max_samples"))
    out["path"] = path
    return out




def port_free(port):
    """{"port", "free", "error"}: can a server bind ``port`` on every address (what a server that listens
    on 0.0.0.0 needs)? The socket is closed at once; nothing keeps the port."""
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        return {"port": port, "free": True, "error": None}
    except OSError as exc:
        return {"port": port, "free": False, "error": exc.strerror or str(exc)}
    finally:
        s.close()


def op_list(args):
    return {"jobs": _jobs_in(state_dir(), args.get("key"))}


# ------------------------------------------------------------------ launch
def _str_dict(value, what):
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise AgentFailure("bad-args", "%s must map names to strings" % what)
    return value


def _server_args(server):
    """The server of a two-process job, checked: {command, env, port, health_path, health_timeout} and
    client_start when it is not the default ("healthy": the client once the server answers; "launch":
    right after the server, the client waiting for it itself)."""
    if server is None:
        return None
    if not isinstance(server, dict):
        raise AgentFailure("bad-args", "server must be a mapping")
    command = server.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise AgentFailure("bad-args", "server.command must be a non-empty list of strings")
    port = server.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise AgentFailure("bad-args", "server.port must be a port number")
    start = server.get("client_start", "healthy")
    if start not in ("healthy", "launch"):
        raise AgentFailure("bad-args", "server.client_start must be healthy or launch")
    return {"command": command, "env": _str_dict(server.get("env"), "server.env"), "port": port,
            "health_path": str(server.get("health_path") or "/health"),
            "health_timeout": float(server.get("health_timeout") or 600),
            **({"client_start": start} if start != "healthy" else {})}


def op_launch(args):
    # imported here, not for every exec of the agent (status, logs and facts do not need them)
    import secrets as _secrets
    key = safe_key(args.get("key"))
    command = args.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise AgentFailure("bad-args", "command must be a non-empty list of strings")
    env = _str_dict(args.get("env"), "env")
    secret_values = _str_dict(args.get("secrets"), "secrets")
    workdir = os.path.expanduser(args.get("workdir") or "~")
    dirs = _output_dirs(args)
    output_dir = dirs[0] if dirs else None
    shard = _shard_arg(args.get("shard"))
    _plan_arg(args.get("plan"))          # refused before anything is made
    root = state_dir()
    name = slot(key, output_dir)
    with _LaunchLock(os.path.join(root, name + ".lock"), float(args.get("lock_timeout", 30))):
        cur = _current_id(key, output_dir)
        if cur:
            try:
                st = job_status(cur)
            except AgentFailure:
                st = None
            if st and st["state"] in ("starting", "running"):
                # attach only to the job asked for: same output directory (the slot) and same share
                if _shard_arg(st.get("shard")) != shard:
                    from .job import outputlock
                    raise AgentFailure(
                        "busy", "%s is being written by job %s (%s); this launch is %s" % (
                            output_dir, cur, outputlock.shard_text(_shard_arg(st.get("shard"))),
                            outputlock.shard_text(shard)),
                        "one output directory holds one job: give each share its own output_dir "
                        "(e.g. with {host}), or stop that job first")
                differ = _other_dirs(st, dirs)
                if differ:
                    raise AgentFailure("busy", differ, "stop that job first (remote-ops stop HOST --job %s), or "
                                       "launch with its output directories" % st.get("job_id"))
                if args.get("overwrite"):      # never dropped silently: that job writes this directory now
                    raise AgentFailure("busy", overwrite_running(st, output_dir), overwrite_running_hint(st))
                return {"attached": True, "job": st}
        if not os.path.isdir(workdir):
            raise AgentFailure("no-workdir", "workdir %s does not exist on the host" % workdir)
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        job_id = "%s-%s-%s" % (key, time.strftime("%Y%m%d-%H%M%S"), _secrets.token_hex(3))
        jobdir = os.path.join(root, job_id)
        os.mkdir(jobdir, 0o700)
        return _start(args, job_id, jobdir, key, name, command, workdir, env, secret_values, dirs, shard)


def _plan_arg(value):
    """What status needs of the launch plan (extract/plan.py): the bytes the job writes per token."""
    bpt = (value or {}).get("bytes_per_token") if isinstance(value, dict) else None
    if bpt is None:
        return None
    if isinstance(bpt, bool) or not isinstance(bpt, (int, float)) or bpt <= 0:
        raise AgentFailure("bad-args", "plan.bytes_per_token must be a positive number, got %r" % (bpt,))
    return {"bytes_per_token": float(bpt)}


def _shard_arg(value):
    """[k, n] from the launch's ``shard`` (a pair), else None."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value) or not 0 <= value[0] < value[1]:
        raise AgentFailure("bad-args", "shard must be [k, n] with 0 <= k < n, got %r" % (value,))
    return [value[0], value[1]]


def _start(args, job_id, jobdir, key, name, command, workdir, env, secret_values, dirs, shard):
    """The new job ``job_id`` (under the slot's launch lock): its files, the output directories'
    markers, ``<slot>.current`` and the detached supervisor."""
    import subprocess
    root = state_dir()
    output_dir = dirs[0] if dirs else None
    lock_fd = os.open(os.path.join(jobdir, "run.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    from .job import outputlock
    claimed = []

    def undo():
        for d in claimed:
            jobfiles.release_output(d, job_id)
        os.close(lock_fd)
        import shutil
        shutil.rmtree(jobdir, ignore_errors=True)   # nothing of this launch is left to list
    try:
        # one job per output directory: refused here when another job writes in any of them (the
        # directories are claimed in order; a refusal releases those this launch took)
        for d in dirs:
            outputlock.claim(d, {"job_id": job_id, "jobdir": jobdir, "key": key, "shard": shard, "output_dirs":
                                 dirs if len(dirs) > 1 else None, "pid": os.getpid(),
                                 "start_ticks": jobfiles.proc_start_ticks(os.getpid())})
            claimed.append(d)
        # the run identity, once this job holds the directories (no other job's files move)
        identity = _record_identity(dirs, args.get("identity"), bool(args.get("overwrite"))) if dirs else None
        short = None
        if args.get("layout") == "hs_safetensors" and output_dir:   # issue 50 item 2: outputs/shortfiles.py
            from .outputs import shortfiles
            ids = (args.get("identity") or {}).get("layer_ids") if isinstance(args.get("identity"), dict) else None
            short = shortfiles.set_aside(output_dir, len(ids) if isinstance(ids, list) else None)
    except BaseException:
        undo()
        raise
    log = os.path.join(jobdir, "log")
    from .job import diskspeed
    jobfiles.write_json(os.path.join(jobdir, "job.json"), {
        "job_id": job_id, "key": key, "command": command, "workdir": workdir, "env": env,
        "secret_names": sorted(secret_values), "output_dir": output_dir, "log": log,
        **({"output_dirs": dirs} if len(dirs) > 1 else {}),
        "expected_samples": args.get("expected_samples"),
        "watchdog_seconds": args.get("watchdog_seconds"),
        "cleanup_grace": args.get("cleanup_grace", 10), "created_at": time.time(),
        "launcher_pid": os.getpid(), "playbook": args.get("playbook"),
        "label": standin_label(command, workdir),
        "layout": args.get("layout"), "server": _server_args(args.get("server")), "shard": shard,
        "plan": _plan_arg(args.get("plan")),
        # where the supervisor keeps the job's own write speed for the next plan (diskspeed.record_observed)
        "diskspeed_cache": diskspeed.cache_dir() if dirs else None,
    })
    if secret_values:
        fd = os.open(os.path.join(jobdir, "secrets.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            import json
            json.dump(secret_values, fh)
    script = write_job_scripts(jobdir)
    os.close(os.open(log, os.O_WRONLY | os.O_CREAT, 0o600))
    if short and short["moved"]:
        from .outputs import shortfiles
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(shortfiles.line(short) + "\n")
    jobfiles.write_json(os.path.join(root, name + ".current"), {"job_id": job_id})
    sup_env = {k: v for k, v in os.environ.items() if k != jobfiles.MARKER}
    sup_log = os.open(os.path.join(jobdir, "supervisor.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen([sys.executable, script, jobdir, str(lock_fd)], cwd=jobdir, env=sup_env,
                                stdin=subprocess.DEVNULL, stdout=sup_log, stderr=sup_log,
                                start_new_session=True, close_fds=True, pass_fds=(lock_fd,))
    finally:
        os.close(sup_log)
        os.close(lock_fd)   # the supervisor holds the lock from here on
    for d in dirs:          # the markers' process from here on is the supervisor
        try:
            outputlock.update(d, job_id, pid=proc.pid, start_ticks=jobfiles.proc_start_ticks(proc.pid))
        except OSError:
            pass            # the run.lock check still tells it live

    deadline = time.time() + float(args.get("start_timeout", 20))
    while time.time() < deadline:
        if os.path.exists(os.path.join(jobdir, "run.json")) or \
                os.path.exists(os.path.join(jobdir, "exit.json")) or \
                os.path.exists(os.path.join(jobdir, "server.json")):   # a server started first
            break
        time.sleep(0.02)
    out = {"attached": False, "job": job_status(job_id)}
    if identity is not None:
        out["identity"] = identity
    if short and short["moved"]:
        out["set_aside"] = short
    return out


def _record_identity(dirs, ident, overwrite):
    """Under the launch lock, before the job starts: the preflight's identity checked again against
    the output directories (a refusal, kind other-run, when another run's samples are in one), the
    earlier run's files moved aside with ``overwrite`` (in each directory that has some), and
    run.json written for a new run (in each directory). Returns {"digest", "state", "moved"} or None
    when the launch carries no identity; ``moved``: the first directory's move."""
    if not dirs or not isinstance(ident, dict):
        return None
    from .outputs import run_identity as ri
    res = ri.check_dirs(dirs, ident)
    # --overwrite moves only what is not this run: a directory whose run.json is this run's is resumed
    aside = [d for d in dirs if overwrite and ri.check(d, ident)["state"] != "same"
             and (ri.sample_files(d) or os.path.exists(os.path.join(d, ri.FILE)))]
    if not aside and res["problem"]:
        raise AgentFailure("other-run", ri.refusal(res["problem"]))
    moves = [dict(ri.move_aside(d), output_dir=d) for d in aside]
    for d in sorted(set(res["write"]) | set(aside), key=dirs.index):
        ri.write(d, ident)
    return {"digest": res["digest"], "state": res["state"], "moved": moves[0] if moves else None,
            "moved_all": moves, "kept": [d for d in dirs if d not in aside] if overwrite else []}


def overwrite_running(st, output_dir):
    """The refusal of --overwrite while the run's own job writes ``output_dir``."""
    return ("--overwrite: job %s is running and writing %s (this run): nothing is moved while it writes"
            % (st.get("job_id"), output_dir))


def overwrite_running_hint(st):
    return ("follow it (remote-ops logs HOST --job %s --follow), or stop it first (remote-ops stop HOST --job %s) "
            "and run the same command again" % (st.get("job_id"), st.get("job_id")))




# ------------------------------------------------------------------ logs and tail
def _decode(chunk):
    """Decode up to the last complete UTF-8 character; returns (text, bytes consumed)."""
    for cut in range(0, 4):
        end = len(chunk) - cut
        try:
            return chunk[:end].decode("utf-8"), end
        except UnicodeDecodeError as exc:
            if exc.start < end - 4:
                return chunk.decode("utf-8", "replace"), len(chunk)
    return chunk.decode("utf-8", "replace"), len(chunk)


def op_logs(args):
    """The log's last ``lines`` lines (default 50), or its bytes from ``offset``."""
    st = job_status(_resolve(args))
    path = st["log"]
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    if args.get("offset") is not None:
        start = max(0, min(int(args["offset"]), size))
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read(int(args.get("max_bytes", 1 << 20)))
        text, used = _decode(data)
        return {"job": st, "text": text, "offset": start, "next": start + used, "size": size}
    n = int(args.get("lines", 50))
    want = 4096
    while True:
        data = _read_tail(path, want)
        if data.count(b"\n") > n or len(data) >= size or want >= 64 << 20:
            break
        want *= 4
    parts = data.split(b"\n")
    if len(data) < size:
        parts = parts[1:]   # first line is probably cut
    if parts and parts[-1] == b"":
        parts = parts[:-1]
    text = b"\n".join(parts[-n:]).decode("utf-8", "replace") + ("\n" if parts else "")
    return {"job": st, "text": text, "offset": size - len(text.encode()), "next": size, "size": size}


def _gpu_summary():
    q = gpu.query(timeout=10, driver=False)
    if not q["present"]:
        return None
    return {"error": q["error"],
            "gpus": [{"index": g["index"], "memory_used_mib": g["memory_used_mib"],
                      "memory_total_mib": g["memory_total_mib"], "utilization_pct": g["utilization_pct"]}
                     for g in q["gpus"]],
            "processes": len(q["processes"])}


def op_tail(args):
    """Streams the log from ``offset`` as it grows, with periodic snapshots; returns when the job
    reaches a terminal state and its supervisor has let go of the log (after draining it) or after ``budget`` seconds, so that the
    controller re-polls on a fresh channel. Events: {"type": "log", "offset", "next", "data"},
    {"type": "snapshot", ...}. Result: {"state", "next", "status", "ended": bool}."""
    job_id = _resolve(args)
    st = job_status(job_id)
    path = st["log"]
    offset = max(0, int(args.get("offset") or 0))
    budget = float(args.get("budget", 300))
    poll = float(args.get("poll", 0.05))
    snap_every = float(args.get("snapshot_every", 5))
    gpu_every = float(args.get("gpu_every", 10))
    t0 = time.time()
    last_snap = last_gpu = last_state = 0.0
    gpu_info = None
    fh = None
    written = FileWait(path)   # wakes on the log's writes; ``poll`` stays the longest wait
    try:
        while True:
            if fh is None:
                try:
                    fh = open(path, "rb")
                except OSError:
                    fh = None
            if fh is not None:
                fh.seek(offset)
                data = fh.read(256 * 1024)
                if data:
                    text, used = _decode(data)
                    if used:
                        yield {"type": "log", "offset": offset, "next": offset + used, "data": text}
                        offset += used
                        if len(data) == 256 * 1024:
                            continue
            now = time.time()
            if now - last_state >= 0.5:
                last_state = now
                st = job_status(job_id)
                # ended, and its log complete: the supervisor records the exit before it writes the
                # "ended:" line and its cleanup's lines, and holds run.lock until it has written them
                if st["state"] in TERMINAL and not st["supervisor_alive"]:
                    if fh is not None:
                        fh.seek(offset)
                        rest = fh.read()
                        if rest:
                            text, used = _decode(rest)
                            yield {"type": "log", "offset": offset, "next": offset + used, "data": text}
                            offset += used
                    return {"state": st["state"], "next": offset, "status": st, "ended": True}
            if now - last_snap >= snap_every:
                if now - last_gpu >= gpu_every:
                    last_gpu = now
                    gpu_info = _gpu_summary()
                last_snap = now
                yield {"type": "snapshot", "state": st["state"], "samples": st["samples"],
                       "elapsed_s": st["elapsed_s"], "rate_per_s": st["rate_per_s"],
                       "tokens": st["tokens"], "tokens_per_s": st["tokens_per_s"], "eta_s": st["eta_s"],
                       "watchdog": st["watchdog"], "gpu": gpu_info, "log_size": st["log_size"],
                       "write": st.get("write"),
                       "offset": offset}
            if now - t0 >= budget:
                return {"state": st["state"], "next": offset, "status": st, "ended": False}
            written.wait(poll)
    finally:
        written.close()
        if fh is not None:
            fh.close()


# ------------------------------------------------------------------ stop
def _proc_info(pid):
    info = {"pid": pid}
    try:
        with open("/proc/%d/comm" % pid) as fh:
            info["name"] = fh.read().strip()
    except OSError:
        info["name"] = None
    return info


def _server_group(jobdir):
    """The process group of the job's server while its leader lives (never a reused pid's group)."""
    rec = jobfiles.read_json(os.path.join(jobdir, "server.json")) or {}
    if rec.get("pgid") and _pid_alive(rec.get("pid"), rec.get("start_ticks")):
        return rec["pgid"]
    return None


def _job_pids(job_id, pgid, exclude):
    """Every live process of the job: marker in its environment, in its process group (or its
    server's), or a descendant recorded by the supervisor (pid + start time, so a reused pid is never hit)."""
    pids = set(jobfiles.marker_pids(job_id, exclude))
    if pgid:
        pids |= set(jobfiles.group_pids(pgid, exclude))
    server_pgid = _server_group(_jobdir(job_id))
    if server_pgid:
        pids |= set(jobfiles.group_pids(server_pgid, exclude))
    known = jobfiles.read_json(os.path.join(_jobdir(job_id), "pids.json"), {}) or {}
    pids |= set(jobfiles.known_alive({int(k): v for k, v in known.items()})) - set(exclude)
    return sorted(pids)


def op_stop(args):
    """SIGTERM the job's process group and every process carrying its marker, SIGKILL after
    ``grace`` seconds, then kill job processes still on the GPU list and report what still holds
    GPU memory."""
    import signal
    job_id = _resolve(args)
    jobdir = _jobdir(job_id)
    grace = float(args.get("grace", 30))
    st = job_status(job_id)
    run = jobfiles.read_json(os.path.join(jobdir, "run.json")) or {}
    pgid = run.get("pgid")
    if pgid and not _pid_alive(run.get("pid"), run.get("start_ticks")) and not st["supervisor_alive"]:
        pgid = None   # gone and possibly reused: never signal a stranger's group
    exclude = {os.getpid(), run.get("supervisor_pid") or -1}
    found = _job_pids(job_id, pgid, exclude)
    report = {"job_id": job_id, "was": st["state"], "terminated": [], "killed": [],
              "remaining": [], "gpu_holders": [], "gpu_killed": []}
    if st["state"] in ("starting", "running") and not os.path.exists(os.path.join(jobdir, "stop.json")):
        jobfiles.write_json(os.path.join(jobdir, "stop.json"), {"requested_at": time.time(), "grace": grace})
    if found:
        report["terminated"] = [_proc_info(p) for p in found]
        jobfiles.kill_all(found, pgid, signal.SIGTERM)
        deadline = time.time() + grace
        while time.time() < deadline:
            time.sleep(0.1)
            found = _job_pids(job_id, pgid, exclude)
            if not found:
                break
        if found:
            report["killed"] = [_proc_info(p) for p in found]
            jobfiles.kill_all(found, pgid, signal.SIGKILL)
            deadline = time.time() + 5
            while time.time() < deadline and _job_pids(job_id, pgid, exclude):
                time.sleep(0.05)
    # The GPU list finds re-parented workers that cleared or never had the marker in /proc view.
    q = gpu.query(timeout=10, driver=False)
    if q["present"]:
        ours = set(_job_pids(job_id, pgid, exclude))
        for p in q["processes"]:
            if p["pid"] in ours:
                jobfiles.kill_all([p["pid"]], None, signal.SIGKILL)
                report["gpu_killed"].append(p)
        if report["gpu_killed"]:
            time.sleep(1)
            q = gpu.query(timeout=10, driver=False)
        ours = set(_job_pids(job_id, pgid, exclude))
        report["gpu_holders"] = [dict(p, job=p["pid"] in ours) for p in q["processes"]]
        report["gpu_error"] = q["error"]
    report["remaining"] = [_proc_info(p) for p in _job_pids(job_id, pgid, exclude)]
    # Let the supervisor record the exit status before answering.
    deadline = time.time() + 10
    while time.time() < deadline:
        st = job_status(job_id)
        if st["state"] in TERMINAL:
            break
        time.sleep(0.05)
    report["job"] = st
    return report
