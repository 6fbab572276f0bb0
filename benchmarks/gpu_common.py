"""What the GPU checks share: the result document, subprocess runs, the host environment, the carried
bundle's interpreters and remote-ops itself in a fresh process.

Used by benchmarks/gpu_extract_check.py and benchmarks/gpu_model_check.py, which run ON the lent GPU
machines (offline; see ../shared/GPU-NOTES.md). Stdlib only: the machine's python runs it before
anything of the bundle is on its path.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLAYBOOK = REPO / "playbooks" / "eagle3-speculators-0.3.0.yaml"

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
        self.doc: dict = {"code_rev": code_rev, "check": check, "tensor_parallel_size": tp,
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
