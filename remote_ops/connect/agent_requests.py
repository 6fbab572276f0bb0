"""Typed requests for the agent's operations: the controller's only way to name one.

One function per operation of ``remote_ops/agent/contract.py`` ``OPS``, grouped by agent module;
each returns ``(op, args)`` for ``Session.call(*req)`` / ``Session.stream(*req)`` or a
``Session.call_many([...])`` batch. Only the keyword arguments given are sent, and ``_req`` refuses
a key the contract does not declare for the operation (a programming error: TypeError), so a typo
fails in the controller's tests, not on a host. ``tests/agent/test_contract.py`` checks that every
declared operation has its function here and that no other controller module spells an op name.
"""

from __future__ import annotations

from typing import Any

from remote_ops.agent.contract import OPS

Request = tuple[str, dict]
_UNSET: Any = object()


def _req(op: str, **args) -> Request:
    sent = {k: v for k, v in args.items() if v is not _UNSET}
    bad = set(sent) - set(OPS[op].args)
    if bad:
        raise TypeError(f"{op} does not take {sorted(bad)} (remote_ops/agent/contract.py)")
    return op, sent


# ping.py
def ping_ping(*, echo: Any = _UNSET) -> Request:
    return _req("ping.ping", echo=echo)


def ping_ticks(*, n: int = _UNSET, every: float = _UNSET) -> Request:
    return _req("ping.ticks", n=n, every=every)


# facts.py, gpu.py
def facts_gather(*, workdir: str | None = _UNSET, packages: list[str] = _UNSET, gpus: bool = _UNSET,
                 jobs: bool = _UNSET) -> Request:
    return _req("facts.gather", workdir=workdir, packages=packages, gpus=gpus, jobs=jobs)


def gpu_query(*, driver: bool = _UNSET, timeout: float = _UNSET) -> Request:
    return _req("gpu.query", driver=driver, timeout=timeout)


# compat.py
def candidates_check(*, sources: list[dict], package: str = _UNSET, against: list[str] = _UNSET) -> Request:
    """sources: [{"version", "key", "data"?}] (agent/candidates.py); ``data`` only for keys the host needs."""
    return _req("candidates.check", sources=sources, package=package, against=against)


def compat_check(*, against: list[str], targets: list[str] = _UNSET, package: str = _UNSET, mode: str = _UNSET,
                 drift: bool = _UNSET, override_sources: dict = _UNSET, sys_path: list[str] = _UNSET,
                 only_symbols: list = _UNSET, trace: bool = _UNSET) -> Request:
    return _req("compat.check", against=against, targets=targets, package=package, mode=mode, drift=drift,
                override_sources=override_sources, sys_path=sys_path, only_symbols=only_symbols, trace=trace)


def serverflow_check(*, command: list[str], client: dict = _UNSET, python: str = _UNSET,
                     sys_path: list[str] = _UNSET, client_command: list[str] = _UNSET) -> Request:
    return _req("serverflow.check", command=command, client=client, python=python, sys_path=sys_path,
                client_command=client_command)


def model_check(*, model: str, library: str = _UNSET, layer_ids: list = _UNSET, default_layer_ids: list = _UNSET,
                protocol: str = _UNSET, worker: str = _UNSET, text_model: list = _UNSET,
                text_model_members: list = _UNSET, layer_forward_keywords: list = _UNSET,
                workdir: str = _UNSET, sys_path: list[str] = _UNSET, tokenizer_loader: str = _UNSET) -> Request:
    return _req("model.check", workdir=workdir, model=model, library=library, layer_ids=layer_ids,
                tokenizer_loader=tokenizer_loader,
                default_layer_ids=default_layer_ids, protocol=protocol, worker=worker, text_model=text_model,
                text_model_members=text_model_members, layer_forward_keywords=layer_forward_keywords,
                sys_path=sys_path)


def compat_inspect(*, symbols: list[str], mode: str = _UNSET, sys_path: list[str] = _UNSET) -> Request:
    return _req("compat.inspect", symbols=symbols, mode=mode, sys_path=sys_path)


# files.py, imports.py
def files_put(*, workdir: str | None, files: list[dict], dry_run: bool = _UNSET,
              unless_running: str = _UNSET) -> Request:
    return _req("files.put", workdir=workdir, files=files, dry_run=dry_run, unless_running=unless_running)


def imports_probe(*, python: str, modules: list[str], env: dict = _UNSET, workdir: str | None = _UNSET,
                  timeout: float = _UNSET, packages: list[str] = _UNSET, unless_running: str = _UNSET,
                  model: str = _UNSET) -> Request:
    return _req("imports.probe", python=python, modules=modules, env=env, workdir=workdir, timeout=timeout,
                packages=packages, unless_running=unless_running, model=model)


# dataset.py
def dataset_check(*, path: str, workdir: str | None = _UNSET, max_samples: int | None = _UNSET,
                  budget: float = _UNSET) -> Request:
    return _req("dataset.check", path=path, workdir=workdir, max_samples=max_samples, budget=budget)


# jobs.py
def jobs_probe(*, key: str, output_dir: str | None, need: dict | None = None, port: int | None = _UNSET,
               layout: str | None = _UNSET, identity: dict | None = _UNSET, speed: dict | None = _UNSET,
               output_dirs: list | None = _UNSET, prepared: dict | None = _UNSET) -> Request:
    return _req("jobs.probe", key=key, output_dir=output_dir, need=need if need else _UNSET, port=port, layout=layout,
                identity=identity, speed=speed, output_dirs=output_dirs, prepared=prepared)


def jobs_launch(*, key: str, command: list[str], workdir: str | None, env: dict, secrets: dict,
                output_dir: str | None, expected_samples: int | None, watchdog_seconds: float | None,
                cleanup_grace: float, playbook: str | None, lock_timeout: float = _UNSET,
                start_timeout: float = _UNSET, server: dict | None = _UNSET, layout: str | None = _UNSET,
                shard: list | None = _UNSET, identity: dict | None = _UNSET, overwrite: bool = _UNSET,
                plan: dict | None = _UNSET, output_dirs: list | None = _UNSET) -> Request:
    return _req("jobs.launch", key=key, command=command, workdir=workdir, env=env, secrets=secrets,
                output_dir=output_dir, output_dirs=output_dirs, expected_samples=expected_samples, watchdog_seconds=watchdog_seconds,
                cleanup_grace=cleanup_grace, playbook=playbook, lock_timeout=lock_timeout,
                start_timeout=start_timeout, server=server, layout=layout, shard=shard, identity=identity,
                overwrite=overwrite, plan=plan)


def jobs_status(*, key: str = _UNSET, job_id: str = _UNSET, output_dir: str | None = _UNSET) -> Request:
    """One job: by ``job_id``, or the latest of the playbook ``key`` writing ``output_dir`` (any, when absent)."""
    return _req("jobs.status", key=key, job_id=job_id, output_dir=output_dir)


def jobs_list(*, key: str = _UNSET) -> Request:
    return _req("jobs.list", key=key)


def jobs_logs(*, job_id: str = _UNSET, key: str = _UNSET, output_dir: str | None = _UNSET, lines: int = _UNSET,
              max_bytes: int = _UNSET, offset: int = _UNSET) -> Request:
    return _req("jobs.logs", job_id=job_id, key=key, output_dir=output_dir, lines=lines, max_bytes=max_bytes,
                offset=offset)


def jobs_tail(*, job_id: str = _UNSET, key: str = _UNSET, output_dir: str | None = _UNSET, offset: int = _UNSET,
              budget: float = _UNSET, poll: float = _UNSET, snapshot_every: float = _UNSET,
              gpu_every: float = _UNSET) -> Request:
    return _req("jobs.tail", job_id=job_id, key=key, output_dir=output_dir, offset=offset, budget=budget, poll=poll,
                snapshot_every=snapshot_every, gpu_every=gpu_every)


def jobs_stop(*, job_id: str, grace: float) -> Request:
    return _req("jobs.stop", job_id=job_id, grace=grace)


# patching.py
def patching_read(*, targets: list[dict], packages: list[str] = _UNSET, workdir: str | None = _UNSET,
                  lock_timeout: float = _UNSET, data_unless: dict | None = _UNSET,
                  present: dict | None = _UNSET) -> Request:
    """data_unless: an ``only_if`` state; when the host is in it, the targets' bytes are left out
    (``data`` null, ``data_omitted`` true): the controller planned from them already.
    present: {"args": check arguments, "fixes": [{edit, kind, symbol, name}]}: the answer's
    ``present`` says per edit whether one of its fixes matches a finding of the unpatched modules."""
    return _req("patching.read", targets=targets, packages=packages, workdir=workdir, lock_timeout=lock_timeout,
                data_unless=data_unless, present=present)


def patching_apply(**args) -> Request:
    """targets, playbook, edit_ids, workdir, import_check, import_timeout, lock_timeout, who, verify,
    only_if (the host state the plan is for: python major.minor, package versions, every target's
    sha256; the agent answers ``{"skipped": why}`` and changes nothing when the host differs),
    while_running (apply even while a job of the host's interpreter runs)."""
    return _req("patching.apply", **args)


def patching_verify(*, verify: dict, targets: list[dict]) -> Request:
    return _req("patching.verify", verify=verify, targets=targets)


def patching_rollback(*, to: str | None, force: bool, who: str, lock_timeout: float = _UNSET,
                      while_running: bool = _UNSET) -> Request:
    return _req("patching.rollback", to=to, force=force, who=who, lock_timeout=lock_timeout,
                while_running=while_running)


def patching_history(*, limit: int | None) -> Request:
    return _req("patching.history", limit=limit)


# verify.py
def verify_verify(*, output_dir: str, expected: int | None = _UNSET, expected_default: int | None = _UNSET,
                  all: bool = _UNSET, sample: int = _UNSET, seed: int = _UNSET, finite: bool = _UNSET,
                  layout: str | None = _UNSET, adopt: dict | None = _UNSET) -> Request:
    return _req("verify.verify", output_dir=output_dir, expected=expected, expected_default=expected_default,
                all=all, sample=sample, seed=seed, finite=finite, layout=layout, adopt=adopt)


# shards.py
def shards_files(*, output_dir: str, digest: bool = _UNSET, packed: bool = _UNSET) -> Request:
    return _req("shards.files", output_dir=output_dir, digest=digest, packed=packed)


# slurm.py
def slurm_submit(*, key: str, command: list[str], workdir: str | None, env: dict, output_dir: str | None,
                 tasks: int, sbatch: list[str], python: str | None, expected_samples: int | None,
                 secrets: dict = _UNSET, requeue: int = _UNSET) -> Request:
    return _req("slurm.submit", key=key, command=command, workdir=workdir, env=env, output_dir=output_dir,
                tasks=tasks, sbatch=sbatch, python=python, expected_samples=expected_samples, secrets=secrets,
                requeue=requeue)


def slurm_status(*, key: str = _UNSET, job_id: str = _UNSET) -> Request:
    return _req("slurm.status", key=key, job_id=job_id)


def slurm_where(*, partition: str | None) -> Request:
    return _req("slurm.where", partition=partition)


def slurm_list(*, key: str = _UNSET) -> Request:
    return _req("slurm.list", key=key)


def slurm_stop(*, key: str = _UNSET, job_id: str = _UNSET, grace: float = _UNSET) -> Request:
    return _req("slurm.stop", key=key, job_id=job_id, grace=grace)


def slurm_logs(*, key: str = _UNSET, job_id: str = _UNSET, lines: int = _UNSET, offsets: list = _UNSET) -> Request:
    return _req("slurm.logs", key=key, job_id=job_id, lines=lines, offsets=offsets)


# logits.py
def logits_check(*, output_dir: str, n: int, layout: str | None = _UNSET, model: str | None = _UNSET,
                 seed: int = _UNSET, port: int | None = _UNSET, top_k: int = _UNSET, min_top1: float = _UNSET,
                 max_mean_delta: float = _UNSET, timeout: float = _UNSET) -> Request:
    return _req("logits.check", output_dir=output_dir, n=n, layout=layout, model=model, seed=seed, port=port,
                top_k=top_k, min_top1=min_top1, max_mean_delta=max_mean_delta, timeout=timeout)
