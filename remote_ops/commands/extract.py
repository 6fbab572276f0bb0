"""remote-ops extract: preflight, then start the playbook's extraction job under a detached
supervisor on the host (or attach to the one already running), optionally following its log."""

NAME = "extract"
HELP = "start the playbook's extraction job on a host (detached, supervised); --tail follows it"


def add_arguments(p):
    p.add_argument("host", nargs="?", metavar="HOST|GROUP", help="host, group or comma list (default: the inventory's default)")
    p.add_argument("--playbook", "-p", metavar="P", help="playbook file or name (default: the host's)")
    p.add_argument("--tail", action="store_true", help="follow the log until the job ends (Ctrl-C detaches)")
    p.add_argument("--skip-check", action="store_true", help="do not run the call-site check in preflight")
    p.add_argument("--strict", action="store_true",
                   help="refuse the job when the checked calls drifted from the package's baseline version")
    p.add_argument("--dry-run", action="store_true", help="preflight only: show what would start")


def run(args, ctx) -> int:
    import sys

    from remote_ops import jobs
    from remote_ops.errors import Exit
    from remote_ops.tail import follow_job

    hosts = ctx.hosts(args.host)
    if len(hosts) > 1:
        return _fleet(args, ctx, hosts)
    host = hosts[0]
    pb, spec = jobs.load_for_host(host, args.playbook)
    jobs.resolve_secrets(spec)          # a missing secret is refused before touching the host
    session = ctx.session(host)
    pf = jobs.preflight(session, spec, pb, skip_check=args.skip_check, dry_run=args.dry_run,
                       strict_drift=args.strict)
    attached = False
    if pf.running:
        job, attached = pf.running, True
    elif pf.problems:
        err = jobs.refusal(spec, pf, host.name)
        if ctx.json:   # one JSON document: the refusal and every problem
            ctx.emit({"host": host.name, "started": False, "error": err.to_json(),
                      "preflight": pf.to_json()})
            sys.stderr.write(f"remote-ops: {err.one_line()}\n")
            return int(err.exit_status)
        for p in pf.problems:
            sys.stderr.write(f"  refused: {p}\n")
        raise err
    elif args.dry_run:
        ctx.emit({"host": host.name, "started": False, "dry_run": True, "spec": spec.to_json(),
                  "preflight": pf.to_json()},
                 lambda c: [c.print(f"{host.name}: preflight passed; would run: {' '.join(spec.command)}",
                                    markup=False)] + [c.print(f"  note: {n}", markup=False) for n in pf.notes])
        return int(Exit.OK)
    else:
        res = jobs.launch(session, spec)
        job, attached = res["job"], res["attached"]

    head = {"host": host.name, "attached": attached, "job": job, "preflight": pf.to_json()}
    if not args.tail:
        def human(c):
            verb = "already running, not started again" if attached else "started"
            c.print(f"{host.name}: job {job['job_id']} {verb} (pid {job.get('pid')}, state {job['state']})",
                    markup=False)
            if job.get("label"):
                c.print(f"  {job['label']}", markup=False)
            for n in pf.notes:
                c.print(f"  note: {n}", markup=False)
            c.print(f"  log: {job.get('log')}", markup=False)
            c.print(f"  follow: remote-ops extract {host.name} --tail   |   status / logs / stop "
                    f"{host.name}", markup=False)
        ctx.emit(head, human)
        return jobs.exit_for(job)

    offset = 0
    if ctx.json:
        import json
        sys.stdout.write(json.dumps({"event": "job", **head}, default=str) + "\n")
        sys.stdout.flush()
    else:
        what = "attached to running job" if attached else "started job"
        ctx.err.print(f"{host.name}: {what} {job['job_id']} (pid {job.get('pid')}); "
                      "Ctrl-C detaches, the job keeps running", markup=False, highlight=False)
        if job.get("label"):
            ctx.err.print(f"  {job['label']}", markup=False, highlight=False)
    if attached and job.get("log_size", 0) > 8192:
        r = session.call("jobs.logs", {"job_id": job["job_id"], "lines": 20})
        sys.stdout.write(r["text"].replace("\r", "\n") if not ctx.json else "")
        offset = r["next"]
    final = follow_job(ctx, host, job, offset=offset)
    if final is None:
        return int(Exit.INTERRUPTED)
    return report_end(ctx, final)


def report_end(ctx, st) -> int:
    import sys

    from remote_ops import jobs
    if ctx.json:
        import json
        sys.stdout.write(json.dumps({"event": "end", "status": st}, default=str) + "\n")
        sys.stdout.flush()
    else:
        from rich.text import Text
        style = "green" if st["state"] == "succeeded" else "red"
        ctx.console.print(Text(jobs.summary_line(st), style=style), highlight=False)
        if st["state"] != "succeeded":
            for line in st.get("error_lines") or []:
                ctx.console.print(f"  {line}", markup=False, highlight=False)
    return jobs.exit_for(st)


def _fleet(args, ctx, hosts) -> int:
    """extract on several hosts at once: preflight and launch (or attach) in parallel, a per-host
    table; following several logs at once is left to `status GROUP` / one `extract HOST --tail`."""
    from remote_ops import jobs
    from remote_ops.errors import UsageError

    if args.tail:
        raise UsageError(f"--tail follows one host; {args.host!r} names {len(hosts)}",
                         "start them with: remote-ops extract GROUP; follow one with: remote-ops extract HOST "
                         "--tail; watch all with: remote-ops status GROUP")
    specs = {h.name: jobs.load_for_host(h, args.playbook) for h in hosts}   # bad playbooks fail first, locally
    for h in hosts:
        jobs.resolve_secrets(specs[h.name][1])

    def fn(host, session):
        pb, spec = specs[host.name]
        pf = jobs.preflight(session, spec, pb, skip_check=args.skip_check, dry_run=args.dry_run,
                           strict_drift=args.strict)
        if pf.running:
            return {"host": host.name, "attached": True, "job": pf.running, "preflight": pf.to_json()}
        if pf.problems:
            raise jobs.refusal(spec, pf, host.name, all_problems=True)
        if args.dry_run:
            return {"host": host.name, "started": False, "dry_run": True, "spec": spec.to_json(),
                    "preflight": pf.to_json()}
        res = jobs.launch(session, spec)
        return {"host": host.name, "attached": res["attached"], "job": res["job"], "preflight": pf.to_json()}

    def summary(v) -> str:
        if v.get("dry_run"):
            return "preflight passed (dry run)"
        verb = "attached to running" if v["attached"] else "started"
        return f"{verb} {v['job']['job_id']} (pid {v['job'].get('pid')})"

    return ctx.fleet(hosts, fn, lambda c, name, v: None, summary=summary,
                     exit_for=lambda v: 0 if v.get("dry_run") else jobs.exit_for(v["job"]))
