"""Following a job's log: tqdm-aware line splitting, and a follower that survives dropped connections.

The host streams raw log bytes from a byte offset (op ``jobs.tail``). ``LineSplitter`` turns them
into permanent lines (ended by ``\\n``) and progress updates (tqdm's ``\\r`` rewrites), so a tqdm
bar becomes one live progress bar instead of an endless line. ``Follower`` keeps the offset,
reconnects with backoff when the connection drops, and only ends when the host says the job
reached a terminal state: a closed stream is never taken for the end of the job.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from remote_ops.connect import agent_requests as rq
from remote_ops.errors import AgentError, TimeoutError_, UnreachableError

# tqdm's default format: "desc: 45%|####      | 45/100 [00:01<00:02, 30.1it/s]" (desc optional,
# the rate may be "?it/s" or "s/it", total may be unknown: "45it [00:01, 30.1it/s]").
TQDM_RE = re.compile(
    r"^(?:(?P<desc>.*?):\s*)?\s*(?P<pct>\d{1,3})%\|(?P<bar>[^|]*)\| ?(?P<n>[\d.]+[kMG]?)/(?P<total>[\d.]+[kMG]?)"
    r" ?\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:?]+)(?:, ?(?P<rate>[^\]]*))?\]")
PROGRESS_PREFIX = "extract-progress "   # the shipped script's progress lines (agent/job/status.py reads them)
TQDM_NOTOTAL_RE = re.compile(
    r"^(?:(?P<desc>.*?):\s*)?(?P<n>[\d.]+[kMG]?)(?P<unit>[A-Za-z/]*) \[(?P<elapsed>[\d:]+)(?:, ?(?P<rate>[^\]]*))?\]")


def _num(s: str | None) -> float | None:
    if not s:
        return None
    mult = {"k": 1e3, "M": 1e6, "G": 1e9}.get(s[-1], 1)
    try:
        return float(s.rstrip("kMG")) * mult
    except ValueError:
        return None


@dataclass
class TqdmState:
    desc: str
    n: float
    total: float | None
    pct: int | None
    elapsed: str
    remaining: str | None
    rate: str | None
    text: str          # the bar exactly as tqdm wrote it
    end: int = 0       # where the bar ends in the line (text after it is ordinary output)

    def to_json(self) -> dict:
        return {"desc": self.desc, "n": self.n, "total": self.total, "pct": self.pct,
                "elapsed": self.elapsed, "remaining": self.remaining, "rate": self.rate}


def parse_tqdm(line: str) -> TqdmState | None:
    m = TQDM_RE.match(line)
    if m:
        return TqdmState(desc=(m.group("desc") or "").strip(), n=_num(m.group("n")) or 0.0,
                         total=_num(m.group("total")), pct=int(m.group("pct")),
                         elapsed=m.group("elapsed"), remaining=m.group("remaining"),
                         rate=(m.group("rate") or "").strip() or None, text=line[:m.end()], end=m.end())
    m = TQDM_NOTOTAL_RE.match(line)
    if m and ("it/s" in (m.group("rate") or "") or "s/it" in (m.group("rate") or "") or m.group("unit")):
        return TqdmState(desc=(m.group("desc") or "").strip(), n=_num(m.group("n")) or 0.0, total=None,
                         pct=None, elapsed=m.group("elapsed"), remaining=None,
                         rate=(m.group("rate") or "").strip() or None, text=line[:m.end()], end=m.end())
    return None


class LineSplitter:
    """Feed raw log text; get ``("line", str)`` for finished lines and ``("progress", TqdmState)``
    for the latest state of a bar (also for a bar still being drawn without a terminator)."""

    def __init__(self):
        self.pending = ""
        self._shown: str | None = None

    def feed(self, text: str) -> Iterator[tuple[str, object]]:
        self.pending += text
        while True:
            m = re.search(r"\r\n|\n|\r", self.pending)
            if not m:
                break
            if m.group() == "\r" and m.end() == len(self.pending):
                break   # maybe the first half of a \r\n split across two reads
            piece, term = self.pending[:m.start()], m.group()
            self.pending = self.pending[m.end():]
            if term == "\r":
                st = parse_tqdm(piece)
                if st is not None and piece != self._shown:
                    self._shown = piece
                    yield "progress", st
                elif st is None and piece.strip():
                    # a carriage-return rewrite that is not a tqdm bar: keep its latest text only
                    yield "transient", piece
                continue
            st = parse_tqdm(piece)
            if st is not None:
                yield "progress", st
                yield "bar-done", st
                rest = piece[st.end:]
                if rest.strip():
                    yield "line", rest
            else:
                yield "line", piece
            self._shown = None
        if self.pending and self.pending != self._shown:
            st = parse_tqdm(self.pending)
            if st is not None:
                self._shown = self.pending
                yield "progress", st

    def flush(self) -> Iterator[tuple[str, object]]:
        if self.pending.strip():
            st = parse_tqdm(self.pending)
            yield ("bar-done", st) if st is not None else ("line", self.pending)
        self.pending = ""


# ------------------------------------------------------------------ follower
class Follower:
    """Streams ``jobs.tail`` from ``offset`` until the job ends; reconnects on connection loss.

    ``events()`` yields ("log", text), ("snapshot", dict), ("reconnecting", message) and returns the
    final status record; ``run()`` hands them to ``on_event(kind, payload)`` instead (follow.py
    turns them into the typed events of ``--tail``).
    """

    def __init__(self, open_session: Callable, drop_session: Callable, ref: dict, *, offset: int = 0,
                 on_event: Callable[[str, object], None] | None = None, budget: float = 120.0,
                 read_timeout: float = 30.0, snapshot_every: float = 5.0, reconnect_for: float = 900.0,
                 poll: float = 0.05, sleep: Callable[[float], None] = time.sleep):
        self.open_session = open_session
        self.drop_session = drop_session
        self.ref = dict(ref)
        self.offset = offset
        self.on_event = on_event
        self.budget = budget
        self.read_timeout = read_timeout
        self.snapshot_every = snapshot_every
        self.reconnect_for = reconnect_for
        self.poll = poll
        self.sleep = sleep
        self.reconnects = 0
        self.had_job = False   # the host answered about the job once: only then is a drop reconnected

    def _one_stream(self) -> Iterator[tuple[str, object]]:
        session = self.open_session()
        req = rq.jobs_tail(**self.ref, offset=self.offset, budget=self.budget, poll=self.poll,
                           snapshot_every=self.snapshot_every)
        result = None
        for msg in session.stream(*req, timeout=self.read_timeout):
            self.had_job = True
            if "event" in msg:
                ev = msg["event"]
                if ev.get("type") == "log":
                    start, data = int(ev["offset"]), ev["data"]
                    if start < self.offset:   # overlap after a reconnect: skip what was received
                        data = data[len(data.encode()[:self.offset - start].decode("utf-8", "ignore")):]
                    if data:
                        yield "log", data
                    self.offset = max(self.offset, int(ev["next"]))
                elif ev.get("type") == "snapshot":
                    yield "snapshot", ev
            elif "result" in msg:
                result = msg["result"]
        return result

    def events(self) -> Iterator[tuple[str, object]]:
        """("log", text), ("snapshot", dict), ("reconnecting", message) until the job ends; the
        generator's return value (``StopIteration.value``) is the job's final status record."""
        backoff, down_since = 0.5, None
        while True:
            try:
                result = yield from self._one_stream()
            except (UnreachableError, TimeoutError_, AgentError, OSError, EOFError) as exc:
                if isinstance(exc, AgentError) and exc.kind not in (None, "agent-exit"):
                    raise   # a real answer from the agent (e.g. no such job), not a dropped link
                if not self.had_job:
                    # the first connection failed: nothing is known of the job, so there is nothing
                    # to keep following; fail as `logs --follow` does (its error, exit 3)
                    if isinstance(exc, (OSError, EOFError)):
                        raise UnreachableError(f"cannot follow the job: {exc or type(exc).__name__}") from None
                    raise
                result = None
                reason = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            else:
                reason = "the stream closed before the job ended"
            if result is not None:
                self.offset = max(self.offset, int(result.get("next") or 0))
                if result.get("ended"):
                    return result["status"]
                backoff, down_since = 0.5, None
                continue   # time budget used up: poll again on a fresh channel
            # Dropped: never mistake this for the end of the job.
            now = time.monotonic()
            down_since = down_since or now
            if now - down_since > self.reconnect_for:
                raise UnreachableError(f"lost the connection for {int(now - down_since)}s while following "
                                       "the job; it keeps running on the host",
                                       "reattach later with: remote-ops logs HOST " + (
                                           f"--job {self.ref['job_id']} " if self.ref.get("job_id") else "")
                                       + "--follow")
            yield "reconnecting", f"{reason}; reconnecting in {backoff:g}s (the job keeps running)"
            try:
                self.drop_session()
            except Exception:  # the old connection is already broken; closing it may fail too
                pass
            self.sleep(backoff)
            backoff = min(backoff * 2, 15.0)
            self.reconnects += 1

    def run(self) -> dict:
        """``events()`` handed to ``on_event(kind, payload)``; returns the final status record."""
        gen = self.events()
        while True:
            try:
                kind, payload = next(gen)
            except StopIteration as done:
                return done.value
            if self.on_event is not None:
                self.on_event(kind, payload)


def token_text(st: dict, lead: str = "") -> str:
    """"14.2k tok/s, ETA 5m10s" from a status record's (or snapshot's) token fields, which come from
    the job's ``extract-progress`` lines (agent/job/status.py last_progress); "" when it has none."""
    from remote_ops.units import fmt_duration
    parts = []
    rate = st.get("tokens_per_s")
    if rate:
        parts.append(f"{rate / 1000:.1f}k tok/s" if rate >= 1000 else f"{rate:.0f} tok/s")
    if st.get("eta_s") is not None and st.get("state", "running") in ("running", "starting"):
        parts.append(f"ETA {fmt_duration(st['eta_s'])}")
    return lead + ", ".join(parts) if parts else ""


def bound_text(st: dict, brief: bool = False) -> str:
    """"disk-bound (writes at 0.93 of the disk's measured 1.25 GB/s)" for a running job's status record or
    snapshot (extract/plan.py bound_of); "" when the record says nothing of the job's writes, and with
    ``brief`` (the live line of --tail) also for a job without a plan or without tokens/s yet."""
    if "write" not in st or st.get("state", "running") not in ("running", "starting"):
        return ""
    from remote_ops.extract.plan import bound_of
    b = st.get("bound") or bound_of(st)
    if b["bound"] == "unknown" and brief and b.get("missing") != "disk":
        return ""
    if b["bound"] == "unknown":
        return f"bound unknown: {b['why']}"
    return (f"{b['bound'].replace('gpu', 'GPU')}-bound (writes at {b['ratio']:.2f} of the disk's measured "
            f"{b['disk_bytes_per_s'] / 1e9:.2f} GB/s)")


def disk_observed_text(st: dict) -> str:
    """For an ended job whose writes were held back by its disk: "disk: this job wrote 1.05 GB/s, waiting
    6.2 s of 16.5 s for it; kept for the next plan on /mnt (the lower of it and the write test)"
    (agent/job/diskspeed.py record_observed); "" otherwise (the JSON's ``disk_observed`` says why not)."""
    d = st.get("disk_observed") or {}
    o = d.get("observed") or {}
    if not d.get("recorded") or not o.get("bytes_per_s"):
        return ""
    return (f"disk: this job wrote {o['bytes_per_s'] / 1e9:.2f} GB/s, waiting {o.get('waited_s', 0):.1f} s of "
            f"{o.get('seconds', 0):.1f} s for it; kept for the next plan on {d.get('mount')} (the lower of it and "
            "the write test)")


def snapshot_text(snap: dict) -> str:
    parts = []
    s = snap.get("samples") or {}
    if s:
        parts.append(f"outputs {s.get('done', 0)}" + (f"/{s['expected']}" if s.get("expected") else ""))
    if snap.get("rate_per_s"):
        parts.append(f"{snap['rate_per_s']:.2f} samples/s")
    tok = snap.get("tokens") or {}
    if tok.get("total"):
        parts.append(f"tokens {tok.get('done') or 0}/{tok['total']}")
    if token_text(snap):
        parts.append(token_text(snap))
    if bound_text(snap, brief=True):
        parts.append(bound_text(snap, brief=True))
    g = snap.get("gpu")
    if g and g.get("gpus"):
        for x in g["gpus"]:
            used, total = x.get("memory_used_mib"), x.get("memory_total_mib")
            mem = f"{used / 1024:.1f}/{total / 1024:.0f}GiB" if used is not None and total else "?"
            util = f"{x['utilization_pct']}%" if x.get("utilization_pct") is not None else "?"
            parts.append(f"gpu{x.get('index')} {mem} {util}")
    elif g and g.get("error"):
        parts.append(f"gpu: {g['error']}")
    wd = snap.get("watchdog")
    if wd and wd.get("stalled"):
        parts.append(f"WATCHDOG: no progress for {int(wd.get('stalled_for_s') or 0)}s")
    return " | ".join(parts) or snap.get("state", "")
