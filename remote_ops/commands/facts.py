"""remote-ops facts: interpreter, packages, GPUs, disk of one host or a group."""

NAME = "facts"
HELP = "show the remote Python, vllm/speculators/torch/transformers versions, GPUs and disk"
FLAGS: dict = {}            # Inventory.facts's parameters are its flags (commands/params.py)
API_ONLY = ("packages",)   # the packages to report: a script's choice, no flag


def run(args, ctx) -> int:
    from remote_ops.commands.params import call
    return ctx.show(call(ctx.fleet.facts, args), lambda c, name, f: render(c, f), summary=summary)


def summary(f) -> str:
    vers = ", ".join(f"{k} {p.version}" for k, p in f.packages.items() if p.present)
    return f"python {f.python_version}; {vers}; {len((f.gpu or {}).get('gpus') or [])} GPU(s)"


def render(console, f) -> None:
    """A host's facts for people. Versions, paths, GPU names and GPU process names (any user of the
    host names a process) come from the host: cleaned and never read as markup (``termsafe``)."""
    from rich.table import Table
    from rich.text import Text

    from remote_ops.termsafe import text
    from remote_ops.units import human_bytes

    def line(*parts) -> Text:
        """Host text parts, with ``(part, style)`` pairs for a dim note of our own."""
        return Text.assemble(*((text(p[0], p[1]) if isinstance(p, tuple) else text(p)) for p in parts))

    console.print(text(f"{f.host} ({f.hostname})", "bold"))
    how = f.raw.get("python", {}).get("found_by")
    note = ("  (python3 from the login shell's PATH)", "dim") if how == "login shell PATH" else ""
    console.print(line(f"  python   {f.python_version}  {f.python_executable}", note))
    for name, p in f.packages.items():
        if p.present:
            console.print(line(f"  {name:<12} {p.version:<12} {p.location or ''}"))
        else:
            console.print(line(f"  {name:<12} ", ("absent", "dim")))
    d = f.disk
    if "free_bytes" in d:
        console.print(line(f"  disk     {human_bytes(d['free_bytes'])} free of {human_bytes(d['total_bytes'])} "
                           f"at {d['path']}"))
    running = f.jobs or []
    if not running:
        console.print(line("  jobs     ", ("none running", "dim")))
    for j in running:
        s = j.get("samples") or {}
        of = f"/{s['expected']}" if s.get("expected") else ""
        console.print(line(f"  job      {j['job_id']} {j['state']} ({s.get('done', 0)}{of} samples)"))
    g = f.gpu or {}
    if not g.get("present"):
        console.print(line("  gpus     ", (f"none ({g.get('error') or 'nvidia-smi not found'})", "dim")))
        return
    t = Table(box=None, padding=(0, 1), show_edge=False)
    for col in ("gpu", "name", "memory", "util", "temp"):
        t.add_column(col)
    for gpu in g.get("gpus", []):
        mem = f"{gpu.get('memory_used_mib', '?')}/{gpu.get('memory_total_mib', '?')} MiB"
        util = "?" if gpu.get("utilization_pct") is None else f"{gpu['utilization_pct']}%"
        temp = "?" if gpu.get("temperature_c") is None else f"{gpu['temperature_c']}C"
        t.add_row(*(text(x) for x in (gpu.get("index"), gpu.get("name"), mem, util, temp)))
    console.print(t)
    procs = g.get("processes") or []
    for pr in procs:
        console.print(line(f"  gpu process pid {pr.get('pid')} {pr.get('name')} {pr.get('used_memory_mib')} MiB "
                           f"on gpu {pr.get('gpu_index')}"))
