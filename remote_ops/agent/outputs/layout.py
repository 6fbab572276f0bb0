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


def whole(path, layout=None):
    """None when the sample file at ``path`` is whole, else what is wrong, in a few words: a cheap
    check (a few bytes read, never a load) that a file a crash or a copy cut short is not counted.
    ``data_pt`` (torch's zip format): the zip's end record is where the file ends and its central
    directory lies inside the file. ``hs_safetensors``: the header's length and its tensors' last
    byte add up to the file's size."""
    import os
    import struct
    layout = layout or (parse(os.path.basename(path)) or (DEFAULT,))[0]
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        return "cannot be opened (%s)" % (exc.strerror or exc)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return "empty"
        if layout == "hs_safetensors":
            head = os.pread(fd, 8, 0)
            if len(head) < 8:
                return "shorter than a safetensors header (%d bytes)" % size
            n = struct.unpack("<Q", head)[0]
            if n > size - 8 or n > 100 << 20:
                return "its header claims %d bytes, the file has %d" % (n, size)
            import json
            try:
                header = json.loads(os.pread(fd, n, 8))
                end = max([int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"] or [0])
            except (ValueError, KeyError, TypeError, IndexError):
                return "its safetensors header does not parse"
            if 8 + n + end != size:
                return "%d bytes where its header says %d (cut short?)" % (size, 8 + n + end)
            return None
        if os.pread(fd, 4, 0) != b"PK\x03\x04":
            return None            # torch's legacy (pickle) format: only a load can tell
        tail = os.pread(fd, 22, max(0, size - 22))
        at = size - 22
        if tail[:4] != b"PK\x05\x06":         # a zip comment after the end record, or no end record
            span = min(size, 22 + 0xFFFF)
            block = os.pread(fd, span, size - span)
            k = block.rfind(b"PK\x05\x06")
            if k < 0 or len(block) - k < 22:
                return "no zip end record (cut short?)"
            tail, at = block[k:k + 22], size - span + k
        cd_size, cd_offset, comment = struct.unpack("<IIH", tail[12:22])
        if at + 22 + comment != size:
            return "the zip end record is not where the file ends (cut short, or bytes added?)"
        if cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF:    # zip64: its own records say
            return None if os.pread(fd, 4, max(0, at - 20)) == b"PK\x06\x07" else "a broken zip64 end record"
        if cd_offset + cd_size > at:
            return "its zip directory lies past the end record (cut short?)"
        return None
    finally:
        os.close(fd)


# the set bits of each byte value, lowest first (Indexes' ordered walk)
_BITS = tuple(tuple(b for b in range(8) if v >> b & 1) for v in range(256))


class Indexes:
    """A set of sample indexes as a bitmap, one bit per index up to the highest (status, verify and the
    supervisor count a listing of 300k files in 37 KB, not a set or dict of 300k entries). An index far
    beyond the bitmap's reach (more than 64 bits a member above it: a stray ``data_99999999999.pt``)
    is kept in a small set instead, so one odd name never costs its index's worth of memory. ``len``,
    ``in``, ascending iteration, ``top`` (the highest, -1 when empty)."""

    __slots__ = ("bits", "count", "top", "far")

    def __init__(self, members=()):
        self.bits, self.count, self.top, self.far = bytearray(), 0, -1, None
        for i in members:
            self.add(i)

    def add(self, i):
        """Adds ``i`` (an int >= 0); True when it was not there yet."""
        if self.far and i in self.far:
            return False
        byte = i >> 3
        if byte >= len(self.bits):
            if i >= 64 * (self.count + 1) + (1 << 20):
                if self.far is None:
                    self.far = set()
                self.far.add(i)
                self._counted(i)
                return True
            self.bits.extend(bytes(max(byte + 1 - len(self.bits), len(self.bits) // 2)))
        mask = 1 << (i & 7)
        if self.bits[byte] & mask:
            return False
        self.bits[byte] |= mask
        self._counted(i)
        return True

    def _counted(self, i):
        self.count += 1
        if i > self.top:
            self.top = i

    def __contains__(self, i):
        if i < 0:
            return False
        byte = i >> 3
        if byte < len(self.bits) and self.bits[byte] >> (i & 7) & 1:
            return True
        return bool(self.far) and i in self.far

    def __len__(self):
        return self.count

    def __bool__(self):
        return self.count > 0

    def __iter__(self):
        far = sorted(self.far) if self.far else ()
        k = 0
        bits = self.bits
        for byte in range(len(bits)):
            v = bits[byte]
            if v:
                base = byte << 3
                for b in _BITS[v]:
                    i = base + b
                    while k < len(far) and far[k] < i:
                        yield far[k]
                        k += 1
                    if k < len(far) and far[k] == i:
                        k += 1
                    yield i
        yield from far[k:]

    def absent(self, start, stop, step=1):
        """The indexes of ``range(start, stop, step)`` not in the set, ascending (a generator)."""
        for i in range(start, stop, step):
            if i not in self:
                yield i
