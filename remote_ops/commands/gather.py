"""remote-ops gather: copy the outputs of a group's hosts (the shards of one dataset) to one local
directory, every file checked against the sha256 its host computed."""

NAME = "gather"
HELP = "copy the union of the hosts' outputs into one local directory (SFTP, sha256-checked, resumable)"


def add_arguments(p):
    p.add_argument("host", nargs="?", metavar="HOST|GROUP", help="host, group or comma list (default: the inventory's default)")
    p.add_argument("--to", required=True, metavar="DIR", help="local directory to gather into (created)")
    p.add_argument("--playbook", "-p", metavar="P", help="the playbook whose outputs to gather (default: the host's)")
    p.add_argument("--job", metavar="ID", help="gather this job's outputs")
    p.add_argument("--output-dir", metavar="DIR", help="gather this directory of each host instead")


def run(args, ctx) -> int:
    import sys

    from remote_ops.errors import Exit
    from remote_ops.units import human_bytes

    def on_file(host, item):
        if not ctx.json:
            sys.stderr.write(f"\r  {host}: {item['name']} ({human_bytes(item['size'])})          ")
            sys.stderr.flush()

    results = ctx.fleet.gather(args.host, to=args.to, playbook=args.playbook, job=args.job,
                               output_dir=args.output_dir, on_file=on_file)
    if not ctx.json:
        sys.stderr.write("\n")

    def render(c, host, v):
        c.print(f"{host}: {v.copied} copied ({human_bytes(v.bytes)}), {v.skipped} already there, of {v.files}",
                markup=False, highlight=False)

    def render_group(c, g):
        from rich.text import Text
        head = (f"gathered into {g.to}: {g.present}" + (f"/{g.total}" if g.total is not None else "") +
                f" samples ({g.copied} copied, {human_bytes(g.bytes)}; {g.skipped} already there, sha256 checked)")
        c.print(Text(head + ("" if g.ok else ": PROBLEMS"), style="green" if g.ok else "red"))
        for p in g.problems:
            c.print(f"  {p}", markup=False, highlight=False)

    return ctx.show(results, render, summary=lambda v: f"{v.copied} copied, {v.skipped} kept",
                    render_group=render_group, group_exit=lambda g: int(Exit.OK) if g.ok else int(Exit.FINDINGS))
