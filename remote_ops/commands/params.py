"""A command's flags, derived from its ``api.Inventory`` method (invoke's ``@task`` idea).

The method's signature is the one home of every parameter and default: each keyword-only parameter
becomes a flag (``--dry-run`` for ``dry_run``), its default is the flag's default and its annotation
gives the kind:

    bool (default False)      --x                  store_true
    bool (default True)       --no-x               store_false into x
    int / float / str         --x V                type=int (metavar N) / float (``| None``: default None)
    list[str]                 --x V (repeatable)   append
    bool | str                --x [V], --no-x      no value: True; --no-x: False
    no default                required

``target`` (the method's first parameter) is the ``HOST|GROUP`` positional (``args.host``), other
positional parameters are positionals (``list[str] symbols``: one or more ``SYMBOL``). Callbacks (``Callable``) are the
command's to give, never flags. A command module whose ``NAME`` is an ``Inventory`` method gives a
help table ``FLAGS`` (that is what makes it derived): per parameter its help text (a plain string),
or ``flag(help, *option_strings, metavar=, choices=)`` for other option strings (short aliases,
another name) and a metavar; ``playbook``, ``job`` and ``output_dir`` have the same option strings
and metavar everywhere (``STANDARD``). ``cli_flag`` entries are the command's own flags (``--yes``,
``--tail``: how it renders or asks, not the operation's), placed in the table's order; ``API_ONLY``
names parameters left to scripts. A parameter without an entry still gets its flag.
``call(method, args)`` passes the parsed values back, so a new keyword-only parameter of the method
reaches it from the command line without touching ``commands/``.
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass
from typing import Any, Callable

HOST_HELP = "host, group or comma list (default: the inventory's default)"
HOST_REQUIRED_HELP = "host, group or comma list from the inventory"


@dataclass(frozen=True)
class Flag:
    """A parameter's entry in a command's help table."""

    help: str | None = None
    names: tuple[str, ...] = ()       # the option strings, when not just --the-name (e.g. "--playbook", "-p")
    metavar: str | None = None
    choices: tuple | None = None
    no_help: str | None = None        # bool | str: the --no-x flag's help
    cli: dict | None = None           # a flag of the command only: its argparse keywords


def flag(help: str | None = None, *names: str, metavar: str | None = None, choices=None,
         no_help: str | None = None) -> Flag:
    """The help entry of one of the method's parameters."""
    return Flag(help, tuple(names), metavar, tuple(choices) if choices else None, no_help)


def cli_flag(help: str, *names: str, **argparse_kwargs) -> Flag:
    """A flag of the command itself (not a parameter of the method), e.g. ``cli_flag("...", "--yes",
    "-y", action="store_true")``."""
    return Flag(help, tuple(names), cli=argparse_kwargs)


# the parameters every command spells the same (a command's table gives their help text)
STANDARD = {"playbook": Flag(names=("--playbook", "-p"), metavar="P"), "job": Flag(metavar="ID"),
            "output_dir": Flag(metavar="DIR")}


def operation(mod) -> Callable | None:
    """The ``api.Inventory`` method of a command module with a help table (``FLAGS``), or None."""
    if not hasattr(mod, "FLAGS"):
        return None
    from remote_ops.api import Inventory
    return getattr(Inventory, mod.NAME)


def entry_for(table: dict, name: str) -> Flag:
    """A parameter's help entry: the table's (a string is the help text) over ``STANDARD``'s."""
    e = table.get(name, Flag())
    e = Flag(help=e) if isinstance(e, str) else e
    std = STANDARD.get(name)
    if std is not None and e.cli is None:
        e = Flag(e.help, e.names or std.names, e.metavar or std.metavar, e.choices, e.no_help)
    return e


def _kinds(annotation) -> tuple[set[str], bool]:
    """The annotation's types as names (``"list[str] | None"`` -> ({"list[str]"}, True))."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    parts = {p.strip() for p in text.split("|")}
    return parts - {"None"}, "None" in parts


def is_callback(p: inspect.Parameter) -> bool:
    return "Callable" in str(p.annotation)


def parameters(method) -> list[inspect.Parameter]:
    """The method's parameters that the command line gives (not ``self``, not callbacks)."""
    return [p for name, p in inspect.signature(method).parameters.items()
            if name != "self" and not is_callback(p)]


def _positional(p: argparse.ArgumentParser, param: inspect.Parameter, entry: Flag) -> None:
    required = param.default is inspect.Parameter.empty
    if param.name == "target":
        p.add_argument("host", nargs=None if required else "?", metavar="HOST|GROUP",
                       help=entry.help or (HOST_REQUIRED_HELP if required else HOST_HELP))
        return
    kinds, _ = _kinds(param.annotation)
    many = kinds == {"list[str]"}
    one = param.name[:-1] if many and param.name.endswith("s") else param.name     # symbols: SYMBOL ...
    p.add_argument(param.name, nargs=("+" if required else "*") if many else (None if required else "?"),
                   metavar=entry.metavar or one.upper(), help=entry.help, choices=entry.choices,
                   **({} if required else {"default": param.default}))


def _option(p: argparse.ArgumentParser, param: inspect.Parameter, entry: Flag) -> None:
    name, default = param.name, param.default
    dashed = "--" + name.replace("_", "-")
    required = default is inspect.Parameter.empty
    kinds, _ = _kinds(param.annotation)
    common: dict[str, Any] = {"dest": name, "help": entry.help}
    if required:
        common["required"] = True
    else:
        common["default"] = default
    if kinds == {"bool"}:
        if default is True:
            p.add_argument(*(entry.names or ("--no-" + name.replace("_", "-"),)), action="store_false", **common)
        else:
            p.add_argument(*(entry.names or (dashed,)), action="store_true", **common)
        return
    if kinds == {"bool", "str"}:       # --x [VALUE] (True without one), --no-x (False)
        p.add_argument(*(entry.names or (dashed,)), nargs="?", const=True, metavar=entry.metavar, **common)
        p.add_argument("--no-" + name.replace("_", "-"), dest=name, action="store_false", default=None,
                       help=entry.no_help)
        return
    types = {"int": int, "float": float, "str": None}
    if kinds == {"list[str]"}:
        p.add_argument(*(entry.names or (dashed,)), action="append", metavar=entry.metavar,
                       choices=entry.choices, **common)
        return
    if len(kinds) != 1 or next(iter(kinds)) not in types:
        raise TypeError(f"{name}: no flag for a parameter annotated {param.annotation!r} "
                        "(bool, int, float, str, list[str], bool | str; give it a cli_flag entry)")
    kind = types[next(iter(kinds))]
    metavar = entry.metavar or ("N" if kind is int else None)
    p.add_argument(*(entry.names or (dashed,)), metavar=metavar, choices=entry.choices,
                   **({"type": kind} if kind else {}), **common)


def add_arguments(p: argparse.ArgumentParser, mod) -> None:
    """The command's positionals and flags: from its method's signature and help table (``FLAGS``),
    or its own ``add_arguments`` when it names no method."""
    method = operation(mod)
    if method is None:
        mod.add_arguments(p)
        return
    table: dict = mod.FLAGS
    skip = set(getattr(mod, "API_ONLY", ()))
    params = {q.name: q for q in parameters(method) if q.name not in skip}
    unknown = [n for n in table if entry_for(table, n).cli is None and n not in params]
    if unknown:
        raise TypeError(f"{mod.NAME}: FLAGS names {', '.join(unknown)}, not a parameter of "
                        f"Inventory.{mod.NAME} (a flag of the command alone is a cli_flag)")
    keyword = {n: q for n, q in params.items() if q.kind is inspect.Parameter.KEYWORD_ONLY}
    for q in params.values():
        if q.name not in keyword:
            _positional(p, q, entry_for(table, q.name))
    for name in table:
        entry = entry_for(table, name)
        if entry.cli is not None:
            p.add_argument(*(entry.names or ("--" + name.replace("_", "-"),)), dest=name, help=entry.help,
                           **entry.cli)
        elif name in keyword:
            _option(p, keyword[name], entry)
    for name, q in keyword.items():
        if name not in table:       # a new parameter: its flag, with no help text yet
            _option(p, q, entry_for(table, name))


def call(method, args: argparse.Namespace, **overrides):
    """``method`` (a bound ``Inventory`` method) with each of its parameters from ``args`` (``target``
    from ``args.host``); ``overrides`` (callbacks, values the command changes) win."""
    kwargs = {}
    for q in parameters(method):
        if q.name in overrides:
            continue
        source = "host" if q.name == "target" else q.name
        if hasattr(args, source):
            kwargs[q.name] = getattr(args, source)
    return method(**kwargs, **overrides)
