"""The verify operation, controller side: the job's outputs checked on the host with its own torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from remote_ops.connect import agent_requests as rq
from remote_ops.errors import RefusedError, RemoteOpsError, UsageError
from remote_ops.records import Record


@dataclass(eq=False)
class VerifyResult(Record):
    """The record of ``verify``: files counted, gaps, unloadable, layout, NaN/inf; ``ok`` when clean."""

    host: str
    ok: bool = False
    output_dir: str = ""
    files: int = 0
    expected: int | None = None
    checked: int = 0
    mode: str = ""
    extra: dict = field(default_factory=dict)


def check_sample(sample: int) -> None:
    """``verify``'s sample size (checked by api.Inventory before any host, and by ``verify`` itself)."""
    if sample < 1:
        raise UsageError("--sample must be at least 1")


def output_dir_for(session, *, pb, job: str | None) -> tuple[str, int | None, str | None]:
    """The output directory of the job ``jobs.ref_for(pb, job)`` names (else the playbook's output_dir
    when the host has no such job), the number of samples the job expects and its file layout."""
    return job_output(session, pb=pb, job=job)[:3]


def job_output(session, *, pb, job: str | None) -> tuple[str, int | None, str | None, dict | None]:
    """``output_dir_for`` and the job's status record (None when the host has no such job)."""
    from remote_ops.extract import jobs

    st = None
    try:
        st = jobs.resolve_job(session, jobs.ref_for(pb, job, session.host))
        output_dir, default, layout = st.get("output_dir"), (st.get("samples") or {}).get("expected"), st.get("layout")
    except RefusedError:
        if pb is None:     # no such job, and no playbook to say where its outputs would be
            raise
        spec = jobs.parse_spec(pb, session.host)
        output_dir, default, layout = spec.output_dir, spec.expected_samples, spec.layout
    if not output_dir:
        raise UsageError("no output directory known", "pass --output-dir or set extract.output_dir")
    return output_dir, default, layout, st


def running(st: dict | None) -> dict | None:
    """A job still writing the output (verify's and gather's ``running``): its id, state and samples;
    None when it ended (or there is none)."""
    if not st or st.get("state") not in ("running", "starting"):
        return None
    s = st.get("samples") or {}
    return {"job_id": st.get("job_id"), "state": st["state"], "done": s.get("done"), "expected": s.get("expected")}


def running_note(run: dict | None) -> str | None:
    """The one line saying the job still runs: the samples it has not written are not lost yet."""
    if not run:
        return None
    of = f"/{run['expected']}" if run.get("expected") is not None else ""
    return (f"note: job {run['job_id']} is {run['state']} ({run.get('done')}{of} samples): what it has not "
            "written yet counts as missing; verify again once it ended")


def verify(session, *, pb, output_dir: str | None, expected: int | None, all: bool, sample: int,
           job: str | None, on_progress: Callable[[int, int], None] | None = None,
           adopt: bool, logits: int, logits_port: int | None) -> VerifyResult:
    """The verify operation on the session's host: the outputs of ``output_dir``, else of the job
    ``jobs.ref_for(pb, job)`` names (else the playbook's output_dir when the host has no such job);
    ``on_progress(done, of)`` while the host loads files. ``adopt``: an output without run.json (written
    before run identities) gets the run identity of the playbook's job, written only when every
    file loads, is consistent, and its token ids equal its dataset line (implies ``all``)."""
    check_sample(sample)
    adopt_arg = {}
    if adopt:
        if pb is None:
            raise UsageError("--adopt needs the playbook whose job made the outputs", "pass --playbook NAME")
        from remote_ops.extract import jobs
        from remote_ops.extract.preflight import identity_request
        req = identity_request(jobs.parse_spec(pb, session.host), pb)
        if req is None:
            raise UsageError("--adopt: the playbook names no extract.output_dir", "pass --playbook NAME")
        adopt_arg, all = {"adopt": req}, True
    default = layout = st = None   # the job's count when none is given (the job's data_config.json overrides it)
    if not output_dir:
        output_dir, default, layout, st = job_output(session, pb=pb, job=job)
    elif pb is not None:
        from remote_ops.extract import jobs
        try:
            layout = jobs.parse_spec(pb, session.host).layout   # the playbook says which files to expect
        except RemoteOpsError:
            layout = None
    layout_arg = {"layout": layout} if layout else {}
    progress = None if on_progress is None else lambda e: on_progress(e.get("checked"), e.get("of"))
    res = session.stream_result(*rq.verify_verify(output_dir=output_dir, expected=expected, expected_default=default,
                                                  all=all, sample=sample, **layout_arg, **adopt_arg),
                                timeout=600, on_event=progress, what="verify")
    if running(st):
        res = dict(res, running=running(st))
    if logits:     # verify --logits N (extract/logits.py): the engine is the given port, else the job's server
        from remote_ops.extract import logits as logits_mod
        lr = logits_mod.check(session, output_dir=output_dir, layout=layout, n=logits,
                              port=logits_port or logits_mod.server_port(st))
        res = dict(res, logits=lr.to_json(), ok=bool(res.get("ok")) and lr.ok)
    return VerifyResult.from_json(res, host=session.label)
