"""What a CLI command gets: the library fleet (``api.Inventory``) and output for people or ``--json``.

Commands call the fleet's operations (the same methods as the Python API) and hand the ``Results``
to ``Context.show``, the one place that turns results into output and an exit status: each host's
rendering and a per-host table for people; for ``--json`` one document whose shape
``fleet.Results.to_json`` defines (a host's record, or its error; a group's ``{"hosts", "failed"}``).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from remote_ops.errors import Exit
from remote_ops.fleet import HostResult, Results
from remote_ops.records import to_json
from remote_ops.termsafe import clean, lines

__all__ = ["Context", "HostResult", "Results"]


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
    persist: float | None = None         # --persist S / --no-persist (0); None: $REMOTE_OPS_PERSIST, else not asked
    _fleet: Any = None
    _console: Any = None
    _err: Any = None

    # ------------------------------------------------------------------ the fleet (library)
    @property
    def fleet(self):
        """The operations: ``remote_ops.api.Inventory`` over this command line's options."""
        if self._fleet is None:
            from remote_ops.api import Inventory
            self._fleet = Inventory(self.inventory_file, parallel=self.parallel, accept_new=self.accept_new,
                                    connect_timeout=self.connect_timeout, python=self.python,
                                    workdir=self.workdir, warn=self._note,
                                    persist=self.persist, note=self._note if self.verbose else None)
        return self._fleet

    @property
    def inventory(self):
        return self.fleet.inventory

    @property
    def again_flags(self) -> tuple[str, ...]:
        """The global flags a printed command carries to act on the same inventory (remote_ops/again.py)."""
        from remote_ops import again
        return again.global_flags(self.inventory_file, python=self.python, workdir=self.workdir)

    def command(self, sub: str, *words: str) -> str:
        """A command to print for pasting: ``remote-ops [-i INV ...] SUB WORDS`` quoted."""
        from remote_ops import again
        return again.command(sub, *words, flags=self.again_flags)

    def fill(self, text: str, host: str | None = None, target: str | None = None) -> str:
        """``text``'s printed commands made complete (remote_ops/again.py)."""
        from remote_ops import again
        return again.fill(text, self.again_flags, host, target)

    def hosts(self, spec: str | None):
        return self.fleet.resolve(spec)

    def session(self, host):
        return self.fleet.session(host)

    def _note(self, msg: str) -> None:
        sys.stderr.write(f"remote-ops: {clean(msg)}\n")     # a warning may quote the host

    def drop_session(self, host) -> None:
        self.fleet.drop_session(host)

    def close(self) -> None:
        if self._fleet is None:
            return
        sessions = self._fleet.sessions
        if self.verbose:
            from remote_ops.connect.transport import memo_words
            for s in sessions:
                st = s.stats
                memo = memo_words(st.check_memo)
                sys.stderr.write(f"remote-ops: {s.label}: {st.connects} connection(s), {st.execs} exec round "
                                 f"trip(s), {st.sftp_requests} SFTP request(s), {st.bytes_sent} B sent, "
                                 f"{st.bytes_received} B received; agent: {', '.join(map(str, st.agent_cache)) or '-'}, "
                                 f"host CPU {sum(st.host_cpu_s):.3f}s{'; check memo: ' + memo if memo else ''}\n")
        stats_file = os.environ.get("REMOTE_OPS_STATS_FILE")
        if stats_file:
            # benchmarks/controller/run.py: one JSON line per command, each host's round trips (Session.stats)
            with open(stats_file, "a") as fh:
                fh.write(json.dumps({s.label: {**s.stats.as_dict(), "ops": s.stats.op_log}
                                     for s in sessions}) + "\n")
        self._fleet.close()

    # ------------------------------------------------------------------ output
    @property
    def console(self):
        if self._console is None:
            from remote_ops.termsafe import console_class
            # piped output (scripts, CI logs) must not be cut to 80 columns: tables would truncate;
            # no emoji codes, and control characters escaped in all it writes (remote_ops/termsafe.py)
            wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
            self._console = console_class()(highlight=False, soft_wrap=True, width=wide, emoji=False)
        return self._console

    @property
    def err(self):
        if self._err is None:
            from remote_ops.termsafe import console_class
            # redirected (a log file, CI): no wrapping at all, a job id or pid must stay on its line;
            # at a terminal rich uses its real width
            self._err = console_class()(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty(), emoji=False)
        return self._err

    def emit(self, data: Any, human: Callable[[Any], None] | None = None) -> None:
        if self.json or human is None:
            # indented for a person at a terminal; piped (scripts, a fleet's N records) it is one
            # line from the C encoder (indent= forces the pure-Python one): the same object
            indent = 2 if sys.stdout.isatty() else None
            sys.stdout.write(json.dumps(to_json(data), indent=indent, default=str) + "\n")
            sys.stdout.flush()
        else:
            human(self.console)

    def show(self, results: Results, render_one: Callable[[Any, str, Any], None], *,
             summary: Callable[[Any], str] | None = None, exit_for: Callable[[Any], int] | None = None,
             render_failure: Callable[[HostResult], None] | None = None,
             render_group: Callable[[Any, Any], None] | None = None,
             group_exit: Callable[[Any], int] | None = None) -> int:
        """Output of every fleet command, one host or many. ``--json``: ``results.to_json()``. People:
        each host's ``render_one(console, host, record)``, a per-host table when the target named
        several, then one plain line per failed host on stderr (``render_failure`` may add detail
        before it), then ``render_group(console, results.group)`` when the operation computed a record
        over the hosts. Exit status: the first failed host's, else the worst ``exit_for(record)``
        (``group_exit(results.group)`` replaces the hosts' when given)."""
        if self.json:
            self.emit(results.to_json())
        else:
            for r in results:
                if r.ok:
                    render_one(self.console, r.host, r.value)
            if not results.single:
                self.host_table(results, summary)
            if results.group is not None and render_group is not None:
                render_group(self.console, results.group)
        for r in results:
            if not r.ok and r.error is not None:
                if render_failure is not None and not self.json:
                    render_failure(r)
                sys.stderr.write(f"remote-ops: {r.error.one_line()}\n")
                if self.debug and r.traceback:
                    sys.stderr.write(lines(r.traceback))
                    remote = getattr(r.error, "remote_traceback", None)
                    if remote:
                        sys.stderr.write("--- remote traceback ---\n" + lines(remote) + "\n")
        if results.group is not None and group_exit is not None:
            return max(group_exit(results.group), 0 if results.ok else results.exit_status)
        if not results.ok:
            return results.exit_status
        return max([exit_for(r.value) if exit_for else int(Exit.OK) for r in results] or [int(Exit.OK)])

    def host_table(self, results: list[HostResult], summary: Callable[[Any], str] | None = None) -> None:
        from rich.table import Table
        from rich.text import Text

        from remote_ops.termsafe import text
        t = Table(title_justify="left", show_edge=False)
        t.add_column("host")
        t.add_column("status")
        t.add_column("result")
        for r in results:
            if r.ok:
                t.add_row(text(r.host), Text("ok", style="green"), text(summary(r.value) if summary else "done"))
            else:
                # the error's own line follows the table on stderr (once): the row only says which kind
                t.add_row(text(r.host), Text("FAILED", style="red"), Text(_failure_word(r.error)))
        self.console.print(t)


def _failure_word(error) -> str:
    """A failed host's row in the per-host table: the kind of failure; its line is printed below."""
    from remote_ops import errors

    if error is None:
        return "?"
    kinds = ((errors.RefusedError, "refused"), (errors.UnreachableError, "unreachable"), (errors.AuthError,
             "authentication refused"), (errors.TimeoutError_, "timed out"), (errors.HostKeyError, "host key"),
             (errors.UsageError, "usage"), (errors.AgentError, "failed on the host"))
    word = next((w for k, w in kinds if isinstance(error, k)), "failed")
    return f"{word}: see the line below"
