"""The unpacked-sources cache (remote_ops/pkgsource.py) as the suite and the sandbox share it: venvs
link its directories through .pth files, so any interpreter importing a package from there writes
``__pycache__`` into it. A release's listing, key and zip (check/candidates.py) stay its own."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from remote_ops import pkgsource
from remote_ops.check import candidates


def wheel(path: Path, files: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)


def test_bytecode_written_into_an_unpacked_release_is_not_part_of_it(tmp_path, monkeypatch):
    monkeypatch.setenv("REMOTE_OPS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "wheels").mkdir(parents=True)
    wheel(tmp_path / "cache" / "wheels" / "toylib-1.0-py3-none-any.whl",
          {"toylib/__init__.py": "from .core import make\n", "toylib/core.py": "def make(a):\n    return a\n",
           "toylib-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: toylib\nVersion: 1.0\n\n"})
    monkeypatch.setattr(candidates, "_keys", {})
    root, files = pkgsource.source_files("toylib", "1.0")
    assert files == ["toylib-1.0.dist-info/METADATA", "toylib/__init__.py", "toylib/core.py"]
    key = candidates.release_key("toylib", "1.0")
    blob = candidates.release_zip("toylib", "1.0")
    # another interpreter imports the package from the cache, writing its bytecode as Python does
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(root)
    subprocess.run([sys.executable, "-c", "import toylib"], env=env, check=True, stdin=subprocess.DEVNULL)
    assert sorted(p.name for p in (root / "toylib" / "__pycache__").iterdir())
    assert pkgsource.source_files("toylib", "1.0") == (root, files)
    monkeypatch.setattr(candidates, "_keys", {})
    assert candidates.release_key("toylib", "1.0") == key
    assert candidates.release_zip("toylib", "1.0") == blob
    assert zipfile.ZipFile(io.BytesIO(blob)).namelist() == files
    # the key is the release's bytes: a changed module is another key
    (root / "toylib" / "core.py").write_text("def make(a, b):\n    return a\n")
    monkeypatch.setattr(candidates, "_keys", {})
    assert candidates.release_key("toylib", "1.0")[0] != key[0]
