"""The shipped playbook's extract section: host vars fill templates, numbers included; optional secrets."""

from __future__ import annotations

import pytest

from remote_ops.extract import jobs

from remote_ops.playbook import loader as playbook
from remote_ops.errors import ConfigError
from remote_ops.connect.inventory import Host
from tests.conftest import REPO

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"


def test_defaults_for_a_real_gpu_host():
    pb = playbook.load(str(SHIPPED))
    host = Host(name="gpu-host", hostname="gpu01", python="/opt/venvs/eagle3/bin/python", workdir="/data/eagle3")
    spec = jobs.parse_spec(pb, host)
    assert spec.command[:2] == ["/opt/venvs/eagle3/bin/python", "extract_hidden_states.py"]
    assert spec.command[spec.command.index("--output-dir") + 1] == "/data/eagle3/hidden_states"
    assert spec.command[spec.command.index("--layer-ids") + 1] == ""     # the generator's choice
    assert spec.gpu_count == 1 and spec.gpus_free is True
    assert spec.expected_samples == 5000 and spec.workdir == "/data/eagle3"
    # the shipped script goes into the workdir under the name the command runs
    shipped, identity, rule = spec.files
    assert shipped.name == "extract_hidden_states.py"
    assert shipped.local == REPO / "remote_ops" / "playbook" / "shipped" / "scripts" / "extract_hidden_states.py"
    assert shipped.data == shipped.local.read_bytes()
    # beside it, the run identity it checks (one definition: the agent's own module)
    assert identity.name == "run_identity.py"
    assert identity.local.resolve() == REPO / "remote_ops" / "agent" / "outputs" / "run_identity.py"
    assert identity.data == identity.local.read_bytes()
    # and the sample-name rule run_identity.py uses (agent/outputs/layout.py: one definition)
    assert rule.name == "layout.py"
    assert rule.local.resolve() == REPO / "remote_ops" / "agent" / "outputs" / "layout.py"
    assert spec.import_check == ["speculators.data_generation.vllm_hidden_states_generator"]
    assert spec.import_timeout == 120 and spec.job_python == "/opt/venvs/eagle3/bin/python"
    assert spec.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_tensor_parallel_size_sets_the_flag_and_the_gpus_asked_for():
    pb = playbook.load(str(SHIPPED))
    host = Host(name="gpu-host", hostname="gpu01", vars={"tensor_parallel_size": 2, "gpus": 2, "layer_ids": "2,4,5,7",
                                                          "import_check": ["torch", "vllm"]})
    spec = jobs.parse_spec(pb, host)
    assert spec.command[spec.command.index("--tensor-parallel-size") + 1] == "2" and spec.gpu_count == 2
    assert spec.command[spec.command.index("--layer-ids") + 1] == "2,4,5,7"
    assert spec.import_check == ["torch", "vllm"]


def test_host_vars_override_playbook_vars_including_numbers():
    pb = playbook.load(str(SHIPPED))
    host = Host(name="sandbox", hostname="127.0.0.1", python="/venv/bin/python", workdir="/w",
                vars={"extract_script": "/w/standin.py", "gpus": 0, "max_samples": 24, "output_dir": "/out"})
    spec = jobs.parse_spec(pb, host)
    assert spec.command[1] == "/w/standin.py"
    assert spec.command[spec.command.index("--max-samples") + 1] == "24"
    assert spec.gpu_count == 0 and spec.expected_samples == 24 and spec.output_dir == "/out"


def test_a_template_that_is_not_a_number_names_the_line(tmp_path):
    text = SHIPPED.read_text()
    p = tmp_path / "pb.yaml"
    p.write_text(text)
    pb = playbook.load(str(p))
    host = Host(name="h", hostname="h", vars={"gpus": "eight"})
    with pytest.raises(ConfigError) as err:
        jobs.parse_spec(pb, host)
    assert "not a number" in err.value.one_line() and f"{p}:" in err.value.one_line()


def test_optional_secret_is_skipped_when_absent_and_sent_when_present(monkeypatch):
    pb = playbook.load(str(SHIPPED))
    spec = jobs.parse_spec(pb, Host(name="h", hostname="h"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert jobs.resolve_secrets(spec) == {}
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    assert jobs.resolve_secrets(spec) == {"HF_TOKEN": "hf_secret_value"}
    assert "hf_secret_value" not in str(spec.to_json())


def test_a_copy_of_the_shipped_playbook_elsewhere_still_ships_remote_ops_own_files(tmp_path):
    """remote-ops:PATH names a file of the installed package, so a user's copy of the shipped playbook
    (kept in their own playbooks/ folder) ships the same script, run_identity.py and layout.py."""
    copy = tmp_path / "mine" / "eagle3-speculators-0.3.0.yaml"
    copy.parent.mkdir()
    copy.write_text(SHIPPED.read_text())
    host = Host(name="gpu-host", hostname="gpu01", python="/opt/venvs/eagle3/bin/python", workdir="/data/eagle3")
    a = jobs.parse_spec(playbook.load(str(SHIPPED)), host)
    b = jobs.parse_spec(playbook.load(str(copy)), host)
    assert [(f.name, f.sha256) for f in b.files] == [(f.name, f.sha256) for f in a.files]
    assert [f.name for f in b.files] == ["extract_hidden_states.py", "run_identity.py", "layout.py"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(SHIPPED.read_text().replace("remote-ops:agent/outputs/layout.py", "remote-ops:../outputs/layout.py"))
    with pytest.raises(ConfigError, match="remote-ops:PATH"):
        jobs.parse_spec(playbook.load(str(bad)), host)


def _flag_playbook(tmp_path, item, var_value):
    """A minimal playbook whose command ends with one mapping item, the var ``v`` set to ``var_value``."""
    import yaml
    p = tmp_path / "pb.yaml"
    p.write_text(yaml.safe_dump({"name": "flags", "vars": {"v": var_value},
                                 "extract": {"command": ["python", "job.py", item], "output_dir": "/out"}}))
    return playbook.load(str(p))


@pytest.mark.parametrize("value, want", [
    (65536, ["--n", "65536"]),               # a number rendered as text
    (0.5, ["--n", "0.5"]),
    ("auto", ["--n", "auto"]),
    ("0", ["--n", "0"]),                     # zero is a value, not "unset"
    (None, []),                              # null: vLLM's (the tool's) own default, no flag
    ("", []),                                # an empty string: no flag either
])
def test_a_flag_with_a_value_is_given_when_the_var_is_set(tmp_path, value, want):
    pb = _flag_playbook(tmp_path, {"flag": "--n", "value": "{vars.v}"}, value)
    spec = jobs.parse_spec(pb, Host(name="h", hostname="h", python="/py"))
    assert spec.command == ["python", "job.py", *want]
    # a host var overrides the playbook's null
    spec = jobs.parse_spec(pb, Host(name="h", hostname="h", vars={"v": 8192}))
    assert spec.command[2:] == ["--n", "8192"]


@pytest.mark.parametrize("value, want", [
    ("bf16", ["--kv", '{"c": "E"}', "--validate"]),
    ("fp8", ["--kv", '{"c": "F", "dir": "/d/m"}']),     # templates filled inside a case
    ("one", ["--only"]),                                # a case may be one string
])
def test_select_gives_the_items_of_the_case_the_var_names(tmp_path, value, want):
    item = {"select": "{vars.v}", "cases": {"bf16": ["--kv", '{"c": "E"}', "--validate"],
                                            "fp8": ["--kv", '{"c": "F", "dir": "/d/{vars.m}"}'], "one": "--only"}}
    import yaml
    p = tmp_path / "pb.yaml"
    p.write_text(yaml.safe_dump({"name": "flags", "vars": {"v": value, "m": "m"},
                                 "extract": {"command": ["python", "job.py", item, "--end"], "output_dir": "/out"}}))
    spec = jobs.parse_spec(playbook.load(str(p)), Host(name="h", hostname="h"))
    assert spec.command == ["python", "job.py", *want, "--end"]


def test_a_flag_value_inside_a_longer_text_and_a_literal(tmp_path):
    pb = _flag_playbook(tmp_path, {"flag": "--path", "value": "/data/{vars.v}/x"}, "m")
    assert jobs.parse_spec(pb, Host(name="h", hostname="h")).command[2:] == ["--path", "/data/m/x"]
    pb = _flag_playbook(tmp_path, {"flag": "--n", "value": 12}, None)
    assert jobs.parse_spec(pb, Host(name="h", hostname="h")).command[2:] == ["--n", "12"]


@pytest.mark.parametrize("item, var_value, words", [
    ({"flag": "--n", "value": "{vars.v}", "if": "{vars.v}"}, 1,
     ["{flag, if}, {flag, value} or {select, cases}", "keys flag, if, value"]),
    ({"flag": "--n"}, 1, ["{flag, if}, {flag, value} or {select, cases}", "got keys flag"]),
    ({"select": "{vars.v}", "cases": {"a": ["--a"], "b": []}}, "c", ["'{vars.v}' gives 'c': one of a, b"]),
    ({"select": "{vars.v}", "cases": {"a": ["--a"]}}, None, ["gives None: one of a"]),
    ({"select": "{vars.v}", "cases": {"a": {"x": 1}}}, "a", ["case 'a' must be a list of strings, got mapping"]),
    ({"select": "{vars.v}", "cases": {"a": [["--x"]]}}, "a", ["every command item must be a string, got list"]),
    ({"select": "{vars.v}", "cases": []}, "a", ["'cases' must be a mapping"]),
    ({"flag": "--n", "value": "{vars.v}"}, [1, 2], ["gives list", "'value' must be a string or a number"]),
    ({"flag": "--n", "value": "{vars.v}"}, True, ["gives boolean"]),
    ({"flag": "--n", "value": "{vars.missing}"}, 1, ["missing"]),
])
def test_a_mapping_item_that_is_neither_form_is_an_error_naming_both(tmp_path, item, var_value, words):
    pb = _flag_playbook(tmp_path, item, var_value)
    with pytest.raises(ConfigError) as err:
        jobs.parse_spec(pb, Host(name="h", hostname="h"))
    line = err.value.one_line()
    assert all(w in line for w in words), line
    assert f"{tmp_path / 'pb.yaml'}:" in line
