"""playbooks/scripts/extract_hidden_states.py on the CPU (torch 2.13.0): dataset, batching, truncation,
resume, atomic writing and the output layout, with a TEST FAKE generator injected in place of
speculators' VllmHiddenStatesGenerator (the real generator runs on a GPU host only; the lead's GPU
check drives it). The layout and the generator's interface are compared with the REAL speculators
0.3.0 sources from PyPI."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from remote_ops import pkgsource
from tests.conftest import REPO, SPECULATORS

SCRIPT = REPO / "playbooks" / "scripts" / "extract_hidden_states.py"


def load_script():
    spec = importlib.util.spec_from_file_location("extract_hidden_states_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def run(tmp_path, rows, *extra, **gen_kw):
    ds = write_jsonl(tmp_path / "ds.jsonl", rows)
    argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(tmp_path / "out"), *extra]
    return ehs.main(argv, None, lambda args: loaders(**gen_kw))


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
        ["data_0.pt", "data_1.pt", "data_2.pt", "data_3.pt", "data_4.pt", "data_config.json"]


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
    out.mkdir()
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
            f.write(b"partial")
            raise OSError(28, "No space left on device")
        return real_save(obj, f, *a, **kw)
    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(OSError):
        run(tmp_path, rows)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["data_0.pt", "data_config.json"]
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
    out.mkdir()
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
