"""remote-ops hosts: the inventory's hosts and groups."""

NAME = "hosts"
HELP = "list the hosts and groups of the inventory (ours, or an Ansible YAML/INI one: -i hosts.yml)"


def add_arguments(p):
    pass


def run(args, ctx) -> int:
    inv = ctx.inventory
    rows = []
    for h in inv.hosts.values():
        rows.append({"name": h.name, "hostname": h.hostname, "port": h.port, "user": h.user,
                     "python": h.python, "workdir": h.workdir, "playbook": h.playbook,
                     "proxy_jump": list(h.proxy_jump) if h.proxy_jump else None,
                     "identity_file": list(h.identity_file) or None, "known_hosts": h.known_hosts,
                     "connection": h.connection, "vars": h.vars,
                     "groups": sorted(g for g, members in inv.groups.items() if h.name in members),
                     "default": h.name == inv.default})
    data = {"inventory": inv.path, "format": inv.format, "default": inv.default, "hosts": rows,
            "groups": inv.groups, "ignored": inv.ignored}

    def human(console):
        # an inventory may come from elsewhere (an Ansible one): its names and values are cleaned
        # and never read as markup (remote_ops/termsafe.py)
        from rich.table import Table

        from remote_ops.termsafe import text
        fmt = "" if inv.format == "remote-ops" else f" ({inv.format.replace('-', ' ')})"
        t = Table(title=text(f"{inv.path}{fmt}"), title_justify="left")
        for col in ("host", "address", "user", "python", "groups"):
            t.add_column(col)
        for r in rows:
            addr = "local" if r["connection"] == "local" else r["hostname"] + (f":{r['port']}" if r["port"] else "")
            if r["proxy_jump"]:
                addr += " via " + ",".join(r["proxy_jump"])
            name = r["name"] + (" (default)" if r["default"] else "")
            t.add_row(*(text(x) for x in (name, addr, r["user"] or "-", r["python"] or "python3 (login shell PATH)",
                                          ", ".join(r["groups"]) or "-")))
        console.print(t)
    ctx.emit(data, human)
    return 0
