"""`check` for the server flow on real vLLM sources (PyPI, cached by pkgsource): the agent op
``serverflow.check`` on 0.16.0, 0.22.0 and 0.33.0, then `check --playbook ... --strict` over SSH on a
host holding speculators 0.9.0 with vLLM 0.22.0 or 0.33.0, and `--strict` failing when nothing was checked.

What the releases hold (read in their sources): 0.16.0 has neither the method extract_hidden_states nor
ExampleHiddenStatesConnector; 0.22.0 (also 0.22.1, 0.23.0) raises ValueError in vllm/config/vllm.py when
that connector runs with chunked prefill on; 0.33.0 moved FrontendArgs to entrypoints/common/cli_args.py
and writes the hidden-states file after the response, holding <file>.lock meanwhile.
"""

from __future__ import annotations

import json
import shutil

import pytest

from remote_ops import pkgsource
from remote_ops.agent import serverflow as agent_sf
from remote_ops.check import serverflow
from remote_ops.connect.inventory import Host
from remote_ops.extract.extract_spec import server_command
from remote_ops.playbook import loader as pb_mod

MAIN = "eagle3-speculators-0.9.0"
NOCP = "eagle3-speculators-0.9.0-no-chunked-prefill"


def _command(name):
    return server_command(pb_mod.load(str(pb_mod.find(name))), Host(name="t", hostname="h", python="python3"))


def _op(version, name=MAIN):
    return agent_sf.op_check({"command": _command(name), "client": serverflow.CLIENT_FIELDS,
                              "sys_path": [str(pkgsource.unpacked("vllm", version))]})


def _by_id(res):
    return {c["id"]: c for c in res["checks"]}


def test_033_has_everything_the_server_command_needs():
    res = _op("0.33.0")
    assert res["library"]["version"] == "0.33.0"
    checks = _by_id(res)
    # the playbook's default target_model is not on this machine: the served model's checks are not run
    assert checks.pop("model")["detail"].startswith("the model directory /data/models/target does not exist")
    assert all(c["ok"] is True for c in checks.values()), [c for c in checks.values() if c["ok"] is not True]
    assert {"method", "proposer", "connector", "connector-reads-shared_storage_path", "connector-writes",
            "connector-returns", "connector-write-lock", "chunked-prefill", "health", "flags",
            "speculative-config-keys", "kv-transfer-config-keys", "fields-CompletionResponse",
            "draft-config-eagle_aux_hidden_state_layer_ids", "entry-point"} <= set(checks)
    assert checks["connector-returns"]["where"].endswith("example_hidden_states_connector.py:559")


def test_022_refuses_chunked_prefill_and_the_sibling_playbook_turns_it_off():
    checks = _by_id(_op("0.22.0"))
    bad = [c for c in checks.values() if c["ok"] is False]
    assert [c["id"] for c in bad] == ["chunked-prefill"]
    assert bad[0]["where"] == "vllm/config/vllm.py:740"
    assert "--no-enable-chunked-prefill" in bad[0]["fix"] and NOCP in bad[0]["fix"]
    fixed = _by_id(_op("0.22.0", NOCP))
    assert fixed.pop("model")["ok"] is None
    assert all(c["ok"] is True for c in fixed.values())     # the flag is a real EngineArgs boolean there


def test_016_has_no_method_and_no_connector():
    checks = _by_id(_op("0.16.0"))
    assert checks["method"]["ok"] is False and checks["connector"]["ok"] is False
    assert "extract_hidden_states" in checks["method"]["detail"]


def test_an_unknown_flag_and_an_unknown_config_key_are_findings():
    cmd = _command(MAIN) + ["--no-such-flag", "1"]
    cmd = [a.replace('"num_speculative_tokens"', '"num_speculative_tokenz"') for a in cmd]
    res = agent_sf.op_check({"command": cmd, "client": serverflow.CLIENT_FIELDS,
                             "sys_path": [str(pkgsource.unpacked("vllm", "0.33.0"))]})
    checks = _by_id(res)
    assert checks["flags"]["ok"] is False and "--no-such-flag" in checks["flags"]["detail"]
    assert checks["speculative-config-keys"]["ok"] is False
    assert "num_speculative_tokenz" in checks["speculative-config-keys"]["detail"]


# vLLM releases whose make_arg_parser adds --api-server-count / -asc itself (not an EngineArgs/FrontendArgs field),
# in each place FrontendArgs has lived: entrypoints/openai/ (<= 0.28), launchers/ (0.29-0.32), common/ (0.33)
PARSER_RELEASES = ("0.11.0", "0.17.0", "0.20.0", "0.22.0", "0.24.0", "0.26.0", "0.29.0", "0.33.0")


@pytest.mark.parametrize("version", PARSER_RELEASES)
def test_make_arg_parsers_own_flags_are_known_and_a_made_up_one_is_still_a_finding(version):
    """--api-server-count N (api_server_count) is added by make_arg_parser in the module that has FrontendArgs:
    accepted, long, underscored (vLLM's FlexibleArgumentParser) or beside --headless; a made-up flag next to it is
    still reported, alone."""
    src = pkgsource.unpacked("vllm", version)
    static = agent_sf.StaticResolver([str(src)])
    module = next(s.partition(":")[0] for s in agent_sf.FRONTEND_ARGS
                  if (src / (s.partition(":")[0].replace(".", "/") + ".py")).is_file())
    opts = agent_sf._parser_options(static, module)
    assert {"--api-server-count", "-asc", "--headless", "--config"} <= opts, (version, opts)
    for extra in (["--api-server-count", "2"], ["--api_server_count", "2"], ["--api-server-count", "4", "--headless"]):
        flags = _by_id(agent_sf.op_check({"command": _command(MAIN) + extra, "client": serverflow.CLIENT_FIELDS,
                                          "sys_path": [str(src)]}))["flags"]
        assert flags["ok"] is True and flags["detail"] == "", (version, extra, flags)
    flags = _by_id(agent_sf.op_check({"command": _command(MAIN) + ["--api-server-count", "2", "--no-such-flag", "1"],
                                      "client": serverflow.CLIENT_FIELDS, "sys_path": [str(src)]}))["flags"]
    assert flags["ok"] is False and flags["detail"] == "unknown: --no-such-flag", (version, flags)
    assert flags["what"] == "every flag of the server command is an EngineArgs/FrontendArgs parameter"


@pytest.mark.parametrize("name,version", [(MAIN, "0.24.0"), (MAIN, "0.33.0"), (NOCP, "0.17.0"), (NOCP, "0.22.0")])
def test_a_hosts_api_server_count_passes_every_check_the_default_passes(name, version):
    """The playbooks' var api_server_count: 4 renders --api-server-count 4, which each playbook's releases take;
    every check holds as it does for the default command (no flag)."""
    pb = pb_mod.load(str(pb_mod.find(name)))
    cmd = server_command(pb, Host(name="t", hostname="h", python="python3", vars={"api_server_count": 4}))
    assert cmd[cmd.index("--api-server-count") + 1] == "4"
    got = _by_id(agent_sf.op_check({"command": cmd, "client": serverflow.CLIENT_FIELDS,
                                    "sys_path": [str(pkgsource.unpacked("vllm", version))]}))
    plain = _by_id(_op(version, name))
    assert {k: c["ok"] for k, c in got.items()} == {k: c["ok"] for k, c in plain.items()}
    assert got["flags"]["ok"] is True, got["flags"]


def test_a_flag_not_in_the_args_classes_is_undecided_where_make_arg_parser_cannot_be_read(tmp_path):
    """A cli_args module without make_arg_parser (a vLLM laid out otherwise): a flag outside EngineArgs and
    FrontendArgs is not decided, never a false finding; the flags that are parameters still pass."""
    src = pkgsource.unpacked("vllm", "0.33.0")
    copy = tmp_path / "vllm-copy"
    shutil.copytree(src, copy)
    cli_args = copy / "vllm/entrypoints/common/cli_args.py"
    text = cli_args.read_text()
    assert "def make_arg_parser(" in text
    cli_args.write_text(text.replace("def make_arg_parser(", "def make_arg_parser_renamed("))
    flags = _by_id(agent_sf.op_check({"command": _command(MAIN) + ["--api-server-count", "2"],
                                      "client": serverflow.CLIENT_FIELDS, "sys_path": [str(copy)]}))["flags"]
    assert flags["ok"] is None and "--api-server-count" in flags["detail"], flags
    assert "defines no make_arg_parser" in flags["detail"]
    assert _by_id(agent_sf.op_check({"command": _command(MAIN), "client": serverflow.CLIENT_FIELDS,
                                     "sys_path": [str(copy)]}))["flags"]["ok"] is True


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    return {v: pkgsource.make_env(tmp_path_factory.mktemp(f"sf{v}") / "venv",
                                  [("speculators", "0.9.0"), ("hs-connectors", "0.9.0"), ("vllm", v)])
            for v in ("0.22.0", "0.33.0")}


def test_check_strict_over_ssh_on_033_runs_the_server_checks(sshd, inventory_file, envs, cli):
    inv = inventory_file(python=str(envs["0.33.0"]))
    status, out, err = cli("check", "testhost", "--playbook", MAIN, "--strict", "--json", "-i", str(inv))
    assert status == 0, out + err
    rec = json.loads(out)
    rec = rec.get("results", [rec])[0] if "results" in rec else rec
    value = rec.get("value", rec)
    sf = value["server_flow"]
    assert sf["playbook"] == MAIN and sf["library"]["version"] == "0.33.0"
    assert sf["checked"] >= 15 and sf["findings"] == [] and sf["warnings"] == []
    assert [c["id"] for c in sf["unknown"]] == ["model"]       # /data/models/target is not on this machine


def test_check_strict_over_ssh_on_022_names_the_flag_and_the_playbook(sshd, inventory_file, envs, cli):
    inv = inventory_file(python=str(envs["0.22.0"]))
    status, out, err = cli("check", "testhost", "--playbook", MAIN, "--strict", "-i", str(inv))
    assert status == 1, out + err
    assert "does not support chunked prefill" in out and NOCP in out and "vllm/config/vllm.py:740" in out
    status, out, err = cli("check", "testhost", "--playbook", NOCP, "--strict", "-i", str(inv))
    assert status == 0, out + err
    assert "0 failed" in out


def test_strict_fails_when_nothing_was_checked(sshd, inventory_file, envs, cli):
    inv = inventory_file(python=str(envs["0.33.0"]))
    status, out, err = cli("check", "testhost", "-i", str(inv))     # no playbook: only the call sites
    assert status == 0 and "nothing was checked on this host" in out
    status, out, err = cli("check", "testhost", "--strict", "-i", str(inv))
    assert status == 1 and "nothing was checked on this host (check --strict exits 1)" in out


def test_the_servers_own_interpreter_is_the_one_checked(sshd, inventory_file, envs, cli):
    """A host whose server runs another interpreter (the var server_python): its vLLM is checked."""
    inv = inventory_file(python=str(envs["0.33.0"]), vars={"server_python": str(envs["0.22.0"])})
    status, out, err = cli("check", "testhost", "--playbook", MAIN, "--strict", "--json", "-i", str(inv))
    sf = json.loads(out)["server_flow"]
    assert status == 1 and sf["library"]["version"] == "0.22.0", out + err
    assert [c["id"] for c in sf["findings"]] == ["chunked-prefill"]
