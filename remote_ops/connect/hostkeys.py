"""Host-key verification against known_hosts, the way OpenSSH does it (never trust on sight)."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
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


# known_hosts files parsed in this process: path -> (the file's bytes, paramiko.HostKeys). A fleet
# connects to N hosts through one file; paramiko would parse all of it (a key object per line,
# and a lookup per line) for every host. The file is still read for every connection and the
# parse reused only for the same bytes, so any change (e.g. --accept-new appending a line, or
# an edit within the same second) is seen by the next connection.
_parsed: dict[str, tuple[bytes, paramiko.HostKeys]] = {}
_parsed_lock = threading.Lock()


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def parsed_known_hosts(path: str) -> paramiko.HostKeys:
    """The parsed file, parsed once per process while its bytes are unchanged. Raises what
    ``HostKeys.load`` raises (OSError, paramiko.SSHException)."""
    with _parsed_lock:   # fleet threads miss at once: one parses, the others wait for it
        data = _read(path)
        hit = _parsed.get(path)
        if hit is not None and hit[0] == data:
            return hit[1]
        keys = paramiko.HostKeys()
        keys.load(path)
        if _read(path) == data:   # what was parsed is what was read (else: parse again next time)
            if len(_parsed) >= 64:
                _parsed.clear()
            _parsed[path] = (data, keys)
        return keys


def load_for(client: paramiko.SSHClient, path: str, hostname: str, port: int) -> None:
    """Give ``client`` the known_hosts entries of ``hostname:port`` (what ``client.load_host_keys``
    would give it for this host: paramiko looks up exactly this name), from the file parsed
    once. Each key type keeps the entry paramiko's lookup returns first; the server's key is
    still checked by paramiko against these, for this host only."""
    name = host_entry_name(hostname, port)
    found = parsed_known_hosts(path).lookup(name)
    if not found:
        return
    mine = client.get_host_keys()
    for keytype in dict.fromkeys(found.keys()):
        mine.add(name, keytype, found[keytype])


class VerifyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuses unknown keys; with ``accept_new`` records the key in ``known_hosts`` (one line)."""

    def __init__(self, known_hosts: str, accept_new: bool, host_label: str):
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        self.host_label = host_label
        self.recorded: str | None = None

    def missing_host_key(self, client, hostname, key):
        fp = fingerprint(key)
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
    return HostKeyError(
        f"HOST KEY CHANGED for {where(name)}: server offers {exc.key.get_name()} {fingerprint(exc.key)}, "
        f"{known_hosts} has {fingerprint(exc.expected_key)}; refusing to connect",
        f"if the host was really reinstalled, remove the old entry with "
        f"{remove_command(name, known_hosts)} and reconnect with --accept-new",
        host=host_label)
