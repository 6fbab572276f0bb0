"""README's extraction throughput table is what benchmarks/render/throughput_table.py renders from the committed
GPU result JSONs (a hand edit, or a result rerun without re-rendering, fails here); its ratios against the run's
own c_best, a named run's, or one copied with --c-best-from."""

from __future__ import annotations

from benchmarks.render import throughput_table as tt
from tests.conftest import REPO


def test_readme_table_is_the_rendered_results():
    table = tt.readme_table((REPO / "README.md").read_text())
    assert table is not None, "README.md lost the throughput-table markers"
    assert table == tt.render(tt.load())


def test_every_row_names_a_measured_part_of_a_committed_result():
    docs = tt.load()
    for name, path, label, ref in tt.ROWS:
        assert tt.part(docs[name], path).get("tokens_per_s"), (name, path)
        if ref:       # a named c_best: a run of the same model and prompts
            assert docs[ref]["c_best"]["tokens_per_s"] and docs[ref]["dataset"] == docs[name]["dataset"]
            assert docs[ref]["model"]["shape"] == docs[name]["model"]["shape"]
    assert len({(n, p) for n, p, _l, _r in tt.ROWS}) == len(tt.ROWS)


def test_ratios_against_the_runs_own_a_named_or_a_copied_c_best():
    shape = {"layers": 61, "hidden": 7168, "experts": 256, "moe": True}
    docs = {"own.json": {"code_rev": "aaa", "model": {"params": 2.5e9, "shape": shape},
                         "c_best": {"tokens_per_s": 200000.0}, "c_vllm_prefill": {"tokens_per_s": 160000.0},
                         "a_tmpfs": {"tokens_per_s": 150000.0}},
            "srv.json": {"code_rev": "bbb", "model": {"layers": 22, "hidden": 2048},
                         "a_server": {"tokens_per_s": 40000.0, "from_first_file": {"tokens_per_s": 50000.0}}},
            "copied.json": {"code_rev": "ccc", "model": {}, "c_best": {"tokens_per_s": 100000.0},
                            "c_best_from": {"path": "/r/gpu_throughput_h200_cbest.json", "code_rev": "aaa"},
                            "a_server_tmpfs_b64k": {"tokens_per_s": 80000.0}}}
    rows = [("own.json", "a_tmpfs", "own", None), ("srv.json", "a_server.from_first_file", "named", "own.json"),
            ("copied.json", "a_server_tmpfs_b64k", "copied", None), ("srv.json", "a_server", "none", None)]
    lines = tt.render(docs, rows).splitlines()
    assert lines[2] == ("| own | 150.0k | 0.75 | 0.9375 | random Llama 2.5B, 61 layers, hidden 7168, MoE, 256 experts "
                        "| aaa | own.json |")
    assert lines[3] == ("| named | 50.0k | 0.25 (of own.json) | 0.3125 (of own.json) | random Llama 22 layers, hidden "
                        "2048, dense | bbb | srv.json |")
    assert lines[4].startswith("| copied | 80.0k | 0.8 (copied from gpu_throughput_h200_cbest.json) | - |")
    assert lines[5].startswith("| none | 40.0k | - | - |")


def test_write_replaces_only_the_section_between_the_markers(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nprose before\n\n{tt.START}\nold table\n{tt.END}\n\nprose after\n")
    monkeypatch.setattr(tt, "README", readme)
    assert tt.main(["--write"]) == 0
    text = readme.read_text()
    assert text.startswith("# x\n\nprose before\n\n") and text.endswith(f"{tt.END}\n\nprose after\n")
    assert tt.readme_table(text) == tt.render(tt.load()) and "old table" not in text
    readme.write_text("# no markers\n")
    assert tt.main(["--write"]) == 1 and readme.read_text() == "# no markers\n"
