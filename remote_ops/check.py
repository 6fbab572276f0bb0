"""`remote-ops check` / `remote-ops inspect`: controller side (op arguments, records, rendering).

The analysis itself runs on the host in ONE agent round trip (``remote_ops/agent/compat.py``),
over the files that the host's interpreter would import. This module builds the op's arguments,
turns its answer into the JSON object of the CLI contract and renders it for people.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

FINDING_KEYS = ("path", "line", "symbol", "kind", "name", "message", "suggestion")
# extra structured data kept on every finding (for people and for `check --emit-playbook`)
FINDING_EXTRAS = ("col", "module", "defined", "call", "source", "signature", "signature_mode", "signature_origin",
                  "fix")

from remote_ops.agent.contract import DEFAULT_AGAINST as _AGAINST
from remote_ops.agent.contract import DEFAULT_PACKAGE

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


def run(session, req: CheckRequest) -> dict:
    """One exec round trip; returns the CLI's JSON object (plus timing)."""
    t0 = time.perf_counter()
    raw = session.call("compat.check", req.op_args())
    t1 = time.perf_counter()
    out = to_json(session.label, raw, req)
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
    from remote_ops import drift
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


def explain(f: dict, style: str = "line") -> str:
    """A finding as one line (``line``) or as a few lines for people (``verbose``)."""
    where = f"{f['path']}:{f['line']}"
    if style == "line":
        return f"{where}: {f['kind']}: {f['message']}"
    call = f.get("call") or ""
    call = call if len(call) <= 100 else call[:97] + "..."
    lines = [f"{where}  {call}".rstrip(),
             f"    {f['kind']}: {f['message']}"]
    if f.get("signature"):
        lines.append(f"    remote:  {f['symbol']}{f['signature']}")
    if f.get("suggestion"):
        lines.append(f"    fix:     {f['suggestion']}")
    return "\n".join(lines)


def render(console, result: dict, verbose: int = 0) -> None:
    from rich.markup import escape

    versions = ", ".join(f"{k} {v}" for k, v in sorted(result["versions"].items()))
    t = result.get("timing") or {}
    timing = ""
    if t.get("host_analysis_s") is not None:
        timing = f", analysis {t['host_analysis_s'] * 1000:.0f} ms on the host"
    console.print(f"[bold]{escape(result['host'])}[/bold]: {result['mode']} check of "
                  f"{len(result['targets'])} module(s), {result.get('calls_checked') or 0} library calls "
                  f"({escape(versions)}{timing})")
    if verbose:
        for tg in result["targets"]:
            console.print(f"  [dim]{escape(tg['module'])}  {escape(tg['path'])}[/dim]")
    for f in result["findings"]:
        console.print(escape(explain(f, "verbose")))
    if result["unknown"]:
        console.print(f"[yellow]{len(result['unknown'])} call(s) could not be decided "
                      f"(not counted as compatible):[/yellow]")
        for u in result["unknown"]:
            console.print(escape(f"  {u.get('path')}:{u.get('line')}  {u.get('symbol')}: {u.get('reason')}"))
    if result.get("note"):
        console.print(f"[yellow]{escape(result['note'])}[/yellow]")
    render_drift(console, result, verbose)
    n = len(result["findings"])
    nd = len(result.get("drift") or [])
    nu = len(result["unknown"])
    base = result.get("baseline") or {}
    compared = any("unavailable" not in b for b in (base.get("libraries") or [base])) if base else False
    tail = f", {nd} drift item(s), {nu} unknown" if compared else f", {nu} unknown"
    if n:
        console.print(f"[red]{n} finding(s)[/red]{tail}")
    else:
        console.print(f"[green]no findings[/green]{tail}")


def render_drift(console, result: dict, verbose: int = 0) -> None:
    from rich.markup import escape

    from remote_ops import drift

    base = result.get("baseline")
    if base is None:
        return
    for b in (base.get("libraries") or [base]):
        if "unavailable" in b:
            console.print(f"[yellow]no baseline for drift: {escape(b['unavailable'])} (binding check only)[/yellow]")
        else:
            console.print(f"[bold]drift against {escape(b['library'])} {escape(b['version'])}[/bold] "
                          f"[dim]({escape(b['source'])})[/dim]")
    for d in result.get("drift") or []:
        console.print(escape(drift.explain(d)))
    if verbose:
        for n in result.get("drift_notes") or []:
            console.print(escape(f"  note: {n}"))
    elif result.get("drift_notes"):
        console.print(f"[dim]{len(result['drift_notes'])} difference(s) not reported as drift (-v lists them)[/dim]")
    accepted = result.get("drift_accepted") or []
    if accepted:
        console.print(f"{len(accepted)} drift item(s) accepted by the playbook (check.accepted_drift)"
                      + ("" if verbose else " [dim](-v lists them with the reasons)[/dim]"))
        if verbose:
            for d in accepted:
                console.print(escape(f"  accepted: {d['path']}:{d['line']}: {d['kind']} {d['name']}: {d['accepted']}"))
    for a in result.get("accepted_unmatched") or []:
        stale = f"check.accepted_drift entry {a['kind']} {a['symbol']} {a['name']} matched no drift item on this host (stale, or not for this version)"
        console.print(f"[yellow]{escape(stale)}[/yellow]")


def render_inspect(console, result: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    versions = ", ".join(f"{k} {v}" for k, v in sorted((result.get("versions") or {}).items()))
    console.print(f"[bold]{escape(result['host'])}[/bold] ({result['mode']} mode; {escape(versions)})")
    for lib, b in (result.get("baselines") or {}).items():
        if "unavailable" in b:
            console.print(f"[yellow]no baseline for {escape(lib)}: {escape(b['unavailable'])}[/yellow]")
    for s in result["symbols"]:
        base = s.get("baseline")
        if base:
            if "signature" in base:
                console.print(escape(f"{s['symbol']} in {base['version']}: {base['signature']}  ({base['origin']})"))
            else:
                console.print(escape(f"{s['symbol']} in {base['version']}: {base['kind']}: {base.get('reason')}"))
            for c in base.get("changes") or []:
                console.print(escape(f"    since {base['version']}: {c}"))
        if s["kind"] in ("missing", "unknown") or "parameters" not in s:
            console.print(escape(f"{s['symbol']}: {s['kind']}: {s.get('reason')}"))
            continue
        head = f"{s['symbol']}{s['signature']}"
        console.print(f"[bold]{escape(head)}[/bold]  [dim]{s['mode']}; {escape(str(s.get('origin')))}"
                      f"{'; ' + escape(s['note']) if s.get('note') else ''}[/dim]")
        tab = Table(box=None, padding=(0, 2), show_edge=False)
        for col in ("name", "kind", "required", "default", "annotation"):
            tab.add_column(col)
        for p in s["parameters"]:
            tab.add_row(escape(p["name"]), p["kind"], "required" if p["required"] else "",
                        escape(p["default"] or ""), escape(p["annotation"] or ""))
        console.print(tab)
