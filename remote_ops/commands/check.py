"""remote-ops check: which calls of the host's speculators cannot bind to its installed vLLM, and
where the library's behaviour drifted from the version the package was written for."""

from remote_ops.check.check import DEFAULT_AGAINST
from remote_ops.commands.params import cli_flag, flag

NAME = "check"
HELP = ("report every call/import of the library that cannot bind on the host (static, or --runtime), "
        "and drift from the baseline version")
FLAGS = {
    "playbook": "take check targets from this playbook's check: section",
    "runtime": "import the library on the host and use inspect.signature (default: parse its sources)",
    "targets": flag("caller module to analyse (repeatable; default: modules of --package importing the library)",
                    "--target", metavar="MODULE"),
    "against": flag("library package (repeatable; default: %s)" % ", ".join(DEFAULT_AGAINST), metavar="PKG"),
    "baseline": flag("library version (fetched from PyPI, sources only) or directory of sources that the "
                     "package was written for (default: the version the package pins in its metadata)",
                     metavar="VERSION|PATH"),
    "drift": "binding check only (no baseline comparison)",
    "strict": cli_flag("exit 1 on drift too (default: drift is shown, exit 0)", action="store_true"),
    "emit_playbook": cli_flag("write a draft playbook with mechanical fixes for the findings (placeholders where a "
                              "person must decide; the loader refuses it until they are filled in)", metavar="FILE"),
    "model": flag("check this checkpoint's model class against what the package's worker needs "
                  "(default: the playbook var target_model; needs the playbook's check.model section)",
                  metavar="PATH|HF_ID"),
    "candidates": cli_flag("check the package's releases (from the installed one on, sources from PyPI) against the "
                           "host's library: declared range, findings, drift, flow, covering playbook",
                           action="store_true"),
    "package": flag("default targets: modules of this package (default speculators.data_generation)",
                    metavar="PKG"),
}


def run(args, ctx) -> int:
    from remote_ops.commands.params import call
    from remote_ops.errors import Exit

    if args.candidates:
        results = call(ctx.fleet.candidates, args)
        return ctx.show(results, lambda c, name, v: render_candidates(c, v),
                        summary=lambda v: ", ".join(f"{r['release']}: {r['findings']}" for r in v.rows
                                                    if r.get("findings") == 0) or "no release binds cleanly",
                        exit_for=lambda v: int(Exit.OK))
    results = call(ctx.fleet.check, args)
    status = ctx.show(results, lambda c, name, v: render(c, v, ctx.verbose),
                      summary=lambda v: "{} finding(s), {} drift, {} unknown".format(*totals(v.to_json())),
                      exit_for=lambda v: int(Exit.FINDINGS) if v.has_findings(args.strict) else int(Exit.OK))
    found = [r.value.to_json() for r in results if r.ok]
    if args.emit_playbook and found:
        _emit_playbook(args.emit_playbook, results.request, found)
    return status


def _emit_playbook(path, req, values) -> None:
    import sys

    from remote_ops.check import emit_playbook

    written, n = emit_playbook.write_for_hosts(path, values, targets=req.targets, against=req.against)
    sys.stderr.write(f"remote-ops: wrote a draft playbook with fixes for {n} finding(s) to {written}\n")


def totals(result: dict) -> tuple[int, int, int]:
    """(findings, drift items, unknown) of one host's check, the model preflight's and the server
    flow's included: the numbers of the closing line are the sums of the lines above it."""
    parts = [result, result.get("model") or {}, result.get("server_flow") or {}]
    return (sum(len(p.get("findings") or []) for p in parts),
            len(result.get("drift") or []),
            sum(len(p.get("unknown") or []) for p in parts))


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
    from remote_ops.termsafe import markup as escape   # cleaned, then [ escaped: the host's text

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
    render_model(console, result.get("model"))
    render_server_flow(console, result.get("server_flow"), verbose)
    if not result.get("calls_checked") and not (result.get("server_flow") or {}).get("checked") \
            and not (result.get("model") or {}).get("class"):
        console.print("[yellow]nothing was checked on this host (check --strict exits 1)[/yellow]")
    n, nd, nu = totals(result)
    base = result.get("baseline") or {}
    compared = any("unavailable" not in b for b in (base.get("libraries") or [base])) if base else False
    tail = f", {nd} drift item(s), {nu} unknown" if compared else f", {nu} unknown"
    if n:
        console.print(f"[red]{n} finding(s)[/red]{tail}")
    else:
        console.print(f"[green]no findings[/green]{tail}")


def render_model(console, m: dict | None) -> None:
    """The model preflight's lines: what was resolved, each finding with its fix, each unknown."""
    if not m:
        return
    from remote_ops.termsafe import markup as escape   # cleaned, then [ escaped: the host's text

    from remote_ops.check import model as model_mod
    console.print(f"[bold]{escape(model_mod.summary(m))}[/bold]")
    for f in m.get("findings") or []:
        console.print(escape(model_mod.explain(f)))
        if f.get("suggestion"):
            console.print(escape(f"    fix:     {f['suggestion']}"))
    for u in m.get("unknown") or []:
        console.print(f"[yellow]{escape('not checked: ' + u['what'] + ': ' + u['reason'])}[/yellow]")
    for w in m.get("warnings") or []:
        console.print(f"[yellow]{escape('warning: ' + w['message'] + ' (source: ' + w['source'] + ')')}[/yellow]")


def render_server_flow(console, sf: dict | None, verbose: int = 0) -> None:
    """A server-flow playbook's checks on the host's vLLM: the count, each failed or undecided one."""
    if not sf:
        return
    from remote_ops.termsafe import markup as escape   # cleaned, then [ escaped: the host's text

    from remote_ops.check import serverflow
    lib = sf.get("library") or {}
    console.print(f"[bold]server flow ({escape(str(sf.get('playbook')))}) on vllm {escape(str(lib.get('version')))}:"
                  f"[/bold] {sf.get('checked', 0)} check(s) decided, {len(sf.get('findings') or [])} failed, "
                  f"{len(sf.get('warnings') or [])} warning(s), {len(sf.get('unknown') or [])} undecided")
    for c in sf.get("checks") or []:
        if c.get("ok") is True and not verbose:
            continue
        line = serverflow.explain(c) if c.get("ok") is not True else f"  ok: {c['what']}"
        if c.get("ok") is None:
            line = "not checked: " + line
        elif c.get("severity") == "warning":
            line = "warning: " + line
        console.print(escape(line))
        if c.get("fix") and c.get("ok") is False:
            console.print(escape(f"    fix:     {c['fix']}"))


def render_drift(console, result: dict, verbose: int = 0) -> None:
    from remote_ops.termsafe import markup as escape   # cleaned, then [ escaped: the host's text

    from remote_ops.check import drift

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
    unmatched = result.get("accepted_unmatched") or []
    # one statement of the playbook's accepted_drift entries: how many matched (and so were
    # accepted) and which others matched nothing here, said as the other entries, not as a contradiction
    matched = len({(d.get("kind"), d.get("symbol"), d.get("name")) for d in accepted})
    if accepted:
        console.print(f"check.accepted_drift: {matched} of {matched + len(unmatched)} entries matched drift on "
                      f"this host; {len(accepted)} drift item(s) accepted"
                      + ("" if verbose else " [dim](-v lists them with the reasons)[/dim]"))
        if verbose:
            for d in accepted:
                console.print(escape(f"  accepted: {d['path']}:{d['line']}: {d['kind']} {d['name']}: {d['accepted']}"))
    if unmatched:
        which = ", ".join(f"{a['kind']} {a['symbol']}.{a['name']}" for a in unmatched)
        lead = (f"the other {len(unmatched)} entr{'y' if len(unmatched) == 1 else 'ies'}" if accepted
                else f"check.accepted_drift: none of the {len(unmatched)} entries")
        console.print(f"[yellow]{escape(f'{lead} matched no drift on this host (written for another version, or stale): {which}')}[/yellow]")


def render_candidates(console, result) -> None:
    """The candidates table: one row per release of the package."""
    from remote_ops.termsafe import markup as escape   # cleaned, then [ escaped: the host's text
    from rich.table import Table

    pkg, lib = result["package"], result["library"]
    inst = result["installed"]
    t = result.get("timing") or {}
    console.print(f"[bold]{escape(result['host'])}[/bold]: {escape(pkg)} releases against the host's "
                  f"{escape(lib)} {escape(str(inst.get(lib)))} (installed {escape(pkg)} {escape(str(inst.get(pkg)))}; "
                  f"{t.get('total_s')}s, {t.get('round_trips')} round trips)")
    table = Table(show_edge=False, pad_edge=False)
    for col in (pkg, f"declares {lib}", "findings", "drift", "flow", "playbook"):
        table.add_column(col)
    for r in result["rows"]:
        if r.get("error"):
            table.add_row(escape(r["release"]), "-", "-", "-", escape(r.get("flow") or "-"),
                          escape(f"not analysed: {r['error']}"))
            continue
        drift = "n/a" if r.get("drift") is None else str(r["drift"])
        findings = str(r["findings"]) + (f" (+{r['unknown']} unknown)" if r.get("unknown") else "")
        if not r.get("modules"):   # a server-flow release: nothing of it calls into the library
            findings = f"- (no module imports {lib})"
        mark = " *" if r.get("installed") else ""      # explained under the table
        table.add_row(escape(r["release"] + mark), escape(r.get("declared") or "none"), findings, drift,
                      escape(r.get("flow") or "-"), escape(", ".join(r.get("playbooks") or []) or "-"))
    console.print(table)
    if any(r.get("installed") for r in result["rows"]):
        # the row of the installed version counts the release as published, not the host's files,
        # which a patch changed: say so rather than contradict `check`
        console.print(f"[dim]* the installed version. Each row checks the release's sources from PyPI; the "
                      f"host's installed {escape(pkg)} files (patched or not) are what `remote-ops check "
                      f"{escape(result['host'])}` checks[/dim]")
