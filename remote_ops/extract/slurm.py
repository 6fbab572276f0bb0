"""Slurm as a target (controller side): a host whose inventory vars say ``scheduler: slurm`` is a
cluster's login node reached over SSH; ``extract`` submits the playbook's job there as a job array
(``agent/slurm.py``), and ``status`` / ``logs`` / ``stop`` read ``squeue`` and the tasks' files or
run ``scancel``. Array task k of N runs shard k/N (extract/shard.py's rule) into
``<output_dir>/shard-k-of-N``, so ``verify HOST`` checks the tasks' union and ``gather`` collects
it. The playbook's ``extract.slurm``: ``tasks`` (N, default 1), ``time`` (--time), ``partition``,
``gres`` (default ``gpu:<gpus.count>`` when the job asks for GPUs), ``sbatch`` (more --options),
``requeue`` (times a preempted or timed-out task is requeued, default 3; 0: never).

Preflight runs on the login node (shipped files, the call-site check, the import probe with the
job's interpreter): that is right when the login node shares the compute nodes' environment, the
usual set-up, and its notes say so: the login node's hostname and the partition (sinfo) the tasks
run on. GPUs are Slurm's to give (--gres), so the login node's are not checked.
"""

from __future__ import annotations

import dataclasses
import os

from remote_ops.connect import agent_requests as rq
from remote_ops.errors import RefusedError, UsageError

SLURM_KEYS = {"tasks", "time", "partition", "gres", "sbatch", "requeue"}
REQUEUE_DEFAULT = 3     # times a task is requeued (preempted, or stopped near its time limit)


from remote_ops.connect.hosts import is_slurm  # noqa: E402,F401  (the one test of a login node)


def options(pb, spec) -> tuple[int, list[str]]:
    """(tasks, sbatch options) from the playbook's extract.slurm (file:line errors)."""
    raw = (pb.extract or {}).get("slurm") or {}

    def err(key, problem):
        return pb.error(("extract", "slurm") + ((key,) if key else ()), problem)
    if not isinstance(raw, dict):
        raise err(None, "extract.slurm must be a mapping {tasks, time, partition, gres, sbatch}")
    unknown = set(raw) - SLURM_KEYS
    if unknown:
        raise err(sorted(unknown)[0], f"unknown key in extract.slurm (known: {', '.join(sorted(SLURM_KEYS))})")
    tasks = raw.get("tasks", 1)
    if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
        raise err("tasks", f"tasks must be a whole number >= 1, got {tasks!r}")
    out = []
    for key, flag in (("time", "--time"), ("partition", "--partition")):
        if raw.get(key) is not None:
            if not isinstance(raw[key], (str, int)) or "\n" in str(raw[key]):
                raise err(key, f"{key} must be a string")
            out.append(f"{flag}={raw[key]}")
    gres = raw.get("gres") or (f"gpu:{spec.gpu_count}" if spec.gpu_count else None)
    if gres:
        out.append(f"--gres={gres}")
    requeue = raw.get("requeue", REQUEUE_DEFAULT)
    if isinstance(requeue, bool) or not isinstance(requeue, int) or requeue < 0:
        raise err("requeue", f"requeue must be a whole number >= 0 (0: never), got {requeue!r}")
    extra = raw.get("sbatch") or []
    if not isinstance(extra, list) or not all(isinstance(s, str) and s.startswith("--") and "\n" not in s
                                              for s in extra):
        raise err("sbatch", "sbatch must be a list of --option=value strings")
    return tasks, out + list(extra)


def _partition(pb) -> str | None:
    p = ((pb.extract or {}).get("slurm") or {}).get("partition")
    return None if p is None else str(p)


def where_note(w: dict) -> str:
    """The preflight's line saying where it ran and where the tasks will (agent op slurm.where)."""
    part = (f"partition {w['partition']}" + (" (the default)" if w.get("default") else "")
            if w.get("partition") else "the cluster's default partition")
    nodes = f", nodes {w['nodes']}" if w.get("nodes") else ""
    why = f" ({w['error']})" if w.get("error") else ""
    return (f"slurm: files, dataset, disk, model and imports checked on the login node {w['hostname']}; "
            f"tasks run on {part}{nodes}{why}: they need the same paths and Python there")


def requeue_times(pb) -> int:
    """extract.slurm.requeue: how often a preempted or timed-out task is requeued (options() checked it)."""
    return ((pb.extract or {}).get("slurm") or {}).get("requeue", REQUEUE_DEFAULT)


def extract(session, pb, spec, *, skip_check: bool, dry_run: bool, strict_drift: bool, early_death_s: float,
            overwrite: bool, remeasure_disk: bool):
    """jobs.extract's twin for a login node (``early_death_s`` does not apply: sbatch queues the array,
    and status shows a task that failed). The preflight checks each task's directory's run identity
    (another run's samples refuse the submit, naming the tasks); ``overwrite`` is not offered here."""
    from remote_ops.agent.slurm import TOKEN
    from remote_ops.extract import jobs
    from remote_ops.extract.extract_spec import parse_spec

    from remote_ops.extract.extract_spec import resolve_secrets

    host = session.host
    secret_values = resolve_secrets(spec)   # an optional secret unset here is simply not passed
    if not spec.output_dir:
        raise UsageError("a Slurm job needs extract.output_dir (each array task writes shard-K-of-N in it)")
    if spec.several_dirs:
        raise UsageError(f"extract.output_dir names {len(spec.output_dirs)} directories; a Slurm job writes one "
                         "(each array task its shard-K-of-N in it)", "give output_dir one directory for Slurm hosts")
    if overwrite:
        raise UsageError("--overwrite is not offered for Slurm jobs",
                         "move the task directories aside yourself, or give extract.output_dir a new path")
    tasks, sbatch = options(pb, spec)
    pf = jobs.preflight(session, dataclasses.replace(spec, gpu_count=0, gpus_free=False), pb,
                        skip_check=skip_check, dry_run=dry_run, strict_drift=strict_drift, host=host,
                        remeasure_disk=remeasure_disk, slurm_tasks=tasks)
    pf.running = None        # a plain job of the same playbook on the login node is not this one
    import shlex
    pf.notes.append(f"slurm: {tasks} array task(s), sbatch {shlex.join(sbatch) or '(no options)'}")
    pf.notes.append(where_note(session.call(*rq.slurm_where(partition=_partition(pb)))))
    if pf.problems:
        raise jobs.refusal(spec, pf, host.name)
    if dry_run:
        return jobs.ExtractResult(host.name, started=False, dry_run=True, spec=spec.to_json(), preflight=pf.to_json())
    per_task = parse_spec(pb, host, subdir=TOKEN)     # {output_dir} in the command: the task's directory
    env = dict(spec.env)
    from remote_ops.extract.preflight import playbook_identity
    if (playbook := playbook_identity(pb)) is not None:      # each task computes the identity the preflight checked
        import json
        env["REMOTE_OPS_RUN_PLAYBOOK"] = json.dumps(playbook, sort_keys=True)
    res = session.call(*rq.slurm_submit(key=spec.key, command=per_task.command, workdir=spec.workdir, env=env,
                                        output_dir=spec.output_dir, tasks=tasks, sbatch=sbatch,
                                        python=host.python, expected_samples=spec.expected_samples,
                                        secrets=secret_values or rq._UNSET, requeue=requeue_times(pb)),
                        timeout=120)
    return jobs.ExtractResult(host.name, attached=res["attached"], job=res["job"], preflight=pf.to_json())


def _ref(pb, job) -> dict:
    from remote_ops.extract import jobs
    ref = jobs.ref_for(pb, job)
    if not ref:
        raise UsageError("which Slurm job?", "give --playbook or --job (or set the host's playbook)")
    return ref


def status(session, *, pb, job):
    from remote_ops.extract import jobs
    return jobs.JobStatus(session.label, session.call(*rq.slurm_status(**_ref(pb, job))))


def list_jobs(session):
    """``status --all`` on a login node: the Slurm jobs submitted from it (``jobs.JobList``)."""
    from remote_ops.extract import jobs
    return jobs.JobList(session.label, session.call(*rq.slurm_list())["jobs"])


def final_status(session, job_id: str) -> dict:
    """The status record of the Slurm job ``job_id`` (for the end line of a follow)."""
    return session.call(*rq.slurm_status(job_id=job_id))


def stop(session, *, pb, job, grace, on_stopping=None):
    from remote_ops.extract import jobs
    ref = _ref(pb, job)
    if on_stopping is not None:
        st = session.call(*rq.slurm_status(**ref))
        if st["state"] in ("running", "starting"):
            on_stopping(st, grace or 30.0)
    rep = session.call(*rq.slurm_stop(**ref, grace=30.0 if grace is None else grace), timeout=(grace or 30) + 120)
    if rep["remaining"]:
        raise RefusedError(f"Slurm still lists task(s) {rep['remaining']} of job {rep['job']['slurm_id']}",
                           f"run remote-ops stop HOST --job {rep['job'].get('job_id')} again, or ask the cluster's admins",
                           host=session.label)
    return jobs.StopResult.from_json(rep, host=session.label, clean=True)


def logs(session, *, pb, job, lines):
    from remote_ops.extract import jobs
    r = session.call(*rq.slurm_logs(**_ref(pb, job), lines=lines))
    return jobs.LogsResult(session.label, r["job"]["job_id"], r["job"]["state"], r["text"], r["size"], r["next"])


def follow(session, job_id: str, on_text, *, poll: float = 1.0, clock=None) -> dict:
    """Follow a Slurm job's task logs until every task ended: ``on_text(task, text)`` for each new
    piece (whole lines), polling every ``poll`` seconds; returns the final status record."""
    import time
    offsets: list[int] = []
    while True:
        r = session.call(*rq.slurm_logs(job_id=job_id, offsets=offsets))
        for c in r["chunks"]:
            while len(offsets) <= c["task"]:
                offsets.append(0)
            offsets[c["task"]] = c["next"]
            if c["text"]:
                on_text(c["task"], c["text"])
        if r["job"]["state"] not in ("running", "starting"):
            if not any(c["text"] for c in r["chunks"]):
                return r["job"]
            continue          # one more read: what the tasks wrote before they ended
        time.sleep(poll)


def handle(st: dict) -> str:
    """How a person finds a job's processes: its pid, or for a Slurm array its Slurm job id and tasks."""
    if st.get("scheduler") == "slurm":
        return f"Slurm job {st.get('slurm_id')}, {len(st.get('tasks') or [])} array task(s)"
    return f"pid {st.get('pid')}"


def logs_text(st: dict) -> str:
    """Where a Slurm array's logs are: one file per task in its state directory."""
    names = [os.path.basename(t["log"]) for t in st.get("tasks") or [] if t.get("log")]
    where = os.path.dirname(st["tasks"][0]["log"]) if names else st.get("log_dir")
    return f"logs: {where}/" + (names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}" if names else "")


def print_task_text(ctx, task: int, text: str) -> None:
    """A followed task's new log text: ``[task k] line`` for people (control characters escaped: the
    host wrote it), JSON Lines events with --json."""
    import json
    import sys

    from remote_ops.termsafe import clean
    for line in text.replace("\r", "\n").splitlines():
        if not line.strip():
            continue
        sys.stdout.write(json.dumps({"event": "log", "task": task, "line": line}) + "\n" if ctx.json
                         else f"[task {task}] {clean(line)}\n")
    sys.stdout.flush()
