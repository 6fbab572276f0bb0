"""remote-ops check: which calls of the host's speculators cannot bind to its installed vLLM."""

NAME = "check"
HELP = "report every call/import of the library that cannot bind on the host (static, or --runtime)"


def add_arguments(p):
    p.add_argument("host", nargs="?", metavar="HOST|GROUP", help="host, group or comma list (default: the inventory's default)")
    p.add_argument("--playbook", "-p", metavar="P", help="take check targets from this playbook's check: section")
    p.add_argument("--runtime", action="store_true",
                   help="import the library on the host and use inspect.signature (default: parse its sources)")
    p.add_argument("--target", action="append", dest="targets", metavar="MODULE",
                   help="caller module to analyse (repeatable; default: modules of --package importing the library)")
    p.add_argument("--against", action="append", metavar="PKG", help="library package (repeatable; default vllm)")
    p.add_argument("--emit-playbook", metavar="FILE",
                   help="write a draft playbook with mechanical fixes for the findings (placeholders where a "
                        "person must decide; the loader refuses it until they are filled in)")
    p.add_argument("--package", metavar="PKG", default=None,
                   help="default targets: modules of this package (default speculators.data_generation)")


def run(args, ctx) -> int:
    from remote_ops import check as check_mod
    from remote_ops.errors import Exit

    if args.playbook:
        from remote_ops import playbook as pb_mod
        req = check_mod.request_from_playbook(pb_mod.load(pb_mod.find(args.playbook)), runtime=args.runtime)
    else:
        req = check_mod.CheckRequest(runtime=args.runtime)
    if args.targets:
        req.targets = list(args.targets)
    if args.against:
        req.against = list(args.against)
    if args.package:
        req.package = args.package
    hosts = ctx.hosts(args.host)
    results = ctx.for_each_host(hosts, lambda host, sess: check_mod.run(sess, req))
    if ctx.json:
        if len(results) == 1 and results[0].ok:
            ctx.emit(results[0].value)
        elif len(results) == 1:
            ctx.report_failures(results)
        else:
            ctx.emit({"hosts": [r.value if r.ok else r.to_json() for r in results]})
            ctx.report_failures(results)
    else:
        for r in results:
            if r.ok:
                check_mod.render(ctx.console, r.value, ctx.verbose)
        ctx.report_failures(results)
    if args.emit_playbook:
        _emit_playbook(args.emit_playbook, req, [r for r in results if r.ok], ctx)
    failed = [r for r in results if not r.ok]
    if failed:
        return ctx.fleet_status(results)
    return int(Exit.FINDINGS) if any(r.value["findings"] for r in results) else int(Exit.OK)


def _emit_playbook(path, req, results, ctx) -> None:
    """One draft for all hosts checked: findings merged, versions pinned to what the hosts run."""
    import sys

    from remote_ops import emit_playbook

    seen, findings, versions = set(), [], {}
    for r in results:
        for pkg, ver in (r.value.get("versions") or {}).items():
            versions.setdefault(pkg, set()).add(ver)
        for f in r.value["findings"]:
            key = (f.get("module"), f.get("line"), f.get("symbol"), f.get("kind"), f.get("name"))
            if key not in seen:
                seen.add(key)
                findings.append(f)
    requires = {pkg: "==" + next(iter(v)) for pkg, v in sorted(versions.items()) if len(v) == 1 and next(iter(v))}
    check = {}
    targets = list(req.targets or []) or sorted({t["module"] if isinstance(t, dict) else t
                                                   for r in results for t in (r.value.get("targets") or [])})
    if targets:
        check["targets"] = targets
    if req.against:
        check["against"] = list(req.against)
    written = emit_playbook.write(path, findings, requires=requires or None, check=check or None)
    sys.stderr.write(f"remote-ops: wrote a draft playbook with fixes for {len(findings)} finding(s) to {written}\n")
