"""Kept connections (``--persist S``, like OpenSSH's ControlPersist): the client side.

After a command has connected to a host itself (and verified its key), ``spawn`` starts one small
background process (``remote_ops.connect.muxserver``) that opens its own verified connection to each such
host (the same ``transport.Session`` code: ssh_config, host keys, ProxyJump) and keeps it for S
seconds without clients. A later command finds the host's socket and runs its agent exec over
that connection instead of paying the SSH handshake again. A paramiko connection cannot be handed
from one process to another (the transport's keys, sequence numbers and reader thread live in the
process that made it), so the kept connection is the background process's own second handshake,
made after the first command has finished.

Where: ``$REMOTE_OPS_MUX_DIR``, else ``$XDG_RUNTIME_DIR/remote-ops-mux``, else
``~/.cache/remote-ops/mux``: a directory of the user's, mode 0700; the socket is 0600. A
directory or socket that is not the user's, not a directory/socket, or open to group/other is
never used (the command connects itself; ``-v`` says why). On Linux both ends check the other's
uid with SO_PEERCRED. The socket's name is a hash of everything that decides which connection
this is (``identity``): a different user, port, identity file, known_hosts file (or its content
changing), ssh_config text, jump chain or ssh-agent never reuses another's connection.

Protocol over the unix socket, one connection per exec, frames of ``type(1 byte) + length(4 bytes,
big-endian) + payload``:

    client -> mux   X {"command", "timeout", "persist", "resident"}  open a session channel and exec
                    command (``resident``: or answer this agent exec from the host's resident agent)
                    I bytes   stdin            E   stdin closed          Q   stop the mux
    mux -> client   A         exec sent        N text  nothing was run (the mux's link is gone)
                    O bytes   stdout           R bytes stderr
                    S {"status": int}  the end (-1: no exit status, the link died)
                    F text    the link died while relaying

The client sends stdin only after ``A``, so when it sees ``N`` or the socket closing before ``A``
nothing ran on the host and it connects itself instead; after ``A`` a lost mux is a lost
connection (``UnreachableError``), exactly as a dropped SSH link.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
import sys

PROTOCOL = 1
# Off unless asked (--persist S, $REMOTE_OPS_PERSIST): a kept connection outlives an sshd restart and a
# host-key rotation on the host (as OpenSSH's ControlPersist does), so within the window the next
# command would not see a stopped sshd or a changed host key. Opting in is one variable. Not asked
# (None) is not the same as an explicit 0: only 0 (--no-persist) also tells a running mux to exit,
# so a command nobody asked to persist does no mux work at all.
DEFAULT_PERSIST = None
_MAX_PATH = 100          # sun_path is 108 bytes on Linux (104 on macOS)


# ------------------------------------------------------------------------------------ framing
def send_frame(sock: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    sock.sendall(kind + struct.pack(">I", len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("the connection-keeping process (--persist) went away")
        buf += chunk
    return buf


def recv_frame(sock: socket.socket) -> tuple[bytes, bytes]:
    head = _recv_exact(sock, 5)
    (n,) = struct.unpack(">I", head[1:])
    return head[:1], _recv_exact(sock, n) if n else b""


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end (Linux SO_PEERCRED); None where not available."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i")))
    return uid


# ------------------------------------------------------------------------------------ settings
def default_persist() -> float | None:
    """``$REMOTE_OPS_PERSIST`` (seconds; 0 = off and stop a kept one), else None (not asked)."""
    raw = os.environ.get("REMOTE_OPS_PERSIST", "").strip()
    if not raw:
        return DEFAULT_PERSIST
    from remote_ops.errors import UsageError
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"REMOTE_OPS_PERSIST must be a number of seconds (0 = off), got {raw!r}") from None
    return check_persist(value, "REMOTE_OPS_PERSIST")


def check_persist(value: float, what: str = "--persist") -> float:
    if not 0 <= value <= 86400:
        from remote_ops.errors import UsageError
        raise UsageError(f"{what} must be a number of seconds in [0, 86400] (0 = off), got {value:g}")
    return float(value)


def available() -> bool:
    """Unix sockets and uids (not on Windows: there persistence is always off)."""
    return hasattr(socket, "AF_UNIX") and hasattr(os, "getuid")


def mux_dir() -> str:
    d = os.environ.get("REMOTE_OPS_MUX_DIR")
    if d:
        return os.path.abspath(os.path.expanduser(d))
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run and os.path.isdir(run):
        return os.path.join(run, "remote-ops-mux")
    return os.path.expanduser("~/.cache/remote-ops/mux")


def unsafe(path: str, want_dir: bool) -> str | None:
    """Why ``path`` must not be used (not ours, wrong type, group/other bits), or None if it is safe."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    kind_ok = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISSOCK(st.st_mode)
    if not kind_ok:
        return f"{path} is not a {'directory' if want_dir else 'socket'}"
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & 0o077:
        return f"{path} has mode {stat.S_IMODE(st.st_mode):04o} (group/other may use it; must be 0700/0600)"
    return None


def ensure_dir(create: bool) -> tuple[str | None, str | None]:
    """(the mux directory, None) when it is safe to use; (None, why) when not."""
    d = mux_dir()
    if create and not os.path.lexists(d):
        try:
            os.makedirs(os.path.dirname(d), exist_ok=True)
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass                                   # another controller made it: checked below
        except OSError as exc:
            return None, f"cannot create {d}: {exc.strerror or exc}"
    why = unsafe(d, want_dir=True)
    return (None, why) if why else (d, None)


def _file_id(path: str | None):
    """What identifies a file's content without reading it: path, inode, size, mtime."""
    if not path:
        return None
    try:
        st = os.stat(os.path.expanduser(path))
    except OSError:
        return [path, None]
    return [path, st.st_ino, st.st_size, st.st_mtime_ns]


def _host_id(host) -> dict:
    return {"hostname": host.hostname, "port": host.port, "user": host.user,
            "identity_file": [_file_id(host.resolve_path(i)) for i in host.identity_file],
            "known_hosts": _file_id(host.resolve_path(host.known_hosts)) if host.known_hosts else None,
            "proxy_jump": list(host.proxy_jump) if host.proxy_jump is not None else None,
            "keepalive": host.keepalive}


def identity(host, options, inventory_hosts: dict) -> str | None:
    """The socket name for this connection: a hash of what decides which connection it is; None
    when it cannot be computed (then nothing is kept: the direct connection reports the problem)."""
    from remote_ops.connect import sshconfig

    cfg = os.path.expanduser(options.ssh_config_path) if options.ssh_config_path else sshconfig.default_path()
    try:
        cfg_text = sshconfig.expand_text(cfg) if os.path.exists(cfg) else ""
    except Exception:  # an unreadable or bad config: the direct connection says what is wrong
        return None
    hops = [_host_id(inventory_hosts[h]) if h in inventory_hosts else h for h in (host.proxy_jump or ())]
    defaults = [_file_id(os.path.expanduser(f"~/.ssh/{n}")) for n in ("known_hosts", "id_rsa", "id_ecdsa",
                                                                       "id_ed25519")]
    parts = {"v": PROTOCOL, "uid": os.getuid(), "home": os.path.expanduser("~"),
             "agent": os.environ.get("SSH_AUTH_SOCK"), "host": _host_id(host), "hops": hops,
             "ssh_config": [cfg, hashlib.sha256(cfg_text.encode()).hexdigest()], "defaults": defaults,
             "inventory": host.inventory_path}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def socket_path(d: str, key: str) -> str:
    return os.path.join(d, key + ".sock")


# ------------------------------------------------------------------------------------ client
class Mux:
    """A host's kept connection, found by ``attach``: one unix connection per exec."""

    def __init__(self, path: str, first: socket.socket):
        self.path = path
        self._spare: socket.socket | None = first   # the connection attach made, used by the first exec

    def _connect(self) -> socket.socket | None:
        if self._spare is not None:
            s, self._spare = self._spare, None
            return s
        return _connect(self.path)

    def exec(self, command: str, timeout: float | None, persist: float,
             resident: dict | None = None) -> "MuxChannel | None":
        """The command started on the kept connection, or None when nothing was run (the mux is
        gone or its link is dead): the caller then connects itself. ``resident`` ({"agent": bundle
        sha256, "cache": the host's agent cache setting}): an agent exec the mux may answer from the
        host's resident agent (muxserver.Resident); the client sees the same stream either way."""
        sock = self._connect()
        if sock is None:
            return None
        try:
            sock.settimeout((timeout or 30) + 5)
            send_frame(sock, b"X", json.dumps({"command": command, "timeout": timeout, "persist": persist,
                                               "resident": resident}).encode())
            kind, _ = recv_frame(sock)
        except (OSError, EOFError):
            kind = b"N"
        if kind != b"A":
            sock.close()
            return None
        sock.settimeout(timeout)
        return MuxChannel(sock)

    def close(self) -> None:
        if self._spare is not None:
            self._spare.close()
            self._spare = None


class MuxChannel:
    """The part of paramiko's Channel that ``Session._run_agent`` uses, over a mux connection."""

    exec_sent = True

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._stderr = b""
        self._status: int | None = None
        self._stdin_gone = False

    def sendall(self, data: bytes) -> None:
        self._send(b"I", data)

    def shutdown_write(self) -> None:
        self._send(b"E")

    def _send(self, kind: bytes, data: bytes = b"") -> None:
        """A frame of stdin; none once the mux has ended this exec: a command that exits before reading
        its stdin (an interpreter not found) ends it, and what the mux sent before closing (the exit
        status, stderr) is still there to read, so the caller reports that, not a broken pipe. A mux
        that died sent nothing: recv() then fails as a lost link."""
        if self._stdin_gone:
            return
        try:
            send_frame(self.sock, kind, data)
        except (BrokenPipeError, ConnectionResetError):
            self._stdin_gone = True

    def recv(self, _n: int) -> bytes:
        """The next stdout chunk; b"" at the end (socket.timeout, EOFError, OSError as paramiko)."""
        while self._status is None:
            kind, data = recv_frame(self.sock)
            if kind == b"O":
                return data
            if kind == b"R":
                self._stderr += data
            elif kind == b"S":
                self._status = int(json.loads(data)["status"])
            elif kind == b"F":
                raise OSError(data.decode(errors="replace"))
            else:
                raise OSError(f"unexpected frame {kind!r} from the connection-keeping process")
        return b""

    def recv_stderr_ready(self) -> bool:
        return bool(self._stderr)

    def recv_stderr(self, _n: int) -> bytes:
        data, self._stderr = self._stderr, b""
        return data

    def recv_exit_status(self) -> int:
        while self._status is None:
            self.recv(0)
        return self._status

    def close(self) -> None:
        self.sock.close()


def _connect(path: str) -> socket.socket | None:
    """A connection to a live mux we may trust, or None (missing, stale, or not ours)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(5)
        s.connect(path)
        uid = peer_uid(s)
        if uid is not None and uid != os.getuid():
            s.close()
            return None
        return s
    except OSError:
        s.close()
        return None


def attach(host, options, inventory_hosts: dict, note) -> Mux | None:
    """The host's kept connection if one is running and safe to use, else None."""
    if not available():
        return None
    d, why = ensure_dir(create=False)
    if d is None:
        if why != "missing":
            note(f"{host.name}: not using kept connections: {why}")
        return None
    key = identity(host, options, inventory_hosts)
    if key is None:
        return None
    path = socket_path(d, key)
    why = unsafe(path, want_dir=False)
    if why:
        if why != "missing":
            note(f"{host.name}: not using the kept connection: {why}")
        return None
    sock = _connect(path)
    if sock is None:
        return None
    note(f"{host.name}: using the kept connection ({path})")
    return Mux(path, sock)


def stop(host, options, inventory_hosts: dict) -> bool:
    """Ask the host's mux (if any) to exit: ``--no-persist`` / ``--persist 0``. True if one was told."""
    if not available():
        return False
    d, _ = ensure_dir(create=False)
    key = identity(host, options, inventory_hosts) if d else None
    if key is None or unsafe(socket_path(d, key), want_dir=False):
        return False
    sock = _connect(socket_path(d, key))
    if sock is None:
        return False
    try:
        send_frame(sock, b"Q")
        return True
    except OSError:
        return False
    finally:
        sock.close()


def keep(sessions: list, note=None) -> int:
    """After a command: keep the connection of every session that had to connect itself with
    persist on (``Session.keep``), in one background process; how many hosts it was started for."""
    todo = [s for s in sessions if getattr(s, "keep", False)]
    return spawn(todo, note or (lambda _m: None)) if todo and available() else 0


def spawn(sessions: list, note) -> int:
    """Start one background process keeping a connection to each of ``sessions``' hosts (those
    that connected themselves with persist on and have no live mux yet); how many hosts."""
    from remote_ops.connect import bundle

    d, why = ensure_dir(create=True)
    if d is None:
        note(f"not keeping connections: {why}")
        return 0
    specs = []
    for sess in sessions:
        key = identity(sess.host, sess.options, sess.inventory_hosts)
        if key is None:
            continue
        if len(socket_path(d, key)) > _MAX_PATH:
            note(f"not keeping connections: {d} is too long a path for a unix socket (set REMOTE_OPS_MUX_DIR)")
            return 0
        live = _connect(socket_path(d, key))
        if live is not None:
            live.close()
            continue
        hosts = {n: h for n, h in sess.inventory_hosts.items() if n in (sess.host.proxy_jump or ())}
        specs.append({"key": key, "host": _host_dict(sess.host),
                      "hops": {n: _host_dict(h) for n, h in hosts.items()},
                      "connect_timeout": sess.options.connect_timeout,
                      "ssh_config_path": sess.options.ssh_config_path, "persist": sess.options.persist,
                      # what the host's resident agent is started with ahead of the next command
                      "agent_cache": (sess.host.env or {}).get(bundle.CACHE_ENV)})
    if not specs:
        return 0
    import subprocess

    log_path = os.path.join(d, "mux.log")
    if os.path.isfile(log_path) and os.path.getsize(log_path) > 1 << 20:
        os.unlink(log_path)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        # through sh -c '... &': the mux is not our child (nothing to reap; it outlives us); fd 3
        # because sh gives a background command /dev/null as stdin unless it is redirected from elsewhere
        server = os.path.join(os.path.dirname(os.path.abspath(__file__)), "muxserver.py")   # this very package
        proc = subprocess.Popen(["/bin/sh", "-c", 'exec 3<&0; "$0" "$1" "$2" <&3 3<&- &', sys.executable, server, d],
                                stdin=subprocess.PIPE, stdout=log, stderr=log, cwd="/", start_new_session=True)
    finally:
        os.close(log)
    try:
        proc.stdin.write(json.dumps(specs, default=list).encode())
        proc.stdin.close()
    except OSError:
        pass
    proc.wait()
    return len(specs)


def _host_dict(host) -> dict:
    import dataclasses
    return {f.name: getattr(host, f.name) for f in dataclasses.fields(host) if f.name not in ("env", "vars")}
