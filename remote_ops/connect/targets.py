"""What a command-line target names: an inventory host or group, or an ad-hoc host.

Order, for each comma-separated part (so an inventory host always wins over an alias of the same
name):

1. a host of the inventory, a group of the inventory, or ``all``;
2. ``localhost`` (bare): a local connection, the agent in a subprocess of the controller;
3. ``[user@]host[:port]`` with an ``@``, a ``:`` or a ``.`` in it (``[v6]:port`` too): that address,
   completed by ``~/.ssh/config`` as ``ssh`` would (HostName, Port, User, IdentityFile, ProxyJump,
   UserKnownHostsFile; the typed user and port win);
4. a name ``~/.ssh/config`` describes (a literal ``Host`` name, or one whose lookup sets HostName);
5. anything else is refused with exit 2 and the closest known name (a bare single word is never
   looked up in DNS by accident: write ``user@name`` or ``name:22`` to mean a DNS name).

Per-host settings only an inventory can give come from flags (``--python``, ``--workdir``,
``--playbook``) or defaults (``python3`` on the PATH of the account's login shell).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from remote_ops.errors import UsageError
from remote_ops.connect.inventory import Host, Inventory
from remote_ops.suggest import closest

LOCAL_NAME = "localhost"


def parse_address(text: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` / ``[user@][v6addr]:port`` -> (user, host, port)."""
    user, sep, rest = text.rpartition("@")
    if sep and not user:
        raise UsageError(f"{text!r}: empty user name before '@'")
    port_text = None
    if rest.startswith("["):
        host, close, tail = rest[1:].partition("]")
        if not close or (tail and not tail.startswith(":")):
            raise UsageError(f"{text!r}: write an IPv6 address as [addr] or [addr]:port")
        port_text = tail[1:] if tail else None
    elif rest.count(":") == 1:
        host, port_text = rest.split(":")
    else:
        host = rest          # a bare IPv6 address has several colons and no port
    if not host:
        raise UsageError(f"{text!r}: no host name")
    port = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise UsageError(f"{text!r}: port must be a number 1-65535, got {port_text!r}")
        port = int(port_text)
    return (user or None), host, port


def looks_like_address(part: str) -> bool:
    return any(c in part for c in "@:.")


def adhoc_host(part: str, ssh_cfg) -> Host | None:
    """The ad-hoc host ``part`` names, or None when it names nothing known."""
    from remote_ops.connect import sshconfig

    if part == LOCAL_NAME:
        return Host(name=part, hostname=LOCAL_NAME, connection="local")
    if looks_like_address(part):
        user, host, port = parse_address(part)
        return Host(name=part, hostname=host, port=port, user=user)
    if sshconfig.is_alias(ssh_cfg, part):
        # hostname stays the alias: the transport looks it up in ~/.ssh/config like ssh does
        return Host(name=part, hostname=part)
    return None


def resolve(inv: Inventory, spec: str | None, ssh_cfg=None) -> list[Host]:
    """Hosts named by ``spec`` (None: the inventory's default)."""
    if not spec:
        if not inv.hosts and inv.doc is None:
            raise UsageError(f"no host given and no inventory ({inv.path} not found)",
                             "name one: user@host[:port], an ~/.ssh/config alias, or -i hosts.yml")
        return inv.resolve(None)
    cfg_box: list[Any] = [ssh_cfg]

    def cfg():
        if cfg_box[0] is None:
            from remote_ops.connect import sshconfig
            cfg_box[0] = sshconfig.load()
        return cfg_box[0]

    out: list[Host] = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        if part in inv.hosts or part in inv.groups or part == "all":
            found = inv.resolve(part)
        else:
            host = adhoc_host(part, cfg())
            if host is None:
                raise unknown(inv, part, cfg())
            found = [host]
        for h in found:
            if h not in out:
                out.append(h)
    if not out:
        raise UsageError(f"{inv.path}: {spec!r} names no hosts")
    return out


def unknown(inv: Inventory, part: str, ssh_cfg) -> UsageError:
    from remote_ops.connect import sshconfig

    known = list(inv.hosts) + list(inv.groups) + sshconfig.aliases(ssh_cfg)
    best = closest(part, known)
    where = f"{inv.path}: " if inv.doc is not None else ""
    if best:
        return UsageError(f"{where}unknown host or group {part!r}: did you mean {best!r}?")
    return UsageError(f"{where}unknown host or group {part!r}",
                      "not in the inventory nor ~/.ssh/config; for another machine write "
                      f"user@{part} or {part}:22")


def with_overrides(hosts: list[Host], *, python: str | None = None, workdir: str | None = None) -> list[Host]:
    """``--python`` / ``--workdir`` replace the host's own values (explicit flag > inventory > default)."""
    changes = {k: v for k, v in (("python", python), ("workdir", workdir)) if v is not None}
    return [dataclasses.replace(h, **changes) for h in hosts] if changes else hosts


def names_one_host(inv: Inventory, spec: str | None) -> bool:
    """Whether ``spec`` names one host (a host or ad-hoc target), not a group, ``all`` or a list;
    the JSON shape depends on this, never on how many hosts a group happens to hold."""
    if not spec:
        spec = inv.default
        if not spec:
            return True                    # an inventory with one host and no default
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    return len(parts) == 1 and parts[0] != "all" and (parts[0] in inv.hosts or parts[0] not in inv.groups)
