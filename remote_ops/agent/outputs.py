"""What the output checks (verify.py: data_<N>.pt; verify_hs.py: hs_<N>.safetensors) share: how many
items a list in the answer holds at most, and torch imported with the failure every verify gives."""

from .protocol import AgentFailure

MAX_LISTED = 50


def _import_torch():
    try:
        import torch
    except ImportError as exc:
        raise AgentFailure("no-torch", "torch cannot be imported by the host's interpreter (%s)" % exc,
                           "verify runs with the host's python; set 'python' in the inventory to the "
                           "environment that ran the job")
    return torch
