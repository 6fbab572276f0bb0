"""Ansible inventories (YAML and INI), read directly into our ``Inventory``.

Why not ansible-core's ``InventoryManager``: it is GPL-3.0 (remote-ops would have to link it), it
pulls in Jinja2 and Ansible's plugin loader (a large controller dependency, imported by every
command that reads an inventory), and its current releases (2.20, 2.21) need Python >= 3.12 on the controller
while remote-ops supports 3.10 (ansible-core's release matrix). The static
formats are small and documented; no maintained standalone parser exists on PyPI (the packages
named after Ansible inventories generate or graph them). So the YAML form is read with PyYAML
(through ``yamlsrc``, for file:line errors) and the INI form by the ~80 lines below, following
Ansible's ``ini`` plugin: ``[group]``, ``[group:vars]``, ``[group:children]``, ``host:port``,
inline ``key=value`` as Python literals, ``:vars`` values as strings, ``#``/``;`` comments,
host ranges ``web[01:20]``/``db-[a:f]``/``[0:10:2]``. ``group_vars/`` and ``host_vars/`` beside
the inventory are read too, with Ansible's precedence (all < parent group < child group < host;
a ``group_vars`` file over the inventory file's vars for the same group).

Not supported (say so, do not guess): Jinja2 templates in the variables we map (refused with the
host and variable), ``!vault`` values (a YAML error naming the line), dynamic inventory scripts
and plugins (``ansible-inventory -i SRC --list -y > hosts.yml`` writes a static YAML one that is),
inventory directories.

Mapping (the rest of the ``ansible_*`` variables are listed once on stderr, never silently dropped;
other variables become the host's ``vars`` for playbooks):
  ansible_host / ansible_ssh_host            -> hostname
  ansible_port / ansible_ssh_port            -> port
  ansible_user / ansible_ssh_user            -> user
  ansible_ssh_private_key_file / ansible_private_key_file -> identity_file
  ansible_python_interpreter                 -> python (auto*: python3 from the login shell's PATH)
  ansible_connection                         -> ssh (ssh, paramiko, smart) or local; other kinds: host left out
  ansible_ssh_common_args / ansible_ssh_extra_args: -J, -o ProxyJump=, -o ProxyCommand='ssh -W %h:%p
      [-p P] [-l U] [user@]host' -> proxy_jump; -o UserKnownHostsFile/Port/User/IdentityFile/
      ConnectTimeout/ServerAliveInterval, -i, -p, -l -> the same settings
  remote_ops_workdir / remote_ops_playbook / remote_ops_env -> workdir / playbook / env
"""

from __future__ import annotations

import ast
import re
import shlex
import string
from pathlib import Path
from typing import Any

from remote_ops.errors import ConfigError
from remote_ops.connect.hosts import Host, Inventory

GROUP_KEYS = {"hosts", "children", "vars"}
SSH_KINDS = {"ssh", "paramiko", "smart"}
_RANGE = re.compile(r"^(.*?)\[([0-9a-zA-Z]+):([0-9a-zA-Z]+)(?::([0-9]+))?\](.*)$")


# ---------------------------------------------------------------------------------- detection
def is_ini(path: str) -> bool:
    p = Path(path).expanduser()
    if p.suffix in (".yml", ".yaml", ".json"):
        return False
    if p.suffix in (".ini", ".cfg"):
        return True
    try:
        lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return False           # load_file reports it
    for line in lines:
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("---") or re.match(r"^[^\s=]+\s*:(\s|$)", s):
            return False       # a YAML mapping
        return s.startswith("[") or "=" in s or re.match(r"^[^\s:]+(:\d+)?$", s) is not None
    return False


def is_ansible_yaml(data: Any, our_keys: set) -> bool:
    if not isinstance(data, dict) or not data or set(data) <= our_keys:
        return False
    # "all" is Ansible's root group; otherwise every top-level value must look like a group
    return "all" in data or all(v is None or (isinstance(v, dict) and set(v) & GROUP_KEYS) for v in data.values())


# ---------------------------------------------------------------------------------- model
class _Tree:
    """Groups (hosts, children, vars) and host vars as the file states them, before mapping."""

    def __init__(self, path: str):
        self.path = path
        self.groups: dict[str, dict] = {}
        self.hosts: dict[str, dict] = {}          # name -> inline vars (merged over appearances)
        self.lines: dict[str, int | None] = {}    # host -> first line

    def group(self, name: str) -> dict:
        return self.groups.setdefault(name, {"hosts": [], "children": [], "vars": {}})

    def add_host(self, group: str, pattern: str, variables: dict, line: int | None) -> None:
        for name in expand_range(pattern, self.path, line):
            port = None
            if name.count(":") == 1 and not name.startswith("["):
                name, port_text = name.split(":")
                if not port_text.isdigit():
                    raise ConfigError(self.path, line, f"host {name!r}: port {port_text!r} is not a number")
                port = int(port_text)
            entry = self.hosts.setdefault(name, {})
            if port is not None:
                entry["ansible_port"] = port
            entry.update(variables)
            self.lines.setdefault(name, line)
            g = self.group(group)
            if name not in g["hosts"]:
                g["hosts"].append(name)


def expand_range(pattern: str, path: str, line: int | None) -> list[str]:
    """Ansible host ranges: ``web[01:03]`` -> web01 web02 web03; letters and a stride too."""
    m = _RANGE.match(pattern)
    if not m:
        return [pattern]
    head, beg, end, step, tail = m.groups()
    step_n = int(step) if step else 1
    if beg.isdigit() and end.isdigit():
        width = len(beg) if beg.startswith("0") else 0
        if int(end) < int(beg) or step_n < 1:
            raise ConfigError(path, line, f"host range {pattern!r} is empty")
        items = [str(i).zfill(width) for i in range(int(beg), int(end) + 1, step_n)]
    elif len(beg) == 1 and len(end) == 1 and beg.isalpha() and end.isalpha():
        letters = string.ascii_letters
        i, j = letters.index(beg), letters.index(end)
        if j < i:
            raise ConfigError(path, line, f"host range {pattern!r} is empty")
        items = list(letters[i:j + 1:step_n])
    else:
        raise ConfigError(path, line, f"unreadable host range {pattern!r}", "write [01:20] or [a:f]")
    return [name for item in items for name in expand_range(head + item + tail, path, line)]


# ---------------------------------------------------------------------------------- YAML
def from_yaml(doc) -> Inventory:
    tree = _Tree(doc.path)

    def walk(name: str, body: Any, where: tuple) -> None:
        tree.group(name)
        if body is None:
            return
        if not isinstance(body, dict):
            raise doc.error(where, f"Ansible group {name!r} must be a mapping of hosts/children/vars")
        for key in body:
            if key not in GROUP_KEYS:
                raise doc.error(where + (key,), f"unknown key {key!r} in Ansible group {name!r}",
                                "an Ansible group has hosts, children and vars")
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise doc.error(where + ("hosts",), f"hosts of group {name!r} must be a mapping of host -> vars")
        for hname, hvars in hosts.items():
            if hvars is not None and not isinstance(hvars, dict):
                raise doc.error(where + ("hosts", hname), f"vars of host {hname!r} must be a mapping")
            tree.add_host(name, str(hname), dict(hvars or {}), doc.line(*where, "hosts", hname))
        gvars = body.get("vars") or {}
        if not isinstance(gvars, dict):
            raise doc.error(where + ("vars",), f"vars of group {name!r} must be a mapping")
        tree.group(name)["vars"].update(gvars)
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise doc.error(where + ("children",), f"children of group {name!r} must be a mapping of groups")
        for child, cbody in children.items():
            if child not in tree.group(name)["children"]:
                tree.group(name)["children"].append(str(child))
            walk(str(child), cbody, where + ("children", child))

    for gname, body in doc.data.items():
        walk(str(gname), body, (gname,))
    # as in Ansible, a host listed only under "all" is in "ungrouped"
    grouped = {h for g, body in tree.groups.items() if g != "all" for h in body["hosts"]}
    for h in tree.group("all")["hosts"]:
        if h not in grouped:
            tree.add_host("ungrouped", h, {}, tree.lines.get(h))
    return _build(tree, "ansible-yaml", doc)


# ---------------------------------------------------------------------------------- INI
def _literal(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def load_ini(path: str) -> Inventory:
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, None, f"cannot read: {exc}") from None
    tree = _Tree(path)
    group, kind = "ungrouped", "hosts"
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            m = re.match(r"^\[([^\]:]+)(?::(\w+))?\]\s*(?:[#;].*)?$", line)
            if not m or (m.group(2) and m.group(2) not in ("vars", "children")):
                raise ConfigError(path, lineno, f"unreadable section {line!r}",
                                  "write [group], [group:vars] or [group:children]")
            group, kind = m.group(1), m.group(2) or "hosts"
            tree.group(group)
            continue
        if kind == "vars":
            if "=" not in line:
                raise ConfigError(path, lineno, f"[{group}:vars] wants key=value, got {line!r}")
            k, v = line.split("=", 1)
            tree.group(group)["vars"][k.strip()] = v.strip()          # strings, as Ansible reads them
        elif kind == "children":
            child = line.split()[0]
            tree.group(child)
            if child not in tree.group(group)["children"]:
                tree.group(group)["children"].append(child)
        else:
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as exc:
                raise ConfigError(path, lineno, f"unreadable host line: {exc}") from None
            if not tokens:
                continue
            variables = {}
            for tok in tokens[1:]:
                if "=" not in tok:
                    raise ConfigError(path, lineno, f"host {tokens[0]!r}: expected key=value, got {tok!r}")
                k, v = tok.split("=", 1)
                variables[k] = _literal(v)
            tree.add_host(group, tokens[0], variables, lineno)
    return _build(tree, "ansible-ini", None)


# ---------------------------------------------------------------------------------- vars + mapping
def _vars_dir(root: Path, kind: str, name: str) -> dict:
    """group_vars/NAME(.yml|.yaml|.json|) or group_vars/NAME/*.y*ml beside the inventory."""
    import yaml

    base = root / kind
    files = [base / (name + ext) for ext in ("", ".yml", ".yaml", ".json")]
    d = base / name
    if d.is_dir():
        files += sorted(f for f in d.iterdir() if f.suffix in (".yml", ".yaml", ".json", ""))
    out: dict = {}
    for f in files:
        if f.is_file():
            try:
                data = yaml.safe_load(f.read_text(encoding="utf-8"))
            except yaml.YAMLError as exc:
                line = getattr(getattr(exc, "problem_mark", None), "line", None)
                raise ConfigError(str(f), None if line is None else line + 1, f"YAML error: {exc}") from None
            if data is not None and not isinstance(data, dict):
                raise ConfigError(str(f), None, "a vars file must be a mapping")
            out.update(data or {})
    return out


def _build(tree: _Tree, fmt: str, doc) -> Inventory:
    root = Path(tree.path).expanduser().parent
    groups = tree.groups
    groups.setdefault("all", {"hosts": [], "children": [], "vars": {}})
    child_of = {c for g in groups.values() for c in g["children"]}
    for name in groups:                    # top-level groups are children of all
        if name != "all" and name not in child_of and name not in groups["all"]["children"]:
            groups["all"]["children"].append(name)
    if "ungrouped" in groups and not groups["ungrouped"]["hosts"] and not groups["ungrouped"]["children"]:
        groups["all"]["children"].remove("ungrouped")
        del groups["ungrouped"]

    depth: dict[str, int] = {"all": 0}
    parents: dict[str, set] = {n: set() for n in groups}
    for name, g in groups.items():
        for c in g["children"]:
            parents[c].add(name)

    def depth_of(name: str, seen=()) -> int:
        if name in depth:
            return depth[name]
        if name in seen:
            raise ConfigError(tree.path, None, f"group {name!r} is its own ancestor")
        depth[name] = 1 + max((depth_of(p, seen + (name,)) for p in parents[name]), default=0)
        return depth[name]

    def members(name: str, seen=()) -> list[str]:
        if name in seen:
            raise ConfigError(tree.path, None, f"group {name!r} is its own ancestor")
        out = list(groups[name]["hosts"])
        for c in groups[name]["children"]:
            out += [h for h in members(c, seen + (name,)) if h not in out]
        return out

    all_members = {name: members(name) for name in groups}
    for name in groups:
        depth_of(name)
    gvars = {name: {**g["vars"], **_vars_dir(root, "group_vars", name)} for name, g in groups.items()}

    hosts: dict[str, Host] = {}
    ignored: dict[str, list[str]] = {}
    left_out: list[str] = []
    order = all_members["all"] + [h for h in tree.hosts if h not in all_members["all"]]
    for hname in order:
        mine = sorted((g for g in groups if hname in all_members[g] or g == "all"),
                      key=lambda g: (depth[g], g))
        merged: dict = {}
        for g in mine:
            merged.update(gvars[g])
        merged.update(tree.hosts.get(hname, {}))
        merged.update(_vars_dir(root, "host_vars", hname))
        host, unused = _map_host(hname, merged, tree.path, tree.lines.get(hname))
        for var in unused:
            ignored.setdefault(var, []).append(hname)
        if host is None:
            left_out.append(f"{hname} ({merged.get('ansible_connection')})")
            continue
        hosts[hname] = host
    out_groups = {name: [h for h in all_members[name] if h in hosts] for name in groups if name != "all"}
    warnings = []
    if ignored:
        listed = "; ".join(f"{var} ({', '.join(hs[:3])}{', ...' if len(hs) > 3 else ''})"
                           for var, hs in sorted(ignored.items()))
        warnings.append(f"{tree.path}: Ansible settings remote-ops does not use, ignored: {listed}")
    if left_out:
        warnings.append(f"{tree.path}: hosts left out, their ansible_connection is not ssh or local: "
                        + ", ".join(left_out))
    return Inventory(tree.path, hosts, out_groups, None, doc, format=fmt, warnings=warnings, ignored=ignored)


def _text(value: Any, hname: str, var: str, path: str, line: int | None) -> str:
    s = str(value)
    if "{{" in s or "{%" in s:
        raise ConfigError(path, line, f"host {hname!r}: {var} is a Jinja2 template ({s!r})",
                          "remote-ops does not evaluate templates; set the value itself")
    return s


def _int(value: Any, hname: str, var: str, path: str, line: int | None) -> int:
    s = _text(value, hname, var, path, line)
    if not s.isdigit() or not 0 < int(s) < 65536:
        raise ConfigError(path, line, f"host {hname!r}: {var} must be a port number, got {s!r}")
    return int(s)


def _map_host(hname: str, v: dict, path: str, line: int | None) -> tuple[Host | None, list[str]]:
    unused: list[str] = []
    kw: dict[str, Any] = {"name": hname, "hostname": hname, "inventory_path": path}

    def first(*names):
        for n in names:
            if n in v and v[n] is not None:
                return n, v[n]
        return None, None

    n, val = first("ansible_host", "ansible_ssh_host")
    if n:
        kw["hostname"] = _text(val, hname, n, path, line)
    n, val = first("ansible_port", "ansible_ssh_port")
    if n:
        kw["port"] = _int(val, hname, n, path, line)
    n, val = first("ansible_user", "ansible_ssh_user")
    if n:
        kw["user"] = _text(val, hname, n, path, line)
    n, val = first("ansible_ssh_private_key_file", "ansible_private_key_file")
    if n:
        kw["identity_file"] = (_text(val, hname, n, path, line),)
    n, val = first("ansible_python_interpreter")
    if n:
        py = _text(val, hname, n, path, line)
        kw["python"] = None if py.startswith("auto") else py
    n, val = first("ansible_connection")
    conn = _text(val, hname, n, path, line) if n else "ssh"
    if conn == "local":
        kw["connection"] = "local"
        kw["hostname"] = "localhost" if "ansible_host" not in v else kw["hostname"]
    elif conn not in SSH_KINDS:
        return None, []
    for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if v.get(var):
            unused += _ssh_args(_text(v[var], hname, var, path, line), kw, var, path, line, hname)
    if "remote_ops_workdir" in v:
        kw["workdir"] = _text(v["remote_ops_workdir"], hname, "remote_ops_workdir", path, line)
    if "remote_ops_playbook" in v:
        kw["playbook"] = _text(v["remote_ops_playbook"], hname, "remote_ops_playbook", path, line)
    if isinstance(v.get("remote_ops_env"), dict):
        kw["env"] = {str(k): "" if x is None else str(x) for k, x in v["remote_ops_env"].items()}
    mapped = {"ansible_host", "ansible_ssh_host", "ansible_port", "ansible_ssh_port", "ansible_user",
              "ansible_ssh_user", "ansible_ssh_private_key_file", "ansible_private_key_file",
              "ansible_python_interpreter", "ansible_connection", "ansible_ssh_common_args",
              "ansible_ssh_extra_args"}
    unused += [k for k in v if k.startswith("ansible_") and k not in mapped]
    kw["vars"] = {k: x for k, x in v.items() if not k.startswith(("ansible_", "remote_ops_"))}
    return Host(**kw), unused


def _proxy_from_command(cmd: str) -> str | None:
    """``ssh -W %h:%p [-p P] [-l U] [-q] [user@]bastion`` -> ``[user@]bastion[:P]``."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        return None
    if not words or Path(words[0]).name != "ssh" or "-W" not in words:
        return None
    user = port = dest = None
    i = 1
    while i < len(words):
        w = words[i]
        if w in ("-W", "-p", "-l", "-i", "-o", "-F", "-J"):
            if i + 1 >= len(words):
                return None
            arg = words[i + 1]
            if w == "-p":
                port = arg
            elif w == "-l":
                user = arg
            elif w in ("-i", "-o", "-F", "-J"):
                return None            # more than a plain jump: not a ProxyJump equivalent
            i += 2
            continue
        if w.startswith("-"):
            if set(w[1:]) - set("qCvTNn46"):
                return None
        elif dest is None:
            dest = w
        else:
            return None                # a remote command: not a plain jump
        i += 1
    if dest is None:
        return None
    if user and "@" not in dest:
        dest = f"{user}@{dest}"
    return f"{dest}:{port}" if port else dest


def _ssh_args(args: str, kw: dict, var: str, path: str, line: int | None, hname: str) -> list[str]:
    """Map the ssh options we have settings for; return the rest as ``var: option`` for the report."""
    try:
        words = shlex.split(args)
    except ValueError as exc:
        raise ConfigError(path, line, f"host {hname!r}: unreadable {var}: {exc}") from None
    unused = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("-o", "-J", "-i", "-p", "-l") and i + 1 < len(words):
            opt, arg, i = w, words[i + 1], i + 2
        elif w[:2] in ("-o", "-J", "-i", "-p", "-l") and len(w) > 2:
            opt, arg, i = w[:2], w[2:], i + 1
        else:
            unused.append(f"{var}: {w}")
            i += 1
            continue
        if opt == "-o":
            key, _, value = arg.partition("=") if "=" in arg else arg.partition(" ")
            key, value = key.strip().lower(), value.strip()
            opt = {"proxyjump": "-J", "identityfile": "-i", "port": "-p", "user": "-l"}.get(key, opt)
            if key == "proxycommand":
                jump = _proxy_from_command(value)
                if jump is None:
                    unused.append(f"{var}: -o ProxyCommand={value}")
                    continue
                opt, arg = "-J", jump
            elif key == "userknownhostsfile":
                kw["known_hosts"] = value.split()[0]
                continue
            elif key == "connecttimeout" and value.isdigit():
                kw["connect_timeout"] = float(value)
                continue
            elif key == "serveraliveinterval" and value.isdigit():
                kw["keepalive"] = int(value)
                continue
            elif opt == "-o":
                unused.append(f"{var}: -o {arg}")
                continue
            else:
                arg = value
        if opt == "-J":
            hops = tuple(h.strip() for h in arg.split(",") if h.strip())
            kw["proxy_jump"] = () if [h.lower() for h in hops] == ["none"] else hops
        elif opt == "-i":
            kw["identity_file"] = (arg,)
        elif opt == "-p":
            kw["port"] = _int(arg, hname, var, path, line)
        elif opt == "-l":
            kw["user"] = arg
    return unused
