"""Host-key verification against known_hosts, the way OpenSSH does it (never trust on sight)."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import paramiko

from remote_ops.errors import HostKeyError


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def host_entry_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


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
                f"unknown host key for {hostname} ({key.get_name()} {fp}); not in {self.known_hosts}",
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


def changed_key_error(exc: paramiko.BadHostKeyException, known_hosts: str, host_label: str) -> HostKeyError:
    name = exc.hostname
    return HostKeyError(
        f"HOST KEY CHANGED for {name}: server offers {exc.key.get_name()} {fingerprint(exc.key)}, "
        f"{known_hosts} has {fingerprint(exc.expected_key)}; refusing to connect",
        f"if the host was really reinstalled, remove the old entry with "
        f"ssh-keygen -R '{name}' -f {known_hosts} and reconnect with --accept-new",
        host=host_label)
