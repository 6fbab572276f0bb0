"""remote-ops verify: check the job's outputs on the host with the host's own torch."""

from remote_ops.termsafe import text

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
    "adopt": ("an output written before run identities (no run.json): check every file (implies --all) and, "
              "when each one's token ids equal its dataset line, write the playbook job's run.json"),
    "logits": ("also rebuild the last captured layer's next-token logits of N sampled files (the checkpoint's "
               "final norm and lm_head only) and compare them with the engine's prompt logprobs: top-1 "
               "agreement and mean |delta logprob|, each with a threshold"),
    "logits_port": ("the port of a vLLM server on the host serving the checkpoint, for --logits (default: "
                    "the job's own server while it runs)"),
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
    from remote_ops.extract.shard import union_lines
    lines = union_lines(u)
    c.print(text(lines[0], "green" if u.ok else "red"))
    for line in lines[1:]:
        c.print(text(line), highlight=False)


def _summary(v) -> str:
    return f"{v.files}/{v.expected or '?'} files, " + ("ok" if v.ok else "PROBLEMS")


def render(c, host, r) -> None:
    """One host's verify record for people. File names, paths and problems come from the host: each
    line goes out as ``termsafe.text``, escaped, never markup."""
    exp = f" of {r['expected']} expected" if r.get("expected") else ""
    from remote_ops.agent.outputs import layout
    kind = r.get("layout") or layout.DEFAULT          # the flow's file names (agent/outputs/layout.py)
    files = "%s_<N>.%s" % layout.LAYOUTS[kind]
    where = " + ".join(map(str, r.get("output_dirs") or [r["output_dir"]]))   # an output spread over several disks
    head = f"{host}: {r['files']} {files} files{exp} in {where}; loaded {r['checked']} ({r['mode']})"
    from remote_ops.extract.verify import running_note
    if running_note(r.get("running")):         # the job still writes: its missing samples are not lost yet
        c.print(text(f"{host}: {running_note(r.get('running'))}", "yellow"), highlight=False)
    if r.get("shard_dirs"):      # only shard subdirectories: each is a part of the union below
        c.print(text(f"{host}: {r['files']} {files} files in {len(r['shard_dirs'])} shard dir(s) of "
                     f"{r['output_dir']}: {', '.join(map(str, r['shard_dirs']))}", "green" if r["ok"] else "red"))
        return
    c.print(text(head, "green" if r["ok"] else "red"))
    if r["gap_count"]:
        c.print(text(f"  gaps: {r['gap_count']} missing index(es) below {r['max_index']}: "
                     f"{', '.join(map(str, r['gaps'][:20]))}"))
    if r["missing_after_last"]:
        c.print(text(f"  missing: {r['missing_after_last']} sample(s) after index {r['max_index']}"))
    for u in r["unloadable"]:
        c.print(text(f"  does not load: {u['file']}: {u['error']}"), highlight=False)
    if r["unloadable"]:
        cut = any(u.get("whole") is False for u in r["unloadable"])
        c.print(text("  fix: " + ("extract on this host again: its resume writes a file cut short anew; "
                                  if cut else "") + "a whole file that does not load: move it away, then extract "
                     "again (the resume writes every missing sample)"), highlight=False)
    for i in r["inconsistent"]:
        c.print(text(f"  inconsistent: {layout.name(i['index'], kind)} {i['problem']}"), highlight=False)
    for n in r["non_finite"]:
        c.print(text(f"  NaN/inf: {layout.name(n['index'], kind)} {n['problem']}"), highlight=False)
    for p in r.get("config_problems") or []:
        c.print(text(f"  data_config.json: {p}"), highlight=False)
    for p in r.get("name_problems") or []:      # odd names and links (agent/outputs/layout.py's rule)
        c.print(text(f"  names: {p}"), highlight=False)
    ident = r.get("identity") or {}
    for p in ident.get("problems") or []:
        c.print(text(f"  run identity: {p}"), highlight=False)
    if ident.get("adopted"):
        c.print(text(f"  run identity adopted: run.json {str(ident.get('digest'))[:12]} written after the token ids of "
                     f"all {ident.get('ids_compared')} file(s) matched their dataset lines"), highlight=False)
    elif ident.get("adopt_refused"):
        c.print(text(f"  --adopt: {ident['adopt_refused']}"), highlight=False)
    if ident.get("recorded"):
        c.print(text(f"  run identity {str(ident.get('digest'))[:12]} (run.json): token ids of "
                     f"{ident.get('ids_compared')} file(s) compared with their "
                     f"{'prepared data rows' if ((ident.get('identity') or {}).get('dataset') or {}).get('format') == 'arrow' else 'dataset lines'}, "
                     f"{ident.get('ids_differ')} differ"), highlight=False)
    if r.get("temporaries"):
        c.print(text(f"  note: {len(r['temporaries'])} unfinished temporary file(s) such as {r['temporaries'][0]} "
                     "(a run stopped while writing; the next run removes them)"), highlight=False)
    if not r.get("data_config") and kind == layout.DEFAULT:     # the server flow writes none
        c.print(text("  note: no data_config.json"))
    elif r.get("layers_hidden"):
        cfg = r.get("config") or {}
        shapes = ", ".join(f"{lay} layers x {hid}" for lay, hid in r["layers_hidden"])
        c.print(text(f"  layout: {shapes}" + (f" (data_config.json: {cfg.get('layers')} layers x {cfg.get('hidden')})"
                                               if kind == layout.DEFAULT else "")))
    if r.get("logits"):        # verify --logits (extract/logits.py)
        from remote_ops.extract.logits import LogitsResult, lines
        lr = LogitsResult.from_json(r["logits"])
        for i, line in enumerate(lines(lr)):
            c.print(text("  " + line, ("green" if lr.ok else "red") if i == 0 else None), highlight=False)
    if r["ok"]:
        c.print(text("  outputs look complete and consistent", "green"))
