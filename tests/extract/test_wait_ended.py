"""jobs.wait_ended: what tests/extract/test_shard.py and benchmarks/controller/shard_group.py poll ``status --json`` with
(the flow itself runs over the real sshd in extract/test_shard.py). Here the documents' two shapes and the timeout."""

from __future__ import annotations

import pytest

from remote_ops.errors import TimeoutError_
from remote_ops.extract import jobs


def _group(*states):
    return {"hosts": [{"host": f"h{i}", "ok": True, "result": {"job": {"state": s}}} for i, s in enumerate(states)]}


def test_returns_the_first_document_in_which_every_job_ended():
    answers = iter([_group("running", "succeeded"), _group("failed", "succeeded"), _group("running", "running")])
    asked = []

    def read():
        asked.append(1)
        return next(answers)
    assert jobs.wait_ended(read, timeout=10, every=0) == _group("failed", "succeeded")
    assert len(asked) == 2
    assert jobs.wait_ended(lambda: {"host": "one", "job": {"state": "lost"}}, timeout=10)["job"]["state"] == "lost"


def test_times_out_naming_the_states():
    with pytest.raises(TimeoutError_) as ei:
        jobs.wait_ended(lambda: _group("running", "stopped"), timeout=0.2, every=0.05)
    assert ei.value.one_line() == "jobs still not ended after 0.2s: running, stopped"


def test_an_ended_job_whose_supervisor_still_runs_its_cleanup_is_waited_for():
    # the exit is recorded before the supervisor's cleanup and the release of the output directory: --tail waits for
    # the supervisor to let go (agent/jobs.py op_tail), and so does wait_ended
    cleaning = {"hosts": [{"host": "h0", "ok": True, "result": {"job": {"state": "succeeded", "supervisor_alive": True}}}]}
    done = {"hosts": [{"host": "h0", "ok": True, "result": {"job": {"state": "succeeded", "supervisor_alive": False}}}]}
    answers = iter([cleaning, cleaning, done])
    assert jobs.wait_ended(lambda: next(answers), timeout=10, every=0) == done
    with pytest.raises(TimeoutError_):
        jobs.wait_ended(lambda: cleaning, timeout=0.2, every=0.05)
