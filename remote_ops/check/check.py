"""The check and inspect operations, controller side: op arguments, per-host functions, records.

The analysis itself runs on the host in ONE agent round trip (``remote_ops/agent/compat.py``),
over the files that the host's interpreter would import. This module builds the op's arguments and
turns its answer into the typed records (``CheckResult``, ``InspectResult``); drift against the
baseline is analysed here, on the controller (``remote_ops/check/drift.py``). Rendering is the CLI's
(``remote_ops/commands/check.py``, ``commands/inspect.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

FINDING_KEYS = ("path", "line", "symbol", "kind", "name", "message", "suggestion")
# extra structured data kept on every finding (for people and for `check --emit-playbook`)
FINDING_EXTRAS = ("col", "module", "defined", "call", "source", "signature", "signature_mode", "signature_origin",
                  "fix")

from remote_ops.connect import agent_requests as rq
from remote_ops.agent.contract import DEFAULT_AGAINST as _AGAINST
from remote_ops.agent.contract import DEFAULT_PACKAGE
from remote_ops.errors import UsageError
from remote_ops.records import Record, optional

# the one default for the library checked against (the agent op uses the same constant)
DEFAULT_AGAINST = list(_AGAINST)


@dataclass
class CheckRequest:
    targets: list[str] | None = None      # None: every module of `package` importing `against`
    against: list[str] = field(default_factory=lambda: list(DEFAULT_AGAINST))
    package: str = DEFAULT_PACKAGE
    runtime: bool = False
    override_sources: dict[str, str] | None = None
    drift: bool = True                     # compare with the baseline the package was written for
    baseline: str | None = None           # VERSION or PATH; None: the package's declared pin
    accepted_drift: list = field(default_factory=list)   # the playbook's check.accepted_drift

    def op_args(self) -> dict:
        args: dict[str, Any] = {"against": list(self.against), "package": self.package,
                                "mode": "runtime" if self.runtime else "static"}
        if self.drift:
            args["drift"] = True
        if self.targets:
            args["targets"] = list(self.targets)
        if self.override_sources:
            args["override_sources"] = dict(self.override_sources)
        return args


def request_from_playbook(pb, runtime: bool = False) -> CheckRequest:
    """Targets from a playbook's ``check:`` section (default targets when it has none)."""
    c = getattr(pb, "check", None) or {}
    return CheckRequest(targets=list(c.get("targets") or []) or None,
                        against=list(c.get("against") or DEFAULT_AGAINST), runtime=runtime,
                        accepted_drift=list(c.get("accepted_drift") or []))


def make_request(*, pb=None, runtime: bool = False, targets: list[str] | None = None,
                 against: list[str] | None = None, package: str | None = None, baseline: str | None = None,
                 drift: bool = True) -> CheckRequest:
    """The check to run, from the operation's parameters; ``pb``: the named playbook (loaded once by
    the caller), whose ``check:`` section gives the targets."""
    req = request_from_playbook(pb, runtime=runtime) if pb is not None else CheckRequest(runtime=runtime)
    if targets:
        req.targets = list(targets)
    if against:
        req.against = list(against)
    if package:
        req.package = package
    req.baseline, req.drift = baseline, drift
    return req


def for_host(req: CheckRequest, pb) -> CheckRequest:
    """``req`` with the host's own playbook's ``check.accepted_drift`` (``pb``, loaded once by the
    caller; None: ``req`` unchanged)."""
    if pb is None:
        return req
    from dataclasses import replace
    return replace(req, accepted_drift=list((pb.check or {}).get("accepted_drift") or []))


@dataclass(eq=False)
class LibraryAnswer(Record):
    """What ``check`` and ``inspect`` records share: the host, the mode, the library versions."""

    host: str
    mode: str = "static"
    versions: dict = field(default_factory=dict)


@dataclass(eq=False)
class CheckResult(LibraryAnswer):
    """The record of ``check``: binding findings, what could not be decided, drift vs the baseline."""

    findings: list = field(default_factory=list)
    unknown: list = field(default_factory=list)
    targets: list = field(default_factory=list)
    calls_checked: int | None = None
    python: Any = None
    note: str = optional()
    drift: list = optional()
    drift_notes: list = optional()
    drift_accepted: list = optional()
    baseline: dict = optional()
    timing: dict = optional()
    model: dict = optional()            # the model preflight (check.model), when a model is known
    server_flow: dict = optional()      # a server-flow playbook's checks on the host's vLLM (check.serverflow)
    extra: dict = field(default_factory=dict)

    def has_findings(self, strict: bool = False) -> bool:
        return bool(self.findings or (strict and self.drift) or (self.model or {}).get("findings")
                    or (self.server_flow or {}).get("findings") or (strict and self.nothing_checked()))

    def nothing_checked(self) -> bool:
        """No call site, no server-flow check and no model check was decided: ``--strict`` fails."""
        return not self.calls_checked and not (self.server_flow or {}).get("checked") \
            and not (self.model or {}).get("class")


def check(session, req: CheckRequest, model_req=None, model_from_vars: bool = False,
          server_req=None, server_playbook: str | None = None) -> CheckResult:
    """The check operation on the session's host: one exec round trip (the call sites, and the model preflight
    when ``model_req``: ``check.model.request``), then drift on the controller. ``model_from_vars``:
    the model is the playbook's var, not ``--model``: a directory that is not there is not checked
    (an unknown naming the var) rather than a finding, since ``check`` is about the code; the extract
    preflight still refuses it. ``server_req``: ``check.serverflow.request`` (a server-flow playbook's
    checks of the host's vLLM: remote_ops/agent/serverflow.py), in the same round trip."""
    out = run(session, req, model_req, server_req)
    if "server_flow" in out:
        from remote_ops.check import serverflow
        out["server_flow"] = serverflow.summarize(out["server_flow"], server_playbook)
    if model_from_vars and out.get("model"):
        from remote_ops.check.model import missing_as_unknown
        missing_as_unknown(out["model"])
    if out.get("model"):
        from remote_ops.check import known
        m = out["model"]
        m["warnings"] = known.warnings_for(m, out.get("versions") or {})
        # the model check's warnings (a tokenizer in custom code that the package loads untrusted): said by
        # check as warnings, not findings; extract's preflight refuses them (extract/preflight.py)
        for f in [f for f in m.get("findings") or [] if f.get("severity") == "warning"]:
            m["findings"].remove(f)
            m["warnings"].append({"kind": f.get("kind"), "message": f"{f['message']} (fix: {f['suggestion']})",
                                  "source": f"{f['path']}:{f['line']}"})
    return CheckResult.from_json(out)


def run(session, req: CheckRequest, model_req=None, server_req=None) -> dict:
    """One exec round trip; returns the CLI's JSON object (plus timing)."""
    from remote_ops.connect.transport import unwrap
    t0 = time.perf_counter()
    extra = [r for r in (model_req, server_req) if r is not None]
    if not extra:
        raw, model, server = session.call(*rq.compat_check(**req.op_args())), None, None
    else:
        got = [unwrap(r, session.label) for r in session.call_many([rq.compat_check(**req.op_args())] + extra)]
        raw = got.pop(0)
        model = got.pop(0) if model_req is not None else None
        server = got.pop(0) if server_req is not None else None
    t1 = time.perf_counter()
    out = to_json(session.label, raw, req)
    if model is not None:
        model.pop("elapsed_s", None)
        out["model"] = model
    if server is not None:
        server.pop("elapsed_s", None)
        out["server_flow"] = server
    out["timing"] = {"host_analysis_s": raw.get("elapsed_s"),
                     "round_trip_s": round(t1 - t0, 4)}
    if req.drift:
        out["timing"]["drift_baseline_s"] = round(time.perf_counter() - t1, 4)
    return out


def with_drift(raw: dict, req: CheckRequest | None) -> dict:
    """``raw`` plus drift against the baseline (controller side); {} when drift is off."""
    if req is None:
        return {}
    if not req.drift:
        return {"drift": [], "drift_notes": [], "baseline": {"unavailable": "drift analysis was switched off"}}
    from remote_ops.check import drift
    return drift.apply_accepted(drift.analyse(raw, list(req.against), req.baseline), req.accepted_drift)


def to_json(host: str, raw: dict, req: CheckRequest | None = None) -> dict:
    extra = with_drift(raw, req)
    findings = []
    for f in raw.get("findings") or []:
        rec = {k: f.get(k) for k in FINDING_KEYS}
        rec.update({k: f.get(k) for k in FINDING_EXTRAS if k in f})
        if "baseline" in f:
            rec["baseline"] = f["baseline"]
        findings.append(rec)
    return {"host": host, "mode": raw.get("mode", "static"), "versions": raw.get("versions") or {},
            "findings": findings, "unknown": raw.get("unknown") or [],
            "targets": raw.get("targets") or [], "calls_checked": raw.get("calls_checked"),
            "python": raw.get("python"), **({"note": raw["note"]} if raw.get("note") else {}),
            **extra}




# ------------------------------------------------------------------ inspect
@dataclass(eq=False)
class InspectResult(LibraryAnswer):
    """The record of ``inspect``: each symbol's parameters as the host defines them (and in a baseline)."""

    symbols: list = field(default_factory=list)
    baselines: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def unresolved(self) -> bool:
        return any(s["kind"] in ("missing", "unknown") for s in self.symbols)


def parse_symbols(symbols: list[str]) -> list[str]:
    """``module:qualname`` strings, checked locally (UsageError names the bad one)."""
    for s in symbols:
        mod, sep, qual = s.partition(":")
        if not sep or not all(p.isidentifier() for p in mod.split(".")) or \
                (qual and not all(p.isidentifier() for p in qual.split("."))):
            raise UsageError(f"bad symbol {s!r}: expected module:qualname", "for example vllm.v1.request:Request")
    return list(symbols)


def inspect(session, symbols: list[str], *, runtime: bool, baseline: str | None) -> InspectResult:
    """The inspect operation on the session's host (one round trip; ``baseline`` adds the same symbols in that
    library version and what changed since)."""
    raw = session.call(*rq.compat_inspect(symbols=list(symbols), mode="runtime" if runtime else "static"))
    rec = InspectResult.from_json(raw, host=session.label, baselines={})
    if baseline:
        from remote_ops.check import drift
        rec.baselines = drift.inspect_diff(rec.to_json(), baseline)
    return rec
