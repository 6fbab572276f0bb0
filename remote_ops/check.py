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
FINDING_EXTRAS = ("col", "module", "defined", "call", "signature", "signature_mode", "signature_origin", "fix")

DEFAULT_PACKAGE = "speculators.data_generation"
DEFAULT_AGAINST = ["vllm"]


@dataclass
class CheckRequest:
    targets: list[str] | None = None      # None: every module of `package` importing `against`
    against: list[str] = field(default_factory=lambda: list(DEFAULT_AGAINST))
    package: str = DEFAULT_PACKAGE
    runtime: bool = False
    override_sources: dict[str, str] | None = None

    def op_args(self) -> dict:
        args: dict[str, Any] = {"against": list(self.against), "package": self.package,
                                "mode": "runtime" if self.runtime else "static"}
        if self.targets:
            args["targets"] = list(self.targets)
        if self.override_sources:
            args["override_sources"] = dict(self.override_sources)
        return args


def request_from_playbook(pb, runtime: bool = False) -> CheckRequest:
    """Targets from a playbook's ``check:`` section (default targets when it has none)."""
    c = getattr(pb, "check", None) or {}
    return CheckRequest(targets=list(c.get("targets") or []) or None,
                        against=list(c.get("against") or DEFAULT_AGAINST), runtime=runtime)


def run(session, req: CheckRequest) -> dict:
    """One exec round trip; returns the CLI's JSON object (plus timing)."""
    t0 = time.perf_counter()
    raw = session.call("compat.check", req.op_args())
    out = to_json(session.label, raw)
    out["timing"] = {"host_analysis_s": raw.get("elapsed_s"),
                     "round_trip_s": round(time.perf_counter() - t0, 4)}
    return out


def to_json(host: str, raw: dict) -> dict:
    findings = []
    for f in raw.get("findings") or []:
        rec = {k: f.get(k) for k in FINDING_KEYS}
        rec.update({k: f.get(k) for k in FINDING_EXTRAS if k in f})
        findings.append(rec)
    return {"host": host, "mode": raw.get("mode", "static"), "versions": raw.get("versions") or {},
            "findings": findings, "unknown": raw.get("unknown") or [],
            "targets": raw.get("targets") or [], "calls_checked": raw.get("calls_checked"),
            "python": raw.get("python"), **({"note": raw["note"]} if raw.get("note") else {})}


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
    n = len(result["findings"])
    if n:
        console.print(f"[red]{n} finding(s)[/red]")
    else:
        console.print("[green]no findings[/green]")


def render_inspect(console, result: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    versions = ", ".join(f"{k} {v}" for k, v in sorted((result.get("versions") or {}).items()))
    console.print(f"[bold]{escape(result['host'])}[/bold] ({result['mode']} mode; {escape(versions)})")
    for s in result["symbols"]:
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
