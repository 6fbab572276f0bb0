"""`check --model` with Kimi-K2.5's real config.json (tests/fixtures/kimi-k2.5, see its SOURCE.md) as a
config-only checkpoint, on the real sources of vLLM 0.17.0, 0.20.0, 0.22.0 and 0.33.0: the class the
registry picks, the layers, what the int4 quantization_config quantizes (the routed experts only) and
what the installed vLLM has for it; and the per-release known breakages of the family
(remote_ops/check/known_breakages.yaml) reported as warnings naming the release and the source."""

from __future__ import annotations

import pytest

from remote_ops import pkgsource
from remote_ops.agent import model as model_check
from remote_ops.agent.core.reads import Reads
from remote_ops.check import known
from tests.conftest import REPO
from tests.check.test_model import section_args

KIMI = REPO / "tests" / "fixtures" / "kimi-k2.5"


def _check(vllm, extra=()):
    sys_path = [str(pkgsource.unpacked("vllm", vllm)), str(pkgsource.unpacked("speculators", "0.3.0")), *extra]
    return model_check.check(section_args(sys_path=sys_path, model=str(KIMI)), Reads())


@pytest.mark.parametrize("vllm", ["0.17.0", "0.20.0", "0.22.0", "0.33.0"])
def test_kimi_config_int4_experts(vllm):
    out = _check(vllm)
    assert out["class"]["symbol"] == "vllm.model_executor.models.kimi_k25.KimiK25ForConditionalGeneration"
    assert out["num_layers"] == 61 and out["layer_ids"] == [2, 30, 58, 60]
    q = out["quantization"]
    assert (q["method"], q["format"], q["bits"], q["type"], q["strategy"], q["group_size"], q["symmetric"]) == \
        ("compressed-tensors", "pack-quantized", 4, "int", "group", 32, True)
    # the ignore list leaves only the routed experts quantized
    assert q["quantized"] == ["routed experts"]
    assert q["not_quantized"] == ["shared experts", "attention", "dense MLP (first layers)", "lm_head"]
    assert q["library_has_method"] is True
    where = q["moe_method"]["where"]
    assert where.startswith(str(pkgsource.unpacked("vllm", vllm)))
    # 0.17.0 keeps every compressed-tensors MoE method in one module; 0.20.0 on split it per scheme
    assert where.endswith("compressed_tensors_moe.py" if vllm == "0.17.0" else "compressed_tensors_moe_wna16.py")
    # these sources hold no compressed_tensors package: what Kimi's load would need, said before the engine
    assert q["needs_package"] == {"name": "compressed-tensors", "import": "compressed_tensors", "installed": False}
    dep = [f for f in out["findings"] if f["kind"] == "quantization-dependency"]
    assert len(dep) == 1 and "pip install compressed-tensors" in dep[0]["suggestion"]


def test_the_dependency_finding_goes_when_the_package_is_there(tmp_path):
    (tmp_path / "compressed_tensors").mkdir()
    (tmp_path / "compressed_tensors" / "__init__.py").write_text("")
    out = _check("0.22.0", extra=[str(tmp_path)])
    assert out["quantization"]["needs_package"]["installed"] is True
    assert not [f for f in out["findings"] if f["kind"].startswith("quantization")]


def test_an_unknown_method_is_a_finding(tmp_path):
    import json
    cfg = json.loads((KIMI / "config.json").read_text())
    cfg["quantization_config"]["quant_method"] = "no-such-method"
    cfg["text_config"].pop("quantization_config")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sys_path = [str(pkgsource.unpacked("vllm", "0.33.0")), str(pkgsource.unpacked("speculators", "0.3.0"))]
    out = model_check.check(section_args(sys_path=sys_path, model=str(tmp_path)), Reads())
    bad = [f for f in out["findings"] if f["kind"] == "quantization-unsupported"]
    assert len(bad) == 1 and bad[0]["name"] == "no-such-method" and out["quantization"]["library_has_method"] is False


def test_known_breakages_name_the_release_and_the_source():
    entries = known.load()
    assert entries and all(e["source"].strip() for e in entries)
    model = {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"]}
    w = known.warnings_for(model, {"vllm": "0.22.1"})
    assert len(w) == 1 and w[0]["message"].startswith("vllm 0.22.1: serving Kimi-K2.5 regressed")
    assert "Model-Optimizer" in w[0]["source"] and "0.22.1 regressed Kimi serve" in w[0]["source"]
    assert [x["version"] for x in known.warnings_for(model, {"vllm": "0.17.0"})] == ["0.17.0"]
    assert known.warnings_for(model, {"vllm": "0.22.0"}) == []
    assert known.warnings_for({"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]},
                              {"vllm": "0.22.1"}) == []


def test_a_data_file_entry_without_a_source_is_refused(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("breakages:\n  - {family: {model_type: [x]}, library: vllm, versions: '==1.0', what: w}\n")
    with pytest.raises(ValueError, match="lacks source"):
        known.load(str(p))


def test_check_model_over_ssh_warns_on_the_release(sshd, inventory_file, env_vllm017, cli):
    inv = inventory_file(python=str(env_vllm017))
    status, out, err = cli("check", "testhost", "--playbook", "eagle3-speculators-0.3.0", "--model", str(KIMI),
                           "-i", str(inv))
    assert "warning: vllm 0.17.0: Kimi-K2.5 fails SpeculativeConfig validation in this release (source: NVIDIA " \
           "Model-Optimizer" in " ".join(out.split()), out + err
    # a warning is not a finding: the exit status is the findings' (0.17.0's Kimi class lacks SupportsEagle3)
    assert status == 1
    status, out, err = cli("--json", "check", "testhost", "--playbook", "eagle3-speculators-0.3.0", "--model",
                           str(KIMI), "-i", str(inv))
    import json
    model = json.loads(out)["model"]
    assert [w["version"] for w in model["warnings"]] == ["0.17.0"]
    assert not [f for f in model["findings"] if "0.17.0" in f["message"] and "SpeculativeConfig" in f["message"]]


def _with_remote_tokenizer(tmp_path):
    """Kimi-K2.5's real config.json with a tokenizer_config.json of the shape Kimi-K2.5 ships (its
    tokenizer is tokenization_kimi.py, named in auto_map)."""
    import json
    import shutil
    d = tmp_path / "kimi"
    d.mkdir()
    shutil.copy(KIMI / "config.json", d / "config.json")
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}))
    return d


def test_the_030_generator_loads_a_remote_code_tokenizer_untrusted(tmp_path):
    """speculators 0.3.0's vllm_hidden_states_generator.py:84 calls AutoTokenizer.from_pretrained(model_path)
    with no trust_remote_code (its AutoConfig and ModelConfig calls hard-code True)."""
    from tests.check.test_model import PLAYBOOK
    d = _with_remote_tokenizer(tmp_path)
    loader = PLAYBOOK.check["model"]["tokenizer_loader"]
    sys_path = [str(pkgsource.unpacked("vllm", "0.20.0")), str(pkgsource.unpacked("speculators", "0.3.0"))]
    out = model_check.check(section_args(sys_path=sys_path, model=str(d), tokenizer_loader=loader), Reads())
    tok = [f for f in out["findings"] if f["kind"] == "remote-code-tokenizer"]
    assert len(tok) == 1 and tok[0]["severity"] == "warning" and tok[0]["line"] == 84
    assert tok[0]["path"].endswith("speculators/data_generation/vllm_hidden_states_generator.py")
    assert "tokenization_kimi.TikTokenTokenizer" in tok[0]["message"] and "server flow" in tok[0]["suggestion"]
    # the shipped playbook's edits (tokenizer-trust-remote-code) end it: read from the installed module
    from remote_ops.playbook import edits as edits_mod
    patched = tmp_path / "site"
    import shutil
    shutil.copytree(pkgsource.unpacked("speculators", "0.3.0"), patched)
    rel = "speculators/data_generation/vllm_hidden_states_generator.py"
    (target,) = [t for t in PLAYBOOK.patches if t.module == "speculators.data_generation.vllm_hidden_states_generator"]
    res = edits_mod.apply_edits((patched / rel).read_text(), target.edits, rel)
    assert "tokenizer-trust-remote-code" in [e.edit_id for e in res.results]
    (patched / rel).write_text(res.new_text)
    out = model_check.check(section_args(sys_path=[sys_path[0], str(patched)], model=str(d),
                                         tokenizer_loader=loader), Reads())
    assert not [f for f in out["findings"] if f["kind"] == "remote-code-tokenizer"]
    # config.json's auto_map alone: the generator's AutoConfig trusts it, nothing to say
    out = model_check.check(section_args(sys_path=sys_path, model=str(KIMI), tokenizer_loader=loader), Reads())
    assert not [f for f in out["findings"] if f["kind"] == "remote-code-tokenizer"]


def test_check_warns_on_the_030_flow_with_a_remote_tokenizer(sshd, inventory_file, env_vllm017,
                                                                           cli, tmp_path):
    import json
    d = _with_remote_tokenizer(tmp_path)
    inv = inventory_file(python=str(env_vllm017))
    status, out, err = cli("--json", "check", "testhost", "--playbook", "eagle3-speculators-0.3.0", "--model",
                           str(d), "-i", str(inv))
    model = json.loads(out)["model"]
    w = [x for x in model["warnings"] if x.get("kind") == "remote-code-tokenizer"]
    assert len(w) == 1 and w[0]["source"].endswith("vllm_hidden_states_generator.py:84")
    assert not [f for f in model["findings"] if f["kind"] == "remote-code-tokenizer"]
    status, out, err = cli("check", "testhost", "--playbook", "eagle3-speculators-0.3.0", "--model", str(d),
                           "-i", str(inv))
    assert "warning: " + str(d / "tokenizer_config.json") + " names its tokenizer in custom code" in out, out


def test_extract_preflight_refuses_the_030_flow_on_a_remote_tokenizer(sshd, inventory_file, cli, tmp_path):
    import json

    from remote_ops.playbook import loader as pb_mod
    env = pkgsource.make_env(tmp_path / "venv", [("speculators", "0.3.0"), ("vllm", "0.33.0")])
    d = _with_remote_tokenizer(tmp_path)
    (tmp_path / "wd").mkdir()
    inv = inventory_file(python=str(env), playbook=str(pb_mod.find("eagle3-speculators-0.3.0")),
                         workdir=str(tmp_path / "wd"),
                         vars={"target_model": str(d), "import_check": [], "gpus": 0, "layer_ids": "2,30,58,60",
                               "dataset": str(tmp_path / "d.jsonl")})
    status, out, err = cli("extract", "testhost", "--dry-run", "--json", "-i", str(inv))
    doc = json.loads(out)
    problems = doc["preflight"]["problems"] if "preflight" in doc else doc["details"]["preflight"]["problems"]
    mine = [p for p in problems if "remote-code-tokenizer" in p]
    assert status != 0 and len(mine) == 1, problems
    assert "vllm_hidden_states_generator.py:84" in mine[0] and "trust_remote_code" in mine[0]
