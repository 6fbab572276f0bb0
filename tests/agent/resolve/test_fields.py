"""resolve_fields: constructor fields of dataclasses, pydantic, msgspec and NamedTuple classes."""

from __future__ import annotations

from remote_ops.agent.resolve.sigmodel import KWONLY, POSKW, VARKW
from tests.resolver_lib import lib, params  # noqa: F401  (fixture)


def _sig(r, name):
    return r.signature(r.lookup("p.m", name))


def test_dataclass_classvar_initvar_init_false_kw_only(lib):
    r = lib({"p/__init__.py": "", "p/m.py": """
        import dataclasses
        from dataclasses import dataclass, field, InitVar, KW_ONLY
        from typing import ClassVar
        @dataclass
        class D:
            a: int
            count: ClassVar[int] = 0
            seed: InitVar[int] = 1
            cache: dict = field(init=False, default_factory=dict)
            _: KW_ONLY
            k: str = "x"
        @dataclasses.dataclass(kw_only=True)
        class K:
            a: int
            b: int = field(default=2, kw_only=False)
    """})
    assert params(_sig(r, "D")) == [("a", POSKW, None), ("seed", POSKW, "1"), ("k", KWONLY, "'x'")]
    assert params(_sig(r, "K")) == [("b", POSKW, "2"), ("a", KWONLY, None)]
    assert _sig(r, "D").note == "dataclass fields"


def test_dataclass_init_false_falls_through_to_object(lib):
    r = lib({"p/__init__.py": "", "p/m.py": "from dataclasses import dataclass\n"
                                            "@dataclass(init=False)\nclass N:\n    a: int\n"})
    assert _sig(r, "N").params == []


def test_pydantic_model_fields_are_keyword_only_and_extra_allowed_unless_forbidden(lib):
    r = lib({"p/__init__.py": "", "p/m.py": """
        from pydantic import BaseModel, ConfigDict, Field
        class M(BaseModel):
            model_config = ConfigDict(frozen=True)
            a: int
            b: str = Field("x")
            c: int = Field(...)
            _private: int = 0
        class Strict(BaseModel):
            model_config = ConfigDict(extra="forbid")
            a: int
    """})
    assert params(_sig(r, "M")) == [("a", KWONLY, None), ("b", KWONLY, "'x'"), ("c", KWONLY, None),
                                    ("data", VARKW, None)]
    assert params(_sig(r, "Strict")) == [("a", KWONLY, None)]


def test_pydantic_dataclass_ignores_extra_keywords_unless_forbidden(lib):
    r = lib({"p/__init__.py": "", "p/m.py": """
        from pydantic.dataclasses import dataclass
        @dataclass
        class P:
            a: int
        @dataclass(config={"extra": "forbid"})
        class F:
            a: int
    """})
    assert params(_sig(r, "P")) == [("a", POSKW, None), ("extra", VARKW, None)]
    assert "extra keywords are ignored" in _sig(r, "P").note
    assert params(_sig(r, "F")) == [("a", POSKW, None)]


def test_msgspec_struct_and_namedtuple(lib):
    r = lib({"p/__init__.py": "", "p/m.py": """
        import msgspec
        from typing import NamedTuple
        class S(msgspec.Struct, kw_only=True):
            a: int
            b: list = msgspec.field(default_factory=list)
        class T(NamedTuple):
            x: int
            y: int = 3
    """})
    assert params(_sig(r, "S")) == [("a", KWONLY, None), ("b", KWONLY, "<factory list>")]
    assert _sig(r, "S").note == "msgspec.Struct fields"
    assert params(_sig(r, "T")) == [("x", POSKW, None), ("y", POSKW, "3")]


def test_kw_only_is_per_class_along_the_bases(lib):
    r = lib({"p/__init__.py": "", "p/m.py": """
        from dataclasses import dataclass
        @dataclass
        class B:
            a: int
            b: int = 1
        @dataclass(kw_only=True)
        class C(B):
            c: int
    """})
    assert params(_sig(r, "C")) == [("a", POSKW, None), ("b", POSKW, "1"), ("c", KWONLY, None)]
