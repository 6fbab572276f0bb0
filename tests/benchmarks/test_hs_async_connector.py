"""benchmarks/gpu/lib/hs_async_connector.py on vLLM 0.20.0's own ExampleHiddenStatesConnector source (from PyPI):
only the modules that source imports from the rest of vLLM are stand-ins (a base class that keeps the step's
metadata, a logger); the connector's own code, ReqMeta, extract_from_kv_cache and torch (CPU) are real.

Shows, on the real source, what the class changes: 0.20.0 names a request in a step's metadata at every step
that gives it new blocks, and not at a last chunk that needs none (its file then keeps the states the slots
held before that chunk ran); the async class names it once, at the step that completes the prompt. And the
worker side: the ``<file>.lock`` speculators' client waits on is held until the file is whole, only rank 0
writes, and the bytes waiting to be written are bounded."""
import fcntl
import importlib.util
import logging
import os
import sys
import threading
import types
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
from safetensors.torch import load_file  # noqa: E402

from remote_ops import pkgsource  # noqa: E402
from tests.conftest import REPO  # noqa: E402

CONN = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
TP_RANK = {"rank": 0}


class StubBase:
    """What vLLM's KVConnectorBase_V1 gives the connector: its config and the step's metadata."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        self._vllm_config = vllm_config
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._connector_metadata = None

    def bind_connector_metadata(self, meta):
        self._connector_metadata = meta

    def _get_connector_metadata(self):
        return self._connector_metadata


def _module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


@pytest.fixture(scope="module")
def conn_mods():
    src = pkgsource.unpacked("vllm", "0.20.0") / "vllm/distributed/kv_transfer/kv_connector/v1/" \
        "example_hidden_states_connector.py"
    stubs = {
        "vllm": _module("vllm"),
        "vllm.config": _module("vllm.config", VllmConfig=object,
                               get_layers_from_vllm_config=lambda cfg, cls, names: {n: object() for n in names}),
        "vllm.distributed": _module("vllm.distributed"),
        "vllm.distributed.kv_transfer": _module("vllm.distributed.kv_transfer"),
        "vllm.distributed.kv_transfer.kv_connector": _module("vllm.distributed.kv_transfer.kv_connector"),
        "vllm.distributed.kv_transfer.kv_connector.v1": _module("vllm.distributed.kv_transfer.kv_connector.v1"),
        "vllm.distributed.kv_transfer.kv_connector.v1.base": _module(
            "vllm.distributed.kv_transfer.kv_connector.v1.base", KVConnectorBase_V1=StubBase,
            KVConnectorMetadata=object, KVConnectorRole=NS(WORKER=1, SCHEDULER=0)),
        "vllm.distributed.parallel_state": _module("vllm.distributed.parallel_state",
                                                   get_tensor_model_parallel_rank=lambda: TP_RANK["rank"]),
        "vllm.logger": _module("vllm.logger", init_logger=logging.getLogger),
        "vllm.v1": _module("vllm.v1"),
        "vllm.v1.attention": _module("vllm.v1.attention"),
        "vllm.v1.attention.backend": _module("vllm.v1.attention.backend", AttentionMetadata=object),
        "vllm.v1.core": _module("vllm.v1.core"),
        "vllm.v1.core.sched": _module("vllm.v1.core.sched"),
        "vllm.v1.core.sched.output": _module("vllm.v1.core.sched.output", NewRequestData=object,
                                             SchedulerOutput=object),
        "vllm.model_executor": _module("vllm.model_executor"),
        "vllm.model_executor.models": _module("vllm.model_executor.models"),
        "vllm.model_executor.models.extract_hidden_states": _module(
            "vllm.model_executor.models.extract_hidden_states", CacheOnlyAttentionLayer=object,
            CacheOnlyAttentionMetadata=object),
    }
    saved = {k: sys.modules.get(k) for k in [*stubs, CONN, "hs_async_connector"]}
    sys.modules.update(stubs)
    try:
        stock = _module(CONN)
        stock.__file__ = str(src)
        sys.modules[CONN] = stock
        exec(compile(src.read_text(), str(src), "exec"), stock.__dict__)
        spec = importlib.util.spec_from_file_location(
            "hs_async_connector", REPO / "benchmarks/gpu/lib/hs_async_connector.py")
        mine = importlib.util.module_from_spec(spec)
        sys.modules["hs_async_connector"] = mine
        spec.loader.exec_module(mine)
        yield stock, mine
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def config(tmp_path, block_size=4, **extra):
    kv = NS(get_from_extra_config=lambda key, default: {"shared_storage_path": str(tmp_path), **extra}.get(
        key, default))
    return NS(kv_transfer_config=kv, cache_config=NS(block_size=block_size),
              speculative_config=NS(draft_model_config=NS(hf_config=NS(eagle_aux_hidden_state_layer_ids=[1, 2]))))


def new_req(rid, prompt, blocks, computed=0):
    return NS(req_id=rid, prompt_token_ids=list(prompt), block_ids=(list(blocks),), num_computed_tokens=computed)


def step(new=(), cached=(), scheduled=None):
    """A SchedulerOutput with the fields 0.20.0's scheduler fills (cached: (req_id, new blocks or None,
    computed before))."""
    return NS(scheduled_new_reqs=list(new), num_scheduled_tokens=dict(scheduled or {}),
              scheduled_cached_reqs=NS(req_ids=[c[0] for c in cached], resumed_req_ids=set(),
                                       new_block_ids=[None if c[1] is None else (list(c[1]),) for c in cached],
                                       num_computed_tokens=[c[2] for c in cached]))


def named(meta):
    return [(r.req_id, r.token_ids.shape[0], r.slot_mapping.shape[0]) for r in meta.requests]


def test_a_last_chunk_without_new_blocks(conn_mods, tmp_path):
    """Prompt A of 7 tokens, blocks of 4: the first step runs 6 tokens in blocks [0, 1] (8 slots), the
    second the 7th, which fits the blocks it has: the scheduler gives it no new block (None)."""
    stock_mod, mine_mod = conn_mods
    steps = [step(new=[new_req("A", range(7), [0, 1])], scheduled={"A": 6}),
             step(cached=[("A", None, 6)], scheduled={"A": 1})]
    stock = stock_mod.ExampleHiddenStatesConnector(config(tmp_path), 0)
    mine = mine_mod.AsyncHiddenStatesConnector(config(tmp_path), 0)
    # 0.20.0: written after the first chunk (the 7th token's slot not yet computed), never after the last
    assert [named(stock.build_connector_meta(s)) for s in steps] == [[("A", 7, 8)], []]
    # the async class: once, at the step that completes the prompt
    assert [named(mine.build_connector_meta(s)) for s in steps] == [[], [("A", 7, 8)]]


def test_chunks_with_new_blocks_and_a_whole_prompt(conn_mods, tmp_path):
    _, mine_mod = conn_mods
    mine = mine_mod.AsyncHiddenStatesConnector(config(tmp_path), 0)
    first = step(new=[new_req("A", range(10), [0, 1]), new_req("B", range(3), [5])], scheduled={"A": 8, "B": 3})
    second = step(cached=[("A", [2], 8)], scheduled={"A": 2})
    assert named(mine.build_connector_meta(first)) == [("B", 3, 4)]
    meta = mine.build_connector_meta(second)
    assert named(meta) == [("A", 10, 12)]
    assert meta.requests[0].slot_mapping[:10].tolist() == list(range(10))   # blocks 0, 1, 2 in order
    assert mine.request_finished(NS(request_id="A"), [])[1] == {"hidden_states_path": str(tmp_path / "A.safetensors")}


def test_a_resumed_request_takes_its_new_blocks(conn_mods, tmp_path):
    _, mine_mod = conn_mods
    mine = mine_mod.AsyncHiddenStatesConnector(config(tmp_path), 0)
    mine.build_connector_meta(step(new=[new_req("A", range(6), [0])], scheduled={"A": 4}))
    resumed = step(cached=[("A", [7, 8], 0)], scheduled={"A": 6})
    resumed.scheduled_cached_reqs.resumed_req_ids = {"A"}
    meta = mine.build_connector_meta(resumed)
    assert meta.requests[0].slot_mapping[:6].tolist() == [28, 29, 30, 31, 32, 33]


def worker(mine_mod, tmp_path, **extra):
    w = mine_mod.AsyncHiddenStatesConnector(config(tmp_path, **extra), 1)
    w.register_kv_caches({"cache_layer": None})
    return w


def kv_layer(blocks=4, block_size=4, layers=2, hidden=3):
    return torch.arange(blocks * block_size * layers * hidden, dtype=torch.float32).reshape(
        blocks, block_size, layers, hidden)


def test_the_lock_is_held_until_the_file_is_whole(conn_mods, tmp_path, monkeypatch):
    _, mine_mod = conn_mods
    w = worker(mine_mod, tmp_path)
    release = threading.Event()
    real_save = mine_mod.save_file

    def slow_save(tensors, path):
        release.wait(10)
        real_save(tensors, path)
    monkeypatch.setattr(mine_mod, "save_file", slow_save)
    meta = w.build_connector_meta(step(new=[new_req("A", [5, 6, 7, 8, 9], [2, 0])], scheduled={"A": 5}))
    w.bind_connector_metadata(meta)
    kv = kv_layer()
    w.save_kv_layer("cache_layer", kv, None)
    target, lock = tmp_path / "A.safetensors", tmp_path / "A.safetensors.lock"
    fd = os.open(lock, os.O_RDWR)          # what speculators 0.9.0's client does after the response
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert not target.exists()
        release.set()
        fcntl.flock(fd, fcntl.LOCK_EX)     # returns once the writer released it
    finally:
        os.close(fd)
    got = load_file(str(target))
    want = kv.flatten(0, 1)[[8, 9, 10, 11, 0]]   # block 2's slots, then block 0's first
    assert torch.equal(got["hidden_states"], want) and got["token_ids"].tolist() == [5, 6, 7, 8, 9]
    assert not (tmp_path / "A.safetensors.part").exists()


def test_pending_bytes_are_bounded(conn_mods, tmp_path, monkeypatch):
    _, mine_mod = conn_mods
    w = worker(mine_mod, tmp_path, max_pending_mb=0)   # below one request: one write in flight at a time
    release = threading.Event()
    real_save = mine_mod.save_file
    monkeypatch.setattr(mine_mod, "save_file", lambda t, p: (release.wait(10), real_save(t, p)))
    meta = w.build_connector_meta(step(new=[new_req("A", [1, 2], [0]), new_req("B", [3, 4], [1])],
                                       scheduled={"A": 2, "B": 2}))
    w.bind_connector_metadata(meta)
    t = threading.Thread(target=w.save_kv_layer, args=("cache_layer", kv_layer(), None))
    t.start()
    t.join(0.5)
    assert t.is_alive()                    # B waits for A's write: the forward is held back
    assert (tmp_path / "A.safetensors.lock").exists() and not (tmp_path / "B.safetensors.lock").exists()
    release.set()
    t.join(10)
    assert not t.is_alive()
    w._pool.shutdown(wait=True)
    assert load_file(str(tmp_path / "B.safetensors"))["token_ids"].tolist() == [3, 4]


def test_only_rank_zero_writes(conn_mods, tmp_path):
    _, mine_mod = conn_mods
    TP_RANK["rank"] = 1
    try:
        w = worker(mine_mod, tmp_path)
    finally:
        TP_RANK["rank"] = 0
    w.bind_connector_metadata(w.build_connector_meta(step(new=[new_req("A", [1], [0])], scheduled={"A": 1})))
    w.save_kv_layer("cache_layer", kv_layer(), None)
    assert list(tmp_path.iterdir()) == []
