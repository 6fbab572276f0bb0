"""One output directory holds one run: the run identity (run.json,
remote_ops/agent/outputs/run_identity.py), the refusal of a resume into another run (extract's preflight and
the extract script's own check), extract --overwrite, and verify against the identity. End-to-end
cases run the STAND-IN job over the real sshd; each ends refused, rewritten from the right input, or
flagged by verify (non-zero), never silently mixed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from remote_ops.agent.outputs import run_identity as ri
from tests.conftest import STANDIN, load_extract_script
from tests.extract.test_jobs import Env, cli_json

pytestmark = pytest.mark.timeout(240)


# ------------------------------------------------------------------ the identity itself
def ident(**over):
    base = {"dataset": {"path": "/d.jsonl", "size": 10, "samples": 3, "lines_sha256": "a" * 64},
            "model": {"path": "/m", "config_sha256": None}, "layer_ids": [2, 4, 5, 7], "max_model_len": 64,
            "flow": "generator", "playbook": None, "shard": None, "versions": {"torch": "2.13.0"}}
    base.update(over)
    return base


def test_command_inputs_read_the_flags_the_script_takes():
    argv = ["python", "x.py", "--dataset", "d.jsonl", "--max-samples=5", "--target-model-path", "m",
            "--layer-ids", "2,4,5,7", "--max-model-len", "64", "--shard", "1/3", "--batch-size", "2",
            "--output-dir", "out"]
    assert ri.command_inputs(argv) == {"dataset": "d.jsonl", "max_samples": 5, "model": "m",
                                       "layer_ids": [2, 4, 5, 7], "max_model_len": 64,
                                       "shard": {"index": 1, "count": 3}, "output_dirs": None}
    assert ri.command_inputs(["--layer-ids", ""])["layer_ids"] is None      # the generator's choice
    assert ri.command_inputs([]) == dict.fromkeys(("dataset", "max_samples", "model", "layer_ids",
                                                   "max_model_len", "shard", "output_dirs"))
    # several output directories (A:B) are part of the identity, in order; one directory is not
    assert ri.command_inputs(["--output-dir", "/n0/hs:/n1/hs"])["output_dirs"] == ["/n0/hs", "/n1/hs"]
    assert "output_dirs" not in ri.identity(ri.command_inputs(["--output-dir", "out"]))
    two = ri.identity(ri.command_inputs(["--output-dir=/n0/hs:rel"]), cwd="/w")
    assert two["output_dirs"] == ["/n0/hs", os.path.realpath("/w/rel")]


def test_the_directory_of_a_sample_alternates_over_the_shares_own_samples():
    assert [ri.dir_index(i, 2) for i in range(6)] == [0, 1, 0, 1, 0, 1]
    assert [ri.dir_index(i, 1) for i in range(3)] == [0, 0, 0]
    # shard 0/2 (even samples) over 2 directories: both used; shard 1/4 over 3: 1, 5, 9, 13 -> 0, 1, 2, 0
    assert [ri.dir_index(i, 2, 2) for i in (0, 2, 4, 6)] == [0, 1, 0, 1]
    assert [ri.dir_index(i, 3, 4) for i in (1, 5, 9, 13)] == [0, 1, 2, 0]


def test_digest_is_the_canonical_json_of_the_identity_and_differences_name_each_leaf():
    a, b = ident(), ident(layer_ids=[1, 3, 5, 7], versions={"torch": "2.14.0"})
    doc = ri.record(a)
    import hashlib
    assert doc["format"] == "remote-ops-run/1" and doc["identity"] == a
    assert doc["digest"] == hashlib.sha256(json.dumps(a, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert doc["created"].endswith("Z")
    assert ri.differences(a, b) == ["layer_ids [2,4,5,7] -> [1,3,5,7]", "versions.torch 2.13.0 -> 2.14.0"]
    c = ident(dataset=dict(a["dataset"], lines_sha256="b" * 64), shard={"index": 1, "count": 2})
    assert ri.differences(a, c) == ["dataset.lines_sha256 aaaaaaaaaaaa -> bbbbbbbbbbbb",
                                    'shard none -> {"count":2,"index":1}']
    assert ri.differences(a, ident()) == []


def test_dataset_facts_hash_the_lines_used_not_blank_lines_or_line_endings(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b'{"input_ids": [1]}\n\n{"input_ids": [2]}\r\n{"input_ids": [3]}')
    q = tmp_path / "e.jsonl"
    q.write_bytes(b'{"input_ids": [1]}\n{"input_ids": [2]}\n{"input_ids": [3]}\n')
    f, g = ri.dataset_facts(str(p), None), ri.dataset_facts(str(q), None)
    assert f["samples"] == 3 and f["lines_sha256"] == g["lines_sha256"] and f["size"] != g["size"]
    assert ri.dataset_facts(str(p), 2)["lines_sha256"] == ri.dataset_facts(str(q), 2)["lines_sha256"] \
        != f["lines_sha256"]
    q.write_bytes(b'{"input_ids": [1]}\n{"input_ids": [9]}\n{"input_ids": [3]}\n')     # changed in place
    assert ri.dataset_facts(str(q), None)["lines_sha256"] != f["lines_sha256"]
    with pytest.raises(ri.IdentityError, match="cannot read dataset"):
        ri.dataset_facts(str(tmp_path / "missing.jsonl"), None)


def test_check_states_and_move_aside_keeps_every_file(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert ri.check(str(out), ident())["state"] == "new"
    ri.write(str(out), ident())
    assert ri.check(str(out), ident())["state"] == "same"
    other = ident(layer_ids=[1, 3, 5, 7])
    assert ri.check(str(out), other)["state"] == "new"            # no samples: nothing to mix
    (out / "data_0.pt").write_bytes(b"x")
    res = ri.check(str(out), other)
    assert res["state"] == "differs" and res["differences"] == ["layer_ids [2,4,5,7] -> [1,3,5,7]"]
    assert res["problem"] == f"{out} holds 1 sample file(s) of another run: layer_ids [2,4,5,7] -> [1,3,5,7]"
    assert "remote-ops extract HOST --overwrite" in ri.refusal(res["problem"])   # the controller fills HOST
    assert "--overwrite" in ri.refusal(res["problem"], by_hand=True)
    (out / "run.json").unlink()
    assert ri.check(str(out), other)["state"] == "unrecorded"
    (out / "run.json").write_text("{not json")
    assert ri.check(str(out), other)["state"] == "unreadable"
    (out / "data_config.json").write_text("{}")
    (out / ".data_1.pt.77.tmp").write_bytes(b"half")
    (out / "notes.txt").write_text("mine")
    moved = ri.move_aside(str(out), now=0)
    dest = out / ".replaced-19700101T000000Z"
    assert moved == {"moved_to": str(dest), "files": 4}
    assert sorted(p.name for p in dest.iterdir()) == [".data_1.pt.77.tmp", "data_0.pt", "data_config.json", "run.json"]
    assert sorted(p.name for p in out.iterdir()) == [".replaced-19700101T000000Z", "notes.txt"]
    assert ri.move_aside(str(out), now=0)["moved_to"] == str(dest) + "-2"      # never onto an earlier one


# ------------------------------------------------------------------ the script's own check
class Gen:
    """TEST FAKE generator: rows of layer l of token t = t * 10 + l; records that it was built."""

    made = []

    def __init__(self, model_path, layer_ids, max_model_len, *a):
        self.layer_ids = layer_ids or [2, 4, 5, 7]
        self.max_model_len = max_model_len
        Gen.made.append(self)

    def generate(self, token_ids):
        return [{"input_ids": torch.tensor(ids, dtype=torch.long),
                 "hidden_states": [(torch.tensor(ids, dtype=torch.float32).unsqueeze(1) * 10 + l)
                                   .expand(len(ids), 8).to(torch.bfloat16) for l in self.layer_ids]}
                for ids in token_ids]


def script_run(ehs, tmp_path, ds, *extra):
    Gen.made = []
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out"), *extra]
    return ehs.main(argv, None, lambda args: {"make_generator": Gen, "load_tokenizer": None,
                                              "hidden_size_of": lambda p: 8})


def rows(path, n, base=0):
    path.write_text("".join(json.dumps({"input_ids": [base + i + 1] * (i + 2)}) + "\n" for i in range(n)))
    return path


def test_the_script_refuses_another_runs_directory_before_the_engine_and_overwrite_moves_it(tmp_path, capsys):
    ehs = load_extract_script("extract_hidden_states_identity")
    ds = rows(tmp_path / "ds.jsonl", 4)
    assert script_run(ehs, tmp_path, ds, "--layer-ids", "2,4,5,7") == 0
    doc = json.loads((tmp_path / "out" / "run.json").read_text())
    assert doc["identity"]["layer_ids"] == [2, 4, 5, 7] and doc["identity"]["dataset"]["samples"] == 4
    assert doc["digest"] == ri.digest(doc["identity"]) and doc["identity"]["versions"]["torch"] == torch.__version__
    capsys.readouterr()
    # changed layer ids: exit 2, one line naming the change, no engine built, nothing touched
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    assert script_run(ehs, tmp_path, ds, "--layer-ids", "1,3,5,7") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds 4 sample file(s) of another run: layer_ids [2,4,5,7] -> [1,3,5,7]" in err[0]
    assert "a new --output-dir, or run again with --overwrite" in err[0]
    assert Gen.made == []
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()} == before
    # the same dataset path with other lines: refused too
    rows(ds, 4, base=50)
    assert script_run(ehs, tmp_path, ds, "--layer-ids", "2,4,5,7") == 2
    assert "dataset.lines_sha256" in capsys.readouterr().err and Gen.made == []
    # --overwrite: the old files moved aside, the new run written from the new input
    assert script_run(ehs, tmp_path, ds, "--layer-ids", "1,3,5,7", "--overwrite") == 0
    (old,) = (tmp_path / "out").glob(".replaced-*")
    assert sorted(p.name for p in old.iterdir()) == ["data_0.pt", "data_1.pt", "data_2.pt", "data_3.pt",
                                                     "data_config.json", "run.json"]
    s = torch.load(tmp_path / "out" / "data_0.pt", weights_only=True)
    assert s["input_ids"].tolist() == [51, 51] and len(s["hidden_states"]) == 4
    assert json.loads((tmp_path / "out" / "run.json").read_text())["identity"]["layer_ids"] == [1, 3, 5, 7]
    # and the same run again resumes: nothing to do, no engine
    assert script_run(ehs, tmp_path, ds, "--layer-ids", "1,3,5,7") == 0
    assert Gen.made == [] and "all 4 samples are already in" in capsys.readouterr().out


def test_samples_without_run_json_are_refused_by_the_script(tmp_path, capsys):
    ehs = load_extract_script("extract_hidden_states_identity2")
    ds = rows(tmp_path / "ds.jsonl", 2)
    (tmp_path / "out").mkdir()
    torch.save({}, tmp_path / "out" / "data_0.pt")
    assert script_run(ehs, tmp_path, ds) == 2
    assert "holds 1 sample file(s) and no run.json" in capsys.readouterr().err and Gen.made == []


# ------------------------------------------------------------------ over the real sshd, the stand-in job
def set_vars(env, **kv):
    doc = yaml.safe_load(env.inventory.read_text())
    doc["hosts"]["testhost"].setdefault("vars", {}).update(kv)
    env.inventory.write_text(yaml.safe_dump(doc))


def standin_env(tmp_path, sshd, ds, layers="2,4,5,7"):
    return Env(tmp_path, sshd, extra_args=["--dataset", "{vars.ds}", "--layer-ids", "{vars.layers}",
                                           "--max-model-len", "64"],
               host_vars={"ds": str(ds), "layers": layers})


def ids_of(out, i):
    return torch.load(out / f"data_{i}.pt", weights_only=True)["input_ids"].tolist()


def lines(ds):
    return [json.loads(l)["input_ids"] for l in ds.read_text().splitlines() if l.strip()]


@pytest.mark.long
def test_a_resume_with_another_dataset_is_refused_and_overwrite_rewrites_from_it(tmp_path, sshd, cli):
    a, b = rows(tmp_path / "a.jsonl", 3), rows(tmp_path / "b.jsonl", 5, base=100)
    env = standin_env(tmp_path, sshd, a)
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err
    set_vars(env, ds=str(b))
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status != 0
    assert f"{env.out} holds 3 sample file(s) of another run: dataset.lines_sha256" in err, err
    assert "dataset.path" in err and ("a new output_dir, or start over with: remote-ops -i "
                                      f"{env.inventory} extract testhost --playbook {env.playbook} --overwrite") in err
    assert len(env.jobdirs()) == 1                                  # refused before any launch
    assert [ids_of(env.out, i) for i in range(3)] == lines(a)
    status, out, err = cli(*env.argv("extract", "testhost", "--tail", "--overwrite"))
    assert status == 0, err
    (old,) = env.out.glob(".replaced-*")
    assert sorted(p.name for p in old.glob("data_*.pt")) == ["data_0.pt", "data_1.pt", "data_2.pt"]
    assert [ids_of(env.out, i) for i in range(5)] == lines(b)      # every file from the new dataset
    s, rec, err = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"] and rec["identity"]["ids_compared"] == 5 and rec["identity"]["ids_differ"] == 0, rec


@pytest.mark.long
def test_a_resume_with_other_layer_ids_is_refused_in_preflight_and_by_the_script(tmp_path, sshd, cli):
    ds = rows(tmp_path / "a.jsonl", 4)
    env = standin_env(tmp_path, sshd, ds)
    assert cli(*env.argv("extract", "testhost", "--tail"))[0] == 0
    set_vars(env, layers="1,3,5,7")
    status, rec, err = cli_json(cli, env, "extract", "testhost")
    assert status != 0 and len(env.jobdirs()) == 1
    problems = rec["preflight"]["problems"]
    assert problems[-1].startswith(f"{env.out} holds 4 sample file(s) of another run: layer_ids [2,4,5,7] -> [1,3,5,7]")
    assert rec["preflight"]["identity"]["state"] == "differs"
    # by hand, the same script in the same directory: refused before the stand-in model is built
    proc = subprocess.run([sys.executable, str(STANDIN), "--dataset", str(ds), "--layer-ids", "1,3,5,7",
                           "--max-model-len", "64", "--output-dir", str(env.out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "layer_ids [2,4,5,7] -> [1,3,5,7]" in proc.stderr and "Loaded stand-in model" not in proc.stdout
    assert json.loads((env.out / "run.json").read_text())["identity"]["layer_ids"] == [2, 4, 5, 7]


@pytest.mark.long
def test_a_dataset_changed_in_place_is_refused_and_flagged_by_verify(tmp_path, sshd, cli):
    ds = rows(tmp_path / "a.jsonl", 4)
    env = standin_env(tmp_path, sshd, ds)
    assert cli(*env.argv("extract", "testhost", "--tail"))[0] == 0
    rows(ds, 4, base=40)                                  # same path, same count, other lines
    status, out, err = cli(*env.argv("extract", "testhost"))
    assert status != 0 and "another run: dataset.lines_sha256" in err and len(env.jobdirs()) == 1
    s, rec, err = cli_json(cli, env, "verify", "testhost", "--all")
    assert s != 0 and not rec["ok"]
    assert any("changed since the run" in p for p in rec["identity"]["problems"]), rec["identity"]
    assert rec["identity"]["ids_differ"] == 4


@pytest.mark.long
def test_verify_flags_a_file_of_another_run(tmp_path, sshd, cli, capsys):
    ds, other = rows(tmp_path / "a.jsonl", 4), rows(tmp_path / "b.jsonl", 4, base=100)
    env = standin_env(tmp_path, sshd, ds)
    assert cli(*env.argv("extract", "testhost", "--tail"))[0] == 0
    s, rec, _ = cli_json(cli, env, "verify", "testhost")
    assert s == 0 and rec["ok"] and rec["identity"]["recorded"]
    # a file another run wrote (other tokens, 3 layers) put in place of data_2.pt
    ehs = load_extract_script("extract_hidden_states_identity3")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert script_run(ehs, elsewhere, other, "--layer-ids", "1,3,5") == 0
    (elsewhere / "out" / "data_2.pt").replace(env.out / "data_2.pt")
    capsys.readouterr()                                   # the by-hand run's own output
    s, rec, err = cli_json(cli, env, "verify", "testhost", "--all")
    assert s != 0 and not rec["ok"]
    problems = [p["problem"] for p in rec["inconsistent"] if p["index"] == 2]
    assert "3 layers; the run asked for 4 (layer_ids [2,4,5,7])" in problems
    assert "hidden size 8; the run's is 64" in problems
    assert any(p.startswith("token ids differ from dataset line 2") for p in problems), problems
    status, out, _ = cli(*env.argv("verify", "testhost", "--all"))
    assert status != 0 and "token ids of 4 file(s) compared with their dataset lines, 1 differ" in out


def test_verify_of_an_empty_or_unrecorded_directory_is_never_ok(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, extract={"expected_samples": 4})
    env.out.mkdir()
    s, rec, err = cli_json(cli, env, "verify", "testhost")
    assert s != 0 and rec["error"] == "RefusedError", rec
    assert "holds no data_<N>.pt files and no run.json: nothing to verify" in rec["message"]
    status, out, err = cli(*env.argv("verify", "testhost"))
    assert status != 0 and "nothing to verify" in err
    torch.save({"input_ids": torch.tensor([1, 2]), "hidden_states": [torch.zeros(2, 8)] * 4,
                "loss_mask": torch.ones(2, dtype=torch.long)}, env.out / "data_0.pt")
    s, rec, err = cli_json(cli, env, "verify", "testhost", "--expected", "1")
    assert s != 0 and not rec["ok"] and not rec["identity"]["recorded"]
    assert rec["identity"]["problems"][0].startswith(f"no run.json in {env.out}")


def test_script_identity_matches_the_agents_for_the_same_command(tmp_path):
    """The preflight (agent/jobs.py job_identity, by the job's interpreter) and the script compute one
    identity from one command line: otherwise every resume would be refused."""
    from remote_ops.agent import jobs as agent_jobs
    ehs = load_extract_script("extract_hidden_states_identity4")
    ds = rows(tmp_path / "ds.jsonl", 3)
    argv = ["--target-model-path", "m", "--dataset", "ds.jsonl", "--output-dir", "out", "--layer-ids", "2,4",
            "--max-model-len", "64", "--shard", "0/2"]
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        args = ehs.parse_args(argv)
        mine, _ = ehs.check_run_identity(args, io.StringIO())
    finally:
        os.chdir(cwd)
    theirs = agent_jobs.job_identity({"command": [sys.executable, "extract_hidden_states.py", *argv],
                                      "workdir": str(tmp_path), "flow": "generator", "python": sys.executable})
    assert mine == theirs and mine["dataset"]["path"] == str(ds.resolve())
    assert mine["shard"] == {"index": 0, "count": 2}


def test_gather_writes_the_unions_run_json_and_refuses_parts_of_two_runs():
    """gather's plan (extract/shard.py): the union's run.json is the kept run's identity without the
    shard; a part of another run is refused, and then no run.json is written."""
    import hashlib
    from remote_ops.extract import shard as shard_mod

    def part(k, ident_):
        cfg = {"data": {"num_samples": 4}, "hidden_states": {"layer_ids": [2, 4, 5, 7]}, "model": {"hidden_size": 8},
               "shard": {"index": k, "count": 2}}
        rest = {key: v for key, v in ident_.items() if key != "shard"}
        run = hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        return [{"output_dir": f"/o{k}", "files": [{"index": i, "name": f"data_{i}.pt", "size": 1, "sha256": str(i)}
                                                   for i in range(k, 4, 2)],
                 "config_text": json.dumps(cfg), "run_text": json.dumps(ri.record(ident_)), "shard_dirs": [],
                 "identity": f"dir:{k}", "run": {"digest": ri.digest(ident_), "shard": [k, 2], "run": run}}]
    same = {"a": part(0, ident(shard={"index": 0, "count": 2})), "b": part(1, ident(shard={"index": 1, "count": 2}))}
    _, union_doc, g = shard_mod.plan(same)
    assert not g.problems and union_doc is not None
    assert g.extra["run"]["identity"] == ident(shard=None) and g.extra["run"]["digest"] == ri.digest(ident(shard=None))
    mixed = {"a": same["a"], "b": part(1, ident(shard={"index": 1, "count": 2}, layer_ids=[1, 3, 5, 7]))}
    _, _, g = shard_mod.plan(mixed)
    assert g.problems == ["the directories hold files of 2 runs in equal numbers (their run.json differ: a:/o0, "
                          "b:/o1): gather one run at a time (move the other run's directories away)"]
    assert g.extra["run"] is None
    mixed["a"] = part(0, ident(shard={"index": 0, "count": 2}))
    mixed["a"][0]["files"].append({"index": 1, "name": "data_1.pt", "size": 1, "sha256": "x"})   # a's run: 3 files
    _, _, g = shard_mod.plan(mixed)
    assert g.extra["run"] is None and g.problems and all("another run" in p or "differ" in p for p in g.problems), \
        g.problems


@pytest.mark.long
def test_a_run_grows_by_appended_lines_and_through_a_symlink_but_not_by_changed_ones(tmp_path, sshd, cli):
    """Issue 46 item 7: a run grows when the lines it used are unchanged: lines appended to its dataset
    (so more samples), the same file reached through a symlink; it is the same run, resumed, its run.json
    rewritten; a changed line among those used is still another run."""
    ds = rows(tmp_path / "a.jsonl", 3)
    env = standin_env(tmp_path, sshd, ds)
    assert cli(*env.argv("extract", "testhost", "--tail"))[0] == 0
    first = [ids_of(env.out, i) for i in range(3)]
    before = {i: (env.out / f"data_{i}.pt").stat().st_mtime_ns for i in range(3)}
    more = rows(tmp_path / "more.jsonl", 5)
    assert lines(more)[:3] == lines(ds)
    ds.write_text(more.read_text())                                  # two lines appended
    link = tmp_path / "link.jsonl"
    link.symlink_to(ds)
    set_vars(env, ds=str(link))
    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run")
    assert s == 0, (rec, err)
    assert any("grows (3 -> 5 samples (its first 3 dataset lines unchanged)" in n for n in rec["preflight"]["notes"]), rec["preflight"]["notes"]
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err
    assert [ids_of(env.out, i) for i in range(3)] == first
    assert {i: (env.out / f"data_{i}.pt").stat().st_mtime_ns for i in range(3)} == before   # not rewritten
    assert [ids_of(env.out, i) for i in range(5)] == lines(ds)
    doc = json.loads((env.out / "run.json").read_text())
    assert doc["identity"]["dataset"]["samples"] == 5
    s, rec, err = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"] and rec["identity"]["ids_compared"] == 5 and rec["identity"]["ids_differ"] == 0, rec
    # one of the used lines changed: another run, refused before any launch
    jobs = len(env.jobdirs())
    changed = ds.read_text().splitlines()
    changed[1] = json.dumps({"input_ids": [7, 7, 7, 7]})
    ds.write_text("\n".join(changed) + "\n")
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status != 0 and "dataset.lines_sha256" in err and len(env.jobdirs()) == jobs


def test_extends_pins_the_captured_layer_ids_and_refuses_other_changes(tmp_path):
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(json.dumps({"input_ids": [i, i + 1]}) + "\n" for i in range(4)))
    out = tmp_path / "out"
    out.mkdir()
    (out / "data_config.json").write_text(json.dumps({"hidden_states": {"layer_ids": [2, 4, 6]}}))
    base = {"dataset": ri.dataset_facts(str(ds), 2), "model": None, "layer_ids": None, "max_model_len": 64,
            "flow": "generator", "playbook": None, "shard": None, "versions": {}}
    grown = dict(base, dataset=ri.dataset_facts(str(ds), 4))
    assert ri.extends(base, grown, str(out))["samples"] == [2, 4]
    pinned = dict(grown, layer_ids=[2, 4, 6])
    got = ri.extends(base, pinned, str(out))
    assert got and "layer ids pinned to the [2,4,6] the run captured" in got["notes"]
    assert ri.extends(base, dict(grown, layer_ids=[1, 2, 3]), str(out)) is None
    assert ri.extends(base, dict(grown, max_model_len=128), str(out)) is None
    assert ri.extends(grown, base, str(out)) is None                # a run never shrinks into another


@pytest.mark.long
def test_verify_adopt_writes_run_json_only_when_every_file_matches(tmp_path, sshd, cli):
    """Issue 46 item 7: an output written before run identities (no run.json) is adopted by
    verify --adopt once every file's token ids equal its dataset line; then extract resumes it.
    One file of other tokens: nothing written, the file named."""
    ds = rows(tmp_path / "a.jsonl", 4)
    env = standin_env(tmp_path, sshd, ds)
    assert cli(*env.argv("extract", "testhost", "--tail"))[0] == 0
    run_json = env.out / "run.json"
    recorded = json.loads(run_json.read_text())
    run_json.unlink()                                                # as written before run identities
    status, out, err = cli(*env.argv("extract", "testhost"))
    assert status != 0 and "no run.json" in err
    # one file of another line's tokens: refused, nothing written
    good = (env.out / "data_2.pt").read_bytes()
    (env.out / "data_2.pt").write_bytes((env.out / "data_1.pt").read_bytes())
    s, rec, err = cli_json(cli, env, "verify", "testhost", "--adopt")
    assert s != 0 and not rec["ok"] and not run_json.exists()
    assert rec["identity"]["adopted"] is False and "verify found problems" in rec["identity"]["adopt_refused"]
    assert any(i["index"] == 2 and "token ids differ" in i["problem"] for i in rec["inconsistent"]), rec["inconsistent"]
    (env.out / "data_2.pt").write_bytes(good)
    status, out, err = cli(*env.argv("verify", "testhost", "--adopt"))
    assert status == 0, (out, err)
    assert "run identity adopted: run.json" in out and "all 4 file(s) matched their dataset lines" in out
    doc = json.loads(run_json.read_text())
    assert doc["digest"] == recorded["digest"]                       # the identity the job itself recorded
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0 and "all 4 samples are already in" in out + err, (out, err)
    s, rec, err = cli_json(cli, env, "verify", "testhost", "--adopt")
    assert rec["identity"]["adopt_refused"].endswith("has a run.json already: nothing to adopt")
