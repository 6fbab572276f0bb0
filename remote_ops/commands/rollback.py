"""remote-ops rollback: restore the exact original bytes of a patch from its journaled backup."""

NAME = "rollback"
HELP = "undo the latest patch on a host (or every patch back to --to JOURNAL_ID), byte for byte"


def add_arguments(p):
    p.add_argument("host", nargs="?", metavar="HOST|GROUP", help="host, group or comma list (default: the inventory's default)")
    p.add_argument("--to", metavar="JOURNAL_ID", help="undo this patch and every later one (see remote-ops history)")
    p.add_argument("--force", action="store_true", help="restore even when the file changed since the patch")


def run(args, ctx) -> int:
    from remote_ops import patching

    hosts = ctx.hosts(args.host)
    results = ctx.for_each_host(hosts, lambda h, s: patching.rollback(s, h, to=args.to, force=args.force))
    if ctx.json:
        ctx.emit({"hosts": [r.to_json() for r in results]} if len(results) > 1 or not results[0].ok
                 else results[0].value)
    else:
        for r in results:
            if not r.ok:
                continue
            v = r.value
            if not v.get("changed"):
                ctx.console.print(f"{r.host}: {v.get('message') or 'nothing to roll back (files already original)'}", soft_wrap=True)
            for d in v.get("rolled_back") or []:
                e = d["entry"]
                if e:
                    ctx.console.print(f"{r.host}: rolled back {d['of']} -> journal {e['txid']}", soft_wrap=True)
                    for t in e["targets"]:
                        ctx.console.print(f"  {t['real']} restored (sha256 {t['after'][:12]})", soft_wrap=True)
        ctx.report_failures(results)
    return ctx.fleet_status(results)
