"""The inventory's records: ``Host`` (one host, the values the inventory set) and ``Inventory``
(hosts, groups, the default; ``resolve`` of a command-line target). Filled by inventory.py from our
YAML format and by ansible_inventory.py from Ansible's."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from remote_ops.errors import UsageError
from remote_ops.yamlsrc import YamlDoc


@dataclass(frozen=True)
class Host:
    """One host of the inventory, with the values the inventory set (None where unset)."""

    name: str
    hostname: str
    port: int | None = None
    user: str | None = None
    identity_file: tuple[str, ...] = ()
    proxy_jump: tuple[str, ...] | None = None   # None: fall back to ~/.ssh/config; () : none
    known_hosts: str | None = None
    python: str | None = None   # None: python3 on the PATH of the account's login shell
    workdir: str | None = None
    env: dict = field(default_factory=dict, hash=False, compare=False)
    vars: dict = field(default_factory=dict, hash=False, compare=False)
    playbook: str | None = None
    connect_timeout: float | None = None   # None: ssh_config's ConnectTimeout, else 10 s
    keepalive: int | None = None           # None: ssh_config's ServerAliveInterval, else 15 s; 0: off
    inventory_path: str | None = None
    connection: str = "ssh"   # "local": the agent runs in a subprocess of the controller (no SSH)

    def resolve_path(self, value: str) -> str:
        """A path from the inventory, relative to the inventory's folder."""
        p = Path(os.path.expanduser(value))
        if not p.is_absolute() and self.inventory_path:
            p = Path(self.inventory_path).parent / p
        return str(p)


@dataclass
class Inventory:
    path: str
    hosts: dict[str, Host]
    groups: dict[str, list[str]]
    default: str | None = None
    doc: YamlDoc | None = None
    format: str = "remote-ops"                        # or "ansible-yaml", "ansible-ini"
    warnings: list[str] = field(default_factory=list)   # printed once when loaded (stderr)
    ignored: dict[str, list[str]] = field(default_factory=dict)   # ansible_* var -> hosts (not used)

    def resolve(self, spec: str | None) -> list[Host]:
        """Hosts named by ``spec``: a host, a group, a comma list of either, or None for the default."""
        if not spec:
            if self.default:
                if self.default not in self.hosts and self.default not in self.groups:
                    line = self.doc.line("default") if self.doc else None
                    hint = ("start it with: remote-ops sandbox up" if self.default == "sandbox"
                            else "fix 'default' or name a host on the command line")
                    raise UsageError(f"{self.path}:{line}: default host {self.default!r} is not defined", hint)
                if self.default in self.groups:
                    return [self.hosts[n] for n in self.groups[self.default]]
                return [self.hosts[self.default]]
            if len(self.hosts) == 1:
                return list(self.hosts.values())
            raise UsageError(f"{self.path}: no host given and the inventory has no 'default'",
                             f"name a host ({', '.join(sorted(self.hosts)) or 'none defined'}) "
                             "or add 'default: NAME'")
        out: list[Host] = []
        for part in [p.strip() for p in spec.split(",") if p.strip()]:
            if part in self.hosts:
                names = [part]
            elif part in self.groups:
                names = self.groups[part]
            elif part == "all":
                names = list(self.hosts)
            else:
                from remote_ops.suggest import closest
                known = sorted(self.hosts) + sorted(self.groups)
                best = closest(part, known)
                if best:
                    raise UsageError(f"{self.path}: unknown host or group {part!r}: did you mean {best!r}?")
                raise UsageError(f"{self.path}: unknown host or group {part!r}",
                                 f"known: {', '.join(known) if known else 'none'}")
            for name in names:
                if self.hosts[name] not in out:
                    out.append(self.hosts[name])
        if not out:
            raise UsageError(f"{self.path}: {spec!r} names no hosts")
        return out


def is_slurm(host) -> bool:
    """A cluster's login node: the inventory var ``scheduler: slurm`` (extract/slurm.py runs its jobs)."""
    return str((getattr(host, "vars", None) or {}).get("scheduler", "")).lower() == "slurm"
