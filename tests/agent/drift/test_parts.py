"""The agent's drift parts on small hand-made inputs (the real-wheel drift tests are in agent/drift/test_drift.py)."""

from __future__ import annotations

import pytest

from remote_ops.agent.drift.compare import _same_default
from remote_ops.agent.drift.facts import norm_annotation
from remote_ops.agent.drift.classes import hierarchy_table
from remote_ops.agent.drift.scan import _rel, dispatch_facts
from tests.resolver_lib import lib  # noqa: F401  (fixture)


@pytest.mark.parametrize("a,b", [
    ("Optional[int]", "int | None"), ("typing.List[str]", "list[str]"), ("Union[b, a]", "a | b"),
    ("'Dict[str, int]'", "dict[str, int]"), ("typing_extensions.Tuple[int, ...]", "tuple[int, ...]"),
])
def test_spellings_of_one_annotation_normalise_equal(a, b):
    assert norm_annotation(a) == norm_annotation(b)


def test_different_annotations_stay_different():
    assert norm_annotation("list[int]") != norm_annotation("list[str]")
    assert norm_annotation(None) is None


@pytest.mark.parametrize("a,b,same", [
    ("1", "1", True), ("1.0", "1", True), ("'auto'", "ModelImpl.AUTO", True),
    ("'auto'", "ModelImpl.AUTO.value", True), ("'auto'", "ModelImpl.FAST", False),
    ("None", "0", False), ("f()", "g()", False),
])
def test_same_default(a, b, same):
    assert _same_default(a, b) is same


def test_class_table_and_dispatch_scan_class_bodies(lib):
    r = lib({"lib/__init__.py": "", "lib/workers.py": """
        class GPUWorker:
            def __init__(self):
                self.model_runner = None
                self.device = "cuda"
            def execute_model(self, req):
                pass
            def load_model(self):
                pass
        class Other:
            def load_model(self):
                pass
        def execute_model():
            pass
    """})
    table = hierarchy_table(r, "lib", ["model_runner", "execute_model", "load_model"], 3, roots=[str(r.sys_path[0])])
    assert list(table) == ["lib.workers:GPUWorker"]
    row = table["lib.workers:GPUWorker"]
    assert row["where"] == "lib/workers.py:2" and row["methods"] == ["__init__", "execute_model", "load_model"]
    assert set(row["has"]) == {"model_runner", "execute_model", "load_model"}
    assert row["lines"]["execute_model"] == 6 and row["headers"]["execute_model"]
    assert dispatch_facts(r, "lib", "load_model") == ["lib.workers:GPUWorker", "lib.workers:Other"]
    assert dispatch_facts(r, "lib", "execute_model") == ["lib.workers:GPUWorker"]   # not the module function


def test_rel():
    assert _rel("/a/b/c.py", ["/x", "/a/"]) == "b/c.py"
    assert _rel("/elsewhere/c.py", ["/a"]) == "/elsewhere/c.py"


def test_hierarchy_candidates_read_bases_by_name_across_files(lib):
    """A class with none of the names in its own body is a candidate through its bases (written
    dotted, generic, over several lines, beside keywords); a class on a file's first line counts."""
    from remote_ops.agent.drift.scan import _base_names, hierarchy_candidates
    r = lib({"lib/__init__.py": "", "lib/base.py": """class Base:
    def load_model(self):
        self.model_runner = None
""", "lib/sub.py": """
import typing
from . import base


class Sub(
    base.Base,      # the library's
    typing.Generic[int],
    metaclass=type,
):
    pass


class Plain:
    pass
"""})
    got = [(m, c, line, lib_bases) for m, c, line, _, lib_bases in hierarchy_candidates(
        r, "lib", ["model_runner", "load_model"], 2)]
    assert got == [("lib.base", "Base", 1, False), ("lib.sub", "Sub", 6, True)]
    assert _base_names(b"a.B, C[int], metaclass=M):", 0) == ["B", "C"]
    table = hierarchy_table(r, "lib", ["model_runner", "load_model"], 2)
    assert table["lib.sub:Sub"]["has"] == ["model_runner", "load_model"]
    assert table["lib.sub:Sub"]["inherited"]["load_model"][0] == "lib.base:Base"
