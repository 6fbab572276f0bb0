"""Following a job from the Python API (api.Inventory.follow) and the CLI's printers of the same
events (extract --tail, logs --follow), over the real sshd with the torch stand-in job."""

from __future__ import annotations

import json

import pytest

from remote_ops import api
from remote_ops.errors import UsageError
from remote_ops.extract.follow import End, Line, Progress
from tests.conftest import write_inventory
from tests.test_jobs_ssh import Env, _no_job_left_behind  # noqa: F401  (its autouse fixture)

pytestmark = pytest.mark.timeout(180)


def test_tail_prints_the_events_follow_yields(tmp_path, sshd, cli):
    """--tail --json prints each event's to_json(); following the ended job again through the API
    from the log's start gives the same lines and the same end."""
    env = Env(tmp_path, sshd, ["--max-samples", "24", "--sleep", "0.3"], {"expected_samples": 24})
    status, out, err = cli(*env.argv("extract", "testhost", "--tail", "--json"))
    assert status == 0, err
    printed = [json.loads(line) for line in out.splitlines()]
    assert printed[0]["event"] == "job" and printed[-1]["event"] == "end"
    assert {p["event"] for p in printed} >= {"job", "line", "progress", "snapshot", "end"}
    snap = next(p for p in printed if p["event"] == "snapshot")     # the host's status record
    assert snap["state"] == "running" and "samples" in snap
    job_id = printed[0]["job"]["job_id"]

    with api.open_inventory(str(env.inventory)) as inv:
        events = list(inv.follow("testhost", job_id))
        newest = list(inv.follow("testhost"))         # no job, no playbook: the host's newest job
    assert isinstance(events[-1], End) and all(not isinstance(e, End) for e in events[:-1])
    lines = [e.text for e in events if isinstance(e, Line)]
    assert sum(" starting: " in x for x in lines) == 1 and "ended: exit code 0" in lines[-1]
    assert lines == [p["text"] for p in printed if p["event"] == "line"]
    assert any(isinstance(e, Progress) and e.done and e.state.n == 24 and e.state.desc == "Generating hidden states"
               for e in events)
    end = events[-1].status
    assert end["state"] == "succeeded" and end["exit_code"] == 0 and end["job_id"] == job_id
    assert printed[-1]["status"]["state"] == "succeeded"
    assert [e.to_json() for e in newest if isinstance(e, Line)] == [e.to_json() for e in events if isinstance(e, Line)]
    with api.open_inventory(str(env.inventory)) as inv:     # from an offset: only what came after it
        size = inv.logs("testhost", job=job_id, lines=1)[0].value.next
        tail_only = list(inv.follow("testhost", job_id, offset=size))
    assert [type(e) for e in tail_only] == [End] and tail_only[0].status["state"] == "succeeded"


def test_logs_follow_prints_the_rest_of_a_running_job(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--max-samples", "12", "--sleep", "0.3"])
    assert cli(*env.argv("extract", "testhost"))[0] == 0
    env.wait_log("Generating hidden states")
    status, out, err = cli(*env.argv("logs", "testhost", "--follow"))
    assert status == 0, err
    assert "Generating hidden states" in out and "succeeded" in out.splitlines()[-1]
    assert out.count(" starting: ") == 1          # the lines so far, then only the new ones


def test_follow_takes_one_host_and_says_so_before_contacting_any(tmp_path):
    inv_path = write_inventory(tmp_path / "inv.yaml", {
        "a": {"hostname": "127.0.0.1", "port": 9}, "b": {"hostname": "127.0.0.1", "port": 9}},
        groups={"both": ["a", "b"]})
    with api.open_inventory(str(inv_path)) as inv:
        with pytest.raises(UsageError, match="follow takes one host; 'both' names 2"):
            inv.follow("both")


def test_tail_attaching_to_a_long_log_prints_its_last_lines_then_follows(tmp_path, sshd, cli):
    """extract --tail on a running job whose log passed 8 KiB: the last 20 lines (logs), then the
    follow from where they end to the job's end: the log's first line is never printed."""
    import time

    env = Env(tmp_path, sshd, ["--max-samples", "2000", "--ticks", "--hang-at", "900"])
    assert cli(*env.argv("extract", "testhost"))[0] == 0
    d = env.wait_log("tick ")
    deadline = time.time() + 60
    while (d / "log").stat().st_size <= 8192 and time.time() < deadline:
        time.sleep(0.2)
    assert (d / "log").stat().st_size > 8192
    p = env.subprocess("extract", "testhost", "--tail")
    try:
        assert "attached to running job" in p.stderr.readline()   # attached: stop cannot race a new job
        time.sleep(1)
        assert cli(*env.argv("stop", "testhost", "--grace", "1"))[0] == 0
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 1, err                       # a stopped job: exit 1, as status says
    assert "tick " in out and " starting: " not in out
    assert ": stopped after " in out.splitlines()[-1]
