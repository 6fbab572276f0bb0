"""The paramiko side of a connection, for ``transport.py``: paramiko imported without invoke, one SSH
client connection (optionally through a ProxyJump gateway connection) opened with its failures
mapped to our one-line errors, ssh_config loading, and the exec request sent without waiting for
its reply.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import types

from remote_ops.errors import AuthError, HostKeyError, TimeoutError_, UnreachableError


class _LazyModule:
    """Stands in for a module until first use, then imports it (see _import_paramiko)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        import importlib
        return getattr(importlib.import_module(self._name), attr)


class _VersionOnlyMetadata(types.ModuleType):
    """Stands in for ``importlib.metadata`` while paramiko's ``__init__`` runs: it only asks for
    its own version (``metadata.version("paramiko")``), which costs ~10 ms of every command
    (importlib.metadata, the email parser, a search of sys.path). This reads the Version line of
    the METADATA next to the imported package instead; anything else, or no such file, goes to
    the real module."""

    def version(self, name: str) -> str:
        import glob
        import importlib.util
        import os

        spec = importlib.util.find_spec(name)
        site = os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else None
        found = glob.glob(os.path.join(glob.escape(site), f"{name}-*.dist-info", "METADATA")) if site else []
        if len(found) == 1:
            with open(found[0], encoding="utf-8") as fh:
                for line in fh:
                    if not line.strip():
                        break   # end of the headers
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
        return self.__getattr__("version")(name)

    def __getattr__(self, attr):
        import sys
        if attr.startswith("__"):
            raise AttributeError(attr)   # the import system's own questions: a plain module's answers
        real = sys.modules.get("importlib.metadata")
        if real is None or real is self:
            saved = sys.modules.pop("importlib.metadata", None)
            try:
                import importlib.metadata as real
            finally:
                if saved is self and sys.modules.get("importlib.metadata") is not real:
                    sys.modules["importlib.metadata"] = saved
        return getattr(real, attr)


def _import_paramiko():
    """paramiko, without importing invoke or importlib.metadata at start-up.

    paramiko.config imports invoke when it is installed (only to run ``Match exec`` lines of an
    ssh_config), and invoke pulls in asyncio, unittest.mock and its own YAML: ~50 ms of every
    command. It is hidden for the import and then handed to paramiko.config as a lazy module, so
    a ``Match exec`` line still works, paying for invoke only then. paramiko's own version comes
    from its METADATA file (_VersionOnlyMetadata), not from importlib.metadata."""
    import importlib
    import sys

    with _paramiko_lock:   # fleet threads connect at once: one imports, the others wait for it
        if "paramiko" in sys.modules:
            import paramiko   # (waits for an import in progress in another thread)
            _constant_time_mac_check()
            return paramiko
        hide = "invoke" not in sys.modules
        if hide:
            sys.modules["invoke"] = None   # ``import invoke`` raises ImportError, which paramiko expects
        shim = None
        if "importlib.metadata" not in sys.modules:
            shim = sys.modules["importlib.metadata"] = _VersionOnlyMetadata("importlib.metadata")
        try:
            import paramiko
            import paramiko.config as pconfig
        finally:
            if hide and "invoke" in sys.modules and sys.modules["invoke"] is None:
                del sys.modules["invoke"]
            if shim is not None:
                if sys.modules.get("importlib.metadata") is shim:
                    del sys.modules["importlib.metadata"]
                if getattr(importlib, "metadata", None) is shim:
                    del importlib.metadata
        if hide and getattr(pconfig, "invoke", False) is None:
            pconfig.invoke = _LazyModule("invoke")
        _constant_time_mac_check()
        return paramiko


def _constant_time_mac_check() -> None:
    """paramiko checks every incoming packet's MAC with ``util.constant_time_bytes_eq``, a loop
    over the bytes in Python (about 60 us a packet: ~1 ms of controller CPU per host of a fleet
    command). ``hmac.compare_digest`` is the stdlib's constant-time comparison in C, with the same
    answer for bytes (False for any length or byte that differs). ``paramiko.packet`` looks the
    function up on ``paramiko.util`` at each packet, so replacing it there covers both MAC checks
    (plain and encrypt-then-MAC); ``hostkeys`` imported its own reference and keeps paramiko's."""
    import hmac

    import paramiko.util as putil

    if getattr(putil.constant_time_bytes_eq, "__module__", None) == "paramiko.util":
        putil.constant_time_bytes_eq = hmac.compare_digest


_paramiko_lock = threading.Lock()


IDLE_POLL_S = 1.0   # paramiko's reading thread's socket timeout once the handshake is done


# Private keys loaded in this process: path -> ((key file bytes, certificate bytes or None), PKey).
# A fleet authenticates N hosts with one identity file; paramiko would read and parse it for every
# host, trying each key class in turn until one accepts the file.
_keys: dict = {}
_keys_lock = threading.Lock()


def _key_type(data: bytes) -> str | None:
    """The key type a private key file declares (``ssh-ed25519``, ``ssh-rsa``, ``ecdsa-sha2-...``;
    RSA/EC for PEM files), or None: read from the OpenSSH format's clear public part."""
    import base64
    import struct

    head = data[:64]
    if b"-----BEGIN RSA PRIVATE KEY-----" in head:
        return "ssh-rsa"
    if b"-----BEGIN EC PRIVATE KEY-----" in head:
        return "ecdsa-sha2-"
    if b"-----BEGIN OPENSSH PRIVATE KEY-----" not in head:
        return None
    try:
        blob = base64.b64decode(b"".join(line for line in data.split(b"-----")[2].split()))
        magic = b"openssh-key-v1\0"
        if not blob.startswith(magic):
            return None
        pos = len(magic)
        for _ in range(3):                       # cipher, kdf name, kdf options
            pos += 4 + struct.unpack(">I", blob[pos:pos + 4])[0]
        pos += 4 + 4                             # number of keys, length of the first public key
        n = struct.unpack(">I", blob[pos:pos + 4])[0]
        return blob[pos + 4:pos + 4 + n].decode("ascii")
    except (IndexError, ValueError, struct.error, UnicodeDecodeError):
        return None


def _key_classes(data: bytes, paramiko) -> tuple:
    """paramiko's order of key classes (RSA, ECDSA, Ed25519), the one the file declares first: a
    fleet with a key per host parses each file once, not up to three times."""
    order = (paramiko.RSAKey, paramiko.ECDSAKey, paramiko.Ed25519Key)
    kind = _key_type(data) or ""
    first = {"ssh-rsa": paramiko.RSAKey, "ssh-ed25519": paramiko.Ed25519Key}.get(kind) or \
        (paramiko.ECDSAKey if kind.startswith("ecdsa-sha2-") else None)
    return order if first is None else (first,) + tuple(k for k in order if k is not first)


def identity_key(path: str):
    """The private key in ``path`` (with its ``-cert.pub`` certificate when one exists), loaded as
    paramiko's ``SSHClient`` loads a ``key_filename`` and kept while the files' bytes are unchanged;
    None when it does not load without a passphrase (the caller then leaves it to paramiko, which
    reports it as before)."""
    import os

    import paramiko

    cert = path + "-cert.pub"
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        cert_data = None
        if os.path.isfile(cert):
            with open(cert, "rb") as fh:
                cert_data = fh.read()
    except OSError:
        return None
    with _keys_lock:
        hit = _keys.get(path)
        if hit is not None and hit[0] == (data, cert_data):
            return hit[1]
    for klass in _key_classes(data, paramiko):
        try:
            key = klass.from_private_key_file(path, None)
            if cert_data is not None:
                key.load_certificate(cert)
            break
        except paramiko.SSHException:
            continue
        except Exception:  # whatever paramiko's own loading would raise, it raises there
            return None
    else:
        return None
    with _keys_lock:
        if len(_keys) >= 64:
            _keys.clear()
        _keys[path] = ((data, cert_data), key)
    return key


def identity_problem(path: str) -> str | None:
    """Why ``path`` cannot serve as an SSH identity (missing, unreadable, a public key, not a key
    paramiko reads, protected by a passphrase), or None when it loads."""
    import os

    import paramiko

    if not os.path.exists(path):
        return "no such file"
    if os.path.isdir(path):
        return "it is a directory, not a key file"
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    head = data.lstrip()[:40]
    if head.startswith((b"ssh-", b"ecdsa-", b"sk-")):
        return "it is a public key; name the private key (the file without .pub)"
    if b"PRIVATE KEY-----" not in data[:200]:
        return "it is not a private key file"
    if identity_key(path) is not None:     # loads (the process's cache of keys): usable
        return None
    encrypted = False
    for klass in _key_classes(data, paramiko):
        try:
            klass.from_private_key_file(path, None)
            return None
        except paramiko.PasswordRequiredException:
            encrypted = True
        except Exception:  # not this class (or a format paramiko does not read): try the next
            continue
    if encrypted:
        return "it is protected by a passphrase, which remote-ops cannot ask for"
    return f"paramiko cannot read this key type (it reads RSA, ECDSA and Ed25519 keys{_declared(data)})"


def _declared(data: bytes) -> str:
    kind = _key_type(data)
    return f"; this one says {kind}" if kind else ""


def identity_error(s: dict, label: str, path: str | None = None) -> AuthError | None:
    """The one-line error for the first unusable identity file of ``s`` (or ``path``), or None."""
    for p in ([path] if path else s.get("identity_files") or []):
        why = identity_problem(p)
        if why is not None:
            hint = "fix identity_file for this host in the inventory (or IdentityFile in ~/.ssh/config)"
            if "passphrase" in why:
                hint = f"load it into ssh-agent (ssh-add {p}) and rerun; remote-ops uses the agent's keys"
            return AuthError(f"cannot use identity_file {p}: {why}", hint, host=label)
    return None


class _Conn:
    """One SSH client connection, optionally through a gateway connection (a ProxyJump hop)."""

    def __init__(self, hostname: str, port: int, gateway: "_Conn | None", connect_kwargs: dict):
        import paramiko

        self.host = hostname
        self.port = port
        self.gateway = gateway
        self.connect_kwargs = connect_kwargs
        self.client = paramiko.SSHClient()
        self.transport = None

    def open(self) -> None:
        if self.transport is not None and self.transport.active:
            return
        kwargs = {k: v for k, v in self.connect_kwargs.items() if v is not None}
        files = kwargs.get("key_filename")
        if isinstance(files, (list, tuple)) and len(files) == 1 and "pkey" not in kwargs:
            # one identity file: paramiko tries it first either way; loaded once per process
            key = identity_key(files[0])
            if key is not None:
                kwargs["pkey"] = key
                del kwargs["key_filename"]
        if self.gateway is not None:
            self.gateway.open()
            kwargs["sock"] = self.gateway.transport.open_channel(
                "direct-tcpip", (self.host, int(self.port)), ("", 0), timeout=kwargs.get("timeout"))
        from remote_ops.connect.quiet import transport_class
        # paramiko's Transport, waiting on events instead of waking every 0.1 s (quiet.py)
        self.client.connect(self.host, port=self.port, transport_factory=transport_class(), **kwargs)
        self.transport = self.client.get_transport()
        sock = getattr(self.transport, "sock", None)
        if isinstance(sock, socket.socket):
            # paramiko's transport thread reads with a 0.1 s timeout only to notice that it should
            # stop: ten wake-ups a second per host, a few ms of CPU per host on a long fleet run.
            # After the handshake (whose own timeout still polls at 0.1 s) a wait this long is
            # enough; close() shuts the socket down, which ends that wait at once.
            sock.settimeout(IDLE_POLL_S)

    def close(self) -> None:
        t = self.transport or self.client.get_transport()
        sock = getattr(t, "sock", None)
        if isinstance(sock, socket.socket):
            try:
                # wakes paramiko's reading thread now (it may wait IDLE_POLL_S) and sends our FIN
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass   # already closed or never connected
        self.client.close()   # also ends a transport left by a failed handshake (a no-op if none)
        self.transport = None


def _names(s: dict) -> tuple[str, str, str]:
    """How a connection's failure names it: (who, the fix for its address, the fix for its port).

    ``s`` is a connection's settings plus ``jump`` (the hop as written, when this is a jump host),
    ``via`` (the last jump host before it, if any) and ``adhoc`` (a target from the command line)."""
    where = f"{s['user']}@{s['hostname']}:{s['port']}"
    if s.get("jump"):
        hop = s["jump"]
        who = f"jump host {hop} ({where})" if hop != where else f"jump host {where}"
        fix = "check proxy_jump for this host in the inventory, or ProxyJump in ~/.ssh/config"
        return who, fix, f"is sshd running on the jump host and its port right? {fix}"
    if s.get("adhoc"):
        fix = "check the host name given on the command line, or HostName in ~/.ssh/config"
    else:
        fix = "check hostname for this host in the inventory, or HostName in ~/.ssh/config"
    return where, fix, "is sshd running and the port right?"


def _jump_refusal(exc, s: dict, label: str) -> UnreachableError:
    """The jump host ``s['via']`` could not open the forwarded connection to the target."""
    target = f"{s['hostname']}:{s['port']}"
    code, text = getattr(exc, "code", None), getattr(exc, "text", "") or str(exc)
    if code == 1:   # OPEN_ADMINISTRATIVELY_PROHIBITED
        return UnreachableError(f"jump host {s['via']} refuses to forward to {target} ({text})",
                                "the jump host's sshd must allow TCP forwarding (AllowTcpForwarding yes)",
                                host=label)
    _, fix, _ = _names(dict(s, jump=None))
    return UnreachableError(f"jump host {s['via']} cannot connect to {target} ({text})",
                            f"the jump host resolves and connects to {s['hostname']} itself: {fix}, and that "
                            f"sshd listens on port {s['port']} there and is reachable from {s['via']}",
                            host=label)


def open_verified(conn: _Conn, s: dict, label: str) -> None:
    """Open ``conn`` (its gateway already open), raising our one-line errors for every way it fails.

    ``s``: the connection's settings, with ``jump``/``via``/``adhoc`` as ``_names`` reads them, so
    that a failed hop is named as the hop that failed (the jump host or the target, its own
    host:port, the fix for that hop)."""
    import paramiko

    who, addr_fix, port_fix = _names(s)
    where = who
    started = time.monotonic()
    try:
        conn.open()
    except HostKeyError:
        raise
    except paramiko.ChannelException as exc:   # the jump host could not open the forwarded connection
        raise _jump_refusal(exc, s, label) from None
    except paramiko.BadHostKeyException as exc:
        from remote_ops.connect.hostkeys import changed_key_error
        raise changed_key_error(exc, s["known_hosts"], label, int(s["port"])) from None
    except paramiko.AuthenticationException as exc:
        # a key file paramiko could not use (passphrase, wrong type) is named with why; a key the
        # server refused is named too
        keys = s.get("identity_files") or []
        offered = f" with identity_file {', '.join(keys)}" if keys else ""
        raise identity_error(s, label) or AuthError(
            f"authentication refused by {where}{offered} ({exc})",
            f"check that the key's .pub line is in ~{s['user']}/.ssh/authorized_keys on the host, or fix "
            "user and identity_file in the inventory, or load the right key into ssh-agent" if keys else
            "check user and identity_file in the inventory, or load the key into ssh-agent",
            host=label) from None
    except (socket.timeout, TimeoutError):
        raise TimeoutError_(f"connection to {where} timed out after {s['timeout']:g}s",
                            "check that the host is up and reachable, or raise connect_timeout",
                            host=label) from None
    except paramiko.ssh_exception.NoValidConnectionsError:
        raise UnreachableError(f"cannot reach {where}: connection refused", port_fix, host=label) from None
    except socket.gaierror as exc:
        what = "jump host name" if s.get("jump") else "host name"
        raise UnreachableError(f"cannot resolve {what} {s['hostname']!r} ({exc.strerror})", addr_fix,
                               host=label) from None
    except (ConnectionError, OSError) as exc:
        if getattr(exc, "filename", None):   # a file, not the network: paramiko opening a key file
            raise (identity_error(s, label, exc.filename) or
                   AuthError(f"cannot use identity_file {exc.filename}: {exc.strerror or exc}",
                             "fix identity_file for this host in the inventory", host=label)) from None
        raise UnreachableError(f"cannot reach {where}: {exc.strerror or exc}",
                               "check the address and the network path", host=label) from None
    except EOFError:
        # paramiko raises a bare EOFError when the peer drops the link mid-handshake
        raise UnreachableError(f"connection to {where} lost during the SSH handshake",
                               "rerun the command; check the network path if it keeps happening",
                               host=label) from None
    except paramiko.SSHException as exc:
        msg = str(exc)
        if s.get("via") and "Timeout opening channel" in msg:
            raise TimeoutError_(f"jump host {s['via']} did not connect to {s['hostname']}:{s['port']} "
                                f"within {s['timeout']:g}s",
                                f"check that {s['hostname']} is up and reachable from the jump host, "
                                "or raise connect_timeout", host=label) from None
        t = conn.client.get_transport()
        saved = getattr(t, "saved_exception", None) if t is not None else None
        if "No existing session" in msg:
            # paramiko hides the handshake's real failure behind this; a handshake that took the
            # whole timeout is a host that accepted TCP but never spoke SSH.
            msg = str(saved) if saved is not None else "handshake failed"
            if time.monotonic() - started >= 0.9 * s["timeout"]:
                msg += " (timeout)"
        bad_key = identity_error(s, label)
        if bad_key is not None and "key" in msg.lower():     # e.g. "not a valid RSA private key file"
            raise bad_key from None
        if "authentication" in msg.lower():
            raise AuthError(f"authentication refused by {where} ({msg})",
                            "check user and identity_file in the inventory, or load the key into ssh-agent",
                            host=label) from None
        if "banner" in msg.lower() or "timeout" in msg.lower():
            raise TimeoutError_(f"no SSH greeting from {where} within {s['timeout']:g}s ({msg})",
                                "the port answers but is not an SSH server, or the host is overloaded",
                                host=label) from None
        raise UnreachableError(f"SSH negotiation with {where} failed: {msg}", host=label) from None
    conn.transport.set_keepalive(s["keepalive"])
    sock = getattr(conn.transport, "sock", None)
    if isinstance(sock, socket.socket):
        # Without this, delayed ACKs add ~40 ms to every channel open.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def link_errors() -> tuple:
    """What a dropped link raises: OSError/EOFError, and paramiko's SSHException once it is loaded
    (a command served entirely by a kept connection, mux.py, never imports paramiko)."""
    pm = sys.modules.get("paramiko")
    return (OSError, EOFError) + ((pm.SSHException,) if pm is not None else ())


def _ssh_config(path: str | None):
    _import_paramiko()   # first, so that paramiko comes without invoke (see there)
    from remote_ops.connect import sshconfig   # paramiko's parser plus Include and refused unknown Match
    return sshconfig.load(path)


def _parse_hop(hop: str) -> tuple[str | None, str, int | None]:
    user, _, rest = hop.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        port = int(p)
    return (user or None), host, port


def _exec_pipelined(chan, command: str) -> None:
    """Send the exec request without waiting for its reply, so stdin follows in the same flight.

    paramiko's ``exec_command`` asks for a reply and blocks on it: one extra network round trip
    per call. SSH keeps a channel's messages in order, so the server starts the command before it
    reads our stdin; a refused exec shows up as a channel closed without an exit status, which
    ``_exec_lines`` reports as a lost connection. paramiko has no public call that sends a request
    without asking for its reply, so this is the one private paramiko call left here
    (``Transport._send_user_message``); every agent call over SSH goes through it.
    """
    from paramiko.common import cMSG_CHANNEL_REQUEST
    from paramiko.message import Message

    m = Message()
    m.add_byte(cMSG_CHANNEL_REQUEST)
    m.add_int(chan.remote_chanid)
    m.add_string("exec")
    m.add_boolean(False)
    m.add_string(command)
    chan.transport._send_user_message(m)
