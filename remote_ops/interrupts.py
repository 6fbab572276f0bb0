"""Ctrl-C that tells the truth about the host.

A change on a host (a patch's transaction, a rollback, a job's launch) is one agent round trip that
the host completes even when the controller goes away mid-way. So the controller holds SIGINT from
the moment such a request is sent until its answer is read (``committing``): a first Ctrl-C in that
window is remembered (and acknowledged on stderr) and raised as soon as the answer is in, when the
command knows what the host did. What changed is recorded per host (``changed``), and the CLI's one
line after a Ctrl-C (``message``) says so:

    HOST: interrupted after the patch was applied (journal ID): undo with remote-ops rollback HOST
    interrupted before anything changed on HOST

A second Ctrl-C inside the window stops waiting; the line then says the outcome is unknown and
where to look. In a fleet the window's hosts run in worker threads (only the main thread gets
signals): a Ctrl-C there lets every host finish the change it has sent (``Fleet.run`` waits for
them) and ``cancel`` keeps hosts from sending a new one.

SIGINT is one per process, and so is this record (``reset`` at the start of each CLI command).
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

_lock = threading.Lock()
_changed: dict[str, list[str]] = {}      # host -> lines "interrupted after ...: what to do"
_unknown: dict[str, str] = {}            # host -> line for a change whose answer was not waited for
_cancelled = threading.Event()
_held = {"depth": 0, "signals": 0, "previous": None, "what": ""}


def reset() -> None:
    with _lock:
        _changed.clear()
        _unknown.clear()
    _cancelled.clear()


def cancel() -> None:
    """A Ctrl-C reached the main thread: no host may start a new change from now on."""
    _cancelled.set()


def changed(host: str, line: str) -> None:
    """``line``: what happened and what to do, e.g. ``the patch was applied (journal X): undo with ...``."""
    with _lock:
        _changed.setdefault(host, []).append(line)


class StopWaiting(KeyboardInterrupt):
    """A second Ctrl-C inside a window: the host's answer was not waited for."""


def before_sending() -> None:
    """Called before a window sends a further change: a Ctrl-C already held stops the command here,
    with nothing of that change sent."""
    if _held["signals"] and threading.current_thread() is threading.main_thread():
        _held["signals"] = 0
        raise KeyboardInterrupt
    if _cancelled.is_set():
        raise KeyboardInterrupt


def _on_sigint(signum, frame) -> None:
    _held["signals"] += 1
    if _held["signals"] > 1:
        raise StopWaiting
    sys.stderr.write(f"remote-ops: Ctrl-C: waiting for {_held['what']} to answer, to say what happened "
                     "(Ctrl-C again stops waiting)\n")
    sys.stderr.flush()


@contextmanager
def committing(host: str, what: str, look: str):
    """The window of one changing round trip on ``host``: SIGINT is held (main thread) until the
    body has read the host's answer and called ``changed``; a held Ctrl-C is raised on leaving.
    ``what``: "the patch", ``look``: the command that shows the outcome ("remote-ops history HOST")."""
    if _cancelled.is_set():
        raise KeyboardInterrupt
    main = threading.current_thread() is threading.main_thread()
    if main and _held["depth"] == 0:
        _held.update(signals=0, what=f"{what} on {host}", previous=signal.signal(signal.SIGINT, _on_sigint))
    if main:
        _held["depth"] += 1
    try:
        yield
    except StopWaiting:      # a second Ctrl-C: the answer was not waited for
        with _lock:
            if host not in _changed:
                _unknown[host] = (f"{host}: interrupted while {what} was being sent or answered; whether it "
                                  f"took effect is unknown: see {look}")
        raise
    finally:
        if main:
            _held["depth"] -= 1
            if _held["depth"] == 0:
                signal.signal(signal.SIGINT, _held["previous"] or signal.default_int_handler)
    # the body ended normally (an error of its own wins: it says what happened): now the held Ctrl-C
    if main and _held["depth"] == 0 and _held["signals"]:
        _held["signals"] = 0
        raise KeyboardInterrupt


def message(hosts: list[str] | None) -> str:
    """The lines after a Ctrl-C for a command that changes ``hosts`` (None: "interrupted")."""
    with _lock:
        changed_, unknown = dict(_changed), dict(_unknown)
    if hosts is None and not changed_ and not unknown:
        return "interrupted"
    names = list(hosts or [])
    names += [h for h in list(changed_) + list(unknown) if h not in names]
    lines = []
    for h in names:
        if h in changed_:
            lines += [f"{h}: interrupted after {x}" for x in changed_[h]]
        elif h in unknown:
            lines.append(unknown[h])
        else:
            lines.append(f"interrupted before anything changed on {h}")
    return "\n".join(lines) if lines else "interrupted before anything changed"
