"""remote-ops status: running / succeeded / failed / stopped / lost, progress, elapsed and rate."""

from remote_ops.commands.params import cli_flag

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
                c.print(f"{name}: " + jobs.summary_line(r), markup=False, highlight=False)
            if not v.jobs:
                c.print(f"{name}: no jobs", markup=False)
        return ctx.show(call(ctx.fleet.jobs, args), render_all, summary=lambda v: f"{len(v.jobs)} job(s)")
    return ctx.show(call(ctx.fleet.status, args),
                    lambda c, name, v: render(c, name, v.job), summary=lambda v: jobs.summary_line(v.job),
                    exit_for=lambda v: jobs.exit_for(v.job), render_group=render_group)


def render_group(c, g) -> None:
    from remote_ops.extract.shard import progress_line
    c.print(progress_line(g), markup=False, highlight=False)


def render(c, host, st) -> None:
    from rich.text import Text

    from remote_ops.extract import jobs
    color = {"running": "cyan", "starting": "cyan", "succeeded": "green"}.get(st["state"], "red")
    c.print(Text(f"{host}: " + jobs.summary_line(st), style=color))
    if st.get("label"):
        c.print(Text(f"  {st['label']}", style="yellow"))
    from remote_ops.extract.tail import bound_text, disk_observed_text
    for line in (bound_text(st), disk_observed_text(st)):
        if line:
            c.print(f"  {line}", markup=False, highlight=False)
    for t in st.get("tasks") or []:      # a Slurm job array (extract/slurm.py)
        c.print(f"  task {t['task']}: {t['state']}" + (f" ({t['reason']})" if t.get("reason") else "") +
                f", {t['samples']}" + (f"/{t['expected']}" if t.get("expected") is not None else "") + " samples"
                + (f", exit {t['exit_code']}" if t.get("exit_code") is not None else ""), markup=False)
    if st.get("slurm_id"):
        c.print(f"  Slurm job {st['slurm_id']}", markup=False)
    if st.get("accounting"):             # why sacct could not tell how the tasks that left the queue ended
        c.print(f"  {st['accounting']}", markup=False, highlight=False)
    if st.get("pid"):
        c.print(f"  pid {st['pid']} (process group {st.get('pgid')}), supervisor "
                f"{'alive' if st.get('supervisor_alive') else 'gone'}", markup=False)
    if jobs.server_line(st):
        c.print(f"  {jobs.server_line(st)}", markup=False, highlight=False)
    if st.get("exit_code") is not None or st.get("signal_name"):
        c.print(f"  exit: {st.get('exit_code') if st.get('exit_code') is not None else st.get('signal_name')}",
                markup=False)
    for line in st.get("error_lines") or []:
        c.print(f"  | {line}", markup=False, highlight=False)
    for w in st.get("warnings") or []:
        c.print(Text(f"  warning: {w}", style="yellow"))
    where = " + ".join(st.get("output_dirs") or [st.get("output_dir")])   # several disks: every directory
    c.print(f"  output: {where}   log: {st.get('log')}", markup=False, highlight=False)

