"""~/.ssh/config as OpenSSH reads it, through paramiko's SSHConfig, plus what paramiko leaves out.

paramiko's parser does Host patterns (with negation), ``%h``-style tokens, canonicalisation and
``Match`` with ``all``, ``canonical``, ``final``, ``exec``, ``host``, ``originalhost``, ``user``
and ``localuser``. What it does not do, and what this module does about it:

- ``Include``: paramiko stores it as an ordinary setting and reads nothing. Here it is expanded
  in place before paramiko parses the text (globs, ``~``, paths relative to ``~/.ssh``, nesting
  up to 16 levels like OpenSSH). After an included file that opens its own ``Host``/``Match``
  blocks, the including block's header is repeated, so lines after the ``Include`` keep the scope
  they have in OpenSSH.
- ``Match`` keywords paramiko does not know (``tagged``, ``localnetwork``, ``version``,
  ``sessiontype``, ``command``): paramiko treats an unknown keyword as matching, so such a block
  would apply to every host. They are refused with the file and line instead.
- ``Match user`` is tested against the ``User`` the config sets (else the local user), not the
  ``user@`` typed on the command line, as paramiko does; OpenSSH uses the typed one.
- Only HostName, Port, User, IdentityFile, ProxyJump, UserKnownHostsFile, ConnectTimeout and
  ServerAliveInterval are used to connect (``transport.Session``); ProxyCommand, certificates,
  ControlMaster and the other options are not.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import threading
from pathlib import Path

from remote_ops.errors import ConfigError

PARAMIKO_MATCH = {"all", "canonical", "final", "exec", "host", "originalhost", "user", "localuser"}
MAX_DEPTH = 16
_KEY_RE = re.compile(r"\s*(\w+)(?:\s*=\s*|\s+)(.*)")


def default_path() -> str:
    return os.path.expanduser(os.environ.get("REMOTE_OPS_SSH_CONFIG") or "~/.ssh/config")


def expand_text(path: str, depth: int = 0) -> str:
    """The config file's text with every ``Include`` replaced by the files it names."""
    p = Path(path)
    text = p.read_text(encoding="utf-8", errors="replace")
    out: list[str] = []
    header = "Host *"          # the block the next line belongs to
    for lineno, raw in enumerate(text.splitlines(), 1):
        m = _KEY_RE.match(raw)
        key = m.group(1).lower() if m and not raw.lstrip().startswith("#") else ""
        if key in ("host", "match"):
            header = raw.strip()
            if key == "match":
                _check_match(m.group(2), path, lineno)
        if key != "include":
            out.append(raw)
            continue
        if depth >= MAX_DEPTH:
            raise ConfigError(path, lineno, f"Include nested deeper than {MAX_DEPTH} levels")
        try:
            patterns = shlex.split(m.group(2))
        except ValueError as exc:
            raise ConfigError(path, lineno, f"unreadable Include line: {exc}") from None
        opened_block = False
        for pattern in patterns:
            pat = os.path.expanduser(pattern)
            if not os.path.isabs(pat):
                pat = os.path.join(os.path.expanduser("~/.ssh"), pat)
            for inc in sorted(glob.glob(pat)):
                if os.path.isdir(inc):
                    continue
                body = expand_text(inc, depth + 1)
                out.append(f"# remote-ops: begin Include {inc}")
                out.append(body)
                out.append(f"# remote-ops: end Include {inc}")
                opened_block = opened_block or any(
                    (km := _KEY_RE.match(b)) and km.group(1).lower() in ("host", "match")
                    for b in body.splitlines() if not b.lstrip().startswith("#"))
        if opened_block:
            out.append(header)    # back to the including block, as OpenSSH scopes it
    return "\n".join(out) + "\n"


def _check_match(value: str, path: str, lineno: int) -> None:
    try:
        words = shlex.split(value)
    except ValueError:
        return   # paramiko reports the unparsable line itself
    i = 0
    while i < len(words):
        kw = words[i].lstrip("!").lower()
        if kw not in PARAMIKO_MATCH:
            raise ConfigError(path, lineno, f"'Match {kw}' is not supported by paramiko's ssh_config parser",
                              f"supported: {', '.join(sorted(PARAMIKO_MATCH))}; use a Host block for this host")
        i += 1 if kw in ("all", "canonical", "final") else 2


# Parsed configs of this process, by their expanded text: a fleet looks every host up in one
# config, which is then parsed once (the files are still read each time, so an edit, or a new
# file an Include glob matches, is seen at once). Lookups only read the parsed object; ``Match
# exec`` still runs at each lookup.
_parsed: dict = {}
_parsed_lock = threading.Lock()


def load(path: str | None = None):
    """A paramiko ``SSHConfig`` for ``path`` (default ``$REMOTE_OPS_SSH_CONFIG`` or ``~/.ssh/config``)."""
    import paramiko

    p = os.path.expanduser(path) if path else default_path()
    if not os.path.exists(p):
        return paramiko.SSHConfig()
    text = expand_text(p)
    with _parsed_lock:
        cfg = _parsed.get((p, text))
        if cfg is not None:
            return cfg
        try:
            cfg = paramiko.SSHConfig.from_text(text)
        except paramiko.ssh_exception.ConfigParseError as exc:
            raise ConfigError(p, None, f"cannot parse ssh config: {exc}") from None
        if len(_parsed) >= 8:
            _parsed.clear()
        _parsed[(p, text)] = cfg
        return cfg


def lookup(cfg, name: str) -> dict:
    """``cfg.lookup(name)``; ``{}`` for an empty config (no file): paramiko would still expand its
    default tokens for every host (the local user from the password database, twice) to answer
    nothing but ``{"hostname": name}``, which callers take as their default anyway."""
    if cfg is None or getattr(cfg, "_config", None) == []:
        return {}
    return cfg.lookup(name)


def aliases(cfg) -> list[str]:
    """Host names written literally (no wildcard, no negation) in ``Host`` lines."""
    out = []
    # paramiko's get_hostnames() raises KeyError once a Match block exists: read the blocks
    names = [n for entry in getattr(cfg, "_config", []) for n in entry.get("host", [])]
    for name in names:
        if name and not any(c in name for c in "*?!") and name not in out:
            out.append(name)
    return out


def is_alias(cfg, name: str) -> bool:
    """Whether OpenSSH would treat ``name`` as something the config describes: a literal ``Host``
    name, or a name whose lookup rewrites the HostName (e.g. ``Host gpu*`` + ``HostName %h.lan``)."""
    if name in aliases(cfg):
        return True
    try:
        return cfg.lookup(name).get("hostname", name) != name
    except Exception:  # a Match exec that fails is not an alias
        return False
