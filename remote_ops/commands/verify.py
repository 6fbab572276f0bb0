"""remote-ops verify: check the job's outputs on the host with the host's own torch."""

NAME = "verify"
HELP = "check data_<N>.pt outputs on the host: count, gaps, unloadable files, layout, NaN/inf"


def add_arguments(p):
    p.add_argument("host", nargs="?", metavar="HOST|GROUP", help="host, group or comma list (default: the inventory's default)")
    p.add_argument("--all", action="store_true", help="load every file (default: a sample)")
    p.add_argument("--sample", type=int, default=32, metavar="N", help="files to load when not --all (default 32)")
    p.add_argument("--playbook", "-p", metavar="P", help="playbook (default: the host's)")
    p.add_argument("--job", metavar="ID", help="verify the outputs of this job")
    p.add_argument("--output-dir", metavar="DIR", help="verify this directory on the host instead")
    p.add_argument("--expected", type=int, metavar="N", help="expected number of samples")


def run(args, ctx) -> int:
    from remote_ops.errors import Exit, UsageError

    if args.sample < 1:
        raise UsageError("--sample must be at least 1")
    hosts = ctx.hosts(args.host)
    exit_for = lambda v: int(Exit.OK) if v["ok"] else int(Exit.FINDINGS)  # noqa: E731
    if len(hosts) > 1:
        return ctx.fleet(hosts, lambda h, s: _verify(args, ctx, h, s, progress=False), render,
                         summary=_summary, exit_for=exit_for)
    host = hosts[0]
    res = _verify(args, ctx, host, ctx.session(host), progress=not ctx.json)
    ctx.emit(res, lambda c: render(c, host.name, res))
    return exit_for(res)


def _summary(v) -> str:
    return f"{v.get('files')}/{v.get('expected') or '?'} files, " + ("ok" if v["ok"] else "PROBLEMS")


def _verify(args, ctx, host, session, *, progress: bool) -> dict:
    import sys

    from remote_ops import jobs
    from remote_ops.errors import AgentError, RefusedError, UsageError

    out_dir, expected = args.output_dir, args.expected
    if not out_dir:
        try:
            st = jobs.resolve_job(session, jobs.job_ref(ctx, host, args))
            out_dir = st.get("output_dir")
            expected = expected or (st.get("samples") or {}).get("expected")
        except RefusedError:
            pb, spec = jobs.load_for_host(host, args.playbook)
            out_dir, expected = spec.output_dir, expected or spec.expected_samples
    if not out_dir:
        raise UsageError("no output directory known", "pass --output-dir or set extract.output_dir")
    res = None
    try:
        for msg in session.stream("verify.verify", {"output_dir": out_dir, "expected": expected,
                                                    "all": args.all, "sample": args.sample}, timeout=600):
            if "event" in msg and progress:
                ev = msg["event"]
                sys.stderr.write(f"\r  loaded {ev.get('checked')}/{ev.get('of')} files")
                sys.stderr.flush()
            elif "result" in msg:
                res = msg["result"]
    except AgentError as exc:
        if exc.kind in ("no-torch", "no-output"):
            raise RefusedError(exc.message, exc.hint, host=host.name) from None
        raise
    if res is None:
        raise AgentError("verify ended without an answer", "rerun it", host=host.name)
    return {"host": host.name, **res}


def render(c, host, r) -> None:
    from rich.text import Text
    exp = f" of {r['expected']} expected" if r.get("expected") else ""
    head = f"{host}: {r['files']} data_<N>.pt files{exp} in {r['output_dir']}; loaded {r['checked']} ({r['mode']})"
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
