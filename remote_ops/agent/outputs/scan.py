"""What the output checks (verify.py: data_<N>.pt; outputs/safetensors.py: hs_<N>.safetensors) share: how many
items a list in the answer holds at most, and torch imported with the failure every verify gives."""

import os

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


def scan(out_dir, layout=None, strays=None):
    """One listing of ``out_dir`` by the layout's rule (outputs/layout.py): ({index: name} of its
    sample files, [indexes of the empty ones], [unfinished writes]). Only regular files count (a link
    is never followed); ``strays`` (a dict), when given, gets ``odd`` (names that only look like a
    sample: never counted) and ``links`` (sample-like names that are not regular files)."""
    from . import layout as lay
    layout = layout or lay.DEFAULT
    indexes, empty, partial = {}, [], []
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
            indexes[i] = name
            try:
                if entry.stat(follow_symlinks=False).st_size == 0:
                    empty.append(i)
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
