"""remote-ops check: which calls of the host's speculators cannot bind to its installed vLLM, and
where the library's behaviour drifted from the version the package was written for."""

from remote_ops.check import DEFAULT_AGAINST

NAME = "check"
HELP = ("report every call/import of the library that cannot bind on the host (static, or --runtime), "
        "and drift from the baseline version")


def add_arguments(p):
    p.add_argument("host", nargs="?", metavar="HOST|GROUP", help="host, group or comma list (default: the inventory's default)")
    p.add_argument("--playbook", "-p", metavar="P", help="take check targets from this playbook's check: section")
    p.add_argument("--runtime", action="store_true",
                   help="import the library on the host and use inspect.signature (default: parse its sources)")
    p.add_argument("--target", action="append", dest="targets", metavar="MODULE",
                   help="caller module to analyse (repeatable; default: modules of --package importing the library)")
    p.add_argument("--against", action="append", metavar="PKG",
                   help="library package (repeatable; default: %s)" % ", ".join(DEFAULT_AGAINST))
    p.add_argument("--baseline", metavar="VERSION|PATH",
                   help="library version (fetched from PyPI, sources only) or directory of sources that the "
                        "package was written for (default: the version the package pins in its metadata)")
    p.add_argument("--no-drift", action="store_true", help="binding check only (no baseline comparison)")
    p.add_argument("--strict", action="store_true", help="exit 1 on drift too (default: drift is shown, exit 0)")
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
    req.baseline = args.baseline
    req.drift = not args.no_drift
    hosts = ctx.hosts(args.host)
    found: list = []
    accepted_of: dict = {}   # playbook path -> its check.accepted_drift (a fleet shares one file)

    def one(host, sess):
        r = req
        if not args.playbook and getattr(host, "playbook", None):
            # the host's playbook reviewed some drift: apply its check.accepted_drift (targets unchanged)
            from dataclasses import replace

            from remote_ops import playbook as pb_mod
            path = pb_mod.find(None, host)
            if path not in accepted_of:
                accepted_of[path] = list((pb_mod.load(path).check or {}).get("accepted_drift") or [])
            r = replace(req, accepted_drift=accepted_of[path])
        res = check_mod.run(sess, r)
        found.append((host.name, res))
        return res

    status = ctx.fleet(hosts, one, lambda c, name, v: check_mod.render(c, v, ctx.verbose),
                       summary=lambda v: (f"{len(v['findings'])} finding(s), {len(v.get('drift') or [])} drift, "
                                          f"{len(v.get('unknown') or [])} unknown"),
                       exit_for=lambda v: int(Exit.FINDINGS) if v["findings"] or (args.strict and v.get("drift"))
                       else int(Exit.OK))
    if args.emit_playbook and found:
        _emit_playbook(args.emit_playbook, req, [v for _, v in sorted(found, key=lambda x: x[0])], ctx)
    return status


def _emit_playbook(path, req, values, ctx) -> None:
    """One draft for all hosts checked: findings merged, versions pinned to what the hosts run."""
    import sys

    from remote_ops import emit_playbook

    seen, findings, versions = set(), [], {}
    for value in values:
        for pkg, ver in (value.get("versions") or {}).items():
            versions.setdefault(pkg, set()).add(ver)
        for f in list(value["findings"]) + list(value.get("drift") or []):
            key = (f.get("module"), f.get("line"), f.get("symbol"), f.get("kind"), f.get("name"))
            if key not in seen:
                seen.add(key)
                findings.append(f)
    requires = {pkg: "==" + next(iter(v)) for pkg, v in sorted(versions.items()) if len(v) == 1 and next(iter(v))}
    check = {}
    targets = list(req.targets or []) or sorted({t["module"] if isinstance(t, dict) else t
                                                   for v in values for t in (v.get("targets") or [])})
    if targets:
        check["targets"] = targets
    if req.against:
        check["against"] = list(req.against)
    written = emit_playbook.write(path, findings, requires=requires or None, check=check or None)
    sys.stderr.write(f"remote-ops: wrote a draft playbook with fixes for {len(findings)} finding(s) to {written}\n")
