"""Unit tests of the static signature model: binding simulation and resolution rules."""

from __future__ import annotations

import textwrap

import pytest

from remote_ops.agent.resolve.resolver import StaticResolver
from remote_ops.agent.resolve.sigmodel import (KWONLY, POSKW, POSONLY, VARKW, VARPOS, Parameter, Signature, Unknown,
                                               bind)


def sig(*params):
    return Signature([Parameter(*p) for p in params], "static")


@pytest.mark.parametrize("params,call,expected", [
    ([("a", POSKW), ("b", POSKW, "1")], (1, False, [], False), []),
    ([("a", POSKW)], (2, False, [], False), ["too-many-positional"]),
    ([("a", POSKW)], (0, False, ["b"], False), ["unexpected-keyword", "missing-argument"]),
    ([("a", POSKW)], (0, True, [], False), []),                     # f(*xs): count unknown
    ([("a", POSKW), ("k", KWONLY)], (0, True, [], False), ["missing-argument"]),
    ([("a", POSKW)], (0, False, [], True), []),                     # f(**kw): never missing
    ([("a", POSKW)], (0, False, ["zz"], True), ["unexpected-keyword"]),
    ([("a", POSONLY)], (0, False, ["a"], False), ["unexpected-keyword", "missing-argument"]),
    ([("a", POSONLY), ("kw", VARKW)], (1, False, ["a"], False), []),
    ([("args", VARPOS), ("kw", VARKW)], (5, False, ["x", "y"], False), []),
    ([("a", POSKW)], (1, False, ["a"], False), ["unexpected-keyword"]),  # multiple values
])
def test_bind(params, call, expected):
    assert [k for k, _, _ in bind(sig(*params), *call)] == expected


def test_render():
    s = sig(("x", POSONLY), ("a", POSKW, "1", "int"), ("rest", VARPOS), ("k", KWONLY), ("kw", VARKW))
    assert s.render() == "(x, /, a: int = 1, *rest, k, **kw)"
    assert sig(("a", POSKW), ("k", KWONLY, "2")).render() == "(a, *, k=2)"


@pytest.fixture
def lib(tmp_path):
    def make(files):
        for rel, text in files.items():
            p = tmp_path / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(textwrap.dedent(text))
        return StaticResolver([str(tmp_path)])
    return make


def _sig(r, mod, name):
    return r.signature(r.lookup(mod, name))


def test_c3_mro_picks_the_right_init(lib):
    r = lib({"p/__init__.py": "", "p/m.py": """
        class A:
            def __init__(self, a): pass
        class B(A):
            pass
        class C(A):
            def __init__(self, c): pass
        class D(B, C):
            pass
    """})
    assert [p.name for p in _sig(r, "p.m", "D").params] == ["c"]


def test_all_limits_star_reexport_and_type_checking_imports_do_not_count(lib):
    r = lib({"p/__init__.py": "from .impl import *\n", "p/impl.py": """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from os import path
        __all__ = ["a"]
        def a(): pass
        def b(): pass
    """})
    assert r.lookup("p", "a").kind == "function"
    assert r.lookup("p", "b").kind == "missing"
    assert r.lookup("p.impl", "path").kind == "missing"
    assert r.lookup("p", "impl").kind == "module"       # submodule of a package


@pytest.mark.parametrize("body,reason", [
    ("import enum\nclass C(enum.Enum):\n    X = 1\n", "Enum"),
    ("class M(type):\n    def __call__(cls, *a):\n        pass\nclass C(metaclass=M):\n    pass\n", "metaclass"),
    ("class M(type):\n    def __new__(mcs, n, b, ns):\n        return super().__new__(mcs, n, b, ns)\n"
     "class B(metaclass=M):\n    pass\nclass C(B):\n    def __init__(self, a):\n        pass\n", "inherits from B"),
    ("class B:\n    def __new__(cls, a):\n        pass\nclass C(B):\n    def __init__(self, a, b):\n        pass\n",
     "__new__"),
    ("class C:\n    def __new__(cls, x):\n        pass\n", "__new__"),
    ("import somewhere_else\nclass C(somewhere_else.Base):\n    pass\n", "somewhere_else"),
    ("def deco(c):\n    c.x = 1\n    return c\n@deco\nclass C:\n    pass\n", "deco"),
    ("class C(dict):\n    pass\n", "builtin"),
])
def test_undeterminable_classes_are_unknown_with_reason(lib, body, reason):
    r = lib({"p/__init__.py": "", "p/m.py": body})
    s = _sig(r, "p.m", "C")
    assert isinstance(s, Unknown) and reason in s.reason


def test_namedtuple_and_inherited_dataclass_fields(lib):
    r = lib({"p/__init__.py": "", "p/m.py": """
        from typing import NamedTuple
        from dataclasses import dataclass, field
        class NT(NamedTuple):
            a: int
            b: int = 2
        @dataclass
        class Base:
            x: int
            y: int = 0
        @dataclass
        class Child(Base):
            y: int = 5
            z: list = field(default_factory=list)
    """})
    assert [(p.name, p.required) for p in _sig(r, "p.m", "NT").params] == [("a", True), ("b", False)]
    assert [(p.name, p.default) for p in _sig(r, "p.m", "Child").params] == [
        ("x", None), ("y", "5"), ("z", "<factory list>")]


def test_explicit_init_beats_dataclass(lib):
    r = lib({"p/__init__.py": "", "p/m.py": """
        from dataclasses import dataclass
        @dataclass
        class T:
            tensors: dict
            extra: int
            def __init__(self, tensors, extra=None):
                pass
    """})
    assert [(p.name, p.required) for p in _sig(r, "p.m", "T").params] == [("tensors", True), ("extra", False)]
