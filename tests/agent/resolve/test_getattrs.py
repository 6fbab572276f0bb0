"""resolve_getattr: the module ``__getattr__`` (PEP 562) reader follows the lazy re-export idioms
and leaves anything else unknown, without running the code."""

from __future__ import annotations

import pytest

from tests.resolver_lib import lib  # noqa: F401  (fixture)

IMPL = {"p/impl.py": "class Real:\n    def __init__(self, a, b=1): pass\ndef helper(x): pass\n"}


@pytest.mark.parametrize("init", [
    # if name == "X": from .a import X; return X
    """
    def __getattr__(name):
        if name == "Real":
            from .impl import Real
            return Real
        raise AttributeError(name)
    """,
    # a literal map of name -> "module:attr", split and imported relative to __package__
    """
    import importlib
    _LAZY = {"Real": "p.impl:Real", "helper": ".impl:helper"}
    def __getattr__(name):
        if name in _LAZY:
            mod, attr = _LAZY[name].split(":")
            return getattr(importlib.import_module(mod, __package__), attr)
        raise AttributeError(name)
    """,
    # return getattr(import_module(MAP[name]), name)
    """
    from importlib import import_module
    _WHERE = {"Real": "p.impl", "helper": "p.impl"}
    def __getattr__(name):
        if name not in _WHERE:
            raise AttributeError(name)
        return getattr(import_module(_WHERE[name]), name)
    """,
    # a tuple value unpacked into two names
    """
    import importlib
    _MAP = {"Real": ("p.impl", "Real")}
    def __getattr__(name):
        if name in _MAP:
            mod, attr = _MAP[name]
            return getattr(importlib.import_module(mod), attr)
        raise AttributeError(name)
    """,
])
def test_lazy_reexport_idioms_resolve_to_the_definition(lib, init):
    r = lib({"p/__init__.py": init, **IMPL})
    e = r.lookup("p", "Real")
    assert e.kind == "class" and e.mod.name == "p.impl"
    assert [p.name for p in r.signature(e).params] == ["a", "b"]
    gone = r.lookup("p", "Nothing")
    assert gone.kind == "missing" and "AttributeError" in gone.reason


@pytest.mark.parametrize("init,why", [
    ("def __getattr__(name):\n    return make(name)\n", "not known statically"),
    ("_LAZY = {'Real': 'p.impl'}\n_LAZY['Real'] = 'elsewhere'\n"
     "import importlib\ndef __getattr__(name):\n    return getattr(importlib.import_module(_LAZY[name]), name)\n",
     "not known statically"),                            # the map is mutated: not a literal any more
    ("def __getattr__(name):\n    from .impl import *\n    return Real\n", "not known statically"),
    ("def __getattr__(name, extra):\n    pass\n", "not known statically"),
    ("globals().update({})\ndef __getattr__(name):\n    from .impl import Real\n    return Real\n",
     "not known statically"),                            # names bound by means not followed
])
def test_anything_else_stays_unknown(lib, init, why):
    r = lib({"p/__init__.py": init, **IMPL})
    e = r.lookup("p", "Real")
    assert e.kind == "unknown" and why in e.reason and "Real" in e.reason


def test_getattr_returning_a_submodule(lib):
    r = lib({"p/__init__.py": "import importlib\ndef __getattr__(name):\n"
                              "    if name == 'impl2':\n        return importlib.import_module('.impl', __name__)\n"
                              "    raise AttributeError(name)\n", **IMPL})
    e = r.lookup("p", "impl2")
    assert e.kind == "module" and e.mod.name == "p.impl"
