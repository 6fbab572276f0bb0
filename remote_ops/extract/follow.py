"""Following a job: the events ``--tail`` and ``logs --follow`` print, for the CLI and for scripts.

``follow(...)`` streams the job's log from a byte offset (``tail.Follower``: reconnects when the
connection drops, ends only when the host says the job ended) and yields typed events: a finished
``Line``, a tqdm ``Progress`` update, a ``Transient`` ``\\r`` rewrite that is not a bar, a ``Snapshot``
(the host's periodic status record: samples, rate, GPUs, watchdog, whatever the agent adds), a
``Reconnecting`` note, and last the ``End`` with the job's final status record. Nothing here prints:
``commands/follow.py`` renders these events for a terminal, a pipe or ``--json``.

    import remote_ops.api as ro

    with ro.open_inventory("inventory.yaml") as inv:
        for ev in inv.follow("gpu1"):
            if ev.kind == "line":
                print(ev.text)
        print(ev.status["state"])                    # the last event is End
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Iterator

from remote_ops.extract.tail import Follower, LineSplitter, TqdmState


@dataclass(frozen=True)
class FollowEvent:
    """Base of the events; ``to_json()`` is the object ``--tail --json`` prints on one line, or None
    for an event it does not print."""

    kind: ClassVar[str] = ""

    def to_json(self) -> dict | None:
        return None


@dataclass(frozen=True)
class Line(FollowEvent):
    """A finished log line (ended by ``\\n``; a bar's trailing text too)."""

    text: str
    kind: ClassVar[str] = "line"

    def to_json(self) -> dict:
        return {"event": "line", "text": self.text}


@dataclass(frozen=True)
class Progress(FollowEvent):
    """The latest state of a tqdm bar; ``done`` when the bar's line was finished."""

    state: TqdmState
    done: bool = False
    kind: ClassVar[str] = "progress"

    def to_json(self) -> dict:
        return {"event": "progress", "done": self.done, **self.state.to_json()}


@dataclass(frozen=True)
class Transient(FollowEvent):
    """A ``\\r`` rewrite that is not a tqdm bar: only its latest text matters."""

    text: str
    kind: ClassVar[str] = "transient"


@dataclass(frozen=True)
class Snapshot(FollowEvent):
    """The host's status record while the job runs (``jobs.tail`` sends one every few seconds)."""

    status: dict
    kind: ClassVar[str] = "snapshot"

    def to_json(self) -> dict:
        out = {"event": "snapshot", **{k: v for k, v in self.status.items() if k != "type"}}
        if "write" in out and out.get("state") in ("running", "starting"):   # which bound: extract/plan.py
            from remote_ops.extract.plan import bound_of
            out["bound"] = bound_of(out)
        return out


@dataclass(frozen=True)
class Reconnecting(FollowEvent):
    """The connection dropped; the follower reconnects (the job keeps running)."""

    message: str
    kind: ClassVar[str] = "reconnecting"

    def to_json(self) -> dict:
        return {"event": "reconnecting", "message": self.message}


@dataclass(frozen=True)
class End(FollowEvent):
    """The job reached a terminal state: its final status record (``state``, ``exit_code``, ...)."""

    status: dict
    kind: ClassVar[str] = "end"

    def to_json(self) -> dict:
        return {"event": "end", "status": self.status}


def _pieces(split_items) -> Iterator[FollowEvent]:
    for k, v in split_items:
        if k == "line":
            yield Line(v)
        elif k == "progress":
            yield Progress(v)
        elif k == "bar-done":
            yield Progress(v, done=True)
        elif k == "transient":
            yield Transient(v)


def follow(open_session: Callable, drop_session: Callable, ref: dict, *, offset: int = 0,
           budget: float = 120.0, reconnect_for: float = 900.0) -> Iterator[FollowEvent]:
    """The job ``ref`` names (``jobs.ref_for``: ``{"job_id": ...}``, ``{"key": ...}``, or ``{}`` for
    the host's newest job) followed from byte ``offset`` of its log to its end; the last event is
    ``End``. ``open_session()`` gives the host's session, ``drop_session()`` closes a broken one.
    A Ctrl-C (KeyboardInterrupt) while waiting first yields the text already received, then is
    raised: the job keeps running on the host. A first connection that fails raises its error at
    once (UnreachableError, ...); a connection lost after the host answered about the job is
    reopened (``Reconnecting`` events) for up to ``reconnect_for`` seconds, then UnreachableError."""
    if not ref:     # the newest job on the host: only jobs.list knows it
        from remote_ops.extract.jobs import resolve_job
        ref = {"job_id": resolve_job(open_session(), ref)["job_id"]}
    split = LineSplitter()
    raw = Follower(open_session, drop_session, ref, offset=offset, budget=budget,
                   reconnect_for=reconnect_for).events()
    try:
        while True:
            try:
                kind, payload = next(raw)
            except StopIteration as done:
                status = done.value
                break
            if kind == "log":
                yield from _pieces(split.feed(payload))
            elif kind == "snapshot":
                yield Snapshot(payload)
            elif kind == "reconnecting":
                yield Reconnecting(payload)
    except KeyboardInterrupt:
        yield from _pieces(split.flush())
        raise
    yield from _pieces(split.flush())
    yield End(status)
