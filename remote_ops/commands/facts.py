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
    from rich.table import Table
    from rich.text import Text

    from remote_ops.units import human_bytes

    console.print(Text(f"{f.host} ({f.hostname})", style="bold"))
    how = f.raw.get("python", {}).get("found_by")
    note = f"  [dim](python3 from the login shell's PATH)[/dim]" if how == "login shell PATH" else ""
    console.print(f"  python   {f.python_version}  {f.python_executable}{note}")
    for name, p in f.packages.items():
        if p.present:
            console.print(f"  {name:<12} {p.version:<12} {p.location or ''}")
        else:
            console.print(f"  {name:<12} [dim]absent[/dim]")
    d = f.disk
    if "free_bytes" in d:
        console.print(f"  disk     {human_bytes(d['free_bytes'])} free of {human_bytes(d['total_bytes'])} at {d['path']}")
    running = f.jobs or []
    if not running:
        console.print("  jobs     [dim]none running[/dim]")
    for j in running:
        s = j.get("samples") or {}
        of = f"/{s['expected']}" if s.get("expected") else ""
        console.print(f"  job      {j['job_id']} {j['state']} ({s.get('done', 0)}{of} samples)", markup=False)
    g = f.gpu or {}
    if not g.get("present"):
        console.print(f"  gpus     [dim]none ({g.get('error') or 'nvidia-smi not found'})[/dim]")
        return
    t = Table(box=None, padding=(0, 1), show_edge=False)
    for col in ("gpu", "name", "memory", "util", "temp"):
        t.add_column(col)
    for gpu in g.get("gpus", []):
        mem = f"{gpu.get('memory_used_mib', '?')}/{gpu.get('memory_total_mib', '?')} MiB"
        util = "?" if gpu.get("utilization_pct") is None else f"{gpu['utilization_pct']}%"
        temp = "?" if gpu.get("temperature_c") is None else f"{gpu['temperature_c']}C"
        t.add_row(str(gpu.get("index")), str(gpu.get("name")), mem, util, temp)
    console.print(t)
    procs = g.get("processes") or []
    for pr in procs:
        console.print(f"  gpu process pid {pr.get('pid')} {pr.get('name')} {pr.get('used_memory_mib')} MiB on gpu {pr.get('gpu_index')}")
