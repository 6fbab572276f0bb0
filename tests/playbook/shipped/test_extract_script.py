"""remote_ops/playbook/shipped/scripts/extract_hidden_states.py on the CPU (torch 2.13.0): dataset, batching, truncation,
resume, atomic writing and the output layout, with a TEST FAKE generator injected in place of
speculators' VllmHiddenStatesGenerator (the real generator runs on a GPU host only; the lead's GPU
check drives it). The layout and the generator's interface are compared with the REAL speculators
0.3.0 sources from PyPI."""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from remote_ops import pkgsource
from tests.conftest import EXTRACT_SCRIPT, SPECULATORS, load_extract_script

SCRIPT = EXTRACT_SCRIPT


def load_script():
    return load_extract_script("extract_hidden_states_under_test")


ehs = load_script()


class FakeGenerator:
    """TEST FAKE, not speculators: the constructor and generate() of VllmHiddenStatesGenerator, with
    hidden states computed from the token ids (row t of layer l = ids[t] * 10 + l, exact in bfloat16), so a test
    can tell which sample and layer every row came from."""

    made = []

    def __init__(self, model_path, layer_ids, max_model_len, gpu_memory_utilization, tensor_parallel_size,
                 hidden=8, corrupt=None):
        self.model_path, self.max_model_len = model_path, max_model_len
        self.layer_ids = layer_ids if layer_ids is not None else [2, 4, 5, 7]
        self.tensor_parallel_size = tensor_parallel_size
        self.hidden, self.corrupt = hidden, corrupt
        self.calls = []
        FakeGenerator.made.append(self)

    def generate(self, token_ids):
        self.calls.append([list(t) for t in token_ids])
        out = []
        for ids in token_ids:
            ids = list(ids)[: self.max_model_len - 1]
            base = torch.tensor(ids, dtype=torch.float32).unsqueeze(1) * 10
            hs = [(base + l).expand(len(ids), self.hidden).to(torch.bfloat16) for l in self.layer_ids]
            out.append({"input_ids": torch.tensor(ids, dtype=torch.long), "hidden_states": hs, "loss_mask": None})
        if self.corrupt:
            self.corrupt(out)
        return out


def fake_tokenizer(model_path):
    """TEST FAKE tokenizer: one token per word, id = word length."""
    return lambda text: {"input_ids": [len(w) for w in text.split()]}


def loaders(**gen_kw):
    FakeGenerator.made = []
    return {"make_generator": lambda *a: FakeGenerator(*a, **gen_kw), "load_tokenizer": fake_tokenizer,
            "hidden_size_of": lambda path: gen_kw.get("hidden", 8)}


def write_jsonl(path: Path, rows):
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return path


# one engine step per generate() call, samples in order: the loop most tests below look at call by call
# (the defaults, several steps a call and steps filled out of order, have their own tests)
ONE_STEP = ("--batch-steps", "1", "--pack-window", "0")


def run(tmp_path, rows, *extra, **gen_kw):
    ds = write_jsonl(tmp_path / "ds.jsonl", rows)
    extra = extra if "--batch-steps" in extra else (*ONE_STEP, *extra)
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out"), *extra]
    return ehs.main(argv, None, lambda args: loaders(**gen_kw))


def earlier_run(tmp_path, rows, *extra):
    """The run.json a first run of ``run(tmp_path, rows, *extra)`` records, without its samples: files
    a test then plants count as that run's (a directory with samples and no run.json is refused)."""
    import io
    ds = write_jsonl(tmp_path / "ds.jsonl", rows)
    args = ehs.parse_args(["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out"),
                           *extra])
    (tmp_path / "out").mkdir(exist_ok=True)
    ehs.record_run_identity(*ehs.check_run_identity(args, io.StringIO()))


def errors(capsys):
    """stderr without the progress bar's lines."""
    return [l for l in capsys.readouterr().err.replace("\r", "\n").splitlines()
            if l.strip() and not l.startswith("Generating hidden states")]


def load(tmp_path, i):
    return torch.load(tmp_path / "out" / f"data_{i}.pt", weights_only=True)


def test_layout_ids_text_loss_mask_and_batches(tmp_path):
    rows = [{"input_ids": [5, 6, 7]}, {"text": "ab cde f", "loss_mask": [0, 1, 1]}, "",
            {"input_ids": [9] * 4, "loss_mask": [1, 0, 1, 0], "id": "extra keys are ignored"},
            {"input_ids": [1, 2]}, {"input_ids": [3]}]
    assert run(tmp_path, rows, "--batch-size", "2", "--layer-ids", "1,3") == 0
    (gen,) = FakeGenerator.made
    assert gen.layer_ids == [1, 3]
    assert gen.calls == [[[5, 6, 7], [2, 3, 1]], [[9, 9, 9, 9], [1, 2]], [[3]]]   # blank line skipped
    s0, s1, s2 = load(tmp_path, 0), load(tmp_path, 1), load(tmp_path, 2)
    assert set(s0) == {"input_ids", "hidden_states", "loss_mask"}
    assert s0["input_ids"].dtype == torch.long and s0["input_ids"].tolist() == [5, 6, 7]
    assert s0["loss_mask"].dtype == torch.long and s0["loss_mask"].tolist() == [1, 1, 1]   # absent: all ones
    assert s1["input_ids"].tolist() == [2, 3, 1] and s1["loss_mask"].tolist() == [0, 1, 1]
    assert s2["loss_mask"].tolist() == [1, 0, 1, 0]
    assert len(s0["hidden_states"]) == 2
    for layer, h in zip([1, 3], s0["hidden_states"]):
        assert h.dtype == torch.bfloat16 and h.is_contiguous() and tuple(h.shape) == (3, 8)
        assert h[:, 0].float().tolist() == [50 + layer, 60 + layer, 70 + layer]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == \
        ["data_0.pt", "data_1.pt", "data_2.pt", "data_3.pt", "data_4.pt", "data_config.json", "run.json"]


def test_truncation_is_the_same_in_every_field(tmp_path):
    rows = [{"input_ids": list(range(1, 21)), "loss_mask": [0] * 10 + [1] * 10}, {"input_ids": [4, 5]}]
    assert run(tmp_path, rows, "--max-model-len", "8") == 0
    s = load(tmp_path, 0)
    assert s["input_ids"].tolist() == list(range(1, 8))
    assert s["loss_mask"].tolist() == [0] * 7
    assert all(h.shape[0] == 7 for h in s["hidden_states"])
    assert FakeGenerator.made[0].calls[0][0] == list(range(1, 8))    # cut before generate()
    assert load(tmp_path, 1)["input_ids"].tolist() == [4, 5]


def test_max_samples_takes_the_first_lines(tmp_path, capsys):
    rows = [{"input_ids": [i + 1]} for i in range(5)]
    assert run(tmp_path, rows, "--max-samples", "3") == 0
    assert sorted(p.name for p in (tmp_path / "out").glob("data_*.pt")) == ["data_0.pt", "data_1.pt", "data_2.pt"]
    assert run(tmp_path / "x" if (tmp_path / "x").mkdir() is None else None, rows, "--max-samples", "9") == 0
    assert "has 5 samples, fewer than --max-samples 9" in capsys.readouterr().out


def test_resume_skips_finished_files_and_drops_stale_temporaries(tmp_path, capsys):
    rows = [{"input_ids": [i + 1, i + 2]} for i in range(6)]
    out = tmp_path / "out"
    earlier_run(tmp_path, rows)
    torch.save({"keep": "me"}, out / "data_1.pt")
    torch.save({"keep": "me"}, out / "data_4.pt")
    (out / ".data_2.pt.12345.tmp").write_bytes(b"half a file")
    before = (out / "data_1.pt").stat().st_mtime_ns
    assert run(tmp_path, rows, "--batch-size", "2") == 0
    gen = FakeGenerator.made[0]
    assert gen.calls == [[[1, 2], [3, 4]], [[4, 5], [6, 7]]]          # samples 0, 2, 3, 5
    assert (out / "data_1.pt").stat().st_mtime_ns == before
    assert torch.load(out / "data_4.pt", weights_only=True) == {"keep": "me"}
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    text = capsys.readouterr().out
    assert "resuming: 2 of 6 samples already written, 4 to go" in text
    assert "removed 1 unfinished temporary file(s)" in text
    # everything there: the engine is not even started
    assert run(tmp_path, rows) == 0
    assert FakeGenerator.made == []
    assert "all 6 samples are already in" in capsys.readouterr().out


def test_a_failed_write_leaves_no_file_and_no_temporary(tmp_path, monkeypatch):
    rows = [{"input_ids": [1, 2]}, {"input_ids": [3, 4]}]
    real_save = torch.save
    calls = []

    def save(obj, f, *a, **kw):
        calls.append(1)
        if len(calls) == 2:
            Path(f).write_bytes(b"partial")      # save_atomic hands torch.save the temporary's name
            raise OSError(5, "Input/output error")   # ENOSPC: the full-disk tests below
        return real_save(obj, f, *a, **kw)
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(OSError):
        run(tmp_path, rows)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["data_0.pt", "data_config.json", "run.json"]
    monkeypatch.setattr(torch, "save", real_save)
    assert run(tmp_path, rows) == 0 and load(tmp_path, 1)["input_ids"].tolist() == [3, 4]


def test_a_result_that_is_another_samples_is_refused(tmp_path, capsys):
    rows = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5, 6, 7]}]

    def shift_rows(out):     # the chunked-prefill symptom: a sample gets other rows
        out[1]["hidden_states"] = [h[:3] for h in out[1]["hidden_states"]]
    assert run(tmp_path, rows, corrupt=shift_rows) == 1
    err = errors(capsys)
    assert len(err) == 1 and "data_1.pt" in err[0] and "ds.jsonl:2" in err[0]
    assert "hidden_states[0] has 3 rows for 4 tokens" in err[0]
    assert not (tmp_path / "out" / "data_1.pt").exists() and not (tmp_path / "out" / "data_0.pt").exists()

    def swap(out):
        out.reverse()
    assert run(tmp_path, rows, corrupt=swap) == 1
    assert "other input_ids than this sample's" in capsys.readouterr().err

    def drop_layer(out):
        out[0]["hidden_states"] = out[0]["hidden_states"][:-1]
    assert run(tmp_path, rows, corrupt=drop_layer) == 1
    assert "expected hidden states of 4 layers, got 3" in capsys.readouterr().err


class FakeExecutor:
    """TEST FAKE of the generator's vLLM executor: records shutdown()."""

    def __init__(self):
        self.shutdowns = 0

    def shutdown(self):
        self.shutdowns += 1


def test_the_engine_is_shut_down_after_success_and_after_a_failure(tmp_path):
    rows = [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5, 6, 7]}]
    ex = FakeExecutor()
    FakeGenerator.executor = ex
    try:
        assert run(tmp_path, rows) == 0 and ex.shutdowns == 1

        def boom(out):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        with pytest.raises(RuntimeError, match="illegal memory access"):
            run(tmp_path / "x" if (tmp_path / "x").mkdir() is None else None, rows, corrupt=boom)
        assert ex.shutdowns == 2
    finally:
        del FakeGenerator.executor


def test_a_model_without_hidden_size_fails_before_the_engine_starts(tmp_path, capsys):
    def no_hidden(path):
        raise ehs.InputError("cannot find hidden_size in the config of %s" % path)
    ds = write_jsonl(tmp_path / "ds.jsonl", [{"input_ids": [1]}])
    FakeGenerator.made = []
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out")]
    assert ehs.main(argv, None, lambda a: {**loaders(), "hidden_size_of": no_hidden}) == 2
    assert FakeGenerator.made == [] and "cannot find hidden_size" in capsys.readouterr().err


@pytest.mark.parametrize("rows, expect", [
    (["{not json"], "ds.jsonl:1: not valid JSON"),
    ([[1, 2]], "ds.jsonl:1: each line must be a JSON object"),
    ([{"input_ids": [1], "text": "x"}], "exactly one of input_ids or text"),
    ([{"input_ids": [1]}, {"input_ids": []}], "ds.jsonl:2: input_ids must be a non-empty list"),
    ([{"input_ids": [1, -2]}], "input_ids[1] is -2"),
    ([{"input_ids": [1, 2.5]}], "input_ids[1] is 2.5"),
    ([{"input_ids": [1, 2], "loss_mask": [1]}], "loss_mask has 1 entries for 2 input_ids"),
    ([{"input_ids": [1, 2], "loss_mask": [1, 2]}], "loss_mask[1] is 2, not 0 or 1"),
    ([{"text": "a b", "loss_mask": [1]}], "loss_mask has 1 entries but the text is 2 tokens"),
    ([], "has no samples"),
])
def test_bad_dataset_is_one_line_and_exit_2(tmp_path, capsys, rows, expect):
    assert run(tmp_path, rows) == 2
    err = errors(capsys)
    assert len(err) == 1 and err[0].startswith("extract_hidden_states: error: ") and expect in err[0], err
    assert FakeGenerator.made == []            # refused before the engine starts
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, expect", [
    (["--layer-ids", "2,x"], "'x' is not a layer index"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--gpu-memory-utilization", "1.5"], "must be in (0, 1]"),
    (["--max-samples", "0"], "--max-samples must be >= 1"),
])
def test_bad_arguments_exit_2(tmp_path, capsys, argv, expect):
    assert run(tmp_path, [{"input_ids": [1]}], *argv) == 2
    assert expect in capsys.readouterr().err


def test_missing_dataset_file(tmp_path, capsys):
    assert ehs.main(["--target-model-path", "m", "--dataset", str(tmp_path / "nope.jsonl"),
                     "--output-dir", str(tmp_path / "o")], None, lambda a: loaders()) == 2
    assert "cannot read dataset" in capsys.readouterr().err


def test_one_bar_over_samples_with_tqdm_mininterval(tmp_path, monkeypatch):
    import tqdm as tqdm_mod
    seen = []
    real = tqdm_mod.tqdm

    class Recording(real):
        def __init__(self, *a, **kw):
            seen.append(kw)
            super().__init__(*a, **kw)
    monkeypatch.setattr(tqdm_mod, "tqdm", Recording)
    monkeypatch.setenv("TQDM_MININTERVAL", "7")
    out = tmp_path / "out"
    earlier_run(tmp_path, [{"input_ids": [i + 1]} for i in range(5)])
    torch.save({}, out / "data_0.pt")
    assert run(tmp_path, [{"input_ids": [i + 1]} for i in range(5)], "--batch-size", "2") == 0
    (kw,) = seen
    assert kw["total"] == 5 and kw["initial"] == 1 and kw["unit"] == "sample" and kw["mininterval"] == 7.0


def _dataclass_fields(tree) -> dict[str, list[str]]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(
                (isinstance(d, ast.Name) and d.id == "dataclass") for d in node.decorator_list):
            out[node.name] = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                              and not (isinstance(s.annotation, ast.Subscript)
                                       and getattr(s.annotation.value, "id", "") == "ClassVar")]
    return out


def test_data_config_has_speculators_030_fields_exactly(tmp_path):
    """data_config.json against the REAL speculators 0.3.0 DataGenerationConfig (its dataclasses,
    read from the PyPI wheel's source): the same keys at every level, the same version and schema."""
    src = pkgsource.unpacked(*SPECULATORS)
    path = next(src.rglob("speculators/data_generation/config_generator.py"))
    text = path.read_text()
    fields = _dataclass_fields(ast.parse(text))
    assert run(tmp_path, [{"input_ids": [1, 2]}]) == 0
    cfg = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert list(cfg) == fields["DataGenerationConfig"]
    assert list(cfg["reproducibility"]) == fields["ReproducibilityInfo"]
    assert list(cfg["reproducibility"]["package_versions"]) == fields["PackageVersions"]
    assert list(cfg["model"]) == fields["ModelConfig"]
    assert list(cfg["data"]) == fields["DataConfig"]
    assert list(cfg["hidden_states"]) == fields["HiddenStatesConfig"]
    assert list(cfg["generation"]) == fields["GenerationConfig"]
    assert list(cfg["format"]) == fields["FormatConfig"]
    assert f'VERSION: ClassVar[str] = "{cfg["version"]}"' in text
    assert cfg["format"]["schema"]["hidden_states"]["num_tensors"] == 4
    assert cfg["format"]["schema"]["hidden_states"]["shape"] == "list of [seq_len, 8]"
    assert cfg["hidden_states"]["layer_ids"] == [2, 4, 5, 7] and cfg["model"]["hidden_size"] == 8
    for key in ("input_ids", "loss_mask"):   # the schema's own words, as speculators writes them
        assert f'"{key}": {{\n                    "dtype": "{cfg["format"]["schema"][key]["dtype"]}"' in text


def test_generator_interface_is_speculators_030s():
    """The script calls VllmHiddenStatesGenerator as the REAL 0.3.0 source defines it."""
    src = pkgsource.unpacked(*SPECULATORS)
    path = next(src.rglob("speculators/data_generation/vllm_hidden_states_generator.py"))
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "VllmHiddenStatesGenerator")
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    params = [a.arg for a in methods["__init__"].args.args[1:]]
    assert params == ["model_path", "layer_ids", "max_model_len", "gpu_memory_utilization", "tensor_parallel_size"]
    assert [a.arg for a in methods["generate"].args.args[1:]] == ["token_ids"]
    assert ehs.GENERATOR_MODULE == "speculators.data_generation.vllm_hidden_states_generator"
    assert os.path.relpath(path, src).replace(os.sep, "/").endswith(
        ehs.GENERATOR_MODULE.replace(".", "/") + ".py")
    # the generator cuts prompts to max_model_len - 1, as the script does before calling it
    assert "max_len = self.vllm_config.model_config.max_model_len - 1" in path.read_text()


# ------------------------------------------------------------------ packing, the writer thread, progress
def progress_lines(text):
    return [json.loads(l[len(ehs.PROGRESS_PREFIX):]) for l in text.splitlines() if l.startswith(ehs.PROGRESS_PREFIX)]


def test_pack_batches_keeps_the_order_and_both_bounds():
    lengths = {0: 5, 1: 5, 2: 3, 3: 9, 4: 12, 5: 1, 6: 1, 7: 1}
    todo = [0, 1, 2, 3, 4, 5, 6, 7]
    assert list(ehs.pack_batches(todo, lengths, 10, 32)) == [[0, 1], [2], [3], [4], [5, 6, 7]]   # 12 > 10 alone
    assert list(ehs.pack_batches(todo, lengths, 10, 2)) == [[0, 1], [2], [3], [4], [5, 6], [7]]
    assert list(ehs.pack_batches(todo, lengths, 0, 3)) == [[0, 1, 2], [3, 4, 5], [6, 7]]        # count only
    assert list(ehs.pack_batches([7, 2, 5], lengths, 4, 32)) == [[7, 2], [5]]
    assert list(ehs.pack_batches([], lengths, 10, 3)) == []


def test_pack_steps_fills_each_step_from_a_window_and_takes_every_sample_once():
    import random
    rng = random.Random(7)
    lengths = [rng.randint(200, 2047) for _ in range(1000)]      # the GPU benchmark's shape, cut to 2047
    todo = list(range(1000))
    in_order = list(ehs.pack_steps(todo, lengths, 8192, 32))
    filled = list(ehs.pack_steps(todo, lengths, 8192, 32, window=16))
    for steps in (in_order, filled):
        assert sorted(i for s in steps for i in s) == todo                       # each sample once
        assert all(sum(lengths[i] for i in s) <= 8192 and len(s) <= 32 for s in steps)
    assert [i for s in in_order for i in s] == todo                              # window 0: in order
    # fuller steps: within 2 % of the fewest possible, and fewer than in order by more than 5 %
    assert len(filled) <= 1.02 * -(-sum(lengths) // 8192) and len(filled) < 0.95 * len(in_order)
    # the oldest pending sample opens every step, so none waits more than `window` steps past its turn
    assert all(filled[k][0] == min(i for s in filled[k:] for i in s) for k in range(len(filled)))
    order = [i for s in filled for i in s]
    assert order != todo and max(abs(pos - i) for pos, i in enumerate(order)) <= 16 * 32
    # the sample cap and an over-long sample (alone) hold with the window too
    assert list(ehs.pack_steps([0, 1, 2, 3], [3, 20, 3, 3], 10, 2, window=4)) == [[0, 2], [1], [3]]
    assert list(ehs.pack_steps([], lengths, 10, 3, window=4)) == []


def test_pack_batches_joins_steps_into_calls_in_step_order():
    lengths = {0: 5, 1: 5, 2: 3, 3: 9, 4: 12, 5: 1, 6: 1, 7: 1}
    todo = list(range(8))
    steps = list(ehs.pack_steps(todo, lengths, 10, 32))
    assert list(ehs.pack_batches(todo, lengths, 10, 32, steps=2)) == [steps[0] + steps[1], steps[2] + steps[3],
                                                                      steps[4]]
    assert list(ehs.pack_batches(todo, lengths, 10, 32, steps=9)) == [todo]
    filled = list(ehs.pack_steps(todo, lengths, 10, 32, window=8))
    assert filled == [[0, 1], [2, 5, 6, 7], [3], [4]]                      # 3 + 1 + 1 + 1 fills the room 9 left
    assert list(ehs.pack_batches(todo, lengths, 10, 32, steps=3, window=8)) == [[0, 1, 2, 5, 6, 7, 3], [4]]


def test_the_defaults_call_generate_with_several_full_steps_and_every_file_holds_its_own_rows(tmp_path, capsys):
    rows = [{"input_ids": [(i % 50) + 1] * n} for i, n in enumerate([4, 4, 4, 9, 2, 2, 2, 2, 12, 7, 3, 1, 6, 5, 8])]
    ds = write_jsonl(tmp_path / "ds.jsonl", rows)
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out")]
    lo = {**loaders(), "make_generator": lambda *a: BudgetGenerator(*a)}     # steps of 10 tokens, 3 samples
    assert ehs.main(argv, None, lambda args: lo) == 0
    out = capsys.readouterr().out
    assert "%d step(s) per generate() call, each of up to 10 tokens and 3 samples, filled from the next %d pending" % (
        ehs.DEFAULT_BATCH_STEPS, ehs.DEFAULT_PACK_WINDOW) in out
    lengths = [len(r["input_ids"]) for r in rows]
    want = list(ehs.pack_batches(list(range(len(rows))), lengths, 10, 3, ehs.DEFAULT_BATCH_STEPS,
                                 ehs.DEFAULT_PACK_WINDOW))
    calls = FakeGenerator.made[-1].calls
    assert [[len(ids) for ids in c] for c in calls] == [[lengths[i] for i in b] for b in want]
    assert len(calls) < len(list(ehs.pack_steps(list(range(len(rows))), lengths, 10, 3)))   # fewer calls than steps
    assert [i for b in want for i in b] != list(range(len(rows)))            # some samples out of order ...
    for i, r in enumerate(rows):                                             # ... yet each file is its own sample
        d = load(tmp_path, i)
        assert d["input_ids"].tolist() == r["input_ids"]
        assert [int(h[0, 0]) for h in d["hidden_states"]] == [r["input_ids"][0] * 10 + l for l in (2, 4, 5, 7)]
    # --batch-tokens 0 is the old loop whatever the defaults: calls of --batch-size samples, in order
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "old"),
            "--batch-tokens", "0", "--batch-size", "4"]
    assert ehs.main(argv, None, lambda args: lo) == 0
    assert [len(c) for c in FakeGenerator.made[-1].calls] == [4, 4, 4, 3]
    assert [c[0][0] for c in FakeGenerator.made[-1].calls] == [1, 5, 9, 13]


def test_batch_steps_and_pack_window_are_checked():
    for flags in (("--batch-steps", "0"), ("--pack-window", "-1")):
        with pytest.raises(ehs.InputError, match=flags[0]):
            ehs.parse_args(["--target-model-path", "m", "--dataset", "d", "--output-dir", "o", *flags])
    args = ehs.parse_args(["--target-model-path", "m", "--dataset", "d", "--output-dir", "o", "--batch-steps", "auto"])
    assert args.batch_steps is None and args.pack_window == ehs.DEFAULT_PACK_WINDOW


def test_auto_batch_steps_keep_a_calls_captured_states_within_the_budget():
    gib = 1 << 30
    assert ehs.auto_batch_steps(8192, 4, 2048) == ehs.DEFAULT_BATCH_STEPS == 4    # 128 MiB a step
    assert ehs.auto_batch_steps(8192, 4, 7168) == 2          # Kimi-K2.5: 448 MiB a step
    assert ehs.auto_batch_steps(8192, 4, 16384) == 1         # 1 GiB a step: one, never none
    assert ehs.auto_batch_steps(65536, 8, 16384) == 1
    assert ehs.auto_batch_steps(8192, 4, 7168, budget=4 * gib) == 4
    assert ehs.auto_batch_steps(0, 4, 7168) == ehs.DEFAULT_BATCH_STEPS


def test_auto_steps_follow_the_capture_budget_and_the_ready_line_says_so(tmp_path, capsys, monkeypatch):
    rows = [{"input_ids": [(i % 50) + 1] * n} for i, n in enumerate([4, 4, 4, 9, 2, 2, 2, 2, 12, 7, 3, 1])]
    ds = write_jsonl(tmp_path / "ds.jsonl", rows)
    lo = {**loaders(), "make_generator": lambda *a: BudgetGenerator(*a)}     # steps of 10 tokens, 3 samples
    # 10 tokens x 4 layers x hidden 8 x 2 bytes = 640 bytes a step: a budget of 1,300 allows 2 steps a call
    monkeypatch.setattr(ehs, "CAPTURE_BUDGET_BYTES", 1300)
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out")]
    assert ehs.main(argv, None, lambda args: lo) == 0
    out = capsys.readouterr().out
    assert "2 step(s) per generate() call" in out and "auto: 2 steps a call keep a call's captured states within 0 MiB" in out
    lengths = [len(r["input_ids"]) for r in rows]
    want = list(ehs.pack_batches(list(range(len(rows))), lengths, 10, 3, 2, ehs.DEFAULT_PACK_WINDOW))
    assert [[len(ids) for ids in c] for c in FakeGenerator.made[-1].calls] == [[lengths[i] for i in b] for b in want]
    # an explicit --batch-steps is taken as given
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out3"), "--batch-steps", "3"]
    assert ehs.main(argv, None, lambda args: lo) == 0
    out = capsys.readouterr().out
    assert "3 step(s) per generate() call" in out and "auto:" not in out


class BudgetGenerator(FakeGenerator):
    """TEST FAKE exposing a scheduler with the attribute names of vLLM 0.20.0's Scheduler."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.scheduler = type("Sched", (), {"max_num_scheduled_tokens": 10, "max_num_running_reqs": 3})()


def test_batches_fill_the_engines_token_budget_and_the_flags_override_it(tmp_path, capsys):
    rows = [{"input_ids": [1] * n} for n in (4, 4, 4, 9, 2, 2, 2, 2, 12)]
    ds = write_jsonl(tmp_path / "ds.jsonl", rows)

    def go(out, *extra):
        argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / out), *extra, *ONE_STEP]
        lo = {**loaders(), "make_generator": lambda *a: BudgetGenerator(*a)}
        assert ehs.main(argv, None, lambda args: lo) == 0
        return [[len(ids) for ids in call] for call in FakeGenerator.made[-1].calls]
    assert go("a") == [[4, 4], [4], [9], [2, 2, 2], [2], [12]]            # 10 tokens, 3 samples per step
    assert ("1 step(s) per generate() call, each of up to 10 tokens and 3 samples (engine step: 10 tokens, 3 samples)"
            in capsys.readouterr().out)
    assert go("b", "--batch-tokens", "20", "--batch-size", "8") == [[4, 4, 4], [9, 2, 2, 2, 2], [12]]
    assert go("c", "--batch-tokens", "0", "--batch-size", "4") == [[4, 4, 4, 9], [2, 2, 2, 2], [12]]
    # a generator without a scheduler: speculators 0.3.0's own budget, max(8192, max_model_len) and 32
    assert run(tmp_path / "d" if (tmp_path / "d").mkdir() is None else None, [{"input_ids": [1] * 300}] * 40,
               "--max-model-len", "4096") == 0
    assert [len(c) for c in FakeGenerator.made[-1].calls] == [27, 13]      # 27 * 300 <= 8192 < 28 * 300
    for i in range(40):
        assert (tmp_path / "d" / "out" / f"data_{i}.pt").exists()


def test_the_budget_names_are_vllm_0200s_and_the_defaults_speculators_030s():
    """engine_budget reads the attributes the REAL vLLM 0.20.0 Scheduler sets, and falls back to the
    REAL speculators 0.3.0 generator's constants."""
    vllm = pkgsource.unpacked("vllm", "0.20.0")
    sched = (vllm / "vllm" / "v1" / "core" / "sched" / "scheduler.py").read_text()
    assert "self.max_num_running_reqs = self.scheduler_config.max_num_seqs" in sched
    assert "self.max_num_scheduled_tokens = (" in sched and "token_budget = self.max_num_scheduled_tokens" in sched
    # chunked prefill off: the scheduler stops at the first waiting prompt that does not fit, so
    # a generate() call's prompts run in order and a batch that fits the budget is one step
    assert "not self.scheduler_config.enable_chunked_prefill\n                        and num_new_tokens > token_budget" in sched
    src = pkgsource.unpacked(*SPECULATORS)
    gen = next(src.rglob("speculators/data_generation/vllm_hidden_states_generator.py")).read_text()
    assert f"MIN_MAX_BATCHED_TOKENS = {ehs.DEFAULT_MIN_BATCH_TOKENS}" in gen
    assert f"MAX_NUM_SEQS = {ehs.DEFAULT_MAX_NUM_SEQS}" in gen
    assert "max_num_batched_tokens = max(\n            MIN_MAX_BATCHED_TOKENS, max_model_len\n        )" in gen
    assert ehs.engine_budget(object(), 2048) == (8192, 32) and ehs.engine_budget(object(), 9000) == (9000, 32)
    cfg = type("C", (), {"scheduler_config": type("S", (), {"max_num_batched_tokens": 4096, "max_num_seqs": 7,
                                                             "max_num_scheduled_tokens": None})()})()
    assert ehs.engine_budget(type("G", (), {"vllm_config": cfg})(), 2048) == (4096, 7)


def test_writes_overlap_the_next_generate(tmp_path, monkeypatch):
    """The first file's write is held until generate() of the SECOND batch has been called: only a
    writer thread lets that happen (with --write-queue-mb 0 the same run would wait forever)."""
    import threading
    second_call = threading.Event()
    real_save = torch.save
    held = []

    def save(obj, f, *a, **kw):
        if not held:
            held.append(1)
            assert second_call.wait(20), "generate() of the next batch never ran while a write was pending"
        return real_save(obj, f, *a, **kw)
    monkeypatch.setattr(torch, "save", save)

    class Watching(FakeGenerator):
        def generate(self, token_ids):
            if self.calls:
                second_call.set()
            return super().generate(token_ids)
    ds = write_jsonl(tmp_path / "ds.jsonl", [{"input_ids": [i + 1]} for i in range(4)])
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out"),
            "--batch-size", "1", *ONE_STEP]
    assert ehs.main(argv, None, lambda a: {**loaders(), "make_generator": lambda *x: Watching(*x)}) == 0
    assert sorted(p.name for p in (tmp_path / "out").glob("data_*.pt")) == [f"data_{i}.pt" for i in range(4)]


def test_writer_threads_write_two_files_at_once_and_the_default_is_eight(tmp_path, monkeypatch, capsys):
    """The first file's save is held until a second save has started: only a second writer thread
    lets that happen (with one, the first would wait for ever). Every file is whole at the end."""
    import threading
    second = threading.Event()
    real_save = torch.save
    calls = []

    def save(obj, f, *a, **kw):
        calls.append(1)
        if len(calls) == 1:
            assert second.wait(20), "no second file was written while the first one was"
        else:
            second.set()
        return real_save(obj, f, *a, **kw)
    monkeypatch.setattr(torch, "save", save)
    rows = [{"input_ids": [i + 1, i + 2]} for i in range(6)]
    assert run(tmp_path, rows, "--batch-size", "2") == 0
    for i in range(6):
        assert load(tmp_path, i)["input_ids"].tolist() == [i + 1, i + 2]
    auto = max(1, min(8, (os.cpu_count() or 2) // 2))
    assert f"; {auto} copy thread(s), 8 writer thread(s)" in capsys.readouterr().out


def test_copy_threads_are_set_after_the_engine_starts(tmp_path, capsys):
    """vLLM's executor sets torch's threads to 1 in the process that starts it; the script sets its own
    count once the generator is up (generate() clones every batch's rows in this process)."""
    before = torch.get_num_threads()
    seen = []

    class OneThreadEngine(FakeGenerator):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            torch.set_num_threads(1)             # what set_multiprocessing_worker_envs does

        def generate(self, token_ids):
            seen.append(torch.get_num_threads())
            return super().generate(token_ids)
    try:
        ds = write_jsonl(tmp_path / "ds.jsonl", [{"input_ids": [1, 2]}])
        argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out"),
                "--copy-threads", "3", "--write-queue-mb", "0", *ONE_STEP]
        assert ehs.main(argv, None, lambda a: {**loaders(), "make_generator": lambda *x: OneThreadEngine(*x)}) == 0
        assert seen == [3] and "; 3 copy thread(s), 0 writer thread(s)" in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)


def test_write_queue_0_writes_each_batch_before_the_next_generate(tmp_path, monkeypatch):
    order = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **kw: (order.append("save"), real_save(obj, f, *a, **kw)))

    class Recording(FakeGenerator):
        def generate(self, token_ids):
            order.append("generate")
            return super().generate(token_ids)
    ds = write_jsonl(tmp_path / "ds.jsonl", [{"input_ids": [i + 1]} for i in range(3)])
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out"),
            "--batch-size", "1", "--write-queue-mb", "0", *ONE_STEP]
    assert ehs.main(argv, None, lambda a: {**loaders(), "make_generator": lambda *x: Recording(*x)}) == 0
    assert order == ["generate", "save"] * 3


def test_a_writer_failure_stops_the_run_with_its_error_and_resume_redoes_exactly_the_rest(tmp_path, monkeypatch):
    rows = [{"input_ids": [i + 1, i + 2]} for i in range(8)]
    real_save = torch.save
    saves = []

    def save(obj, f, *a, **kw):
        saves.append(1)
        if len(saves) == 3:
            Path(f).write_bytes(b"partial")      # save_atomic hands torch.save the temporary's name
            raise OSError(5, "Input/output error")   # ENOSPC: the full-disk tests below
        return real_save(obj, f, *a, **kw)
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(OSError, match="Input/output error"):   # a queue of one sample at a time
        run(tmp_path, rows, "--batch-size", "2", "--write-queue-mb", "0.0001")
    assert len(FakeGenerator.made[0].calls) == 2     # stopped at the next put, not after generating everything
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["data_0.pt", "data_1.pt", "data_config.json", "run.json"]
    monkeypatch.setattr(torch, "save", real_save)
    assert run(tmp_path, rows, "--batch-size", "2") == 0
    assert FakeGenerator.made[0].calls == [[[3, 4], [4, 5]], [[5, 6], [6, 7]], [[7, 8], [8, 9]]]
    for i in range(8):
        assert load(tmp_path, i)["input_ids"].tolist() == [i + 1, i + 2]


def test_on_a_generator_error_the_checked_samples_already_queued_are_written(tmp_path, monkeypatch):
    """Batches 0 and 1 are queued behind a slow writer when batch 2 fails: their files are written
    before the error leaves; the rerun generates exactly samples 4 and 5."""
    import time as _time
    real_save = torch.save

    def slow_save(obj, f, *a, **kw):
        _time.sleep(0.2)
        return real_save(obj, f, *a, **kw)
    monkeypatch.setattr(torch, "save", slow_save)
    rows = [{"input_ids": [i + 1]} for i in range(6)]

    def boom_on_third(out):
        if len(FakeGenerator.made[0].calls) == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        run(tmp_path, rows, "--batch-size", "2", corrupt=boom_on_third)
    assert sorted(p.name for p in (tmp_path / "out").glob("data_*.pt")) == [f"data_{i}.pt" for i in range(4)]
    monkeypatch.setattr(torch, "save", real_save)
    assert run(tmp_path, rows, "--batch-size", "2") == 0
    assert FakeGenerator.made[0].calls == [[[5], [6]]]


CRASH_DRIVER = r'''
import importlib.util, os, sys, time, torch
spec = importlib.util.spec_from_file_location("ehs", sys.argv[1]); ehs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ehs)
crash_at = int(sys.argv[2])
real_save = torch.save
def slow_save(obj, f, *a, **kw):      # the disk is slower than the GPU: the queue fills up
    time.sleep(0.05)
    return real_save(obj, f, *a, **kw)
torch.save = slow_save
class Gen:
    def __init__(self, *a):
        self.layer_ids, self.tensor_parallel_size, self.n = [0, 1], 1, 0
    def generate(self, batch):
        self.n += 1
        time.sleep(0.03)             # the GPU step: faster than writing its two samples
        if self.n == crash_at:
            os._exit(137)            # like SIGKILL / OOM: no cleanup, no drain
        return [{"input_ids": torch.tensor(ids), "hidden_states": [torch.full((len(ids), 4), float(ids[0] + l),
                 dtype=torch.bfloat16) for l in (0, 1)], "loss_mask": None} for ids in batch]
sys.exit(ehs.main(sys.argv[3:], None, lambda a: {"make_generator": Gen, "load_tokenizer": None,
                                                  "hidden_size_of": lambda p: 4}))
'''


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_a_hard_crash_mid_queue_loses_only_queued_samples_and_resume_is_exact(tmp_path, threads):
    """The process dies (os._exit, no drain) while samples wait in the queue: every file present is
    whole and right, the lost ones are exactly the absent ones, and the next run writes only those.
    One writer thread completes files in order; N (4 is the default) may leave up to N - 1 gaps,
    which resume fills exactly."""
    import subprocess
    import sys
    driver = tmp_path / "driver.py"
    driver.write_text(CRASH_DRIVER)
    ds = write_jsonl(tmp_path / "ds.jsonl", [{"input_ids": [i + 1] * 3} for i in range(40)])
    out = tmp_path / "out"
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(out), "--batch-size", "2",
            "--writer-threads", str(threads), *ONE_STEP]
    r = subprocess.run([sys.executable, str(driver), str(SCRIPT), "12", *argv], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 137, r.stderr
    present = sorted(int(p.name[5:-3]) for p in out.glob("data_*.pt"))
    assert 0 < len(present) < 22            # 11 batches generated, some of them still queued
    if threads == 1:
        assert present == list(range(len(present)))     # one writer, in order
    assert max(present) - len(present) < threads        # taken in order: at most threads - 1 gaps
    for i in present:
        s = torch.load(out / f"data_{i}.pt", weights_only=True)
        assert s["input_ids"].tolist() == [i + 1] * 3 and s["hidden_states"][1][0, 0].item() == i + 2
    r = subprocess.run([sys.executable, str(driver), str(SCRIPT), "0", *argv], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"resuming: {len(present)} of 40 samples already written, {40 - len(present)} to go" in r.stdout
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    for i in range(40):
        assert torch.load(out / f"data_{i}.pt", weights_only=True)["input_ids"].tolist() == [i + 1] * 3
    lines = progress_lines(r.stdout)
    assert lines[0]["samples_done"] == len(present) and lines[0]["tokens_done"] == 3 * len(present)
    assert lines[-1]["samples_done"] == 40 and lines[-1]["tokens_done"] == lines[-1]["tokens_total"] == 120


def test_progress_lines_count_tokens_and_give_rate_and_eta(tmp_path, capsys):
    rows = [{"input_ids": [1] * n} for n in (3, 5, 7, 9)]
    out = tmp_path / "out"
    earlier_run(tmp_path, rows)
    torch.save({}, out / "data_0.pt")                     # an earlier run's file counts as done
    # progress lines are printed by the main thread after each batch (never by the writer thread, whose
    # writes would splice into other lines of the log): with sequential writes, one line per file
    assert run(tmp_path, rows, "--batch-size", "1", "--progress-seconds", "0", "--write-queue-mb", "0") == 0
    lines = progress_lines(capsys.readouterr().out)
    first, last = lines[0], lines[-1]
    assert (first["samples_done"], first["samples_total"], first["tokens_done"], first["tokens_total"]) == (1, 4, 3, 24)
    assert first["tokens_per_s"] is None and first["eta_s"] is None
    assert (last["samples_done"], last["tokens_done"], last["eta_s"]) == (4, 24, 0.0)
    assert last["tokens_per_s"] > 0 and last["t"] >= first["t"]
    assert [l["tokens_done"] for l in lines[1:4]] == [8, 15, 24]         # --progress-seconds 0: every file
    mid = lines[1]
    assert mid["eta_s"] == pytest.approx((24 - 8) / mid["tokens_per_s"], abs=0.06)   # rounded to 0.1 s


@pytest.mark.parametrize("argv, expect", [
    (["--batch-tokens", "-1"], "--batch-tokens must be >= 0"),
    (["--write-queue-mb", "-1"], "--write-queue-mb must be >= 0"),
])
def test_bad_new_arguments_exit_2(tmp_path, capsys, argv, expect):
    assert run(tmp_path, [{"input_ids": [1]}], *argv) == 2
    assert expect in capsys.readouterr().err


def test_batch_tokens_auto_is_the_engines_budget(tmp_path):
    args = ehs.parse_args(["--target-model-path", "m", "--dataset", "d", "--output-dir", "o", "--batch-tokens", "auto"])
    assert args.batch_tokens is None and args.batch_size is None
    assert ehs.parse_args(["--target-model-path", "m", "--dataset", "d", "--output-dir", "o",
                           "--batch-tokens", "0"]).batch_tokens == 0


@pytest.mark.parametrize("writer_first", [True, False])
def test_a_writer_error_is_never_dropped_when_the_generator_fails_too(tmp_path, monkeypatch, capsys, writer_first):
    """Both fail: the generator's error is raised, and the writer's is said on stderr, whether the
    writer failed before the generator did or while the queue was being written."""
    import time as _time
    real_save = torch.save

    saves = []

    def failing_save(obj, f, *a, **kw):
        saves.append(1)
        if writer_first and len(saves) == 1:
            return real_save(obj, f, *a, **kw)     # data_0 is written; data_1 (queued with it) fails
        if not writer_first:
            _time.sleep(0.3)          # still writing when the generator fails
        raise OSError(5, "Input/output error")   # ENOSPC: the full-disk tests below
    monkeypatch.setattr(torch, "save", failing_save)

    def boom_on_second(out):
        if len(FakeGenerator.made[0].calls) == 2:
            if writer_first:
                _time.sleep(0.3)      # the writer has failed by now
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        run(tmp_path, [{"input_ids": [i + 1]} for i in range(4)], "--batch-size", "2", "--writer-threads", "1",
            corrupt=boom_on_second)      # one writer: which save fails is the order of the samples
    err = capsys.readouterr().err
    assert "Input/output error" in err and ("the writer had failed too" if writer_first
                                                  else "writing the queued samples failed too") in err
    assert [p.name for p in (tmp_path / "out").glob("data_*.pt")] == (["data_0.pt"] if writer_first else [])


def test_a_full_disk_is_said_in_one_line_and_resume_writes_the_rest(tmp_path, monkeypatch, capsys):
    """torch.save reports a full disk as a RuntimeError about stream positions; the script reads the
    free space before removing its temporary and stops with one line that names the cause and what to
    do (exit 1), leaving whole files only. An error while room is left stays the error it was."""
    import types
    rows = [{"input_ids": [i + 1] * 50} for i in range(6)]
    real_save, real_statvfs = torch.save, os.statvfs
    state = {"free_blocks": 10**9, "saves": 0}

    def save(obj, f, *a, **kw):
        state["saves"] += 1
        if state["saves"] == 3:
            Path(f).write_bytes(b"part of a file")
            state["free_blocks"] = 0
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        return real_save(obj, f, *a, **kw)

    def statvfs(path):
        st = real_statvfs(path)
        return types.SimpleNamespace(f_bavail=state["free_blocks"], f_bfree=state["free_blocks"], f_frsize=st.f_frsize)
    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(ehs.os, "statvfs", statvfs)
    assert run(tmp_path, rows, "--batch-size", "2", "--write-queue-mb", "0") == 1
    (line,) = [l for l in errors(capsys) if "error" in l]
    assert line == (f"extract_hidden_states: error: no space left on the device of {tmp_path / 'out'}: data_2.pt "
                    f"needs 0.0 MB, 0.0 MB were free when its write failed (free space there and run extract "
                    "again: it resumes with exactly the missing files)"), line
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["data_0.pt", "data_1.pt", "data_config.json", "run.json"]
    state.update(free_blocks=10**9, saves=10)                 # room again: an error there is not "disk full"
    monkeypatch.setattr(torch, "save", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("another fault")))
    with pytest.raises(RuntimeError, match="another fault"):
        run(tmp_path, rows, "--batch-size", "2", "--write-queue-mb", "0")
    monkeypatch.setattr(torch, "save", real_save)
    assert run(tmp_path, rows, "--batch-size", "2") == 0
    assert [load(tmp_path, i)["input_ids"].tolist() for i in range(6)] == [[i + 1] * 50 for i in range(6)]


def test_a_real_full_filesystem_stops_the_job_with_the_cause(tmp_path):
    """On a real 4 MiB tmpfs (root: mount; skipped where mounting is not allowed) eight samples of
    0.6 MB do not fit: the run stops with the one line, every file left is whole, no temporary is left
    (one writer thread, so the files that fit are the first ones)."""
    import subprocess
    import sys
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root and mount rights)")
    try:
        ds = write_jsonl(tmp_path / "ds.jsonl", [{"input_ids": [i + 1] * 300} for i in range(8)])
        driver = tmp_path / "driver.py"
        driver.write_text(
            "import importlib.util, sys, torch\n"
            "spec = importlib.util.spec_from_file_location('ehs', sys.argv[1]); ehs = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(ehs)\n"
            "class Gen:\n"
            "    def __init__(self, *a):\n"
            "        self.layer_ids, self.tensor_parallel_size = [0, 1], 1\n"
            "    def generate(self, batch):\n"
            "        return [{'input_ids': torch.tensor(ids), 'hidden_states': [torch.full((len(ids), 512), float(ids[0] + l),\n"
            "                 dtype=torch.bfloat16) for l in (0, 1)], 'loss_mask': None} for ids in batch]\n"
            "sys.exit(ehs.main(sys.argv[2:], None, lambda a: {'make_generator': Gen, 'load_tokenizer': None,\n"
            "                                                 'hidden_size_of': lambda p: 512}))\n")
        r = subprocess.run([sys.executable, str(driver), str(SCRIPT), "--target-model-path", "m", "--dataset", str(ds),
                            "--output-dir", str(mnt), "--batch-size", "2", "--writer-threads", "1"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stderr
        last = [l for l in r.stderr.splitlines() if l.startswith("extract_hidden_states: error:")]
        assert len(last) == 1 and f"no space left on the device of {mnt}: data_" in last[0] and \
            "needs 0.6 MB" in last[0], r.stderr
        present = sorted(int(p.name[5:-3]) for p in mnt.glob("data_*.pt"))
        assert present == list(range(len(present))) and 0 < len(present) < 8
        assert not [p for p in mnt.iterdir() if p.name.endswith(".tmp")]
        for i in present:
            assert torch.load(mnt / f"data_{i}.pt", weights_only=True)["input_ids"].tolist() == [i + 1] * 300
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


class SlotViewGenerator(FakeGenerator):
    """TEST FAKE of the zero-copy hand-off (0.3.0 playbook edit captured-states-zero-copy-results): each
    batch's rows live in a shared buffer of its own (a slot) and every sample's states are
    torch.frombuffer views of it."""

    def __init__(self, *a, mapped=None, **kw):
        super().__init__(*a, **kw)
        self.slots = []                     # [buffer, refcount with nothing viewing it]
        self._remote_ops_shm_mapped = mapped

    def generate(self, token_ids):
        import mmap
        out, at = super().generate(token_ids), 0
        buffer = mmap.mmap(-1, 1 << 20)
        self.slots.append([buffer, 0])
        del buffer
        self.slots[-1][1] = sys.getrefcount(self.slots[-1][0])
        for r in out:
            views = []
            for h in r["hidden_states"]:
                n = h.numel()
                v = torch.frombuffer(self.slots[-1][0], dtype=torch.bfloat16, count=n, offset=at * 2).view(h.shape)
                v.copy_(h)
                views.append(v)
                at += n
            r["hidden_states"] = views
        return out


@pytest.mark.parametrize("mapped, said", [
    (("/dev/shm/remote-ops-hs-1-x/slot-9-0-1", "zero-copy slots (2), page-locked: yes"),
     "captured states came through shared memory (/dev/shm/remote-ops-hs-1-x/slot-9-0-1, zero-copy slots (2), "
     "page-locked: yes)"),
    (("/dev/shm/remote-ops-hs-1-x/hs-9-1", torch.zeros(4)),      # the one-file way maps a tensor there
     "captured states came through shared memory (/dev/shm/remote-ops-hs-1-x/hs-9-1)")])
def test_views_of_a_hand_off_slot_are_saved_as_their_own_rows_and_let_go(tmp_path, capsys, mapped, said):
    rows = [{"input_ids": [(j % 20) + 1 for j in range(40 + 7 * i)]} for i in range(6)]
    made = []

    def make(*a):
        made.append(SlotViewGenerator(*a, mapped=mapped, hidden=16))
        return made[-1]
    ds = write_jsonl(tmp_path / "ds.jsonl", rows)
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out"),
            "--batch-size", "2", "--batch-tokens", "0"]
    assert ehs.main(argv, None, lambda a: {**loaders(hidden=16), "make_generator": make}) == 0
    assert said in capsys.readouterr().out.splitlines()
    gen = made[0]
    assert len(gen.slots) == 3
    for i, r in enumerate(rows):
        got = load(tmp_path, i)
        ids = torch.tensor(r["input_ids"], dtype=torch.float32)
        for l, h in zip(gen.layer_ids, got["hidden_states"]):
            assert h.shape == (len(ids), 16) and h.untyped_storage().nbytes() == len(ids) * 16 * 2   # its rows only
            assert torch.equal(h[:, 0], (ids * 10 + l).to(torch.bfloat16))
    # once the run is over nothing (batch loop, writer threads) views any slot: each would be free again
    refs = [sys.getrefcount(slot[0]) for slot in gen.slots]
    assert refs == [slot[1] for slot in gen.slots]


def test_the_batch_loop_and_the_writer_let_go_of_a_slots_views_once_written(tmp_path):
    """A hand-off slot is reused only when nothing views it: the batch loop must not keep the last batch
    through the next generate(), nor a writer thread the last sample it wrote while it waits for more."""
    rows = [{"input_ids": [(j % 20) + 1 for j in range(30 + i)]} for i in range(6)]
    made, held = [], []

    class Watching(SlotViewGenerator):
        def generate(self, token_ids):     # with --write-queue-mb 0 the last batch is written by now
            held.append([sys.getrefcount(slot[0]) - slot[1] for slot in self.slots])
            return super().generate(token_ids)

    def make(*a):
        made.append(Watching(*a, hidden=16))
        return made[-1]
    ds = write_jsonl(tmp_path / "ds.jsonl", rows)
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out"),
            "--batch-size", "2", "--batch-tokens", "0", "--write-queue-mb", "0"]
    assert ehs.main(argv, None, lambda a: {**loaders(hidden=16), "make_generator": make}) == 0
    assert held == [[], [0], [0, 0]]

    import mmap
    import threading
    slot = [mmap.mmap(-1, 1 << 16), 0]
    slot[1] = sys.getrefcount(slot[0])
    done = threading.Event()
    writer = ehs.Writer(torch, str(tmp_path / "w"), 1 << 20, lambda i: done.set(), threads=1)
    os.makedirs(tmp_path / "w")
    view = torch.frombuffer(slot[0], dtype=torch.bfloat16, count=64).view(4, 16)
    writer.put(0, {"input_ids": torch.arange(4), "hidden_states": [view], "loss_mask": torch.ones(4)})
    del view
    assert done.wait(30)
    refs = sys.getrefcount(slot[0])                  # (not inside assert: its rewriting holds operands)
    assert refs == slot[1]                           # the thread, now waiting for more, holds nothing
    writer.close()


# ------------------------------------------------------------------ several output directories
def run_dirs(tmp_path, rows, dirs, *extra, **gen_kw):
    ds = write_jsonl(tmp_path / "ds.jsonl", rows)
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", ":".join(str(d) for d in dirs), *extra, *ONE_STEP]
    return ehs.main(argv, None, lambda args: loaders(**gen_kw))


def names(d):
    return sorted((p.name for p in d.iterdir() if p.name.startswith("data_")), key=lambda n: (len(n), n))


def test_two_output_directories_take_the_samples_alternately_and_resume_writes_the_missing_in_place(
        tmp_path, capsys):
    rows = [{"input_ids": [i + 1, i + 2]} for i in range(7)]
    a, b = tmp_path / "nvme0" / "hs", tmp_path / "nvme1" / "hs"
    assert run_dirs(tmp_path, rows, [a, b], "--batch-size", "3") == 0
    assert names(a) == ["data_0.pt", "data_2.pt", "data_4.pt", "data_6.pt", "data_config.json"]
    assert names(b) == ["data_1.pt", "data_3.pt", "data_5.pt", "data_config.json"]
    assert torch.load(b / "data_3.pt", weights_only=True)["input_ids"].tolist() == [4, 5]
    ra, rb = json.loads((a / "run.json").read_text()), json.loads((b / "run.json").read_text())
    assert ra["identity"] == rb["identity"]
    assert ra["identity"]["output_dirs"] == [str(a.resolve()), str(b.resolve())]
    assert json.loads((a / "data_config.json").read_text())["data"]["num_samples"] == 7
    assert "2 output directories: sample N goes to the ((N // 1) % 2)-th of" in capsys.readouterr().out
    # a stop: two files lost, one moved by hand into the other directory
    (a / "data_4.pt").unlink()
    (b / "data_1.pt").unlink()
    (b / "data_5.pt").rename(a / "data_5.pt")
    kept = (a / "data_5.pt").stat().st_mtime_ns
    assert run_dirs(tmp_path, rows, [a, b]) == 0
    assert FakeGenerator.made[0].calls == [[[2, 3], [5, 6]]]      # samples 1 and 4, nothing else
    assert names(a) == ["data_0.pt", "data_2.pt", "data_4.pt", "data_5.pt", "data_6.pt", "data_config.json"]
    assert names(b) == ["data_1.pt", "data_3.pt", "data_config.json"]
    assert (a / "data_5.pt").stat().st_mtime_ns == kept
    text = capsys.readouterr().out
    assert "resuming: 5 of 7 samples already written, 2 to go; 1 of them in another of the output directories" in text
    assert run_dirs(tmp_path, rows, [a, b]) == 0 and FakeGenerator.made == []
    assert "all 7 samples are already in %s, %s: nothing to do" % (a, b) in capsys.readouterr().out


def test_a_changed_directory_list_is_refused_naming_the_difference(tmp_path, capsys):
    rows = [{"input_ids": [i + 1]} for i in range(4)]
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert run_dirs(tmp_path, rows, [a, b]) == 0
    capsys.readouterr()
    for dirs in ([b, a], [a, b, c], [a]):
        assert run_dirs(tmp_path, rows, dirs) == 2
        (line,) = errors(capsys)
        assert "holds 2 sample file(s) of another run: output_dirs " in line, line
        assert "--overwrite" in line
    assert FakeGenerator.made == []
    # --overwrite moves both directories' files aside and starts the new list
    assert run_dirs(tmp_path, rows, [b, a], "--overwrite") == 0
    assert names(b) == ["data_0.pt", "data_2.pt", "data_config.json"]
    assert names(a) == ["data_1.pt", "data_3.pt", "data_config.json"]
    assert len(list(a.glob(".replaced-*/data_*.pt"))) == 2 and len(list(b.glob(".replaced-*/data_*.pt"))) == 2


def test_one_directory_named_twice_is_refused(tmp_path, capsys):
    rows = [{"input_ids": [1]}]
    (tmp_path / "a").mkdir()
    os.symlink(tmp_path / "a", tmp_path / "link")
    for dirs in ([tmp_path / "a", tmp_path / "link"], [tmp_path / "new", str(tmp_path / "new") + "/"]):
        assert run_dirs(tmp_path, rows, dirs) == 2
        (line,) = errors(capsys)
        assert "--output-dir names one directory twice" in line and "are the same directory" in line
    assert FakeGenerator.made == []


def test_a_shard_spreads_its_own_samples_over_every_directory(tmp_path):
    """Shard 0/2 holds the even samples: by the global index alone both would land in the first of two
    directories; the rule alternates the shard's own samples."""
    rows = [{"input_ids": [i + 1]} for i in range(9)]
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_dirs(tmp_path, rows, [a, b], "--shard", "0/2") == 0
    assert names(a) == ["data_0.pt", "data_4.pt", "data_8.pt", "data_config.json"]
    assert names(b) == ["data_2.pt", "data_6.pt", "data_config.json"]
    assert ehs.pending_indexes("%s:%s" % (a, b), 9, (0, 2)) == []
    assert ehs.pending_indexes([b, a], 9, (1, 2)) == [1, 3, 5, 7]


def profile_lines(text):
    return [json.loads(l[len(ehs.PROFILE_PREFIX):]) for l in text.splitlines() if l.startswith(ehs.PROFILE_PREFIX)]


def test_writers_run_under_the_short_switch_interval_and_the_old_one_comes_back(tmp_path, monkeypatch, capsys):
    """While writer threads run, Python's switch interval is --gil-switch-ms (default 0.5 ms): seen from
    inside a save; after the run, the interval before it is back. 0 leaves Python's own."""
    import sys as _sys
    seen = []
    real_save = torch.save

    def save(obj, f, *a, **kw):
        seen.append(_sys.getswitchinterval())
        return real_save(obj, f, *a, **kw)
    monkeypatch.setattr(torch, "save", save)
    before = _sys.getswitchinterval()
    rows = [{"input_ids": [i + 1, i + 2]} for i in range(4)]
    assert run(tmp_path, rows, "--batch-size", "2") == 0
    assert seen and set(seen) == {0.0005} and _sys.getswitchinterval() == before
    assert profile_lines(capsys.readouterr().out)[-1]["gil_switch_ms"] == 0.5
    seen.clear()
    (tmp_path / "b").mkdir()
    assert run(tmp_path / "b", rows, "--gil-switch-ms", "2") == 0
    assert set(seen) == {0.002} and _sys.getswitchinterval() == before
    seen.clear()
    (tmp_path / "c").mkdir()
    assert run(tmp_path / "c", rows, "--gil-switch-ms", "0") == 0
    assert set(seen) == {before}
    assert profile_lines(capsys.readouterr().out)[-1]["gil_switch_ms"] == 0
    seen.clear()
    (tmp_path / "d").mkdir()                   # no writer threads: the interval is never touched
    assert run(tmp_path / "d", rows, "--write-queue-mb", "0") == 0
    assert set(seen) == {before}
    assert profile_lines(capsys.readouterr().out)[-1]["gil_switch_ms"] is None


def test_the_profile_line_accounts_for_the_run(tmp_path, capsys):
    """One extract-profile line at the end: a batch count and generate() calls that match the run, the
    writer's files and bytes exactly, its save times; a generator without hand-off slots says none."""
    rows = [{"input_ids": list(range(1, 2 + i))} for i in range(7)]
    assert run(tmp_path, rows, "--batch-size", "3", "--batch-tokens", "0") == 0
    out = capsys.readouterr().out
    (prof,) = profile_lines(out)
    gen = FakeGenerator.made[-1]
    assert prof["batches"] == len(gen.calls) == 3
    tokens = sum(len(r["input_ids"]) for r in rows)
    assert prof["tokens"] == tokens
    w = prof["writer"]
    assert w["threads"] == 8 and w["files"] == 7
    assert w["bytes"] == sum(ehs.tensor_bytes(load(tmp_path, i)) for i in range(7))
    assert w["save_s"] > 0 and 0 < w["save_ms_median"] <= w["save_ms_p90"]
    assert prof["generate_s"] >= 0 and prof["seconds"] >= prof["generate_s"]
    assert prof["slots"] is None
    assert out.index(ehs.PROFILE_PREFIX) > out.rindex(ehs.PROGRESS_PREFIX)   # after the last progress line


def test_the_profile_says_how_long_the_main_thread_waited_for_the_writers(tmp_path, monkeypatch, capsys):
    """A writer slower than the generator, with a queue of one sample: put() waits, and says so; with a
    queue that holds everything it does not wait."""
    import time as _time
    real_save = torch.save

    def slow(obj, f, *a, **kw):
        _time.sleep(0.05)
        return real_save(obj, f, *a, **kw)
    monkeypatch.setattr(torch, "save", slow)
    rows = [{"input_ids": [i + 1] * 50} for i in range(8)]
    assert run(tmp_path, rows, "--batch-size", "1", "--write-queue-mb", "0.0001", "--writer-threads", "1") == 0
    slow_w = profile_lines(capsys.readouterr().out)[-1]
    assert slow_w["writer"]["put_wait_s"] >= 0.2          # ~7 of the 8 saves waited for
    (tmp_path / "b").mkdir()
    assert run(tmp_path / "b", rows, "--batch-size", "1", "--writer-threads", "1") == 0
    fast = profile_lines(capsys.readouterr().out)[-1]
    assert fast["writer"]["put_wait_s"] == 0
    assert fast["drain_s"] >= 0.2                          # the saves happen after the loop: in the drain


def test_the_profile_counts_the_generators_hand_off_slots(tmp_path, capsys):
    class Slots(FakeGenerator):
        def generate(self, token_ids):
            self._remote_ops_slots = {0: None, 1: None}
            self._remote_ops_slot_files, self._remote_ops_slots_full = 3, 1
            return super().generate(token_ids)
    ds = write_jsonl(tmp_path / "ds.jsonl", [{"input_ids": [1, 2]}])
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out"), *ONE_STEP]
    assert ehs.main(argv, None, lambda a: {**loaders(), "make_generator": lambda *x: Slots(*x)}) == 0
    assert profile_lines(capsys.readouterr().out)[-1]["slots"] == {"slots": 2, "files": 3, "all_held": 1}


def test_save_times_keep_bounded_memory_and_quantiles_within_one_percent():
    import random
    rng = random.Random(7)
    times = [rng.lognormvariate(-3.5, 0.6) for _ in range(20_000)]
    st = ehs.SaveTimes()
    for t in times:
        st.add(t)
    assert st.count == 20_000 and abs(st.total - sum(times)) < 1e-9
    exact = sorted(times)
    for f in (0.0, 0.5, 0.9, 0.99):
        want = exact[min(len(exact) - 1, int(f * len(exact)))]
        assert abs(st.quantile(f) / want - 1) < 0.0101, f
    assert len(st._buckets) < 400                       # not one entry per file
    one = ehs.SaveTimes()
    one.add(0.025)
    assert abs(one.quantile(0.5) / 0.025 - 1) < 0.0101 and one.quantile(0.9) == one.quantile(0.5)
