"""The model preflight: the checkpoint's class, resolved from the REAL vLLM 0.17.0 / 0.20.0
registry sources, against what REAL speculators 0.3.0's worker needs, before and after the shipped
playbook's edits; config.json-only checkpoint directories; then `check --model` and the extract
preflight over the real sshd.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from remote_ops import pkgsource
from remote_ops.agent import model as model_check
from remote_ops.agent.core.reads import Reads
from remote_ops.playbook import edits as edits_mod
from remote_ops.playbook import loader as pb_mod

PLAYBOOK = pb_mod.load(pb_mod.find("eagle3-speculators-0.3.0"))
WORKER = "speculators.data_generation.custom_worker"
DEEPSEEK = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 8,
            "hidden_size": 256}
CHECKPOINTS = {
    "deepseek": DEEPSEEK,
    # Kimi-K2.5 as published: a multimodal wrapper whose text config is a DeepSeek-V3 one
    "kimi": {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
             "text_config": dict(DEEPSEEK, architectures=["DeepseekV3ForCausalLM"])},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 6},
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4},
    # LLaVA as many are published: the text_config names no architectures
    "llava": {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
              "text_config": {"model_type": "llama", "num_hidden_layers": 4}},
    "unknown-arch": {"architectures": ["NoSuchModelForCausalLM"], "num_hidden_layers": 8},
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    for name, cfg in CHECKPOINTS.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    (root / "no-config").mkdir()
    return root


@pytest.fixture(scope="module")
def speculators_patched(tmp_path_factory) -> Path:
    """speculators 0.3.0 with the shipped playbook's edits applied by remote-ops' own edit code."""
    src = pkgsource.unpacked("speculators", "0.3.0")
    dest = tmp_path_factory.mktemp("spec-patched") / "site"
    shutil.copytree(src, dest)
    for target in PLAYBOOK.patches:
        path = dest / (target.module.replace(".", "/") + ".py")
        path.write_text(edits_mod.apply_edits(path.read_text(), target.edits, str(path)).new_text)
    return dest


def section_args(**over):
    s = PLAYBOOK.check["model"]
    args = {"library": "vllm", "default_layer_ids": s["default_layer_ids"], "protocol": s["protocol"],
            "worker": s["worker"], "text_model": s["text_model"]}
    args.update(over)
    return args


def run(checkpoints, name, vllm, patched=None, **over):
    sys_path = [str(pkgsource.unpacked("vllm", vllm)), str(patched or pkgsource.unpacked("speculators", "0.3.0"))]
    over.setdefault("model", str(checkpoints / name))
    return model_check.check(section_args(sys_path=sys_path, **over), Reads())


def kinds(out):
    return {(f["kind"], f["name"]) for f in out["findings"]}


# (checkpoint, vLLM, worker patched?, expected finding kinds, expected text model path or None)
CASES = [
    # vLLM 0.17.0: the DeepSeek-V3 family does not implement SupportsEagle3 (only SupportsEagle)
    ("kimi", "0.17.0", False, {("protocol-missing", "get_eagle3_aux_hidden_state_layers"),
                               ("text-model-missing", "model")}, None),
    ("kimi", "0.17.0", True, {("protocol-missing", "get_eagle3_aux_hidden_state_layers")}, "language_model.model"),
    ("deepseek", "0.17.0", True, {("protocol-missing", "get_eagle3_aux_hidden_state_layers")}, "model"),
    ("qwen3", "0.17.0", True, {("layer-ids", None)}, "model"),
    # vLLM 0.20.0: Kimi implements SupportsEagle3 but has no .model: the unpatched worker fails there
    ("kimi", "0.20.0", False, {("text-model-missing", "model")}, None),
    ("kimi", "0.20.0", True, set(), "language_model.model"),
    ("deepseek", "0.20.0", False, {("text-model-member-missing", "get_input_embeddings")}, "model"),
    ("deepseek", "0.20.0", True, set(), "model"),
    ("llama", "0.20.0", True, {("layer-ids", None)}, "model"),
    ("unknown-arch", "0.20.0", True, {("architecture-not-registered", "NoSuchModelForCausalLM")}, None),
]


@pytest.mark.parametrize("name,vllm,patched,expected,text_path", CASES,
                         ids=[f"{c[0]}-{c[1]}-{'patched' if c[2] else 'original'}" for c in CASES])
def test_model_preflight_on_real_sources(checkpoints, speculators_patched, name, vllm, patched, expected, text_path):
    out = run(checkpoints, name, vllm, speculators_patched if patched else None)
    assert kinds(out) == expected, out["findings"]
    assert (out.get("text_model") or {}).get("path") == text_path
    assert out["unknown"] == [], out["unknown"]
    for f in out["findings"]:       # each finding names where and what to do
        assert f["path"] and f["message"] and f["suggestion"]
        if f["kind"] != "layer-ids":
            assert f["path"].startswith(str(pkgsource.unpacked("vllm", vllm))) and f["line"]


def test_kimi_on_020_resolves_the_wrapper_to_deepseek_text_model(checkpoints, speculators_patched):
    out = run(checkpoints, "kimi", "0.20.0", speculators_patched)
    assert out["class"]["symbol"] == "vllm.model_executor.models.kimi_k25.KimiK25ForConditionalGeneration"
    assert out["text_model"]["symbol"] == "vllm.model_executor.models.deepseek_v2.DeepseekV2Model"
    assert out["decoder_layer"]["symbol"] == "vllm.model_executor.models.deepseek_v2.DeepseekV2DecoderLayer"
    assert out["num_layers"] == 8 and out["layer_ids"] == [2, 4, 5, 7] and out["layer_ids_source"] == "default"
    assert set(out["checked"]) == {"layer ids", "SupportsEagle3", "text model", "decoder layer forward"}
    # what the worker needs is read from its source: the patched forward uses embed_input_ids
    assert "embed_input_ids" in out["worker"]["uses"] and "get_input_embeddings" not in out["worker"]["uses"]
    assert out["worker"]["layer_calls"][0]["keywords"] == ["hidden_states", "positions", "residual"]


def test_the_unpatched_worker_is_read_as_it_is(checkpoints):
    out = run(checkpoints, "kimi", "0.20.0")
    assert out["text_model_paths"] == ["model"]            # the original never names language_model
    assert "get_input_embeddings" in out["worker"]["uses"]


@pytest.mark.parametrize("ids,problem", [
    ([2, 4, 4, 7], "4 repeated"), ([2, 4, 8], "8 out of range 0..7"), ([0, 7], None)])
def test_given_layer_ids_are_checked_against_the_layer_count(checkpoints, speculators_patched, ids, problem):
    out = run(checkpoints, "deepseek", "0.20.0", speculators_patched, layer_ids=ids)
    assert out["layer_ids_source"] == "given"
    msgs = [f["message"] for f in out["findings"] if f["kind"] == "layer-ids"]
    assert (problem in msgs[0]) if problem else msgs == []


def test_default_layer_ids_of_small_models_repeat(checkpoints, speculators_patched):
    out = run(checkpoints, "qwen3", "0.20.0", speculators_patched)
    (f,) = [f for f in out["findings"] if f["kind"] == "layer-ids"]
    assert "[2, 3, 3, 5]" in f["message"] and "default for 6 layers" in f["message"]
    assert "layer_ids" in f["suggestion"]


def test_unknowns_are_listed_not_passed(checkpoints, speculators_patched):
    hf = run(checkpoints, "no-such-org/no-such-model", "0.20.0", speculators_patched,
             model="no-such-org/no-such-model")
    assert hf["findings"] == [] and "not in the local HF hub cache" in hf["unknown"][0]["reason"]
    missing = run(checkpoints, "no-config", "0.20.0", speculators_patched)
    assert [f["kind"] for f in missing["findings"]] == ["model-config"] and "no config.json" in missing["findings"][0]["message"]


def test_a_relative_model_path_is_the_jobs_own(checkpoints, speculators_patched):
    out = run(checkpoints, "x", "0.20.0", speculators_patched, model="deepseek", workdir=str(checkpoints))
    assert out["config"] == str(checkpoints / "deepseek" / "config.json") and out["text_model"]["path"] == "model"


def test_declared_protocol_members_come_from_the_library(checkpoints):
    """SupportsEagle3's members are read from vLLM's interfaces.py, not listed by hand."""
    from remote_ops.agent.resolve.resolver import StaticResolver
    r = StaticResolver([str(pkgsource.unpacked("vllm", "0.20.0"))], reads=Reads())
    proto = r.lookup("vllm.model_executor.models.interfaces", "SupportsEagle3")
    members = model_check.protocol_members(r, proto)
    # 0.20.0 renamed get_eagle3_aux_hidden_state_layers (0.17.0) to get_eagle3_default_aux_hidden_state_layers
    assert {"supports_eagle3", "set_aux_hidden_state_layers", "get_eagle3_default_aux_hidden_state_layers"} <= \
        set(members), members


# ------------------------------------------------------------------ over the real sshd
@pytest.fixture
def env020(tmp_path):
    return pkgsource.make_env(tmp_path / "venv", [("speculators", "0.3.0"), ("vllm", "0.20.0")])


def test_check_model_over_ssh_then_patch_then_clean(sshd, inventory_file, env020, cli, checkpoints, tmp_path):
    inv = inventory_file(python=str(env020), playbook=str(pb_mod.find("eagle3-speculators-0.3.0")),
                         vars={"target_model": str(checkpoints / "kimi"), "layer_ids": "1,3,5,7"})
    status, out, err = cli("check", "testhost", "--json", "-i", str(inv))
    assert status == 1, err
    m = json.loads(out)["model"]
    assert kinds(m) == {("text-model-missing", "model")} and m["layer_ids"] == [1, 3, 5, 7]
    status, out, err = cli("check", "testhost", "-i", str(inv))
    text = " ".join(out.split())
    assert "KimiK25ForConditionalGeneration has no model" in text and "language_model.model" in text
    status, out, err = cli("patch", "testhost", "--yes", "-i", str(inv))
    assert status == 0, err
    status, out, err = cli("check", "testhost", "--json", "-i", str(inv))
    assert status == 0, out
    m = json.loads(out)["model"]
    assert m["findings"] == [] and m["text_model"]["path"] == "language_model.model"
    # --model overrides the var: a 6-layer Qwen3 with the package's default ids
    status, out, err = cli("check", "testhost", "--json", "--model", str(checkpoints / "qwen3"), "-i", str(inv))
    assert status == 1 and kinds(json.loads(out)["model"]) == {("layer-ids", None)}


def test_check_lists_a_missing_model_var_as_not_checked_and_a_missing_model_flag_as_a_finding(
        sshd, inventory_file, env020, cli, tmp_path):
    pb = pb_mod.find("eagle3-speculators-0.3.0")
    inv = inventory_file(python=str(env020), playbook=str(pb))          # the playbook's /data/models/target
    assert cli("patch", "testhost", "--yes", "-i", str(inv))[0] == 0
    status, out, err = cli("check", "testhost", "--json", "-i", str(inv))
    doc = json.loads(out)
    m = doc["model"]
    assert status == 0 and m["findings"] == [] and "set the var target_model" in m["unknown"][0]["reason"]
    # the closing line's unknown is the sum of the lines above it: the calls' and the model's
    status, out, err = cli("check", "testhost", "-i", str(inv))
    lines = out.strip().splitlines()
    assert any(line.startswith("model ") and "1 unknown" in line for line in lines), out
    assert lines[-1].endswith(f", {len(doc['unknown']) + len(m['unknown'])} unknown"), out
    assert not lines[-1].endswith(", 0 unknown")
    status, out, err = cli("check", "testhost", "--json", "--model", str(tmp_path / "nope"), "-i", str(inv))
    assert status == 1 and kinds(json.loads(out)["model"]) == {("model-missing", None)}


def test_extract_preflight_refuses_a_model_the_worker_cannot_serve(sshd, inventory_file, env020, cli, checkpoints,
                                                                  tmp_path):
    pb = pb_mod.find("eagle3-speculators-0.3.0")
    inv = inventory_file(python=str(env020), playbook=str(pb), workdir=str(tmp_path / "wd"),
                         vars={"target_model": str(checkpoints / "qwen3"), "import_check": [], "gpus": 0,
                               "dataset": str(tmp_path / "d.jsonl")})
    (tmp_path / "wd").mkdir()
    assert cli("patch", "testhost", "--yes", "-i", str(inv))[0] == 0
    status, out, err = cli("extract", "testhost", "--dry-run", "--json", "-i", str(inv))
    doc = json.loads(out)
    problems = doc["preflight"]["problems"] if "preflight" in doc else doc["details"]["preflight"]["problems"]
    assert status != 0 and any("layer-ids" in p and "[2, 3, 3, 5]" in p for p in problems), doc


def test_the_layer_ids_fix_applied_as_printed_gets_past_the_preflight_and_the_scripts_parse(
        checkpoints, speculators_patched):
    """The preflight's suggestion ("set the playbook var layer_ids to ..., e.g. [0, 2, 3, 5]") taken
    literally as YAML into the host's vars: the preflight's own request reads it and finds nothing,
    and the command the job runs hands the shipped script a --layer-ids ("[0, 2, 3, 5]": a list var
    is filled as written, which the server flow's JSON needs) that it parses to the same ids."""
    import re

    import yaml

    from remote_ops.check import model as check_model
    from remote_ops.connect.hosts import Host
    from remote_ops.extract.extract_spec import parse_spec
    from tests.conftest import load_extract_script

    out = run(checkpoints, "qwen3", "0.20.0", speculators_patched)
    (f,) = [f for f in out["findings"] if f["kind"] == "layer-ids"]
    m = re.search(r"set the playbook var layer_ids to .*, e\.g\. (\[.*\])$", f["suggestion"])
    assert m, f["suggestion"]
    literal = yaml.safe_load(f"layer_ids: {m.group(1)}")["layer_ids"]     # as a user pastes it into vars:
    host = Host(name="gpu", hostname="gpu", python="/usr/bin/python3", workdir="/w",
                vars={"target_model": str(checkpoints / "qwen3"), "layer_ids": literal})
    req = check_model.request(PLAYBOOK, host)
    assert req is not None
    op, args = req
    assert args["layer_ids"] == literal
    fixed = run(checkpoints, "qwen3", "0.20.0", speculators_patched, layer_ids=args["layer_ids"])
    assert [f for f in fixed["findings"] if f["kind"] == "layer-ids"] == []
    command = parse_spec(PLAYBOOK, host).command
    given = command[command.index("--layer-ids") + 1]
    script = load_extract_script()
    assert script.parse_layer_ids(given) == literal
    assert script.parse_layer_ids("2,4,5,7") == script.parse_layer_ids("[2, 4, 5, 7]") == [2, 4, 5, 7]
    with pytest.raises(script.InputError, match="is not a layer index"):
        script.parse_layer_ids("[2, x]")


def test_a_text_model_chosen_at_run_time_is_said_whole(checkpoints, speculators_patched):
    """LLaVA's text model comes from init_vllm_registered_model(hf_config=config.text_config, ...)
    and its text_config names no architectures: the reason says that, in full words (it used to be
    the call's source cut at 100 characters, inside an identifier)."""
    out = run(checkpoints, "llava", "0.20.0", speculators_patched)
    (u,) = [u for u in out["unknown"] if u["what"].startswith("text model")]
    assert u["reason"].endswith("LlavaForConditionalGeneration: the text model's class is chosen at run time from "
                                "hf_config=config.text_config, and config.json's text_config names no architectures")


@pytest.mark.parametrize("text,limit,want", [
    ("init_vllm_registered_model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, 'x'))", 60,
     "init_vllm_registered_model(vllm_config=vllm_config, prefix ..."),
    ("self.model_cls(config.text_config)", 20, "self.model_cls ..."),
    ("short(x)", 80, "short(x)"),
    ("abc.def_ghi(x)", 11, "abc.def_ghi ..."),
])
def test_a_clipped_expression_ends_between_names(text, limit, want):
    assert model_check._clip(text, limit) == want


def test_a_corrupt_config_json_is_to_be_repaired_not_pointed_elsewhere(tmp_path):
    """The directory is the right one and its config.json is broken: the fix names that file; a
    directory without config.json is still told to point target_model at the checkpoint."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],')
    out = run(tmp_path, "ckpt", "0.20.0")
    (f,) = out["findings"]
    assert f["kind"] == "model-config" and "is not valid JSON" in f["message"]
    assert f["suggestion"] == f"repair or re-download {tmp_path / 'ckpt' / 'config.json'} (the job's loader reads it too)"
    (tmp_path / "empty").mkdir()
    (f,) = run(tmp_path, "empty", "0.20.0")["findings"]
    assert "has no config.json" in f["message"] and f["suggestion"].startswith("point target_model")
