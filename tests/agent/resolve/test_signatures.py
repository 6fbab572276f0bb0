"""resolve_signatures: the signature of calling a function or constructing a class, or why not."""

from __future__ import annotations

from remote_ops.agent.resolve.sigmodel import KWONLY, POSKW, POSONLY, VARKW, VARPOS, Unknown
from tests.resolver_lib import lib, params  # noqa: F401  (fixture)


def test_function_parameters_defaults_and_annotations(lib):
    r = lib({"p/__init__.py": "def f(a, /, b: int = 1, *rest, k, m='x', **kw) -> None: pass\n"})
    s = r.signature(r.lookup("p", "f"))
    assert params(s) == [("a", POSONLY, None), ("b", POSKW, "1"), ("rest", VARPOS, None),
                         ("k", KWONLY, None), ("m", KWONLY, "'x'"), ("kw", VARKW, None)]
    assert s.render() == "(a, /, b: int = 1, *rest, k, m='x', **kw)"
    assert s.mode == "static" and s.origin.endswith("__init__.py:1")


def test_methods_drop_self_or_cls_but_not_for_staticmethods(lib):
    r = lib({"p/__init__.py": """
        class C:
            def m(self, a): pass
            @classmethod
            def c(cls, a): pass
            @staticmethod
            def s(a): pass
    """})
    c = r.lookup("p", "C")
    assert [p.name for p in r.signature(r.class_attr(c, "m", via_instance=True)).params] == ["a"]
    assert [p.name for p in r.signature(r.class_attr(c, "m", via_instance=False)).params] == ["self", "a"]
    assert [p.name for p in r.signature(r.member(c, "c")).params] == ["a"]
    assert [p.name for p in r.signature(r.member(c, "s")).params] == ["a"]


def test_decorators_that_keep_or_may_change_a_signature(lib):
    r = lib({"p/__init__.py": """
        import functools
        def keep(fn):
            @functools.wraps(fn)
            def inner(*a, **k):
                return fn(*a, **k)
            return inner
        def odd(fn):
            return lambda: None
        @functools.lru_cache
        def cached(a): pass
        @keep
        def kept(a, b): pass
        @odd
        def changed(a): pass
    """})
    assert [p.name for p in r.signature(r.lookup("p", "cached")).params] == ["a"]
    assert [p.name for p in r.signature(r.lookup("p", "kept")).params] == ["a", "b"]
    u = r.signature(r.lookup("p", "changed"))
    assert isinstance(u, Unknown) and "odd" in u.reason


def test_class_construction_init_new_and_object(lib):
    r = lib({"p/__init__.py": """
        class Empty:
            pass
        class WithInit:
            def __init__(self, a, *, b=2): pass
        class Neutral:
            def __new__(cls, *args, **kwargs): pass
        class Sub(Neutral):
            def __init__(self, x): pass
    """})
    e = r.signature(r.lookup("p", "Empty"))
    assert e.params == [] and e.note == "object() takes no arguments"
    assert params(r.signature(r.lookup("p", "WithInit"))) == [("a", POSKW, None), ("b", KWONLY, "2")]
    assert [p.name for p in r.signature(r.lookup("p", "Sub")).params] == ["x"]


def test_what_is_not_a_callable_or_not_analysed_says_so(lib):
    r = lib({"p/__init__.py": "import torch\nVALUE = 3\nclass E(torch.nn.Module):\n    pass\n"})
    for name, why in (("VALUE", "not a function or class"), ("nope", "no attribute"),
                      ("E", "a base cannot be resolved (no module named 'torch')")):
        s = r.signature(r.lookup("p", name))
        assert isinstance(s, Unknown) and why in s.reason, (name, s)


def test_signatures_of_classes_are_cached_and_recursion_is_unknown(lib):
    r = lib({"p/__init__.py": "class A:\n    def __init__(self, a): pass\n"})
    a = r.lookup("p", "A")
    assert r.signature(a) is r.signature(a)
