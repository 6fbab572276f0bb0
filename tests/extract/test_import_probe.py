"""The extract import probe also imports the vLLM module of the class the model registry picks for the
checkpoint (Kimi-K2.5's vllm/model_executor/models/kimi_k25.py needs compressed_tensors, which
otherwise fails only once the engine loads the model). Real vLLM 0.20.0 sources from PyPI."""

from __future__ import annotations

import json

import pytest

from remote_ops import pkgsource
from remote_ops.agent import imports
from remote_ops.agent.protocol import AgentFailure

KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                        "num_hidden_layers": 4}}


@pytest.fixture(scope="module")
def env020(tmp_path_factory):
    return pkgsource.make_env(tmp_path_factory.mktemp("probe020") / "venv", [("vllm", "0.20.0")])


def _ckpt(tmp_path, name, cfg):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_the_registry_picks_the_module_from_the_job_interpreters_vllm(tmp_path, env020):
    from remote_ops.agent.core.pythons import sys_path_of
    sp = sys_path_of(str(env020))
    assert any("vllm-0.20.0" in p for p in sp)
    assert imports.model_module(_ckpt(tmp_path, "kimi", KIMI), sys_path=sp) == \
        ("vllm.model_executor.models.kimi_k25", None)
    deepseek = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    assert imports.model_module(_ckpt(tmp_path, "ds", deepseek), sys_path=sp)[0] == \
        "vllm.model_executor.models.deepseek_v2"
    mod, why = imports.model_module(_ckpt(tmp_path, "odd", {"architectures": ["NoSuchForCausalLM"]}), sys_path=sp)
    assert mod is None and "NoSuchForCausalLM" in why and "registry" in why
    mod, why = imports.model_module(str(tmp_path / "absent"), sys_path=sp)
    assert mod is None and "does not exist" in why


def test_the_probe_imports_the_models_module_in_the_job_interpreter(tmp_path, env020):
    # this venv holds vLLM's sources only (no torch): the model's module is imported, and fails there,
    # after the job's own modules (json) imported fine
    with pytest.raises(AgentFailure) as exc:
        imports.op_probe({"python": str(env020), "modules": ["json"], "model": _ckpt(tmp_path, "kimi", KIMI),
                          "timeout": 120})
    assert exc.value.kind == "import-failed"
    assert exc.value.details["module"] == "vllm.model_executor.models.kimi_k25"
    assert "import vllm.model_executor.models.kimi_k25 failed" in str(exc.value)


def test_a_model_that_cannot_be_read_is_said_not_probed(tmp_path, env020):
    res = imports.op_probe({"python": str(env020), "modules": ["json"], "model": str(tmp_path / "absent")})
    assert res["ok"] and res["modules"] == ["json"]
    assert res["model_note"].startswith("the model's module was not probed: ") and "does not exist" in res["model_note"]
