"""remote-ops hosts: the inventory's hosts and groups."""

NAME = "hosts"
HELP = "list the hosts and groups of the inventory"


def add_arguments(p):
    pass


def run(args, ctx) -> int:
    inv = ctx.inventory
    rows = []
    for h in inv.hosts.values():
        rows.append({"name": h.name, "hostname": h.hostname, "port": h.port, "user": h.user,
                     "python": h.python, "workdir": h.workdir, "playbook": h.playbook,
                     "proxy_jump": list(h.proxy_jump) if h.proxy_jump else None,
                     "groups": sorted(g for g, members in inv.groups.items() if h.name in members),
                     "default": h.name == inv.default})
    data = {"inventory": inv.path, "default": inv.default, "hosts": rows, "groups": inv.groups}

    def human(console):
        from rich.table import Table
        t = Table(title=f"{inv.path}", title_justify="left")
        for col in ("host", "address", "user", "python", "groups"):
            t.add_column(col)
        for r in rows:
            addr = r["hostname"] + (f":{r['port']}" if r["port"] else "")
            if r["proxy_jump"]:
                addr += " via " + ",".join(r["proxy_jump"])
            name = r["name"] + (" (default)" if r["default"] else "")
            t.add_row(name, addr, r["user"] or "-", r["python"], ", ".join(r["groups"]) or "-")
        console.print(t)
    ctx.emit(data, human)
    return 0
