"""remote-ops sandbox up|down|status: the embedded local host reached over real SSH."""

NAME = "sandbox"
HELP = "start/stop a local sandbox host (real sshd on 127.0.0.1, real speculators + vLLM sources)"


def add_arguments(p):
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--vllm", default="0.17.0", metavar="VERSION", help="vLLM release for the host (default 0.17.0)")
    p.add_argument("--speculators", default="0.3.0", metavar="VERSION", help="speculators release (default 0.3.0)")
    p.add_argument("--port", type=int, help="sshd port (default: a free one, kept across restarts)")
    p.add_argument("--no-torch", action="store_true", help="skip torch (no extraction stand-in)")
    p.add_argument("--purge", action="store_true", help="with down: delete the sandbox's files")


def run(args, ctx) -> int:
    from remote_ops import sandbox
    from remote_ops.connect.inventory import inventory_path

    inv = inventory_path(ctx.inventory_file)
    if args.action == "up":
        say = (lambda m: None) if ctx.json else (lambda m: ctx.err.print(f"[dim]sandbox: {m}[/dim]"))
        data = sandbox.up(inv, speculators=args.speculators, vllm=args.vllm, port=args.port,
                          torch=not args.no_torch, progress=say)
        written = data.get("host_written_to") or inv
        where = written if written == inv else f"{written} (included by {inv})"
        ctx.emit(data, lambda c: c.print(
            f"sandbox is up: host sandbox = 127.0.0.1:{data['port']} (speculators {args.speculators}, "
            f"vllm {args.vllm}) in {where}; root {data['root']} ({data['root_from']}); try: "
            + ctx.command("facts", "sandbox") + "\n"
            f"server-flow host {sandbox.SERVER_HOST_NAME} (speculators {sandbox.SERVER_SPECULATORS} STAND-IN server and "
            f"client, prepared data {data['server_host']['prepared']}); try: "
            + ctx.command("extract", sandbox.SERVER_HOST_NAME, "--tail"), markup=False))
    elif args.action == "down":
        data = sandbox.down(inv, purge=args.purge)
        ctx.emit(data, lambda c: c.print(
            ("sandbox stopped" if data["stopped"] else "sandbox was not running")
            + f" (root {data['root']}, {data['root_from']}" + ("; its files removed)" if data["purged"] else ")"),
            markup=False))
    else:
        data = sandbox.status(inv)
        ctx.emit(data, lambda c: c.print(
            f"no sandbox yet at {data['root']} ({data['root_from']}; remote-ops sandbox up)" if not data["exists"] else
            f"sandbox {'running' if data['running'] else 'stopped'} on 127.0.0.1:{data.get('port')} at {data['root']} "
            f"({data['root_from']})" + (f"; hosts sandbox and {data['server_host']['name']} (server flow, workdir "
                                       f"{data['server_host']['workdir']})" if data.get("server_host") else ""),
            markup=False))
        return 0 if data.get("running") else 1
    return 0
