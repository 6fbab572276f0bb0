"""Small hand-made libraries on disk for the static resolver's part tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from remote_ops.agent.resolve.resolver import StaticResolver


def write_lib(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def lib(tmp_path):
    """``lib({"p/__init__.py": "...", ...})`` -> a StaticResolver over those files only."""
    def make(files, **kw):
        return StaticResolver([str(write_lib(tmp_path, files))], **kw)
    return make


def params(sig):
    return [(p.name, p.kind, p.default) for p in sig.params]
