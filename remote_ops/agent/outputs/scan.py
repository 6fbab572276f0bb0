"""What the output checks (verify.py: data_<N>.pt; outputs/safetensors.py: hs_<N>.safetensors) share: how many
items a list in the answer holds at most, and torch imported with the failure every verify gives."""

import os
from collections.abc import Sequence

from ..protocol import AgentFailure

MAX_LISTED = 50


def _import_torch():
    try:
        import torch
    except ImportError as exc:
        raise AgentFailure("no-torch", "torch cannot be imported by the host's interpreter (%s)" % exc,
                           "verify runs with the host's python; set 'python' in the inventory to the "
                           "environment that ran the job")
    return torch


class Listed:
    """Problems of one kind as a check finds them: the first ``limit`` kept (in the order found), all
    counted; ``len`` is the count, a slice reads the kept ones (so a check of 300k files holds a few
    problems, never one per file)."""

    __slots__ = ("items", "count", "limit")

    def __init__(self, limit=MAX_LISTED):
        self.items, self.count, self.limit = [], 0, limit

    def append(self, item):
        self.count += 1
        if len(self.items) < self.limit:
            self.items.append(item)

    def full(self):
        """True once ``limit`` are kept: what follows is only counted (``more``)."""
        return len(self.items) >= self.limit

    def more(self, n):
        """``n`` more counted, none kept."""
        self.count += n

    def __len__(self):
        return self.count

    def __bool__(self):
        return self.count > 0

    def __getitem__(self, key):
        return self.items[key]


def ends_of(members):
    """The first and the last of an ``Indexes`` (one when it holds one, none when empty)."""
    if members:
        yield next(iter(members))
        if members.top != next(iter(members)):
            yield members.top


class Without(Sequence):
    """The members of an ``Indexes`` in ascending order less the few in ``skip`` (sorted, all members),
    as a sequence ``random.sample`` draws from by position, as it drew from the list it replaces: a
    count of members per 512 indexes finds the k-th one, nothing is listed per file."""

    def __init__(self, members, skip):
        self.members, self.skip = members, skip
        bits = members.bits
        self.far = sorted(members) if members.far else None     # an index far beyond the rest: listed
        self.before, n = [], 0                                  # members below each 64-byte block
        for at in range(0, len(bits), 64):
            self.before.append(n)
            n += int.from_bytes(bits[at:at + 64], "little").bit_count()

    def __len__(self):
        return len(self.members) - len(self.skip)

    def _select(self, k):
        """The k-th member (0-based), ascending."""
        if self.far is not None:
            return self.far[k]
        import bisect
        block = bisect.bisect_right(self.before, k) - 1
        k -= self.before[block]
        bits = self.members.bits
        for byte in range(block * 64, min(len(bits), block * 64 + 64)):
            c = bin(bits[byte]).count("1")
            if k < c:
                from .layout import _BITS
                return byte * 8 + _BITS[bits[byte]][k]
            k -= c
        raise IndexError(k)

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[x] for x in range(*j.indices(len(self)))]
        if j < 0:
            j += len(self)
        if not 0 <= j < len(self):
            raise IndexError(j)
        import bisect
        k = j          # the k-th member with k - (skipped members at or below it) == j and itself not skipped
        while True:
            x = self._select(k)
            below = bisect.bisect_right(self.skip, x)
            if k - below == j and (below == 0 or self.skip[below - 1] != x):
                return x
            k = j + below

    def __iter__(self):
        skip = set(self.skip)
        return (i for i in self.members if i not in skip)


def scan(out_dir, layout=None, strays=None):
    """One listing of ``out_dir`` by the layout's rule (outputs/layout.py): (the indexes of its sample
    files, the indexes of the empty ones, [unfinished writes]); indexes as bitmaps (layout.Indexes: a
    file's name is ``layout.name(index)``). Only regular files count (a link is never followed);
    ``strays`` (a dict), when given, gets ``odd`` (names that only look like a sample: never counted)
    and ``links`` (sample-like names that are not regular files)."""
    from . import layout as lay
    layout = layout or lay.DEFAULT
    indexes, empty, partial = lay.Indexes(), lay.Indexes(), []
    odd, links = [], []
    with os.scandir(out_dir) as it:
        for entry in it:
            name = entry.name
            if lay.is_partial(name, layout):
                partial.append(name)
                continue
            i = lay.index_of(name, layout)
            if i is None:
                if lay.is_odd(name):
                    odd.append(name)
                continue
            try:
                regular = entry.is_file(follow_symlinks=False)
            except OSError:
                regular = False
            if not regular:
                links.append(name)
                continue
            indexes.add(i)
            try:
                if entry.stat(follow_symlinks=False).st_size == 0:
                    empty.add(i)
            except OSError:
                pass
    if strays is not None:
        strays.setdefault("odd", []).extend(sorted(odd))
        strays.setdefault("links", []).extend(sorted(links))
    return indexes, empty, partial


def stray_problems(strays):
    """The one-line problems for ``scan``'s strays (names escaped: they come from the host's files)."""
    from .layout import show
    out = []
    for key, what in (("odd", "file name(s) that look like samples but are not a sample's exact name "
                              "(data_<N>.pt / hs_<N>.safetensors, N in ASCII digits without leading zeros)"),
                      ("links", "sample name(s) that are not regular files (links are never followed)")):
        names = strays.get(key) or []
        if names:
            out.append("%d %s, e.g. %s: never counted; move or rename them" % (len(names), what, show(names[0])))
    return out
