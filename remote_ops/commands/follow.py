"""Printers of a followed job (``extract --tail``, ``logs --follow``): the events of
``api.Inventory.follow`` (extract/follow.py) rendered for a terminal (a live rich bar), a pipe
(plain lines, bar updates now and then) or ``--json`` (one object per line). Not a command."""

from __future__ import annotations

import sys
import time

from remote_ops.extract.follow import End, FollowEvent, Line, Progress, Reconnecting, Snapshot, Transient
from remote_ops.extract.tail import PROGRESS_PREFIX, snapshot_text
from remote_ops.termsafe import clean, text as safe_text


class PlainPrinter:
    """For pipes and logs: finished lines at once, bar updates at most every ``progress_every`` s.
    Every line is the host's text: its control characters are escaped (remote_ops/termsafe.py)."""

    def __init__(self, out=None, progress_every: float = 10.0, snapshot_every: float = 60.0):
        self.out = out or sys.stdout
        self.progress_every = progress_every
        self.snapshot_every = snapshot_every
        self._last_prog = 0.0
        self._last_snap = 0.0
        self._last_desc = None

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def __call__(self, ev: FollowEvent) -> None:
        now = time.monotonic()
        if isinstance(ev, Line):
            self.write(clean(ev.text) + "\n")
        elif isinstance(ev, Progress) and ev.done:
            self.write(clean(ev.state.text) + "\n")
            self._last_desc = None
        elif isinstance(ev, Progress):
            if ev.state.desc != self._last_desc or now - self._last_prog >= self.progress_every:
                self._last_desc, self._last_prog = ev.state.desc, now
                self.write(clean(ev.state.text) + "\n")
        elif isinstance(ev, Snapshot):
            if now - self._last_snap >= self.snapshot_every:
                self._last_snap = now
                self.write(f"[remote-ops] {clean(snapshot_text(ev.status))}\n")
        elif isinstance(ev, Reconnecting):
            self.write(f"[remote-ops] connection lost: {clean(ev.message)}\n")

    def close(self) -> None:
        pass


class LivePrinter:
    """For a terminal: log lines scroll above one rich progress bar and a GPU / output status line.
    The host's text (lines, a bar's description and rate, the status line) is cleaned and never read
    as markup: the bar's columns have markup off."""

    def __init__(self, console):
        from rich.console import Group
        from rich.live import Live
        from rich.progress import BarColumn, Progress as Bars, TextColumn, TimeRemainingColumn
        from rich.text import Text

        self.console = console
        self.progress = Bars(TextColumn("{task.description}", markup=False), BarColumn(),
                             TextColumn("{task.completed:.0f}/{task.fields[total_text]}", markup=False),
                             TextColumn("{task.fields[rate]}", markup=False), TimeRemainingColumn(),
                             console=console, auto_refresh=False)
        self.status = Text("", style="dim")
        self.tasks: dict[str, int] = {}
        self.live = Live(Group(self.progress, self.status), console=console, refresh_per_second=8,
                         transient=False, redirect_stdout=False)
        self.live.start()

    def __call__(self, ev: FollowEvent) -> None:
        if isinstance(ev, Line):
            if ev.text.startswith(PROGRESS_PREFIX):
                return    # the job's machine-readable progress: the status line shows it (snapshot_text)
            self.console.print(safe_text(ev.text), highlight=False, markup=False, soft_wrap=True)
        elif isinstance(ev, Progress):
            st = ev.state
            key = st.desc or "progress"
            if key not in self.tasks:
                self.tasks[key] = self.progress.add_task(clean(key), total=st.total, total_text="?", rate="")
            self.progress.update(self.tasks[key], completed=st.n, total=st.total,
                                 total_text=f"{st.total:.0f}" if st.total else "?", rate=clean(st.rate or ""))
        elif isinstance(ev, Transient):
            self.status.plain = clean(ev.text[-200:])
        elif isinstance(ev, Snapshot):
            self.status.plain = clean(snapshot_text(ev.status))
        elif isinstance(ev, Reconnecting):
            self.console.print(safe_text(f"connection lost: {ev.message}", "yellow"), highlight=False)
        self.live.refresh()

    def close(self) -> None:
        self.live.refresh()
        self.live.stop()


class JsonPrinter:
    """--json: each event's ``to_json()`` on one line (JSON Lines)."""

    def __init__(self, out=None):
        self.out = out or sys.stdout

    def emit(self, obj: dict) -> None:
        import json
        self.out.write(json.dumps(obj, default=str) + "\n")
        self.out.flush()

    def __call__(self, ev: FollowEvent) -> None:
        obj = ev.to_json()
        if obj is not None and not isinstance(ev, End):     # the end is printed by report_end
            self.emit(obj)

    def close(self) -> None:
        pass


def printer_for(ctx):
    if ctx.json:
        return JsonPrinter()
    if ctx.console.is_terminal:
        return LivePrinter(ctx.console)
    return PlainPrinter()


def print_follow(ctx, target: str | None, job_id: str, *, offset: int = 0, reattach: str | None = None) -> int:
    """Follow the job on the one host ``target`` names to its end, printing its events; the exit
    status of how it ended, or INTERRUPTED after Ctrl-C (the job keeps running)."""
    from remote_ops.errors import Exit

    printer = printer_for(ctx)
    end = None
    try:
        for ev in ctx.fleet.follow(target, job=job_id, offset=offset):
            if isinstance(ev, End):
                end = ev
            printer(ev)
    except KeyboardInterrupt:
        printer.close()
        host = ctx.hosts(target)[0].name
        # following by the job's id: never a launch (an extract would preflight again)
        msg = f"job {job_id} still running; reattach with: " + (
            reattach or ctx.command("logs", host, "--job", job_id, "--follow"))
        if ctx.json:
            JsonPrinter().emit({"event": "detached", "job_id": job_id, "message": msg})
        sys.stderr.write(f"\n{clean(msg)}\n")
        return int(Exit.INTERRUPTED)
    except BaseException:
        try:
            printer.close()
        except Exception:  # never hide the real error behind a rendering problem
            pass
        raise
    printer.close()
    return report_end(ctx, end.status)


def report_end(ctx, st: dict) -> int:
    """Print how a followed job ended (one JSON event, or its summary and error lines); its exit status."""
    from remote_ops.extract import jobs

    if ctx.json:
        JsonPrinter().emit(End(st).to_json())
    else:
        style = "green" if st["state"] == "succeeded" else "red"
        ctx.console.print(safe_text(jobs.summary_line(st), style), highlight=False)
        if st["state"] != "succeeded":
            for line in st.get("error_lines") or []:      # the job's last stderr lines
                ctx.console.print(safe_text(f"  {line}"), markup=False, highlight=False)
            if st.get("accounting"):      # a Slurm array: why sacct could not tell how its tasks ended
                ctx.console.print(safe_text(f"  {st['accounting']}"), markup=False, highlight=False)
    return jobs.exit_for(st)
