"""The extraction job as a Slurm job array, on a cluster's login node (stdlib only).

``slurm.submit`` writes the job's record and a batch script (Python, ``#SBATCH`` lines first) into
``$REMOTE_OPS_STATE_DIR/slurm/<job-id>/`` and runs ``sbatch --parsable``; array task k runs the
job's command with ``--shard k/N`` into ``<output_dir>/shard-k-of-N`` (the token ``@SHARD_DIR@`` in
the command), its log is ``task-k.log`` and its exit status ``task-k.exit.json`` (written by the
batch script, so a task's end is known after Slurm forgot the job). ``slurm.status`` reads
``squeue`` for pending and running tasks, those files for ended ones and ``sacct`` for the tasks
that left the queue (Slurm's final state, exit code, elapsed time, node; a task killed by Slurm
has no exit file), or says in one line that the cluster has no accounting; ``slurm.stop`` runs
``scancel``; ``slurm.logs`` the tasks' logs. Every command is an argv list, never a shell line.
"""

import os
import subprocess
import time

from .core import statedir
from .job import jobfiles
from .protocol import AgentFailure

TOKEN = "@SHARD_DIR@"
REQUEUE_LEAD_S = 120   # SIGUSR1 this long before a task's time limit: it stops and requeues itself

BATCH = '''#!%(python)s
%(sbatch)s
# remote-ops: array task k runs the job's command with --shard k/N (written by agent/slurm.py)
import json, os, shlex, signal, subprocess, sys, time
JOBDIR = %(jobdir)r
with open(os.path.join(JOBDIR, "job.json")) as fh:
    job = json.load(fh)
k, n = int(os.environ["SLURM_ARRAY_TASK_ID"]), int(job["tasks"])
shard = "%%d/%%d" %% (k, n)
argv = [a.replace(%(token)r, "shard-%%d-of-%%d" %% (k, n)) for a in job["command"]] + ["--shard", shard]
env = dict(os.environ, REMOTE_OPS_SHARD=shard, **job["env"])
secrets_file = os.path.join(JOBDIR, "secrets.json")   # 0600 in this 0700 directory; removed when all tasks ended
rc = None
if job.get("secret_names"):
    try:
        with open(secrets_file) as fh:
            env.update({str(a): str(b) for a, b in json.load(fh).items()})
    except (OSError, ValueError, AttributeError) as exc:
        print("[remote-ops] task %%d: cannot read the job's secrets file %%s (%%s); not started: "
              "run remote-ops extract again" %% (k, secrets_file, exc), flush=True)
        rc = 126
# Slurm sends SIGUSR1 (--signal=B:USR1@...) before the time limit: the command is stopped (its files
# are written atomically, a rerun resumes) and the task requeues itself, as submitit does; a preempted
# task is requeued by Slurm itself (--requeue). Either way no exit file: the task is not over.
restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
asked = []
child = None
def on_usr1(signum, frame):
    asked.append(time.time())
    if child is not None and child.poll() is None:
        child.terminate()
signal.signal(signal.SIGUSR1, on_usr1)
out_dir = os.path.join(job["output_dir"], "shard-%%d-of-%%d" %% (k, n)) if job.get("output_dir") else None
def written():
    # what the task's directory holds at its end (jobfiles.py's count, layout.py beside it in JOBDIR)
    if not out_dir:
        return None
    try:
        import importlib.util
        sys.dont_write_bytecode = True      # no __pycache__ in the job's state directory
        spec = importlib.util.spec_from_file_location("remote_ops_job_jobfiles", os.path.join(JOBDIR, "jobfiles.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.written(out_dir, job.get("layout"))
    except Exception as exc:
        return {"error": "%%s: %%s" %% (type(exc).__name__, exc)}
def record(name, rec):
    tmp = os.path.join(JOBDIR, "task-%%d.%%s.tmp" %% (k, name))
    with open(tmp, "w") as fh:
        json.dump(rec, fh)
    os.replace(tmp, os.path.join(JOBDIR, "task-%%d.%%s" %% (k, name)))
# scancel (or Slurm's time limit) sends SIGTERM: the command stops, and the task records when it ended and
# what it had written (task-k.end.json; no exit file: how it ended is Slurm's to say)
termed = []
def ended_by_term():
    record("end.json", {"ended_at": time.time(), "signal": "SIGTERM", "samples": written()})
    sys.exit(143)
def on_term(signum, frame):
    termed.append(time.time())
    if child is None:
        ended_by_term()
    if child.poll() is None:
        child.terminate()      # its end is recorded once child.wait() below returns
signal.signal(signal.SIGTERM, on_term)
if rc is None:
    print("[remote-ops] task %%d of %%d on %%s%%s: %%s" %% (k, n, os.uname().nodename,
          " (run %%d)" %% (restarts + 1) if restarts else "", shlex.join(argv)), flush=True)
    try:
        child = subprocess.Popen(argv, cwd=job["workdir"], env=env)
        rc = child.wait()
    except OSError as exc:
        print("[remote-ops] cannot start the job: %%s" %% exc, flush=True)
        rc = 127
if termed:
    ended_by_term()
if asked:
    most = int(job.get("requeue") or 0)
    task = "%%s_%%d" %% (os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID"), k)
    if restarts < most:
        print("[remote-ops] task %%d: Slurm's time limit is near: stopped and requeued (%%d of at most %%d); "
              "the next run resumes the missing files" %% (k, restarts + 1, most), flush=True)
        if subprocess.call(["scontrol", "requeue", task]) == 0:
            sys.exit(0)
        print("[remote-ops] task %%d: scontrol requeue %%s failed" %% (k, task), flush=True)
    else:
        print("[remote-ops] task %%d: Slurm's time limit is near and it was requeued %%d time(s) already "
              "(extract.slurm.requeue: %%d): not again" %% (k, restarts, most), flush=True)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
record("exit.json", {"exit_code": rc, "ended_at": time.time(), "samples": written()})
if all(os.path.exists(os.path.join(JOBDIR, "task-%%d.exit.json" %% i)) for i in range(n)):
    try:
        os.unlink(secrets_file)
    except OSError:
        pass
sys.exit(rc)
'''


def _root():
    return statedir.private_dir("slurm")


def _run(argv, timeout=60):
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout)
    except FileNotFoundError:
        raise AgentFailure("no-slurm", "%s is not on the login node's PATH" % argv[0],
                           "is this host a Slurm login node? (inventory vars: scheduler: slurm)")
    except subprocess.TimeoutExpired:
        raise AgentFailure("slurm-failed", "%s did not answer in %ds" % (argv[0], timeout))
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def _jobdir(job_id):
    if not isinstance(job_id, str) or not job_id.replace("-", "").replace(".", "").replace("_", "").isalnum():
        raise AgentFailure("bad-args", "invalid job id %r" % (job_id,))
    return os.path.join(_root(), job_id)


def _resolve(args):
    if args.get("job_id"):
        return args["job_id"]
    from .job.status import safe_key
    cur = jobfiles.read_json(os.path.join(_root(), safe_key(args.get("key")) + ".current")) or {}
    if not cur.get("job_id"):
        raise AgentFailure("no-job", "no Slurm job of %s on this host" % safe_key(args.get("key")),
                           "submit one with: remote-ops extract HOST")
    return cur["job_id"]


def _squeue(slurm_id):
    """Array task id -> (state, reason) of the tasks Slurm still lists (pending, running, ...)."""
    rc, out, err = _run(["squeue", "-h", "-r", "-j", str(slurm_id), "-o", "%K|%T|%r"])
    tasks = {}
    if rc != 0:
        if "Invalid job id" in err:
            return tasks
        raise AgentFailure("slurm-failed", "squeue failed: %s" % (err.strip() or "exit %d" % rc))
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0].isdigit():    # squeue's reason "None": there is none
            tasks[int(parts[0])] = (parts[1], None if parts[2] in ("None", "") else parts[2])
    return tasks


SACCT_FORMAT = "JobID,State,ExitCode,Elapsed,NodeList"
# sacct's final states (slurm's job_state_string) -> this job's task states; a task with no exit file
# of its own (killed by Slurm: time limit, memory, node failure, scancel) ends as sacct says
_SACCT_STATES = {"COMPLETED": "succeeded", "CANCELLED": "stopped", "FAILED": "failed", "TIMEOUT": "failed",
                 "OUT_OF_MEMORY": "failed", "NODE_FAIL": "failed", "BOOT_FAIL": "failed", "DEADLINE": "failed",
                 "PREEMPTED": "failed"}


def elapsed_seconds(text):
    """sacct's Elapsed ``[D-][HH:]MM:SS`` in seconds (None when it is not that)."""
    days, _, rest = text.strip().rpartition("-")
    parts = rest.split(":")
    try:
        nums = [int(p) for p in parts]
        d = int(days) if days else 0
    except ValueError:
        return None
    if not 2 <= len(nums) <= 3:
        return None
    while len(nums) < 3:
        nums.insert(0, 0)
    return d * 86400 + nums[0] * 3600 + nums[1] * 60 + nums[2]


def parse_sacct(text, slurm_id):
    """``sacct -j ID --parsable2 --noheader --format=JobID,State,ExitCode,Elapsed,NodeList`` -> task
    id -> {slurm_state, exit_code, signal, elapsed_s, node} for the array's task rows ``ID_K`` (its steps
    ``ID_K.batch``/``.extern`` and pending ranges ``ID_[3-5]`` skipped). ``State`` may carry words after
    the state ("CANCELLED by 0"); ``ExitCode`` is ``exit:signal``."""
    tasks = {}
    prefix = "%s_" % slurm_id
    for line in text.splitlines():
        parts = line.rstrip("\n").split("|")
        if len(parts) != 5 or not parts[0].startswith(prefix):
            continue
        k = parts[0][len(prefix):]
        if not k.isdigit():
            continue
        code, _, sig = parts[2].partition(":")
        node = parts[4].strip()
        tasks[int(k)] = {"slurm_state": (parts[1].split() or ["UNKNOWN"])[0].rstrip("+"),
                         "exit_code": int(code) if code.isdigit() else None,
                         "signal": int(sig) if sig.isdigit() and int(sig) else None,
                         "elapsed_s": elapsed_seconds(parts[3]),
                         "node": node if node and node != "None assigned" else None}
    return tasks


def _sacct(slurm_id, n):
    """(task id -> sacct record, None) or ({}, one line saying why sacct gave nothing): accounting not
    configured on this cluster (sacct's own words), sacct missing or failing."""
    try:
        rc, out, err = _run(["sacct", "-j", str(slurm_id), "--parsable2", "--noheader",
                             "--format=" + SACCT_FORMAT], timeout=30)
    except AgentFailure as exc:
        return {}, "sacct: %s" % exc.message
    words = " ".join((err or out).split())
    if rc != 0:
        if "accounting storage is disabled" in words or "accounting_storage/none" in words:
            return {}, ("sacct: Slurm accounting is not configured on this cluster (%s): a task's final "
                        "state is its exit file's, node and elapsed time are not known" % words)
        return {}, "sacct failed: %s" % (words or "exit status %d" % rc)
    tasks = parse_sacct(out, slurm_id)
    return tasks, None if tasks else "sacct has no record of Slurm job %s's %d task(s) (yet)" % (slurm_id, n)


def _accounting(jobdir, slurm_id, n, final):
    """sacct's records of the job's tasks that left the queue; kept in sacct.json once every task left
    it (``final``), so a finished job asks sacct once."""
    path = os.path.join(jobdir, "sacct.json")
    kept = jobfiles.read_json(path)
    if kept is not None:
        return {int(k): v for k, v in kept["tasks"].items()}, kept["note"]
    tasks, note = _sacct(slurm_id, n)
    if final and (len(tasks) == n or (note or "").startswith("sacct: Slurm accounting is not configured")):
        jobfiles.write_json(path, {"tasks": {str(k): v for k, v in tasks.items()}, "note": note})
    return tasks, note


def job_status(job_id, accounting=True):
    """The job's status record: squeue for the tasks Slurm still lists, each ended task's exit file,
    and sacct for the tasks that left the queue (``accounting``: True, or "final": only once no task
    is queued, as a follow's polls do): Slurm's final state, exit code, elapsed time and node of each,
    or, in ``accounting``, one line saying why sacct could not tell."""
    jobdir = _jobdir(job_id)
    job = jobfiles.read_json(os.path.join(jobdir, "job.json"))
    if job is None:
        raise AgentFailure("no-job", "no Slurm job %s on this host" % job_id)
    n = int(job["tasks"])
    live = _squeue(job["slurm_id"])
    stop = jobfiles.read_json(os.path.join(jobdir, "stop.json"))
    acct, acct_note = {}, None
    if (accounting is True and len(live) < n) or (accounting == "final" and not live):
        acct, acct_note = _accounting(jobdir, job["slurm_id"], n, final=not live)
    tasks, done, expected, ends = [], 0, 0, []
    initial = job.get("initial_samples") or []
    for k in range(n):
        ext = jobfiles.read_json(os.path.join(jobdir, "task-%d.exit.json" % k))
        term = jobfiles.read_json(os.path.join(jobdir, "task-%d.end.json" % k)) if ext is None else None
        sa = acct.get(k) if k not in live else None
        ext_code = (ext or {}).get("exit_code")
        if k in live:
            state = {"PENDING": "pending", "RUNNING": "running", "CONFIGURING": "running",
                     "COMPLETING": "running"}.get(live[k][0], live[k][0].lower())
        elif ext is not None:
            state = "succeeded" if ext.get("exit_code") == 0 else ("stopped" if stop else "failed")
        elif sa is not None and sa["slurm_state"] in _SACCT_STATES:
            state = _SACCT_STATES[sa["slurm_state"]]
            ext_code = sa["exit_code"]
        else:
            state = "stopped" if stop else "lost"
        log = os.path.join(jobdir, "task-%d.log" % k)
        out_dir = os.path.join(job["output_dir"], "shard-%d-of-%d" % (k, n)) if job.get("output_dir") else None
        # an ended task: what it wrote by its end and when it ended (its exit file, or the end it recorded
        # on scancel's SIGTERM); else, or for a task of an older remote-ops, its directory now
        end = (ext or term) if k not in live else None
        at_end = (end or {}).get("samples") if isinstance((end or {}).get("samples"), dict) else None
        if at_end is not None and isinstance(at_end.get("done"), int):
            count, total = at_end["done"], at_end.get("num_samples")
        else:
            count, total = (jobfiles.count_samples(out_dir)[0] if out_dir else 0), None
            if out_dir:
                from .outputs.data_config import read_data_config
                total = (read_data_config(out_dir) or {}).get("num_samples")
        total = total if isinstance(total, int) and not isinstance(total, bool) else job.get("expected_samples")
        done += count
        share = len(range(k, total, n)) if isinstance(total, int) else None
        expected += share or 0
        if k not in live:
            ends.append(_task_end(end, stop, log, job["created_at"]))
        tasks.append({"task": k, "state": state, "reason": live[k][1] if k in live else _sacct_reason(sa),
                      "exit_code": ext_code,
                      "samples": count, "expected": share, "samples_counted": "at its end" if at_end else "now",
                      "at_start": initial[k] if k < len(initial) else None,
                      "log": log, "slurm_state": (sa or {}).get("slurm_state"),
                      "node": (sa or {}).get("node"), "elapsed_s": (sa or {}).get("elapsed_s"),
                      "signal": (sa or {}).get("signal") or (term or {}).get("signal")})
    states = {t["state"] for t in tasks}
    if states & {"pending", "running"}:
        state = "running" if "running" in states else "starting"
    elif states == {"succeeded"}:
        state = "succeeded"
    elif stop:
        state = "stopped"
    elif "failed" in states:
        state = "failed"
    else:
        state = "lost"
    bad = [t for t in tasks if t["state"] in ("failed", "lost")]
    reason = None
    if state == "succeeded":
        reason = "all %d array tasks exit code 0" % n
    elif bad:
        reason = "; ".join("task %d %s%s%s" % (t["task"], t["state"], " (exit code %s)" % t["exit_code"]
                                               if t["exit_code"] is not None else "",
                                               ", %s" % t["reason"] if t["reason"] else "") for t in bad[:5])
    elif state == "stopped":
        reason = "stopped by remote-ops' stop (scancel)"
    t = time.time()
    # an ended array's time is its own: from its submission to its last task's end, never to now
    ended_at = None if state in ("running", "starting") else max(ends or [t])
    elapsed = (ended_at or t) - job["created_at"]
    new = done - sum(x for x in initial if isinstance(x, int)) if initial else done
    return {"job_id": job_id, "key": job["key"], "scheduler": "slurm", "slurm_id": job["slurm_id"],
            "state": state, "reason": reason, "tasks": tasks, "command": job["command"],
            "output_dir": job.get("output_dir"), "log": None, "log_dir": jobdir,
            "label": job.get("label"), "created_at": job["created_at"], "ended_at": ended_at,
            "elapsed_s": round(elapsed, 1),
            "samples": {"done": done, "expected": expected or job.get("expected_samples"),
                        "at_start": sum(x for x in initial if isinstance(x, int)) if initial else None},
            "rate_per_s": round(new / elapsed, 3) if new > 0 and elapsed > 0 else None,
            "exit_code": None, "signal_name": None, "error_lines": [], "warnings": [], "pid": None,
            "accounting": acct_note}


def _task_end(end, stop, log, created_at):
    """When an array task that left the queue ended: its exit file's (or SIGTERM record's) time, else
    remote-ops' scancel, else its log's last write (a task Slurm killed outright), else its submission."""
    if end and isinstance(end.get("ended_at"), (int, float)):
        return end["ended_at"]
    if stop and isinstance(stop.get("at"), (int, float)):
        return stop["at"]
    try:
        return os.path.getmtime(log)
    except OSError:
        return created_at


def _sacct_reason(sa):
    """A task's end as sacct recorded it, one phrase: "Slurm: TIMEOUT on node1 after 600 s, signal 15"."""
    if not sa:
        return None
    return "Slurm: %s%s%s%s" % (sa["slurm_state"], " on %s" % sa["node"] if sa["node"] else "",
                                " after %d s" % sa["elapsed_s"] if sa["elapsed_s"] is not None else "",
                                ", signal %d" % sa["signal"] if sa["signal"] else "")


def op_status(args):
    return job_status(_resolve(args))


def op_where(args):
    """Where a preflight runs and where the tasks will: this login node's hostname, and the partition
    (``partition``, else the cluster's default: sinfo's ``*``) with its nodes; ``error`` when sinfo
    could not say."""
    asked = args.get("partition")
    out = {"hostname": os.uname().nodename, "partition": asked, "nodes": None, "default": not asked,
           "error": None}
    try:
        rc, text, err = _run(["sinfo", "-h", "-o", "%P|%N"], timeout=30)
    except AgentFailure as exc:
        out["error"] = exc.message
        return out
    if rc != 0:
        out["error"] = "sinfo: %s" % (" ".join((err or text).split()) or "exit status %d" % rc)
        return out
    for line in text.splitlines():
        name, _, nodes = line.strip().partition("|")
        default = name.endswith("*")
        if (asked and name.rstrip("*") == str(asked)) or (not asked and default):
            out.update(partition=name.rstrip("*"), nodes=nodes or None)
            break
    else:
        out["error"] = ("sinfo lists no partition %s" % asked) if asked else "sinfo marks no default partition"
    return out


def op_list(args):
    """Every Slurm job remote-ops submitted from this login node (of playbook ``key`` when given), oldest
    first: each one's status record (sacct asked once for each ended job, see _accounting)."""
    root = os.path.join(statedir.root(), "slurm")     # read-only: no state directory made here
    found = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        job = jobfiles.read_json(os.path.join(root, name, "job.json"))
        if not job or not job.get("slurm_id") or (args.get("key") and job.get("key") != args["key"]):
            continue
        found.append(job_status(name))
    found.sort(key=lambda j: j.get("created_at") or 0)
    return {"jobs": found}


def op_submit(args):
    import secrets as _secrets
    from .job.status import safe_key, standin_label
    key = safe_key(args.get("key"))
    command = args.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise AgentFailure("bad-args", "command must be a non-empty list of strings")
    tasks = args.get("tasks")
    if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
        raise AgentFailure("bad-args", "tasks must be a whole number >= 1")
    sbatch = args.get("sbatch") or []
    requeue = args.get("requeue", 0)
    if isinstance(requeue, bool) or not isinstance(requeue, int) or requeue < 0:
        raise AgentFailure("bad-args", "requeue must be a whole number >= 0")
    if not all(isinstance(s, str) and s.startswith("--") and "\n" not in s for s in sbatch):
        raise AgentFailure("bad-args", "sbatch options are --name=value strings")
    root = _root()
    cur = jobfiles.read_json(os.path.join(root, key + ".current")) or {}
    if cur.get("job_id") and os.path.isdir(os.path.join(root, cur["job_id"])):
        st = job_status(cur["job_id"])
        if st["state"] in ("running", "starting"):
            return {"attached": True, "job": st}
    workdir = os.path.expanduser(args.get("workdir") or "~")
    if not os.path.isdir(workdir):
        raise AgentFailure("no-workdir", "workdir %s does not exist on the host" % workdir)
    output_dir = os.path.expanduser(args["output_dir"]) if args.get("output_dir") else None
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
    job_id = "%s-%s-%s" % (key, time.strftime("%Y%m%d-%H%M%S"), _secrets.token_hex(3))
    jobdir = os.path.join(root, job_id)
    os.mkdir(jobdir, 0o700)
    command = [os.path.expanduser(c) if c.startswith("~") else c for c in command]
    secret_values = args.get("secrets") or {}
    if not isinstance(secret_values, dict) or not all(isinstance(a, str) and isinstance(b, str)
                                                      for a, b in secret_values.items()):
        raise AgentFailure("bad-args", "secrets must be a mapping of names to strings")
    if secret_values:
        # read by each array task from this private file (never the job script, argv or job.json)
        fd = os.open(os.path.join(jobdir, "secrets.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            import json
            json.dump(secret_values, fh)
    # what each task's directory holds before the array runs: its rate counts only what it writes
    initial = [jobfiles.count_samples(os.path.join(output_dir, "shard-%d-of-%d" % (k, tasks)))[0] if output_dir else 0
               for k in range(tasks)]
    record = {"job_id": job_id, "key": key, "command": command, "workdir": workdir, "initial_samples": initial,
              "secret_names": sorted(secret_values),
              "env": args.get("env") or {}, "output_dir": output_dir, "tasks": tasks,
              "expected_samples": args.get("expected_samples"), "created_at": time.time(),
              "label": standin_label(command, workdir), "sbatch": sbatch, "requeue": requeue}
    jobfiles.write_json(os.path.join(jobdir, "job.json"), record)
    from .jobs import _module_source
    from .outputs import layout
    for mod, fname in ((jobfiles, "jobfiles.py"), (layout, "layout.py")):
        # read by each task at its end to count what it wrote (jobfiles.written: the one count)
        with open(os.path.join(jobdir, fname), "w") as fh:
            fh.write(_module_source(mod))
    lines = ["#SBATCH --job-name=%s" % key, "#SBATCH --array=0-%d" % (tasks - 1),
             "#SBATCH --output=%s" % os.path.join(jobdir, "task-%a.log"), "#SBATCH --open-mode=append"]
    if requeue:
        # requeued when preempted (Slurm) or near the time limit (the batch script, on SIGUSR1)
        lines += ["#SBATCH --requeue", "#SBATCH --signal=B:USR1@%d" % REQUEUE_LEAD_S]
    lines += ["#SBATCH %s" % s for s in sbatch]
    script = os.path.join(jobdir, "batch.py")
    with open(script, "w") as fh:
        fh.write(BATCH % {"python": args.get("python") or "/usr/bin/env python3", "sbatch": "\n".join(lines),
                          "jobdir": jobdir, "token": TOKEN})
    os.chmod(script, 0o700)
    rc, out, err = _run(["sbatch", "--parsable", script])
    if rc != 0:
        _forget(jobdir)
        raise AgentFailure("slurm-failed", "sbatch refused the job: %s" % _one_message(err or out, rc),
                           _submit_hint(err or out))
    record["slurm_id"] = out.strip().split(";")[0]
    jobfiles.write_json(os.path.join(jobdir, "job.json"), record)
    jobfiles.write_json(os.path.join(root, key + ".current"), {"job_id": job_id})
    return {"attached": False, "job": job_status(job_id)}


def _one_message(text, rc):
    """sbatch's error lines as one line: each without its ``sbatch: error:`` prefix, joined by "; "."""
    parts = []
    for line in text.splitlines():
        line = line.strip()
        for prefix in ("sbatch: error:", "sbatch:"):
            if line.startswith(prefix):
                line = line[len(prefix):].strip()
                break
        if line and line not in parts:
            parts.append(line)
    return "; ".join(parts) or "exit status %d" % rc


# sbatch's words for a controller it could not reach (slurm's slurm_errno.h texts)
_NO_CONTROLLER = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
                  "connect failure", "Zero Bytes were transmitted")
# ... and for options of the job the cluster refused
_OPTIONS = {"partition": ("Invalid partition",), "gres": ("gres", "Invalid generic resource"),
            "time": ("time limit",), "sbatch": ("Requested node configuration", "Invalid account",
                                                "Invalid qos", "Memory specification", "More processors")}


def _submit_hint(text):
    """What to do about a refused sbatch: reach the controller, or fix the option it names."""
    if any(w in text for w in _NO_CONTROLLER):
        return ("the login node cannot reach slurmctld: check that `scontrol ping` answers there "
                "(SLURM_CONF, the controller's state), then run extract again")
    named = [key for key, words in _OPTIONS.items() if any(w.lower() in text.lower() for w in words)]
    if named:
        return "fix %s in the playbook's extract.slurm" % " and ".join(named)
    return "sbatch's message above says why; extract.slurm in the playbook holds the job's options"


def _forget(jobdir):
    """Remove a job directory that never became a Slurm job (its secrets first)."""
    import shutil
    try:
        os.unlink(os.path.join(jobdir, "secrets.json"))
    except OSError:
        pass
    shutil.rmtree(jobdir, ignore_errors=True)


def op_stop(args):
    job_id = _resolve(args)
    st = job_status(job_id)
    was = st["state"]
    if was in ("running", "starting"):
        jobfiles.write_json(os.path.join(_jobdir(job_id), "stop.json"), {"at": time.time()})
        rc, out, err = _run(["scancel", str(st["slurm_id"])])
        if rc != 0:
            raise AgentFailure("slurm-failed", "scancel failed: %s" % (err.strip() or "exit %d" % rc))
        deadline = time.time() + float(args.get("grace") or 30) + 10
        while time.time() < deadline and _squeue(st["slurm_id"]):
            time.sleep(0.5)
    remaining = sorted(_squeue(st["slurm_id"]))
    if not remaining:
        try:
            os.unlink(os.path.join(_jobdir(job_id), "secrets.json"))   # no task will read it any more
        except OSError:
            pass
    return {"job_id": job_id, "was": was, "terminated": [], "killed": [], "remaining": remaining,
            "job": job_status(job_id)}


def op_logs(args):
    job_id = _resolve(args)
    offsets = args.get("offsets")
    st = job_status(job_id, accounting="final" if isinstance(offsets, list) else True)
    if isinstance(offsets, list):     # follow: each task's log from its offset on (at most 1 MiB each)
        chunks = []
        for t in st["tasks"]:
            start = offsets[t["task"]] if t["task"] < len(offsets) and isinstance(offsets[t["task"]], int) else 0
            try:
                with open(t["log"], "rb") as fh:
                    fh.seek(start)
                    data = fh.read(1 << 20)
            except OSError:
                data = b""
            cut = data.rfind(b"\n") + 1 if len(data) == 1 << 20 else len(data)   # whole lines when cut short
            chunks.append({"task": t["task"], "text": data[:cut].decode("utf-8", "replace"), "next": start + cut})
        return {"job": st, "chunks": chunks}
    lines = int(args.get("lines", 50))
    parts = []
    for t in st["tasks"]:
        try:
            with open(t["log"], "rb") as fh:
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        tail = text.replace("\r", "\n").splitlines()[-lines:] if lines else []
        parts.append("== task %d (%s) ==\n%s" % (t["task"], t["state"], "\n".join(tail)))
    text = "\n".join(parts) + "\n"
    return {"job": st, "text": text, "size": len(text), "next": len(text)}
