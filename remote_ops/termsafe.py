"""Text from the host made safe for the laptop's terminal: control characters shown, never obeyed.

A job, a host path or a GPU process name is chosen by whoever uses the host. Printed as it is, an
escape sequence in it acts on the terminal that reads it: OSC 52 writes the clipboard, OSC 0 the
window title, OSC 8 makes a hyperlink, CSI 2J clears the screen. ``clean`` writes every C0 and C1
control character, DEL and the other characters Python does not call printable (line and paragraph
separators, bidi overrides) as its escape (``\\x1b``, ``\\x9b``, ``\\u2028``); tab is kept, newline
only where the caller says so. Printable letters of any script are kept.

rich interprets markup (``[link=...]``) and emoji codes in the strings it prints: host text goes
to rich as ``Text(clean(s))``, with ``markup=False``, or through ``markup(s)`` (``rich.markup.escape``
of the cleaned text) where the line carries markup of our own. ``Console`` (the CLI's consoles,
commands/context.py) escapes control characters once more in every segment it writes, a net under
the call sites; it cannot undo markup, so the call sites still decide that.

``--json`` output is not cleaned here: JSON escapes control characters itself.
"""

from __future__ import annotations

import functools

TAB = "\t"
TAB_NEWLINE = "\t\n"


def _escape(ch: str) -> str:
    return ch.encode("unicode_escape").decode("ascii")


def clean(text, keep: str = TAB) -> str:
    """``text`` (any object: ``str()`` of it) with every character that is not printable written as
    its Python escape, except those in ``keep`` (tab; ``TAB_NEWLINE`` for text printed as several
    lines, such as a log; ``""`` for one field that must stay on one line, tab escaped too)."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():        # the common case, at C speed (space is printable, tab is not)
        return s
    return "".join(ch if ch.isprintable() or ch in keep else _escape(ch) for ch in s)


def lines(text, keep: str = TAB) -> str:
    """Multi-line host text (a log, a traceback): ``clean`` keeping the newlines (and ``keep``)."""
    return clean(text, keep + "\n")


def markup(text, keep: str = TAB_NEWLINE) -> str:
    """Host text for a rich line that carries markup of our own: cleaned (a multi-line explanation
    keeps its newlines), then its markup escaped (``rich.markup.escape``)."""
    from rich.markup import escape
    return escape(clean(text, keep))


def text(s, style: str = "", keep: str = TAB):
    """A ``rich.text.Text`` of host text: cleaned, never read as markup or emoji codes."""
    from rich.text import Text
    return Text(clean(s, keep), style=style or "")


@functools.lru_cache(maxsize=None)
def console_class():
    """``rich.console.Console`` whose every written text segment is cleaned (tab and newline kept).
    rich's own styling and cursor moves (control segments) pass as they are."""
    from rich.console import Console
    from rich.segment import Segment

    class SafeConsole(Console):
        def render(self, renderable, options=None):
            for seg in super().render(renderable, options):
                if seg.control or seg.text.isprintable():
                    yield seg
                else:
                    yield Segment(clean(seg.text, TAB_NEWLINE), seg.style, seg.control)

    return SafeConsole
