"""Command-line entry point: argument parsing, error handling, nothing else.

Kept import-light: heavy modules load only inside the command that needs them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from remote_ops.commands.completion import complete
from remote_ops.commands.params import add_arguments

COMMANDS = (
    "hosts", "playbooks", "facts", "sandbox",
    "inspect", "check",
    "patch", "rollback", "history",
    "extract", "status", "logs", "stop", "verify", "gather",
    "completion",
)


def _load_commands():
    mods = []
    for name in COMMANDS:
        try:
            mods.append(importlib.import_module(f"remote_ops.commands.{name}"))
        except ModuleNotFoundError as exc:
            if exc.name != f"remote_ops.commands.{name}":
                raise
    return mods


def _global_flags(p: argparse.ArgumentParser, suppress: bool) -> None:
    d = argparse.SUPPRESS if suppress else None
    p.add_argument("--json", action="store_true", default=d, help="machine-readable output on stdout")
    p.add_argument("--debug", action="store_true", default=d, help="show tracebacks")
    p.add_argument("-v", "--verbose", action="count", default=d, help="more detail")
    p.add_argument("-i", "--inventory", metavar="FILE", default=d,
                   help="inventory file (default: $REMOTE_OPS_INVENTORY or ./inventory.yaml)")
    p.add_argument("--accept-new", action="store_true", default=d,
                   help="record an unknown host key (like ssh -o StrictHostKeyChecking=accept-new)")
    p.add_argument("--parallel", type=int, metavar="N", default=d, help="hosts worked on at once (default 16)")
    p.add_argument("--connect-timeout", type=float, metavar="S", default=d,
                   help="SSH connect timeout (default: the host's connect_timeout, else ConnectTimeout "
                        "in ~/.ssh/config, else 10)")
    p.add_argument("--python", metavar="PATH", default=d,
                   help="interpreter on the host (default: the inventory's, else python3 on the PATH of a login shell)")
    p.add_argument("--workdir", metavar="DIR", default=d, help="working directory on the host (default: the inventory's)")
    p.add_argument("--persist", type=float, metavar="S", default=d,
                   help="keep each host's SSH connection for S idle seconds for the next command "
                        "(default: $REMOTE_OPS_PERSIST, else off; 60 is like Ansible's ControlPersist)")
    p.add_argument("--no-persist", dest="persist", action="store_const", const=0.0, default=d,
                   help="connect anew and keep nothing (stops a kept connection to the host)")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, same as every other user error
        import re

        from remote_ops.errors import UsageError
        from remote_ops.suggest import did_you_mean
        # cli.main prints the "remote-ops: " prefix; a sub-command names itself after it
        where = self.prog.removeprefix("remote-ops").strip()
        m = re.search(r"argument ([^:]+): invalid choice: '?([^' ]+)'?", message)
        if m:
            names = set(m.group(1).split("/"))
            choices = next((a.choices for a in self._actions if a.choices and (
                names & set(a.option_strings) or a.metavar in names or a.dest in names)), None)
            what = "command" if "COMMAND" in message else "choice"
            hint = did_you_mean(m.group(2), choices or ())
            message = f"unknown {what} {m.group(2)!r}" + (f": {hint}" if hint else
                                                           f" (choose from {', '.join(choices or ())})")
            raise UsageError(f"{where + ': ' if where else ''}{message}")
        m = re.match(r"unrecognized arguments: (.+)", message)
        if m and not where:
            # argparse reports these from the top parser: point at the command's own help, and
            # say how to pass a value that starts with '-' (--shard -1/3 reads -1/3 as an option)
            argv = getattr(self, "argv", None) or []
            subs = next((a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)), {})
            cmd = next((a for a in argv if a in subs), None)
            prog = f"{self.prog} {cmd}" if cmd else self.prog
            word = (m.group(1).split() or [m.group(1)])[0]     # an argument of blanks is a word too
            i = argv.index(word) if word in argv else -1
            if i > 0 and word.startswith("-") and argv[i - 1].startswith("--") and "=" not in argv[i - 1]:
                raise UsageError(f"{message}: {word!r} after {argv[i - 1]} is read as an option",
                                 f"write {argv[i - 1]}={word}; see: {prog} --help")
            raise UsageError(message, f"see: {prog} --help")
        raise UsageError(f"{where + ': ' if where else ''}{message}", f"see: {self.prog} --help")


def version_line() -> str:
    """``remote-ops VERSION`` (``remote_ops.__version__``, the one place it is written), plus the
    commit when the package runs from a git checkout (an editable install or the tree itself)."""
    import subprocess
    from pathlib import Path

    from remote_ops import __version__
    line = f"remote-ops {__version__}"
    top = Path(__file__).resolve().parent.parent
    if (top / ".git").exists():
        try:
            got = subprocess.run(["git", "-C", str(top), "describe", "--always", "--dirty", "--abbrev=7",
                                  "--exclude", "*"], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return line
        if got.returncode == 0 and got.stdout.strip():
            line += f" (git {got.stdout.strip()})"
    return line


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="remote-ops",
                     description="Drive a remote GPU host over SSH: check vLLM signatures, patch "
                                 "speculators, run and watch hidden-state extraction.")
    _global_flags(parser, suppress=False)
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for mod in _load_commands():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        _global_flags(p, suppress=True)   # flags work before or after the command
        add_arguments(p, mod)             # from its api.Inventory method + help table, or its own
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None            # the console script / python -m remote_ops
    try:
        return _main(argv, as_program)
    except KeyboardInterrupt:
        # a Ctrl-C outside the command's own handling: while it set up (imports), or while it wrote
        # the line of an earlier Ctrl-C; what was recorded as changed is still said
        rec = sys.modules.get("remote_ops.interrupts")
        for line in (rec.message([]) if rec else "interrupted before anything changed").splitlines():
            sys.stderr.write(f"remote-ops: {line}\n")
        return _finished(130, as_program)


def _main(argv: list[str] | None, as_program: bool) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["__complete"]:          # called by the bash/zsh completion scripts
        return complete(argv[1:], build_parser())
    debug = "--debug" in argv
    json_mode = "--json" in argv
    from remote_ops import interrupts
    from remote_ops.errors import Exit, RemoteOpsError
    ctx = args = None
    interrupts.reset()
    try:
        try:
            parser = build_parser()
            parser.argv = argv           # for its error line: which command's help to point at
            args = parser.parse_args(argv)
            if not getattr(args, "_module", None):
                parser.print_help()
                return int(Exit.USAGE)
            from remote_ops.commands.context import Context
            ctx = Context(json=bool(args.json), debug=bool(args.debug), verbose=args.verbose or 0,
                          accept_new=bool(args.accept_new), inventory_file=args.inventory,
                          parallel=args.parallel or 16, connect_timeout=args.connect_timeout,
                          python=args.python, workdir=args.workdir, persist=args.persist)
            ctx.fleet   # checks --parallel / --connect-timeout / --persist and $REMOTE_OPS_PERSIST before any work
            return _finished(int(args._module.run(args, ctx) or 0), as_program)
        finally:
            if ctx is not None:
                ctx.close()
    except RemoteOpsError as exc:
        if ctx is not None:       # a printed command acts on this inventory, this target (remote_ops/again.py)
            from remote_ops import again
            again.fill_error(exc, ctx.again_flags, host=exc.host or getattr(args, "host", None),
                             target=getattr(args, "host", None))
        _report(exc, debug, json_mode)
        return _finished(int(exc.exit_status), as_program)
    except KeyboardInterrupt:
        for line in interrupts.message(_changing_hosts(args, ctx)).splitlines():
            if ctx is not None:
                line = ctx.fill(line)
            sys.stderr.write(f"remote-ops: {line}\n")
        return _finished(int(Exit.INTERRUPTED), as_program)
    except BrokenPipeError:
        return int(Exit.OK)
    except Exception as exc:  # a bug: one line unless --debug
        if debug:
            raise
        from remote_ops.termsafe import clean    # the message may quote the host
        sys.stderr.write(f"remote-ops: internal error: {type(exc).__name__}: {clean(exc)} "
                         "(rerun with --debug for the traceback)\n")
        return int(Exit.REMOTE)


def _changing_hosts(args, ctx) -> list[str] | None:
    """The hosts a command that changes hosts (its module's CHANGES_HOSTS) was given, for the line
    after a Ctrl-C ("interrupted before anything changed on HOST"); None for other commands."""
    if args is None:       # still reading the command line: no host was contacted
        return []
    if not getattr(getattr(args, "_module", None), "CHANGES_HOSTS", False):
        return None
    try:
        return ctx.fleet.hosts(args.host)
    except Exception:  # the target could not be resolved: name what was typed
        return [args.host] if getattr(args, "host", None) else []


def _finished(status: int, as_program: bool) -> int:
    """The command's output is written and its outcome decided: as the program (not called from
    Python), a Ctrl-C from now until the process is gone would only kill it with that output
    already printed (shells show exit 130 with no word of why), so it is ignored. Python keeps an
    ignored SIGINT ignored through interpreter shutdown."""
    if as_program:
        import signal
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return status


def _report(exc, debug: bool, json_mode: bool) -> None:
    import json
    import traceback

    if debug:
        traceback.print_exc()
        rt = getattr(exc, "remote_traceback", None)
        if rt:
            from remote_ops.termsafe import lines
            sys.stderr.write("--- remote traceback ---\n" + lines(rt) + "\n")
    if json_mode:
        sys.stdout.write(json.dumps(exc.to_json()) + "\n")
    sys.stderr.write(f"remote-ops: {exc.one_line()}\n")


if __name__ == "__main__":
    sys.exit(main())
