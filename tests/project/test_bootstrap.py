"""scripts/bootstrap.sh's install step, on a copy of the checkout whose .venv python only records
what it is asked to run: the test install (``--test``, scripts/test.sh) also stands for the plain
one that scripts/demo.sh asks for, so the demo run by the suite does not reinstall the package."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO



def checkout(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "bootstrap.sh", root / "scripts" / "bootstrap.sh")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    log = tmp_path / "venv-python.log"
    py = root / ".venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    py.chmod(0o755)
    return root, log


def bootstrap(root: Path, *args: str) -> None:
    subprocess.run(["bash", str(root / "scripts" / "bootstrap.sh"), *args], check=True,
                   stdin=subprocess.DEVNULL, capture_output=True, env=dict(os.environ))


def test_the_test_install_stands_for_the_plain_one(tmp_path):
    root, log = checkout(tmp_path)
    (root / ".venv" / ".remote-ops-installed-test").touch()
    bootstrap(root)                                  # the test install is there: nothing to do
    assert not log.exists()
    os.utime(root / "pyproject.toml")                # the project changed since: the plain install
    os.utime(root / ".venv" / ".remote-ops-installed-test", (1, 1))
    bootstrap(root)
    assert log.read_text().splitlines()[-1].endswith(f"-e {root}")
