"""The library fleet: an inventory, one verified session per host, and per-host fan-out.

``Fleet.run(target, fn)`` calls ``fn(host, session)`` on every host the target names, in parallel
(bounded by ``parallel``), and returns ``Results``: one ``HostResult`` per host, in order, holding the
operation's record or the ``RemoteOpsError`` that stopped that host. One dead host never stops or
hides the others. ``remote_ops.api.Inventory`` adds the operations; the CLI is a client of it.
Nothing here prints or knows argparse.
"""

from __future__ import annotations

import os
import threading
import traceback as tb
from dataclasses import dataclass
from typing import Any, Callable

from remote_ops.errors import Exit, RemoteOpsError, UsageError
from remote_ops.records import to_json


@dataclass
class HostResult:
    """One host's outcome (fabric's GroupResult idea: a record or an error, never lost)."""

    host: str
    ok: bool
    value: Any = None
    error: RemoteOpsError | None = None
    traceback: str | None = None

    def to_json(self) -> dict:
        out: dict = {"host": self.host, "ok": self.ok}
        if self.ok:
            out["result"] = to_json(self.value)
        else:
            out["error"] = self.error.to_json() if self.error else None
        return out


class Results(list):
    """``[HostResult, ...]`` in target order, with fleet helpers.

    ``single`` is True when the target named one host (not a group or list, even of one host): the
    CLI then prints that host's record (or error) alone, else the ``{"hosts", "failed"}`` envelope."""

    single: bool = False
    group = None      # a record over all the hosts (status, verify and gather of a group), or None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self)

    @property
    def succeeded(self) -> dict[str, Any]:
        return {r.host: r.value for r in self if r.ok}

    @property
    def failed(self) -> dict[str, RemoteOpsError]:
        return {r.host: r.error for r in self if not r.ok}

    @property
    def failed_hosts(self) -> list[str]:
        return [r.host for r in self if not r.ok]

    def __getitem__(self, key):
        if isinstance(key, str):
            for r in self:
                if r.host == key:
                    return r
            raise KeyError(key)
        return super().__getitem__(key)

    @property
    def exit_status(self) -> int:
        """The first failed host's exit status, else 0 (what the CLI exits with on host failures)."""
        for r in self:
            if not r.ok:
                return int(r.error.exit_status) if r.error else int(Exit.REMOTE)
        return int(Exit.OK)

    def to_json(self) -> dict:
        """The one JSON shape: a single host's record (its error object when it failed), else
        ``{"hosts": [{"host", "ok", "result" | "error"}], "failed": [names]}``, plus ``"group"``
        (``Results.group``'s record: totals over the hosts) when the operation computes one."""
        if self.single and len(self) == 1:
            r = self[0]
            if r.ok:
                return to_json(r.value)
            return r.error.to_json() if r.error else {"error": "RemoteOpsError", "host": r.host}
        out = {"hosts": [r.to_json() for r in self], "failed": self.failed_hosts}
        if self.group is not None:
            out["group"] = to_json(self.group)
        return out

    def raise_for_failures(self) -> "Results":
        for r in self:
            if not r.ok:
                raise r.error
        return self


class Fleet:
    """Hosts of an inventory (or ad-hoc targets) and one open session per host, reused until close."""

    def __init__(self, path: str | None = None, *, parallel: int = 16, accept_new: bool = False,
                 connect_timeout: float | None = None, python: str | None = None, workdir: str | None = None,
                 warn: Callable[[str], None] | None = None, persist: float | None = None,
                 note: Callable[[str], None] | None = None):
        if parallel < 1:
            raise UsageError("--parallel must be at least 1")
        if persist is not None:
            from remote_ops.connect.mux import check_persist
            persist = check_persist(persist)
        elif os.environ.get("REMOTE_OPS_PERSIST", "").strip():
            from remote_ops.connect.mux import default_persist
            persist = default_persist()      # a bad value is a UsageError here, before any host
        if connect_timeout is not None and not 0 < connect_timeout <= 3600:
            raise UsageError(f"--connect-timeout must be a number of seconds in (0, 3600], got {connect_timeout:g}")
        self.inventory_file = path
        self.parallel = parallel
        self.accept_new = accept_new
        self.connect_timeout = connect_timeout
        self.python = python
        self.workdir = workdir
        self._warn = warn
        self.persist = persist       # kept connections (mux.py): seconds idle; 0 off (stop a kept one); None not asked
        self._note = note            # why a kept connection is not used (-v)
        self._inventory = None
        self._resolved: dict = {}
        self._sessions: dict = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ inventory and targets
    @property
    def inventory(self):
        if self._inventory is None:
            from remote_ops.connect import inventory
            # only an inventory named explicitly must exist: without one, ad-hoc targets still work
            self._inventory = inventory.load(self.inventory_file, missing_ok=self.inventory_file is None)
            if self._warn:
                for line in self._inventory.warnings:      # e.g. ansible_* variables not used, once
                    self._warn(line)
        return self._inventory

    def resolve(self, target: str | None = None):
        """The ``Host`` records a target names: inventory hosts, groups, ``all``, comma lists, or
        ad-hoc targets (``user@host:port``, ssh_config aliases, ``localhost``); python/workdir applied."""
        from remote_ops.connect import targets
        if target not in self._resolved:     # an operation resolves its target twice (inputs, fan-out)
            self._resolved[target] = targets.with_overrides(targets.resolve(self.inventory, target),
                                                            python=self.python, workdir=self.workdir)
        return list(self._resolved[target])

    @property
    def again_flags(self) -> tuple[str, ...]:
        """The global flags a printed command carries to act on these hosts (remote_ops/again.py)."""
        from remote_ops import again
        return again.global_flags(self.inventory_file, python=self.python, workdir=self.workdir)

    def names_one_host(self, target: str | None) -> bool:
        from remote_ops.connect import targets
        return targets.names_one_host(self.inventory, target)

    # ------------------------------------------------------------------ sessions
    def session(self, host):
        """The host's session, opened on first use and kept until ``close``."""
        from remote_ops.connect.sessions import session_for
        from remote_ops.connect.transport import ConnectOptions

        with self._lock:
            sess = self._sessions.get(host.name)
            if sess is None:
                sess = session_for(host, ConnectOptions(accept_new=self.accept_new,
                                                        connect_timeout=self.connect_timeout,
                                                        persist=self.persist, note=self._note),
                                   self.inventory.hosts if self._inventory is not None else None)
                self._sessions[host.name] = sess
        sess.open()
        return sess

    def drop_session(self, host) -> None:
        with self._lock:
            sess = self._sessions.pop(host.name, None)
        if sess is not None:
            sess.close()

    @property
    def sessions(self) -> list:
        with self._lock:
            return list(self._sessions.values())

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            try:
                s.close()
            except Exception:  # closing must never hide the operation's own result
                pass
        if any(getattr(s, "keep", False) for s in sessions):
            from remote_ops.connect import mux
            try:
                mux.keep(sessions, self._note)   # --persist: one background process keeps these hosts
            except OSError as exc:
                if self._note:
                    self._note(f"could not start the process keeping connections: {exc}")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ fan-out
    def run(self, target: str | None, fn: Callable[[Any, Any], Any]) -> Results:
        """``fn(host, session)`` on every host of ``target``, in parallel, bounded by ``parallel``;
        a host's error is its result, never raised."""
        hosts = self.resolve(target)
        from remote_ops import again
        flags, typed = self.again_flags, target or self.inventory.default

        def one(host) -> HostResult:
            try:
                # a command the result prints acts on this inventory and this host (remote_ops/again.py)
                return HostResult(host.name, True, again.fill_all(fn(host, self.session(host)), flags,
                                                                  host.name, typed))
            except RemoteOpsError as exc:
                exc.host = exc.host or host.name
                again.fill_error(exc, flags, host.name, typed)
                return HostResult(host.name, False, error=exc, traceback=tb.format_exc())
            except Exception as exc:  # an unexpected bug on one host must not hide the others
                err = RemoteOpsError(f"internal error: {type(exc).__name__}: {exc}",
                                     "rerun with --debug and report it", host=host.name)
                return HostResult(host.name, False, error=err, traceback=tb.format_exc())

        if len(hosts) == 1:
            out = Results([one(hosts[0])])
        else:
            from concurrent.futures import ThreadPoolExecutor   # only fleets need it (~10 ms to import)
            with ThreadPoolExecutor(max_workers=max(1, min(self.parallel, len(hosts)))) as pool:
                try:
                    out = Results(pool.map(one, hosts))
                except KeyboardInterrupt:
                    # hosts that have not sent their change send none; leaving the pool waits for those
                    # that have, so the Ctrl-C line can say what each host did (interrupts.py)
                    from remote_ops import interrupts
                    interrupts.cancel()
                    raise
        out.single = self.names_one_host(target)
        return out
