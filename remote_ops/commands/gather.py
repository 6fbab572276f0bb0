"""remote-ops gather: copy the outputs of a group's hosts (the shards of one dataset) to one local
directory, every file checked against the sha256 its host computed."""

from remote_ops.commands.params import flag

NAME = "gather"
HELP = "copy the union of the hosts' outputs into one local directory (SFTP, sha256-checked, resumable)"
FLAGS = {
    "to": flag("local directory to gather into (created)", metavar="DIR"),
    "playbook": "the playbook whose outputs to gather (default: the host's)",
    "job": "gather this job's outputs",
    "output_dir": "gather this directory of each host instead",
    "host_mode": "give each copy its host file's mode, capped at 0644 (default: 0600)",
    "checksum": ("hash every file already in --to (default: a file gather wrote and nobody touched since, by "
                 "size, mtime and inode in its manifest, is taken as it is)"),
}


def run(args, ctx) -> int:
    import sys

    from remote_ops.commands.params import call
    from remote_ops.errors import Exit
    from remote_ops.units import human_bytes

    # the file being copied, redrawn in place: only on a terminal (a log or a pipe would get every
    # redraw as one endless line); the per-host lines and the total below say what was copied
    redraw = not ctx.json and sys.stderr.isatty()
    drawn = []

    def on_file(host, item):
        if redraw:
            from remote_ops.termsafe import clean    # the name is the host's
            sys.stderr.write(f"\r  {clean(host)}: {clean(item['name'])} ({human_bytes(item['size'])})          ")
            sys.stderr.flush()
            drawn.append(1)

    results = call(ctx.fleet.gather, args, on_file=on_file)
    if drawn:
        sys.stderr.write("\n")

    def render(c, host, v):
        failed = f", {len(v.failed)} NOT copied" if v.failed else ""
        c.print(f"{host}: {v.copied} copied ({human_bytes(v.bytes)}), {v.skipped} already there{failed}, of {v.files}",
                markup=False, highlight=False)

    def render_group(c, g):
        from rich.text import Text
        head = (f"gathered into {g.to}: {g.present}" + (f"/{g.total}" if g.total is not None else "") +
                f" samples ({g.copied} copied, {human_bytes(g.bytes)}; {g.skipped} already there, sha256 checked)")
        c.print(Text(head + ("" if g.ok else ": PROBLEMS"), style="green" if g.ok else "red"))
        for r in g.extra.get("running") or []:
            c.print(f"  note: job {r['job_id']} on {r['host']} is {r['state']} ({r.get('done')}"
                    + (f"/{r['expected']}" if r.get("expected") is not None else "") + " samples): gather again once "
                    "it ended", markup=False, highlight=False)
        for p in g.problems:
            c.print(f"  {p}", markup=False, highlight=False)
        for d in g.extra.get("same_dir") or []:
            c.print(f"  note: {d['where']} is the directory {d['same_as']}: read once", markup=False, highlight=False)
        for d in g.dropped[:20]:
            c.print(f"  dropped data_{d['index']}.pt of {d['dropped']}: kept {d['kept']} ({d['why']}"
                    + ("" if d["same_bytes"] else "; the bytes differ") + ")", markup=False, highlight=False)
        if len(g.dropped) > 20:
            c.print(f"  ... and {len(g.dropped) - 20} more dropped copies (--json lists them)", markup=False)
        if g.beyond:
            c.print(f"  not copied: {len(g.beyond)} file(s) beyond the dataset's {g.total} samples, e.g. {g.beyond[0]}",
                    markup=False, highlight=False)

    return ctx.show(results, render, summary=lambda v: f"{v.copied} copied, {v.skipped} kept",
                    render_group=render_group, group_exit=lambda g: int(Exit.OK) if g.ok else int(Exit.FINDINGS))
