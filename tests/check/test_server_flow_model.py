"""The server flow's checks of the model it serves (agent/contract.py SERVED_MODEL_CHECKS), on real vLLM sources
(PyPI, cached by pkgsource) and Kimi-K2.5's real config.json (tests/fixtures/kimi-k2.5) as a config-only
checkpoint: custom code in auto_map against the playbook var trust_remote_code, and the aux layer ids
against what the model's forward captures (agent/check/auxcapture.py); then `check --model` and the
extract preflight over the real sshd.

What the sources hold (read there): DeepseekV2Model.forward gathers an aux state before each decoder layer
(`if idx in self.aux_hidden_state_layers`, idx < num_hidden_layers) from vLLM 0.18.0, and also after the
loop (`if self.end_layer in self.aux_hidden_state_layers`) from 0.25.0; 0.17.x's DeepSeek-V2 class has no
capture (nor SupportsEagle3: gpu_model_runner.py raises at load). LlamaModel gathers before each layer in
0.17.x and after each layer (`_maybe_add_hidden_state(aux, idx + 1, ...)`) from 0.18.0.
"""

from __future__ import annotations

import json

import pytest

from remote_ops import pkgsource
from remote_ops.agent import serverflow as agent_sf
from remote_ops.agent.check.auxcapture import capture
from remote_ops.agent.contract import SERVED_MODEL_CHECKS
from remote_ops.check import serverflow
from remote_ops.connect.inventory import Host
from remote_ops.extract.extract_spec import server_command
from remote_ops.playbook import loader as pb_mod
from tests.conftest import REPO

MAIN = "eagle3-speculators-0.9.0"
NOCP = "eagle3-speculators-0.9.0-no-chunked-prefill"
KIMI = REPO / "tests" / "fixtures" / "kimi-k2.5"
KIMI_IDS = [2, 30, 58, 61]          # launch_vllm.py's [2, n//2, n-3, n] for Kimi-K2.5's 61 layers


def _module(version, name):
    p = pkgsource.unpacked("vllm", version) / "vllm" / "model_executor" / "models" / f"{name}.py"
    return capture(str(p), p.read_text())


@pytest.mark.parametrize("version,deepseek_last,llama_last", [
    ("0.18.0", False, True), ("0.20.0", False, True), ("0.22.0", False, True), ("0.24.0", False, True),
    ("0.25.0", True, True), ("0.33.0", True, True)])
def test_which_release_captures_the_last_id(version, deepseek_last, llama_last):
    ds, ll = _module(version, "deepseek_v2"), _module(version, "llama")
    assert (ds["class"], ds["shape"], ds["last_id"]) == ("DeepseekV2Model", "before-layer", deepseek_last)
    assert (ll["class"], ll["shape"], ll["last_id"]) == ("LlamaModel", "after-layer", llama_last)
    # the first id adds residual, None before the first layer, in DeepSeek's forward (not in Llama's)
    assert ds["first_id_adds_none"] is True and ll["first_id_adds_none"] is False


def test_017_llama_gathers_before_the_layer_and_deepseek_not_at_all():
    ll = _module("0.17.0", "llama")
    assert (ll["shape"], ll["last_id"], ll["line"]) == ("before-layer", False, 424)
    assert _module("0.17.0", "deepseek_v2") is None and _module("0.20.0", "kimi_k25") is None


def _ckpt(tmp_path, tokenizer_auto_map=False, config_auto_map=True, name="kimi"):
    d = tmp_path / name
    d.mkdir()
    cfg = json.loads((KIMI / "config.json").read_text())
    if not config_auto_map:
        cfg.pop("auto_map")
        cfg["text_config"].pop("auto_map", None)
    (d / "config.json").write_text(json.dumps(cfg))
    if tokenizer_auto_map:
        # the shape of Kimi-K2.5's tokenizer_config.json: its tokenizer is tokenization_kimi.py
        (d / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "TikTokenTokenizer",
            "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}))
    return d


def _command(name=MAIN, **vars_):
    return server_command(pb_mod.load(str(pb_mod.find(name))),
                          Host(name="t", hostname="h", python="python3", vars=vars_))


def _model_checks(version, command):
    res = agent_sf.op_check({"command": command, "client": serverflow.CLIENT_FIELDS,
                             "sys_path": [str(pkgsource.unpacked("vllm", version))]})
    return {c["id"]: c for c in res["checks"] if c["id"] in SERVED_MODEL_CHECKS}


def test_the_var_renders_the_flag_into_the_server_command(tmp_path):
    for name in (MAIN, NOCP):
        assert "--trust-remote-code" not in _command(name)
        assert _command(name, trust_remote_code=True)[-1] == "--trust-remote-code"
        assert "--trust-remote-code" in _command(name, trust_remote_code="true")
        with pytest.raises(Exception, match="must be true or false"):
            _command(name, trust_remote_code="yes please")


def test_kimi_config_auto_map_is_a_warning_until_the_var_is_set(tmp_path):
    d = _ckpt(tmp_path)
    checks = _model_checks("0.33.0", _command(target_model=str(d)))
    t = checks["trust-remote-code"]
    assert t["ok"] is False and t["severity"] == "warning" and t["where"] == str(d / "config.json")
    assert "config.json auto_map (AutoConfig, AutoModel, AutoModelForCausalLM)" in t["detail"]
    assert "trust_remote_code: true" in t["fix"]
    # the flag is an EngineArgs boolean of this release: the flags check passes with it
    trusted = agent_sf.op_check({"command": _command(target_model=str(d), trust_remote_code=True),
                                 "client": serverflow.CLIENT_FIELDS,
                                 "sys_path": [str(pkgsource.unpacked("vllm", "0.33.0"))]})
    by = {c["id"]: c for c in trusted["checks"]}
    assert by["trust-remote-code"]["ok"] is True and by["flags"]["ok"] is True


def test_a_tokenizer_in_remote_code_alone_is_said(tmp_path):
    d = _ckpt(tmp_path, tokenizer_auto_map=True, config_auto_map=False)
    t = _model_checks("0.22.0", _command(NOCP, target_model=str(d)))["trust-remote-code"]
    assert t["ok"] is False and "tokenizer_config.json auto_map (AutoTokenizer)" in t["detail"]
    assert "config.json auto_map" not in t["detail"].replace("tokenizer_config.json", "")
    plain = _ckpt(tmp_path, config_auto_map=False, name="plain")
    assert _model_checks("0.22.0", _command(NOCP, target_model=str(plain)))["trust-remote-code"]["ok"] is True


@pytest.mark.parametrize("version,line,stack", [("0.20.0", 1276, 113), ("0.22.0", 1313, None),
                                                ("0.24.0", 1339, None)])
def test_kimi_last_id_is_not_captured_before_025(tmp_path, version, line, stack):
    d = _ckpt(tmp_path)
    name = NOCP if version == "0.22.0" else MAIN
    a = _model_checks(version, _command(name, target_model=str(d), layer_ids=KIMI_IDS))["aux-layer-ids"]
    assert a["ok"] is False and a["where"] == f"vllm/model_executor/models/deepseek_v2.py:{line}"
    assert a["detail"].startswith("ids [61] will not be captured on this vLLM: DeepseekV2Model.forward")
    assert "stacks 3 state(s) for 4 ids" in a["detail"]
    if stack:
        assert f"vllm/v1/spec_decode/extract_hidden_states.py:{stack}" in a["detail"]
    assert a["fix"].endswith("e.g. [2, 30, 58, 60]")
    # ids below n are the fix, and they hold
    ok = _model_checks(version, _command(name, target_model=str(d), layer_ids=[2, 30, 58, 60]))["aux-layer-ids"]
    assert ok["ok"] is True


def test_kimi_last_id_is_captured_from_025(tmp_path):
    d = _ckpt(tmp_path)
    for version, line in (("0.25.0", 1489), ("0.33.0", 1586)):
        a = _model_checks(version, _command(target_model=str(d), layer_ids=KIMI_IDS))["aux-layer-ids"]
        assert a["ok"] is True and a["where"] == f"vllm/model_executor/models/deepseek_v2.py:{line}"


def test_id_zero_and_out_of_range_ids(tmp_path):
    d = _ckpt(tmp_path)
    a = _model_checks("0.33.0", _command(target_model=str(d), layer_ids=[0, 30]))["aux-layer-ids"]
    assert a["ok"] is False and "id 0 adds residual, None before the first layer" in a["detail"]
    a = _model_checks("0.33.0", _command(target_model=str(d), layer_ids=[2, 62]))["aux-layer-ids"]
    assert a["ok"] is False and "[62] not in 0..61" in a["detail"]


def test_017_kimi_has_no_capture_at_all(tmp_path):
    d = _ckpt(tmp_path)
    a = _model_checks("0.17.0", _command(target_model=str(d), layer_ids=[2, 30, 58, 60]))["aux-layer-ids"]
    assert a["ok"] is False and a["where"] == "vllm/v1/worker/gpu_model_runner.py:4309"
    assert "vllm/model_executor/models/kimi_k25.py, vllm/model_executor/models/deepseek_v2.py" in a["detail"]


def test_llama_default_ids_on_017_and_020(tmp_path):
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                               "num_hidden_layers": 32}))
    # the playbook's default [2, 16, 29, 32] is for a 32-layer Llama
    old = _model_checks("0.17.0", _command(target_model=str(d)))["aux-layer-ids"]
    assert old["ok"] is False and old["where"] == "vllm/model_executor/models/llama.py:424"
    assert "ids [32] will not be captured" in old["detail"]
    assert _model_checks("0.20.0", _command(target_model=str(d)))["aux-layer-ids"]["ok"] is True
    assert _model_checks("0.20.0", _command(target_model=str(d)))["trust-remote-code"]["ok"] is True


# ------------------------------------------------------------------ over the real sshd
@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    return {v: pkgsource.make_env(tmp_path_factory.mktemp(f"sfm{v}") / "venv",
                                  [("speculators", "0.9.0"), ("hs-connectors", "0.9.0"), ("vllm", v)])
            for v in ("0.22.0", "0.33.0")}


def test_check_model_warns_on_remote_code_and_names_uncaptured_ids(sshd, inventory_file, envs, cli, tmp_path):
    d = _ckpt(tmp_path)
    inv = inventory_file(python=str(envs["0.33.0"]), vars={"layer_ids": KIMI_IDS})
    status, out, err = cli("check", "testhost", "--playbook", MAIN, "--model", str(d), "--strict", "-i", str(inv))
    text = " ".join(out.split())
    assert status == 0, out + err          # a warning is not a finding; 0.33.0 captures id 61
    assert "1 warning(s)" in text and "warning: server flow:" in text and "trust_remote_code: true" in text
    status, out, err = cli("--json", "check", "testhost", "--playbook", MAIN, "--model", str(d), "-i", str(inv))
    sf = json.loads(out)["server_flow"]
    assert [c["id"] for c in sf["warnings"]] == ["trust-remote-code"] and sf["findings"] == []
    inv = inventory_file(python=str(envs["0.33.0"]), vars={"layer_ids": KIMI_IDS, "trust_remote_code": True})
    status, out, err = cli("--json", "check", "testhost", "--playbook", MAIN, "--model", str(d), "-i", str(inv))
    sf = json.loads(out)["server_flow"]
    assert status == 0 and sf["warnings"] == [] and sf["findings"] == [] and sf["unknown"] == []
    # 0.22.0: id 61 is never gathered by deepseek_v2.py: a finding, exit 1
    inv = inventory_file(python=str(envs["0.22.0"]), vars={"layer_ids": KIMI_IDS, "trust_remote_code": True})
    status, out, err = cli("check", "testhost", "--playbook", NOCP, "--model", str(d), "-i", str(inv))
    text = " ".join(out.split())
    assert status == 1, out + err
    assert "vllm/model_executor/models/deepseek_v2.py:1313" in text and "ids [61] will not be captured" in text
    assert "e.g. [2, 30, 58, 60]" in text


def test_extract_preflight_refuses_remote_code_without_the_var(sshd, inventory_file, envs, cli, tmp_path):
    d = _ckpt(tmp_path)
    data = tmp_path / "prep"
    data.mkdir()
    base = {"target_model": str(d), "preprocessed_data": str(data), "layer_ids": [2, 30, 58, 60],
            "server_python": str(envs["0.33.0"])}
    inv = inventory_file(python=str(envs["0.33.0"]), vars=base)
    status, out, err = cli("--json", "extract", "testhost", "--playbook", MAIN, "--dry-run", "-i", str(inv))
    rec = json.loads(out)
    problems = rec["preflight"]["problems"]
    assert status != 0
    mine = [p for p in problems if "--trust-remote-code" in p]
    assert len(mine) == 1 and "config.json auto_map" in mine[0] and "(fix: set the playbook var " \
        "trust_remote_code: true" in mine[0], problems
    inv = inventory_file(python=str(envs["0.33.0"]), vars=dict(base, trust_remote_code=True))
    status, out, err = cli("--json", "extract", "testhost", "--playbook", MAIN, "--dry-run", "-i", str(inv))
    problems = json.loads(out)["preflight"]["problems"]
    assert not [p for p in problems if "server flow:" in p], problems
    # the layer id n on 0.22.0 refuses too
    inv = inventory_file(python=str(envs["0.22.0"]), vars=dict(base, trust_remote_code=True, layer_ids=KIMI_IDS,
                                                                server_python=str(envs["0.22.0"])))
    status, out, err = cli("--json", "extract", "testhost", "--playbook", NOCP, "--dry-run", "-i", str(inv))
    problems = json.loads(out)["preflight"]["problems"]
    assert [p for p in problems if "ids [61] will not be captured" in p and "deepseek_v2.py:1313" in p], problems


@pytest.mark.parametrize("version,ok", [("0.20.0", True), ("0.33.0", True), ("0.17.0", False)])
def test_a_wrapper_whose_text_config_names_no_architecture_is_followed_to_the_model_it_builds(tmp_path, version, ok):
    """Kimi-K2.5-shaped checkpoints need not list text_config.architectures: kimi_k25.py builds its text
    model as init_vllm_registered_model(..., architectures=["DeepseekV2ForCausalLM"]), and that model's
    forward is the one that captures (a GPU fixture without them was refused as 'cannot extract')."""
    d = _ckpt(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"].pop("architectures", None)
    (d / "config.json").write_text(json.dumps(cfg))
    a = _model_checks(version, _command(target_model=str(d), layer_ids=[2, 30, 58, 60]))["aux-layer-ids"]
    assert a["ok"] is ok, a
    if ok:
        assert a["where"].startswith("vllm/model_executor/models/deepseek_v2.py:")
    else:
        assert "vllm/model_executor/models/kimi_k25.py, vllm/model_executor/models/deepseek_v2.py" in a["detail"]
