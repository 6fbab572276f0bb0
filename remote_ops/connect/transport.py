"""SSH transport: verified connections (host keys, ssh_config, ProxyJump, keepalive) and agent calls.

This module and ``sshconn.py`` (paramiko without invoke, one client connection through ProxyJump
hops, the pipelined exec request) are the only ones that know about SSH. Everything crossing the
wire is an *agent call*: one exec channel running the stdlib-only agent on the host's interpreter,
request on stdin, JSON lines back. ``Session.stats`` counts exec channels and SFTP requests (the round trips).
With ``ConnectOptions.persist`` the exec may run over a connection kept by a background process
(``mux.py``): ``open`` then makes no SSH connection at all, and ``connects`` stays 0.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from remote_ops.connect import bundle
from remote_ops.errors import AgentError, HostKeyError, TimeoutError_, UnreachableError, agent_error
from remote_ops.connect.inventory import Host
from remote_ops.connect.sshconn import (_Conn, _exec_pipelined, _import_paramiko, _parse_hop, _ssh_config,  # noqa: F401
                                link_errors, open_verified)


# paramiko logs tracebacks of failed handshakes; the user gets our one-line error instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass
class Stats:
    connects: int = 0
    execs: int = 0
    sftp_requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    op_log: list = field(default_factory=list)
    bundles_sent: int = 0                                 # execs that had to ship the agent's sources
    host_cpu_s: list = field(default_factory=list)        # per exec: the agent's own CPU seconds
    host_cpu_split: list = field(default_factory=list)    # per exec: [interpreter start, bootstrap] of it
    agent_cache: list = field(default_factory=list)       # per exec: hit | filled | shipped | off | ...
    check_memo: list = field(default_factory=list)        # per exec: the host's check memo {hit, miss, ...}
    mux_execs: int = 0                                    # execs run over a kept connection (--persist)

    def as_dict(self) -> dict:
        return {"connects": self.connects, "execs": self.execs, "sftp_requests": self.sftp_requests,
                "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "bundles_sent": self.bundles_sent, "host_cpu_s": self.host_cpu_s,
                "host_cpu_split": self.host_cpu_split, "agent_cache": self.agent_cache,
                "check_memo": self.check_memo, "mux_execs": self.mux_execs}


def memo_words(per_exec: list) -> str:
    """``2 hit, 1 miss``: what the host's check memo did over these execs (``Stats.check_memo``
    entries, or the same dicts read back from a stats file), or "" when it did nothing."""
    total: dict = {}
    for m in per_exec:
        for k, v in (m or {}).items():
            total[k] = total.get(k, 0) + v
    return ", ".join(f"{v} {k}" for k, v in sorted(total.items()))


@dataclass
class ConnectOptions:
    accept_new: bool = False
    connect_timeout: float | None = None
    ssh_config_path: str | None = None   # None: ~/.ssh/config when it exists
    persist: float | None = None         # seconds a kept connection idles (mux.py); 0: off (and stop
    #                                      a running one); None: not managed (plain Session users)
    note: Callable[[str], None] | None = None   # -v notes (why a kept connection is not used)


PROBE_LINE = 4096      # the probe's "need" line is far shorter: a first line longer than this is an answer

class Session:
    """One verified SSH connection to one host, and agent calls over it."""

    # Send the agent's sources only when the host's cache lacks them (bundle.encode_probe); a
    # host that cannot cache gets the self-contained form for the rest of the session.
    bundle_probe = True

    def __init__(self, host: Host, options: ConnectOptions | None = None,
                 inventory_hosts: dict[str, Host] | None = None):
        self.host = host
        self.options = options or ConnectOptions()
        self.inventory_hosts = inventory_hosts or {}
        self.stats = Stats()
        self._conn = None
        self._gateways: list = []
        self._mux = None          # mux.Mux: the host's kept connection, when one is used
        self.keep = False         # connected itself with persist on: a mux should keep this host
        self._lock = threading.Lock()
        self._login: dict | None = None   # python unset: what the login shell's PATH gave (first call)
        self._sftp = None         # paramiko SFTPClient, opened by the first open_sample (gather)
        self._sftps: dict = {}    # slot -> SFTPClient: gather's further channels (open_sample's slot)

    # ---------------------------------------------------------------- connecting
    @property
    def label(self) -> str:
        return self.host.name

    def _settings(self, host: Host, ssh_cfg) -> dict:
        """explicit inventory value -> ~/.ssh/config -> OpenSSH default."""
        entry = sshconfig_lookup(ssh_cfg, host.hostname)
        hostname = entry.get("hostname", host.hostname)
        port = host.port or int(entry.get("port", 22))
        user = host.user or entry.get("user") or getpass.getuser()
        idents = [host.resolve_path(i) for i in host.identity_file] or \
            [os.path.expanduser(i) for i in entry.get("identityfile", [])]
        if host.known_hosts:
            known = host.resolve_path(host.known_hosts)
        else:
            ukh = entry.get("userknownhostsfile")
            known = os.path.expanduser(ukh.split()[0] if ukh else "~/.ssh/known_hosts")
        if host.proxy_jump is not None:
            hops = list(host.proxy_jump)
        else:
            pj = entry.get("proxyjump")
            hops = [] if not pj or pj.lower() == "none" else [h.strip() for h in pj.split(",")]
        timeout = self.options.connect_timeout or host.connect_timeout or float(entry.get("connecttimeout", 10))
        keepalive = host.keepalive if host.keepalive is not None else int(entry.get("serveraliveinterval", 15))
        return {"hostname": hostname, "port": port, "user": user, "identity_files": idents,
                "known_hosts": known, "hops": hops, "timeout": timeout, "keepalive": keepalive}

    def _hop_host(self, hop: str, ssh_cfg=None) -> Host:
        if hop in self.inventory_hosts:
            return self.inventory_hosts[hop]
        user, hostname, port = _parse_hop(hop)
        # A hop that is not an inventory host trusts the same known_hosts as the host it leads to,
        # and offers the same keys unless ~/.ssh/config names an IdentityFile for the hop itself.
        own_keys = bool(sshconfig_lookup(ssh_cfg, hostname).get("identityfile"))
        return Host(name=hop, hostname=hostname, port=port, user=user, proxy_jump=(),
                    known_hosts=self.host.known_hosts,
                    identity_file=() if own_keys else self.host.identity_file,
                    inventory_path=self.host.inventory_path)

    def _make_connection(self, host: Host, ssh_cfg, gateway, s: dict | None = None):
        """A connection to ``host`` (not opened) and its settings (``s``: already resolved ones)."""
        import paramiko

        s = s or self._settings(host, ssh_cfg)
        conn = _Conn(s["hostname"], s["port"], gateway, {
            "username": s["user"],
            "key_filename": s["identity_files"] or None,
            "allow_agent": True,
            "look_for_keys": not s["identity_files"],
            "timeout": int(max(1, s["timeout"])),
            "banner_timeout": s["timeout"],
            "auth_timeout": s["timeout"],
        })
        client: paramiko.SSHClient = conn.client
        known = s["known_hosts"]
        if os.path.exists(known):       # absent: every key is unknown; VerifyPolicy writes the file itself
            from remote_ops.connect.hostkeys import load_for
            try:
                load_for(client, known, s["hostname"], s["port"])   # the file parsed once per process
            except (OSError, paramiko.SSHException) as exc:
                raise HostKeyError(f"cannot read known_hosts {known}: {exc}", host=host.name) from None
        policy = _policy(known, self.options.accept_new, host.name)
        client.set_missing_host_key_policy(policy)
        return conn, s

    def _note(self, msg: str) -> None:
        if self.options.note is not None:
            self.options.note(msg)

    def open(self) -> "Session":
        if self._conn is not None or self._mux is not None:
            return self
        if self.options.persist is not None:
            from remote_ops.connect import mux
            if self.options.persist > 0:
                self._mux = mux.attach(self.host, self.options, self.inventory_hosts, self._note)
                if self._mux is not None:
                    return self
            elif mux.stop(self.host, self.options, self.inventory_hosts):
                self._note(f"{self.label}: told the kept connection to exit (--no-persist)")
        return self._open_ssh()

    def _open_ssh(self) -> "Session":
        ssh_cfg = _ssh_config(self.options.ssh_config_path)
        s0 = self._settings(self.host, ssh_cfg)
        gateway, via = None, None
        for hop in s0["hops"]:
            # each hop opened (and its failure named) on its own: a bastion that cannot be
            # resolved or refuses its port is the jump host's fault, not the target's
            hop_conn, hs = self._make_connection(self._hop_host(hop, ssh_cfg), ssh_cfg, gateway)
            self._gateways.append((hop_conn, hs))
            open_verified(hop_conn, dict(hs, jump=hop, via=via, adhoc=self.host.inventory_path is None),
                          self.label)
            gateway, via = hop_conn, hop
        conn, s = self._make_connection(self.host, ssh_cfg, gateway, s0)
        open_verified(conn, dict(s, via=via, adhoc=self.host.inventory_path is None), self.label)
        self._conn = conn
        self.stats.connects += 1
        self.keep = bool(self.options.persist)
        return self

    def open_sample(self, path: str, slot: int = 0):
        """A sample file on the host opened for reading over SFTP (one SFTP channel per session, opened
        on first use on this process's own connection; ``gather`` reads the outputs with it). Only a
        regular file: a link (lstat, never followed) or anything else raises OSError, so a link planted
        in an output directory cannot make gather read a file outside it; the opened file must still
        be a regular file of the size lstat saw. ``slot``: which of the session's SFTP channels (gather
        reads several files at once, one channel each, on the one connection)."""
        with self._lock:
            sftp = self._sftp if slot == 0 else self._sftps.get(slot)
            if sftp is None:
                import paramiko
                try:
                    sftp = paramiko.SFTPClient.from_transport(self.transport)
                except (paramiko.SSHException, EOFError, OSError) as exc:
                    raise UnreachableError(f"cannot open SFTP: {exc or type(exc).__name__}",
                                           "the host's sshd needs the sftp subsystem", host=self.label) from None
                if slot == 0:
                    self._sftp = sftp
                else:
                    self._sftps[slot] = sftp
            self.stats.sftp_requests += 1
        import stat
        st = sftp.lstat(path)
        if not stat.S_ISREG(st.st_mode or 0):
            raise OSError(f"{path} is not a regular file on the host (a link or other: never followed)")
        fh = sftp.open(path, "rb")
        try:
            now = fh.stat()
            if not stat.S_ISREG(now.st_mode or 0) or now.st_size != st.st_size:
                raise OSError(f"{path} changed between its lstat and its open (replaced by a link?)")
            fh.prefetch()
        except BaseException:
            fh.close()
            raise
        return fh

    def close(self) -> None:
        for sftp in [self._sftp, *self._sftps.values()]:
            if sftp is not None:
                try:
                    sftp.close()
                except Exception:  # closing must not hide the operation's result
                    pass
        self._sftp, self._sftps = None, {}
        if self._mux is not None:
            self._mux.close()
            self._mux = None
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
        for hop_conn, _ in reversed(self._gateways):
            try:
                hop_conn.close()
            except Exception:  # closing a dead gateway must not mask the real error
                pass
        self._gateways = []

    def __enter__(self) -> "Session":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def transport(self):
        """The paramiko transport of this process's own connection (the mux server uses it)."""
        if self._conn is None:
            self._open_ssh()
        return self._conn.transport

    # ---------------------------------------------------------------- agent calls
    def _open_channel(self, timeout: float | None, command: str, resident: dict | None = None):
        """A channel for one exec: over the kept connection (the exec already sent), else a
        session channel of our own connection (falling back to one when the mux is gone)."""
        self.open()
        if self._mux is not None:
            chan = self._mux.exec(command, timeout, self.options.persist, resident)
            if chan is not None:
                self.stats.mux_execs += 1
                return chan
            self._mux.close()   # nothing ran: connect ourselves (and keep that connection afterwards)
            self._mux = None
            self._note(f"{self.label}: the kept connection is gone; connecting anew")
        import paramiko

        if self._conn is None:
            self._open_ssh()
        try:
            chan = self._conn.transport.open_session(timeout=timeout or 30)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise UnreachableError(f"connection lost: {exc or type(exc).__name__}",
                                   "rerun the command; nothing was left half-done on the host",
                                   host=self.label) from None
        if timeout:
            chan.settimeout(timeout)
        return chan

    def _python(self) -> str | None:
        """The interpreter to exec: the host's, else the one a login shell found earlier in this
        session, else None (bundle looks python3 up through a login shell)."""
        return self.host.python or (self._login or {}).get("executable")

    def _exec_lines(self, ops: list[dict], env: dict | None, timeout: float | None,
                    stop_on_error: bool) -> Iterator[dict]:
        """Run one agent request (one exec round trip); yields every parsed output line."""
        login_path = {"PATH": self._login["path"]} if self._login else {}
        full_env = {**login_path, **self.host.env, **(env or {})}
        resident = None
        if self._mux is not None and resident_ok(ops):
            # the kept connection may answer from the host's resident agent (the probe form it reads)
            cache = full_env.get(bundle.CACHE_ENV)
            resident = {"agent": bundle.agent_sha256(), "cache": None if cache is None else str(cache)}
        if resident is not None or (self.bundle_probe and full_env.get(bundle.CACHE_ENV) != "off"):
            payload = bundle.encode_probe(ops, full_env, stop_on_error)
        else:
            payload = bundle.encode_request(ops, full_env, stop_on_error)
        what = "+".join(o["op"] for o in ops)
        self.stats.execs += 1
        self.stats.op_log.append([o["op"] for o in ops])
        end: dict = {}
        buf = bytearray()        # a long line (gather's listing) arrives in many chunks: grown in place,
        for data in self._run_agent(payload, timeout, what, end, resident):     # searched only where new
            self.stats.bytes_received += len(data)
            nl = (len(buf) + data.find(b"\n")) if b"\n" in data else -1
            buf += data
            while nl >= 0:
                if nl == len(buf) - 1:      # the buffer is the line (the usual case): parsed as it is, no copy
                    line, buf = buf, bytearray()
                    del line[nl:]
                else:
                    line = bytes(memoryview(buf)[:nl])
                    del buf[:nl + 1]
                nl = buf.find(b"\n")
                if line and not line.isspace():     # (strip() would copy a long bytearray)
                    head = bytes(line[:200])
                    try:        # the line's bytes freed before its text is parsed: never bytes, text and values at once
                        text = line.decode(json.detect_encoding(line), "surrogatepass")
                        line = None
                        msg = json.loads(text)
                    except ValueError:
                        raise AgentError(f"agent sent unreadable output: {head!r}",
                                         host=self.label) from None
                    text = None
                    if "results" in msg:
                        self._note_agent(msg.get("agent"))
                    if self.host.python is None and isinstance(msg, dict) and msg.get("login"):
                        self._login = msg["login"]
                    yield msg
        if buf.strip():
            try:
                yield json.loads(bytes(buf))
            except ValueError:
                pass
        status, stderr = end.get("status"), end.get("stderr", "")
        if status == 127:
            raise AgentError(f"remote interpreter {self.host.python or 'python3'!r} not found",
                             "set 'python' for this host in the inventory (or pass --python) to the venv's python",
                             host=self.label, remote_traceback=stderr, kind="no-python")
        if status not in (0, None, -1):
            last = stderr.splitlines()[-1] if stderr else f"exit status {status}"
            raise AgentError(f"remote agent failed on {self.host.python or 'python3'}: {last}",
                             "the host's python must be >= 3.10; rerun with --debug for the remote traceback",
                             host=self.label, remote_traceback=stderr, kind="agent-exit")
        if status == -1:
            raise UnreachableError("connection lost before the remote operation finished",
                                   host=self.label)

    def _note_agent(self, agent: dict | None) -> None:
        if not isinstance(agent, dict):
            return
        if isinstance(agent.get("cpu_s"), (int, float)):
            self.stats.host_cpu_s.append(agent["cpu_s"])
            self.stats.host_cpu_split.append([agent.get("start_cpu_s"), agent.get("boot_cpu_s")])
        state = agent.get("cache")
        self.stats.agent_cache.append(state)
        self.stats.check_memo.append(agent.get("memo") if isinstance(agent.get("memo"), dict) else {})
        if state in ("off", "unwritable", "unsafe"):
            self.bundle_probe = False   # this host cannot cache: stop probing (saves the wait)

    def _run_agent(self, payload: bytes, timeout: float | None, what: str, end: dict,
                   resident: dict | None = None) -> Iterator[bytes]:
        """The agent on one exec channel: yields stdout chunks; sets end["status"], end["stderr"].

        With the probe form (bundle.encode_probe) stdin stays open until the agent's first line:
        ``{"bundle": "need"}`` (its cache lacks this agent) is answered with the bundle on the same
        channel and not passed on; any other first line means the cache served it."""
        command = bundle.agent_command(self._python())
        chan = self._open_channel(timeout, command, resident)
        link_errors_ = link_errors()
        stderr_chunks: list[bytes] = []
        probing = payload[:1] == b"{"
        first = bytearray()
        try:
            if not getattr(chan, "exec_sent", False):
                _exec_pipelined(chan, command)
            chan.sendall(payload)
            if not probing:
                chan.shutdown_write()
            self.stats.bytes_sent += len(payload)
            while True:
                try:
                    data = chan.recv(65536)
                except socket.timeout:
                    raise TimeoutError_(f"remote operation {what} timed out after {timeout:g}s",
                                        host=self.label) from None
                while chan.recv_stderr_ready():
                    stderr_chunks.append(chan.recv_stderr(65536))
                if not data:
                    break
                if probing:
                    first += data
                    nl = first.find(b"\n")
                    if nl < 0 and len(first) <= PROBE_LINE:
                        continue
                    # the first line is known: the short "need" line, or anything else (a long line,
                    # e.g. gather's listing, is passed on as it arrives, never gathered here first)
                    probing = False
                    if 0 <= nl <= PROBE_LINE and first[:nl].strip() == bundle.NEED_BUNDLE:
                        data = bytes(first[nl + 1:])
                        extra = bundle.agent_payload()
                        chan.sendall(extra)
                        self.stats.bytes_sent += len(extra)
                        self.stats.bundles_sent += 1
                    else:
                        data = bytes(first)
                    first = bytearray()
                    chan.shutdown_write()
                    if not data:
                        continue
                yield data
            if first:
                yield bytes(first)
            end["status"] = chan.recv_exit_status()
            while chan.recv_stderr_ready():
                stderr_chunks.append(chan.recv_stderr(65536))
        except link_errors_ as exc:
            # the link died mid-call (paramiko: OSError, EOFError or "Channel closed."; a mux: gone)
            raise UnreachableError(f"connection lost during {what}: "
                                   f"{exc or type(exc).__name__}", host=self.label) from None
        finally:
            try:
                chan.close()
            except link_errors_:
                pass   # the link is already gone: the error that matters was raised above
        end["stderr"] = b"".join(stderr_chunks).decode(errors="replace").strip()

    def call_many(self, ops: list[tuple[str, dict]], *, env: dict | None = None,
                  timeout: float | None = None, stop_on_error: bool = False) -> list[dict]:
        """Run several ops in ONE exec round trip; returns the raw ``{"ok", "result"|"error"}`` list."""
        specs = [{"op": op, "args": args} for op, args in ops]
        final = None
        for msg in self._exec_lines(specs, env, timeout, stop_on_error):
            if "results" in msg:
                final = msg["results"]
        if final is None:
            raise AgentError("the remote agent ended without an answer", host=self.label)
        return final

    def call(self, op: str, args: dict | None = None, *, env: dict | None = None,
             timeout: float | None = None) -> Any:
        """One op, one round trip; a failure raises the error its kind declares (``unwrap``)."""
        (res,) = self.call_many([(op, args or {})], env=env, timeout=timeout)
        return unwrap(res, self.label)

    def stream(self, op: str, args: dict | None = None, *, env: dict | None = None,
               timeout: float | None = None) -> Iterator[dict]:
        """Streams a generator op: yields ``{"event": ...}`` and finally ``{"result": ...}``."""
        specs = [{"op": op, "args": args or {}}]
        for msg in self._exec_lines(specs, env, timeout, False):
            if "event" in msg:
                yield {"event": msg["event"]}
            elif "results" in msg:
                yield {"result": unwrap(msg["results"][0], self.label)}

    def stream_result(self, op: str, args: dict | None = None, *, timeout: float | None = None,
                      on_event: Callable[[dict], None] | None = None, what: str | None = None) -> Any:
        """A generator op's result, its events passed to ``on_event`` on the way; an AgentError saying
        ``what`` (default: the op) ended without an answer when the stream ends with no result."""
        res, answered = None, False
        for msg in self.stream(op, args, timeout=timeout):
            if "result" in msg:
                res, answered = msg["result"], True
            elif on_event is not None:
                on_event(msg["event"])
        if not answered:
            raise AgentError(f"{what or op} ended without an answer", "rerun it", host=self.label)
        return res


def resident_ok(ops: list[dict]) -> bool:
    """Whether a host's resident agent may answer these ops (``--persist``): every one declared
    ``resident`` in the contract, none with an argument value of ``RESIDENT_UNLESS``."""
    from remote_ops.agent.contract import OPS, RESIDENT_UNLESS

    for spec in ops:
        op = OPS.get(spec.get("op"))
        if op is None or not op.resident:
            return False
        args = spec.get("args") or {}
        if any(args.get(k) == v for k, v in RESIDENT_UNLESS.items()):
            return False
    return True


def unwrap(res: dict, label: str | None = None) -> Any:
    """The op's result, or its failure raised as the error its kind declares (errors.agent_error)."""
    if res.get("ok"):
        return res.get("result")
    raise agent_error(res.get("error") or {}, label)


def sshconfig_lookup(ssh_cfg, hostname: str) -> dict:
    from remote_ops.connect.sshconfig import lookup
    return lookup(ssh_cfg, hostname)


def _policy(known_hosts: str, accept_new: bool, label: str):
    from remote_ops.connect.hostkeys import VerifyPolicy
    return VerifyPolicy(known_hosts, accept_new, label)
