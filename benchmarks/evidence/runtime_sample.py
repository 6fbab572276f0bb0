"""Runtime sample for a playbook's range: a real vLLM install (CPU machine, no GPU), patched by remote-ops,
then the patched generator imported and `check --runtime` run there.

    python benchmarks/evidence/runtime_sample.py --vllm 0.16.0,0.25.0,0.32.0 \\
        --json benchmarks/results/runtime_sample.json

Per vLLM release, a venv of this machine's Python gets, from the package index (pip, nothing else):
- the torch release vLLM pins (``torch==X`` from its METADATA; the index's wheel, which imports on a CPU
  machine; a local ``+cpu`` build of the same version where pip's find-links has one);
- vLLM's other declared dependencies (its METADATA, markers evaluated here), except the GPU-only ones
  in ``GPU_ONLY`` (kernels, CUDA libraries, video codecs, torchaudio/vision/codec, ray) which a CPU
  machine cannot use and the generator's import path does not need;
- the vLLM and speculators 0.3.0 wheels themselves (``--no-deps``: the real wheels, compiled parts
  included) and speculators' light dependencies.
Then over a local connection: ``patch --yes --import-check`` (the playbook's edits, and the host's
interpreter imports the patched modules), ``python -c "import <generator>"``, and
``check --runtime --strict`` (vLLM imported; each call bound with inspect.signature). Everything
that could not be done is recorded with pip's or Python's own last line, never skipped silently.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from remote_ops import pkgsource  # noqa: E402

GEN = "speculators.data_generation.vllm_hidden_states_generator"
GPU_ONLY = {"torch", "torchaudio", "torchvision", "torchcodec", "flashinfer-python", "pynvvideocodec",
            "apache-tvm-ffi", "tilelang", "nvtx", "fastsafetensors", "instanttensor", "quack-kernels",
            "tokenspeed-mla", "humming-kernels", "xformers", "ray", "numba", "cupy-cuda12x",
            "nvidia-cudnn-frontend", "nvidia-cutlass-dsl", "opencv-python-headless", "deepgemm", "triton"}
SPECULATORS_DEPS = ["pydantic", "pydantic-settings", "loguru", "pyyaml", "rich", "safetensors", "tqdm", "numpy",
                    "click", "httpx", "datasets", "huggingface-hub"]


def last(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    return lines[-1].strip() if lines else ""


def requirements(vllm: str) -> tuple[str, list[str], list[str]]:
    """(torch pin, vLLM's other dependencies to install, the ones left out as GPU-only)."""
    from packaging.requirements import Requirement

    src = pkgsource.unpacked("vllm", vllm)
    meta = next(src.glob("vllm-*.dist-info")) / "METADATA"
    torch, keep, left = None, [], []
    for line in meta.read_text().splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = Requirement(line[len("Requires-Dist: "):])
        if req.marker is not None and ("extra" in str(req.marker) or not req.marker.evaluate({"extra": ""})):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name == "torch":    # installed on its own, at vLLM's pin
            torch = str(req.specifier)
            continue
        if name in GPU_ONLY or name.startswith("nvidia-"):
            left.append(str(req))
            continue
        keep.append(str(req).split(";")[0].strip())
    return torch, keep, left


def run(cmd, timeout=1800, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def ro(inv: Path, *args: str, timeout=900) -> tuple[int, dict | None, str]:
    p = run([sys.executable, "-m", "remote_ops", "-i", str(inv), "--json", *args], timeout=timeout, cwd=REPO)
    try:
        doc = json.loads(p.stdout) if p.stdout.strip() else None
    except ValueError:
        doc = None
    return p.returncode, doc, p.stderr


def one(vllm: str, work: Path, playbook: Path, pins: list[str] = ()) -> dict:
    t0 = time.monotonic()
    rec: dict = {"vllm": vllm}
    torch, deps, left = requirements(vllm)
    rec["torch"] = torch
    rec["left_out_gpu_only"] = left
    env = work / f"venv-{vllm}"
    shutil.rmtree(env, ignore_errors=True)
    run([pkgsource.base_python(), "-m", "venv", str(env)])
    py = env / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    rec["pins"] = list(pins)
    p = run(pip + [f"torch{torch}"] + deps + SPECULATORS_DEPS + list(pins))
    if p.returncode != 0:
        rec.update(installed=f"no: {last(p.stderr)}", seconds=round(time.monotonic() - t0))
        return rec
    wheels = [str(pkgsource.fetch_wheel("vllm", vllm)), str(pkgsource.fetch_wheel("speculators", "0.3.0"))]
    p = run(pip + ["--no-deps"] + wheels)
    if p.returncode != 0:
        rec.update(installed=f"no: {last(p.stderr)}", seconds=round(time.monotonic() - t0))
        return rec
    versions = run([str(py), "-c", "import importlib.metadata as m;print(m.version('torch'), m.version('transformers'))"])
    rec["installed"] = "yes: torch %s, transformers %s" % tuple(versions.stdout.split()) if versions.returncode == 0 \
        else f"yes (versions unreadable: {last(versions.stderr)})"
    inv = work / f"inv-{vllm}.yaml"
    inv.write_text(json.dumps({"hosts": {"h": {"connection": "local", "python": str(py), "playbook": str(playbook),
                                                "env": {"REMOTE_OPS_STATE_DIR": str(work / f"state-{vllm}")}}}}))
    rc, doc, err = ro(inv, "patch", "h", "--yes", "--import-check")
    rec["patch"] = {"rc": rc, "changed": (doc or {}).get("changed"),
                    "edits": {e["edit"]: e["state"] for e in (doc or {}).get("edits") or []},
                    "import_check": (doc or {}).get("import_check"), "error": None if rc == 0 else last(err)}
    p = run([str(py), "-c", f"import {GEN}"], timeout=900)
    rec["imports"] = "yes" if p.returncode == 0 else f"no: {last(p.stderr)}"
    rc, doc, err = ro(inv, "check", "h", "--runtime", "--strict")
    if doc is not None and "findings" in doc:
        rec["runtime_check"] = (f"exit {rc}: {len(doc['findings'])} findings, {len(doc.get('unknown') or [])} unknown, "
                                f"{doc.get('calls_checked')} calls bound, {len(doc.get('drift') or [])} drift")
        rec["runtime"] = {"rc": rc, "mode": doc.get("mode"), "versions": doc.get("versions"),
                          "findings": [f.get("message") for f in doc["findings"]],
                          "unknown": [u.get("reason") for u in doc.get("unknown") or []]}
    else:
        rec["runtime_check"] = f"exit {rc}: {last(err)}"
    names = sorted({re.split(r"[<>=!;~ \\[]", x)[0] for x in left})
    rec["detail"] = f"left out as GPU-only: {', '.join(names)}" if names else ""
    rec["seconds"] = round(time.monotonic() - t0)
    shutil.rmtree(env, ignore_errors=True)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", default="0.16.0,0.25.0,0.32.0")
    ap.add_argument("--playbook", default=str(REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"))
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "runtime_sample.json"))
    ap.add_argument("--workdir", help="where the venvs are built (default: a temporary directory)")
    ap.add_argument("--pin", action="append", default=[], metavar="REQ",
                    help="an extra requirement for every install, e.g. 'transformers<5.24' (recorded)")
    args = ap.parse_args(argv)
    rev = run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO).stdout.strip()
    records = []
    with tempfile.TemporaryDirectory(prefix="ro-runtime-", dir=args.workdir) as t:
        for v in [x.strip() for x in args.vllm.split(",") if x.strip()]:
            records.append(one(v, Path(t), Path(args.playbook).resolve(), args.pin))
            print(json.dumps(records[-1])[:600], file=sys.stderr)
    ok = [r["vllm"] for r in records if r.get("imports") == "yes" and str(r.get("runtime_check", "")).startswith("exit 0")]
    doc = {"command": "python benchmarks/evidence/runtime_sample.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "code_rev": rev, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "python": sys.version.split()[0],
           "summary": (f"a CPU machine, Python {sys.version.split()[0]}, no GPU"
                       + (f", pinned {', '.join(args.pin)}" if args.pin else "")
                       + f"; patched generator imports and check --runtime --strict exits 0 on: {', '.join(ok) or 'none'}"),
           "records": records}
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
