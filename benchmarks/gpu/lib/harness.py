"""What the GPU checks share: the result document, subprocess runs, the host environment, the carried
bundle's interpreters and remote-ops itself in a fresh process.

Used by benchmarks/gpu/extract_check.py, benchmarks/gpu/server_check.py, benchmarks/gpu/model_check.py and benchmarks/gpu/throughput.py,
which run ON the lent GPU
machines (offline; see ../shared/GPU-NOTES.md). Stdlib only: the machine's python runs it before
anything of the bundle is on its path.
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402
PLAYBOOK = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"

# Environment every host operation gets (GPU-NOTES.md: offline, NVLink multicast off).
HOST_ENV = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1",
    "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
}

VERSIONS = r'''
import json, importlib.metadata as md
out = {}
for n in ("vllm", "speculators", "torch", "transformers", "tokenizers", "pydantic", "triton", "pillow",
          "safetensors"):
    try:
        out[n] = md.version(n)
    except md.PackageNotFoundError:
        out[n] = None
print(json.dumps(out))
'''


def drift_line(d: dict) -> str:
    b, i = d.get("baseline") or {}, d.get("installed") or {}
    change = f"{b.get('value')} -> {i.get('value')}" if d.get("kind") == "default-changed" else \
        f"{b.get('annotation') or b.get('where')} -> {i.get('annotation') or i.get('where')}"
    return (f"{d.get('kind')} {d.get('symbol')} {d.get('name')}: {change} (line {d.get('line')})"
            + (f" [accepted: {d['accepted']}]" if d.get("accepted") else ""))


def save_word_tokenizer(out, vocab_size: int, max_length: int, extra_specials=()) -> None:
    """The tiny models' tokenizer, saved in ``out``: word level over ``<unk> <s> </s> <pad>`` (ids 0-3) and
    the words w4, w5, ... to the end of the vocabulary, less ``extra_specials`` (added special tokens,
    which take the last ids); ``<s>`` starts every text. Imports tokenizers and transformers itself (this
    module stays stdlib-only); the model builders run in a fresh interpreter get its source (WORD_TOKENIZER)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for i in range(len(specials), vocab_size - len(extra_specials)):
        vocab[f"w{i}"] = i
    for t in extra_specials:
        vocab[t] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    added = {"additional_special_tokens": list(extra_specials)} if extra_specials else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", **added)
    fast.model_max_length = max_length
    fast.save_pretrained(out)


WORD_TOKENIZER = inspect.getsource(save_word_tokenizer)   # for the builder scripts run with ``python -c``


def model_shape(config: dict) -> dict:
    """A checkpoint's shape from its config.json, the same keys for every result JSON (``model.shape``):
    layers, hidden, heads, kv_heads, intermediate, vocab; for mixture-of-experts models (DeepSeek-V3's
    n_routed_experts, Mixtral's num_local_experts, Qwen3-MoE's num_experts) experts, experts_per_token,
    shared_experts and moe_intermediate; mla when the attention is latent (kv_lora_rank); moe: true/false.
    A wrapper's text model (text_config, as Kimi-K2.5's) is the one measured."""
    c = config.get("text_config") or config
    experts = c.get("n_routed_experts") or c.get("num_local_experts") or c.get("num_experts") or 0
    shape = {"architecture": (config.get("architectures") or [None])[0], "layers": c.get("num_hidden_layers"),
             "hidden": c.get("hidden_size"), "heads": c.get("num_attention_heads"),
             "kv_heads": c.get("num_key_value_heads"), "intermediate": c.get("intermediate_size"),
             "vocab": c.get("vocab_size"), "experts": experts, "moe": bool(experts)}
    if experts:
        shape.update(experts_per_token=c.get("num_experts_per_tok"), shared_experts=c.get("n_shared_experts"),
                     moe_intermediate=c.get("moe_intermediate_size"))
    if c.get("kv_lora_rank"):
        shape["mla"] = {"kv_lora_rank": c.get("kv_lora_rank"), "q_lora_rank": c.get("q_lora_rank")}
    return shape


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Run:
    """The result document, written after every step so a timeout still leaves what was done."""

    def __init__(self, out: Path, tp: int, code_rev: str | None, append: bool, check: str = "gpu_extract_check",
                 connection: str = "local (no sshd on the GPU machine; same agent and requests as over SSH)"):
        self.out = out
        self.t0 = time.monotonic()
        if append and out.exists():
            self.doc = json.loads(out.read_text())
            self.prior_elapsed = float(self.doc.get("elapsed_s") or 0)
            self.doc.setdefault("runs", []).append({"code_rev": code_rev, "started_at": utc_now()})
            return
        self.prior_elapsed = 0.0
        self.doc: dict = {"code_rev": code_rev, "check": check, "written_by": provenance.written_by(rev=code_rev),
                          "tensor_parallel_size": tp,
                          "connection": connection, "started_at": utc_now(),
                          "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                          "steps": {}, "verdict": {}}

    def step(self, name: str, **data) -> dict:
        self.doc["steps"][name] = data
        self.save()
        return data

    def save(self) -> None:
        self.doc["elapsed_s"] = round(self.prior_elapsed + time.monotonic() - self.t0, 1)
        write_json(self.out, self.doc)

    def finish(self, prefixes: tuple[str, ...]) -> int:
        """The verdict of every step whose name starts with one of ``prefixes`` (its ``ok``), saved and
        printed as the summary line; returns the exit status (0: all ok)."""
        verdict = {k: bool(v.get("ok")) for k, v in self.doc["steps"].items() if k.startswith(prefixes)}
        self.doc["verdict"] = verdict
        self.doc["all_ok"] = bool(verdict) and all(verdict.values())
        self.save()
        print(json.dumps({"verdict": verdict, "all_ok": self.doc["all_ok"], "elapsed_s": self.doc["elapsed_s"]}))
        return 0 if self.doc["all_ok"] else 1


class Harness:
    """What a GPU check's harness starts from: its arguments (--work, --out, --tp, --code-rev, --append,
    --base-python, --controller-python), the work directory, the interpreters, the result document and
    the log of the commands it runs."""

    def __init__(self, args, check: str):
        self.args = args
        self.work = Path(args.work).resolve()
        self.base_python = args.base_python or sys.executable
        self.controller_python = args.controller_python or self.base_python
        self.run = Run(Path(args.out), args.tp, args.code_rev, args.append, check=check)
        self.log = self.work / "commands.log"


def save_verdict(run: Run, names: dict[str, str], steps: list[str]) -> None:
    """The verdict of ``steps`` (a step's key -> its result's name in ``names``): each is its result's
    ``ok``, False while it has none (not run yet, skipped, crashed); earlier runs' keys are kept (--append)."""
    s = run.doc["steps"]
    verdict = dict(run.doc.get("verdict") or {})
    verdict.update({k: bool((s.get(names[k]) or {}).get("ok")) for k in steps})
    run.doc["verdict"] = verdict
    run.doc["all_ok"] = bool(verdict) and all(verdict.values())
    run.save()


def run_steps(run: Run, steps: list[str], order: dict, names: dict[str, str], *, budget: float | None = None) -> int:
    """Run ``steps`` (keys of ``order``, in the order given), the verdict saved after each. A step that
    raises is recorded as ``<step>_crashed`` and the next one still runs (one broken step must not hide
    the others' results); with ``budget``, a step that would start after that many seconds of this run is
    recorded as ``<step>_skipped``. Prints the summary line; returns the exit status (0: all ok)."""
    for s in steps:
        elapsed = time.monotonic() - run.t0
        if budget is not None and elapsed > budget:
            run.step(f"{s}_skipped", ok=False, reason=f"{elapsed:.0f}s elapsed > --budget {budget:.0f}s")
            continue
        try:
            order[s]()
        except Exception as exc:   # one broken step must not hide the others' results
            run.step(f"{s}_crashed", ok=False, error=f"{type(exc).__name__}: {exc}")
        save_verdict(run, names, steps)
    save_verdict(run, names, steps)
    print(json.dumps({"verdict": run.doc["verdict"], "all_ok": run.doc["all_ok"], "elapsed_s": run.doc["elapsed_s"]}))
    return 0 if run.doc["all_ok"] else 1


def verify_detail(step: dict) -> str:
    """The evidence of a verify step (``remote-ops verify --json`` in ``result``), for GPU_RESULTS.md."""
    r = step.get("result") or {}
    dtypes = f", dtypes {r['dtypes']}" if r.get("dtypes") else ""
    return (f"exit {step.get('rc')}: {r.get('files')} files, {r.get('checked')} loaded, [layers, hidden] "
            f"{r.get('layers_hidden')}{dtypes}, non-finite {r.get('non_finite_count')}, gaps {r.get('gap_count')}, "
            f"unloadable {r.get('unloadable_count')}")


def compare_detail(step: dict) -> str:
    """The evidence of a comparison with transformers (benchmarks/gpu/extract_check.py COMPARE's ``result``)."""
    r = step.get("result") or {}
    return (f"{r.get('samples')} samples x {len(r.get('layer_ids') or [])} layers (ids {r.get('layer_ids')}), "
            f"{r.get('tokens_compared')} token vectors: min cosine {r.get('min_cosine')}, mean "
            f"{r.get('mean_cosine')}, shape mismatches {r.get('shape_mismatches_count')}, below 0.999: "
            f"{r.get('below_0_999_count')}")


def write_json(path: Path, doc) -> None:
    """Write ``doc`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    os.replace(tmp, path)


def sh(cmd: list[str], *, timeout: float, env: dict | None = None, log: Path | None = None) -> dict:
    """Run ``cmd`` in its own session; on timeout the whole process group is killed (vLLM's workers)."""
    started = time.monotonic()
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **(env or {})}, start_new_session=True)
    except FileNotFoundError as exc:
        rc, out, err = 127, "", str(exc)
    else:
        try:
            out, err = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            kill_group(p)
            out, err = p.communicate()
            rc, err = 124, (err or "") + f"\ntimed out after {timeout}s"
    if log is not None:
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(cmd)}\n[rc={rc}]\n{out}\n{err}\n")
    return {"rc": rc, "stdout": out or "", "stderr": err or "", "seconds": round(time.monotonic() - started, 2)}


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL the process group of ``p`` (started with start_new_session=True), only that group."""
    import signal
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def last_json(text: str):
    """The JSON document in a command's stdout (the whole output, or its last line)."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        for line in reversed(text.splitlines()):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def unpack_bundle(work: Path, bundle: str | None) -> dict:
    """Unpack the carried bundle (site/ and tf/) into ``work`` once; without one, site/ and tf/ must be there."""
    stamp = work / ".unpacked"
    if not stamp.exists():
        if bundle:
            with tarfile.open(bundle, "r:*") as tf:
                tf.extractall(work, filter="data") if sys.version_info >= (3, 12) else tf.extractall(work)
            stamp.write_text("ok")
        elif not ((work / "site").is_dir() and (work / "tf").is_dir()):
            raise SystemExit(f"{work} has no site/ and tf/ and no --bundle was given")
    return {"site": str(work / "site"), "tf": str(work / "tf")}


def write_interpreter(work: Path, name: str, base_python: str, path: list[str]) -> Path:
    """A host interpreter: ``base_python`` with ``path`` first on PYTHONPATH (e.g. transformers 4.57.6)."""
    (work / "bin").mkdir(parents=True, exist_ok=True)
    f = work / "bin" / name
    f.write_text(f"#!/bin/sh\nPYTHONPATH={':'.join(path)} exec {base_python} \"$@\"\n")
    f.chmod(0o755)
    return f


def versions_of(python: Path | str) -> dict | None:
    return last_json(sh([str(python), "-c", VERSIONS], timeout=60)["stdout"])


def gpu_names() -> list[str]:
    smi = sh(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"], timeout=30)
    return [line.strip() for line in smi["stdout"].splitlines() if line.strip()]


def remote_ops(controller_python: str, inventory: Path, args: tuple[str, ...] | list[str], *, work: Path,
               timeout: float, log: Path | None, controller_cache: str | None = None) -> dict:
    """remote-ops itself: this checkout's CLI in a fresh process; its JSON parsed when --json is given."""
    cmd = [controller_python, "-c",
           "import sys; sys.path.insert(0, sys.argv.pop(1)); from remote_ops.cli import main; "
           "sys.exit(main(sys.argv[1:]))", str(REPO), "-i", str(inventory), *args]
    # the controller needs libcst (carried in site/); it never imports vllm/speculators/torch
    env = {"PYTHONPATH": str(work / "site"), "COLUMNS": "200"}
    if controller_cache:   # the controller's wheel cache: drift's baseline sources
        env["REMOTE_OPS_CACHE"] = controller_cache
    r = sh(cmd, timeout=timeout, env=env, log=log)
    r["argv"] = ["remote-ops", *args]
    r["json"] = last_json(r["stdout"]) if "--json" in args else None
    return r
