"""The server flow's prepared data over a real sshd (the sandbox's stand-ins; the client reads the Arrow
directory that `speculators prepare-data` saves): its identity in run.json and a changed one refused,
rows too long for the server refused before launch, refused requests never "succeeded", counts,
tokens and verify in this flow's words."""

from __future__ import annotations

import json

import pytest
import yaml

from remote_ops.sandbox_assets import prepared_data
from tests.extract.test_server_flow import Env, cli_json, marker_pids

pytest.importorskip("pyarrow")
pytestmark = pytest.mark.timeout(240)


def data_rows(n=10, long=(), long_len=40):
    return [[1] + [(i * 37 + k * 11) % 1000 + 4 for k in range(long_len if i in long else 5 + (i % 4) * 3)]
            for i in range(n)]


class DataEnv(Env):
    """Env whose client reads a prepared Arrow directory; ``max_model_len`` on the server's command."""

    def __init__(self, tmp_path, sshd, rows, *, max_samples=5000, max_model_len=None):
        super().__init__(tmp_path, sshd, samples=max_samples, client_args=["--max-retries", "0"])
        self.prepared = tmp_path / "prepared"
        prepared_data.write(str(self.prepared), rows)
        self.set(max_model_len=max_model_len)

    def set(self, *, max_model_len=None, max_samples=None):
        doc = yaml.safe_load(self.playbook.read_text())
        ex = doc["extract"]
        cmd = ex["command"]
        cmd[cmd.index("--preprocessed-data") + 1] = str(self.prepared)
        if max_samples is not None:
            cmd[cmd.index("--max-samples") + 1] = str(max_samples)
        srv = ex["server"]["command"]
        if "--max-model-len" in srv:
            del srv[srv.index("--max-model-len"):srv.index("--max-model-len") + 2]
        if max_model_len is not None:
            srv += ["--max-model-len", str(max_model_len)]
        self.playbook.write_text(yaml.safe_dump(doc, sort_keys=False))


def mtimes(env):
    return {p.name: p.stat().st_mtime_ns for p in env.files()}


def test_rows_too_long_for_the_server_are_refused_before_launch(tmp_path, sshd, cli):
    env = DataEnv(tmp_path, sshd, data_rows(10, long=(5, 7)), max_model_len=32)
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status != 0
    assert "2 of its 10 rows have max_model_len (32) tokens or more (longest 41; rows 5, 7)" in err
    assert "--seq-length 31" in err and "--max-model-len to 42" in err
    assert env.jobdirs() == [] and env.files() == []          # nothing started, nothing written
    # only the rows the job sends count: the first 5 of them are all short
    env.set(max_model_len=32, max_samples=5)
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    assert "5/5 samples" in out and len(env.files()) == 5
    # verify counts what the job was asked for (max_samples 5), not the 10 rows run.json records
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"] and rec["expected"] == 5 and rec["missing_after_last"] == 0, rec


def test_complete_run_counts_rows_tokens_and_compares_every_file_then_changed_data_is_refused(tmp_path, sshd, cli):
    rows = data_rows(10)
    env = DataEnv(tmp_path, sshd, rows, max_model_len=64)       # max_samples 5000 > 10 rows
    status, out, err = cli(*env.argv("extract", "testhost", "--dry-run"))
    assert status == 0, err + out
    assert "prepared data: 10 rows (seq_len), the longest of the 10 the job sends 15 tokens, under max_model_len 64" in out + err
    assert "fewer than max_samples 5000: the job will write 10" in out + err
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    assert "10/10 samples" in out
    run = json.loads((env.out / "run.json").read_text())
    ds = run["identity"]["dataset"]
    assert ds["format"] == "arrow" and ds["rows"] == 10 and ds["path"] == str(env.prepared.resolve())
    assert len(ds["sha256"]) == 64
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    job = rec["job"]
    assert job["state"] == "succeeded" and job["samples"]["done"] == 10 and job["samples"]["expected"] == 10
    assert job["tokens"]["done"] == sum(len(r) for r in rows)
    s, text, _ = cli(*env.argv("status", "testhost"))
    assert "10/10" in text and "data_<N>.pt" not in text
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"] and rec["expected"] == 10
    assert rec["identity"]["ids_compared"] == 10 and rec["identity"]["ids_differ"] == 0
    s, text, _ = cli(*env.argv("verify", "testhost", "--all"))
    assert "10 hs_<N>.safetensors files of 10 expected" in text
    assert "10 file(s) compared with their prepared data rows, 0 differ" in text
    assert "data_<N>.pt" not in text and "data_config.json" not in text
    # the prepared data changed in place: a resume is refused before the server starts, nothing changes
    before = mtimes(env)
    changed = [list(r) for r in rows]
    changed[3][1] += 1
    prepared_data.write(str(env.prepared), changed)
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status != 0
    assert "dataset.sha256" in err and "--overwrite" in err
    assert len(env.jobdirs()) == 1 and mtimes(env) == before
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s != 0 and not rec["ok"]
    assert any("changed since the run" in p for p in rec["identity"]["problems"])


def test_refused_requests_fail_the_job_and_a_second_extract_writes_only_the_missing(tmp_path, sshd, cli):
    # no --max-model-len on the server's command: the preflight cannot compare, the server refuses at its
    # own limit (the stand-in's default 4096, as vLLM's is the model's)
    rows = data_rows(8, long=(2, 6), long_len=4100)
    env = DataEnv(tmp_path, sshd, rows)
    status, out, err = cli(*env.argv("extract", "testhost", "--dry-run"))
    assert status == 0 and "no --max-model-len): not compared" in out + err
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status != 0, out
    assert "2 sample(s) refused and skipped (rows 2, 6)" in out
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    job = rec["job"]
    assert job["state"] == "failed" and job["refused"]["count"] == 2 and job["refused"]["indexes"] == [2, 6]
    assert "maximum context length" in job["error_lines"][0]
    assert job["samples"]["done"] == 6 and job["samples"]["expected"] == 8
    s, rec, _ = cli_json(cli, env, "verify", "testhost")
    assert s != 0 and rec["gap_count"] == 2 and rec["gaps"] == [2, 6]
    # the cause fixed (the server's max_model_len raised): the same run resumes, only rows 2 and 6 are written
    before = mtimes(env)
    env.set(max_model_len=8192)
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    assert "8/8 samples" in out and "Saved 2 new data points" in out
    after = mtimes(env)
    assert {k: v for k, v in after.items() if k in before} == before and len(after) == 8
    assert marker_pids(tmp_path) == []
