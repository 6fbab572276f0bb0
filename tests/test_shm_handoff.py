"""The captured states' shared-memory hand-off (playbook edits captured-states-through-shared-memory
and captured-states-from-shared-memory, issue 25), on speculators 0.3.0's real sources patched by
remote-ops' own edit code.

The worker's half runs in a child process (its own address space, as vLLM's worker is) and the
generator's half here; only the worker's reply (a small dict, or the tensors when it falls back)
crosses the pipe, as it crosses vLLM's collective_rpc. vLLM and transformers are replaced by stubs
of the few names the two modules import: what is tested is the edited code, not vLLM.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import shutil
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from remote_ops import pkgsource  # noqa: E402
from remote_ops.playbook import edits as edits_mod  # noqa: E402
from remote_ops.playbook import loader as pb_mod  # noqa: E402
from tests.conftest import load_extract_script  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = pb_mod.load(pb_mod.find("eagle3-speculators-0.3.0"))
DG = "speculators/data_generation/"
ENV = "REMOTE_OPS_HS_SHM_DIR"


def patched_sources(dest: Path) -> Path:
    src = pkgsource.unpacked("speculators", "0.3.0")
    for target in PLAYBOOK.patches:
        rel = target.module.replace(".", "/") + ".py"
        if not rel.startswith(DG):
            continue
        path = dest / Path(rel).name
        path.write_text(edits_mod.apply_edits((src / rel).read_text(), target.edits, rel).new_text)
    shutil.copy(src / DG / "logging_utils.py", dest / "logging_utils.py")
    return dest


def _stub(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


class _Anything:
    def __init__(self, *a, **kw):
        self.__dict__.update(kw)


def load_patched(src_dir: str, module: str):
    """Import the patched ``module`` (custom_worker or vllm_hidden_states_generator) from
    ``src_dir`` as part of a package ``specpkg``, with vLLM/transformers stubbed."""
    for name in ("vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched", "vllm.v1.executor",
                 "vllm.model_executor", "vllm.model_executor.models"):
        _stub(name)
    _stub("vllm.distributed", get_pp_group=None, get_tp_group=None)
    _stub("vllm.model_executor.models.interfaces", supports_eagle3=lambda m: True)
    _stub("vllm.sequence", IntermediateTensors=dict)
    _stub("vllm.config", **{n: _Anything for n in ("CacheConfig", "DeviceConfig", "LoadConfig", "ModelConfig",
                                                   "ParallelConfig", "SchedulerConfig", "VllmConfig")})
    _stub("vllm.sampling_params", SamplingParams=_Anything)
    _stub("vllm.v1.core.kv_cache_utils", _get_kv_cache_groups_uniform_spec=None,
          get_kv_cache_config_from_groups=None, unify_hybrid_kv_cache_specs=None)
    _stub("vllm.v1.core.sched.scheduler", Scheduler=_Anything)
    _stub("vllm.v1.executor.multiproc_executor", MultiprocExecutor=_Anything)
    _stub("vllm.v1.request", Request=_Anything, RequestStatus=types.SimpleNamespace(FINISHED_ABORTED=1))
    _stub("vllm.v1.structured_output", StructuredOutputManager=_Anything)
    _stub("transformers", AutoConfig=None, AutoTokenizer=None)
    pkg = _stub("specpkg")
    pkg.__path__ = [src_dir]
    for name in ("logging_utils", module):
        spec = importlib.util.spec_from_file_location(f"specpkg.{name}", os.path.join(src_dir, name + ".py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return mod


def worker_loop(src_dir, conn):
    """vLLM's rank-0 worker, reduced to the extension: a ("start", dir) message begins a new worker
    life (a fresh extension; $REMOTE_OPS_HS_SHM_DIR set to dir, or unset for None), every other
    message is one batch's captured layers (lists of per-step chunks) and the reply is what
    _get_captured_states returns. One process serves every test (torch imports once)."""
    cw = load_patched(src_dir, "custom_worker")
    ext = None
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if isinstance(msg, tuple) and msg[0] == "start":
            if msg[1] is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = msg[1]
            ext = cw.HiddenStatesWorkerExtension()
            ext._layer_ids = frozenset()
            conn.send(os.getpid())
            continue
        ext._captured_states = msg
        conn.send(ext._get_captured_states())


_WORKER = {}


def _worker(src_dir: Path):
    """The module's one worker process (spawned: its own address space, as vLLM's worker)."""
    if "conn" not in _WORKER:
        ctx = mp.get_context("spawn")
        _WORKER["conn"], child = ctx.Pipe()
        _WORKER["proc"] = ctx.Process(target=worker_loop, args=(str(src_dir), child), daemon=True)
        _WORKER["proc"].start()
    return _WORKER["conn"]


class Side:
    """The generator (no __init__: no engine) over a child-process worker."""

    def __init__(self, src_dir: Path, shm_dir: str | None):
        self.conn = _worker(src_dir)
        self.conn.send(("start", shm_dir))
        assert self.conn.recv() != os.getpid()           # another process
        gen_mod = load_patched(str(src_dir), "vllm_hidden_states_generator")
        self.replies = []
        self.batch = None
        side = self

        class Executor:
            def collective_rpc(self, method, args=(), unique_reply_rank=None):
                if method != "_get_captured_states":
                    return None
                side.conn.send(side.batch)
                reply = side.conn.recv()
                side.replies.append(reply)
                return reply

        class Scheduler:
            def add_request(self, req):
                pass

            def schedule(self):
                return types.SimpleNamespace(total_num_scheduled_tokens=0)

        gen = gen_mod.VllmHiddenStatesGenerator.__new__(gen_mod.VllmHiddenStatesGenerator)
        gen.executor, gen.scheduler, gen._request_counter = Executor(), Scheduler(), 0
        gen.tokenizer = types.SimpleNamespace(eos_token_id=2)
        gen.vllm_config = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=1 << 20))
        self.gen = gen

    def generate(self, lengths, layers=3, hidden=64, steps=2, seed=0):
        """One generate() of prompts of ``lengths`` tokens; the worker's states are random bf16 rows
        (``steps`` chunks per layer, as several scheduler steps leave them). Returns (results, the
        states the worker held, concatenated per layer)."""
        g = torch.Generator().manual_seed(seed)
        total = sum(lengths)
        full = [torch.randn(total, hidden, generator=g).to(torch.bfloat16) for _ in range(layers)]
        cut = total // steps
        self.batch = [[h[:cut], h[cut:]] if steps == 2 else [h] for h in full]
        results = self.gen.generate([[7] * n for n in lengths])
        return results, full

    def close(self):
        pass   # the worker process serves the next test; it ends with the module (fixture src)


def check_results(results, full, lengths):
    at = 0
    for r, n in zip(results, lengths):
        assert r["input_ids"].tolist() == [7] * n
        for h, ref in zip(r["hidden_states"], full):
            assert h.dtype == torch.bfloat16 and h.shape == (n, ref.shape[1])
            assert torch.equal(h, ref[at:at + n])          # bit for bit
        at += n
    assert at == sum(lengths)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    yield patched_sources(tmp_path_factory.mktemp("spec-hs"))
    if "conn" in _WORKER:
        _WORKER.pop("conn").send(None)
        _WORKER.pop("proc").join(20)


def test_the_states_come_through_one_file_bit_for_bit_and_the_file_regrows(src, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    side = Side(src, str(shm))
    try:
        small, big = [40, 60], [3000, 2500, 1000]        # 100 rows; then 6,500 x 3 x 64 > 1 Mi elements
        r1, full1 = side.generate(small, seed=1)
        check_results(r1, full1, small)
        first = side.replies[-1]
        assert isinstance(first, dict) and first["dtype"] == "bfloat16"
        assert first["shapes"] == [[100, 64]] * 3 and first["capacity"] == 1 << 20
        r2, full2 = side.generate(big, seed=2)
        check_results(r2, full2, big)
        second = side.replies[-1]
        assert isinstance(second, dict) and second["remote_ops_shm"] != first["remote_ops_shm"]
        assert second["capacity"] >= 6500 * 3 * 64
        assert sorted(os.listdir(shm)) == [os.path.basename(second["remote_ops_shm"])]   # the old one is gone
        r3, full3 = side.generate(small, seed=3)            # fits: the same file, mapped once
        check_results(r3, full3, small)
        assert side.replies[-1]["remote_ops_shm"] == second["remote_ops_shm"]
        # results are copies: the file's later contents did not reach the earlier results
        check_results(r1, full1, small)
        check_results(r2, full2, big)
    finally:
        side.close()


def test_without_a_directory_the_tensors_come_over_the_rpc(src):
    side = Side(src, None)
    try:
        r, full = side.generate([30, 50])
        check_results(r, full, [30, 50])
        assert isinstance(side.replies[-1], list) and torch.is_tensor(side.replies[-1][0])
    finally:
        side.close()


def test_a_directory_that_fails_falls_back_to_the_rpc_for_good(src, tmp_path, capfd):
    side = Side(src, str(tmp_path / "missing"))
    try:
        r, full = side.generate([30, 50])
        check_results(r, full, [30, 50])
        (tmp_path / "missing").mkdir()                       # fixed later: the worker stays on the RPC
        r, full = side.generate([20], seed=4)
        check_results(r, full, [20])
        assert all(isinstance(x, list) for x in side.replies)
        assert os.listdir(tmp_path / "missing") == []
    finally:
        side.close()


# ------------------------------------------------------------------ the script's directory
def load_script():
    return load_extract_script("ehs_handoff")


def test_the_script_makes_names_and_removes_its_directory(tmp_path, monkeypatch, capsys):
    ehs = load_script()
    monkeypatch.delenv(ENV, raising=False)
    dead = tmp_path / "remote-ops-hs-999999999-x"           # a killed run's (no such pid)
    dead.mkdir()
    (dead / "hs-1-1").write_bytes(b"x")
    live = tmp_path / f"remote-ops-hs-{os.getppid()}-y"      # a running process's: kept
    live.mkdir()
    other = tmp_path / "someone-elses"
    other.mkdir()
    d = ehs.open_handoff(str(tmp_path), sys.stdout)
    assert os.environ[ENV] == d and Path(d).parent == tmp_path and Path(d).name.startswith(f"remote-ops-hs-{os.getpid()}-")
    assert not dead.exists() and live.exists() and other.exists()
    (Path(d) / "hs-5-1").write_bytes(b"x")
    ehs.close_handoff(d)
    assert not Path(d).exists() and ENV not in os.environ
    assert ehs.open_handoff("off", sys.stdout) is None and ENV not in os.environ
    with pytest.raises(ehs.InputError, match="not a writable directory"):
        ehs.open_handoff(str(tmp_path / "nope"), sys.stdout)


def test_the_playbook_passes_the_setting_to_the_script():
    cmd = PLAYBOOK.extract["command"] if isinstance(PLAYBOOK.extract, dict) else PLAYBOOK.extract.command
    defaults = PLAYBOOK.doc.data["vars"]
    i = cmd.index("--handoff-dir")
    assert cmd[i + 1] == "{vars.handoff_dir}" and defaults["handoff_dir"] == "auto"
    assert load_script().parse_args(["--target-model-path", "m", "--dataset", "d", "--output-dir", "o"]).handoff_dir == "auto"
