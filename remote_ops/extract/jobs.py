"""The extraction job, controller side: the per-host operations extract (preflight, launch or
attach), status, jobs, logs and stop, and their records. The playbook's ``extract:`` schema is
``extract_spec.py`` (its names stay importable from here); following a log is ``tail.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from remote_ops.connect import agent_requests as rq
from remote_ops.errors import Exit, RefusedError, RemoteOpsError, TimeoutError_, UsageError
from remote_ops.extract.extract_spec import (EXTRACT_KEYS, MAX_FILE_BYTES, ExtractSpec, SecretRef,  # noqa: F401
                                     ShippedFile, assignment_changed, parse_spec, resolve_secrets)
from remote_ops.records import HostRecord, optional
from remote_ops.units import fmt_duration, human_bytes

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
            early_death_s: float, overwrite: bool) -> ExtractResult:
    """The extract operation on the session's host: preflight (one round trip), then launch the
    detached job or attach to the running one. A preflight with problems raises its refusal
    (``refusal``), whose ``details["preflight"]`` is the whole preflight record. ``overwrite``: the
    output directory's earlier run (another run identity) is moved aside at launch instead of refused."""
    host = session.host
    pf = preflight(session, spec, pb, skip_check=skip_check, dry_run=dry_run, strict_drift=strict_drift,
                   host=host, overwrite=overwrite)
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
        res = launch(session, spec, identity=(pf.identity or {}).get("identity"), overwrite=overwrite)
        if not res["attached"]:
            jid = res["job"]["job_id"]
            interrupts.changed(host.name, f"the job was started ({jid}): it keeps running; follow it with "
                                          f"remote-ops logs {host.name} --job {jid}, stop it with "
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
    """The status operation on the session's host: the job ``ref_for(pb, job)`` names."""
    return JobStatus(session.label, resolve_job(session, ref_for(pb, job, session.host)))


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
@dataclass
class Preflight:
    running: dict | None = None            # the playbook's job already running: attach to it
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gpu: dict | None = None
    disk: dict | None = None
    check: dict | None = None
    model: dict | None = None              # the model preflight (playbook check.model)
    files: list[dict] = field(default_factory=list)      # shipped files: written / unchanged / would-write
    imports: dict | None = None            # the import probe's result or failure
    dataset: dict | None = None            # the dataset check (extract/dataset.py): samples, expected, problem
    exit_status: int | None = None         # a refusal's exit status when a problem has its own
    hint: str | None = None                # what to do about the deciding problem
    server: dict | None = None             # a two-process job's server: its port, its import probe
    identity: dict | None = None           # the run identity against output_dir's run.json (agent/outputs/run_identity.py)

    def to_json(self) -> dict:
        extra = {} if self.server is None else {"server": self.server}
        if self.identity is not None:
            extra["identity"] = self.identity
        return {**extra, "running": self.running, "problems": self.problems, "notes": self.notes,
                "gpu": self.gpu, "disk": self.disk, "files": self.files, "imports": self.imports,
                "model": self.model,
                "dataset": self.dataset,
                "check": None if self.check is None else {
                    "findings": len(self.check.get("findings") or []),
                    "unknown": len(self.check.get("unknown") or []),
                    "drift": len(self.check.get("drift") or []),
                    "baseline": {k: v for k, v in (self.check.get("baseline") or {}).items() if k != "path"},
                    "calls_checked": self.check.get("calls_checked")}}


def _shard_text(shard) -> str:
    return f"shard {shard[0]}/{shard[1]}" if shard else "no shard"


def _drift_preflight(pf: Preflight, playbook, strict: bool) -> None:
    """Drift of the checked modules against their baseline: notes, or problems under --strict.
    Items the playbook accepted (check.accepted_drift) are notes only."""
    from remote_ops.check.check import request_from_playbook, with_drift

    d = with_drift(pf.check, request_from_playbook(playbook))
    if d.get("drift_accepted"):
        pf.notes.append(f"drift: {len(d['drift_accepted'])} item(s) accepted by the playbook (check.accepted_drift)")
    pf.check.update(d)
    base = d.get("baseline") or {}
    if "unavailable" in base:
        pf.notes.append(f"drift: no baseline ({base['unavailable']})")
        return
    items = d.get("drift") or []
    out = pf.problems if strict else pf.notes
    for x in items:
        out.append(f"drift: {x['path']}:{x['line']}: {x['kind']}: {x['message']}")
    if items and strict:
        pf.problems.append("--strict refuses a job whose calls drifted from the baseline: run remote-ops check")


def _model_preflight(pf: Preflight, res: dict) -> None:
    """The model preflight's findings are problems (the job would fail after loading the model);
    what it could not decide is a note."""
    from remote_ops.check import model as model_mod
    if not res.get("ok"):
        err = res.get("error") or {}
        pf.notes.append(f"model check could not run: {err.get('message')}")
        return
    pf.model = dict(res["result"])
    pf.model.pop("elapsed_s", None)
    pf.notes.append(model_mod.summary(pf.model))
    for u in pf.model.get("unknown") or []:
        pf.notes.append(f"model not checked: {u['what']}: {u['reason']}")
    for f in pf.model.get("findings") or []:
        pf.problems.append(f"model: {model_mod.explain(f)}" + (f" (fix: {f['suggestion']})" if f.get("suggestion") else ""))


def playbook_identity(playbook) -> dict | None:
    """The playbook part of a run identity: its name and the sha256 of what it changes on the host, its
    document as JSON without comments, ``description``, ``vars``, ``check`` and ``extract`` (the patches
    and ``requires``): what the vars and the extract command change reaches the identity through the
    job's command line, and a flag that changes no data (a delay, a port) does not refuse a resume."""
    import hashlib
    import json
    doc = getattr(getattr(playbook, "doc", None), "data", None)
    if not isinstance(doc, dict):
        return None
    body = {k: v for k, v in doc.items() if k not in ("vars", "description", "check", "extract")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return {"name": playbook.name, "sha256": hashlib.sha256(text.encode()).hexdigest()}


def identity_request(spec: ExtractSpec, playbook) -> dict | None:
    """What the agent needs to compute the job's run identity (agent/jobs.py job_identity)."""
    if not spec.output_dir:
        return None
    req = {"command": spec.command, "workdir": spec.workdir, "flow": "server" if spec.server else "generator",
           "playbook": playbook_identity(playbook), "python": spec.job_python, "env": spec.env}
    if spec.server is not None:
        req["server_command"] = spec.server.command
        if spec.disk:
            req["fallback"] = {k: spec.disk.get(k) for k in ("dataset", "model", "layer_ids", "max_model_len")}
    return req


def _identity_preflight(pf: Preflight, res: dict | None, spec: ExtractSpec, overwrite: bool) -> None:
    """Resume only into the same run: another run's samples in output_dir refuse the launch in one
    line (what differs, and what to do), unless --overwrite moves them aside at launch."""
    if res is None:
        return
    pf.identity = res
    if res.get("error"):
        pf.notes.append(f"run identity not computed: {res['error']} (the job checks its own)")
        return
    short = res["digest"][:12]
    if res.get("problem"):
        if overwrite:
            pf.notes.append(f"--overwrite: {res['samples']} sample file(s) of the earlier run will be moved into "
                            f"{spec.output_dir}/.replaced-<UTC time>/ ({'; '.join(res['differences']) or res['state']})")
        else:
            pf.problems.append(res["line"])
    elif res["state"] == "same" and res["samples"]:
        pf.notes.append(f"run identity {short}: the {res['samples']} sample file(s) in {spec.output_dir} are this "
                        "run's (run.json): resuming")
    elif overwrite and res.get("recorded"):
        pf.notes.append(f"--overwrite: run.json of the earlier run will be moved into {spec.output_dir}/.replaced-<UTC time>/")
    else:
        pf.notes.append(f"run identity {short}: recorded in {spec.output_dir}/run.json at launch")


def probe_model(spec: ExtractSpec, playbook, host) -> str | None:
    """The checkpoint the job's model-loading process loads: the playbook's check.model path, else the
    server command's ``serve MODEL`` (None when neither says)."""
    section = (getattr(playbook, "check", None) or {}).get("model")
    if section and host is not None and section.get("path"):
        from remote_ops.playbook.templates import fill_for_host
        path = fill_for_host(playbook, host, section.get("path"), ("check", "model", "path"))
        if isinstance(path, str) and path:
            return path
    cmd = spec.server.command if spec.server is not None else []
    if "serve" in cmd and cmd.index("serve") + 1 < len(cmd) and not cmd[cmd.index("serve") + 1].startswith("-"):
        return cmd[cmd.index("serve") + 1]
    return None


def preflight(session, spec: ExtractSpec, playbook, *, skip_check: bool = False, dry_run: bool = False,
              strict_drift: bool = False, host=None, overwrite: bool = False) -> Preflight:
    """Running job + shipped files + GPUs + check + disk + import probe, in ONE round trip. The files
    are uploaded here (unless dry_run or the job is running), before the probe that may import them.
    Drift against the package's baseline is shown as notes, and refuses the job only with
    ``strict_drift``."""
    from remote_ops.errors import exit_for_kind
    from remote_ops.connect.transport import unwrap

    need = dict(spec.disk, max_samples=spec.expected_samples, workdir=spec.workdir) if spec.disk else None
    server = spec.server
    probe_args = {} if server is None else {"port": server.port}
    if spec.layout:
        probe_args["layout"] = spec.layout
    if (ident_req := identity_request(spec, playbook)) is not None:
        probe_args["identity"] = ident_req
    ops: dict[str, rq.Request] = {"probe": rq.jobs_probe(key=spec.key, output_dir=spec.output_dir, need=need,
                                                         **probe_args),
                                  "gpu": rq.gpu_query(driver=False)}
    if spec.files:
        ops["files"] = (rq.files_put(workdir=spec.workdir, files=[f.to_wire() for f in spec.files],
                                dry_run=dry_run, unless_running=spec.key))
    do_check = bool(playbook.check) and not skip_check
    if do_check:
        from remote_ops.check.check import DEFAULT_AGAINST
        ops["check"] = (rq.compat_check(targets=playbook.check["targets"],
                                   against=playbook.check.get("against") or DEFAULT_AGAINST, drift=True))
    if do_check and host is not None:
        from remote_ops.check import model as model_mod
        model_req = model_mod.request(playbook, host)
        if model_req is not None:
            ops["model"] = model_req
    # the process that loads the model (the server, else the job) also imports the library module of the
    # class the registry picks for it (Kimi-K2.5: vllm's kimi_k25.py needs compressed_tensors), which
    # otherwise fails only once the engine loads the model
    model = probe_model(spec, playbook, host)
    if spec.import_check:
        ops["imports"] = (rq.imports_probe(python=spec.job_python, modules=spec.import_check, env=spec.env,
                                    workdir=spec.workdir, timeout=spec.import_timeout, packages=spec.requires,
                                    unless_running=spec.key,
                                    **({"model": model} if model and server is None else {})))
    from remote_ops.extract import dataset
    if (ds := dataset.request(spec)) is not None:
        ops["dataset"] = ds
    if server is not None and server.import_check:
        # the server's modules, by the server's interpreter with its environment (a second probe)
        ops["server_imports"] = (rq.imports_probe(
            python=server.python, modules=server.import_check, env={**spec.env, **server.env},
            workdir=spec.workdir, timeout=spec.import_timeout, packages=spec.requires, unless_running=spec.key,
            **({"model": model} if model else {})))
    raw = dict(zip(ops, session.call_many(list(ops.values()), timeout=2 * spec.import_timeout + 300)))
    pf = Preflight()
    probe = unwrap(raw["probe"], session.label)
    job = probe.get("job")
    if job and job.get("state") in ("starting", "running"):
        if list(job.get("shard") or ()) == list(spec.shard or ()):
            pf.running = job       # the job asked for (same output directory, same share): attach
            return pf
        pf.problems.append(f"{spec.output_dir} is being written by job {job['job_id']} "
                           f"({_shard_text(job.get('shard'))}); this launch is {_shard_text(spec.shard)}")
        pf.hint = ("one output directory holds one job: give each share its own output_dir (e.g. with {host}), "
                   "or stop that job first")
        return pf
    pf.disk = probe.get("disk")
    held = (pf.disk or {}).get("held_by")
    if held:                 # another job (another state dir, inventory name or machine) writes there
        pf.problems.append(held["line"])
        pf.hint = held.get("hint")
        return pf
    pf.gpu = unwrap(raw["gpu"], session.label)
    if spec.files:
        res = raw["files"]
        if res.get("ok"):
            pf.files = res["result"].get("files") or []
            for f in pf.files:
                pf.notes.append(f"file {f['name']}: {f['action']} (sha256 {f['sha256'][:12]})")
        else:
            err = res.get("error") or {}
            pf.problems.append(f"cannot upload {', '.join(f.name for f in spec.files)}: {err.get('message')}")
    # check clean
    if do_check:
        res = raw["check"]
        if not res.get("ok"):
            err = res.get("error") or {}
            pf.problems.append(f"check could not run: {err.get('message')}")
        else:
            pf.check = res["result"]
            findings = pf.check.get("findings") or []
            for f in findings[:5]:
                pf.problems.append(f"check: {f.get('path')}:{f.get('line')}: {f.get('message')}")
            if len(findings) > 5:
                pf.problems.append(f"check: ... and {len(findings) - 5} more findings")
            if findings:
                pf.problems.append("the job would fail on these calls after loading the model: "
                                   "run remote-ops check / patch first")
            if pf.check.get("unknown"):
                pf.notes.append(f"check: {len(pf.check['unknown'])} call(s) could not be verified")
            _drift_preflight(pf, playbook, strict_drift)
        if "model" in raw:
            _model_preflight(pf, raw["model"])
    elif not playbook.check:
        pf.notes.append("playbook has no 'check' section: call sites not verified")
    else:
        pf.notes.append("check skipped (--skip-check)")
    # GPUs
    g = pf.gpu or {}
    if spec.gpu_count:
        if not g.get("present"):
            pf.problems.append(f"the job needs {spec.gpu_count} GPU(s) but nvidia-smi is not on the host")
        elif g.get("error"):
            pf.problems.append(f"GPUs: {g['error']}")
        elif len(g.get("gpus") or []) < spec.gpu_count:
            pf.problems.append(f"the job needs {spec.gpu_count} GPU(s), the host has {len(g.get('gpus') or [])}")
    if g.get("present") and spec.gpus_free and (spec.gpu_count or g.get("processes")):
        procs = g.get("processes") or []
        for p in procs:
            pf.problems.append(f"GPU {p.get('gpu_index')}: foreign compute process pid {p.get('pid')} "
                               f"({p.get('name')}) holds {p.get('used_memory_mib')} MiB")
        if procs:
            pf.problems.append("GPUs are not free: stop those processes (or set extract.gpus.free: false)")
    # disk: from real sizes (extract.disk, agent/job/diskneed.py), else the mean size of the files already there
    d = pf.disk or {}
    n = d.get("need") or {}
    if d.get("error"):
        pf.problems.append(f"cannot measure free disk at {spec.output_dir}: {d['error']}")
    elif "fits" in n:
        (pf.notes if n["fits"] else pf.problems).append(n["line"])
    elif spec.output_dir and spec.expected_samples:
        per = d.get("mean_sample_bytes")
        left = max(0, spec.expected_samples - (d.get("existing_samples") or 0))
        if per and left:
            need_b = per * left
            if d.get("free_bytes") is not None and d["free_bytes"] < need_b * 1.05:
                pf.problems.append(f"not enough disk at {spec.output_dir}: {left} more samples need about "
                                   f"{human_bytes(need_b)}, {human_bytes(d['free_bytes'])} free")
            else:
                pf.notes.append(f"disk: {left} samples need ~{human_bytes(need_b)}, {human_bytes(d.get('free_bytes'))} free")
        elif left:
            pf.notes.append("disk need unknown: " + (n.get("unknown") or "give the playbook an extract.disk section"))
    if d.get("shard") and list(d["shard"]) != list(spec.shard or ()) and not overwrite:   # extract/shard.py
        pf.problems.append(assignment_changed(spec, d["shard"]))
    _identity_preflight(pf, probe.get("identity"), spec, overwrite)
    # the server's port: free on the host (a server left from an earlier run holds it)
    port = probe.get("port")
    if server is not None and port is not None:
        pf.server = {"port": port}
        if not port.get("free"):
            pf.problems.append(f"port {server.port} is not free on the host ({port.get('error')}): another "
                               "server holds it (a job left running? remote-ops status --all) or set extract.server.port")
    if "dataset" in raw:
        pf.dataset = dataset.preflight(pf, raw["dataset"], spec)
    # imports last: when the environment cannot import the job's modules, that is the deciding problem
    for key, modules, who in (("server_imports", server.import_check if server else [], "server"),
                              ("imports", spec.import_check, "job")):
        if not modules:
            continue
        res = raw[key]
        if res.get("ok"):
            result = res["result"]
            if who == "server":
                pf.server = {**(pf.server or {}), "imports": result}
            else:
                pf.imports = result
            if result.get("skipped"):
                pf.notes.append(f"{who} import check skipped: {result['skipped']}" if who == "server"
                                else f"import check skipped: {result['skipped']}")
            else:
                pf.notes.append(f"{'server ' if who == 'server' else ''}imports: {', '.join(result.get('modules') or modules)} "
                                f"import in {result.get('seconds')}s")
            if result.get("model_note"):
                pf.notes.append(f"{who}: {result['model_note']}")
        else:
            err = res.get("error") or {}
            failed = {"ok": False, **{k: v for k, v in err.items() if k != "traceback"}}
            if who == "server":
                pf.server = {**(pf.server or {}), "imports": failed}
                pf.problems.append(f"server: {err.get('message') or 'import check failed'}")
            else:
                pf.imports = failed
                pf.problems.append(err.get("message") or "import check failed")
            pf.hint = err.get("hint")
            pf.exit_status = int(exit_for_kind(err.get("kind")))
    if server is not None and playbook.requires:
        _requires_preflight(pf, playbook, raw, (("server_imports", server.import_check), ("imports", spec.import_check)))
    _coverage_preflight(pf, playbook, session.label)
    return pf


def _requires_preflight(pf: Preflight, playbook, raw: dict, probes) -> None:
    """A two-process job is not patched first, so nothing else checks the playbook's ``requires``: each
    package is checked against the version the interpreter that imports it reported (the server's
    for the server's modules, the client's for the client's)."""
    seen: dict[str, str] = {}
    for key, modules in probes:
        res = raw.get(key) or {}
        versions = (res.get("result") or {}).get("versions") or {} if res.get("ok") else {}
        for m in modules:
            top = m.split(".")[0]
            if top in playbook.requires and versions.get(top) and top not in seen:
                seen[top] = versions[top]
    for problem in playbook.check_requires(seen):
        if problem.split(" ")[0] in seen:
            pf.problems.append(f"requires: {problem} (the playbook's requires, "
                               f"{playbook.path}:{playbook.line('requires')})")
    if seen:
        pf.notes.append("requires: " + ", ".join(f"{n} {v}" for n, v in sorted(seen.items())) + " (import probes)")
    for name in sorted(set(playbook.requires) - set(seen)):
        pf.notes.append(f"requires: {name} not checked (no import probe imports it)")


def _coverage_preflight(pf: Preflight, playbook, host: str) -> None:
    """A host the playbook's ``requires`` does not cover (the check's versions): the deciding problem,
    the same line as ``patch`` gives (playbook/coverage.py), before any GPU time."""
    if pf.check is None or not playbook.requires:
        return
    from remote_ops.playbook import coverage

    out = coverage.refusal(playbook, pf.check.get("versions") or {}, pf.check.get("findings") or [], host)
    if out is not None:
        pf.problems.append(out[0])
        pf.hint, pf.exit_status = out[1], None


def refusal(spec: ExtractSpec, pf: Preflight, host: str) -> RefusedError:
    """The error for a preflight with problems: the deciding (last) problem, its hint and exit status;
    ``details["preflight"]`` carries every problem (``--json`` prints it with the error)."""
    hint = pf.hint
    if len(pf.problems) > 1:
        hint = (hint + "; " if hint else "") + f"{len(pf.problems)} problems, all in preflight.problems"
    err = RefusedError(f"preflight refused to start {spec.key}: {pf.problems[-1]}", hint, host=host,
                       exit_status=Exit(pf.exit_status) if pf.exit_status else None)
    err.details = {"preflight": pf.to_json()}
    return err


def launch(session, spec: ExtractSpec, *, identity: dict | None = None, overwrite: bool = False) -> dict:
    """Start the job (or attach to the one already running): idempotent per playbook. ``identity``
    (the preflight's) is checked again and recorded as output_dir/run.json before the job starts; the
    job gets its playbook part as $REMOTE_OPS_RUN_PLAYBOOK, so the script computes the same identity."""
    secret_values = resolve_secrets(spec)
    env = dict(spec.env)
    if identity is not None and identity.get("playbook"):
        import json
        env["REMOTE_OPS_RUN_PLAYBOOK"] = json.dumps(identity["playbook"], sort_keys=True)
    args = {"key": spec.key, "command": spec.command, "workdir": spec.workdir, "env": env,
            "secrets": secret_values, "output_dir": spec.output_dir,
            "expected_samples": spec.expected_samples, "watchdog_seconds": spec.watchdog_seconds,
            "cleanup_grace": spec.stop_grace, "playbook": spec.playbook_path}
    if spec.server is not None:
        args["server"] = spec.server.to_wire()
    if spec.layout:
        args["layout"] = spec.layout
    if spec.shard:
        args["shard"] = list(spec.shard)
    if identity is not None:
        args["identity"] = identity
    if overwrite:
        args["overwrite"] = True
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
    ``hosts``) every ``every`` seconds until each job in it has ended; that last document. A
    TimeoutError_ naming the jobs' states after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        doc = read_status()
        found = [h["result"]["job"] for h in doc["hosts"]] if "hosts" in doc else [doc["job"]]
        if all(j["state"] in TERMINAL for j in found):
            return doc
        if time.monotonic() > deadline:
            raise TimeoutError_(f"jobs still not ended after {timeout:g}s: "
                                + ", ".join(sorted({j["state"] for j in found})))
        time.sleep(every)
