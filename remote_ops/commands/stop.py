"""remote-ops stop: SIGTERM the job's process group, SIGKILL after the grace period, then make
sure nothing of the job is left (marker scan and the GPU process list) and report GPU holders."""

from remote_ops.commands.params import flag
from remote_ops.termsafe import text   # process names and job records come from the host

NAME = "stop"
HELP = "stop the extraction job: TERM, grace, KILL; confirm no process of it is left on CPU or GPU"
FLAGS = {
    "grace": flag("seconds between SIGTERM and SIGKILL (default: the playbook's, else 30)",
                  metavar="SECONDS"),
    "playbook": "the playbook whose job to stop (default: the host's)",
    "job": "a job id (see status --all)",
}


def run(args, ctx) -> int:
    from remote_ops.commands.params import call
    from remote_ops.errors import Exit

    def say(host, st, grace):
        how = (f"scancel of Slurm job {st.get('slurm_id')}, {len(st.get('tasks') or [])} array task(s)"
               if st.get("scheduler") == "slurm" else f"SIGTERM, SIGKILL after {grace:g}s")
        ctx.err.print(text(f"{host.name}: stopping {st['job_id']} ({how})..."), markup=False, highlight=False)

    results = call(ctx.fleet.stop, args, on_stopping=None if ctx.json else say)
    return ctx.show(results, lambda c, name, v: render(c, name, v, v.clean),
                    summary=lambda v: f"{v.job_id}: " + ("nothing left" if v.clean else "PROCESSES LEFT"),
                    exit_for=lambda v: int(Exit.OK) if v.clean else int(Exit.FINDINGS))


def render(c, host, rep, clean) -> None:
    from rich.text import Text

    from remote_ops.extract import jobs

    def names(ps):
        return ", ".join(f"{p['pid']} ({p.get('name')})" for p in ps)

    if rep["was"] in jobs.TERMINAL and not rep["terminated"]:
        c.print(text(f"{host}: job {rep['job_id']} was not running ({rep['was']})"), markup=False)
    if rep["terminated"]:
        c.print(text(f"  SIGTERM: {names(rep['terminated'])}"), markup=False)
    if rep["killed"]:
        c.print(text(f"  SIGKILL after grace: {names(rep['killed'])}"), markup=False)
    for p in rep.get("gpu_killed") or []:
        c.print(text(f"  killed GPU holder of the job: pid {p['pid']} ({p.get('name')}) {p.get('used_memory_mib')} MiB"),
                markup=False)
    slurm = rep["job"].get("scheduler") == "slurm"
    if rep["remaining"]:
        c.print(text(f"  STILL ALIVE: {names(rep['remaining'])}", "red"))
    elif slurm:
        c.print(text(f"  scancel {rep['job'].get('slurm_id')}: Slurm lists no task of it", "green"))
    else:
        c.print(Text("  no process of the job is left", style="green"))
    for h in rep.get("gpu_holders") or []:
        who = "of this job" if h.get("job") else "not of this job"
        c.print(text(f"  GPU {h.get('gpu_index')}: pid {h['pid']} ({h.get('name')}) holds "
                     f"{h.get('used_memory_mib')} MiB ({who})", "yellow"))
    c.print(text(jobs.summary_line(rep["job"])), highlight=False)
