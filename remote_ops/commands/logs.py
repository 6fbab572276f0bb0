"""remote-ops logs: the job's log (readable after the job ended), optionally followed."""

from remote_ops.commands.params import cli_flag, flag

NAME = "logs"
HELP = "print the last lines of the extraction job's log; --follow keeps printing until it ends"
FLAGS = {
    "lines": flag("lines to show (default %(default)s)", "-n", "--lines"),
    "follow": cli_flag("keep following until the job ends", "--follow", "-f", action="store_true"),
    "playbook": "the playbook whose job to show (default: the host's)",
    "job": "a job id (see status --all)",
}


def collapse(text: str) -> str:
    """A log as a person reads it: of each tqdm \\r-rewritten line only its last state, with every
    control character but tab and newline escaped (remote_ops/termsafe.py): the host wrote it."""
    from remote_ops.termsafe import lines
    out = []
    for line in text.split("\n"):
        parts = [p for p in line.split("\r") if p.strip()]
        out.append(parts[-1] if parts else "")
    return lines("\n".join(out))


def run(args, ctx) -> int:
    from remote_ops.commands.follow import print_follow
    from remote_ops.extract import jobs
    from remote_ops.errors import Exit, UsageError

    if args.follow:
        hosts = ctx.hosts(args.host)
        if len(hosts) > 1:
            raise UsageError(f"--follow follows one host; {args.host!r} names {len(hosts)}",
                             f"follow one with: {ctx.command('logs', hosts[0].name, '--follow')} "
                             f"(or {', '.join(h.name for h in hosts[1:])})")
    from remote_ops.commands.params import call
    results = call(ctx.fleet.logs, args)
    if not (args.follow and results.ok):
        def render_one(c, name, v):
            if results.single:
                c.out(collapse(v.text), highlight=False, end="")
            else:
                from remote_ops.termsafe import text
                c.rule(text(f"{name}: {v.job_id} ({v.state})"))
                c.out(collapse(v.text), highlight=False)
        return ctx.show(results, render_one, summary=lambda v: f"{v.job_id} ({v.state})")
    # --follow: the log so far, then the live tail (JSON Lines with --json) until the job ends
    r = results[0].value
    from remote_ops.extract.slurm import is_slurm
    slurm = is_slurm(ctx.hosts(args.host)[0])
    if slurm and r.state in jobs.TERMINAL:
        # an ended job array: its logs as they are, then the end line and exit status a local job's
        # follow ends with (the array's summary, each failed task's state and exit code)
        from remote_ops.commands.follow import report_end
        from remote_ops.extract.slurm import final_status
        _print_logs(ctx, r)
        return report_end(ctx, final_status(ctx.session(ctx.hosts(args.host)[0]), r.job_id))
    if slurm:                                     # a job array: every task's log
        from remote_ops.commands.follow import report_end
        from remote_ops.extract.slurm import follow, print_task_text
        try:
            final = follow(ctx.session(ctx.hosts(args.host)[0]), r.job_id, lambda k, t: print_task_text(ctx, k, t))
        except KeyboardInterrupt:
            return int(Exit.INTERRUPTED)
        return report_end(ctx, final)
    # the same way whether the job still runs or ended meanwhile: the lines so far, then the follow
    # from where they end, which yields the rest its supervisor still writes (its "ended:" line)
    # and the end (summary line, exit status as status says)
    _print_logs(ctx, r)
    return print_follow(ctx, args.host, r.job_id, offset=r.next)


def _print_logs(ctx, r) -> None:
    """A followed job's log so far: as text, or with --json the event ``{"event": "logs", ...}``."""
    import sys
    if ctx.json:
        import json
        from remote_ops.records import to_json
        sys.stdout.write(json.dumps({"event": "logs", **to_json(r)}, default=str) + "\n")
    else:
        sys.stdout.write(collapse(r.text))
    sys.stdout.flush()
