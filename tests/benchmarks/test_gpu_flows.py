"""The both-flows GPU check's pieces that run without a GPU (benchmarks/gpu/flows_check.py,
benchmarks/gpu/flows_compare.py, benchmarks/gpu/lib/models.py --unambiguous-routing, and their GPU_RESULTS.md sections): the layer
mapping of the two layouts, the counting of every vector, the routing biases shared by both checkpoints,
the Kimi host's server command with --trust-remote-code through the shipped playbook's var, and the renderers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from benchmarks.gpu import flows_check as fc  # noqa: E402
from benchmarks.gpu import flows_compare as cmp  # noqa: E402
from benchmarks.gpu.lib import models as gm  # noqa: E402
from benchmarks.render import gpu_results  # noqa: E402


def test_layouts_map_to_the_same_decoder_layers():
    pt = cmp.parse_output("a=/x/out:pt:" + fc.IDS_030)
    hs = cmp.parse_output("b=/x/y:z:hs:" + ",".join(map(str, fc.IDS_SRV)))
    assert pt["decoder_layers"] == hs["decoder_layers"] == [1, 3, 5, 6]
    assert hs["dir"] == Path("/x/y:z") and pt["layout"] == "pt" and hs["layout"] == "hs"
    with pytest.raises(SystemExit):
        cmp.parse_output("c=/x:hs:0,2")          # id 0 of the server flow is the embeddings
    with pytest.raises(SystemExit):
        cmp.parse_output("c=/x:npz:1")


def test_count_counts_every_vector_and_the_worst():
    c = cmp.Count()
    c.add(torch.tensor([1.0, 0.9995, 0.998]), {"sample": 0})
    c.add(torch.tensor([0.99999, 0.5]), {"sample": 3}, equal=torch.tensor([True, False]))
    d = c.doc(with_equal=True)
    assert (d["n_total"], d["n_within_0_999"], d["n_below_0_999"], d["n_within_0_9999"]) == (5, 3, 2, 2)
    assert d["min_cosine"] == 0.5 and d["min_at"] == {"sample": 3, "token": 1} and d["n_bitwise_equal"] == 1


def test_outputs_found_and_loaded_in_both_layouts(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    ids = [1, 5, 6, 7]
    h = [torch.randn(4, 8, dtype=torch.bfloat16) for _ in range(2)]
    (tmp_path / "pt").mkdir()
    (tmp_path / "hs").mkdir()
    torch.save({"input_ids": torch.tensor(ids), "hidden_states": h}, tmp_path / "pt" / "data_3.pt")
    (tmp_path / "pt" / "data_config.json").write_text("{}")
    safetensors.save_file({"token_ids": torch.tensor(ids), "hidden_states": torch.stack(h, 1).contiguous()},
                          str(tmp_path / "hs" / "hs_3.safetensors"))
    for layout in ("pt", "hs"):
        out = cmp.parse_output(f"o={tmp_path / layout}:{layout}:2,3")
        files = cmp.sample_files(out)
        assert list(files) == [3]
        got_ids, states = cmp.load_sample(torch, out, files[3])
        assert got_ids == ids and all(torch.equal(a, b) for a, b in zip(states, h))


def test_routing_biases_are_shared_by_both_checkpoints_and_spaced():
    key = "model.layers.3.mlp.gate.e_score_correction_bias"
    a, b = gm.routing_bias(key, 8), gm.routing_bias("language_model." + key, 8)
    assert torch.equal(a, b)
    assert sorted(a.tolist()) == [i * gm.BIAS_SPACING for i in range(8)]
    assert not torch.equal(a, gm.routing_bias(key.replace("3", "4"), 8))     # each router its own order
    assert torch.equal(a.to(torch.bfloat16).float(), a)                       # exact in bf16
    assert gm.text_key("language_model.model.norm.weight") == "model.norm.weight"


def test_the_hash_check_fails_on_a_wrong_fixture(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    g = torch.Generator().manual_seed(0)
    w = {"model.layers.2.mlp.gate.weight": torch.randn(8, 16, generator=g).to(torch.bfloat16),
         "model.layers.2.mlp.gate.e_score_correction_bias": torch.zeros(8, dtype=torch.bfloat16),
         "model.norm.weight": torch.ones(16, dtype=torch.bfloat16)}
    for name, prefix in (("plain", ""), ("wrapper", "language_model.")):
        (tmp_path / name).mkdir()
        safetensors.save_file({prefix + k: v for k, v in w.items()} |
                              ({"vision_tower.x.weight": torch.ones(2)} if prefix else {}),
                              str(tmp_path / name / "model.safetensors"))
    ok = gm.shared_tensors_check(tmp_path / "plain", tmp_path / "wrapper")
    assert ok["ok"] and ok["tensors"] == ok["equal"] == 3 and ok["router_tensors"] == 2
    gm.make_routing_unambiguous(tmp_path / "plain")           # the routing made unambiguous in one only
    bad = gm.shared_tensors_check(tmp_path / "plain", tmp_path / "wrapper")
    assert not bad["ok"] and bad["differ"] == ["model.layers.2.mlp.gate.e_score_correction_bias",
                                               "model.layers.2.mlp.gate.weight"]
    gm.make_routing_unambiguous(tmp_path / "wrapper")
    assert gm.shared_tensors_check(tmp_path / "plain", tmp_path / "wrapper")["ok"]


def test_the_kimi_server_runs_with_trust_remote_code_through_the_shipped_playbook(tmp_path):
    """The harness's inventory (no GPU needed to write it): every server-flow host uses the shipped playbook,
    and the server command the real extract spec fills has --trust-remote-code for Kimi only (the var)."""
    import argparse

    from remote_ops.connect.inventory import Host
    from remote_ops.extract.extract_spec import server_command
    from remote_ops.playbook import loader as pb_mod
    args = argparse.Namespace(work=str(tmp_path), out=str(tmp_path / "out.json"), code_rev=None, budget=60,
                              base_python=None, gpu_memory_utilization=0.3, probes=True, server_connector="vllm")
    h = fc.FlowsCheck(args)
    h.root.mkdir(parents=True)
    h.rows, h.dataset, h.resume_rows, h.resume_dataset = [[1, 2]], tmp_path / "d.jsonl", [[1]], tmp_path / "r.jsonl"
    h.inventory()
    inv = json.loads(h.inv.read_text())["hosts"]
    srv = {k: v for k, v in inv.items() if k.startswith("srv-")}
    assert sorted(srv) == ["srv-deepseek_v3", "srv-kimi_k25", "srv-kimi_shipped", "srv-probe"]
    pb = pb_mod.load(str(fc.PB090))
    for name, host in srv.items():
        assert host["playbook"] == str(fc.PB090)
        cmd = server_command(pb, Host(name=name, hostname="localhost", python=host["python"], vars=host["vars"]))
        assert ("--trust-remote-code" in cmd) == (name == "srv-kimi_k25"), (name, cmd)
    assert h.run.doc["steps"]["inventory"]["server_trust_remote_code"] == ["srv-kimi_k25"]


def test_server_connector_async_gives_every_server_host_the_copy(tmp_path):
    """--server-connector async: each server-flow host's playbook is the shipped one with the async connector
    (loaded from benchmarks/gpu/lib through the server's own interpreter); the 0.3.0 hosts are untouched."""
    import argparse

    from remote_ops.connect.inventory import Host
    from remote_ops.extract.extract_spec import server_command
    from remote_ops.playbook import loader as pb_mod
    args = argparse.Namespace(work=str(tmp_path), out=str(tmp_path / "out.json"), code_rev=None, budget=60,
                              base_python=None, gpu_memory_utilization=0.3, probes=False, server_connector="async",
                              models="deepseek_v3", server_vars='{"max_num_batched_tokens": 1024}')
    h = fc.FlowsCheck(args)
    h.root.mkdir(parents=True)
    (tmp_path / "bin" / "server").mkdir(parents=True)
    (tmp_path / "bin" / "server" / "python").write_text("#!/bin/sh\nPYTHONPATH=/x/site exec python3 \"$@\"\n")
    h.rows, h.dataset, h.resume_rows, h.resume_dataset = [[1, 2]], tmp_path / "d.jsonl", [[1]], tmp_path / "r.jsonl"
    h.inventory()
    inv = json.loads(h.inv.read_text())["hosts"]
    srv = {k: v for k, v in inv.items() if k.startswith("srv-")}
    assert sorted(srv) == ["srv-deepseek_v3", "srv-kimi_k25"]
    for name, host in srv.items():
        assert host["playbook"] != str(fc.PB090)
        cmd = server_command(pb_mod.load(host["playbook"]), Host(name=name, hostname="localhost",
                                                                   python=host["python"], vars=host["vars"]))
        kv = json.loads(cmd[cmd.index("--kv_transfer_config") + 1])
        assert kv["kv_connector"] == "AsyncHiddenStatesConnector" and cmd[0] == host["vars"]["server_python"]
        assert "benchmarks/gpu/lib:/x/site exec" in Path(host["vars"]["server_python"]).read_text()
        assert host["vars"]["max_num_batched_tokens"] == 1024    # --server-vars reach every server host
    assert all(v["playbook"] == str(fc.PB030) for k, v in inv.items() if k.startswith("030-"))
    assert h.run.doc["steps"]["inventory"]["server_connector"] == "async"
    assert h.models == ["deepseek_v3"] and h.run.doc["steps"]["inventory"]["models"] == ["deepseek_v3"]
    args.models = "llama"
    with pytest.raises(SystemExit, match="--models 'llama'"):
        fc.FlowsCheck(args)


def flows_doc(ok=True):
    out = {"n_total": 100, "n_within_0_999": 100 if ok else 97, "n_below_0_999": 0 if ok else 3,
           "min_cosine": 0.99993 if ok else 0.97, "mean_cosine": 0.99999, "ok": ok, "layout": "pt",
           "layer_ids": [1, 3, 5, 6], "samples": 24, "expected_samples": 24}
    return {"code_rev": "abc1234", "gpus": ["NVIDIA H200"], "elapsed_s": 500,
            "steps": {"build": {"ok": True, "shared_tensors": {"ok": True, "tensors": 255, "equal": 255,
                                                               "router_tensors": 12},
                                "routing": [{"gate_scale": 0.01, "bias_spacing": 0.25, "gate_weights_scaled": 6}]},
                      "extract_030-deepseek_v3": {"ok": True, "flow": "0.3.0", "rc": 0, "files": 24, "expected": 24,
                                                  "seconds": 80.1, "verify": {"rc": 0}},
                      "compare": {"ok": ok, "result": {
                          "ok": ok, "seconds": 30.0, "outputs": {"030-deepseek_v3": out},
                          "pairs": {"030-kimi_k25 vs 030-deepseek_v3": {"n_total": 100, "n_within_0_999": 100,
                                                                       "n_within_0_9999": 100, "n_bitwise_equal": 87,
                                                                       "min_cosine": 0.99995, "ok": True}},
                          "negative_control": {"what": "rows rolled", "n_total": 100, "n_below_0_999": 100,
                                               "min_cosine": -0.1, "fails": True}}}}}


def test_flows_section_names_the_server_playbook_it_ran(tmp_path):
    d = flows_doc()
    f = tmp_path / "gpu_flows_tp1.json"
    f.write_text(json.dumps(d))
    assert "server-flow playbook" not in "\n".join(gpu_results.render_flows([f]))   # a record from before
    d["steps"]["inventory"] = {"ok": True, "server_connector": "async", "models": ["deepseek_v3"],
                               "server_vars": {"max_num_batched_tokens": 1024}}
    f.write_text(json.dumps(d))
    assert ("- server-flow playbook: `--server-connector async` (benchmarks/gpu/lib/connector.py); server vars "
            '{"max_num_batched_tokens": 1024}; models deepseek_v3') in "\n".join(gpu_results.render_flows([f]))


def test_flows_section_reads_its_figures_from_the_file(tmp_path):
    f = tmp_path / "gpu_flows_tp1.json"
    f.write_text(json.dumps(flows_doc()))
    md = "\n".join(gpu_results.render_flows([f]))
    assert "commit abc1234" in md and "`benchmarks/gpu_flows_check.py`" in md     # a result from before written_by
    assert "255/255 equal (12 router tensors), ok" in md
    assert "| 030-deepseek_v3 | pt | [1, 3, 5, 6] | 24/24 | 100 | 100 | 0.999930 |" in md
    assert "| 030-kimi_k25 vs 030-deepseek_v3 | 100 | 100 | 100 | 87 | 0.999950 | yes |" in md
    assert "fails, as it must" in md and "Verdict of the comparison: all ok" in md
    f.write_text(json.dumps(flows_doc(ok=False)))
    md = "\n".join(gpu_results.render_flows([f]))
    assert "| 100 | 97 | 0.970000 |" in md and "NOT ok" in md


def test_throughput_section_names_the_faster_flow():
    d = {"code_rev": "abc", "a_after": {"tokens_per_s": 80000.0, "wall_s": 70}, "a_server": {
        "tokens_per_s": 120000.0, "wall_s": 200, "files": 300, "tokens": 458061, "seconds": 3.8,
        "from_first_file": {"tokens_per_s": 130000.0}, "layer_ids": [2, 11, 19, 22], "server_ready_after_s": 120},
        "ratios": {"a_server/c": 0.5, "a_server/a_after": 1.5}}
    md = "\n".join(gpu_results.throughput_section("x.json", d))
    assert "Faster once the engine is up: the server flow (120.0k against 80.0k tokens/s for the 0.3.0 flow)" in md
    assert "server flow (a)/(c) 0.5, server flow / 0.3.0 flow 1.5" in md and "130.0k" in md
    d["a_server"]["tokens_per_s"] = 40000.0
    assert "the 0.3.0 flow (80.0k against 40.0k" in "\n".join(gpu_results.throughput_section("x.json", d))


def test_rate_from_the_first_file_leaves_out_what_came_before_it(tmp_path):
    import os
    from benchmarks.gpu import throughput as gt
    lengths = [100, 200, 300, 400]
    files = []
    for i, t in enumerate((1000.0, 1000.0, 1002.0, 1004.0)):    # two files of the first instant
        f = tmp_path / f"hs_{i}.safetensors"
        f.write_bytes(b"x")
        os.utime(f, (t, t))
        files.append(f)
    r = gt.from_first_file(files, lengths, lambda f: int(f.name[3:].split(".")[0]))
    assert r == {"seconds": 4.0, "tokens": 700, "tokens_per_s": 175.0}
    assert gt.from_first_file(files[:1], lengths, lambda f: 0)["tokens_per_s"] is None


def test_a_record_taken_before_the_check_ended_says_what_it_lacks(tmp_path):
    """A flows record collected while the check still ran (no all_ok) names the runs and the compare it
    lacks, and that no vector was compared; a finished record says nothing of the kind."""
    run = {"ok": True, "flow": "0.3.0", "rc": 0, "files": 24, "expected": 24, "seconds": 90.0, "verify": {"rc": 0}}
    partial = {"check": "gpu_flows_check", "code_rev": "abc1234", "verdict": {},
               "steps": {"build": {"ok": True}, "extract_030-deepseek_v3": run, "extract_030-kimi_k25": run}}
    f = tmp_path / "gpu_flows_x.json"
    f.write_text(json.dumps(partial))
    text = "\n".join(gpu_results.render_flows([f]))
    assert ("**Incomplete record**: taken before the check ended; not in it: extract_srv-deepseek_v3, "
            "extract_srv-kimi_k25, compare. No token vector was compared in this record") in text
    f.write_text(json.dumps({**partial, "all_ok": True}))
    assert "Incomplete record" not in "\n".join(gpu_results.render_flows([f]))


def test_one_flow_can_be_run_alone_and_its_record_says_so(tmp_path):
    """--flows 030: the flows and compare steps run the 0.3.0 flow only; a record of one flow names it,
    and an incomplete one lacks only that flow's runs; a flow that does not exist is refused."""
    import argparse
    args = argparse.Namespace(work=str(tmp_path), out=str(tmp_path / "out.json"), code_rev=None, budget=60,
                              base_python=None, gpu_memory_utilization=0.3, probes=False, flows="030")
    assert fc.FlowsCheck(args).flow_names == ["030"]
    assert fc.FlowsCheck(argparse.Namespace(**{**vars(args), "flows": "srv,030"})).flow_names == ["030", "srv"]
    with pytest.raises(SystemExit):
        fc.FlowsCheck(argparse.Namespace(**{**vars(args), "flows": "030,server"}))
    run = {"ok": True, "flow": "0.3.0", "rc": 0, "files": 24, "expected": 24, "seconds": 90.0, "verify": {"rc": 0}}
    partial = {"check": "gpu_flows_check", "code_rev": "abc1234", "verdict": {}, "flows": ["030"],
               "steps": {"build": {"ok": True}, "extract_030-deepseek_v3": run}}
    f = tmp_path / "gpu_flows_x.json"
    f.write_text(json.dumps(partial))
    text = "\n".join(gpu_results.render_flows([f]))
    assert "- flows run: the 0.3.0 flow only (`--flows 030`)" in text
    assert "not in it: extract_030-kimi_k25, compare." in text
