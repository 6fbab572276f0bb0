"""Following a job from the Python API (api.Inventory.follow) and the CLI's printers of the same
events (extract --tail, logs --follow), over the real sshd with the torch stand-in job."""

from __future__ import annotations

import json
import re
import sys

import pytest

from remote_ops import api
from remote_ops.errors import UsageError
from remote_ops.extract.follow import End, Line, Progress
from tests.conftest import write_inventory
from tests.extract.test_jobs import Env, _no_job_left_behind  # noqa: F401  (its autouse fixture)

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


def test_logs_follow_of_a_job_that_ended_before_attaching_ends_as_a_followed_one(tmp_path, sshd, cli):
    """The job ends between extract and `logs --follow` (a loaded machine makes that happen to the test
    above): the same output as a follow that saw it end, its log then its summary line, and the exit
    status status gives (1 for a failed job), not 0 because it ended a moment earlier."""
    env = Env(tmp_path, sshd, ["--max-samples", "12", "--crash-at", "4"])
    assert cli(*env.argv("extract", "testhost", "--watch", "0"))[0] == 0
    env.wait_log(" ended: exit code ")
    status, out, err = cli(*env.argv("logs", "testhost", "--follow"))
    assert status == 1, err
    assert out.count(" starting: ") == 1 and out.count(" ended: exit code ") == 1
    lines = out.splitlines()
    ended = next(i for i, line in enumerate(lines) if " ended: exit code " in line)
    assert "failed" in lines[ended + 1] and "simulated failure" in lines[-1]    # the summary, its error lines
    status, out, err = cli(*env.argv("logs", "testhost", "--follow", "--json"))
    printed = [json.loads(line) for line in out.splitlines()]
    assert status == 1 and printed[0]["event"] == "logs" and " ended: exit code " in printed[0]["text"]
    assert printed[-1]["event"] == "end" and printed[-1]["status"]["state"] == "failed"


def test_tail_waits_for_the_supervisor_to_finish_the_log(tmp_path, monkeypatch):
    """The supervisor records the exit (exit.json) before it writes the log's "ended:" line and its
    cleanup's lines, holding run.lock until then: jobs.tail ends only after those lines, so a follower
    that attaches in that moment still gets the whole log (the job's own timing, made certain here by
    holding the lock as the supervisor does)."""
    import fcntl
    import os
    import threading
    import time

    from remote_ops.agent import jobs as agent_jobs

    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(tmp_path / "state"))
    job_id = "standin-20261202-000000-abcdef"
    d = tmp_path / "state" / "jobs" / job_id
    d.mkdir(parents=True)
    log = d / "log"
    log.write_text("job starting\nwrote 12 sample(s)\n")
    (d / "job.json").write_text(json.dumps({"key": "standin", "log": str(log), "command": ["x"]}))
    (d / "run.json").write_text(json.dumps({"job_id": job_id, "pid": 1, "started_at": 1.0}))
    (d / "exit.json").write_text(json.dumps({"exit_code": 0, "signal": None, "ended_at": 2.0, "cleanup": None}))
    lock = os.open(d / "run.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)

    def supervisor_finishes():
        time.sleep(1.5)
        with open(log, "a") as fh:
            fh.write("job ended: exit code 0\nno process of the job left\n")
        os.close(lock)                  # the supervisor exits: its lock is released

    t = threading.Thread(target=supervisor_finishes)
    t.start()
    try:
        gen = agent_jobs.op_tail({"job_id": job_id, "offset": 0, "budget": 30, "poll": 0.05})
        data = []
        while True:
            try:
                ev = next(gen)
            except StopIteration as done:
                result = done.value
                break
            if ev["type"] == "log":
                data.append(ev["data"])
    finally:
        t.join()
    assert result["ended"] and result["state"] == "succeeded"
    assert "".join(data) == log.read_text() and "".join(data).endswith("no process of the job left\n")


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


def test_follow_of_an_unreachable_host_fails_at_once_as_logs_follow_does(tmp_path, cli):
    """Nothing listens: Inventory.follow raises the connection's error on its first step (it never
    had the job, so there is nothing to reconnect to), as `logs --follow` exits 3 at once."""
    import time

    from remote_ops.errors import Exit, UnreachableError
    from remote_ops.sshd import free_port

    inv_path = write_inventory(tmp_path / "inv.yaml", {"dead": {"hostname": "127.0.0.1", "port": free_port()}})
    t0 = time.monotonic()
    with api.open_inventory(str(inv_path)) as inv:
        with pytest.raises(UnreachableError, match="connection refused") as caught:
            next(iter(inv.follow("dead", "some-job-20261202-000000-abcdef")))
    assert time.monotonic() - t0 < 10 and caught.value.host == "dead"
    assert "keeps running" not in caught.value.one_line()
    status, out, err = cli("-i", str(inv_path), "logs", "dead", "--follow", "--job", "some-job-20261202-000000-abcdef")
    assert status == Exit.UNREACHABLE and "connection refused" in err


def test_a_follow_that_had_the_job_reconnects_within_its_budget(tmp_path, sshd):
    """The host answered about the job, then every new connection is refused: Reconnecting events
    for ``reconnect_for`` seconds, then one UnreachableError saying the job keeps running."""
    import time

    from remote_ops.connect.transport import ConnectOptions, Session
    from remote_ops.errors import UnreachableError
    from remote_ops.extract import jobs
    from remote_ops.extract.follow import Reconnecting, follow
    from remote_ops.playbook.loader import load
    from remote_ops.sshd import free_port

    env = Env(tmp_path, sshd, ["--max-samples", "400", "--sleep", "0.2", "--ticks"])
    sess = env.session()
    job = jobs.launch(sess, jobs.parse_spec(load(env.playbook), sess.host))["job"]
    dead = sshd.host(python=sys.executable, port=free_port())
    holder = {"s": sess}

    def open_session():
        if holder["s"] is None:
            holder["s"] = Session(dead, ConnectOptions()).open()   # the host is gone from here on
        return holder["s"]

    def drop():
        s, holder["s"] = holder["s"], None
        if s:
            s.close()

    seen = []
    try:
        with pytest.raises(UnreachableError, match="lost the connection for .* it keeps running") as caught:
            for ev in follow(open_session, drop, {"job_id": job["job_id"]}, budget=1, reconnect_for=2):
                seen.append(ev)
                if isinstance(ev, Line) and "tick " in ev.text and holder["s"] is sess:
                    t_drop = time.monotonic()
                    sshd.server.kill_sessions()      # the link drops after the job was seen
        waited = time.monotonic() - t_drop
        reconnects = [e for e in seen if isinstance(e, Reconnecting)]
        assert reconnects and "reconnecting in" in reconnects[0].message
        assert re.search(r"reattach later with: remote-ops logs HOST --job \S+ --follow\)", caught.value.one_line())
        assert 2 <= waited < 20
    finally:
        drop()
        s = env.session()
        jobs.stop(s, pb=load(env.playbook), job=job["job_id"], grace=2)
        s.close()
