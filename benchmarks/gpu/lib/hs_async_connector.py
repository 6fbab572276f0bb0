"""vLLM 0.22's asynchronous hidden-state write path, for vLLM 0.17-0.21 (issue 47 item 2: where the server flow's
time goes).

vLLM 0.20.0's ExampleHiddenStatesConnector saves inside the model's forward, on the worker's thread: for every
request of a step it copies the states to the CPU (``.cpu()``, which waits for the GPU) and writes the file
(``safetensors.torch.save_file``) before the step goes on; with chunked prefill it writes a request's file
again at every step that gives it new blocks. vLLM 0.22.0 replaced that with a copy into pinned memory, a CUDA
event and a pool of writer threads, and a ``<file>.lock`` held (``flock`` LOCK_EX) until the file is written,
which speculators 0.9.0's client waits on before it moves the file (``wait_for_lock_async``, 10 s). The lent
H200 can run vLLM 0.20.0 only (torch 2.11), so this class gives 0.20.0 that path, to measure what the server
flow does with the write path of the releases that have it (0.22.0-0.33.0):

- the scheduler side (``build_connector_meta``) names a request in the step's metadata only at the step that
  completes its prompt (0.20.0 names it at every step with new blocks, and misses a last chunk that needs no
  new block); a request resumed after preemption takes its new block list instead of appending it;
- the worker side (``save_kv_layer``) gathers the request's states on the current stream, copies them into
  pinned host memory there (``non_blocking``), records an event, takes the lock and hands the write to a
  thread; at most ``max_pending_mb`` (``kv_connector_extra_config``, default 4096) of states wait to be
  written (the forward waits beyond that, so a slow disk bounds the lag the client's 10 s lock wait sees);
- only tensor-parallel rank 0 writes (0.20.0 writes the same file from every rank);
- the file is written to ``<file>.part`` and renamed, then the lock is released.

Loaded by vLLM through ``--kv_transfer_config '{"kv_connector": "AsyncHiddenStatesConnector",
"kv_connector_module_path": "hs_async_connector", ...}'`` with this file's directory on PYTHONPATH.
Runs where vLLM runs (imports torch, vllm, safetensors): never imported by remote-ops' controller or agent.
"""
from __future__ import annotations

import fcntl
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    ExampleHiddenStatesConnectorMetadata,
    extract_from_kv_cache,
)
from vllm.logger import init_logger

logger = init_logger(__name__)


def prompt_completes(computed_before: int, scheduled: int, prompt_len: int) -> bool:
    """Does a step that computes ``scheduled`` tokens after ``computed_before`` finish the prompt?"""
    return computed_before < prompt_len <= computed_before + scheduled


def resumed_ids(cached) -> set:
    """The cached requests that resumed after preemption: ``resumed_req_ids`` (0.20), else the
    ``resumed_from_preemption`` flags (older releases)."""
    got = getattr(cached, "resumed_req_ids", None)
    if got is not None:
        return set(got)
    flags = getattr(cached, "resumed_from_preemption", None) or []
    return {r for r, f in zip(cached.req_ids, flags) if f}


def copy_to_host(states):
    """(host tensor, wait): a copy into pinned memory on the current stream, and what waits for it; a CPU
    tensor is copied at once."""
    if states.is_cuda:
        host = torch.empty(states.shape, dtype=states.dtype, device="cpu", pin_memory=True)
        host.copy_(states, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event.synchronize
    return states.clone(), (lambda: None)


class AsyncHiddenStatesConnector(ExampleHiddenStatesConnector):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.get_from_extra_config
        self._threads = int(extra("num_writer_threads", 8))
        self._max_pending = int(extra("max_pending_mb", 4096)) << 20
        self._pool = None            # worker side, made on the first save
        self._pending = 0            # bytes copied and not yet written
        self._cv = threading.Condition()
        self._writer = True          # tensor-parallel rank 0 only (set in register_kv_caches)

    # ---- scheduler side ----
    def build_connector_meta(self, scheduler_output):
        meta = ExampleHiddenStatesConnectorMetadata()
        sched = scheduler_output.num_scheduled_tokens
        for new_req in scheduler_output.scheduled_new_reqs:
            ids = new_req.prompt_token_ids or []
            filename = os.path.join(self._storage_path, f"{new_req.req_id}.safetensors")
            self._request_filenames[new_req.req_id] = filename
            self._active_requests[new_req.req_id] = new_req
            self._req_blocks[new_req.req_id] = list(new_req.block_ids[0])
            if prompt_completes(new_req.num_computed_tokens, sched.get(new_req.req_id, 0), len(ids)):
                meta.add_request(new_req.req_id, filename=filename, token_ids=ids,
                                 block_ids=self._req_blocks[new_req.req_id], block_size=self._block_size)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = resumed_ids(cached)
        for i, req_id in enumerate(cached.req_ids):
            req = self._active_requests.get(req_id)
            if req is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if new_blocks is not None:
                if req_id in resumed:
                    self._req_blocks[req_id] = list(new_blocks[0])
                else:
                    self._req_blocks[req_id].extend(new_blocks[0])
            ids = req.prompt_token_ids or []
            if prompt_completes(cached.num_computed_tokens[i], sched.get(req_id, 0), len(ids)):
                meta.add_request(req_id=req_id, filename=self._request_filenames[req_id], token_ids=ids,
                                 block_ids=self._req_blocks[req_id], block_size=self._block_size, new_req=False)
        return meta

    # ---- worker side ----
    def register_kv_caches(self, kv_caches):
        super().register_kv_caches(kv_caches)
        try:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
            self._writer = get_tensor_model_parallel_rank() == 0
        except Exception:   # no tensor-parallel group: one worker
            self._writer = True

    def _reserve(self, n: int) -> None:
        with self._cv:
            while self._pending and self._pending + n > self._max_pending:
                self._cv.wait()
            self._pending += n

    def _write(self, tensors, done, filename, lock_fd, n) -> None:
        part = filename + ".part"
        try:
            done()
            save_file(tensors, part)
            os.replace(part, filename)
        except BaseException as exc:   # the client then finds no file and skips the row, which the job reports
            logger.error("hidden states not written to %s: %r", filename, exc)
        finally:
            os.close(lock_fd)          # releases LOCK_EX: the client's wait ends
            with self._cv:
                self._pending -= n
                self._cv.notify_all()

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        if layer_name not in self.cache_layers or not self._writer:
            return
        meta = self._get_connector_metadata()
        if not meta.requests:
            return
        if self._pool is None:
            os.makedirs(self._storage_path, exist_ok=True)
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="hs-write")
        for req in meta.requests:
            n_tok = req.token_ids.shape[0]
            states = extract_from_kv_cache(kv_layer, req.slot_mapping.to(kv_layer.device), n_tok)
            host, done = copy_to_host(states)
            n = host.numel() * host.element_size()
            self._reserve(n)
            lock_fd = os.open(req.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            self._pool.submit(self._write, {"hidden_states": host, "token_ids": req.token_ids.clone()},
                              done, req.filename, lock_fd, n)
