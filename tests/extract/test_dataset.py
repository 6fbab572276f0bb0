"""The dataset preflight: the agent's check (agent/dataset.py) and the job's own
reader (remote_ops/playbook/shipped/scripts/extract_hidden_states.py read_dataset) give the same verdict on the same
files; extract over a real sshd refuses a bad dataset with one line before anything is launched,
notes a dataset smaller than max_samples (and expects that many), and reports a job that dies at
once with its error line and a non-zero exit."""

from __future__ import annotations

import json
import sys
import time

import pytest
import yaml

from remote_ops.agent import dataset as dataset_check
from remote_ops.errors import Exit
from tests.conftest import EXTRACT_SCRIPT, load_extract_script, write_inventory

SCRIPT = EXTRACT_SCRIPT


def _script():
    return load_extract_script("extract_hidden_states_under_test")


GOOD = '{"input_ids": [1, 2, 3]}\n{"text": "hello", "loss_mask": null}\n\n{"input_ids": [4], "loss_mask": [1]}\n'
CASES = {
    "good": (GOOD, None),
    "good-limited": (GOOD, 2),
    "malformed-json": ('{"input_ids": [1]}\n{"input_ids": [1,\n', None),
    "empty": ("", None),
    "blank-only": ("\n   \n", None),
    "both-keys": ('{"input_ids": [1], "text": "a"}\n', None),
    "neither-key": ('{"ids": [1]}\n', None),
    "not-an-object": ("[1, 2]\n", None),
    "negative-id": ('{"input_ids": [1, -2]}\n', None),
    "bool-id": ('{"input_ids": [true]}\n', None),
    "empty-ids": ('{"input_ids": []}\n', None),
    "empty-text": ('{"text": ""}\n', None),
    "mask-not-binary": ('{"input_ids": [1, 2], "loss_mask": [0, 2]}\n', None),
    "mask-length": ('{"input_ids": [1, 2], "loss_mask": [1]}\n', None),
    "bad-after-the-limit": ('{"input_ids": [1]}\n{"input_ids": [2]}\nnot json\n', 2),   # the job never reads it
    "bad-before-the-limit": ('{"input_ids": [1]}\nnot json\n{"input_ids": [2]}\n', 2),
}


@pytest.mark.parametrize("case", sorted(CASES) + ["missing", "directory"])
def test_agent_check_and_the_jobs_reader_agree(tmp_path, case):
    script = _script()
    path = tmp_path / "data.jsonl"
    limit = None
    if case == "directory":
        path.mkdir()
    elif case != "missing":
        text, limit = CASES[case]
        path.write_text(text)
    try:
        records = script.read_dataset(str(path), limit)
        job = ("ok", len(records))
    except script.InputError as exc:
        job = ("refused", str(exc))
    mine = dataset_check.check(str(path), str(path), limit)
    agent = ("refused", mine["problem"]) if mine["problem"] else ("ok", min(mine["samples"], limit or 10**9))
    assert agent == job
    if case.startswith("good"):
        assert mine["exact"] and mine["samples"] == (limit or 3)


def test_huge_file_is_checked_in_bounded_time(tmp_path):
    path = tmp_path / "big.jsonl"
    line = json.dumps({"input_ids": list(range(40))}) + "\n"
    with open(path, "w") as fh:
        for _ in range(20):
            fh.write(line * 10000)          # 200,000 samples, about 30 MB
    t0 = time.monotonic()
    out = dataset_check.check(str(path), str(path), None, budget=0.05)
    took = time.monotonic() - t0
    assert took < 1.0, took
    assert out["problem"] is None and 0 < out["parsed"] < 200_000
    # the rest counted by blocks: exact if the count finished in time, else a lower bound
    assert out["samples"] == 200_000 if out["exact"] else out["parsed"] < out["samples"] < 200_000
    # with max_samples the job stops there, and so does the check
    out = dataset_check.check(str(path), str(path), 5000, budget=5)
    assert out["exact"] and out["samples"] == 5000 and out["parsed"] == 5000


def test_count_moves_on_even_when_its_time_is_already_gone(tmp_path):
    # a loaded host can reach the count after its deadline: one block is still counted
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b'{"text": "x"}\n' * 1000)
    with open(path, "rb") as fh:
        samples, ended = dataset_check._count(fh, 7, None, time.monotonic() - 1.0)
    assert (samples, ended) == (1007, True)
    big = tmp_path / "big.jsonl"
    big.write_bytes(b'{"text": "x"}\n' * (3 * dataset_check.BLOCK // 14))
    with open(big, "rb") as fh:
        samples, ended = dataset_check._count(fh, 0, None, time.monotonic() - 1.0)
    assert not ended and 0 < samples < 3 * dataset_check.BLOCK // 14


# ------------------------------------------------------------------ over the real sshd
class Job:
    def __init__(self, tmp_path, sshd, command, data: str | None = "", max_samples=24):
        self.tmp = tmp_path
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.work = tmp_path / "work"
        self.work.mkdir()
        if data is not None:
            (self.work / "data.jsonl").write_text(data)
        entry = sshd.host_entry(sys.executable, env={"REMOTE_OPS_STATE_DIR": str(self.state)},
                                workdir=str(self.work))
        self.inventory = tmp_path / "inv.yaml"
        self.inventory.write_text(yaml.safe_dump({"hosts": {"testhost": entry}}))
        self.playbook = tmp_path / "pb.yaml"
        self.playbook.write_text(yaml.safe_dump({"name": "ds", "extract": {
            "command": ["{python}", "-c", command, "--dataset", "data.jsonl", "--max-samples", str(max_samples)],
            "output_dir": str(tmp_path / "out"), "expected_samples": max_samples, "stop_grace_seconds": 1}}))

    def run(self, cli, *extra):
        return cli("-i", str(self.inventory), "extract", "testhost", "--playbook", str(self.playbook), *extra)

    def jobs(self):
        root = self.state / "jobs"
        return [p for p in root.iterdir() if p.is_dir()] if root.exists() else []

    def stop(self, cli):
        cli("-i", str(self.inventory), "stop", "testhost", "--playbook", str(self.playbook), "--grace", "1")


SLEEP = "import time; time.sleep(30)"


@pytest.mark.parametrize("data,problem", [
    (None, "cannot read dataset data.jsonl: No such file or directory"),
    ('{"input_ids": [1]}\n{"input_ids": [2]\n', "dataset data.jsonl:2: not valid JSON ("),
    ("", "dataset data.jsonl has no samples"),
    ('{"input_ids": [1]}\n\n{"input_ids": [1], "text": "x"}\n', "dataset data.jsonl:3: give exactly one of input_ids or text"),
])
def test_bad_dataset_is_refused_before_launch(tmp_path, sshd, cli, data, problem):
    job = Job(tmp_path, sshd, SLEEP, data)
    status, out, err = job.run(cli)
    assert status == Exit.REFUSED, err
    assert job.jobs() == []                  # nothing launched
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"remote-ops: testhost: preflight refused to start ds: {problem}"), err
    assert "fix the dataset (one JSON object per line" in lines[-1]


def test_fewer_samples_than_max_samples_is_a_note_and_the_expected_count(tmp_path, sshd, cli):
    data = "".join(json.dumps({"input_ids": [i + 1]}) + "\n" for i in range(5))
    job = Job(tmp_path, sshd, SLEEP, data, max_samples=24)
    try:
        status, out, err = job.run(cli, "--json")
        assert status == 0, err
        res = json.loads(out)
        assert "dataset: 5 samples, fewer than max_samples 24: the job will write 5 (expected count 5)" \
            in res["preflight"]["notes"]
        assert res["preflight"]["dataset"]["samples"] == 5 and res["preflight"]["dataset"]["expected"] == 5
        assert res["job"]["samples"]["expected"] == 5
    finally:
        job.stop(cli)


def test_a_job_dying_at_once_is_reported_by_extract(tmp_path, sshd, cli):
    job = Job(tmp_path, sshd, "import sys; print('loading'); sys.exit('error: no such model /data/m')",
              '{"input_ids": [1]}\n')
    status, out, err = job.run(cli)
    assert status == Exit.FINDINGS, out + err
    assert "failed: exit code 1: error: no such model /data/m" in out, out


def test_watch_0_returns_at_launch(tmp_path, sshd, cli):
    job = Job(tmp_path, sshd, "import sys; sys.exit('error: no such model /data/m')", '{"input_ids": [1]}\n')
    status, out, err = job.run(cli, "--watch", "0", "--json")
    state = json.loads(out)["job"]["state"]   # as launched: nobody watched it (it may have ended already)
    assert (status, state) in {(0, "starting"), (0, "running"), (1, "failed")}, (status, state, err)
    status, _, err = cli("-i", str(job.inventory), "extract", "testhost", "--watch", "-1")
    assert status == Exit.USAGE and "must be 0-60 seconds, got -1" in err, err


def test_watch_range_is_the_apis_too(tmp_path):
    """The range is checked where the parameter lives (api.Inventory.extract), so a script gets the
    same refusal as the CLI, before any host is resolved or contacted."""
    from remote_ops import api
    from remote_ops.errors import UsageError
    inv = api.Inventory(str(write_inventory(tmp_path / "inv.yaml", {"h": {"hostname": "127.0.0.1", "port": 9}})))
    for bad in (-1, 61):
        with pytest.raises(UsageError, match=f"early_death_s \\(--watch\\) must be 0-60 seconds, got {bad}"):
            inv.extract("h", early_death_s=bad)


LONG = json.dumps({"input_ids": list(range(300_000))}) + "\n"      # one line of about 2 MB
LINES_CASES = {
    # (file bytes, the line the problem is on, words of the problem)
    "non-utf8-on-line-2": (b'{"input_ids": [1]}\n{"text": "caf\xe9"}\n', 2, "not UTF-8 text (invalid continuation byte at byte 14 of the line)"),
    "non-utf8-on-line-1501": (b'{"input_ids": [1, 2, 3]}\n' * 1500 + b'{"text": "\xff"}\n', 1501, "not UTF-8 text"),
    "json-error-on-line-3": (b'{"input_ids": [1]}\n\n{"input_ids": [1,\n', 3, "not valid JSON (Expecting value at column 18)"),
    "json-error-after-a-long-line": (LONG.encode() * 2 + b'{"input_ids": [1] x}\n', 3, "not valid JSON (Expecting ',' delimiter at column 19)"),
    "non-utf8-in-a-long-line": (LONG.encode() + LONG.encode()[:-3] + b'\xc3(]}\n', 2, "not UTF-8 text"),
}


@pytest.mark.parametrize("case", sorted(LINES_CASES))
def test_a_problem_is_named_at_the_files_own_line(tmp_path, case):
    """Non-UTF-8 bytes, a JSON error, a line of megabytes: the line named is the file's line (as
    `sed -n Np` shows it), in the agent's check and in the job's own reader, word for word; the
    decoder's own "line 1" is not shown beside it."""
    data, line, words = LINES_CASES[case]
    path = tmp_path / "data.jsonl"
    path.write_bytes(data)
    assert data.split(b"\n")[line - 1]          # a line of the file, as sed -n Np numbers them
    mine = dataset_check.check(str(path), str(path), None)
    assert mine["line"] == line and mine["problem"].startswith(f"{path}:{line}: {words}"), mine["problem"]
    assert " line 1 " not in mine["problem"] and "line 2" not in mine["problem"]
    script = _script()
    with pytest.raises(script.InputError) as caught:
        script.read_dataset(str(path), None)
    assert str(caught.value) == mine["problem"]


def test_a_refusal_is_printed_once_for_a_host_and_for_a_group(tmp_path, sshd, cli):
    """The deciding problem is said once: in the error line (not also as a '  refused:' line above
    it), and for a group once per host (the per-host table's row says only 'refused')."""
    problem = "dataset data.jsonl:2: not valid JSON (Expecting ',' delimiter at column 18)"
    job = Job(tmp_path, sshd, SLEEP, '{"input_ids": [1]}\n{"input_ids": [2]\n')
    for extra in ((), ("--dry-run",)):
        status, out, err = job.run(cli, *extra)
        assert status == Exit.REFUSED, err
        assert (out + err).count(problem) == 1, out + err
    inv = yaml.safe_load(job.inventory.read_text())
    inv["hosts"]["other"] = dict(inv["hosts"]["testhost"])
    inv["groups"] = {"both": ["testhost", "other"]}
    job.inventory.write_text(yaml.safe_dump(inv))
    status, out, err = cli("-i", str(job.inventory), "extract", "both", "--playbook", str(job.playbook))
    assert status == Exit.REFUSED, err
    text = " ".join((out + err).split())
    assert text.count(problem) == 2 and "refused: see the line below" in text, out + err
    for host in ("testhost", "other"):
        assert f"remote-ops: {host}: preflight refused to start ds: {problem}" in err
