"""Parametrised table of hand-made library/caller pairs, one per rule of `remote-ops check`.

Each case writes a small library package and a caller module to a temporary directory and runs
the ``compat.check`` op twice: static (in-process, parsing only) and ``--runtime`` (in a fresh
interpreter that imports the library and uses inspect.signature). Both must give exactly the
expected findings, so the two modes agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from remote_ops.agent.compat import op_check
from tests.conftest import REPO

ROOT = REPO

try:
    import pydantic  # noqa: F401
    HAVE_PYDANTIC = True
except ImportError:
    HAVE_PYDANTIC = False
try:
    import msgspec  # noqa: F401
    HAVE_MSGSPEC = True
except ImportError:
    HAVE_MSGSPEC = False

# (id, library files, caller source, expected {(line, kind, name)}, needs)
CASES = [
    ("plain-function", {
        "__init__.py": "",
        "api.py": """
            def f(a, b=1, *, c, d=2):
                pass
            def g(x, /, y):
                pass
        """}, """
            from LIB.api import f, g
            f(1, c=3)
            f(1, 2, 3, c=4)
            f(1, e=5, c=1)
            f(b=2, c=1)
            g(1, 2)
            g(x=1, y=2)
            f(1, a=2, c=3)
        """, {(3, "too-many-positional", None), (4, "unexpected-keyword", "e"),
              (5, "missing-argument", "a"), (7, "unexpected-keyword", "x"),
              (7, "missing-argument", "x"), (8, "unexpected-keyword", "a")}, ()),
    ("init-inherited-across-modules", {
        "__init__.py": "from .child import Child\n",
        "base.py": """
            class Base:
                def __init__(self, vllm_config, *, block_size):
                    self.vllm_config = vllm_config
        """,
        "mid.py": """
            from .base import Base
            class Mid(Base):
                def run(self):
                    pass
        """,
        "child.py": """
            from LIB import mid
            class Child(mid.Mid):
                x = 1
        """}, """
            from LIB import Child
            Child(vllm_config=1, block_size=2)
            Child(vllm_config=1)
            Child(1, 2)
            Child(1, block_size=2, eos=3)
        """, {(3, "missing-argument", "block_size"), (4, "too-many-positional", None),
              (4, "missing-argument", "block_size"), (5, "unexpected-keyword", "eos")}, ()),
    ("dataclass-variants", {
        "__init__.py": "",
        "dc.py": """
            import dataclasses
            from dataclasses import dataclass, field, InitVar, KW_ONLY
            from typing import ClassVar

            @dataclass
            class Base:
                a: int
                b: int = 0

            @dataclass
            class D(Base):
                limit: ClassVar[int] = 3
                seed: InitVar[int] = 0
                cache: dict = field(init=False, default_factory=dict)
                c: int = field(default=5)
                _: KW_ONLY
                name: str = "x"
                must: int = dataclasses.field(default=1)

                def __post_init__(self, seed):
                    pass

            @dataclass(kw_only=True)
            class K:
                x: int
                y: int = 2

            @dataclass
            class Req:
                mode: InitVar[str]
                n: int = 1
        """}, """
            from LIB.dc import D, K, Req
            D(1, 2, 3, 4)
            D(1, 2, 3, 4, 5)
            D(a=1, limit=3)
            D(a=1, cache={})
            D(b=1)
            K(1)
            K(x=1, y=2)
            Req(n=2)
            Req("m", name="z")
        """, {(3, "too-many-positional", None), (4, "unexpected-keyword", "limit"),
              (5, "unexpected-keyword", "cache"), (6, "missing-argument", "a"),
              (7, "too-many-positional", None), (7, "missing-argument", "x"),
              (9, "missing-argument", "mode"), (10, "unexpected-keyword", "name")}, ()),
    ("pydantic-config-decorator", {
        "__init__.py": "from .config import *\n",
        "utils.py": """
            from pydantic import ConfigDict
            from pydantic.dataclasses import dataclass

            def config(cls=None, *, config=None, **kwargs):
                merged = ConfigDict(extra="forbid")
                if config is not None:
                    merged.update(config)
                def decorator(cls):
                    return dataclass(cls, config=merged, **kwargs)
                if cls is None:
                    return decorator
                return decorator(cls)

            def old_config(cls):
                return cls
        """,
        "config.py": """
            from dataclasses import InitVar
            from typing import ClassVar
            from pydantic import ConfigDict, Field
            from pydantic.dataclasses import dataclass
            from .utils import config, old_config

            __all__ = ["SchedulerConfig", "CacheConfig", "LooseConfig"]

            @config
            class SchedulerConfig:
                max_model_len: InitVar[int]
                is_encoder_decoder: InitVar[bool]
                DEFAULT: ClassVar[int] = 3
                max_num_seqs: int = Field(default=128, ge=1)
                budget: int = Field(init=False)

                def __post_init__(self, max_model_len, is_encoder_decoder):
                    self.budget = 1

            @config(config=ConfigDict(arbitrary_types_allowed=True))
            class CacheConfig:
                block_size: int = 16

            @old_config
            @dataclass
            class LooseConfig:
                a: int = 1

            class Hidden:
                pass
        """}, """
            from LIB import SchedulerConfig, CacheConfig, LooseConfig
            SchedulerConfig(max_model_len=1, is_encoder_decoder=False, max_num_seqs=4)
            SchedulerConfig(max_model_len=1, max_num_seqs=4)
            SchedulerConfig(max_model_len=1, is_encoder_decoder=False, budget=3)
            CacheConfig(block_size=1, swap=2)
            LooseConfig(a=2, anything=3)
        """, {(3, "missing-argument", "is_encoder_decoder"), (4, "unexpected-keyword", "budget"),
              (5, "unexpected-keyword", "swap")}, ("pydantic",)),
    ("pydantic-basemodel", {
        "__init__.py": "",
        "models.py": """
            from pydantic import BaseModel, ConfigDict

            class Loose(BaseModel):
                a: int
                b: int = 1

            class Strict(BaseModel):
                model_config = ConfigDict(extra="forbid")
                a: int
                _private: int = 0
        """}, """
            from LIB.models import Loose, Strict
            Loose(a=1, zzz=2)
            Loose(1)
            Strict(a=1, zzz=2)
            Strict()
        """, {(3, "too-many-positional", None), (3, "missing-argument", "a"),
              (4, "unexpected-keyword", "zzz"), (5, "missing-argument", "a")}, ("pydantic",)),
    ("msgspec-struct", {
        "__init__.py": "",
        "params.py": """
            import msgspec

            class Mixin:
                def clone(self):
                    return self

            class SamplingParams(Mixin, msgspec.Struct, omit_defaults=True):
                n: int = 1
                temperature: float = 1.0

            class Output(msgspec.Struct, kw_only=True):
                req_id: str
                tokens: list = []

            class Pair(msgspec.Struct):
                left: int
                right: int = 0
        """}, """
            from LIB.params import SamplingParams, Output, Pair
            SamplingParams(max_tokens=1, temperature=0.0)
            SamplingParams(2, 0.5)
            Output("r")
            Pair(right=2)
            Pair(1, 2, 3)
        """, {(2, "unexpected-keyword", "max_tokens"), (4, "too-many-positional", None),
              (4, "missing-argument", "req_id"), (5, "missing-argument", "left"),
              (6, "too-many-positional", None)}, ("msgspec",)),
    ("star-reexports-and-moved-symbols", {
        "__init__.py": "from .impl import *\nfrom .sub import helper as public_helper\n",
        "impl.py": """
            __all__ = ["exported"]
            def exported(x):
                pass
            def not_exported(x):
                pass
        """,
        "sub.py": "def helper(a, b):\n    pass\n",
        "moved/__init__.py": "",
        "moved/newhome.py": "def relocated(x):\n    pass\nclass Gone2:\n    pass\n"}, """
            from LIB import exported, public_helper
            from LIB import not_exported
            from LIB import relocated
            from LIB.old_module import thing
            exported(1, 2)
            public_helper(1)
        """, {(2, "missing-symbol", "not_exported"), (3, "missing-symbol", "relocated"),
              (4, "missing-module", "LIB.old_module"), (5, "too-many-positional", None),
              (6, "missing-argument", "b")}, ()),
    ("star-args-either-side", {
        "__init__.py": "",
        "api.py": """
            def anything(*args, **kwargs):
                pass
            def strict(a, b, *, c):
                pass
            class Flexible:
                def __init__(self, *args, **kwargs):
                    pass
            class Some:
                def __init__(self, a, **kwargs):
                    pass
        """}, """
            from LIB.api import anything, strict, Flexible, Some
            xs = [1, 2]
            kw = {"c": 1}
            anything(1, 2, z=3)
            strict(*xs, c=1)
            strict(**kw)
            strict(1, *xs)
            Flexible(1, 2, x=3)
            Some(a=1, whatever=2)
            Some(*xs, **kw)
            strict(*xs)
        """, {(7, "missing-argument", "c"), (11, "missing-argument", "c")}, ()),
    ("methods-on-attributes-and-nested", {
        "__init__.py": "",
        "sched.py": """
            import enum

            class Status(enum.Enum):
                RUNNING = 1
                FINISHED_ABORTED = 2

            class Base:
                def shutdown(self):
                    pass

            class Scheduler(Base):
                def __init__(self, cfg):
                    self.cfg = cfg
                    self.requests = {}

                def add_request(self, request):
                    pass

                def finish_requests(self, ids, status):
                    pass

                @staticmethod
                def make(x):
                    return x

                @classmethod
                def build(cls, cfg):
                    return cls(cfg)

                @property
                def busy(self):
                    return False

            def make_request(rid, *, eos):
                return rid
        """}, """
            from LIB.sched import Scheduler, Status, make_request
            from LIB import sched as S

            class Gen:
                def __init__(self):
                    self.scheduler = Scheduler(cfg=1)
                    self.other = None

                def go(self):
                    self.scheduler.add_request(make_request("a", eos=1, bad=2))
                    self.scheduler.add_request(1, 2)
                    self.scheduler.finish_requests(["a"], Status.FINISHED_ABORTED)
                    self.scheduler.finish_requests(["a"], Status.GONE)
                    self.scheduler.remove_request("a")
                    self.scheduler.shutdown()
                    self.scheduler.requests.get("a")
                    x = self.scheduler.busy
                    Scheduler.make(1, 2)
                    Scheduler.build(cfg=2)
                    S.Scheduler(1).add_request()
                    local = S.Scheduler(cfg=3)
                    local.finish_requests(["b"])
                    Status(1)

                def shadow(self, Scheduler):
                    Scheduler(1, 2, 3)
        """, {(10, "unexpected-keyword", "bad"), (11, "too-many-positional", None),
              (13, "missing-attribute", "GONE"), (14, "missing-attribute", "remove_request"),
              (18, "too-many-positional", None), (20, "missing-argument", "request"),
              (22, "missing-argument", "status")}, ()),
    ("module-getattr-and-unknowns", {
        "__init__.py": """
            def __getattr__(name):
                if name == "lazily_made":
                    return lambda *a: None
                raise AttributeError(name)
        """,
        "api.py": """
            import functools

            def deco(fn):
                def inner(*a):
                    return fn(*a)
                return inner

            @deco
            def wrapped(a, b):
                pass

            def keeps(fn):
                @functools.wraps(fn)
                def inner(*a, **k):
                    return fn(*a, **k)
                return inner

            @keeps
            def kept(a, b):
                pass
        """}, """
            from LIB import lazily_made
            from LIB.api import wrapped, kept
            lazily_made(1)
            wrapped(1)
            kept(1)
        """, {(5, "missing-argument", "b")}, ()),
    ("lazy-module-getattr-reexports", {
        "__init__.py": """
            import typing

            MODULE_ATTRS = {
                "Engine": ".engine:Engine",
                "make": ".engine:make",
            }
            _CLASS_TO_MODULE = {"Cfg": "LIB.cfgs"}

            if typing.TYPE_CHECKING:
                from LIB.engine import Engine, make
            else:
                def __getattr__(name):
                    from importlib import import_module
                    if name in MODULE_ATTRS:
                        module_name, attr_name = MODULE_ATTRS[name].split(":")
                        module = import_module(module_name, __package__)
                        return getattr(module, attr_name)
                    else:
                        raise AttributeError(name)
        """,
        "engine.py": """
            class Engine:
                def __init__(self, model, *, seed=0):
                    self.model = model
            def make(x):
                return x
        """,
        "cfgs/__init__.py": """
            import importlib
            _CLASS_TO_MODULE = {"Cfg": "LIB.cfgs.cfg"}
            __all__ = ["Cfg", "Lazy"]

            def __getattr__(name):
                if name in _CLASS_TO_MODULE:
                    module_name = _CLASS_TO_MODULE[name]
                    module = importlib.import_module(module_name)
                    return getattr(module, name)
                if name == "Lazy":
                    from .cfg import Lazy
                    return Lazy
                if name == "Made":
                    return object()
                raise AttributeError(name)
        """,
        "cfgs/cfg.py": """
            from dataclasses import dataclass
            @dataclass
            class Cfg:
                size: int
            def Lazy(a, b):
                pass
        """}, """
            from LIB import Engine, make
            from LIB import Nope
            from LIB.cfgs import Cfg, Lazy, Made
            Engine("m", seed=1)
            Engine("m", 1)
            make(1, 2)
            Cfg(size=1, sizes=2)
            Lazy(1)
            Made(1)
        """, {(2, "missing-symbol", "Nope"), (5, "too-many-positional", None),
              (6, "too-many-positional", None), (7, "unexpected-keyword", "sizes"),
              (8, "missing-argument", "b")}, ()),
    ("metaclasses-inherited-and-plain", {
        "__init__.py": "",
        "api.py": """
            import abc

            class Registry(type):
                def __call__(cls, *args, **kwargs):
                    return super().__call__()

            class Registered(metaclass=Registry):
                def __init__(self):
                    pass

            class Child(Registered):
                pass

            class Marker(abc.ABCMeta):
                def describe(cls):
                    return cls.__name__

            class Plain(metaclass=Marker):
                def __init__(self, a):
                    pass

            class PlainChild(Plain):
                pass
        """}, """
            from LIB.api import Child, PlainChild, Plain
            Child(1, 2, x=3)
            PlainChild(1, 2)
            Plain(a=1)
            Plain(b=1)
        """, {(3, "too-many-positional", None), (5, "unexpected-keyword", "b"),
              (5, "missing-argument", "a")}, ()),
]


def _write_case(root: Path, cid: str, lib_files: dict, caller: str) -> tuple[str, str]:
    lib = "lib_" + cid.replace("-", "_")
    app = "app_" + cid.replace("-", "_")
    for rel, text in lib_files.items():
        p = root / lib / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n").replace("LIB", lib))
    (root / app).mkdir(parents=True, exist_ok=True)
    (root / app / "__init__.py").write_text("")
    (root / app / "main.py").write_text(textwrap.dedent(caller).lstrip("\n").replace("LIB", lib))
    return lib, app


def _run_runtime(args: dict) -> dict:
    code = ("import json,sys; from remote_ops.agent.compat import op_check; "
            "print(json.dumps(op_check(json.loads(sys.argv[1]))))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True,
                         text=True, env=env, cwd=str(ROOT), timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _key(findings):
    return {(f["line"], f["kind"], f["name"]) for f in findings}


def _expected(expected, lib):
    return {(line, kind, name.replace("LIB", lib) if name else name) for line, kind, name in expected}


@pytest.mark.parametrize("cid,lib_files,caller,expected,needs", CASES, ids=[c[0] for c in CASES])
def test_static_and_runtime_agree(tmp_path, cid, lib_files, caller, expected, needs):
    if "pydantic" in needs and not HAVE_PYDANTIC:
        pytest.skip("pydantic is not installed")
    if "msgspec" in needs and not HAVE_MSGSPEC:
        pytest.skip("msgspec is not installed")
    lib, app = _write_case(tmp_path, cid, lib_files, caller)
    args = {"targets": [app + ".main"], "against": [lib], "sys_path": [str(tmp_path)] + sys.path}
    expected = _expected(expected, lib)
    static = op_check(dict(args, mode="static"))
    assert _key(static["findings"]) == expected, json.dumps(static, indent=1)
    runtime = _run_runtime(dict(args, mode="runtime"))
    assert runtime["mode"] == "runtime"
    assert _key(runtime["findings"]) == expected, json.dumps(runtime, indent=1)
    # same callee symbols, whichever mode produced the signature
    assert {(f["line"], f["symbol"]) for f in static["findings"]} == \
        {(f["line"], f["symbol"]) for f in runtime["findings"]}


def test_moved_symbol_suggests_new_location(tmp_path):
    cid = "star-reexports-and-moved-symbols"
    case = next(c for c in CASES if c[0] == cid)
    lib, app = _write_case(tmp_path, cid, case[1], case[2])
    res = op_check({"targets": [app + ".main"], "against": [lib], "sys_path": [str(tmp_path)]})
    by_name = {f["name"]: f for f in res["findings"]}
    assert lib + ".moved.newhome" in by_name["relocated"]["suggestion"]
    assert by_name["relocated"]["fix"]["to"] == lib + ".moved.newhome"
    assert by_name["not_exported"]["fix"]["to"] == lib + ".impl"


def test_unknowns_are_reported_not_findings(tmp_path):
    cid = "module-getattr-and-unknowns"
    case = next(c for c in CASES if c[0] == cid)
    lib, app = _write_case(tmp_path, cid, case[1], case[2])
    res = op_check({"targets": [app + ".main"], "against": [lib], "sys_path": [str(tmp_path)]})
    reasons = " | ".join(u["reason"] for u in res["unknown"])
    assert "__getattr__" in reasons
    assert "deco" in reasons
    assert {u["symbol"] for u in res["unknown"]} >= {lib + ".lazily_made", lib + ".api.wrapped"}


def test_override_sources_recheck_new_text(tmp_path):
    cid = "plain-function"
    case = next(c for c in CASES if c[0] == cid)
    lib, app = _write_case(tmp_path, cid, case[1], case[2])
    args = {"targets": [app + ".main"], "against": [lib], "sys_path": [str(tmp_path)]}
    assert op_check(args)["findings"]
    fixed = "from %s.api import f\nf(1, c=3)\n" % lib
    res = op_check(dict(args, override_sources={app + ".main": fixed}))
    assert res["findings"] == []


def test_missing_argument_fix_names_module_constant(tmp_path):
    lib_files = {"__init__.py": "", "s.py": "class Scheduler:\n    def __init__(self, cfg, block_size):\n        pass\n"}
    caller = "from LIB.s import Scheduler\nVLLM_BLOCK_SIZE = 16\nScheduler(cfg=1)\n"
    lib, app = _write_case(tmp_path, "const", lib_files, caller)
    res = op_check({"targets": [app + ".main"], "against": [lib], "sys_path": [str(tmp_path)]})
    (f,) = res["findings"]
    assert f["kind"] == "missing-argument" and f["name"] == "block_size"
    assert f["fix"] == {"action": "add-keyword", "keyword": "block_size", "value": "VLLM_BLOCK_SIZE",
                        "constant": "VLLM_BLOCK_SIZE", "constant_line": 2}
    assert "VLLM_BLOCK_SIZE" in f["suggestion"]


def test_lazy_getattr_unknown_names_say_why(tmp_path):
    cid = "lazy-module-getattr-reexports"
    case = next(c for c in CASES if c[0] == cid)
    lib, app = _write_case(tmp_path, cid, case[1], case[2])
    res = op_check({"targets": [app + ".main"], "against": [lib], "sys_path": [str(tmp_path)]})
    u = [u for u in res["unknown"] if u["symbol"].endswith("Made")][0]
    assert "__getattr__" in u["reason"] and "Made" in u["reason"]
    meta = next(c for c in CASES if c[0] == "metaclasses-inherited-and-plain")
    lib, app = _write_case(tmp_path, meta[0], meta[1], meta[2])
    res = op_check({"targets": [app + ".main"], "against": [lib], "sys_path": [str(tmp_path)]})
    reasons = {u["symbol"].rsplit(".", 1)[-1]: u["reason"] for u in res["unknown"]}
    assert "Registry" in reasons["Child"] and "__call__" in reasons["Child"]


def test_one_odd_call_is_an_unknown_not_a_failed_op(tmp_path, monkeypatch):
    """An analysis error on one call becomes an unknown with the reason; the rest is still checked."""
    from remote_ops.agent.resolve import resolver as signatures

    lib_files = {"__init__.py": "", "api.py": "def good(a):\n    pass\ndef odd(a):\n    pass\n"}
    caller = "from LIB.api import good, odd\ngood(1, 2)\nodd(1)\n"
    lib, app = _write_case(tmp_path, "odd", lib_files, caller)
    real = signatures.StaticResolver.signature

    def boom(self, e):
        if e.qual == "odd":
            raise KeyError("synthetic failure")
        return real(self, e)

    monkeypatch.setattr(signatures.StaticResolver, "signature", boom)
    res = op_check({"targets": [app + ".main"], "against": [lib], "sys_path": [str(tmp_path)]})
    assert _key(res["findings"]) == {(2, "too-many-positional", None)}
    (u,) = res["unknown"]
    assert u["line"] == 3 and "KeyError" in u["reason"] and "synthetic failure" in u["reason"]


def test_odd_library_and_caller_code_never_fail_the_op(tmp_path):
    lib_files = {
        "__init__.py": "from .api import *\n",
        "api.py": """
            import functools
            def make_base():
                return object
            class FromExpr(make_base()):
                pass
            class Self(Self if False else object):
                pass
            class A(B):
                pass
            class B(A):
                pass
            @functools.lru_cache(maxsize=None)
            def cached(a):
                pass
            def __getattr__(name):
                return globals()[name.lower()]
        """,
        "broken.py": "def f(:\n",
    }
    caller = """
        import LIB
        from LIB import api, broken
        from LIB.api import FromExpr, A, cached
        FromExpr(1)
        A(1)
        cached(1, 2)
        api.table[0](1)
        (lambda: api.cached)()(1)
        match 1:
            case 1:
                api.cached(1)
        LIB.api.Whatever(1)
    """
    lib, app = _write_case(tmp_path, "oddlib", lib_files, caller)
    res = op_check({"targets": [app + ".main"], "against": [lib], "sys_path": [str(tmp_path)]})
    assert (6, "too-many-positional", None) in _key(res["findings"])
    assert res["unknown"], res


def test_only_symbols_narrows_the_check_to_those_callees(tmp_path):
    """Patch verification asks only for the callees its edits fix; the rest of the module is not
    checked (and not reported), the named ones exactly as in a full check."""
    from remote_ops.agent import compat

    lib = tmp_path / "libx"
    lib.mkdir()
    (lib / "__init__.py").write_text("def f(a):\n    pass\n\ndef g(b):\n    pass\n")
    caller = tmp_path / "callerx.py"
    caller.write_text("from libx import f, g\n\nf(a=1, zz=2)\ng(c=3)\n")
    base = {"targets": ["callerx"], "against": ["libx"], "sys_path": [str(tmp_path)]}
    full = compat.op_check(dict(base))
    assert {(f["symbol"], f["name"]) for f in full["findings"]} == {
        ("libx.f", "zz"), ("libx.g", "c"), ("libx.g", "b")}
    narrow = compat.op_check(dict(base, only_symbols=["libx.f"]))
    assert {(f["symbol"], f["name"]) for f in narrow["findings"]} == {("libx.f", "zz")}
    assert narrow["calls_checked"] == 1


def test_only_symbols_matches_a_symbol_spelled_by_its_defining_module(tmp_path):
    """One matcher: ``libx.core.Conf`` (where it is defined) and ``libx.Conf`` (the re-export the caller
    imports) are the same class, so either spelling selects the call; findings carry ``defined``.
    A spelling that names nothing is refused, not matched vacuously."""
    from remote_ops.agent import compat
    from remote_ops.agent.protocol import AgentFailure

    lib = tmp_path / "libx"
    lib.mkdir()
    (lib / "__init__.py").write_text("from .core import Conf, g\n")
    (lib / "core.py").write_text("class Conf:\n    def __init__(self, a, *, must):\n        pass\n\n"
                                 "def g(b):\n    pass\n")
    (lib / "other.py").write_text("class Conf:\n    def __init__(self, a, *, must):\n        pass\n")
    (tmp_path / "callery.py").write_text("from libx import Conf, g\n\nConf(1)\ng(c=3)\n")
    base = {"targets": ["callery"], "against": ["libx"], "sys_path": [str(tmp_path)]}
    full = compat.op_check(dict(base))
    conf = [f for f in full["findings"] if f["name"] == "must"]
    assert [(f["symbol"], f["defined"]) for f in conf] == [("libx.Conf", "libx.core.Conf")]
    for spelling in ("libx.core.Conf", "libx.Conf"):
        narrow = compat.op_check(dict(base, only_symbols=[spelling]))
        assert {(f["symbol"], f["name"]) for f in narrow["findings"]} == {("libx.Conf", "must")}, spelling
        assert narrow["calls_checked"] == 1 and narrow["only_unmatched"] == []
    # another class of the same name is another symbol: it selects nothing here, and says so
    other = compat.op_check(dict(base, only_symbols=["libx.other.Conf"]))
    assert other["findings"] == [] and other["calls_checked"] == 0
    assert other["only_unmatched"] == ["libx.other.Conf"]
    with pytest.raises(AgentFailure, match="libx.core.Cnof"):
        compat.op_check(dict(base, only_symbols=["libx.core.Cnof"]))
