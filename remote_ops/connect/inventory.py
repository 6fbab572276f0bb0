"""The inventory: hosts, groups and the default host, loaded with file:line errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from remote_ops.connect import ansible_inventory
from remote_ops.connect.hosts import Host, Inventory  # noqa: F401  (inventory.Host is the usual import)
from remote_ops.yamlsrc import YamlDoc, load_file, type_name

DEFAULT_INVENTORY = "inventory.yaml"

# key -> (accepted python types, description)
HOST_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "hostname": ((str,), "string"),
    "port": ((int,), "integer"),
    "user": ((str,), "string"),
    "identity_file": ((str, list), "string or list of strings"),
    "proxy_jump": ((str, list), "string or list of strings"),
    "known_hosts": ((str,), "string"),
    "python": ((str,), "string"),
    "workdir": ((str,), "string"),
    "env": ((dict,), "mapping"),
    "vars": ((dict,), "mapping"),
    "playbook": ((str,), "string"),
    "connect_timeout": ((int, float), "number"),
    "keepalive": ((int,), "integer"),
    "connection": ((str,), "string: ssh or local"),
}
CONNECTIONS = ("ssh", "local")
TOP_KEYS = {"hosts", "groups", "default", "include"}


def inventory_path(explicit: str | None = None) -> str:
    return explicit or os.environ.get("REMOTE_OPS_INVENTORY") or DEFAULT_INVENTORY


def _str_list(doc: YamlDoc, keys: tuple, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise doc.error(keys + (i,), f"{keys[-1]} entries must be strings, got {type_name(item)}")
    return tuple(value)


def _number(value: Any, types: tuple) -> Any:
    """A quoted number for a numeric setting (``port: "36267"``, as YAML written by other tools
    has it) is that number; anything else is left for the type check to name."""
    if isinstance(value, str) and int in types:
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            if float in types:
                try:
                    return float(text)
                except ValueError:
                    pass
    return value


def _parse_host(doc: YamlDoc, name: str, entry: Any) -> Host:
    where = ("hosts", name)
    if entry is None:
        entry = {}
    if not isinstance(entry, dict):
        raise doc.error(where, f"host {name!r} must be a mapping, got {type_name(entry)}")
    doc.check_keys(where, entry, HOST_KEYS, f"in host {name!r}")
    entry = {k: _number(v, HOST_KEYS[k][0]) for k, v in entry.items()}
    for key, value in entry.items():
        types, desc = HOST_KEYS[key]
        if isinstance(value, bool) or not isinstance(value, types):
            article = "an" if desc[0] in "aeiou" else "a"
            raise doc.error(where + (key,), f"{key} of host {name!r} must be {article} {desc}, got {type_name(value)}"
                            + (f" {value!r}" if isinstance(value, str) else ""))
    for key in ("env", "vars"):
        for k, v in (entry.get(key) or {}).items():
            if key == "env" and (not isinstance(k, str) or not k.replace("_", "a").isalnum() or k[0].isdigit()):
                raise doc.error(where + (key, k), f"env name {k!r} of host {name!r} is not a valid variable name")
            if key == "env" and isinstance(v, (dict, list)):
                raise doc.error(where + (key, k), f"env value {k!r} of host {name!r} must be a scalar")
            if key == "env" and isinstance(v, str) and "\x00" in v:
                raise doc.error(where + (key, k), f"env value {k!r} of host {name!r} holds a NUL character",
                                "an environment variable cannot carry one")
    port = entry.get("port")
    if port is not None and not 0 < port < 65536:
        raise doc.error(where + ("port",), f"port of host {name!r} must be 1-65535, got {port}")
    timeout = entry.get("connect_timeout")
    if timeout is not None and not 0 < timeout <= 3600:   # also refuses .nan and .inf
        raise doc.error(where + ("connect_timeout",),
                        f"connect_timeout of host {name!r} must be seconds in (0, 3600], got {timeout}")
    keepalive = entry.get("keepalive")
    if keepalive is not None and not 0 <= keepalive <= 86400:
        raise doc.error(where + ("keepalive",),
                        f"keepalive of host {name!r} must be 0-86400 seconds (0: off), got {keepalive}")
    connection = entry.get("connection", "ssh")
    if connection not in CONNECTIONS:
        raise doc.error(where + ("connection",),
                        f"connection of host {name!r} must be one of {', '.join(CONNECTIONS)}, got {connection!r}",
                        "local runs the agent on this machine, without SSH (like Ansible's connection: local)")
    proxy = entry.get("proxy_jump")
    proxy_t = None if proxy is None else _str_list(doc, where + ("proxy_jump",), proxy)
    if proxy_t is not None and [p.lower() for p in proxy_t] == ["none"]:
        proxy_t = ()
    ident = entry.get("identity_file") or ()
    return Host(
        name=name,
        hostname=entry.get("hostname", "localhost" if connection == "local" else name),
        port=port,
        user=entry.get("user"),
        identity_file=_str_list(doc, where + ("identity_file",), ident) if ident else (),
        proxy_jump=proxy_t,
        known_hosts=entry.get("known_hosts"),
        python=entry.get("python"),
        workdir=entry.get("workdir"),
        env={k: "" if v is None else str(v) for k, v in (entry.get("env") or {}).items()},
        vars=dict(entry.get("vars") or {}),
        playbook=entry.get("playbook"),
        connect_timeout=None if timeout is None else float(timeout),
        keepalive=None if keepalive is None else int(keepalive),
        inventory_path=doc.path,
        connection=connection,
    )


def parse(doc: YamlDoc) -> Inventory:
    data = doc.data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise doc.error((), f"the inventory must be a mapping with 'hosts', got {type_name(data)}")
    doc.check_keys((), data, TOP_KEYS, "top-level")
    hosts_raw = data.get("hosts") or {}
    if not isinstance(hosts_raw, dict):
        raise doc.error(("hosts",), f"'hosts' must be a mapping of name -> settings, got {type_name(hosts_raw)}")
    hosts, included_groups, included_default = _included(doc, data.get("include"))
    for name, entry in hosts_raw.items():
        if not isinstance(name, str) or not name or "," in name or name != name.strip() or \
                any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise doc.error(("hosts", name), f"invalid host name {name!r}",
                            "no commas, control characters or surrounding spaces: it is typed on the command line")
        if name in hosts:
            raise doc.error(("hosts", name), f"host {name!r} is also defined in {hosts[name].inventory_path}",
                            "define each host once")
        hosts[name] = _parse_host(doc, name, entry)
    groups_raw = data.get("groups") or {}
    if not isinstance(groups_raw, dict):
        raise doc.error(("groups",), f"'groups' must be a mapping of name -> list of hosts, got {type_name(groups_raw)}")
    groups: dict[str, list[str]] = {}
    for gname, members in groups_raw.items():
        if gname in hosts:
            raise doc.error(("groups", gname), f"group {gname!r} has the same name as a host")
        if not isinstance(members, list):
            raise doc.error(("groups", gname), f"group {gname!r} must be a list of host names, got {type_name(members)}")
        names: list[str] = []
        for i, member in enumerate(members):
            if not isinstance(member, str):
                raise doc.error(("groups", gname, i), f"group {gname!r} must list host names, got {type_name(member)}")
            if member in hosts:
                names.append(member)
            elif isinstance(member, str) and member in groups_raw and member != gname:
                # nested group, one level deep is enough for readable inventories
                inner = groups_raw[member]
                if not isinstance(inner, list) or any(not isinstance(m, str) or m not in hosts for m in inner):
                    raise doc.error(("groups", gname, i), f"group {gname!r} nests {member!r}, which must list hosts only")
                names.extend(inner)
            else:
                raise doc.error(("groups", gname, i), f"group {gname!r} names unknown host {member!r}")
        groups[gname] = list(dict.fromkeys(names))
    for gname, members in included_groups.items():
        groups.setdefault(gname, members)
    default = data.get("default", included_default)
    if default is not None and not isinstance(default, str):
        raise doc.error(("default",), f"default must be a host or group name, got {type_name(default)}")
    inv = Inventory(doc.path, hosts, groups, default, doc)
    return inv


def local_path(path: str | Path) -> Path:
    """The git-ignored companion of an inventory (``inventory.yaml`` -> ``inventory.local.yaml``):
    where ``sandbox up`` writes its host, so the tracked inventory is never rewritten."""
    p = Path(path).expanduser()
    return p.with_name(f"{p.stem}.local{p.suffix or '.yaml'}")


def _included(doc: YamlDoc, include: Any) -> tuple[dict[str, Host], dict[str, list[str]], str | None]:
    """Hosts, groups and default of the files ``include`` names (relative to this inventory). A
    missing file is an error at its line, except the inventory's own git-ignored companion
    (``inventory.local.yaml`` of ``inventory.yaml``, ``local_path``), which ``sandbox up`` writes."""
    if include is None:
        return {}, {}, None
    names = [include] if isinstance(include, str) else include
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise doc.error(("include",), f"include must be a file name or a list of them, got {type_name(include)}")
    hosts: dict[str, Host] = {}
    groups: dict[str, list[str]] = {}
    default = None
    for i, n in enumerate(names):
        p = Path(doc.path).expanduser().parent / Path(n).expanduser()
        if not p.exists():
            if p.resolve() == local_path(doc.path).resolve():
                continue          # written by `remote-ops sandbox up`; absent on a fresh clone
            raise doc.error(("include", i) if isinstance(include, list) else ("include",),
                            f"included inventory {n} not found ({p})",
                            "fix the name, or remove it from include")
        sub = load_file(p)
        if isinstance(sub.data, dict) and "include" in sub.data:
            raise sub.error(("include",), "an included inventory cannot include others", "list them all in one file")
        inv = parse(sub)
        for name, host in inv.hosts.items():
            if name in hosts:
                raise sub.error(("hosts", name), f"host {name!r} is also defined in {hosts[name].inventory_path}")
            hosts[name] = host
        groups.update(inv.groups)
        default = default or inv.default
    return hosts, groups, default


def load(path: str | None = None, *, missing_ok: bool = False) -> Inventory:
    """Our YAML format, or an Ansible inventory (YAML or INI: see ansible_inventory.py)."""
    p = inventory_path(path)
    if missing_ok and not Path(p).expanduser().exists():
        return Inventory(p, {}, {}, None, None)
    if ansible_inventory.is_ini(p):
        return ansible_inventory.load_ini(p)
    doc = load_file(p)
    if ansible_inventory.is_ansible_yaml(doc.data, TOP_KEYS):
        return ansible_inventory.from_yaml(doc)
    return parse(doc)

