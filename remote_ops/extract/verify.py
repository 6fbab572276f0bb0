"""The verify operation, controller side: the job's outputs checked on the host with its own torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from remote_ops.connect import agent_requests as rq
from remote_ops.errors import AgentError, RefusedError, RemoteOpsError, UsageError
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


def verify(session, host, *, output_dir: str | None = None, expected: int | None = None, all: bool = False,
           sample: int = 32, playbook: str | None = None, job: str | None = None,
           on_progress: Callable[[int, int], None] | None = None) -> VerifyResult:
    """The verify operation on one host: the outputs of ``output_dir``, else of the job ``jobs.ref_for``
    names (else the playbook's output_dir when the host has no such job); ``on_progress(done, of)``
    while the host loads files."""
    from remote_ops.extract import jobs

    check_sample(sample)
    layout = None
    if not output_dir:
        try:
            st = jobs.resolve_job(session, jobs.ref_for(host, playbook=playbook, job=job))
            output_dir = st.get("output_dir")
            expected = expected or (st.get("samples") or {}).get("expected")
            layout = st.get("layout")
        except RefusedError:
            _, spec = jobs.load_for_host(host, playbook)
            output_dir, expected = spec.output_dir, expected or spec.expected_samples
            layout = spec.layout
    elif playbook or host.playbook:
        try:
            layout = jobs.load_for_host(host, playbook)[1].layout   # the playbook says which files to expect
        except RemoteOpsError:
            layout = None
    if not output_dir:
        raise UsageError("no output directory known", "pass --output-dir or set extract.output_dir")
    res = None
    layout_arg = {"layout": layout} if layout else {}
    for msg in session.stream(*rq.verify_verify(output_dir=output_dir, expected=expected, all=all, sample=sample,
                                                **layout_arg), timeout=600):
        if "event" in msg and on_progress is not None:
            on_progress(msg["event"].get("checked"), msg["event"].get("of"))
        elif "result" in msg:
            res = msg["result"]
    if res is None:
        raise AgentError("verify ended without an answer", "rerun it", host=host.name)
    return VerifyResult.from_json(res, host=host.name)
