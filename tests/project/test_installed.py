"""The installed tool, as a user gets it: the sdist and the wheel built from a clean copy of the tree
(its tracked files), the wheel installed into a fresh venv outside the checkout, and the quick start
run in an empty directory (scripts/demo.sh with $REMOTE_OPS: sandbox up -> facts -> check -> patch
--yes -> check -> extract --tail -> verify -> status), then rollback, check --candidates (naming the
playbook that covers the host), playbooks --json and sandbox down. README "Install" names these
commands; the venv install here is README's third way (pip into a venv)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from remote_ops import __version__
from tests.conftest import REPO


def _clean_copy(dest: Path) -> Path:
    """The tracked files of the checkout (what a clone has), else the tree without build outputs."""
    if (REPO / ".git").exists():
        names = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
        for rel in filter(None, names.decode().split("\0")):
            src = REPO / rel
            if src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
    else:
        shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(".venv", "*.egg-info", "__pycache__", ".remote-ops",
                                                                   "build", "dist"))
    return dest


def _run(cmd, timeout=600, **kw):
    t0 = time.monotonic()
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    sys.__stdout__.write(f"\n[timing] {' '.join(map(str, cmd[:4]))}: {time.monotonic() - t0:.1f} s\n")
    return proc


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The sdist and the wheel built from a clean copy (once per test process): (clone, sdist, wheel)."""
    tmp = tmp_path_factory.mktemp("built")
    src = _clean_copy(tmp / "clone")
    dist = tmp / "dist"
    # sdist first, then the wheel built FROM the sdist (python -m build's default): the sdist is complete
    proc = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, src])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return src, next(dist.glob("remote_ops-*.tar.gz")), next(dist.glob("remote_ops-*.whl"))


@pytest.mark.long
def test_the_wheel_runs_the_quick_start_from_an_empty_directory(tmp_path, built):
    src, sdist, wheel = built
    assert f"-{__version__}" in wheel.name and f"-{__version__}." in sdist.name
    with tarfile.open(sdist) as t:
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    tests = {p.relative_to(src).as_posix() for p in (src / "tests").rglob("*.py")}
    assert "tests/conftest.py" in tests and tests <= in_sdist, sorted(tests - in_sdist)[:5]
    for need in ("scripts/demo.sh", "scripts/test.sh", "CHANGELOG.md", "inventory.yaml",
                 "remote_ops/playbook/shipped/eagle3-speculators-0.3.0.yaml",
                 "remote_ops/playbook/shipped/eagle3-speculators-0.9.0.yaml",
                 "remote_ops/playbook/shipped/scripts/extract_hidden_states.py"):
        assert need in in_sdist, f"the sdist lacks {need}"
    with zipfile.ZipFile(wheel) as z:
        in_wheel = set(z.namelist())
    shipped = {p.relative_to(REPO).as_posix() for p in (REPO / "remote_ops" / "playbook" / "shipped").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert shipped and shipped <= in_wheel, shipped - in_wheel
    assert "remote_ops/agent/outputs/run_identity.py" in in_wheel and "remote_ops/sandbox_assets/extract_standin.py" in in_wheel

    # a fresh venv outside the checkout, the wheel and its dependencies (from the package index)
    venv = tmp_path / "tool-venv"
    base = getattr(sys, "_base_executable", None) or sys.executable
    assert _run([base, "-m", "venv", venv]).returncode == 0
    proc = _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ro = venv / "bin" / "remote-ops"
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("REMOTE_OPS_INVENTORY", "REMOTE_OPS_SANDBOX_DIR",
                                                             "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"

    def ro_run(*args, timeout=600):
        return _run([ro, *args], timeout=timeout, cwd=empty, env=env)

    version = ro_run("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"remote-ops {__version__}", version.stdout
    # imported from the venv, never from the checkout
    where = _run([venv / "bin" / "python", "-c", "import remote_ops; print(remote_ops.__file__)"], cwd=empty, env=env)
    assert where.stdout.startswith(str(venv)), where.stdout
    try:
        demo = _run(["bash", REPO / "scripts" / "demo.sh"], timeout=900, cwd=empty, env=dict(env, REMOTE_OPS=str(ro)))
        out = demo.stdout + demo.stderr
        assert demo.returncode == 0, out[-4000:]
        assert "verified: 4 targeted findings gone" in out and "Done." in out, out[-4000:]
        assert (empty / "inventory.yaml").exists() and "sandbox:" in (empty / "inventory.local.yaml").read_text()
        assert "playbook: eagle3-speculators-0.3.0" in (empty / "inventory.local.yaml").read_text()

        proc = ro_run("check", "sandbox", "--candidates", "--json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = {r["release"]: r for r in json.loads(proc.stdout)["rows"]}
        assert rows["0.3.0"]["installed"] and rows["0.3.0"]["playbooks"] == ["eagle3-speculators-0.3.0"], rows["0.3.0"]

        proc = ro_run("playbooks", "--json")
        assert proc.returncode == 0, proc.stderr
        listed = json.loads(proc.stdout)["playbooks"]
        assert {r["name"] for r in listed} == {"eagle3-speculators-0.3.0", "eagle3-speculators-0.9.0",
                                              "eagle3-speculators-0.9.0-no-chunked-prefill"}
        assert all(r["origin"] == "shipped" and r["path"].startswith(str(venv)) for r in listed), listed

        proc = ro_run("rollback", "sandbox")
        assert proc.returncode == 0, proc.stderr[-3000:]
        proc = ro_run("check", "sandbox")
        assert proc.returncode == 1, proc.stdout[-3000:]          # the findings are back
        status = ro_run("sandbox", "status")
        assert status.returncode == 0 and str(empty / ".remote-ops" / "sandbox") in status.stdout, status.stdout
    finally:
        down = ro_run("sandbox", "down", "--purge", "--json")
    assert down.returncode == 0 and json.loads(down.stdout)["stopped"], down.stdout + down.stderr


def _tool_env(tmp_path: Path, **extra: str) -> dict:
    """The environment of a user's shell for an installed tool: no checkout inventory, sandbox, venv or
    PYTHONPATH of the suite."""
    env = {k: v for k, v in os.environ.items() if k not in ("REMOTE_OPS_INVENTORY", "REMOTE_OPS_SANDBOX_DIR",
                                                             "PYTHONPATH", "VIRTUAL_ENV")}
    env["HOME"] = str(tmp_path / "home")      # nothing of the user's own pipx/uv config or tools
    (tmp_path / "home").mkdir()
    env.update(extra)
    return env


def _installer(tmp_path: Path, package: str) -> Path:
    """A fresh venv holding ``package`` from the package index (pipx or uv, as a user gets them); its bin/."""
    venv = tmp_path / f"{package}-venv"
    base = getattr(sys, "_base_executable", None) or sys.executable
    assert _run([base, "-m", "venv", venv]).returncode == 0
    proc = _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", package])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return venv / "bin"


def _installed_tool_runs(ro: Path, home: Path, tmp_path: Path, env: dict) -> None:
    """--version and playbooks --json from an empty directory: the shipped playbooks are the installed copy's."""
    empty = tmp_path / "empty"
    empty.mkdir()
    version = _run([ro, "--version"], cwd=empty, env=env)
    assert version.returncode == 0 and version.stdout.strip() == f"remote-ops {__version__}", \
        version.stdout + version.stderr
    proc = _run([ro, "playbooks", "--json"], cwd=empty, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    listed = json.loads(proc.stdout)["playbooks"]
    assert {r["name"] for r in listed} == {"eagle3-speculators-0.3.0", "eagle3-speculators-0.9.0",
                                          "eagle3-speculators-0.9.0-no-chunked-prefill"}
    assert all(r["origin"] == "shipped" and r["path"].startswith(str(home)) for r in listed), listed
    assert os.listdir(empty) == []


@pytest.mark.long
def test_pipx_installs_the_wheel_as_a_command(tmp_path, built):
    """README "Install": ``pipx install dist/remote_ops-*.whl`` (pipx from the package index; its
    home and bin directory in the test's tmp dir)."""
    _src, _sdist, wheel = built
    bin_ = _installer(tmp_path, "pipx")
    home, tool_bin = tmp_path / "pipx-home", tmp_path / "pipx-bin"
    env = _tool_env(tmp_path, PIPX_HOME=str(home), PIPX_BIN_DIR=str(tool_bin), PIPX_MAN_DIR=str(tmp_path / "pipx-man"),
                    PATH=f"{bin_}:{os.environ.get('PATH', '')}")
    proc = _run([bin_ / "pipx", "install", wheel], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _installed_tool_runs(tool_bin / "remote-ops", home, tmp_path, env)


@pytest.mark.long
def test_uv_tool_installs_the_wheel_as_a_command(tmp_path, built):
    """README "Install": ``uv tool install dist/remote_ops-*.whl`` (uv from the package index; its tool
    and bin directories and cache in the test's tmp dir). ``--python`` names this machine's
    interpreter and Python downloads are off: uv never fetches a Python of its own here."""
    _src, _sdist, wheel = built
    bin_ = _installer(tmp_path, "uv")
    home, tool_bin = tmp_path / "uv-tools", tmp_path / "uv-bin"
    base = getattr(sys, "_base_executable", None) or sys.executable
    env = _tool_env(tmp_path, UV_TOOL_DIR=str(home), UV_TOOL_BIN_DIR=str(tool_bin),
                    UV_CACHE_DIR=str(tmp_path / "uv-cache"), UV_PYTHON_DOWNLOADS="never",
                    PATH=f"{bin_}:{os.environ.get('PATH', '')}")
    proc = _run([bin_ / "uv", "tool", "install", "--python", base, wheel], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _installed_tool_runs(tool_bin / "remote-ops", home, tmp_path, env)
