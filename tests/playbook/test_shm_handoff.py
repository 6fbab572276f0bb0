"""The captured states' shared-memory hand-off (playbook edits captured-states-through-shared-memory
and captured-states-from-shared-memory), on speculators 0.3.0's real sources patched by
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
    life (a fresh extension; $REMOTE_OPS_HS_SHM_DIR set to dir, or unset for None); ("reset", plan)
    is the generator's _reset_capture RPC; ("get", steps) stores each forward step's captured layers
    as the patched forward does (_store_captured_states), then answers what _get_captured_states
    returns. One process serves every test (torch imports once)."""
    cw = load_patched(src_dir, "custom_worker")
    ext = None
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if msg[0] == "start":
            if msg[1] is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = msg[1]
            ext = cw.HiddenStatesWorkerExtension()
            ext._layer_ids = frozenset()
            ext._captured_states = None
            conn.send(os.getpid())
        elif msg[0] == "reset":
            conn.send(ext._reset_capture(*msg[1]))
        else:
            for step in msg[1]:
                ext._store_captured_states(step)
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
        self.env = os.environ.get(ENV)                     # the script's process names it, as open_handoff does
        if shm_dir is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = shm_dir
        assert self.conn.recv() != os.getpid()           # another process
        gen_mod = load_patched(str(src_dir), "vllm_hidden_states_generator")
        self.replies, self.plans = [], []
        self.steps = None
        side = self

        class Executor:
            def collective_rpc(self, method, args=(), unique_reply_rank=None):
                if method == "_reset_capture":
                    side.plans.append(args[0] if args else None)
                    side.conn.send(("reset", args))
                    return side.conn.recv()
                if method != "_get_captured_states":
                    return None
                side.conn.send(("get", side.steps))
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
        cuts = [total * j // steps for j in range(steps + 1)]
        self.steps = [[h[cuts[j]:cuts[j + 1]] for h in full] for j in range(steps)]
        results = self.gen.generate([[7] * n for n in lengths])
        return results, full

    def close(self):   # the worker process serves the next test; it ends with the module (fixture src)
        if self.env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self.env


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


def own_bytes(t) -> int:
    return t.untyped_storage().nbytes()


def test_each_step_streams_into_a_slot_and_the_results_are_its_rows_bit_for_bit(src, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    side = Side(src, str(shm))
    try:
        lengths = [40, 60, 25]
        r1, full1 = side.generate(lengths, steps=3, seed=1)
        check_results(r1, full1, lengths)
        assert side.plans[-1] == {"slot": 0, "rows": 125, "reserve": 125}   # no scheduler config: the batch's rows
        reply = side.replies[-1]
        assert isinstance(reply, dict) and reply["remote_ops_slot"] == 0 and reply["dtype"] == "bfloat16"
        # layer-major: layer i's 125 rows start after the rows of the layers before it
        assert reply["layers"] == [[0, 125, 64], [125 * 64, 125, 64], [2 * 125 * 64, 125, 64]]
        assert reply["pinned"] is False                   # no CUDA here: plain copies
        # zero copy: every state views the slot file, and its storage is exactly its own rows, so
        # torch.save writes those rows and not the whole slot
        for r, n in zip(r1, lengths):
            for h in r["hidden_states"]:
                assert own_bytes(h) == n * 64 * 2
        saved = tmp_path / "one.pt"
        torch.save(r1[1], saved)
        assert saved.stat().st_size < 60 * 64 * 2 * 3 + 4096
        assert torch.equal(torch.load(saved)["hidden_states"][2], full1[2][40:100])
        assert sorted(os.listdir(shm)) == [os.path.basename(reply["remote_ops_shm"])]
    finally:
        side.close()


def test_a_slot_is_reused_only_once_nothing_views_it(src, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    side = Side(src, str(shm))
    try:
        r1, full1 = side.generate([30, 20], seed=1)
        r2, full2 = side.generate([10, 50], seed=2)      # r1 still held: another slot
        assert [p["slot"] for p in side.plans] == [0, 1]
        check_results(r1, full1, [30, 20])              # batch 2 did not touch batch 1's rows
        keep = r2[1]["hidden_states"][0]                # one view of slot 1 outlives the rest of r2
        del r1, r2
        r3, full3 = side.generate([25], seed=3)          # slot 0 is free again
        r4, full4 = side.generate([35], seed=4)          # slot 1 is still viewed by `keep`: slot 2
        assert [p["slot"] for p in side.plans] == [0, 1, 0, 2]
        assert torch.equal(keep, full2[0][10:60])
        check_results(r3, full3, [25])
        check_results(r4, full4, [35])
        assert len(os.listdir(shm)) == 3
    finally:
        side.close()


def test_a_slot_too_small_is_regrown_under_a_new_name(src, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    side = Side(src, str(shm))
    try:
        small, big = [40, 60], [3000, 2500, 1000]        # 100 rows; then 6,500 x 3 x 64 > 1 Mi elements
        r, full = side.generate(small, seed=1)
        first = side.replies[-1]["remote_ops_shm"]
        del r
        r, full = side.generate(big, seed=2)
        check_results(r, full, big)
        second = side.replies[-1]
        assert second["remote_ops_slot"] == 0 and second["remote_ops_shm"] != first
        assert sorted(os.listdir(shm)) == [os.path.basename(second["remote_ops_shm"])]   # the old one is gone
        assert os.path.getsize(second["remote_ops_shm"]) >= 6500 * 3 * 64 * 2
    finally:
        side.close()


def test_a_new_slot_holds_one_engine_step_so_fuller_batches_do_not_regrow_it(src, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    side = Side(src, str(shm))
    side.gen.vllm_config.scheduler_config = types.SimpleNamespace(max_num_batched_tokens=7000)
    try:
        r, full = side.generate([40, 60], seed=1)
        first = side.replies[-1]["remote_ops_shm"]
        assert side.plans[-1] == {"slot": 0, "rows": 100, "reserve": 7000}
        assert os.path.getsize(first) >= 7000 * 3 * 64 * 2      # the step's rows, not the batch's 100
        del r
        big = [3000, 2500, 1000]                                # 6,500 rows: within the step
        r, full = side.generate(big, seed=2)
        check_results(r, full, big)
        assert side.replies[-1]["remote_ops_shm"] == first      # the same file: not regrown
        assert sorted(os.listdir(shm)) == [os.path.basename(first)]
        assert side.gen._remote_ops_slot_files == 1             # one file mapped for both batches
        del r
        r, full = side.generate([7200], seed=3)                 # beyond the step: a batch of two steps
        check_results(r, full, [7200])
        assert side.plans[-1] == {"slot": 0, "rows": 7200, "reserve": 14000}   # whole steps: two
        second = side.replies[-1]["remote_ops_shm"]
        assert second != first and side.gen._remote_ops_slot_files == 2
        del r
        two = [5000, 4000, 4500]                                # another batch of two steps: fits
        r, full = side.generate(two, steps=2, seed=4)
        check_results(r, full, two)
        assert side.replies[-1]["remote_ops_shm"] == second and side.gen._remote_ops_slot_files == 2
    finally:
        side.close()


class _Future:
    """What MultiprocExecutor's non_block calls return: a future read later (FutureWrapper)."""

    def __init__(self, log, step, error=None):
        self.log, self.step, self.error = log, step, error

    def result(self):
        self.log.append(("result", self.step))
        if self.error:
            raise self.error
        return None


def test_sample_tokens_is_not_waited_for_in_the_step_loop_but_resolved_before_the_states(src, tmp_path):
    """Edits execute-model-then-sample-tokens / sample-tokens-*: each step's sample_tokens is sent with
    non_block=True and not read until every step of the batch has been sent; all are read, in order,
    before _get_captured_states; a worker error in any step is raised from generate()."""
    shm = tmp_path / "shm"
    shm.mkdir()
    side = Side(src, str(shm))
    log = []
    inner = side.gen.executor

    class Executor:
        fail_at = None

        def collective_rpc(self, method, args=(), unique_reply_rank=None):
            log.append(("rpc", method))
            return inner.collective_rpc(method, args=args, unique_reply_rank=unique_reply_rank)

        def execute_model(self, scheduler_output):
            log.append(("execute", scheduler_output.step))
            return None

        def sample_tokens(self, grammar_output, non_block=False):
            assert grammar_output is None
            log.append(("sample", scheduler_output_step[0], non_block))
            return _Future(log, scheduler_output_step[0],
                           RuntimeError("worker failed in step %d" % scheduler_output_step[0])
                           if self.fail_at == scheduler_output_step[0] else None)

    scheduler_output_step = [0]

    class Scheduler:
        def __init__(self):
            self.left, self.finished = 0, []

        def add_request(self, req):
            self.left += 1

        def schedule(self):
            if not self.left:
                return types.SimpleNamespace(total_num_scheduled_tokens=0, num_scheduled_tokens={})
            self.left -= 1                                     # one request a step
            scheduler_output_step[0] += 1
            return types.SimpleNamespace(total_num_scheduled_tokens=10, step=scheduler_output_step[0],
                                         num_scheduled_tokens={"r%d" % scheduler_output_step[0]: 10})

        def finish_requests(self, ids, status):
            self.finished.extend(ids)

    side.gen.executor, side.gen.scheduler = Executor(), Scheduler()
    try:
        lengths = [30, 20, 25]
        r, full = side.generate(lengths, steps=3, seed=1)
        check_results(r, full, lengths)
        steps = [e for e in log if e[0] in ("execute", "sample", "result")]
        assert steps == [("execute", 1), ("sample", 1, True), ("execute", 2), ("sample", 2, True),
                         ("execute", 3), ("sample", 3, True), ("result", 1), ("result", 2), ("result", 3)]
        assert log.index(("result", 3)) < log.index(("rpc", "_get_captured_states"))
        assert side.gen.scheduler.finished == ["r1", "r2", "r3"]
        del r
        log.clear()
        side.gen.executor.fail_at = scheduler_output_step[0] + 2       # the second step of the next batch
        with pytest.raises(RuntimeError, match="worker failed in step"):
            side.generate([10, 10, 10], steps=3, seed=2)
        assert ("rpc", "_get_captured_states") not in log
    finally:
        side.close()


def test_with_every_slot_held_the_batch_is_concatenated_and_copied_as_before(src, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    side = Side(src, str(shm))
    side.gen.REMOTE_OPS_MAX_SLOTS = 1
    try:
        r1, full1 = side.generate([40, 60], seed=1)
        r2, full2 = side.generate([30], seed=2)          # slot 0 still viewed by r1: no plan
        assert side.plans == [{"slot": 0, "rows": 100, "reserve": 100}, None]
        reply = side.replies[-1]
        assert "remote_ops_slot" not in reply and reply["shapes"] == [[30, 64]] * 3   # the one-file way
        check_results(r2, full2, [30])
        assert own_bytes(r2[0]["hidden_states"][0]) == 30 * 64 * 2                    # a copy of its own
        check_results(r1, full1, [40, 60])
        assert side.gen._remote_ops_slots_full == 1
    finally:
        side.close()


def test_rows_that_do_not_match_the_prompts_raise_instead_of_misassigning(src, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    side = Side(src, str(shm))
    try:
        g = torch.Generator().manual_seed(5)
        full = [torch.randn(90, 64, generator=g).to(torch.bfloat16) for _ in range(3)]
        side.steps = [[h for h in full]]                 # the worker captured 90 rows for 100 tokens
        with pytest.raises(RuntimeError, match=r"captured \[90, 90, 90\] rows for a batch of 100 prompt tokens"):
            side.gen.generate([[7] * 40, [7] * 60])
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
