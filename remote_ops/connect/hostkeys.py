"""Host-key verification against known_hosts, the way OpenSSH does it (never trust on sight)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko

from remote_ops.errors import HostKeyError


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def host_entry_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def where(entry_name: str) -> str:
    """``host:port`` for people, from a known_hosts name (``[host]:port`` or ``host``, port 22)."""
    if entry_name.startswith("[") and "]:" in entry_name:
        host, _, port = entry_name[1:].rpartition("]:")
        return f"{host}:{port}"
    return f"{entry_name}:22"


def remove_command(entry_name: str, known_hosts: str) -> str:
    """The ssh-keygen line that removes the host's entry, quoted to paste into a shell as printed."""
    import shlex
    return f"ssh-keygen -R {shlex.quote(entry_name)} -f {shlex.quote(str(known_hosts))}"


@dataclass(frozen=True)
class KnownLine:
    """One key line of a known_hosts file. ``marker``: None, "revoked" or "cert-authority"."""

    lineno: int
    marker: str | None
    patterns: tuple[str, ...]
    keytype: str
    blob: bytes

    def matches(self, name: str) -> bool:
        return host_matches(name, self.patterns)

    def pkey(self) -> paramiko.PKey | None:
        """The key as paramiko's object; None for a type paramiko does not know (OpenSSH skips
        such lines for paramiko's purposes too: a key it cannot compare is never a match)."""
        try:
            return paramiko.PKey.from_type_string(self.keytype, self.blob)
        except (paramiko.pkey.UnknownKeyType, paramiko.SSHException, ValueError, TypeError, IndexError):
            return None


@dataclass
class KnownHosts:
    """A parsed known_hosts file: its key lines, markers included, in file order."""

    path: str
    lines: list[KnownLine]

    def for_host(self, name: str) -> list[KnownLine]:
        return [ln for ln in self.lines if ln.matches(name)]

    def revoked(self, name: str, key: paramiko.PKey) -> KnownLine | None:
        """The first ``@revoked`` line that covers ``name`` and holds ``key``."""
        blob = key.asbytes()
        return next((ln for ln in self.for_host(name) if ln.marker == "revoked" and ln.blob == blob), None)

    def authorities(self, name: str) -> list[KnownLine]:
        return [ln for ln in self.for_host(name) if ln.marker == "cert-authority"]


_MARKERS = {"@revoked": "revoked", "@cert-authority": "cert-authority"}


def parse_known_hosts(text: str, path: str = "known_hosts") -> KnownHosts:
    """Every key line of a known_hosts file, as OpenSSH reads it (sshd(8), SSH_KNOWN_HOSTS FILE
    FORMAT): an optional ``@revoked`` / ``@cert-authority`` marker, comma-separated host patterns
    (``*``/``?`` wildcards, ``!`` negation, ``[host]:port``, hashed ``|1|salt|hash``), key type,
    base64 key, comment. A line that is none of these (bad base64, too few fields, an unknown
    marker) is skipped, as OpenSSH skips it: it trusts nothing."""
    lines: list[KnownLine] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = None
        if fields[0].startswith("@"):
            marker = _MARKERS.get(fields[0])
            if marker is None:
                continue
            fields = fields[1:]
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except (binascii.Error, ValueError):
            continue
        lines.append(KnownLine(lineno, marker, tuple(p for p in fields[0].split(",") if p), fields[1], blob))
    return KnownHosts(path, lines)


def _hashed_matches(name: str, entry: str) -> bool:
    parts = entry.split("|")     # "", "1", salt, hash
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt, want = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)


def _pattern_matches(name: str, pattern: str) -> bool:
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.fullmatch(rx, name.lower(), re.DOTALL) is not None


def host_matches(name: str, patterns: tuple[str, ...]) -> bool:
    """OpenSSH's ``match_hostname``: a negated pattern that matches excludes the host whatever
    else matches; otherwise any matching pattern (or hashed name) includes it."""
    found = False
    for p in patterns:
        if p.startswith("|"):
            found = found or _hashed_matches(name, p)
        elif p.startswith("!"):
            if _pattern_matches(name, p[1:]):
                return False
        elif _pattern_matches(name, p):
            found = True
    return found


# known_hosts files parsed in this process: path -> (the file's bytes, KnownHosts). A fleet
# connects to N hosts through one file; parsing it (and matching every line) per host would
# cost N parses. The file is still read for every connection and the parse reused only for the
# same bytes, so any change (e.g. --accept-new appending a line, or an edit within the same
# second) is seen by the next connection.
_parsed: dict[str, tuple[bytes, KnownHosts]] = {}
_parsed_lock = threading.Lock()


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def parsed_known_hosts(path: str) -> KnownHosts:
    """The parsed file, parsed once per process while its bytes are unchanged. Raises OSError."""
    with _parsed_lock:   # fleet threads miss at once: one parses, the others wait for it
        data = _read(path)
        hit = _parsed.get(path)
        if hit is not None and hit[0] == data:
            return hit[1]
        known = parse_known_hosts(data.decode("utf-8", "replace"), path)
        if len(_parsed) >= 64:
            _parsed.clear()
        _parsed[path] = (data, known)
        return known


def load_for(client: paramiko.SSHClient, path: str, hostname: str, port: int) -> None:
    """Give ``client`` the known_hosts keys of ``hostname:port`` (``[host]:port`` for port != 22,
    the name OpenSSH and paramiko look up). Each key type keeps its first line in the file. A key
    that a ``@revoked`` line covering this host names is never given: the server offering it then
    reaches ``VerifyPolicy`` or ``changed_key_error``, which refuse it as revoked."""
    name = host_entry_name(hostname, port)
    lines = parsed_known_hosts(path).for_host(name)
    revoked = {ln.blob for ln in lines if ln.marker == "revoked"}
    mine = client.get_host_keys()
    seen: set[str] = set()
    for ln in lines:
        if ln.marker is not None or ln.blob in revoked or ln.keytype in seen:
            continue
        key = ln.pkey()
        if key is None:
            continue
        seen.add(ln.keytype)
        mine.add(name, key.get_name(), key)


def _known_or_none(path: str) -> KnownHosts | None:
    try:
        return parsed_known_hosts(path)
    except OSError:
        return None


def revoked_error(known_hosts: str, name: str, key: paramiko.PKey, host_label: str) -> HostKeyError | None:
    """OpenSSH's "REVOKED HOST KEY" refusal, when a ``@revoked`` line covering ``name`` holds ``key``."""
    known = _known_or_none(known_hosts)
    line = known.revoked(name, key) if known else None
    if line is None:
        return None
    return HostKeyError(
        f"REVOKED HOST KEY for {where(name)}: server offers {key.get_name()} {fingerprint(key)}, which "
        f"{known_hosts}:{line.lineno} marks @revoked; refusing to connect",
        "the host's admin must give the host a new key; check the new key's fingerprint with them, then "
        "rerun with --accept-new to record it (keep the @revoked line)",
        host=host_label)


def certificate_error(known_hosts: str, name: str, key: paramiko.PKey, host_label: str) -> HostKeyError | None:
    """The one-line refusal for a host that known_hosts trusts only through ``@cert-authority``:
    paramiko asks servers for plain host keys first and never checks a host certificate's CA
    signature, so such trust cannot be honoured here."""
    known = _known_or_none(known_hosts)
    cas = known.authorities(name) if known else []
    if not cas and "-cert-" not in key.get_name():
        return None
    at = f"{known_hosts}:{cas[0].lineno}" if cas else known_hosts
    return HostKeyError(
        f"host key for {where(name)} ({key.get_name()} {fingerprint(key)}) is not in {known_hosts}, which "
        f"trusts this host only through host certificates (@cert-authority, {at}); remote-ops cannot check "
        "host certificates (paramiko does not verify a CA's signature)",
        f"add the host's own key line to {known_hosts} (ssh-keyscan it and check the fingerprint with the "
        "host's admin), or rerun with --accept-new to record it",
        host=host_label)


class VerifyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuses unknown keys; with ``accept_new`` records the key in ``known_hosts`` (one line)."""

    def __init__(self, known_hosts: str, accept_new: bool, host_label: str):
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.host_label = host_label
        self.recorded: str | None = None

    def missing_host_key(self, client, hostname, key):
        fp = fingerprint(key)
        revoked = revoked_error(self.known_hosts, hostname, key, self.host_label)
        if revoked is not None:
            raise revoked
        refusal = certificate_error(self.known_hosts, hostname, key, self.host_label)
        if refusal is not None and (not self.accept_new or "-cert-" in key.get_name()):
            raise refusal
        if not self.accept_new:
            raise HostKeyError(
                f"unknown host key for {where(hostname)} ({key.get_name()} {fp}); not in {self.known_hosts}",
                "check the fingerprint with the host's admin, then rerun with --accept-new to record it",
                host=self.host_label)
        path = Path(self.known_hosts)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            # A file without a final newline would glue our entry onto its last line.
            if path.stat().st_size and not path.read_bytes().endswith(b"\n"):
                line = "\n" + line
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.recorded = fp


def changed_key_error(exc: paramiko.BadHostKeyException, known_hosts: str, host_label: str,
                      port: int = 22) -> HostKeyError:
    """paramiko names the host without its port; known_hosts stores ``[host]:port`` for port != 22,
    which is what ``ssh-keygen -R`` must be given."""
    name = host_entry_name(exc.hostname, port)
    revoked = revoked_error(known_hosts, name, exc.key, host_label)
    if revoked is not None:
        return revoked
    return HostKeyError(
        f"HOST KEY CHANGED for {where(name)}: server offers {exc.key.get_name()} {fingerprint(exc.key)}, "
        f"{known_hosts} has {fingerprint(exc.expected_key)}; refusing to connect",
        f"if the host was really reinstalled, remove the old entry with "
        f"{remove_command(name, known_hosts)} and reconnect with --accept-new",
        host=host_label)
