"""remote-ops extract: preflight, then start the playbook's extraction job under a detached
supervisor on the host (or attach to the one already running), optionally following its log."""

from remote_ops.commands.params import cli_flag, flag
from remote_ops.termsafe import clean, lines, text

NAME = "extract"
HELP = "start the playbook's extraction job on a host (detached, supervised); --tail follows it"
CHANGES_HOSTS = True    # a Ctrl-C says what changed on each host (remote_ops/interrupts.py)
FLAGS = {
    "playbook": "playbook file or name (default: the host's)",
    "tail": cli_flag("follow the log until the job ends (Ctrl-C detaches)", action="store_true"),
    "skip_check": "do not run the call-site check (nor a server flow's checks of the served model) in preflight",
    "strict": "refuse the job when the checked calls drifted from the package's baseline version",
    "dry_run": "preflight only: show what would start",
    "shard": flag("split the samples over the group's hosts (sorted by name: host k of N writes i %% N == k); "
                  "with K/N: run that share on the named host(s), e.g. one moved from a dead host", metavar="K/N",
                  no_help="run the whole dataset on every host even if the playbook says extract.shard: true"),
    "overwrite": "start over in an output directory that holds another run's samples: move its files "
                 "into .replaced-<UTC time>/ there (never deleted) instead of refusing",
    "remeasure_disk": "measure the output disk's write speed again for the launch plan (it is cached per "
                      "filesystem on the host)",
    "early_death_s": flag("watch a new job S seconds for dying at once (default 3; 0: return at launch)",
                          "--watch", metavar="S"),
}


def run(args, ctx) -> int:
    import sys

    from remote_ops.commands.follow import print_follow
    from remote_ops.commands.params import call
    from remote_ops.extract import jobs
    from remote_ops.errors import Exit, UsageError

    if args.tail and len(ctx.hosts(args.host)) > 1:
        # the commands of this situation, complete: the group's launch with the --shard given (a launch
        # without it is another run), following one host's job by its log (never a one-host extract,
        # which is another share), the group's status
        names = ctx.fleet.hosts(args.host)
        shard = [] if args.shard is None else ["--shard"] if args.shard is True else ["--shard=" + str(args.shard)] \
            if args.shard is not False else ["--no-shard"]
        group = args.host or ctx.inventory.default or ""
        import os
        book = [] if not args.playbook else ["--playbook", os.path.abspath(args.playbook)
                                             if os.path.isfile(args.playbook) else args.playbook]
        raise UsageError(f"--tail follows one host; {group!r} names {len(names)}",
                         f"start them with: {ctx.command('extract', group, *shard, *book)}; follow one with: "
                         f"{ctx.command('logs', names[0], '--follow', *book)} (or {', '.join(names[1:])}); "
                         f"watch all with: {ctx.command('status', group, *book)}")
    results = call(ctx.fleet.extract, args,      # --tail shows an early death itself
                   early_death_s=0 if args.tail else args.early_death_s)

    def refused(r):   # the plan and the other problems of a refused preflight; the error's one line says the last
        pf = (r.error.details or {}).get("preflight") or {}
        lead = f"{r.host}: " if not results.single else ""
        if pf.get("plan"):
            sys.stderr.write(f"  {clean(lead + plan_line(pf['plan']))}\n")
        for p in (pf.get("problems") or [])[:-1]:
            sys.stderr.write(f"  refused: {clean(lead + str(p))}\n")

    if not (args.tail and results.ok and not args.dry_run):
        return ctx.show(results, lambda c, name, v: render(c, name, v, ctx), summary=summary, render_failure=refused,
                        exit_for=lambda v: int(Exit.OK) if v.get("dry_run") else jobs.exit_for(v.job))
    # --tail: the job's head line, then its log followed to the end (JSON Lines with --json)
    v = results[0].value
    host, job = ctx.hosts(args.host)[0], v.job
    offset = 0
    if ctx.json:
        import json
        sys.stdout.write(json.dumps({"event": "job", **v.to_json()}, default=str) + "\n")
        sys.stdout.flush()
    else:
        what = "attached to running job" if v.attached else "started job"
        from remote_ops.extract.slurm import handle
        ctx.err.print(text(f"{host.name}: {what} {job['job_id']} ({handle(job)}); "
                           "Ctrl-C detaches, the job keeps running"), highlight=False)
        if job.get("label"):
            ctx.err.print(text(f"  {job['label']}"), highlight=False)
        if v.preflight.get("plan") and not v.attached:
            ctx.err.print(text(f"  {plan_line(v.preflight['plan'])}"), highlight=False)
        for line in overwrite_lines(v.get("identity")) + [f"note: {n}" for n in v.preflight.get("notes") or []
                                                         if n.startswith("--overwrite")]:
            ctx.err.print(text(f"  {line}"), highlight=False)
    if job.get("scheduler") == "slurm":      # a job array: its tasks' logs, each line "[task k] ..."
        from remote_ops.commands.follow import report_end
        from remote_ops.extract.slurm import follow, print_task_text
        try:
            final = follow(ctx.session(host), job["job_id"], lambda k, text: print_task_text(ctx, k, text))
        except KeyboardInterrupt:
            return int(Exit.INTERRUPTED)
        return report_end(ctx, final)
    if v.attached and job.get("log_size", 0) > 8192:
        r = ctx.fleet.logs(args.host, job=job["job_id"], lines=20).raise_for_failures()[0].value
        sys.stdout.write(lines(r.text.replace("\r", "\n")) if not ctx.json else "")
        offset = r.next
    return print_follow(ctx, args.host, job["job_id"], offset=offset,
                        reattach=ctx.command("logs", host.name, "--job", job["job_id"], "--follow"))


def summary(v) -> str:
    if v.get("dry_run"):
        return "preflight passed (dry run)"
    verb = "attached to running" if v.attached else "started"
    from remote_ops.extract.slurm import handle
    return f"{verb} {v.job['job_id']} ({handle(v.job)})"


def render(c, name, v, ctx=None) -> None:
    if v.get("dry_run"):
        import shlex   # copyable as printed: an empty or spaced argument stays one argument
        c.print(text(f"{name}: preflight passed; would run: {shlex.join(v.spec['command'])}"))
        if v.preflight.get("plan"):
            c.print(text(f"  {plan_line(v.preflight['plan'])}"), highlight=False)
        for n in v.preflight.get("notes") or []:
            c.print(text(f"  note: {n}"))
        return
    job = v.job
    verb = "already running, not started again" if v.attached else "started"
    from remote_ops.extract.slurm import handle, logs_text
    c.print(text(f"{name}: job {job['job_id']} {verb} ({handle(job)}, state {job['state']})"))
    if "--shard" in (job.get("command") or [])[-2:]:
        c.print(text(f"  shard {job['command'][-1]} into {job.get('output_dir')}"))
    if job["state"] not in ("starting", "running", "succeeded"):   # died within its first seconds
        c.print(text(f"  {job['job_id']} {job['state']}: {job.get('reason')}", "red"))
        for line in job.get("error_lines") or []:
            c.print(text(f"  {line}"))
    if job.get("label"):
        c.print(text(f"  {job['label']}"))
    if v.preflight.get("plan") and not v.attached:
        c.print(text(f"  {plan_line(v.preflight['plan'])}"), highlight=False)
    for line in overwrite_lines(v.get("identity")):
        c.print(text(f"  {line}"))
    for n in v.preflight.get("notes") or []:
        c.print(text(f"  note: {n}"))
    c.print(text(f"  {logs_text(job)}" if job.get("scheduler") == "slurm" else f"  log: {job.get('log')}"))
    from remote_ops import again
    flags = ctx.again_flags if ctx is not None else ()
    follow = again.command("logs", name, "--job", job["job_id"], "--follow", flags=flags)
    c.print(text(f"  follow: {follow}   |   status / logs / stop {name}"))


def overwrite_lines(identity: dict | None) -> list[str]:
    """What --overwrite did at launch: every directory moved and where to, and those kept (this run's)."""
    ident = identity or {}
    moves = ident.get("moved_all") or ([ident["moved"]] if ident.get("moved") else [])
    out = [f"--overwrite: moved {m['files']} file(s) of the earlier run" +
           (f" out of {m['output_dir']}" if m.get("output_dir") else "") + f" into {m['moved_to']}" for m in moves]
    if moves:
        out += [f"--overwrite: {d} holds this run: nothing to overwrite there, resumed" for d in ident.get("kept") or []]
    return out


def plan_line(p: dict) -> str:
    """The launch plan (extract/plan.py Plan.to_json) in one line."""
    from remote_ops.units import human_bytes
    tok = f"{p['tokens']:,} tokens ({'exact' if p.get('tokens_exact') else 'estimated'})"
    parts = [f"plan: {p['samples']:,} samples, {tok}, {human_bytes(p['bytes'])} to write"]
    free = human_bytes(p.get("free_bytes"))
    if p.get("disk_bytes_per_s"):
        sp = p.get("disk_speed") or {}
        if sp.get("source") == "job":      # a finished job's own writes, slower than the write test
            test = (sp.get("test") or {}).get("bytes_per_s")
            age = (f"job {sp.get('job_id')}'s own writes, {_age(sp.get('age_s'))} ago"
                   + (f"; the write test: {test / 1e9:.2f} GB/s" if test else ""))
        else:
            age = f"cached {_age(sp.get('age_s'))} ago" if sp.get("cached") else "measured now"
        parts.append(f"disk {free} free, writes {p['disk_bytes_per_s'] / 1e9:.2f} GB/s ({age}) -> "
                     f"{_hours(p['disk_hours'])}")
    else:
        parts.append(f"disk {free} free, write speed unknown ({p.get('disk_unknown')})")
    if p.get("compute_hours") is not None:
        g = p["gpus"]
        parts.append(f"compute ~{_hours(p['compute_hours'])} (estimate: {len(g)} x {g[0].get('model')}, "
                     f"{p['active_params'] / 1e9:.2f}B active params, {p['efficiency']:g} of peak as measured on a "
                     f"{p.get('efficiency_model') or '?'})")
    else:
        parts.append(f"compute unknown ({p.get('compute_unknown')})")
    bound = {"disk": "bound: disk", "compute": "bound: compute"}.get(p.get("bound"), "bound: unknown")
    from remote_ops.extract.coldstart import plan_text
    cold = plan_text(p.get("cold_start"))
    return "; ".join(parts) + f"; {bound}" + (f"; {cold}" if cold else "")


def _hours(h: float) -> str:
    return f"{h:.2f} h" if h >= 0.01 else f"{h * 3600:.0f} s"


def _age(s) -> str:
    from remote_ops.units import fmt_duration
    return fmt_duration(s or 0)
