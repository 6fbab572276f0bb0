"""Drift of functions bound onto library objects, through the library's class hierarchy.

A tiny library in two versions (its base classes in another module than the classes the caller
reaches) and a caller that binds functions with ``types.MethodType``: onto objects it does not know
(the classes that have the attributes stand for them, counted through their MRO), and onto
instances that library constructors made (analysed against that class). Each shape: a method moved
to a base is not gone; a method gone from the whole hierarchy is, with its successor when exactly
one fits.
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
from remote_ops.check import drift
from tests.conftest import REPO

ROOT = REPO

BASE = {
    "__init__.py": "",
    "base.py": """
        class DecoderBase:
            def reset(self):
                pass


        class EmbedBase:
            def warm(self):
                pass

            def get_input_embeddings(self, ids):
                return ids


        class HeadBase:
            def scale(self, h):
                return h

            def compute_logits(self, h):
                return h
    """,
    "models.py": """
        from .base import DecoderBase, EmbedBase
        from . import base


        class Decoder(DecoderBase):
            def __init__(self):
                self.layers = []
                self.final_norm = None

            def embed_tokens(self, ids):
                return ids


        class Tower(EmbedBase):
            def __init__(self):
                self.blocks = []
                self.out_norm = None


        class Head(base.HeadBase):
            def project(self, h):
                return h
    """,
}

INSTALLED = {
    "__init__.py": "",
    "base.py": """
        class DecoderBase:
            def reset(self):
                pass

            def embed_tokens(self, ids):
                return ids


        class EmbedBase:
            def warm(self):
                pass

            def embed_input_ids(self, ids):
                return ids


        class HeadBase:
            def scale(self, h):
                return h

            def compute_logit_scores(self, h):
                return h

            def project(self, h):
                return h
    """,
    "models.py": """
        from .base import DecoderBase, EmbedBase
        from . import base


        class Decoder(DecoderBase):
            def __init__(self):
                self.layers = []
                self.final_norm = None


        class Tower(EmbedBase):
            def __init__(self):
                self.blocks = []
                self.out_norm = None


        class Head(base.HeadBase):
            pass
    """,
}

CALLER = """
    import types

    from lib_h import models
    from lib_h.models import Head


    def _decode(self, ids):
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer(h)
        return self.final_norm(h)


    def _tower(self, ids):
        h = self.get_input_embeddings(ids)
        for block in self.blocks:
            h = block(h)
        return self.out_norm(h)


    def _logits(self, h):
        return self.compute_logits(h)


    def _project(self, h):
        return self.project(h)


    def patch_unknown(dec, tower):
        dec.forward = types.MethodType(_decode, dec)
        tower.forward = types.MethodType(_tower, tower)


    def patch_local():
        head = Head()
        head.logits = types.MethodType(_logits, head)
        return head


    class Holder:
        def __init__(self):
            self.head = models.Head()
            self.head.project_out = types.MethodType(_project, self.head)
"""


def _write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        p = root / "lib_h" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))


def _line(text: str, source: str = CALLER) -> int:
    lines = textwrap.dedent(source).lstrip("\n").splitlines()
    return next(i + 1 for i, line in enumerate(lines) if text in line)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hier")
    base, inst, app = tmp / "base", tmp / "inst", tmp / "app"
    _write(base, BASE)
    _write(inst, INSTALLED)
    (app / "app_h").mkdir(parents=True)
    (app / "app_h" / "__init__.py").write_text("")
    (app / "app_h" / "main.py").write_text(textwrap.dedent(CALLER).lstrip("\n"))
    return base, inst, app


def _args(inst, app):
    return {"sys_path": [str(inst), str(app)], "package": "app_h", "against": ["lib_h"], "drift": True}


@pytest.fixture(scope="module")
def result(libs):
    base, inst, app = libs
    raw = op_check(_args(inst, app))
    return raw, drift.analyse(raw, ["lib_h"], str(base))


def _bound(raw, function):
    return next(t for t in raw["touches"] if t["kind"] == "bound" and t["function"] == function)


def _gone(out):
    return {d["name"]: d for d in out["drift"] if d["kind"] == "attribute-gone"}


EXPECTED = {(_line("self.get_input_embeddings(ids)"), "attribute-gone", "get_input_embeddings"),
            (_line("self.compute_logits(h)"), "attribute-gone", "compute_logits")}


def test_exactly_the_two_vanished_methods_are_drift(result):
    raw, out = result
    assert raw["findings"] == []
    assert {(d["line"], d["kind"], d["name"]) for d in out["drift"]} == EXPECTED


def test_runtime_mode_finds_the_same(libs):
    """--runtime on the host (the library imported): the bound objects' classes are replayed in the
    static resolver, so the drift is the same."""
    base, inst, app = libs
    code = ("import json,sys; from remote_ops.agent.compat import op_check; "
            "print(json.dumps(op_check(json.loads(sys.argv[1]))))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(dict(_args(inst, app), mode="runtime"))],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=str(ROOT),
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    assert raw["mode"] == "runtime"
    out = drift.analyse(raw, ["lib_h"], str(base))
    assert {(d["line"], d["kind"], d["name"]) for d in out["drift"]} == EXPECTED
    assert _gone(out)["compute_logits"]["fix"]["to"] == "compute_logit_scores"


def test_method_moved_to_a_base_in_another_module_is_not_gone(result):
    """Decoder.embed_tokens moved to DecoderBase (lib_h/base.py): the classes that stand for an
    unknown object count what their bases give them."""
    raw, out = result
    assert "embed_tokens" not in _gone(out)
    t = _bound(raw, "_decode")
    assert "classes" in t and "access" not in t          # the object is not known: duck typing
    dec = t["classes"]["lib_h.models:Decoder"]
    assert "embed_tokens" not in dec["methods"] and dec["inherited"]["embed_tokens"][0] == "lib_h.base:DecoderBase"
    assert set(dec["has"]) == {"embed_tokens", "layers", "final_norm"}


def test_method_gone_from_the_whole_hierarchy_is_reported_with_its_successor(result):
    """Tower.get_input_embeddings came from EmbedBase (another module) and was renamed there: the
    baseline's Tower has it only through its base, the installed one nowhere; the successor is the
    one new method of the hierarchy with the same parameters at the same place of EmbedBase."""
    raw, out = result
    d = _gone(out)["get_input_embeddings"]
    base_lines = textwrap.dedent(BASE["base.py"]).lstrip("\n").splitlines()
    inst_lines = textwrap.dedent(INSTALLED["base.py"]).lstrip("\n").splitlines()
    assert d["baseline"]["where"] == "lib_h/base.py:%d" % (
        base_lines.index("    def get_input_embeddings(self, ids):") + 1)
    assert d["installed"]["successor"] == "embed_input_ids"
    assert d["installed"]["where"].endswith("lib_h/base.py:%d" % (
        inst_lines.index("    def embed_input_ids(self, ids):") + 1))
    assert d["fix"] == {"action": "rename-attribute", "attribute": "get_input_embeddings", "to": "embed_input_ids",
                        "function": "_tower", "old": "h = self.get_input_embeddings(ids)",
                        "new": "h = self.embed_input_ids(ids)"}
    assert "Tower" in d["message"]


def test_instance_of_a_library_class_is_analysed_against_that_class(result):
    """head = Head(); head.logits = types.MethodType(_logits, head): one attribute used, so duck
    typing could not tell the class; the constructor does. compute_logits was HeadBase's (another
    module) and is gone from Head's whole hierarchy; its successor has the same parameters and a
    similar name."""
    raw, out = result
    d = _gone(out)["compute_logits"]
    t = _bound(raw, "_logits")
    assert t["instance"] is True and t["class_symbol"] == "lib_h.models.Head" and "classes" not in t
    assert t["class"]["class"] == "lib_h.models:Head" and list(t["class"]["bases"]) == ["lib_h.base:HeadBase"]
    assert d["symbol"] == "self.compute_logits" and d["line"] == _line("self.compute_logits(h)")
    assert "an instance of lib_h.models.Head" in d["message"]
    assert d["baseline"]["class"] == "lib_h.models:Head"
    assert d["baseline"]["where"].endswith("lib_h/base.py:%d" % (
        textwrap.dedent(BASE["base.py"]).lstrip("\n").splitlines().index("    def compute_logits(self, h):") + 1))
    assert d["installed"]["successor"] == "compute_logit_scores"
    assert d["fix"]["to"] == "compute_logit_scores" and d["fix"]["new"] == "return self.compute_logit_scores(h)"


def test_instance_in_an_attribute_with_the_method_moved_to_its_base(result):
    """self.head = models.Head(); self.head.project_out = MethodType(_project, self.head): analysed
    against Head; project moved from Head to HeadBase, so it is not gone."""
    raw, out = result
    t = _bound(raw, "_project")
    assert t["class_symbol"] == "lib_h.models.Head" and t["instance"] is True
    assert t["facts"]["project"]["status"] == "ok"
    assert t["facts"]["project"]["where"].endswith("lib_h/base.py:%d" % (
        textwrap.dedent(INSTALLED["base.py"]).lstrip("\n").splitlines().index("    def project(self, h):") + 1))
    assert "project" not in _gone(out)


def test_no_successor_when_two_fit(tmp_path):
    """Two new methods of the hierarchy with the same parameters and similar names: the finding
    stays, with no rename (a guess between two is not offered)."""
    base, inst, app = tmp_path / "b", tmp_path / "i", tmp_path / "a"
    _write(base, {"__init__.py": "", "base.py": "class B:\n    def compute_logits(self, h):\n        return h\n",
                  "m.py": "from .base import B\n\n\nclass M(B):\n    pass\n"})
    _write(inst, {"__init__.py": "", "base.py": "class B:\n    def compute_logits2(self, h):\n        return h\n\n"
                                                "    def compute_logits3(self, h):\n        return h\n",
                  "m.py": "from .base import B\n\n\nclass M(B):\n    pass\n"})
    (app / "app_h").mkdir(parents=True)
    (app / "app_h" / "__init__.py").write_text("")
    (app / "app_h" / "main.py").write_text(
        "import types\nfrom lib_h.m import M\n\n\ndef _f(self, h):\n    return self.compute_logits(h)\n\n\n"
        "OBJ = M()\nOBJ.f = types.MethodType(_f, OBJ)\n")
    raw = op_check({"sys_path": [str(inst), str(app)], "package": "app_h", "against": ["lib_h"], "drift": True})
    out = drift.analyse(raw, ["lib_h"], str(base))
    (d,) = out["drift"]
    assert d["name"] == "compute_logits" and d["line"] == 6
    assert d["installed"]["successor"] is None and d["fix"] == {"action": "placeholder"}
