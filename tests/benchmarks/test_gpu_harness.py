"""benchmarks/gpu/lib/harness.py's pieces shared by the GPU harnesses (benchmarks/gpu/extract_check.py, benchmarks/gpu/server_check.py),
run here without a GPU: the step loop and its verdict, and the evidence lines GPU_RESULTS.md shows."""

from __future__ import annotations

import json

from benchmarks.gpu.lib import harness

NAMES = {"c": "c_extract", "d": "d_verify", "e": "e_compare"}


def test_steps_run_in_order_a_crash_is_recorded_and_the_others_still_run(tmp_path, capsys):
    run = harness.Run(tmp_path / "r.json", 1, "abc", False, check="t")
    ran = []

    def ok(name):
        return lambda: (ran.append(name), run.step(NAMES[name], ok=True))

    def crash():
        ran.append("d")
        raise RuntimeError("no GPU")
    rc = harness.run_steps(run, ["c", "d", "e"], {"c": ok("c"), "d": crash, "e": ok("e")}, NAMES)
    assert rc == 1 and ran == ["c", "d", "e"]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["steps"]["d_crashed"] == {"ok": False, "error": "RuntimeError: no GPU"}
    assert doc["verdict"] == {"c": True, "d": False, "e": True} and doc["all_ok"] is False
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["verdict"] == doc["verdict"]


def test_a_step_past_the_budget_is_skipped_and_not_ok(tmp_path):
    run = harness.Run(tmp_path / "r.json", 1, None, False)
    rc = harness.run_steps(run, ["c", "e"], {"c": lambda: run.step("c_extract", ok=True), "e": None}, NAMES,
                              budget=-1)
    assert rc == 1
    assert set(run.doc["steps"]) == {"c_skipped", "e_skipped"} and run.doc["verdict"] == {"c": False, "e": False}


def test_appended_steps_keep_the_earlier_verdict(tmp_path):
    first = harness.Run(tmp_path / "r.json", 1, None, False)
    assert harness.run_steps(first, ["c"], {"c": lambda: first.step("c_extract", ok=True)}, NAMES) == 0
    again = harness.Run(tmp_path / "r.json", 1, None, True)
    assert harness.run_steps(again, ["d"], {"d": lambda: again.step("d_verify", ok=True)}, NAMES) == 0
    assert again.doc["verdict"] == {"c": True, "d": True} and again.doc["all_ok"] is True


def test_evidence_lines_of_verify_and_compare():
    verify = {"rc": 0, "result": {"files": 60, "checked": 60, "layers_hidden": [[4, 256]], "dtypes": ["BF16"],
                                  "non_finite_count": 0, "gap_count": 0, "unloadable_count": 0}}
    assert harness.verify_detail(verify) == ("exit 0: 60 files, 60 loaded, [layers, hidden] [[4, 256]], dtypes "
                                                "['BF16'], non-finite 0, gaps 0, unloadable 0")
    del verify["result"]["dtypes"]           # the offline flow's data_<N>.pt: no dtype list recorded
    assert "dtypes" not in harness.verify_detail(verify)
    compare = {"result": {"samples": 2, "layer_ids": [2, 4], "tokens_compared": 10, "min_cosine": 0.9991,
                          "mean_cosine": 0.9998, "shape_mismatches_count": 0, "below_0_999_count": 0}}
    assert harness.compare_detail(compare) == ("2 samples x 2 layers (ids [2, 4]), 10 token vectors: min cosine "
                                                  "0.9991, mean 0.9998, shape mismatches 0, below 0.999: 0")


def test_the_model_builders_carry_the_one_tokenizer():
    from benchmarks.gpu import extract_check, throughput
    for builder in (extract_check.MODEL_BUILDER, throughput.MODEL_BUILDER):
        assert builder.startswith(harness.WORD_TOKENIZER) and "save_word_tokenizer(out, " in builder
        compile(builder, "<builder>", "exec")


def test_run_finish_judges_the_steps_it_is_given_and_returns_the_exit_status(tmp_path, capsys):
    from benchmarks.gpu.lib.harness import Run
    run = Run(tmp_path / "r.json", 1, "abc", False)
    run.step("extract_a", ok=True)
    run.step("compare", ok=False)
    run.step("probe_x", ok=False)                 # not among the prefixes: not judged
    assert run.finish(("extract_",)) == 0
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == {"extract_a": True}
    assert run.finish(("extract_", "compare")) == 1
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["verdict"] == {"extract_a": True, "compare": False} and doc["all_ok"] is False
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["all_ok"] is False
    assert Run(tmp_path / "e.json", 1, None, False).finish(("extract_",)) == 1     # nothing judged: not ok
