"""extract's preflight: what would stop the job, read in ONE round trip before any GPU time.

A registry of parts (``PARTS``), each a small class: ``ops`` adds its agent requests to the round trip,
``read`` turns their answers into the record's problems and notes (the last problem decides the
refusal). Parts are read in ``PARTS`` order: a running job of the same share is attached to at once;
the imports come late because an environment that cannot import the job's modules is the deciding
problem; the playbook's coverage of the host's versions last of all. Each part has its own test
(tests/extract/test_preflight_parts.py) on recorded answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from remote_ops.connect import agent_requests as rq
from remote_ops.errors import Exit, RefusedError
from remote_ops.extract.extract_spec import ExtractSpec, assignment_changed, secret_path
from remote_ops.extract import flows, prepared as _prepared
from remote_ops.units import human_bytes


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
    plan: dict | None = None               # the launch plan (extract/plan.py Plan.to_json)

    def to_json(self) -> dict:
        extra = {} if self.server is None else {"server": self.server}
        if self.identity is not None:
            extra["identity"] = self.identity
        return {**extra, "running": self.running, "problems": self.problems, "notes": self.notes, "plan": self.plan,
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
    req = {"command": spec.command, "workdir": spec.workdir, "flow": spec.flow.name,
           "playbook": playbook_identity(playbook), "python": spec.job_python, "env": spec.env}
    return {**req, **spec.flow.identity_args(spec)}


def _identity_preflight(pf: Preflight, res: dict | None, spec: ExtractSpec, overwrite: bool) -> None:
    """Resume only into the same run: another run's samples in output_dir refuse the launch in one
    line (what differs, and what to do), unless --overwrite moves them aside at launch."""
    if res is None:
        return
    pf.identity = res
    if res.get("error"):
        pf.notes.append(f"run identity not computed: {res['error']} (the job checks its own)")
        return
    if res.get("tasks") is not None:      # a Slurm array: each task's shard-K-of-N (agent/jobs.py identity_check)
        (pf.problems if res.get("problem") else pf.notes).append(res["line"])
        return
    short = res["digest"][:12]
    where = " and ".join(spec.output_dirs) if spec.several_dirs else spec.output_dir
    aside = (f"{spec.output_dir}/.replaced-<UTC time>/" if not spec.several_dirs
             else ".replaced-<UTC time>/ in each of its directories")
    if res.get("problem"):
        if overwrite:
            pf.notes.append(f"--overwrite: {res['samples']} sample file(s) of the earlier run will be moved into "
                            f"{aside} ({'; '.join(res['differences']) or res['state']})")
        else:
            pf.problems.append(res["line"])
    elif res["state"] == "same" and res.get("recorded") and overwrite:
        pf.notes.append(f"--overwrite: {where} holds this run (run.json {short}): nothing to overwrite; "
                        f"resuming its {res['samples']} sample file(s)")
    elif res["state"] == "same" and res["samples"] and res.get("grown"):
        pf.notes.append(f"the run in {where} grows ({'; '.join(res['grown']['notes'])}): resuming its "
                        f"{res['samples']} sample file(s); run.json {short} replaces the recorded one at launch")
    elif res["state"] == "same" and res["samples"]:
        pf.notes.append(f"run identity {short}: the {res['samples']} sample file(s) in {where} are this "
                        "run's (run.json): resuming")
    elif overwrite and res.get("recorded"):
        pf.notes.append(f"--overwrite: run.json of the earlier run will be moved into {aside}")
    else:
        pf.notes.append(f"run identity {short}: recorded in " + (f"{spec.output_dir}/run.json" if not spec.several_dirs
                        else f"the run.json of each of {where}") + " at launch")


def probe_model(spec: ExtractSpec, playbook, host) -> str | None:
    """The checkpoint the job's model-loading process loads: the playbook's check.model path, else the
    server command's ``serve MODEL`` (None when neither says)."""
    section = (getattr(playbook, "check", None) or {}).get("model")
    if section and host is not None and section.get("path"):
        from remote_ops.playbook.templates import fill_for_host
        path = fill_for_host(playbook, host, section.get("path"), ("check", "model", "path"))
        if isinstance(path, str) and path:
            return path
    cmd = spec.flow.model_command(spec)
    if "serve" in cmd and cmd.index("serve") + 1 < len(cmd) and not cmd[cmd.index("serve") + 1].startswith("-"):
        return cmd[cmd.index("serve") + 1]
    return None



@dataclass
class Context:
    """One preflight's inputs, and the agent's answer of the shared probe (``jobs.probe``) once read."""
    session: object
    spec: ExtractSpec
    playbook: object
    host: object = None
    skip_check: bool = False
    dry_run: bool = False
    strict_drift: bool = False
    overwrite: bool = False
    remeasure_disk: bool = False
    probe: dict = field(default_factory=dict)
    slurm_tasks: int | None = None        # a Slurm job array: its tasks' directories hold the run identity

    @property
    def do_check(self) -> bool:
        return bool(self.playbook.check) and not self.skip_check

    @property
    def label(self) -> str:
        return self.session.label


class Part:
    """One concern of the preflight. ``ops``: its requests (name -> request) for the round trip;
    ``read``: its answers -> problems/notes on ``pf``; returning ``STOP`` ends the preflight there."""
    name = ""

    def ops(self, c: Context) -> dict:
        return {}

    def read(self, c: Context, pf: Preflight, raw: dict):
        return None


STOP = "stop"


class RunningJob(Part):
    """The shared probe (running job, free disk and the disk need, the run identity, a server's port);
    a running job of this output directory and share is attached to; another job there refuses."""
    name = "probe"

    def ops(self, c):
        spec = c.spec
        need = dict(spec.disk, max_samples=spec.expected_samples, workdir=spec.workdir) if spec.disk else None
        if need and spec.shard:
            need["shard"] = list(spec.shard)
        args = spec.flow.probe_args(spec)
        if spec.several_dirs:
            args["output_dirs"] = spec.several_dirs
        if spec.layout:
            args["layout"] = spec.layout
        if (ident_req := identity_request(spec, c.playbook)) is not None:
            args["identity"] = dict(ident_req, tasks=c.slurm_tasks) if c.slurm_tasks else ident_req
        if spec.output_dir and spec.disk:     # the launch plan's disk speed (agent/job/diskspeed.py)
            args["speed"] = {"refresh": c.remeasure_disk}
        if (prep := _prepared.request(spec)) is not None:     # the server flow's Arrow data vs max_model_len
            args["prepared"] = prep
        return {"probe": rq.jobs_probe(key=spec.key, output_dir=spec.output_dir, need=need, **args)}

    def read(self, c, pf, raw):
        from remote_ops.connect.transport import unwrap
        c.probe = probe = unwrap(raw["probe"], c.label)
        spec = c.spec
        job = probe.get("job")
        if job and job.get("state") in ("starting", "running"):
            if probe.get("other_dirs"):        # the same first directory, another list (agent/jobs.py)
                pf.problems.append(probe["other_dirs"])
                pf.hint = (f"stop that job first (remote-ops stop HOST --job {job.get('job_id')}), or launch "
                           "with its output directories")
                return STOP
            if list(job.get("shard") or ()) == list(spec.shard or ()):
                if c.overwrite:        # --overwrite is never dropped silently: refuse, naming the job
                    from remote_ops.agent.jobs import overwrite_running, overwrite_running_hint
                    pf.problems.append(overwrite_running(job, spec.output_dir))
                    pf.hint = overwrite_running_hint(job)
                    return STOP
                pf.running = job       # the job asked for (same output directory, same share): attach
                return STOP
            pf.problems.append(f"{spec.output_dir} is being written by job {job['job_id']} "
                               f"({_shard_text(job.get('shard'))}); this launch is {_shard_text(spec.shard)}")
            pf.hint = ("one output directory holds one job: give each share its own output_dir (e.g. with {host}), "
                       "or stop that job first")
            return STOP
        pf.disk = probe.get("disk")
        held = (pf.disk or {}).get("held_by")
        if held:                 # another job (another state dir, inventory name or machine) writes there
            pf.problems.append(held["line"])
            pf.hint = held.get("hint")
            return STOP
        return None


class GpuQuery(Part):
    """nvidia-smi's GPUs and compute processes (read by ``Gpus`` after the check, as before)."""
    name = "gpu"

    def ops(self, c):
        return {"gpu": rq.gpu_query(driver=False)}

    def read(self, c, pf, raw):
        from remote_ops.connect.transport import unwrap
        pf.gpu = unwrap(raw["gpu"], c.label)


class Files(Part):
    """The playbook's extract.files shipped into the workdir (not on a dry run, not under a running job)."""
    name = "files"

    def ops(self, c):
        spec = c.spec
        if not spec.files:
            return {}
        return {"files": rq.files_put(workdir=spec.workdir, files=[f.to_wire() for f in spec.files],
                                      dry_run=c.dry_run, unless_running=spec.key)}

    def read(self, c, pf, raw):
        res = raw.get("files") or {}
        if not (res.get("result") or {}).get("skipped"):   # (under a running job nothing is sent)
            for s in c.spec.secrets:
                if s.source == "file":
                    pf.notes.append(f"secret {s.name}: read from laptop file "
                                    f"{shipped_from(secret_path(c.spec, s), c.spec)} (sent on stdin, never shown)")
        if "files" not in raw:
            return
        local = {f.name: f for f in c.spec.files}
        if res.get("ok"):
            pf.files = res["result"].get("files") or []
            for f in pf.files:
                mine = local.get(f["name"])
                if mine is not None:
                    f["local"] = mine.full_path
                pf.notes.append(f"file {f['name']}: {f['action']} (sha256 {f['sha256'][:12]}, mode "
                                f"{f.get('mode', '?')}) from laptop file {shipped_from(mine, c.spec)}")
        else:
            err = res.get("error") or {}
            pf.problems.append(f"cannot upload {', '.join(shipped_from(f, c.spec) for f in c.spec.files)}: "
                               f"{err.get('message')}")


def shipped_from(f, spec) -> str:
    """A laptop file (a ShippedFile, or a secret's Path) a playbook ships, by full path (links
    followed), flagged when it lies outside the playbook's folder: a playbook from elsewhere cannot
    read, say, ~/.ssh unseen."""
    if f is None:
        return "?"
    full = Path(f).resolve() if isinstance(f, Path) else Path(f.full_path)
    import remote_ops
    package = Path(remote_ops.__file__).resolve().parent
    if package in full.parents:          # remote-ops:PATH, a file of remote-ops itself
        return f"{full} (remote-ops' own)"
    if spec.playbook_path:
        home = Path(spec.playbook_path).resolve().parent
        if home != full and home not in full.parents:
            return f"{full} (outside the playbook's folder {home})"
    return str(full)


class CallSites(Part):
    """The call-site check with drift (the job would fail on these calls after loading the model), and
    the model preflight of the playbook's check.model."""
    name = "check"

    def ops(self, c):
        out = {}
        if c.do_check:
            from remote_ops.check.check import DEFAULT_AGAINST
            out["check"] = rq.compat_check(targets=c.playbook.check["targets"],
                                           against=c.playbook.check.get("against") or DEFAULT_AGAINST, drift=True)
            if c.host is not None:
                from remote_ops.check import model as model_mod
                model_req = model_mod.request(c.playbook, c.host)
                if model_req is not None:
                    out["model"] = model_req
        return out

    def read(self, c, pf, raw):
        if c.do_check:
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
                                       "see them with remote-ops check HOST, fix them with remote-ops patch HOST")
                if pf.check.get("unknown"):
                    pf.notes.append(f"check: {len(pf.check['unknown'])} call(s) could not be verified")
                _drift_preflight(pf, c.playbook, c.strict_drift)
            if "model" in raw:
                _model_preflight(pf, raw["model"])
        elif not c.playbook.check:
            pf.notes.append("playbook has no 'check' section: call sites not verified")
        else:
            pf.notes.append("check skipped (--skip-check)")


class Gpus(Part):
    """Enough GPUs, and free of foreign compute processes (extract.gpus)."""
    name = "gpus"

    def read(self, c, pf, raw):
        spec, g = c.spec, pf.gpu or {}
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


class Disk(Part):
    """The outputs' disk need against the free space: from real sizes (extract.disk,
    agent/job/diskneed.py), else the mean size of the files already there; a changed shard assignment."""
    name = "disk"

    def read(self, c, pf, raw):
        spec = c.spec
        d = pf.disk or {}
        n = d.get("need") or {}
        if d.get("twice"):
            pf.problems.append(d["twice"])
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
        if d.get("shard") and list(d["shard"]) != list(spec.shard or ()) and not c.overwrite:   # extract/shard.py
            pf.problems.append(assignment_changed(spec, d["shard"]))


class LaunchPlan(Part):
    """The launch plan (extract/plan.py): the disk need's samples, tokens and bytes, the output disk's
    free space and write speed, the hours for the disk's bound and the compute's; read after Disk, whose
    refusal uses the same figures."""
    name = "plan"

    def read(self, c, pf, raw):
        from remote_ops.extract import plan
        d = pf.disk or {}
        p = plan.build(d.get("need"), d.get("speed"), pf.gpu, c.spec.gpu_count, c.spec.output_dir)
        if p is not None:       # what the last job of this playbook and output here took to start
            import dataclasses
            from remote_ops.extract.coldstart import for_plan
            p = dataclasses.replace(p, cold_start=for_plan(c.probe.get("job")))
        pf.plan = None if p is None else p.to_json()


class Identity(Part):
    """Resume only into the same run (run.json): agent/outputs/run_identity.py."""
    name = "identity"

    def read(self, c, pf, raw):
        _identity_preflight(pf, c.probe.get("identity"), c.spec, c.overwrite)


class Port(Part):
    """A two-process job's server port: free on the host (a server left from an earlier run holds it)."""
    name = "port"

    def read(self, c, pf, raw):
        server, port = c.spec.server, c.probe.get("port")
        if flows.runs_part(c.spec, self.name) and port is not None:
            pf.server = {"port": port}
            if not port.get("free"):
                pf.problems.append(f"port {server.port} is not free on the host ({port.get('error')}): another "
                                   "server holds it (a job left running? remote-ops status HOST --all) or set extract.server.port")


class Dataset(Part):
    """The job's dataset read as the job reads it (extract/dataset.py)."""
    name = "dataset"

    def ops(self, c):
        from remote_ops.extract import dataset
        ds = dataset.request(c.spec)
        return {} if ds is None else {"dataset": ds}

    def read(self, c, pf, raw):
        if "dataset" in raw:
            from remote_ops.extract import dataset
            pf.dataset = dataset.preflight(pf, raw["dataset"], c.spec)


class ServerModel(Part):
    """A server-flow job: the model the server serves, checked on the server's vLLM before it starts
    (agent/serverflow.py: custom code without --trust-remote-code, aux layer ids its forward does not
    capture); a failure refuses the job, the server's other checks are notes (check/serverflow.py)."""
    name = "server-model"

    def ops(self, c):
        if not flows.runs_part(c.spec, self.name) or c.skip_check:
            return {}
        from remote_ops.check import serverflow
        return {"server_model": serverflow.request(list(c.spec.server.command))}

    def read(self, c, pf, raw):
        if "server_model" not in raw:
            return
        res = raw["server_model"]
        if not res.get("ok"):
            pf.notes.append(f"server-flow checks could not run: {(res.get('error') or {}).get('message')}")
            return
        from remote_ops.check import serverflow
        problems, notes = serverflow.preflight_lines(res["result"])
        pf.problems.extend(problems)
        pf.notes.extend(notes)


class Imports(Part):
    """The job's modules (and a server's, by the server's interpreter) imported as the job will, with
    the library module of the model's class (Kimi-K2.5: vllm's kimi_k25.py needs compressed_tensors),
    which otherwise fails only once the engine loads the model. Read late: it is the deciding problem."""
    name = "imports"

    def ops(self, c):
        spec = c.spec
        model = probe_model(spec, c.playbook, c.host)
        out = {}
        if spec.import_check:
            out["imports"] = rq.imports_probe(python=spec.job_python, modules=spec.import_check, env=spec.env,
                                              workdir=spec.workdir, timeout=spec.import_timeout,
                                              packages=spec.requires, unless_running=spec.key,
                                              **({"model": model} if model and spec.flow.loads_model_in_job else {}))
        for key, modules, _, python, env in spec.flow.import_probes(spec):
            if modules:
                out[key] = rq.imports_probe(
                    python=python, modules=modules, env=env,
                    workdir=spec.workdir, timeout=spec.import_timeout, packages=spec.requires, unless_running=spec.key,
                    **({"model": model} if model else {}))
        return out

    def read(self, c, pf, raw):
        from remote_ops.errors import exit_for_kind
        probes = [(key, modules, who) for key, modules, who, _, _ in c.spec.flow.import_probes(c.spec)]
        for key, modules, who in probes + [("imports", c.spec.import_check, "job")]:
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


class Requires(Part):
    """A two-process job's packages against the playbook's requires (the import probes' versions)."""
    name = "requires"

    def read(self, c, pf, raw):
        if flows.runs_part(c.spec, self.name) and c.playbook.requires:
            probes = [(key, modules) for key, modules, _, _, _ in c.spec.flow.import_probes(c.spec)]
            _requires_preflight(pf, c.playbook, raw, probes + [("imports", c.spec.import_check)])


class InstalledRanges(Part):
    """The playbook's ranges that hold only when a package is installed (``requires: {transformers:
    {version: "<5.24", if_installed: true}}``) against the job's interpreter, as its import probe reported
    the versions: which installed version breaks which import, said before the engine starts (patch
    checks ``requires`` on the host's default interpreter; the job's may be another)."""
    name = "installed-ranges"

    def read(self, c, pf, raw):
        names = c.playbook.if_installed
        res = raw.get("imports") if flows.runs_part(c.spec, self.name) and names else None
        if not res:
            return
        versions = (res.get("result") or {}).get("versions") if res.get("ok") else (res.get("error") or {}).get("versions")
        have = {n: v for n, v in (versions or {}).items() if n in names and v and v != "not installed"}
        problems = [x for x in c.playbook.check_requires(have) if x.split(" ", 1)[0] in have]
        failed = None if res.get("ok") else (res.get("error") or {}).get("module")
        for problem in problems:
            pf.problems.append(f"requires: {problem}" + (f": it breaks the import of {failed}" if failed else "")
                               + f" (the playbook's requires, {c.playbook.path}:{c.playbook.line('requires')})")
        if have and not problems:
            pf.notes.append("requires: " + ", ".join(f"{n} {v}" for n, v in sorted(have.items()))
                            + " in the job's interpreter, in range")


class Coverage(Part):
    """A host the playbook's requires does not cover: the deciding problem, as patch says it."""
    name = "coverage"

    def read(self, c, pf, raw):
        _coverage_preflight(pf, c.playbook, c.label)


class ServerKey(Part):
    """Whether the server of a two-process job takes requests only with the key generated for the
    launch (extract.server.api_key), said in the launch's notes either way."""
    name = "server-key"

    def ops(self, c):
        return {}

    def read(self, c, pf, raw):
        from remote_ops.extract.server_section import SERVER_KEY_ENV
        if not flows.runs_part(c.spec, self.name):
            return
        srv = c.spec.server
        if srv.api_key_env:
            pf.notes.append(f"server API key: generated for this launch, given to the server as {SERVER_KEY_ENV} "
                            f"and to the client as {srv.api_key_env} (secrets, never on a command line)")
        else:
            pf.notes.append(f"warning: server on 127.0.0.1:{srv.port} has no API key: any user of this host can "
                            "send it requests (the playbook's extract.server has no api_key: {client_env: NAME}; "
                            "see its comments for whether its client can send one)")


# In the order they are read (their requests all go in one round trip).
PARTS = (RunningJob(), GpuQuery(), Files(), CallSites(), Gpus(), Disk(), LaunchPlan(), Identity(), Port(), Dataset(),
         _prepared.PreparedData(), ServerModel(), ServerKey(), Imports(), Requires(), InstalledRanges(), Coverage())


def preflight(session, spec: ExtractSpec, playbook, *, skip_check: bool = False, dry_run: bool = False,
              strict_drift: bool = False, host=None, overwrite: bool = False, remeasure_disk: bool = False,
              slurm_tasks: int | None = None) -> Preflight:
    """Running job + shipped files + GPUs + check + disk + run identity + port + dataset + import probes,
    in ONE round trip. The files are uploaded here (unless dry_run or the job is running), before the
    probe that may import them. Drift against the package's baseline is shown as notes, and refuses the
    job only with ``strict_drift``. ``remeasure_disk``: measure the output disk's write speed again
    instead of using the host's cached figure. ``slurm_tasks``: the run identity is each array task's."""
    c = Context(session, spec, playbook, host, skip_check, dry_run, strict_drift, overwrite, remeasure_disk,
                slurm_tasks=slurm_tasks)
    ops: dict[str, rq.Request] = {}
    parts = parts_for(spec)
    for part in parts:
        ops.update(part.ops(c))
    raw = dict(zip(ops, session.call_many(list(ops.values()), timeout=2 * spec.import_timeout + 300)))
    return read(c, raw, parts)


def parts_for(spec: ExtractSpec) -> list:
    """The parts a preflight of ``spec`` runs, in order: PARTS less those another flow declares
    (extract/flows.py), with the flow's own parts read before the import probes."""
    parts = [p for p in PARTS if flows.runs_part(spec, p.name)]
    at = next(i for i, p in enumerate(parts) if p.name == Imports.name)
    return parts[:at] + list(spec.flow.own_parts) + parts[at:]


def read(c: Context, raw: dict, parts=None) -> Preflight:
    """The preflight record from the round trip's answers (``raw``: request name -> answer)."""
    pf = Preflight()
    for part in parts_for(c.spec) if parts is None else parts:
        if part.read(c, pf, raw) == STOP:
            break
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


