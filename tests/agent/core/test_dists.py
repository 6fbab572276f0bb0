"""agent/core/dists.py's distribution finder: the same answers as importlib.metadata, without importing it."""

from __future__ import annotations

import importlib.metadata as md
import sys

from remote_ops.agent import facts
from remote_ops.agent.core import dists


def _dist(root, dirname, version, kind="dist-info"):
    d = root / dirname
    d.mkdir(parents=True)
    (d / ("METADATA" if kind == "dist-info" else "PKG-INFO")).write_text(
        f"Metadata-Version: 2.1\nName: {dirname.split('-')[0]}\nVersion: {version}\n\nVersion: not-a-header\n")
    return d


def test_first_entry_wins_names_normalized_and_absent(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _dist(a, "My_Pkg-1.0.dist-info", "1.0")
    _dist(b, "my_pkg-2.0.dist-info", "2.0")
    _dist(b, "other.egg-info", "0.5", kind="egg-info")
    (b / "single-3.0.egg-info").write_text("Metadata-Version: 1.0\nName: single\nVersion: 3.0\n")
    path = [str(a), str(b)]
    dists._DIST_DIRS.clear()
    assert dists.find_distribution("my-pkg", path) == ("1.0", str(a / "My_Pkg-1.0.dist-info"))
    assert dists.find_distribution("MY.PKG", [str(b)])[0] == "2.0"
    assert dists.find_distribution("other", path)[0] == "0.5"
    assert dists.find_distribution("single", path)[0] == "3.0"
    assert dists.find_distribution("absent", path) is None
    # importlib.metadata agrees on the same path
    assert next(md.distributions(name="my_pkg", path=path)).version == "1.0"


def test_agrees_with_importlib_metadata_on_this_interpreter():
    dists._DIST_DIRS.clear()
    for name in ("pyyaml", "paramiko", "libcst", "packaging", "rich", "pytest"):
        found = dists.find_distribution(name, sys.path)
        assert found is not None and found[0] == md.version(name), name
    assert dists.package_info("no-such-package-here") == {"name": "no-such-package-here", "present": False}
