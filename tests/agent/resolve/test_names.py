"""resolve_names: what ``module.name`` and a dotted expression inside a module resolve to."""

from __future__ import annotations

from tests.resolver_lib import lib  # noqa: F401  (fixture)


def test_imports_aliases_and_chains_reach_the_definition(lib):
    r = lib({"p/__init__.py": "from .a import Thing as Public\nfrom . import b\n",
             "p/a.py": "from .deep import Thing\n", "p/deep.py": "class Thing:\n    pass\nAlias = Thing\n",
             "p/b.py": "from p.deep import Alias\nimport p.deep\nimport p.deep as d\n"})
    for mod, name in (("p", "Public"), ("p.a", "Thing"), ("p.b", "Alias"), ("p.deep", "Alias")):
        e = r.lookup(mod, name)
        assert (e.kind, e.mod.name, e.qual) == ("class", "p.deep", "Thing"), (mod, name)
    b = r.module("p.b").mod
    assert r.resolve_dotted(b, "p.deep.Thing").qual == "Thing"
    assert r.resolve_dotted(b, "d.Thing").kind == "class"
    assert r.lookup("p", "b").kind == "module"


def test_star_imports_follow_all_or_the_public_names(lib):
    r = lib({"p/__init__.py": "from .x import *\nfrom .y import *\n",
             "p/x.py": "__all__ = ['only']\ndef only(): pass\ndef hidden(): pass\n",
             "p/y.py": "def pub(): pass\ndef _priv(): pass\nfrom .z import *\n", "p/z.py": "def deep(): pass\n"})
    assert r.lookup("p", "only").kind == "function"
    assert r.lookup("p", "hidden").kind == "missing"
    assert r.lookup("p", "pub").kind == "function"
    assert r.lookup("p", "_priv").kind == "missing"
    assert r.lookup("p", "deep").kind == "function"       # a star of a star


def test_missing_unknown_and_outside_names_say_why(lib):
    r = lib({"p/__init__.py": "from notinstalled import X\nimport typing\nfrom dataclasses import dataclass\n"
                              "from p.cycle_a import A\n",
             "p/cycle_a.py": "from p.cycle_b import A\n", "p/cycle_b.py": "from p.cycle_a import A\n"})
    gone = r.lookup("p", "nope")
    assert gone.kind == "missing" and "p has no attribute 'nope'" in gone.reason
    ni = r.lookup("p", "X")
    assert ni.kind == "unknown" and "notinstalled" in ni.reason and "not installed" in ni.reason
    assert r.lookup("p", "dataclass").special == "dataclasses.dataclass"   # known without parsing
    assert r.member(r.lookup("p", "typing"), "NamedTuple").special == "typing.NamedTuple"
    cyc = r.lookup("p", "A")
    assert cyc.kind == "unknown" and "import cycle" in cyc.reason
    assert r.lookup("p", "__version__").kind == "value"   # dunders exist on every module


def test_resolve_dotted_builtins_and_undefined_names(lib):
    r = lib({"p/__init__.py": "class C:\n    def m(self): pass\n    class Inner:\n        pass\n"})
    m = r.module("p").mod
    assert r.resolve_dotted(m, "dict").special == "builtins.dict"
    undef = r.resolve_dotted(m, "nowhere.x")
    assert undef.kind == "unknown" and "'nowhere' is not defined in p" in undef.reason
    assert r.resolve_dotted(m, "C.m").kind == "function"
    assert r.resolve_dotted(m, "C.Inner").kind == "class"
    assert r.resolve_dotted(m, "C.absent").kind == "missing"
