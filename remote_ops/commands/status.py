"""remote-ops status: running / succeeded / failed / stopped / lost, progress, elapsed and rate."""

from remote_ops.commands.params import cli_flag
from remote_ops.termsafe import text

NAME = "status"
HELP = "state of the extraction job on a host: progress, elapsed time, rate, exit code and reason"
FLAGS = {
    "playbook": "the playbook whose job to show (default: the host's)",
    "job": "a job id (see --all)",
    "all": cli_flag("list every job recorded on the host", action="store_true"),
}


def run(args, ctx) -> int:
    from remote_ops.commands.params import call
    from remote_ops.extract import jobs

    if args.all:
        def render_all(c, name, v):
            for r in v.jobs:
                c.print(text(f"{name}: " + jobs.summary_line(r)), highlight=False)
            if not v.jobs:
                c.print(text(f"{name}: no jobs"))
        return ctx.show(call(ctx.fleet.jobs, args), render_all, summary=lambda v: f"{len(v.jobs)} job(s)")
    return ctx.show(call(ctx.fleet.status, args),
                    lambda c, name, v: render(c, name, v.job), summary=lambda v: jobs.summary_line(v.job),
                    exit_for=lambda v: jobs.exit_for(v.job), render_group=render_group)


def render_group(c, g) -> None:
    from remote_ops.extract.shard import progress_line
    c.print(text(progress_line(g)), highlight=False)


def render(c, host, st) -> None:
    """A job's status record for people. Every line is built from the host's record (its label, last
    stderr lines, warnings, paths): each goes out as ``termsafe.text``, escaped, never markup."""
    from remote_ops.extract import jobs
    color = {"running": "cyan", "starting": "cyan", "succeeded": "green"}.get(st["state"], "red")
    c.print(text(f"{host}: " + jobs.summary_line(st), color))
    if st.get("label"):
        c.print(text(f"  {st['label']}", "yellow"))
    from remote_ops.extract.tail import bound_text, disk_observed_text
    for line in (bound_text(st), disk_observed_text(st)):
        if line:
            c.print(text(f"  {line}"), highlight=False)
    for t in st.get("tasks") or []:      # a Slurm job array (extract/slurm.py)
        c.print(text(f"  task {t['task']}: {t['state']}" + (f" ({t['reason']})" if t.get("reason") else "") +
                     f", {t['samples']}" + (f"/{t['expected']}" if t.get("expected") is not None else "") + " samples"
                     + (f", exit {t['exit_code']}" if t.get("exit_code") is not None else "")))
    if st.get("slurm_id"):
        c.print(text(f"  Slurm job {st['slurm_id']}"))
    if st.get("accounting"):             # why sacct could not tell how the tasks that left the queue ended
        c.print(text(f"  {st['accounting']}"), highlight=False)
    if st.get("pid"):
        c.print(text(f"  pid {st['pid']} (process group {st.get('pgid')}), supervisor "
                     f"{'alive' if st.get('supervisor_alive') else 'gone'}"))
    if jobs.server_line(st):
        c.print(text(f"  {jobs.server_line(st)}"), highlight=False)
    from remote_ops.extract.coldstart import cold_start_text
    if cold_start_text(st.get("cold_start")):
        c.print(text(f"  {cold_start_text(st.get('cold_start'))}"), highlight=False)
    if st.get("exit_code") is not None or st.get("signal_name"):
        c.print(text(f"  exit: {st.get('exit_code') if st.get('exit_code') is not None else st.get('signal_name')}"))
    for line in st.get("error_lines") or []:
        c.print(text(f"  | {line}"), highlight=False)
    for w in st.get("warnings") or []:
        c.print(text(f"  warning: {w}", "yellow"))
    where = " + ".join(map(str, st.get("output_dirs") or [st.get("output_dir")]))   # several disks: every directory
    if st.get("scheduler") == "slurm":      # an array: each task its shard-K-of-N and its own log
        from remote_ops.extract.slurm import logs_text
        n = len(st.get("tasks") or [])
        c.print(text(f"  output: {where}/shard-K-of-{n}   {logs_text(st)}"), highlight=False)
        return
    c.print(text(f"  output: {where}   log: {st.get('log')}"), highlight=False)
