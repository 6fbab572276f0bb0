"""What a command gets to work with: inventory, sessions, parallel fan-out, output."""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from remote_ops.errors import RemoteOpsError


@dataclass
class HostResult:
    """The outcome of one host in a fleet run (fabric's GroupResult idea: result or error, never lost)."""

    host: str
    ok: bool
    value: Any = None
    error: RemoteOpsError | None = None
    traceback: str | None = None

    def to_json(self) -> dict:
        out = {"host": self.host, "ok": self.ok}
        if self.ok:
            out["result"] = self.value
        else:
            out["error"] = self.error.to_json() if self.error else None
        return out


@dataclass
class Context:
    json: bool = False
    debug: bool = False
    verbose: int = 0
    accept_new: bool = False
    inventory_file: str | None = None
    parallel: int = 16
    connect_timeout: float | None = None
    python: str | None = None            # --python: the interpreter on every named host
    workdir: str | None = None           # --workdir
    persist: float | None = None         # --persist S / --no-persist (0); None: $REMOTE_OPS_PERSIST, else 60
    _inventory: Any = None
    _sessions: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _console: Any = None
    _err: Any = None

    # ------------------------------------------------------------------ inventory
    @property
    def inventory(self):
        if self._inventory is None:
            from remote_ops import inventory
            # only an inventory named with -i must exist: without one, ad-hoc targets still work
            self._inventory = inventory.load(self.inventory_file, missing_ok=self.inventory_file is None)
            for line in self._inventory.warnings:      # e.g. ansible_* variables not used, once
                sys.stderr.write(f"remote-ops: {line}\n")
        return self._inventory

    def hosts(self, spec: str | None):
        """Inventory hosts, groups or ad-hoc targets (``user@host:port``, ssh_config aliases,
        ``localhost``), with ``--python``/``--workdir`` applied."""
        from remote_ops import targets
        return targets.with_overrides(targets.resolve(self.inventory, spec),
                                      python=self.python, workdir=self.workdir)

    # ------------------------------------------------------------------ sessions
    def session(self, host):
        from remote_ops import mux
        from remote_ops.transport import ConnectOptions, session_for

        with self._lock:
            sess = self._sessions.get(host.name)
            if sess is None:
                if self.persist is None:
                    self.persist = mux.default_persist()
                sess = session_for(host, ConnectOptions(accept_new=self.accept_new,
                                                        connect_timeout=self.connect_timeout,
                                                        persist=self.persist, note=self._note),
                                   self.inventory.hosts if self._inventory is not None else None)
                self._sessions[host.name] = sess
        sess.open()
        return sess

    def _note(self, msg: str) -> None:
        if self.verbose:
            sys.stderr.write(f"remote-ops: {msg}\n")

    def drop_session(self, host) -> None:
        with self._lock:
            sess = self._sessions.pop(host.name, None)
        if sess is not None:
            sess.close()

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        if self.verbose:
            for s in sessions:
                st = s.stats
                sys.stderr.write(f"remote-ops: {s.label}: {st.connects} connection(s), {st.execs} exec round "
                                 f"trip(s), {st.sftp_requests} SFTP request(s), {st.bytes_sent} B sent, "
                                 f"{st.bytes_received} B received; agent: {', '.join(map(str, st.agent_cache)) or '-'}, "
                                 f"host CPU {sum(st.host_cpu_s):.3f}s\n")
        stats_file = os.environ.get("REMOTE_OPS_STATS_FILE")
        if stats_file:
            # benchmarks/run.py: one JSON line per command, each host's round trips (Session.stats)
            with open(stats_file, "a") as fh:
                fh.write(json.dumps({s.label: {**s.stats.as_dict(), "ops": s.stats.op_log}
                                     for s in sessions}) + "\n")
        for s in sessions:
            try:
                s.close()
            except Exception:  # closing must never hide the command's own result
                pass
        if any(getattr(s, "keep", False) for s in sessions):
            from remote_ops import mux
            try:
                mux.keep(sessions, self._note)   # --persist: one background process keeps them
            except OSError as exc:
                self._note(f"could not start the process keeping connections: {exc}")

    def for_each_host(self, hosts, fn: Callable[[Any, Any], Any], *, connect: bool = True) -> list[HostResult]:
        """Run ``fn(host, session)`` on every host, in parallel, bounded by ``--parallel``."""
        import traceback as tb

        def one(host) -> HostResult:
            try:
                sess = self.session(host) if connect else None
                return HostResult(host.name, True, fn(host, sess))
            except RemoteOpsError as exc:
                exc.host = exc.host or host.name
                return HostResult(host.name, False, error=exc, traceback=tb.format_exc())
            except Exception as exc:  # an unexpected bug on one host must not hide the others
                err = RemoteOpsError(f"internal error: {type(exc).__name__}: {exc}",
                                     "rerun with --debug and report it", host=host.name)
                return HostResult(host.name, False, error=err, traceback=tb.format_exc())

        hosts = list(hosts)
        if len(hosts) == 1:
            return [one(hosts[0])]
        from concurrent.futures import ThreadPoolExecutor   # only fleets need it (~10 ms to import)
        with ThreadPoolExecutor(max_workers=max(1, min(self.parallel, len(hosts)))) as pool:
            return list(pool.map(one, hosts))

    # ------------------------------------------------------------------ output
    @property
    def console(self):
        if self._console is None:
            from rich.console import Console
            import os
            # piped output (scripts, CI logs) must not be cut to 80 columns: tables would truncate
            wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
            self._console = Console(highlight=False, soft_wrap=True, width=wide)
        return self._console

    @property
    def err(self):
        if self._err is None:
            from rich.console import Console
            self._err = Console(stderr=True, highlight=False)
        return self._err

    def emit(self, data: Any, human: Callable[[Any], None] | None = None) -> None:
        if self.json or human is None:
            sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
            sys.stdout.flush()
        else:
            human(self.console)

    def report_failures(self, results: list[HostResult]) -> None:
        """One plain line per failed host on stderr (never wrapped: scripts grep these)."""
        for r in results:
            if not r.ok and r.error is not None:
                sys.stderr.write(f"remote-ops: {r.error.one_line()}\n")
                if self.debug and r.traceback:
                    sys.stderr.write(r.traceback)

    def fleet(self, hosts, fn: Callable[[Any, Any], Any], render_one: Callable[[Any, str, Any], None], *,
              summary: Callable[[Any], str] | None = None,
              exit_for: Callable[[Any], int] | None = None) -> int:
        """Run ``fn(host, session)`` on every host in parallel and report like every fleet command:
        people get each host's output, then (for several hosts) a per-host table; ``--json`` gets one
        document (``{"hosts": [...], "failed": [...]}`` for several hosts). Returns the exit status:
        a failed host's status, else the worst of ``exit_for(value)``."""
        results = self.for_each_host(hosts, fn)
        if self.json:
            if len(results) == 1 and results[0].ok:
                self.emit(results[0].value)
            else:
                self.emit({"hosts": [r.to_json() for r in results],
                           "failed": [r.host for r in results if not r.ok]})
        else:
            for r in results:
                if r.ok:
                    render_one(self.console, r.host, r.value)
            if len(results) > 1:
                self.host_table(results, summary)
        self.report_failures(results)
        failed = [r for r in results if not r.ok]
        if failed:
            return self.fleet_status(results)
        return max((exit_for(r.value) if exit_for else 0) for r in results)

    def host_table(self, results: list[HostResult], summary: Callable[[Any], str] | None = None) -> None:
        from rich.table import Table
        from rich.text import Text

        t = Table(title_justify="left", show_edge=False)
        t.add_column("host")
        t.add_column("status")
        t.add_column("result")
        for r in results:
            if r.ok:
                t.add_row(r.host, Text("ok", style="green"), Text(summary(r.value) if summary else "done"))
            else:
                t.add_row(r.host, Text("FAILED", style="red"), Text(r.error.one_line() if r.error else "?"))
        self.console.print(t)

    def fleet_status(self, results: list[HostResult]) -> int:
        """Exit status of a fleet run: the first failed host's status, else OK."""
        from remote_ops.errors import Exit
        for r in results:
            if not r.ok:
                return int(r.error.exit_status) if r.error else int(Exit.REMOTE)
        return int(Exit.OK)
