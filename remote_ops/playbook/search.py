"""Where a playbook is found: an explicit path, or a name looked up along one search order.

    1. an explicit path (``--playbook ./mine.yaml``, ``playbook: books/x.yaml`` relative to the inventory)
    2. ``playbooks/`` beside the inventory file                          origin ``inventory``
    3. ``$XDG_CONFIG_HOME/remote-ops/playbooks`` (else ``~/.config/...``)  origin ``user``
    4. the playbooks shipped inside the package (``remote_ops/playbook/shipped/``, read through
       ``importlib.resources``)                                          origin ``shipped``

A name is a file's stem (``eagle3-speculators-0.3.0`` is ``eagle3-speculators-0.3.0.yaml``); the
first directory that has it wins, and the same name further down is shadowed (``Found.shadows``:
the command that uses it says so once). ``listing`` is every playbook of every directory, in that
order: what ``remote-ops playbooks`` shows, and the one list ``check --candidates`` and a refusal's
"X claims vllm V" pointers choose from (``available``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from remote_ops.errors import ConfigError, UsageError

SUFFIXES = (".yaml", ".yml")
ORIGINS = ("path", "inventory", "user", "shipped")
# how inventories before remote-ops 0.2.0 named a shipped playbook (relative to the checkout)
LEGACY_PREFIX = "playbooks/"


@functools.lru_cache(maxsize=1)
def shipped_dir() -> Path:
    """The shipped playbooks' directory, as the installed package holds it (a wheel, an editable
    install or a checkout: always files on disk; a zipped package is not supported)."""
    from importlib.resources import files

    found = files("remote_ops.playbook") / "shipped"
    if not isinstance(found, Path):
        raise ConfigError(str(found), None, "the shipped playbooks are not files on disk (zipped package?)",
                          "install remote-ops as a wheel or with pip/pipx/uv (not zipped)")
    return found


def user_dir() -> Path:
    """``$XDG_CONFIG_HOME/remote-ops/playbooks``, else ``~/.config/remote-ops/playbooks``."""
    base = os.environ.get("XDG_CONFIG_HOME", "").strip()
    root = Path(base).expanduser() if base and Path(base).expanduser().is_absolute() else Path.home() / ".config"
    return root / "remote-ops" / "playbooks"


def inventory_dir(inventory_path: str | None) -> Path | None:
    """``playbooks/`` beside the inventory file (None without one)."""
    if not inventory_path:
        return None
    return Path(inventory_path).expanduser().absolute().parent / "playbooks"


def search_dirs(inventory_path: str | None) -> list[tuple[str, Path]]:
    """(origin, directory) in search order; a directory reached twice is searched once."""
    dirs = [("inventory", inventory_dir(inventory_path)), ("user", user_dir()), ("shipped", shipped_dir())]
    out, seen = [], set()
    for origin, d in dirs:
        if d is None:
            continue
        key = os.path.realpath(d)
        if key not in seen:
            seen.add(key)
            out.append((origin, d))
    return out


@dataclass
class Found:
    """One playbook file: its name (the file's stem), where it came from, and what it shadows."""

    name: str
    origin: str                     # path | inventory | user | shipped
    path: Path
    shadows: list[tuple[str, Path]] = field(default_factory=list)   # (origin, path) of the same name further down
    note: str | None = None         # said once by the command that uses it (shadowing, a legacy path)

    def shadow_note(self) -> str | None:
        if not self.shadows:
            return None
        hidden = ", ".join(f"the {o} one ({p})" for o, p in self.shadows)
        return f"playbook {self.name}: using {self.path} ({self.origin}), which shadows {hidden}"


def _files(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.suffix in SUFFIXES and p.is_file())
    except OSError:            # absent or unreadable: nothing found there
        return []


def listing(inventory_path: str | None) -> list[Found]:
    """Every playbook file along the search order; a name met again further down is listed too,
    and the first one's ``shadows`` names it."""
    out: list[Found] = []
    first: dict[str, Found] = {}
    for origin, d in search_dirs(inventory_path):
        for p in _files(d):
            f = Found(p.stem, origin, p)
            if p.stem in first:
                first[p.stem].shadows.append((origin, p))
            else:
                first[p.stem] = f
            out.append(f)
    for f in first.values():
        f.note = f.shadow_note()
    return out


def by_name(name: str, inventory_path: str | None) -> Found | None:
    """The first playbook named ``name`` along the search order (None: none)."""
    for f in listing(inventory_path):
        if f.name == name:
            return f
    return None


def is_path(spec: str) -> bool:
    """Whether ``spec`` is written as a path (a separator, a YAML suffix, ~ or .), not a name."""
    return "/" in spec or os.sep in spec or spec.endswith(SUFFIXES) or spec.startswith(("~", "."))


def find(spec: str | None, host=None, inventory_path: str | None = None) -> Found:
    """The playbook ``--playbook SPEC`` names (a path, or a name along the search order), else the
    host's (its inventory's ``playbook:``, a path relative to that inventory, or a name).
    ``inventory_path``: the inventory a ``--playbook`` name is looked up beside (the host's own
    inventory file for its ``playbook:``)."""
    chosen = spec or (host.playbook if host is not None else None)
    if not chosen:
        raise UsageError("no playbook given and the host has no 'playbook' in the inventory",
                         "pass --playbook NAME (see: remote-ops playbooks) or a path")
    inv = (getattr(host, "inventory_path", None) if not spec else None) or inventory_path
    where = f"{host.inventory_path}: host {host.name}'s playbook" if host is not None and not spec and \
        getattr(host, "inventory_path", None) else "--playbook"
    if not is_path(chosen):
        found = by_name(chosen, inv)
        if found is None:
            names = sorted({f.name for f in listing(inv)})
            from remote_ops.suggest import did_you_mean
            hint = did_you_mean(chosen, names)
            raise ConfigError(where, None, f"no playbook named {chosen!r}",
                              (hint + "; " if hint else "") + "the playbooks found: `remote-ops playbooks`")
        return found
    p = Path(chosen).expanduser()
    if host is not None and not spec and not p.is_absolute():
        p = Path(host.resolve_path(chosen))
    if p.is_file():
        return Found(p.stem, "path", p)
    legacy = chosen.replace(os.sep, "/").startswith(LEGACY_PREFIX) and chosen.count("/") == 1
    if legacy and chosen.endswith(SUFFIXES):
        found = by_name(Path(chosen).stem, inv)
        if found is not None:
            found.note = "; ".join(x for x in (
                f"{chosen} is not a file: using the playbook named {found.name} ({found.origin}: {found.path}); "
                f"name it `{found.name}`", found.note) if x)
            return found
    raise ConfigError(str(p), None, "playbook not found",
                      "give an existing file, or a playbook's name (see: remote-ops playbooks)")
