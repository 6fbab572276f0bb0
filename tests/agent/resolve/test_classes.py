"""resolve_classes: bases, C3 MRO, class kinds, decorators, metaclasses and class attributes."""

from __future__ import annotations

import pytest

from remote_ops.agent.resolve.sigmodel import Unknown
from tests.resolver_lib import lib  # noqa: F401  (fixture)


def test_mro_is_c3_across_modules(lib):
    r = lib({"p/__init__.py": "", "p/base.py": "class O:\n    pass\nclass A(O):\n    pass\nclass B(O):\n    pass\n",
             "p/m.py": "from typing import Generic\nfrom p.base import A, B\nclass C(A, B, Generic):\n    pass\n"})
    mro = r.mro(r.lookup("p.m", "C"))
    assert [e.special or e.qual for e in mro] == ["C", "A", "B", "O", "typing.Generic"]


def test_inconsistent_or_unresolvable_bases_stay_visible(lib):
    r = lib({"p/__init__.py": "", "p/m.py": "class X:\n    pass\nclass Y(X):\n    pass\n"
                                            "class Bad(X, Y):\n    pass\nclass Dyn(make()):\n    pass\n"})
    assert [e.qual for e in r.mro(r.lookup("p.m", "Bad"))][:1] == ["Bad"]   # no crash, depth-first fallback
    (base,) = r.base_ents(r.lookup("p.m", "Dyn"))
    assert base.kind == "unknown" and "expression" in base.reason


@pytest.mark.parametrize("src,kind", [
    ("import enum\nclass C(enum.IntEnum):\n    A = 1\n", "enum"),
    ("import msgspec\nclass C(msgspec.Struct):\n    a: int\n", "struct"),
    ("from pydantic import BaseModel\nclass C(BaseModel):\n    a: int\n", "model"),
    ("from typing import NamedTuple\nclass C(NamedTuple):\n    a: int\n", "namedtuple"),
    ("from typing_extensions import TypedDict\nclass C(TypedDict):\n    a: int\n", "typeddict"),
    ("from dataclasses import dataclass\n@dataclass(kw_only=True)\nclass C:\n    a: int\n", "dataclass"),
    ("import functools\n@functools.total_ordering\nclass C:\n    pass\n", "plain"),
])
def test_class_kind(lib, src, kind):
    r = lib({"p/__init__.py": "", "p/m.py": src})
    assert r.class_kind(r.lookup("p.m", "C"))[0] == kind


def test_library_decorators_identity_dataclass_wrapper_and_unknown(lib):
    r = lib({"p/__init__.py": "", "p/deco.py": """
        from dataclasses import dataclass
        def same(cls):
            return cls
        def config(cls):
            return dataclass(cls, kw_only=True)
        def register(cls):
            REGISTRY.append(cls)
            return cls
    """, "p/m.py": """
        from p.deco import same, config, register
        @same
        class A:
            pass
        @config
        class B:
            x: int
        @register
        class C:
            pass
    """})
    assert r.class_kind(r.lookup("p.m", "A")) == ("plain", None)
    k, opts = r.class_kind(r.lookup("p.m", "B"))
    assert k == "dataclass" and opts["maker"] == "dataclasses.dataclass"
    c = r.class_kind(r.lookup("p.m", "C"))
    assert isinstance(c, Unknown) and "register" in c.reason


def test_class_attr_methods_properties_fields_and_getattr(lib):
    r = lib({"p/__init__.py": "", "p/m.py": """
        import functools
        class Base:
            x: int
            def __init__(self):
                self.made = 1
            def meth(self, a): pass
            @classmethod
            def make(cls, a): pass
            @staticmethod
            def util(a): pass
            @property
            def prop(self): return 1
            @functools.cached_property
            def cached(self): return 1
        class Child(Base):
            pass
        class Lazy:
            def __getattr__(self, name): return 1
    """})
    child = r.lookup("p.m", "Child")
    meth = r.class_attr(child, "meth", via_instance=True)
    assert meth.kind == "function" and meth.bound and meth.owner.qual == "Base"
    assert not r.class_attr(child, "meth", via_instance=False).bound
    assert r.class_attr(child, "make", via_instance=False).bound
    assert not r.class_attr(child, "util", via_instance=True).bound
    assert r.class_attr(child, "prop", via_instance=True).kind == "value"
    assert r.class_attr(child, "cached", via_instance=True).kind == "value"
    assert r.class_attr(child, "made", via_instance=True).kind == "value"     # self.made = ...
    assert r.class_attr(child, "x", via_instance=True).kind == "value"        # annotation
    assert r.class_attr(child, "nope", via_instance=True).kind == "missing"
    lazy = r.class_attr(r.lookup("p.m", "Lazy"), "anything", via_instance=True)
    assert lazy.kind == "unknown" and "__getattr__" in lazy.reason


def test_instance_names_include_slots_and_give_up_on_setattr(lib):
    r = lib({"p/__init__.py": "", "p/m.py": """
        class S:
            __slots__ = ("a", "b")
        class D:
            def __init__(self, **kw):
                for k, v in kw.items():
                    setattr(self, k, v)
    """})
    assert r.instance_names(r.lookup("p.m", "S")) == {"a", "b"}
    assert "*" in r.instance_names(r.lookup("p.m", "D"))


def test_metaclass_effect(lib):
    r = lib({"p/__init__.py": "", "p/m.py": """
        import abc
        class Plain(type):
            pass
        class Hook(type):
            def __call__(cls, *a, **k): pass
        class A(metaclass=abc.ABCMeta):
            pass
        class B(metaclass=Plain):
            pass
        class C(metaclass=Hook):
            pass
    """})
    get = r.lookup
    assert r._metaclass_effect(get("p.m", "A"), get("p.m", "A").node.keywords[0].value) is None
    assert r._metaclass_effect(get("p.m", "B"), get("p.m", "B").node.keywords[0].value) is None
    why = r._metaclass_effect(get("p.m", "C"), get("p.m", "C").node.keywords[0].value)
    assert "Hook" in why and "__call__" in why
