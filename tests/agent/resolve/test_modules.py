"""resolve_modules: finding and parsing modules without importing them (ModuleIndex, ModInfo)."""

from __future__ import annotations

import ast

from remote_ops.agent.resolve.modules import ModInfo, ModuleIndex
from tests.resolver_lib import write_lib


def test_finds_packages_submodules_and_namespace_packages(tmp_path):
    write_lib(tmp_path, {"p/__init__.py": "", "p/sub/__init__.py": "", "p/sub/m.py": "x = 1\n",
                         "ns/only.py": "y = 2\n"})
    idx = ModuleIndex([str(tmp_path)])
    assert idx.module_file("p.sub.m") == str(tmp_path / "p" / "sub" / "m.py")
    assert idx.module_file("ns") == ""                       # namespace package: no file
    assert idx.module_file("p.nothere") is None
    assert idx.find_spec("p.sub.m") is idx.find_spec("p.sub.m")   # computed once
    assert idx.module("ns.only").kind == "module"
    assert isinstance(idx.load("ns"), ModInfo) and idx.load("ns").path == "<namespace ns>"


def test_never_imports_and_reports_why_a_module_cannot_be_read(tmp_path):
    write_lib(tmp_path, {"p/__init__.py": "raise SystemExit('imported!')\n", "p/bad.py": "def f(:\n",
                         "p/ext.so": ""})
    idx = ModuleIndex([str(tmp_path)])
    assert isinstance(idx.load("p"), ModInfo)                # parsed, not run
    bad = idx.load("p.bad")
    assert bad.kind == "unknown" and "cannot parse" in bad.reason
    assert idx.load("nope").kind == "missing" and "no module named 'nope'" in idx.load("nope").reason
    assert idx.load("").kind == "missing"


def test_override_sources_replace_the_file_text(tmp_path):
    write_lib(tmp_path, {"p/__init__.py": "", "p/m.py": "def old(): pass\n"})
    idx = ModuleIndex([str(tmp_path)], {"p.m": "def new(): pass\n"})
    assert set(idx.load("p.m").names) == {"new"}


def _info(text, name="p.m", is_package=False):
    return ModInfo(name, "<test>", ast.parse(text), is_package)


def test_modinfo_collects_top_level_bindings():
    m = _info("import os.path\nimport numpy as np\nfrom .a import b as c\nfrom ..up import *\n"
              "try:\n    from x import fast\nexcept ImportError:\n    fast = None\n"
              "for i, j in []:\n    pass\nv: int = 1\nann: str\n"
              "def __getattr__(name):\n    raise AttributeError(name)\n")
    assert m.names["os"][:2] == ("module", "os")
    assert m.names["np"][:2] == ("module", "numpy")
    assert m.names["c"][:3] == ("from", "p.a", "b")
    assert m.stars == ["up"]                                 # two levels up from module p.m
    assert m.names["fast"][0] == "value"                     # the except branch is seen last
    assert m.names["i"][0] == m.names["j"][0] == "value"
    assert m.names["v"][0] == "value" and m.names["ann"][0] == "annotation"
    assert m.has_getattr and not m.maybe_dynamic


def test_modinfo_relative_imports_of_a_package_and_a_module():
    assert _info("from .a import b\n", "p.q", is_package=True).names["b"][1] == "p.q.a"
    assert _info("from .a import b\n", "p.q").names["b"][1] == "p.a"
    assert _info("from ..a import b\n", "p.q.r").names["b"][1] == "p.a"


def test_modinfo_all_literal_extend_and_opaque():
    assert _info("__all__ = ['a'] + ['b']\n__all__ += ('c',)\n__all__.extend(['d'])\n").all == ["a", "b", "c", "d"]
    assert _info("__all__ = ['a']\n__all__ += names()\n").all is None
    dyn = _info("globals().update({'x': 1})\n")
    assert dyn.maybe_dynamic and dyn.has_getattr


def test_modinfo_skips_type_checking_imports_but_keeps_the_else_branch():
    m = _info("import typing\nif typing.TYPE_CHECKING:\n    from a import T\nelse:\n    T = object\n")
    assert m.names["T"][0] == "value"


def test_package_files_reads_every_source_once(tmp_path):
    write_lib(tmp_path, {"p/__init__.py": "A = 1\n", "p/m.py": "B = 2\n", "p/sub/__init__.py": "",
                         "p/sub/k.py": "C = 3\n", "p/not-a-pkg/x.py": "D = 4\n", "p/data.txt": "E"})
    idx = ModuleIndex([str(tmp_path)])
    blob, starts, names = idx.package_files("p")
    assert names == ["p", "p.m", "p.sub", "p.sub.k"]
    ends = [s - 1 for s in starts[1:]] + [len(blob)]         # files are joined by one NUL byte
    assert [blob[s:e] for s, e in zip(starts, ends)] == [b"A = 1\n", b"B = 2\n", b"", b"C = 3\n"]
    assert idx.package_files("p") is idx.package_files("p")
    assert idx.package_files("nope") == (b"", [], [])


def test_parsed_trees_are_shared_by_text_not_by_name(tmp_path):
    """Two indexes over the same files share each module's parse (a patch's verification checks
    old and new text); an override or a changed file is other text, so it is parsed anew."""
    write_lib(tmp_path, {"p/__init__.py": "", "p/m.py": "def old(): pass\n"})
    a, b = ModuleIndex([str(tmp_path)]), ModuleIndex([str(tmp_path)])
    assert a.load("p.m").tree is b.load("p.m").tree
    over = ModuleIndex([str(tmp_path)], {"p.m": "def new(): pass\n"})
    assert set(over.load("p.m").names) == {"new"} and set(a.load("p.m").names) == {"old"}
    (tmp_path / "p" / "m.py").write_text("def changed(): pass\n")
    assert set(ModuleIndex([str(tmp_path)]).load("p.m").names) == {"changed"}
