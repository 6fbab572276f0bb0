"""remote-ops status: running / succeeded / failed / stopped / lost, progress, elapsed and rate."""

NAME = "status"
HELP = "state of the extraction job on a host: progress, elapsed time, rate, exit code and reason"


def add_arguments(p):
    p.add_argument("host", nargs="?", metavar="HOST|GROUP", help="host, group or comma list (default: the inventory's default)")
    p.add_argument("--playbook", "-p", metavar="P", help="the playbook whose job to show (default: the host's)")
    p.add_argument("--job", metavar="ID", help="a job id (see --all)")
    p.add_argument("--all", action="store_true", help="list every job recorded on the host")


def run(args, ctx) -> int:
    from remote_ops import jobs

    hosts = ctx.hosts(args.host)
    if len(hosts) > 1:
        return _fleet(args, ctx, hosts)
    host = hosts[0]
    session = ctx.session(host)
    if args.all:
        recs = session.call("jobs.list", {})["jobs"]
        ctx.emit({"host": host.name, "jobs": recs},
                 lambda c: [c.print(jobs.summary_line(r), markup=False, highlight=False) for r in recs]
                 or c.print(f"{host.name}: no jobs", markup=False))
        return 0
    st = jobs.resolve_job(session, jobs.job_ref(ctx, host, args))
    ctx.emit({"host": host.name, "job": st}, lambda c: render(c, host.name, st))
    return jobs.exit_for(st)


def render(c, host, st) -> None:
    from rich.text import Text

    from remote_ops import jobs
    color = {"running": "cyan", "starting": "cyan", "succeeded": "green"}.get(st["state"], "red")
    c.print(Text(f"{host}: " + jobs.summary_line(st), style=color))
    if st.get("label"):
        c.print(Text(f"  {st['label']}", style="yellow"))
    if st.get("pid"):
        c.print(f"  pid {st['pid']} (process group {st.get('pgid')}), supervisor "
                f"{'alive' if st.get('supervisor_alive') else 'gone'}", markup=False)
    if st.get("exit_code") is not None or st.get("signal_name"):
        c.print(f"  exit: {st.get('exit_code') if st.get('exit_code') is not None else st.get('signal_name')}",
                markup=False)
    for line in st.get("error_lines") or []:
        c.print(f"  | {line}", markup=False, highlight=False)
    for w in st.get("warnings") or []:
        c.print(Text(f"  warning: {w}", style="yellow"))
    c.print(f"  output: {st.get('output_dir')}   log: {st.get('log')}", markup=False, highlight=False)


def _fleet(args, ctx, hosts) -> int:
    from remote_ops import jobs

    def fn(host, session):
        if args.all:
            return {"host": host.name, "jobs": session.call("jobs.list", {})["jobs"]}
        return {"host": host.name, "job": jobs.resolve_job(session, jobs.job_ref(ctx, host, args))}

    def render_one(c, name, v):
        if "jobs" in v:
            for r in v["jobs"]:
                c.print(f"{name}: " + jobs.summary_line(r), markup=False, highlight=False)
        else:
            render(c, name, v["job"])

    return ctx.fleet(hosts, fn, render_one,
                     summary=lambda v: jobs.summary_line(v["job"]) if "job" in v else f"{len(v['jobs'])} job(s)",
                     exit_for=lambda v: jobs.exit_for(v["job"]) if "job" in v else 0)
