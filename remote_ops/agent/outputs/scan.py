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


def scan(out_dir, sample_re, is_partial):
    """One listing of ``out_dir``: ({index: name} of the files ``sample_re`` matches (group 1 the
    index), [indexes of the empty ones], [names ``is_partial`` marks: unfinished writes])."""
    indexes, empty, partial = {}, [], []
    with os.scandir(out_dir) as it:
        for entry in it:
            if is_partial(entry.name):
                partial.append(entry.name)
            m = sample_re.match(entry.name)
            if m:
                indexes[int(m.group(1))] = entry.name
                try:
                    if entry.stat().st_size == 0:
                        empty.append(int(m.group(1)))
                except OSError:
                    pass
    return indexes, empty, partial
