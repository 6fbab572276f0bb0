"""remote-ops inspect: the parameters of library callables as installed on the host."""

from remote_ops.commands.params import flag

NAME = "inspect"
HELP = "print the parameters of module:qualname callables on the host (static, or --runtime)"
FLAGS = {
    "symbols": "module:qualname, e.g. vllm.v1.request:Request or vllm.v1.core.sched.scheduler:Scheduler.add_request",
    "runtime": "import the module on the host and use inspect.signature (default: parse the sources)",
    "baseline": flag("also show each symbol in this library version (fetched from PyPI, sources only) or "
                     "source directory, and what changed since (parameters, defaults, return annotation)",
                     metavar="VERSION|PATH"),
}


def run(args, ctx) -> int:
    from remote_ops.commands.params import call
    from remote_ops.errors import Exit

    results = call(ctx.fleet.inspect, args)
    return ctx.show(results, lambda c, name, v: render(c, v), summary=lambda v: f"{len(v.symbols)} symbol(s)",
                    exit_for=lambda v: int(Exit.FINDINGS) if v.unresolved else int(Exit.OK))


def render(console, result) -> None:
    from remote_ops.termsafe import markup as escape   # cleaned, then [ escaped: the host's text
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
