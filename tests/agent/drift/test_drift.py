"""Drift between the library version a package was written for (the baseline) and the installed one.

Hand-made libraries first (a baseline and an installed version of one small package, and a caller),
each drift kind and each relevance rule, static and ``--runtime``; then speculators 0.3.0 on the real
vLLM wheels (baseline 0.11.0, the version speculators pins) against 0.17.0 and 0.20.0, including the
shipped playbook making the four measured items go away.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from remote_ops import pkgsource

from remote_ops.check import drift
from remote_ops.agent.compat import op_check
from tests.conftest import REPO

ROOT = REPO

BASE = {
    "__init__.py": """
        from .config import Config
        from .exec import Executor, Registry, make_group
        REGISTRY = Registry()
    """,
    "config.py": """
        from dataclasses import dataclass, field
        from typing import Optional

        @dataclass
        class Config:
            size: int = 16
            caching: Optional[bool] = None
            mode: str = "a"
            extra: dict = field(default_factory=dict)
            label: Optional[str] = None
            computed: Optional[int] = None
            impl: str = "auto"

            def __post_init__(self):
                if self.computed is None:
                    self.computed = 3
    """,
    "exec.py": """
        from typing import Any, List, Optional

        class Executor:
            def run(self, method, unique_reply_rank=None) -> List[Any]:
                \"\"\"Run ``method`` on every worker.

                Returns the replies, or the single reply if unique_reply_rank is given.
                \"\"\"
                return []

            def spec(self) -> Optional[int]:
                return None

            def names(self) -> list[str]:
                return []

            def keep(self) -> list[int]:
                return []

            def __call__(self, x):
                return x

        class Worker:
            def get_spec(self):
                return 1

            def warm(self):
                pass

        class Model:
            def __init__(self):
                self.layers = []
                self.norm = None

            def get_input_embeddings(self, ids):
                return ids

            def forward(self, ids):
                return ids

        class OtherModel:
            def __init__(self):
                self.layers, self.norm = [], None

            def get_input_embeddings(self, ids):
                return ids

            def forward(self, ids):
                return ids

        class Group:
            def rank(self):
                return 0

        def make_group() -> Group:
            return Group()

        class Registry:
            def register(self, x):
                pass
    """,
}

INSTALLED = {
    "__init__.py": BASE["__init__.py"],
    "config.py": """
        import enum
        from dataclasses import dataclass, field

        class Impl(str, enum.Enum):
            AUTO = "auto"

        @dataclass
        class Config:
            size: int = 16
            caching: bool = True
            mode: str = 'a'
            extra: dict = field(default_factory=dict)
            label: str | None = None
            computed: int = 3
            impl: str = Impl.AUTO.value
    """,
    "exec.py": """
        from typing import Any

        class Executor:
            def run(self, method, unique_reply_rank=None) -> Any:
                \"\"\"Run ``method`` on every worker.

                Returns the replies, or the single reply if unique_reply_rank is given.
                \"\"\"
                return []

            def spec(self) -> int | None:
                return None

            def names(self) -> dict[str, int]:
                return {}

            def keep(self) -> tuple[int, ...]:
                return ()

            def __call__(self, x):
                return x

        class Worker:
            def fetch_spec(self):
                return 1

            def warm(self):
                pass

        class Model:
            def __init__(self):
                self.layers = []
                self.norm = None

            def embed_input_ids(self, ids):
                return ids

            def forward(self, ids):
                return ids

        class OtherModel:
            def __init__(self):
                self.layers, self.norm = [], None

            def embed_input_ids(self, ids):
                return ids

            def forward(self, ids):
                return ids

        class Group:
            def rank(self):
                return 0

        def make_group() -> Group:
            return Group()

        class Registry:
            def register(self, x):
                pass
    """,
}

CALLER = """
    import types

    from lib_d import REGISTRY, Config, Executor, make_group


    def _fwd(self, ids):
        h = self.get_input_embeddings(ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


    def build(obj):
        cfg = Config(size=8)
        ex = Executor()
        out = ex.run("get_spec", unique_reply_rank=0)[0]
        ex.run("mine")
        lst = ex.run("warm")
        first = lst[0]
        if ex.spec():
            pass
        for n in ex.names():
            pass
        ex.keep()
        ex(3)
        make_group().rank()
        REGISTRY.register(1)
        obj._ext = cfg
        obj.forward = types.MethodType(_fwd, obj)
        return out, first


    class Mine:
        def mine(self):
            return 1
"""


def _write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        p = root / "lib_d" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))


@pytest.fixture()
def libs(tmp_path):
    base, inst, app = tmp_path / "base", tmp_path / "inst", tmp_path / "app"
    _write(base, BASE)
    _write(inst, INSTALLED)
    (app / "app_d").mkdir(parents=True)
    (app / "app_d" / "__init__.py").write_text("")
    (app / "app_d" / "main.py").write_text(textwrap.dedent(CALLER).lstrip("\n"))
    return base, inst, app


def _line(text: str) -> int:
    lines = textwrap.dedent(CALLER).lstrip("\n").splitlines()
    return next(i + 1 for i, line in enumerate(lines) if text in line)


EXPECTED = {
    (_line("Config(size=8)"), "default-changed", "caching"),
    (_line('ex.run("get_spec"'), "return-changed", "run"),
    (_line('ex.run("get_spec"'), "attribute-gone", "get_spec"),
    (_line("for n in ex.names()"), "return-changed", "names"),
    (_line("self.get_input_embeddings(ids)"), "attribute-gone", "get_input_embeddings"),
}


def _args(inst, app):
    return {"sys_path": [str(inst), str(app)], "package": "app_d", "against": ["lib_d"], "drift": True}


def _drift(raw, base):
    return drift.analyse(raw, ["lib_d"], str(base))


def test_each_kind_static(libs):
    base, inst, app = libs
    raw = op_check(_args(inst, app))
    assert raw["findings"] == []
    out = _drift(raw, base)
    assert out["baseline"]["path"] == str(base) and out["baseline"]["source"] == f"--baseline {base}"
    got = {(d["line"], d["kind"], d["name"]) for d in out["drift"]}
    assert got == EXPECTED, out["drift"]
    by = {(d["kind"], d["name"]): d for d in out["drift"]}

    caching = by[("default-changed", "caching")]
    assert caching["baseline"]["value"] == "None" and caching["installed"]["value"] == "True"
    assert caching["baseline"]["where"] == "lib_d/config.py:7"
    assert caching["installed"]["where"].endswith("lib_d/config.py:10")
    # None is not a bool any more: False is offered, and marked as a guess
    assert caching["fix"]["value"] == "False" and "guess" in caching["fix"]

    ret = by[("return-changed", "run")]
    assert ret["baseline"]["value"] == "List[Any]" and ret["installed"]["value"] == "Any"
    assert ret["fix"] == {"action": "replace-text", "line": ret["line"],
                          "old": 'ex.run("get_spec", unique_reply_rank=0)[0]',
                          "new": 'ex.run("get_spec", unique_reply_rank=0)'}

    gone = by[("attribute-gone", "get_input_embeddings")]
    assert gone["fix"]["to"] == "embed_input_ids"
    assert gone["fix"]["old"] == "h = self.get_input_embeddings(ids)"
    assert gone["baseline"]["where"] == "lib_d/exec.py:%d" % (
        textwrap.dedent(BASE["exec.py"]).lstrip("\n").splitlines().index(
            "    def get_input_embeddings(self, ids):") + 1)

    notes = " | ".join(out["drift_notes"])
    # relevance rules, each said rather than reported
    assert "computed: " not in notes and "computed's default changed from None" in notes   # __post_init__
    assert "ties the result to unique_reply_rank" in notes     # ex.run("warm") indexed, rank not passed
    # spellings of one type are not drift; unused results and unchanged defaults are not either
    # nor 'auto' becoming the Enum member Impl.AUTO.value
    assert not any(d["name"] in ("spec", "keep", "label", "mode", "extra", "mine", "impl") for d in out["drift"])


def test_unknown_for_each_skipped_call_shape(libs):
    _, inst, app = libs
    raw = op_check(_args(inst, app))
    reasons = {u["symbol"]: u["reason"] for u in raw["unknown"]}
    assert reasons == {
        "lib_d.Executor": "calls an instance of lib_d.Executor: its __call__ is not followed",
        "lib_d.make_group().rank": "method 'rank' called on the result of lib_d.make_group(): what it returns "
                                   "is not followed",
        "lib_d.REGISTRY.register": "method 'register' of the library's module-level object lib_d.REGISTRY: its "
                                   "class is not followed",
    }


def test_default_changed_runtime(libs):
    """--runtime on the host (the library imported, inspect.signature) against the static baseline."""
    base, inst, app = libs
    code = ("import json,sys; from remote_ops.agent.compat import op_check; "
            "print(json.dumps(op_check(json.loads(sys.argv[1]))))")
    args = dict(_args(inst, app), mode="runtime")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=str(ROOT), timeout=120)
    assert proc.returncode == 0, proc.stderr
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    assert raw["mode"] == "runtime"
    out = _drift(raw, base)
    got = {(d["line"], d["kind"], d["name"]) for d in out["drift"]}
    assert got == EXPECTED
    caching = next(d for d in out["drift"] if d["name"] == "caching")
    assert caching["installed"]["value"] == "True"


def test_no_baseline_is_one_line_and_the_binding_check_still_runs(libs, capsys):
    from rich.console import Console

    from remote_ops.check import check as check_mod
    _, inst, app = libs
    raw = op_check(_args(inst, app))
    res = check_mod.to_json("h", raw, check_mod.CheckRequest(against=["lib_d"], package="app_d"))
    assert res["drift"] == [] and "declares no lib_d version" in res["baseline"]["unavailable"]
    console = Console(width=200, force_terminal=False)
    from remote_ops.commands.check import render
    render(console, res)
    text = capsys.readouterr().out
    assert [line for line in text.splitlines() if "drift" in line] == [
        "no baseline for drift: the package declares no lib_d version: pass --baseline VERSION|PATH "
        "(binding check only)"]
    assert "3 unknown" in text


def test_against_has_one_default():
    from remote_ops.check import check as check_mod
    from remote_ops.agent import contract
    from remote_ops.commands import check as check_cmd
    assert check_mod.DEFAULT_AGAINST == list(contract.DEFAULT_AGAINST) == ["vllm"]
    import argparse

    from remote_ops.commands.params import add_arguments
    p = argparse.ArgumentParser()
    add_arguments(p, check_cmd)
    assert "default: vllm" in p.format_help().replace("\n", " ").replace("  ", " ")


# ----------------------------------------------------------------------------- real wheels
SPEC = "speculators.data_generation."
GEN = SPEC + "vllm_hidden_states_generator"
WORKER = SPEC + "custom_worker"


@pytest.fixture(scope="module")
def spec_src():
    return str(pkgsource.unpacked("speculators", "0.3.0"))


def _real(spec_src, version, overrides=None):
    raw = op_check({"sys_path": [spec_src, str(pkgsource.unpacked("vllm", version))], "drift": True,
                    **({"override_sources": overrides} if overrides else {})})
    return raw, drift.analyse(raw, ["vllm"], None)


def _four(out):
    return {(d["module"], d["kind"], d["name"]): d for d in out["drift"]
            if (d["module"], d["kind"], d["name"]) in {
                (WORKER, "attribute-gone", "get_input_embeddings"),
                (GEN, "default-changed", "enable_prefix_caching"),
                (GEN, "return-changed", "collective_rpc"),
                (GEN, "default-changed", "enable_chunked_prefill")}}


@pytest.mark.parametrize("version", ["0.17.0", "0.20.0"])
def test_real_wheels_report_the_four_measured_items(spec_src, version):
    raw, out = _real(spec_src, version)
    assert raw["declared"]["vllm"]["version"] == "0.11.0"        # speculators' own pin (datagen extra)
    assert out["baseline"]["version"] == "0.11.0"
    four = _four(out)
    assert len(four) == 4, out["drift"]
    assert len(out["drift"]) <= 15
    emb = four[(WORKER, "attribute-gone", "get_input_embeddings")]
    assert emb["line"] == 30 and emb["fix"]["to"] == "embed_input_ids"
    pc = four[(GEN, "default-changed", "enable_prefix_caching")]
    assert pc["line"] == 166 and pc["baseline"]["where"] == "vllm/config/cache.py:70"
    assert (pc["baseline"]["value"], pc["installed"]["value"]) == ("None", "True")
    cp = four[(GEN, "default-changed", "enable_chunked_prefill")]
    assert cp["line"] == 194 and cp["baseline"]["where"] == "vllm/config/scheduler.py:80"
    assert (cp["baseline"]["value"], cp["installed"]["value"]) == ("None", "True")
    for d in (pc, cp):
        assert d["fix"]["value"] == "False" and d["installed"]["where"].endswith(
            "vllm/config/%s.py:%s" % ("cache" if d is pc else "scheduler", d["installed"]["where"].rsplit(":", 1)[1]))
    rpc = four[(GEN, "return-changed", "collective_rpc")]
    assert rpc["line"] == 267 and (rpc["baseline"]["value"], rpc["installed"]["value"]) == ("list[Any]", "Any")
    assert rpc["fix"]["old"] == "captured_states_list[0]"
    assert rpc["baseline"]["where"] == "vllm/v1/executor/multiproc_executor.py:212"
    for d in four.values():
        assert d["baseline"]["where"] and d["installed"]["where"] and d["suggestion"]
    # the line 126 call passes no unique_reply_rank: its list result is unchanged, not drift
    assert not any(d["line"] == 126 for d in out["drift"])


def test_shipped_playbook_removes_the_four(spec_src):
    from remote_ops.playbook import edits
    from remote_ops.playbook import loader as playbook
    pb = playbook.load(ROOT / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml")
    overrides = {}
    for p in pb.patches:
        path = Path(spec_src, *p.module.split(".")).with_suffix(".py")
        res = edits.apply_edits(path.read_text(), list(p.edits), str(path))
        assert res.changed
        overrides[p.module] = res.new_text
    for version in ("0.17.0", "0.20.0"):
        _, before = _real(spec_src, version)
        raw, after = _real(spec_src, version, overrides)
        assert len(_four(before)) == 4
        assert _four(after) == {}, after["drift"]
        assert raw["findings"] == []


def test_emit_playbook_drafts_drift_fixes_with_exact_text(spec_src, tmp_path):
    from remote_ops.check import emit_playbook
    from remote_ops.playbook import loader as playbook
    from remote_ops.errors import ConfigError
    raw, out = _real(spec_src, "0.17.0")
    path = emit_playbook.write(tmp_path / "d.yaml", list(raw["findings"]) + out["drift"])
    import yaml
    doc = yaml.safe_load(path.read_text())
    by_mod = {p["module"]: p["edits"] for p in doc["patches"]}
    calls = {e["call"]: e for e in by_mod[GEN] if "call" in e}
    assert calls["CacheConfig"]["add"] == {"enable_prefix_caching": "False"}
    assert "FILL-ME (guess" in calls["CacheConfig"]["note"]
    assert calls["SchedulerConfig"]["add"]["enable_chunked_prefill"] == "False"
    # block_size from the module constant VLLM_BLOCK_SIZE is a guess too
    assert calls["Scheduler"]["add"] == {"block_size": "VLLM_BLOCK_SIZE"}
    assert "FILL-ME (guess" in calls["Scheduler"]["note"] and "VLLM_BLOCK_SIZE" in calls["Scheduler"]["note"]
    texts = [e["replace"] for edits_ in by_mod.values() for e in edits_ if "replace" in e]
    sources = {m: Path(spec_src, *m.split(".")).with_suffix(".py").read_text() for m in by_mod}
    for m, edits_ in by_mod.items():
        for e in edits_:
            if "replace" in e and "FILL-ME" not in e["replace"]["old"]:
                assert sources[m].count(e["replace"]["old"]) == 1, e     # exact source text, matches once
    assert {"old": "else self.get_input_embeddings(input_ids)", "new": "else self.embed_input_ids(input_ids)"} in texts
    assert {"old": "captured_states_list[0]", "new": "captured_states_list"} in texts
    with pytest.raises(ConfigError, match="placeholder left"):
        playbook.load(path)


def test_inspect_baseline_shows_what_changed(spec_src):
    from remote_ops.agent.compat import op_inspect
    vdir = str(pkgsource.unpacked("vllm", "0.17.0"))
    res = op_inspect({"symbols": ["vllm.config.cache:CacheConfig",
                                  "vllm.v1.executor.multiproc_executor:MultiprocExecutor.collective_rpc"],
                      "sys_path": [vdir]})
    bases = drift.inspect_diff(res, "0.11.0")
    assert bases["vllm"]["version"] == "0.11.0"
    cache, rpc = res["symbols"]
    assert "enable_prefix_caching: default None -> True" in cache["baseline"]["changes"]
    assert cache["baseline"]["origin"].startswith("vllm/config/cache.py:")
    assert "returns: list[Any] -> Any" in rpc["baseline"]["changes"]


def test_missing_symbol_gains_the_baseline_location(tmp_path):
    base, inst, app = tmp_path / "b", tmp_path / "i", tmp_path / "a"
    _write(base, {"__init__.py": "", "api.py": "def kept():\n    pass\n\n\ndef gone():\n    pass\n"})
    _write(inst, {"__init__.py": "", "api.py": "def kept():\n    pass\n"})
    (app / "app_d").mkdir(parents=True)
    (app / "app_d" / "__init__.py").write_text("")
    (app / "app_d" / "main.py").write_text("from lib_d.api import gone, kept\n")
    raw = op_check(_args(inst, app))
    (f,) = raw["findings"]
    assert f["kind"] == "missing-symbol" and "baseline" not in f
    out = _drift(raw, base)
    assert f["baseline"] == {"version": str(base), "where": "lib_d/api.py:5", "status": "function"}
    assert out["drift"] == []


def test_draft_text_edit_old_is_the_exact_multiline_source(tmp_path):
    """A finding without a mechanical fix becomes a text edit whose `old` is the call's exact text
    (not whitespace-collapsed or cut), so it matches the file."""
    from remote_ops.check import emit_playbook
    inst, app = tmp_path / "i", tmp_path / "a"
    _write(inst, {"__init__.py": "", "api.py": "def one(a):\n    pass\n"})
    (app / "app_d").mkdir(parents=True)
    (app / "app_d" / "__init__.py").write_text("")
    call = ("one(\n        'a fairly long first argument that makes the call span lines',\n"
            "        'and a second one that no longer fits the signature of one()',   # comment\n    )")
    text = "from lib_d.api import one\n\n\ndef f():\n    return " + call + "\n"
    (app / "app_d" / "main.py").write_text(text)
    raw = op_check(dict(_args(inst, app), drift=False))
    (f,) = raw["findings"]
    assert f["kind"] == "too-many-positional" and f["source"] == call
    doc = emit_playbook.draft(raw["findings"])
    (edit,) = doc["patches"][0]["edits"]
    assert edit["replace"]["old"] == call and text.count(edit["replace"]["old"]) == 1
    assert edit["replace"]["new"].startswith("FILL-ME")
