"""remote-ops inspect: the parameters of library callables as installed on the host."""

NAME = "inspect"
HELP = "print the parameters of module:qualname callables on the host (static, or --runtime)"


def add_arguments(p):
    p.add_argument("host", metavar="HOST|GROUP", help="host, group or comma list from the inventory")
    p.add_argument("symbols", nargs="+", metavar="SYMBOL",
                   help="module:qualname, e.g. vllm.v1.request:Request or vllm.v1.core.sched.scheduler:Scheduler.add_request")
    p.add_argument("--runtime", action="store_true",
                   help="import the module on the host and use inspect.signature (default: parse the sources)")
    p.add_argument("--baseline", metavar="VERSION|PATH",
                   help="also show each symbol in this library version (fetched from PyPI, sources only) or "
                        "source directory, and what changed since (parameters, defaults, return annotation)")


def run(args, ctx) -> int:
    from remote_ops import check as check_mod
    from remote_ops.errors import Exit, UsageError

    for s in args.symbols:
        mod, sep, qual = s.partition(":")
        if not sep or not all(p.isidentifier() for p in mod.split(".")) or \
                (qual and not all(p.isidentifier() for p in qual.split("."))):
            raise UsageError(f"bad symbol {s!r}: expected module:qualname",
                             "for example vllm.v1.request:Request")
    op_args = {"symbols": list(args.symbols), "mode": "runtime" if args.runtime else "static"}

    def one(host, sess):
        raw = sess.call("compat.inspect", op_args)
        out = dict(raw, host=host.name, baselines={})
        if args.baseline:
            from remote_ops import drift
            out["baselines"] = drift.inspect_diff(out, args.baseline)
        return out

    def exit_for(v) -> int:
        bad = any(s["kind"] in ("missing", "unknown") for s in v["symbols"])
        return int(Exit.FINDINGS) if bad else int(Exit.OK)

    return ctx.fleet(ctx.hosts(args.host), one, lambda c, name, v: check_mod.render_inspect(c, v),
                     summary=lambda v: f"{len(v['symbols'])} symbol(s)", exit_for=exit_for)
