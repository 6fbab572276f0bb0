"""Build the bundle that benchmarks/gpu/extract_check.py installs on an offline GPU machine.

The lent H200 machines have torch 2.11.0 (cu130), Python 3.12 and no network (../shared/GPU-NOTES.md):
vLLM 0.20.0 (which pins that torch) and everything it needs to import must travel. This script does
what the committed GPU results used, from PyPI, with exact versions:

- `site/`: vLLM 0.20.0 without `_vllm_fa2_C` (Hopper runs FlashAttention 3 from `_vllm_fa3_C`; `_moe_C`
  is kept: mixture-of-experts models such as DeepSeek-V3 / Kimi-K2.5 need it), the small wheels vLLM
  needs to import, speculators 0.3.0 and libcst (for the controller); xgrammar's static library dropped;
- one folder per `benchmarks/gpu/wheels/<name>.txt` (a `name==version` per line): those wheels, for the
  harnesses that need more than the generator path (vLLM's `LLM`, its API server, another speculators);
- `tf/`: transformers 4.57.6 + huggingface_hub + tokenizers, first on the job's path (speculators 0.3.0
  cannot be imported under the machine's transformers 5.x);
- `bundle.tar.gz` split into parts below the device tool's per-call limit, and SHA256SUMS.
- `baseline.tar.gz`: vLLM 0.11.0's sources from the controller's wheel cache (drift's baseline offline).
- with `--apart spec090/pyarrow,spec090/pandas`: those packages (and their .dist-info/.libs) go into
  `apart.tar.gz`, split into `apart.NN`, instead of the bundle: the machine has its own pyarrow and
  pandas, so they travel only when its versions do not fit (a look at the machine first costs nothing).

    python benchmarks/gpu/lib/bundle.py --out .gpu      # then carry .gpu/part.NN one per call (see GPU-NOTES.md)
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

VLLM = "vllm==0.20.0"
DROP_FROM_VLLM = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",)
EXTRA = REPO / "benchmarks" / "gpu" / "wheels"
SITE = ["annotated_types==0.8.0", "blake3==1.0.11", "cachetools==8.0.2", "cbor2==6.3.0", "distro==1.9.0",
        "gguf==0.19.0", "jiter==0.19.0", "libcst==1.9.0", "llguidance==1.3.0", "loguru==0.7.3",
        "msgspec==0.23.0", "openai==2.54.0",   # openai 3.x needs httpx2 (the machine has httpx): the import probe caught it
        "openai_harmony==0.0.8", "pybase64==1.5.1", "pydantic==2.12.5", "pydantic_core==2.41.5",
        "pyzmq==27.3.0", "setproctitle==1.3.8", "sniffio==1.3.1", "speculators==0.3.0",
        "typing_extensions==4.16.0", "typing_inspection==0.4.5", "xgrammar==0.1.33"]
TF = ["transformers==4.57.6", "huggingface_hub==0.36.2", "tokenizers==0.22.2"]
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"] + [
    x for n in ("2_35", "2_34", "2_31", "2_28", "2_27", "2_26", "2_24", "2_17", "2_5")
    for x in ("--platform", f"manylinux_{n}_x86_64")] + ["--platform", "manylinux2014_x86_64",
                                                          "--platform", "manylinux1_x86_64"]
PART_BYTES = 52 * 2**20       # one part per device call, with the working tree, under its 64 MiB


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], check=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".gpu", help="folder for the wheels, the bundle and its parts")
    ap.add_argument("--apart", default="", help="comma list of DIR/package to pack into apart.tar.gz instead")
    args = ap.parse_args(argv)
    apart = [a.strip() for a in args.apart.split(",") if a.strip()]
    out = Path(args.out)
    wheels, bundle = out / "wheels", out / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    for sub in ("site", "tf", "vllm"):
        (wheels / sub).mkdir(parents=True, exist_ok=True)
    pip("download", "--no-deps", *PLATFORM, "-d", str(wheels / "site"), *SITE)
    pip("download", "--no-deps", *PLATFORM, "-d", str(wheels / "tf"), *TF)
    pip("download", "--no-deps", *PLATFORM, "-d", str(wheels / "vllm"), VLLM)
    extra = {f.stem: [ln.split("#")[0].strip() for ln in f.read_text().splitlines() if ln.split("#")[0].strip()]
             for f in sorted(EXTRA.glob("*.txt"))}
    for sub, reqs in extra.items():
        (wheels / sub).mkdir(parents=True, exist_ok=True)
        pip("download", "--no-deps", *PLATFORM, "-d", str(wheels / sub), *reqs)
    lists = {"site": SITE, "tf": TF, **extra}
    for sub in lists:
        wanted = {s.split("==")[0].lower().replace("-", "_") for s in lists[sub]}
        files = [str(w) for w in sorted((wheels / sub).glob("*.whl"))
                 if w.name.split("-")[0].lower().replace("-", "_") in wanted]
        pip("install", "--no-deps", "--no-compile", "--no-index", *PLATFORM, "--target", str(bundle / sub), *files)
    (vllm_whl,) = sorted((wheels / "vllm").glob("vllm-0.20.0-*.whl"))
    with zipfile.ZipFile(vllm_whl) as zf:
        for info in zf.infolist():
            if info.filename not in DROP_FROM_VLLM:
                zf.extract(info, bundle / "site")
    for junk in list(bundle.rglob("libxgrammar.a")) + list(bundle.rglob("__pycache__")):
        shutil.rmtree(junk) if junk.is_dir() else junk.unlink()
    def is_apart(rel: str) -> bool:   # "spec090/pyarrow" also takes pyarrow-24.0.0.dist-info and pyarrow.libs
        return any(rel == a or rel.startswith((a + "/", a + "-", a + ".")) for a in apart)
    tar = out / "bundle.tar.gz"
    with tarfile.open(tar, "w:gz", compresslevel=6) as tf:
        for sub in lists:
            tf.add(bundle / sub, sub, filter=lambda ti: None if is_apart(ti.name) else ti)
    tars = [(tar, "part")]
    if apart:
        atar = out / "apart.tar.gz"
        with tarfile.open(atar, "w:gz", compresslevel=6) as tf:
            for sub in lists:
                for child in sorted((bundle / sub).iterdir()):
                    if is_apart(f"{sub}/{child.name}"):
                        tf.add(child, f"{sub}/{child.name}")
        tars.append((atar, "apart"))
    for old in list(out.glob("part.*")) + list(out.glob("apart.*")):
        if old.name != "apart.tar.gz":
            old.unlink()
    sums = []
    for t, prefix in tars:
        with open(t, "rb") as fh:
            i = 0
            while chunk := fh.read(PART_BYTES):
                part = out / f"{prefix}.{i:02d}"
                part.write_bytes(chunk)
                sums.append(f"{hashlib.sha256(chunk).hexdigest()}  {part.name}")
                i += 1
        sums.insert(0, f"{hashlib.sha256(t.read_bytes()).hexdigest()}  {t.name}")
    from remote_ops import pkgsource
    base = pkgsource.unpacked("vllm", "0.11.0")
    with tarfile.open(out / "baseline.tar.gz", "w:gz") as tf:
        tf.add(base, base.name)
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    print("\n".join(sums))
    print(f"parts of at most {PART_BYTES >> 20} MiB; baseline.tar.gz: vLLM 0.11.0 sources for drift")
    return 0


if __name__ == "__main__":
    sys.exit(main())
