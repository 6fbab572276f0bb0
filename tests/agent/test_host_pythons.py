"""The agent runs on whatever Python the host has (>= 3.10): check, patch and rollback end to end with
host interpreters 3.10, 3.12 and 3.13 (those this machine has; the others are skipped with the reason)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from remote_ops import pkgsource
from tests.conftest import REPO, SPECULATORS, VLLM_NEW

PYENV = Path(os.path.expanduser("~/.pyenv/versions"))


def _interpreter(minor: str) -> str | None:
    for cand in sorted(PYENV.glob(f"{minor}.*")) if PYENV.is_dir() else []:
        if (cand / "bin" / "python").exists():
            return str(cand / "bin" / "python")
    return shutil.which(f"python{minor}")


@pytest.mark.parametrize("minor", ["3.10", "3.12", "3.13"])
def test_check_patch_rollback_with_host_python(minor, sshd, tmp_path, cli):
    base = _interpreter(minor)
    if base is None:
        pytest.skip(f"no Python {minor} on this machine")
    venv = tmp_path / "venv"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = pkgsource.site_packages(python)
    pkgsource.install_sources(site, *SPECULATORS, copy=True)
    pkgsource.install_sources(site, *VLLM_NEW, copy=False)
    target = site / "speculators" / "data_generation" / "vllm_hidden_states_generator.py"
    original = target.read_bytes()
    from tests.conftest import write_inventory
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(
        str(python), env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state")},
        playbook=str(REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"))})

    status, out, err = cli("facts", "--json", "-i", str(inv))
    assert status == 0, err
    assert json.loads(out)["python"]["version"].startswith(minor + ".")
    status, out, err = cli("check", "--json", "-i", str(inv))
    assert status == 1, err
    assert len(json.loads(out)["findings"]) == 4 and json.loads(out)["unknown"] == []
    status, out, err = cli("patch", "--yes", "-i", str(inv))
    assert status == 0, err
    status, out, err = cli("check", "--json", "-i", str(inv))
    assert status == 0 and json.loads(out)["findings"] == [], out
    pyc = list((target.parent / "__pycache__").glob(f"{target.stem}.cpython-{minor.replace('.', '')}*.pyc"))
    assert pyc, "the host's own bytecode for the patched module was refreshed"
    status, out, err = cli("rollback", "-i", str(inv))
    assert status == 0, err
    assert target.read_bytes() == original
