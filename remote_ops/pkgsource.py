"""Real packages from PyPI, as sources only: download wheels once (cached), unpack the ``.py``
files and the ``.dist-info``, and lay them into a Python environment.

Used by the sandbox host, the tests and the benchmarks. Needs ``pip`` and the package index;
torch/CUDA are never needed because nothing here imports the packages.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path

from remote_ops.cachedir import cache_dir  # noqa: F401  (pkgsource.cache_dir is public)
from remote_ops.errors import RemoteOpsError


@contextmanager
def _locked(name: str):
    lock = cache_dir() / f".{name}.lock"
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _norm(name: str) -> str:
    return name.replace("-", "_").lower()


def fetch_wheel(name: str, version: str) -> Path:
    """The cached wheel of ``name==version``, downloaded with ``pip download --no-deps`` if missing."""
    wheels = cache_dir() / "wheels"
    wheels.mkdir(exist_ok=True)
    pattern = f"{_norm(name)}-{version}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    with _locked(f"wheel-{_norm(name)}-{version}"):
        found = sorted(wheels.glob(pattern))
        if found:
            return found[0]
        tmp = wheels / f".dl-{_norm(name)}-{version}-{os.getpid()}"
        tmp.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(tmp), f"{name}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = sorted(tmp.glob("*.whl"))
        if proc.returncode != 0 or not got:
            shutil.rmtree(tmp, ignore_errors=True)
            last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise RemoteOpsError(f"cannot download {name}=={version} from the package index: {last}",
                                 "check network access to PyPI, or put the wheel in " + str(wheels))
        target = wheels / got[0].name
        os.replace(got[0], target)
        shutil.rmtree(tmp, ignore_errors=True)
        return target


def unpacked(name: str, version: str) -> Path:
    """A cached directory holding only the ``.py`` files and ``.dist-info`` of the wheel."""
    dest = cache_dir() / "src" / f"{_norm(name)}-{version}"
    marker = dest / ".complete"
    if marker.exists():
        return dest
    wheel = fetch_wheel(name, version)
    with _locked(f"src-{_norm(name)}-{version}"):
        if marker.exists():
            return dest
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                top = info.filename.split("/", 1)[0]
                if info.is_dir():
                    continue
                if info.filename.endswith(".py") or (top.endswith(".dist-info") and "/" in info.filename) \
                        or info.filename.endswith(".pyi") or info.filename.endswith("py.typed"):
                    if top.endswith(".data"):
                        continue
                    zf.extract(info, tmp)
        (tmp / ".complete").write_text(wheel.name + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    return dest


def site_packages(python: str | Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def install_sources(site: Path, name: str, version: str, *, copy: bool) -> None:
    """Lay the unpacked package into ``site``: copied (can be patched) or linked by a ``.pth`` file."""
    src = unpacked(name, version)
    if copy:
        for entry in src.iterdir():
            if entry.name == ".complete":
                continue
            target = site / entry.name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(entry, target)
    else:
        (site / f"_remote_ops_{_norm(name)}.pth").write_text(str(src) + "\n")


def base_python() -> str:
    """A real interpreter to build venvs from (the base of the controller's own venv)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def torch_site() -> Path:
    """site-packages of a cached venv holding torch==2.13.0 (CPU) and tqdm, built once."""
    env = cache_dir() / "envs" / "torch-2.13.0"
    marker = env / ".complete"
    if not marker.exists():
        with _locked("torch-env"):
            if not marker.exists():
                shutil.rmtree(env, ignore_errors=True)
                subprocess.run([base_python(), "-m", "venv", str(env)], check=True)
                proc = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q",
                                       "--disable-pip-version-check", "torch==2.13.0", "tqdm", "numpy"],
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    raise RemoteOpsError("cannot install torch==2.13.0 for the sandbox: "
                                         + (proc.stderr.strip().splitlines() or ["?"])[-1])
                marker.write_text("ok\n")
    return site_packages(env / "bin" / "python")


PYARROW = "pyarrow>=15"       # what the sandbox's server-flow stand-in client reads prepared data with


def pyarrow_site() -> Path:
    """site-packages of a cached venv holding pyarrow (``PYARROW``), built once: the sandbox's
    server-flow host reads ``speculators prepare-data``'s Arrow directory with it, whether or not the
    controller itself has pyarrow (an installed wheel has not)."""
    env = cache_dir() / "envs" / "pyarrow"
    marker = env / ".complete"
    if not marker.exists():
        with _locked("pyarrow-env"):
            if not marker.exists():
                shutil.rmtree(env, ignore_errors=True)
                subprocess.run([base_python(), "-m", "venv", str(env)], check=True)
                proc = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q",
                                       "--disable-pip-version-check", PYARROW], capture_output=True, text=True)
                if proc.returncode != 0:
                    raise RemoteOpsError(f"cannot install {PYARROW} for the sandbox: "
                                         + (proc.stderr.strip().splitlines() or ["?"])[-1],
                                         "check access to the package index (pip install pyarrow)")
                marker.write_text("ok\n")
    return site_packages(env / "bin" / "python")


def make_env(dest: str | Path, packages: list[tuple[str, str]], *, copy: set[str] | None = None,
             with_torch: bool = False, with_pyarrow: bool = False) -> Path:
    """Create a venv at ``dest`` holding the real sources of ``packages``; returns its python.

    Packages named in ``copy`` (default: speculators) are copied so they can be patched; the others
    are linked read-only from the cache through a ``.pth`` file (fast, and they stay pristine).
    """
    dest = Path(dest)
    copy = {"speculators"} if copy is None else copy
    subprocess.run([base_python(), "-m", "venv", "--without-pip", str(dest)], check=True)
    python = dest / "bin" / "python"
    site = site_packages(python)
    for name, version in packages:
        install_sources(site, name, version, copy=name in copy)
    if with_torch:
        (site / "_remote_ops_torch.pth").write_text(str(torch_site()) + "\n")
    if with_pyarrow:
        (site / "_remote_ops_pyarrow.pth").write_text(str(pyarrow_site()) + "\n")
    return python


RELEASES_TTL_S = 24 * 3600


def releases(name: str, *, max_age_s: float = RELEASES_TTL_S) -> list[str]:
    """The final releases of ``name`` on the package index, oldest first (``pip index versions``),
    cached for ``max_age_s`` in ``<cache>/index/<name>.json`` (a list asked again within a day is
    not asked of the index)."""
    import json
    import time

    from packaging.version import InvalidVersion, Version

    path = cache_dir() / "index" / f"{_norm(name)}.json"
    try:
        entry = json.loads(path.read_text())
        if time.time() - float(entry["at"]) < max_age_s and isinstance(entry["versions"], list):
            return list(entry["versions"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    cmd = [sys.executable, "-m", "pip", "index", "versions", "--disable-pip-version-check", name]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.strip().startswith("Available versions:")), None)
    if proc.returncode != 0 or line is None:
        last = (proc.stderr.strip().splitlines() or ["no versions listed"])[-1]
        raise RemoteOpsError(f"cannot list the releases of {name} on the package index: {last}",
                             "check network access to PyPI")
    found = []
    for v in line.split(":", 1)[1].split(","):
        try:
            ver = Version(v.strip())
        except InvalidVersion:
            continue
        if not ver.is_prerelease and not ver.is_devrelease:
            found.append(ver)
    versions = [str(v) for v in sorted(set(found))]
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"at": time.time(), "versions": versions}))
    os.replace(tmp, path)
    return versions


def source_files(name: str, version: str) -> tuple[Path, list[str]]:
    """(root, sorted relative paths) of the unpacked ``.py`` and ``.dist-info`` files of a release.

    Not the bytecode that an interpreter importing them from here writes beside them (a sandbox job, a
    test's host agent: ``__pycache__``): what is listed, and so a release's key and zip, stays the
    release's own, whoever imported it meanwhile."""
    root = unpacked(name, version)
    files = sorted(str(rel) for rel in (p.relative_to(root) for p in root.rglob("*") if p.is_file())
                   if str(rel) != ".complete" and "__pycache__" not in rel.parts)
    return root, files
