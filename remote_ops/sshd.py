"""A real OpenSSH ``sshd`` on loopback with freshly generated keys (sandbox host, tests, benchmarks)."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from remote_ops.errors import RemoteOpsError

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")


def find_sshd() -> str:
    for c in SSHD_CANDIDATES:
        if os.access(c, os.X_OK):
            return c
    found = shutil.which("sshd")
    if found:
        return found
    raise RemoteOpsError("OpenSSH server (sshd) is not installed",
                         "install it with: apt-get install -y openssh-server")


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str) -> None:
    if path.exists():
        return
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)


class SshdServer:
    """sshd listening on ``address:port``, keys and config under ``root`` (created 0700)."""

    def __init__(self, root: str | Path, address: str = "127.0.0.1", port: int | None = None,
                 extra_config: str = "", log_level: str = "ERROR"):
        self.root = Path(root)
        self.log_level = log_level
        self.address = address
        self.port_chosen = port is None      # ours to change if another process takes it first
        self.port = port or free_port(address)
        self.extra_config = extra_config
        self.user = getpass.getuser()
        self.proc: subprocess.Popen | None = None

    # paths
    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    @property
    def identity_file(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def config_path(self) -> Path:
        return self.root / "sshd_config"

    @property
    def pid_file(self) -> Path:
        return self.root / "sshd.pid"

    @property
    def log_file(self) -> Path:
        return self.root / "sshd.log"

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        keygen(self.host_key, "remote-ops sandbox host key")
        keygen(self.identity_file, "remote-ops sandbox user key")
        auth = self.root / "authorized_keys"
        auth.write_text(self.identity_file.with_suffix(".pub").read_text())
        os.chmod(auth, 0o600)
        pub = self.host_key.with_suffix(".pub").read_text().split()
        entry = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        self.known_hosts.write_text(f"{entry} {pub[0]} {pub[1]}\n")
        os.chmod(self.known_hosts, 0o600)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True) if os.geteuid() == 0 else None
        self.config_path.write_text(f"""\
Port {self.port}
ListenAddress {self.address}
HostKey {self.host_key}
PidFile {self.pid_file}
AuthorizedKeysFile {auth}
AllowUsers {self.user}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
MaxSessions 100
MaxStartups 200:30:400
Subsystem sftp internal-sftp
LogLevel {self.log_level}
PrintMotd no
AcceptEnv LANG LC_*
{self.extra_config}
""")

    def start(self, *, foreground: bool = True, timeout: float = 10.0) -> "SshdServer":
        """Start sshd. ``foreground``: a child process of ours (tests); else daemonised (sandbox).

        A port picked here (none given) is only free when picked: another process (a parallel test
        worker's sshd, a client's ephemeral port) can bind it before sshd does. Then sshd exits at
        once and the next free port is tried, up to 5 times."""
        for attempt in range(5):
            try:
                return self._start(foreground=foreground, timeout=timeout)
            except RemoteOpsError:
                if not self.port_chosen or attempt == 4 or not self._port_taken():
                    raise
                self.port = free_port(self.address)

    def _port_taken(self) -> bool:
        try:
            with socket.socket() as s:
                s.bind((self.address, self.port))
            return False
        except OSError:
            return True

    def _start(self, *, foreground: bool, timeout: float) -> "SshdServer":
        sshd = find_sshd()
        self.prepare()
        check = subprocess.run([sshd, "-t", "-f", str(self.config_path)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RemoteOpsError(f"sshd rejected its configuration: {check.stderr.strip()}")
        args = [sshd, "-f", str(self.config_path), "-E", str(self.log_file)]
        if foreground:
            self.proc = subprocess.Popen(args + ["-D"], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            proc = subprocess.run(args, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RemoteOpsError(f"sshd failed to start: {proc.stderr.strip() or self.log_tail()}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RemoteOpsError(f"sshd exited at start (status {self.proc.returncode}): {self.log_tail()}",
                                     f"port {self.port} may be in use")
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5) as s:
                    s.settimeout(2)
                    if s.recv(4).startswith(b"SSH-"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RemoteOpsError(f"sshd did not answer on {self.address}:{self.port} within {timeout:g}s: "
                             f"{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return " | ".join(self.log_file.read_text().strip().splitlines()[-3:])
        except OSError:
            return ""

    def daemon_pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def running(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return self.daemon_pid() is not None

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        pid = self.daemon_pid()
        if pid:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.05)

    def session_pids(self) -> list[int]:
        """The per-connection sshd children of the listener: one per open SSH connection."""
        listener = self.proc.pid if self.proc else self.daemon_pid()
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == listener:
                out.append(int(entry.name))
        return out

    def kill_sessions(self) -> int:
        """Kill the per-connection sshd children (fault injection: the connection dies); how many."""
        killed = 0
        for pid in self.session_pids():
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        return killed
