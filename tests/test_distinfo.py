"""agent/distinfo.py: versions of installed distributions as importlib.metadata finds them,
without importing it (compared with importlib.metadata on real and hand-made layouts)."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import zipfile

import pytest

from remote_ops.agent import distinfo


def _md_order(path):
    return [str(d._path) for d in md.distributions(path=path)]


def _md_version(name, path):
    try:
        return True, next(iter(md.Distribution.discover(name=name, path=path))).version
    except StopIteration:
        return False, None


def test_same_answers_as_importlib_metadata_on_this_interpreter():
    path = [p for p in sys.path if not p.endswith(".zip")]
    assert list(distinfo.distributions(path)) == _md_order(path)
    names = {d.metadata["Name"] for d in md.distributions(path=path)}
    assert len(names) > 10
    for name in sorted(names) + ["no-such-dist-xyz", "PyYAML", "pyyaml", "Paramiko"]:
        assert distinfo.version(name, path) == _md_version(name, path), name
        if distinfo.find(name, path):
            assert distinfo.headers(distinfo.find(name, path))["name"] == \
                next(iter(md.Distribution.discover(name=name, path=path))).metadata["Name"]


def test_same_answers_on_a_hand_made_layout(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
    (a / "Foo_Bar-1.0.dist-info").mkdir()
    (a / "Foo_Bar-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: Foo.Bar\nVersion: 1.0  \n\nbody\nVersion: 9\n")
    (b / "foo_bar-2.0.dist-info").mkdir()                        # shadowed by a/
    (b / "foo_bar-2.0.dist-info" / "METADATA").write_text("Name: foo-bar\nVersion: 2.0\n")
    (a / "legacy-0.5.egg-info").mkdir()                         # PKG-INFO, not METADATA
    (a / "legacy-0.5.egg-info" / "PKG-INFO").write_text("Name: legacy\nVersion: 0.5\n")
    (b / "single-3.egg-info").write_text("Name: single\nVersion: 3\n")   # an .egg-info file
    (a / "noversion-1.dist-info").mkdir()
    (a / "noversion-1.dist-info" / "METADATA").write_text("Name: noversion\n")
    (a / "odd-1.dist-info").mkdir()
    (a / "odd-1.dist-info" / "METADATA").write_text("Name: odd\nnot a header\nVersion: 1\n")
    path = [str(a), str(b), str(tmp_path / "missing")]
    assert list(distinfo.distributions(path)) == _md_order(path)
    for name in ("foo.bar", "Foo-Bar", "foo_bar", "legacy", "single", "noversion", "odd", "absent"):
        assert distinfo.version(name, path) == _md_version(name, path), name
    assert distinfo.version("foo-bar", path) == (True, "1.0  ")   # trailing blanks kept, as email keeps them


def test_what_it_cannot_answer_the_same_way_is_left_to_importlib_metadata(tmp_path, monkeypatch):
    z = tmp_path / "dists.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("zipped-1.dist-info/METADATA", "Name: zipped\nVersion: 1\n")
    with pytest.raises(distinfo.Unsure):
        distinfo.find("zipped", [str(z)])
    (tmp_path / "x.egg").mkdir()
    with pytest.raises(distinfo.Unsure):
        distinfo.find("x", [str(tmp_path / "x.egg")])
    folded = tmp_path / "f"
    (folded / "fold-1.dist-info").mkdir(parents=True)
    (folded / "fold-1.dist-info" / "METADATA").write_text("Name: fold\nVersion: 1\n  .post1\n")
    with pytest.raises(distinfo.Unsure):
        distinfo.version("fold", [str(folded)])

    class Finder:
        def find_spec(self, *a):
            return None

        def find_distributions(self, *a, **k):
            return iter(())
    monkeypatch.setattr(sys, "meta_path", [Finder()] + sys.meta_path)
    with pytest.raises(distinfo.Unsure):
        distinfo.find("pyyaml", sys.path)
    # the agent's entry point then asks importlib.metadata, with the same answer
    assert distinfo.versions(["pyyaml", "no-such-dist-xyz"]) == {"pyyaml": md.version("pyyaml"),
                                                                  "no-such-dist-xyz": None}


def test_facts_and_patch_read_do_not_import_importlib_metadata(env_vllm017):
    """On a host whose distributions are plain directories (a venv), the agent's version lookups
    leave importlib.metadata unimported (it costs ~20 ms of every exec)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from remote_ops.agent import facts, distinfo; "
            "f = facts.package_info('vllm'); v = distinfo.versions(['speculators', 'nope']); "
            "print(f['version'], v['speculators'], v['nope'], 'importlib.metadata' in sys.modules)")
    import remote_ops
    from pathlib import Path
    root = str(Path(remote_ops.__file__).parent.parent)
    out = subprocess.run([str(env_vllm017), "-c", code, root], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0.17.0", "0.3.0", "None", "False"]
