"""The output layout: the one rule for what a sample file is called.

A job writes one file per sample: ``data_<N>.pt`` (``data_pt``, speculators 0.3.0's generator) or
``hs_<N>.safetensors`` (``hs_safetensors``, the server flow). ``<N>`` is the sample's index in
canonical form: ASCII digits, no leading zero (``str(int(N))``). Every reader (the agent's listing,
status, verify, the run identity, shares, gather, the supervisor's counts) asks this module, so a name
that only looks like a sample (``data_02.pt``, ``"data_2.pt\\n"``, ``data_٢.pt`` with a non-ASCII digit)
is never counted as one: it is ``odd``, reported as a problem. The controller never writes a name a
host sent: it builds it from the index (``name``).

Stdlib only and without package-relative imports: the supervisor loads this file from beside itself
when it runs as its own script (agent/jobs.py writes it there).
"""

import re

DEFAULT = "data_pt"
# layout -> (prefix, suffix)
LAYOUTS = {"data_pt": ("data", "pt"), "hs_safetensors": ("hs", "safetensors")}
CONFIG = "data_config.json"
RUN = "run.json"

_NAME = re.compile(r"(data|hs)_([0-9]+)\.(pt|safetensors)")
_BY_PARTS = {parts: layout for layout, parts in LAYOUTS.items()}
# what a lax reader would have taken for a sample: any digits (str.isdigit's), spaces or line breaks
# around the parts, a trailing line break ($), leading zeros
_LAX = re.compile(r"\s*(?:data|hs)_\s*\d+\s*\.\s*(?:pt|safetensors)\s*", re.UNICODE)
# unfinished writes: the 0.3.0 script's ``.data_<N>.pt.<...>tmp`` and the server flow's ``*.safetensors.lock``
_TEMP = re.compile(r"\.data_[0-9]+\.pt\..*tmp", re.S)


def name(index, layout=None):
    """The file name of sample ``index`` in ``layout`` (``data_pt`` by default): built, never taken
    from a listing."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError("a sample index is an int >= 0, got %r" % (index,))
    prefix, suffix = LAYOUTS[layout or DEFAULT]
    return "%s_%d.%s" % (prefix, index, suffix)


def parse(filename):
    """(layout, index) when ``filename`` is exactly a sample's canonical name, else None."""
    if not isinstance(filename, str):
        return None
    m = _NAME.fullmatch(filename)
    if m is None:
        return None
    layout = _BY_PARTS.get((m.group(1), m.group(3)))
    if layout is None:
        return None
    index = int(m.group(2))
    return (layout, index) if filename == name(index, layout) else None


def index_of(filename, layout=None):
    """The sample index ``filename`` names in ``layout`` (``data_pt`` by default; ``"any"``: either
    layout), else None."""
    got = parse(filename)
    if got is None or (layout != "any" and got[0] != (layout or DEFAULT)):
        return None
    return got[1]


def is_partial(filename, layout=None):
    """An unfinished write of a sample (``layout`` None: of either layout)."""
    if layout in (None, "data_pt") and _TEMP.fullmatch(filename):
        return True
    return layout in (None, "hs_safetensors") and filename.endswith(".safetensors.lock")


def is_odd(filename):
    """A name a lax reader would count as a sample that is not a sample's canonical name: a problem
    to report, never a sample."""
    return parse(filename) is None and not is_partial(filename) and bool(_LAX.fullmatch(filename))


def pattern(layout=None):
    """A regular expression of ``layout``'s canonical names (group 1 the index), for code that wants
    one; ``index_of`` is the rule (it also refuses leading zeros)."""
    prefix, suffix = LAYOUTS[layout or DEFAULT]
    return re.compile(r"%s_(0|[1-9][0-9]*)\.%s\Z" % (prefix, suffix))


def show(filename):
    """``filename`` with every control character escaped and non-ASCII spelled out: safe to print
    and unambiguous (a name with a non-ASCII digit reads as such)."""
    return ascii(filename)[1:-1] if isinstance(filename, str) else repr(filename)
