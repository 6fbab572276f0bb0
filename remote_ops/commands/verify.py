"""remote-ops verify: check the job's outputs on the host with the host's own torch."""

NAME = "verify"
HELP = "check data_<N>.pt outputs on the host: count, gaps, unloadable files, layout, NaN/inf"
FLAGS = {
    "all": "load every file (default: a sample)",
    "sample": "files to load when not --all (default %(default)s)",
    "playbook": "playbook (default: the host's)",
    "job": "verify the outputs of this job",
    "output_dir": "verify this directory on the host instead",
    "expected": ("expected number of samples (default: data_config.json's num_samples, else the "
                 "job's expected_samples)"),
    "shard": ("check the hosts' outputs as shards of one dataset (automatic for a group whose "
              "data_config.json records a shard): complete, no duplicates, same layout everywhere"),
}


def run(args, ctx) -> int:
    import sys

    from remote_ops.commands.params import call
    from remote_ops.errors import Exit

    def progress(host, done, of):
        sys.stderr.write(f"\r  loaded {done}/{of} files")
        sys.stderr.flush()

    # redrawn in place only on a terminal: in a log each redraw would pile up on one line
    redraw = not ctx.json and sys.stderr.isatty() and ctx.fleet.names_one_host(args.host)
    results = call(ctx.fleet.verify, args, on_progress=progress if redraw else None)
    return ctx.show(results, render, summary=_summary,
                    exit_for=lambda v: int(Exit.OK) if v.ok else int(Exit.FINDINGS),
                    render_group=render_union, group_exit=lambda u: int(Exit.OK) if u.ok else int(Exit.FINDINGS))


def render_union(c, u) -> None:
    from rich.text import Text

    from remote_ops.extract.shard import union_lines
    lines = union_lines(u)
    c.print(Text(lines[0], style="green" if u.ok else "red"))
    for line in lines[1:]:
        c.print(line, markup=False, highlight=False)


def _summary(v) -> str:
    return f"{v.files}/{v.expected or '?'} files, " + ("ok" if v.ok else "PROBLEMS")


def render(c, host, r) -> None:
    from rich.text import Text
    exp = f" of {r['expected']} expected" if r.get("expected") else ""
    where = " + ".join(r.get("output_dirs") or [r["output_dir"]])      # an output spread over several disks
    head = f"{host}: {r['files']} data_<N>.pt files{exp} in {where}; loaded {r['checked']} ({r['mode']})"
    if r.get("shard_dirs"):      # only shard subdirectories: each is a part of the union below
        c.print(Text(f"{host}: {r['files']} data_<N>.pt files in {len(r['shard_dirs'])} shard dir(s) of "
                     f"{r['output_dir']}: {', '.join(r['shard_dirs'])}", style="green" if r["ok"] else "red"))
        return
    c.print(Text(head, style="green" if r["ok"] else "red"))
    if r["gap_count"]:
        c.print(f"  gaps: {r['gap_count']} missing index(es) below {r['max_index']}: "
                f"{', '.join(map(str, r['gaps'][:20]))}", markup=False)
    if r["missing_after_last"]:
        c.print(f"  missing: {r['missing_after_last']} sample(s) after index {r['max_index']}", markup=False)
    for u in r["unloadable"]:
        c.print(f"  does not load: {u['file']}: {u['error']}", markup=False, highlight=False)
    for i in r["inconsistent"]:
        c.print(f"  inconsistent: data_{i['index']}.pt {i['problem']}", markup=False, highlight=False)
    for n in r["non_finite"]:
        c.print(f"  NaN/inf: data_{n['index']}.pt {n['problem']}", markup=False, highlight=False)
    for p in r.get("config_problems") or []:
        c.print(f"  data_config.json: {p}", markup=False, highlight=False)
    ident = r.get("identity") or {}
    for p in ident.get("problems") or []:
        c.print(f"  run identity: {p}", markup=False, highlight=False)
    if ident.get("recorded"):
        c.print(f"  run identity {str(ident.get('digest'))[:12]} (run.json): token ids of {ident.get('ids_compared')} "
                f"file(s) compared with their dataset lines, {ident.get('ids_differ')} differ", markup=False,
                highlight=False)
    if r.get("temporaries"):
        c.print(f"  note: {len(r['temporaries'])} unfinished temporary file(s) such as {r['temporaries'][0]} "
                "(a run stopped while writing; the next run removes them)", markup=False, highlight=False)
    if not r.get("data_config"):
        c.print("  note: no data_config.json", markup=False)
    elif r.get("layers_hidden"):
        cfg = r.get("config") or {}
        shapes = ", ".join(f"{lay} layers x {hid}" for lay, hid in r["layers_hidden"])
        c.print(f"  layout: {shapes} (data_config.json: {cfg.get('layers')} layers x {cfg.get('hidden')})",
                markup=False)
    if r["ok"]:
        c.print(Text("  outputs look complete and consistent", style="green"))
