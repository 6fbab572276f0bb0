"""Errors that reach the user as one clear line, and the exit statuses they map to."""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    """Exit statuses of the CLI. Scripts may rely on these numbers."""

    OK = 0
    FINDINGS = 1          # check found incompatibilities; a job failed; outputs incomplete (a group: its first failed host's status wins)
    USAGE = 2             # bad arguments, inventory or playbook
    UNREACHABLE = 3       # TCP connection refused / no route / DNS
    AUTH = 4              # authentication refused
    TIMEOUT = 5           # connect or command timeout
    HOSTKEY = 6           # unknown or changed host key
    REMOTE = 7            # the remote agent failed (bad interpreter, crash)
    REFUSED = 8           # an operation refused to run (preflight, anchor, validation, lock)
    IMPORT = 9            # preflight: the job's interpreter cannot import the job's modules
    INTERRUPTED = 130


class RemoteOpsError(Exception):
    """An error meant for the user: one line of what/where, an optional hint of what to do."""

    exit_status: Exit = Exit.REMOTE
    kind: str | None = None     # the agent failure kind behind it, if any (remote_ops/agent/contract.py)
    details: dict | None = None  # structured context for --json (e.g. a refused extract's "preflight")

    def __init__(self, message: str, hint: str | None = None, *, exit_status: Exit | None = None,
                 host: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.host = host
        if exit_status is not None:
            self.exit_status = exit_status

    def one_line(self) -> str:
        where = f"{self.host}: " if self.host else ""
        hint = f" ({self.hint})" if self.hint else ""
        line = f"{where}{self.message}{hint}"
        # a user or host value holding a line break (host name, path, payload) must not split the
        # line, nor an escape sequence act on the terminal: every character str.splitlines() breaks
        # on, and every other control character (tab kept), is escaped (remote_ops/termsafe.py)
        from remote_ops.termsafe import clean
        return clean(line)

    def to_json(self) -> dict:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint,
                "exit_status": int(self.exit_status), "host": self.host, **(self.details or {})}


class UsageError(RemoteOpsError):
    exit_status = Exit.USAGE


class ConfigError(UsageError):
    """A bad inventory or playbook; the message names file and line."""

    def __init__(self, path: str, line: int | None, problem: str, hint: str | None = None):
        loc = f"{path}:{line}" if line else str(path)
        super().__init__(f"{loc}: {problem}", hint)
        self.path = str(path)
        self.line = line
        self.problem = problem


class UnreachableError(RemoteOpsError):
    exit_status = Exit.UNREACHABLE


class AuthError(RemoteOpsError):
    exit_status = Exit.AUTH


class TimeoutError_(RemoteOpsError):
    exit_status = Exit.TIMEOUT


class HostKeyError(RemoteOpsError):
    exit_status = Exit.HOSTKEY


class AgentError(RemoteOpsError):
    """The remote agent could not run or raised; carries the remote traceback for --debug."""

    exit_status = Exit.REMOTE

    def __init__(self, message: str, hint: str | None = None, *, remote_traceback: str | None = None,
                 host: str | None = None, kind: str | None = None):
        super().__init__(message, hint, host=host)
        self.remote_traceback = remote_traceback
        self.kind = kind


class RefusedError(RemoteOpsError):
    exit_status = Exit.REFUSED


# ------------------------------------------------------------------ agent failures
def exit_for_kind(kind: str | None, default: Exit = Exit.REFUSED) -> Exit:
    """The exit status of a refusal caused by an agent failure of ``kind`` (``default`` when the kind
    is not a refusal: a preflight refuses on any failure of its probes)."""
    from remote_ops.agent.contract import KINDS
    spec = KINDS.get(kind or "")
    return Exit[spec.exit] if spec is not None and spec.refusal else default


def agent_error(err: dict, host: str | None = None, what: str | None = None) -> RemoteOpsError:
    """The controller's error for an agent failure record (``{"kind", "message", "hint", "traceback"}``).

    The one place a failure kind becomes an error class and an exit status, from the declarations of
    ``remote_ops/agent/contract.py``: a refusal is a ``RefusedError`` with the kind's exit status, any
    other kind (an undeclared one too) an ``AgentError`` carrying the remote traceback."""
    from remote_ops.agent.contract import KINDS
    kind = err.get("kind")
    message = err.get("message") or f"{what or 'remote operation'} failed"
    spec = KINDS.get(kind or "")
    hint = err.get("hint")
    if kind == "no-job" and host:   # the agent cannot name the host as the user does
        hint = hint.replace("HOST", host) if hint else f"list the jobs on {host} with: remote-ops status {host} --all"
    if spec is not None and spec.refusal:
        exc: RemoteOpsError = RefusedError(message, hint, host=host, exit_status=Exit[spec.exit])
        exc.kind = kind
        return exc
    exc = AgentError(message, hint, remote_traceback=err.get("traceback"), host=host, kind=kind)
    if spec is not None:
        exc.exit_status = Exit[spec.exit]
    return exc
