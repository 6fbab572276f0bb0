"""Test helper: an agent operation that is a generator (``op_verify``, ``op_files``, ...) run in process
to its end, its events dropped, as the agent's protocol would run it (remote_ops/agent/protocol.py _run_one)."""

from __future__ import annotations


def drain(gen):
    """``gen`` run to its end, its yielded events dropped; its return value (the op's result)."""
    try:
        while True:
            next(gen)
    except StopIteration as stop:
        return stop.value
