"""The extraction job, controller side: the per-host operations extract (preflight, launch or
attach), status, jobs, logs and stop, and their records. The playbook's ``extract:`` schema is
``extract_spec.py``, the preflight ``preflight.py``; following a log is ``tail.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from remote_ops.connect import agent_requests as rq
from remote_ops.errors import Exit, RefusedError, RemoteOpsError, TimeoutError_, UsageError
from remote_ops.extract.extract_spec import ExtractSpec, parse_spec, resolve_secrets
from remote_ops.extract.preflight import preflight, refusal
from remote_ops.records import HostRecord, optional
from remote_ops.units import fmt_duration

TERMINAL = ("succeeded", "failed", "stopped", "lost")


# ------------------------------------------------------------------ loading
def ref_for(pb, job: str | None = None, host=None) -> dict:
    """Which job a companion operation means: ``job``, else the playbook's (``pb``, loaded once by the
    caller: the one named, else the host's; None when neither), else the newest job on the host ({}).
    With ``host``, the playbook's job is the one writing the host's output directory: a job is recorded
    by what it is (playbook and output directory, agent/job/status.slot), so two inventory names of one
    machine each find their own."""
    if job:
        return {"job_id": job}
    if pb is not None:
        ref = {"key": pb.name}
        if host is not None:
            try:
                out = parse_spec(pb, host).output_dir
            except RemoteOpsError:
                out = None
            if out:
                ref["output_dir"] = out
        return ref
    return {}


def load_for_hosts(hosts, book) -> dict:
    """Each host's (playbook, ExtractSpec), secrets resolved: everything local that can refuse the
    job (bad playbook, missing secret) fails here, before any host is contacted. ``book(host)`` is
    the host's playbook, loaded once per file (api.Inventory's loader)."""
    out = {}
    for h in hosts:
        pb = book(h)
        spec = parse_spec(pb, h)
        resolve_secrets(spec)
        out[h.name] = (pb, spec)
    return out


# ------------------------------------------------------------------ records
@dataclass(eq=False)
class ExtractResult(HostRecord):
    """The record of ``extract``: the job started (or attached to), or a dry run's spec; the preflight."""

    attached: bool = optional()
    started: bool = optional()
    dry_run: bool = optional()
    job: dict = optional()
    spec: dict = optional()
    identity: dict = optional()         # the launch's run identity: digest, state, files moved aside (--overwrite)
    preflight: dict = field(default_factory=dict)


@dataclass(eq=False)
class JobStatus(HostRecord):
    """The record of ``status``: one job's status record (state, samples, rate, exit, reason)."""

    job: dict = field(default_factory=dict)


@dataclass(eq=False)
class JobList(HostRecord):
    """The record of ``status --all``: every job recorded on the host, oldest first."""

    jobs: list = field(default_factory=list)


@dataclass(eq=False)
class LogsResult(HostRecord):
    """The record of ``logs``: the last lines of a job's log; ``next`` is the offset to follow from."""

    job_id: str = ""
    state: str = ""
    text: str = ""
    size: int = 0
    next: int = 0


@dataclass(eq=False)
class StopResult(HostRecord):
    """The record of ``stop``: signals sent, what is left (``clean``), GPU holders."""

    clean: bool = False
    job_id: str = ""
    was: str = ""
    terminated: list = field(default_factory=list)
    killed: list = field(default_factory=list)
    remaining: list = field(default_factory=list)
    gpu_killed: list = optional()
    gpu_holders: list = optional()
    job: dict = field(default_factory=dict)


# ------------------------------------------------------------------ the operations
def check_lines(lines: int) -> None:
    """``logs``' line count (checked by api.Inventory before any host, and by ``logs`` itself)."""
    if lines < 0:
        raise UsageError("-n must be >= 0")


def check_grace(grace: float | None) -> None:
    """``stop``'s grace (checked by api.Inventory before any host, and by ``stop`` itself)."""
    if grace is not None and grace < 0:
        raise UsageError("--grace must be >= 0")


EARLY_DEATH_S = 3.0     # how long extract (without --tail) watches a new job for dying at once
EARLY_DEATH_MAX_S = 60.0   # the longest watch asked for (a longer wait is what --tail is for)


def extract(session, pb, spec: ExtractSpec, *, skip_check: bool, dry_run: bool, strict_drift: bool,
            early_death_s: float, overwrite: bool, remeasure_disk: bool) -> ExtractResult:
    """The extract operation on the session's host: preflight (one round trip), then launch the
    detached job or attach to the running one. A preflight with problems raises its refusal
    (``refusal``), whose ``details["preflight"]`` is the whole preflight record. ``overwrite``: the
    output directory's earlier run (another run identity) is moved aside at launch instead of refused.
    The preflight's launch plan (extract/plan.py) is in ``preflight["plan"]``; its bytes per token go
    with the launch, so status can say which bound the job is at. ``remeasure_disk``: measure the
    output disk's write speed again (it is cached per filesystem on the host)."""
    host = session.host
    pf = preflight(session, spec, pb, skip_check=skip_check, dry_run=dry_run, strict_drift=strict_drift,
                   host=host, overwrite=overwrite, remeasure_disk=remeasure_disk)
    if pf.running:
        return ExtractResult(host.name, attached=True, job=pf.running, preflight=pf.to_json())
    if pf.problems:
        raise refusal(spec, pf, host.name)
    if dry_run:
        return ExtractResult(host.name, started=False, dry_run=True, spec=spec.to_json(), preflight=pf.to_json())
    expected = (pf.dataset or {}).get("expected")
    if expected and spec.expected_samples and expected < spec.expected_samples:
        from dataclasses import replace    # the dataset holds fewer samples than max_samples
        spec = replace(spec, expected_samples=expected)
    from remote_ops import interrupts
    with interrupts.committing(host.name, "the job's launch", f"remote-ops status {host.name} --all"):
        res = launch(session, spec, identity=(pf.identity or {}).get("identity"), overwrite=overwrite,
                     plan=pf.plan)
        if not res["attached"]:
            jid = res["job"]["job_id"]
            interrupts.changed(host.name, f"the job was started ({jid}): it keeps running; follow it with "
                                          f"remote-ops logs {host.name} --job {jid} --follow, stop it with "
                                          f"remote-ops stop {host.name} --job {jid}")
    job = res["job"] if res["attached"] or not early_death_s else early_end(session, res["job"], early_death_s)
    return ExtractResult(host.name, attached=res["attached"], job=job, identity=res.get("identity"),
                         preflight=pf.to_json())


def early_end(session, job: dict, wait_s: float) -> dict:
    """The job's record after up to ``wait_s`` seconds (one round trip, ended early when the job
    ends): a job that dies at once (a bad argument, a missing file) is reported by ``extract``
    itself, with its error line and a non-zero exit, not as "started"."""
    req = rq.jobs_tail(job_id=job["job_id"], offset=int(job.get("log_size") or 0), budget=wait_s, poll=0.1,
                       snapshot_every=3600, gpu_every=3600)
    try:
        for msg in session.stream(*req, timeout=wait_s + 60):
            if "result" in msg:
                return (msg["result"] or {}).get("status") or job
    except RemoteOpsError:   # the job was started: a failed look at it must not turn that into an error
        return job
    return job


def status(session, *, pb, job: str | None) -> JobStatus:
    """The status operation on the session's host: the job ``ref_for(pb, job)`` names; ``job["bound"]``
    says which bound a running job is at (extract/plan.py bound_of)."""
    st = resolve_job(session, ref_for(pb, job, session.host))
    if st.get("state") in ("running", "starting") and "write" in st:
        from remote_ops.extract.plan import bound_of
        st["bound"] = bound_of(st)
    return JobStatus(session.label, st)


def list_jobs(session) -> JobList:
    """``status --all`` on the session's host."""
    return JobList(session.label, session.call(*rq.jobs_list())["jobs"])


def logs(session, *, pb, job: str | None, lines: int) -> LogsResult:
    """The logs operation on the session's host: the last ``lines`` lines of the job's log (also
    after it ended)."""
    check_lines(lines)
    ref = ref_for(pb, job, session.host)
    if not ref:     # the newest job on the host: only jobs.list knows it
        ref = {"job_id": resolve_job(session, ref)["job_id"]}
    # the agent resolves a job id or a playbook key as jobs.status does (same refusal when there is
    # none) and answers with the job's status record: one round trip, not a status call first
    r = session.call(*rq.jobs_logs(**ref, lines=lines))
    return LogsResult(session.label, r["job"]["job_id"], r["job"]["state"], r["text"], r["size"], r["next"])


def stop(session, *, pb, job: str | None, grace: float | None, on_stopping=None) -> StopResult:
    """The stop operation on the session's host (the job ``ref_for(pb, job)`` names): SIGTERM its
    process group, SIGKILL after ``grace`` seconds (None: the playbook's stop_grace_seconds, else 30),
    then what is left. ``on_stopping(status, grace)`` is called before a live job is signalled."""
    check_grace(grace)
    st = resolve_job(session, ref_for(pb, job, session.host))
    if grace is None:
        grace = 30.0
        if pb is not None:
            try:
                grace = parse_spec(pb, session.host).stop_grace
            except RemoteOpsError:   # a playbook without a usable extract section: the default grace still stops it
                pass
    if on_stopping is not None and st["state"] in ("running", "starting"):
        on_stopping(st, grace)
    rep = session.call(*rq.jobs_stop(job_id=st["job_id"], grace=grace), timeout=grace + 120)
    clean = not rep["remaining"] and not any(h.get("job") for h in rep.get("gpu_holders") or [])
    return StopResult.from_json(rep, host=session.label, clean=clean)


def resolve_job(session, ref: dict) -> dict:
    """The job status record for ``ref``; with an empty ref, the newest job on the host."""
    if ref:
        return session.call(*rq.jobs_status(**ref))   # no such job: a refusal, exit USAGE (agent/contract.py)
    jobs = session.call(*rq.jobs_list())["jobs"]
    if not jobs:
        raise RefusedError("no job on this host", "start one with: remote-ops extract HOST",
                           host=session.label, exit_status=Exit.USAGE)
    return jobs[-1]


# ------------------------------------------------------------------ preflight and launch
def launch(session, spec: ExtractSpec, *, identity: dict | None = None, overwrite: bool = False,
           plan: dict | None = None) -> dict:
    """Start the job (or attach to the one already running): idempotent per playbook. ``identity``
    (the preflight's) is checked again and recorded as output_dir/run.json before the job starts; the
    job gets its playbook part as $REMOTE_OPS_RUN_PLAYBOOK, so the script computes the same identity."""
    secret_values = resolve_secrets(spec)
    env = {**spec.env, **spec.flow.job_env(spec)}
    if identity is not None and identity.get("playbook"):
        import json
        env["REMOTE_OPS_RUN_PLAYBOOK"] = json.dumps(identity["playbook"], sort_keys=True)
    args = {"key": spec.key, "command": spec.command, "workdir": spec.workdir, "env": env,
            "secrets": secret_values, "output_dir": spec.output_dir,
            "expected_samples": spec.expected_samples, "watchdog_seconds": spec.watchdog_seconds,
            "cleanup_grace": spec.stop_grace, "playbook": spec.playbook_path}
    args.update(spec.flow.launch_args(spec))
    if spec.layout:
        args["layout"] = spec.layout
    if spec.shard:
        args["shard"] = list(spec.shard)
    if spec.several_dirs:
        args["output_dirs"] = spec.several_dirs
    if identity is not None:
        args["identity"] = identity
    if overwrite:
        args["overwrite"] = True
    if plan and plan.get("bytes_per_token"):
        args["plan"] = {"bytes_per_token": plan["bytes_per_token"]}
    return session.call(*rq.jobs_launch(**args), timeout=120)


# ------------------------------------------------------------------ presenting a status record
def summary_line(st: dict) -> str:
    s = st.get("samples") or {}
    prog = f"{s.get('done', 0)}" + (f"/{s['expected']}" if s.get("expected") else "") + " samples"
    rate = f", {st['rate_per_s']:.2f} samples/s" if st.get("rate_per_s") else ""
    from remote_ops.extract.tail import token_text
    rate += token_text(st, ", ")
    tag = " (STAND-IN)" if (st.get("label") or "").startswith("STAND-IN") else ""
    line = f"{st['job_id']}{tag}: {st['state']} after {fmt_duration(st.get('elapsed_s'))}, {prog}{rate}"
    if st.get("reason") and st["state"] != "succeeded":
        line += f" - {st['reason']}"
    return line


def server_line(st: dict) -> str | None:
    """A two-process job's server, one line: state, port, readiness, exit, log (None for other jobs)."""
    srv = st.get("server")
    if not srv:
        return None
    parts = [f"server: {srv.get('state')}"]
    if srv.get("port"):
        parts.append(f"port {srv['port']}")
    if srv.get("ready_after_s") is not None:
        parts.append(f"healthy after {fmt_duration(srv['ready_after_s'])}")
    if srv.get("exit"):
        parts.append(srv["exit"])
    if srv.get("pid") and srv.get("state") in ("starting", "healthy"):
        parts.append(f"pid {srv['pid']}")
    return ", ".join(parts) + f"   log: {srv.get('log')}"


def exit_for(st: dict) -> int:
    """Exit status for a job record: 0 succeeded or still running, 1 (Exit.FINDINGS) otherwise."""
    return int(Exit.OK) if st.get("state") in ("succeeded", "running", "starting") else int(Exit.FINDINGS)



# ------------------------------------------------------------------ waiting from a script
def wait_ended(read_status, *, timeout: float, every: float = 0.5) -> dict:
    """Call ``read_status()`` (the JSON of ``status TARGET --json``: one host's document, or a group's
    ``hosts``) every ``every`` seconds until each job in it has ended and its supervisor has let go (as
    ``extract --tail`` waits: the exit is recorded before the supervisor's cleanup of leftover processes
    and the release of the output directory); that last document. A TimeoutError_ naming the jobs' states
    after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        doc = read_status()
        found = [h["result"]["job"] for h in doc["hosts"]] if "hosts" in doc else [doc["job"]]
        if all(j["state"] in TERMINAL and not j.get("supervisor_alive") for j in found):
            return doc
        if time.monotonic() > deadline:
            raise TimeoutError_(f"jobs still not ended after {timeout:g}s: "
                                + ", ".join(sorted({j["state"] for j in found})))
        time.sleep(every)
