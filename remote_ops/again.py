"""The commands remote-ops prints for a person to paste: complete and acting on the same hosts.

A printed command names its target and the flags that made the situation (``--shard``, ``--follow``,
``--job``) where it is written; this module adds what only the command line knows: the inventory
(``-i FILE`` when one was given, or came from ``$REMOTE_OPS_INVENTORY``, so a paste acts on that
inventory even where the variable is not set; nothing when the default ./inventory.yaml was used) and
``--python`` / ``--workdir`` when given. ``fill`` puts them into every ``remote-ops COMMAND`` of a text
(right after ``remote-ops``, where the global flags are read as well) and replaces the placeholders
``HOST`` and ``GROUP`` of host-side text with the host and the target the user typed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from typing import Any

# the sub-commands of remote_ops/cli.py (a test holds the two lists equal)
COMMANDS = ("hosts", "playbooks", "facts", "sandbox", "inspect", "check", "patch", "rollback", "history",
            "extract", "status", "logs", "stop", "verify", "gather", "completion")
_CMD = re.compile(r"\bremote-ops (?=(?:%s)\b)" % "|".join(COMMANDS))
_HOST = re.compile(r"(\bremote-ops (?:-\S+ (?:'[^']*'|\S+) )*(?:%s) )HOST\b" % "|".join(COMMANDS))
_GROUP = re.compile(r"(\bremote-ops (?:-\S+ (?:'[^']*'|\S+) )*(?:%s) )GROUP\b" % "|".join(COMMANDS))


def global_flags(inventory_file: str | None, *, python: str | None = None,
                 workdir: str | None = None) -> tuple[str, ...]:
    """The global flags a printed command needs to act where this one acted."""
    inv = inventory_file or os.environ.get("REMOTE_OPS_INVENTORY") or None
    out: tuple[str, ...] = ("-i", os.path.abspath(os.path.expanduser(inv))) if inv else ()
    if python:
        out += ("--python", python)
    if workdir:
        out += ("--workdir", workdir)
    return out


def command(sub: str, *words: str, flags: tuple[str, ...] = ()) -> str:
    """``remote-ops [flags] SUB WORDS...``, each word quoted for a POSIX shell."""
    return shlex.join(["remote-ops", *flags, sub, *[w for w in words if w]])


def fill(text: str, flags: tuple[str, ...] = (), host: str | None = None, target: str | None = None) -> str:
    """``text`` with ``flags`` after every ``remote-ops`` that starts a command, and ``HOST`` /
    ``GROUP`` after a command word replaced by ``host`` / ``target`` (quoted)."""
    if not isinstance(text, str) or "remote-ops " not in text:
        return text
    if flags:
        text = _CMD.sub(lambda m: "remote-ops " + shlex.join(flags) + " ", text)
    if host:
        text = _HOST.sub(lambda m: m.group(1) + shlex.quote(host), text)
    if target:
        text = _GROUP.sub(lambda m: m.group(1) + shlex.quote(target), text)
    return text


# a record's fields that quote the host's own text (a log, a job's output) stay as the host wrote them
_VERBATIM = frozenset({"lines", "tail", "log_tail", "stderr", "stdout", "output", "traceback", "text"})


def fill_all(value: Any, flags: tuple[str, ...] = (), host: str | None = None, target: str | None = None) -> Any:
    """``fill`` over every string of a record, dict or list (in place for records and dicts)."""
    if isinstance(value, str):
        return fill(value, flags, host, target)
    if isinstance(value, list):
        for i, v in enumerate(value):
            value[i] = fill_all(v, flags, host, target)
        return value
    if isinstance(value, tuple):
        return type(value)(*(fill_all(v, flags, host, target) for v in value)) if hasattr(value, "_fields") \
            else tuple(fill_all(v, flags, host, target) for v in value)
    if isinstance(value, dict):
        for k in list(value):
            if k not in _VERBATIM:
                value[k] = fill_all(value[k], flags, host, target)
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if f.name in _VERBATIM:
                continue
            v = getattr(value, f.name)
            new = fill_all(v, flags, host, target)
            if new is not v:
                try:
                    object.__setattr__(value, f.name, new)
                except (AttributeError, TypeError):
                    pass
        return value
    return value


def fill_error(exc, flags: tuple[str, ...] = (), host: str | None = None, target: str | None = None):
    """The error with its message and hint filled (in place)."""
    exc.message = fill(exc.message, flags, host or exc.host, target)
    if exc.hint:
        exc.hint = fill(exc.hint, flags, host or exc.host, target)
    if exc.details:
        fill_all(exc.details, flags, host or exc.host, target)
    return exc
