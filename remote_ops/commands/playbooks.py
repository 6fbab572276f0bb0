"""remote-ops playbooks: every playbook found along the search order, with where it came from."""

NAME = "playbooks"
HELP = ("list the playbooks found by name: playbooks/ beside the inventory, the user's "
        "($XDG_CONFIG_HOME/remote-ops/playbooks), the shipped ones; origin, flow, requires, path")
FLAGS: dict = {}          # Inventory.playbooks takes no parameter: no flag but the global ones


def run(args, ctx) -> int:
    from remote_ops.commands.params import call
    data = call(ctx.fleet.playbooks, args)

    def human(console):
        from rich.table import Table
        from rich.text import Text
        t = Table(title=Text("search order: " + " -> ".join(f"{s['dir']} ({s['origin']})" for s in data.search)),
                  title_justify="left")
        for col in ("name", "origin", "flow", "requires", "path"):
            t.add_column(col, overflow="fold")
        for r in data.playbooks:
            name = r["name"] + (f" (shadowed by {r['shadowed_by']})" if r["shadowed_by"] else "")
            req = ", ".join(f"{k}{v or ' (any)'}" + (" if installed" if k in r["if_installed"] else "")
                            for k, v in r["requires"].items()) or r["error"] or "-"
            t.add_row(Text(name), Text(r["origin"]), Text(r["flow"] or "-"), Text(req), Text(r["path"]))
        console.print(t)
        if not data.playbooks:
            console.print("no playbooks found", markup=False)
    ctx.emit(data, human)
    return 0
