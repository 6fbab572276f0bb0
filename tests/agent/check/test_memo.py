"""The host's check memo (agent/check/memo.py, agent/core/reads.py): a static check's result reused while every
read it made sees the same again, and only then.

In-process on real speculators 0.3.0 + vLLM 0.17.0 sources (a reused result equals a computed one,
with drift) and on a small library written here, which each test then changes the way a host
changes: a signature edited in place (same size, same mtime), a module shadowed by a new one earlier
on the path, an installed version bumped, a damaged entry, a directory that is not private; and
bytecode written by another process importing the package, which changes no result (still a hit).
Over a real sshd: a repeated patch verifies from the memo and says so in its stats, with the same
result, and a repeated check stays a hit across an import of the package by the host's interpreter.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from remote_ops import pkgsource
from remote_ops.agent import compat, protocol
from remote_ops.agent.check import memo
from remote_ops.agent.core import reads
from remote_ops.agent.protocol import AgentFailure
from remote_ops.connect import bundle
from tests.conftest import SPECULATORS, VLLM_NEW

GEN = "speculators.data_generation.vllm_hidden_states_generator"


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A private agent cache entry for this process's agent code, as the bootstrap sets it."""
    d = tmp_path / "agent-entry"
    d.mkdir(mode=0o700)
    monkeypatch.setitem(protocol.BOOT, "cache_dir", str(d))
    protocol.MEMO.clear()
    yield d / memo.STORE
    protocol.MEMO.clear()


def counts() -> dict:
    out = dict(protocol.MEMO)
    protocol.MEMO.clear()
    return out


def wire(result: dict) -> dict:
    """The result as the controller receives it, less the time it took."""
    out = json.loads(json.dumps(result, default=str))
    out.pop("elapsed_s", None)
    return out


def computed(args: dict, monkeypatch) -> dict:
    """The same check with no memo at all (the host cache off)."""
    with monkeypatch.context() as m:
        m.setitem(protocol.BOOT, "cache_dir", None)
        return wire(compat.op_check(dict(args)))     # counts nothing: there is no memo


# --------------------------------------------------------------------------- real sources
def test_a_reused_result_equals_a_computed_one_on_real_sources(store, monkeypatch):
    path = [str(pkgsource.unpacked(*SPECULATORS)), str(pkgsource.unpacked(*VLLM_NEW))]
    args = {"targets": [GEN], "against": ["vllm"], "sys_path": path, "drift": True}
    first = wire(compat.op_check(dict(args)))
    assert counts() == {"miss": 1}
    again = wire(compat.op_check(dict(args)))
    assert counts() == {"hit": 1}
    assert again == first == computed(args, monkeypatch)
    assert {(f["kind"], f["name"]) for f in first["findings"]} >= {
        ("unexpected-keyword", "eos_token_id"), ("missing-argument", "block_size")}
    assert first["touches"] and first["versions"]["vllm"] == VLLM_NEW[1]
    (entry,) = store.glob("*.json")
    assert entry.stat().st_mode & 0o777 == 0o600 and store.stat().st_mode & 0o777 == 0o700
    kinds = {r[0] for r in json.loads(entry.read_bytes().partition(b"\n")[2])["reads"]}
    assert kinds == {"spec", "exists", "data", "walk_py", "distribution"}
    # other arguments are another entry
    compat.op_check(dict(args, drift=False))
    assert counts() == {"miss": 1} and len(list(store.glob("*.json"))) == 2


# --------------------------------------------------------------------------- a library written here
def write(p: Path, text: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


@pytest.fixture
def lib(tmp_path):
    """app (the caller) -> mylib (the library, installed with a dist-info), and an empty path entry
    before the library's that a test may fill."""
    app, early, site = tmp_path / "app", tmp_path / "early", tmp_path / "site"
    early.mkdir()
    write(app / "myapp" / "__init__.py", "")
    write(app / "myapp" / "use.py", "from mylib.core import make\n\nmake(1, b=2)\n")
    write(site / "mylib" / "__init__.py", "")
    core = write(site / "mylib" / "core.py", "def make(a, b=0):\n    return a\n")
    write(site / "mylib-1.0.dist-info" / "METADATA", "Metadata-Version: 2.1\nName: mylib\nVersion: 1.0\n\n")
    args = {"targets": ["myapp.use"], "against": ["mylib"], "sys_path": [str(app), str(early), str(site)]}
    return args, core, early, site


def kinds(result: dict) -> set:
    return {(f["kind"], f["name"]) for f in result["findings"]}


def test_a_signature_edited_in_place_is_seen_same_size_same_mtime(store, lib, monkeypatch):
    args, core, _, _ = lib
    assert kinds(compat.op_check(dict(args))) == set()
    assert kinds(compat.op_check(dict(args))) == set() and counts() == {"miss": 1, "hit": 1}
    st = core.stat()
    core.write_text("def make(a, c=0):\n    return a\n")             # b -> c: same size
    os.utime(core, ns=(st.st_atime_ns, st.st_mtime_ns))               # and the old mtime
    assert core.stat().st_size == st.st_size
    now = wire(compat.op_check(dict(args)))
    assert counts() == {"stale": 1, "miss": 1}
    assert kinds(now) == {("unexpected-keyword", "b")} and now == computed(args, monkeypatch)
    assert wire(compat.op_check(dict(args))) == now and counts() == {"hit": 1}


def import_as_a_job_does(python: str, module: str, path: list[str]) -> None:
    """``import module`` in another interpreter, writing bytecode as Python does by default (the
    suite may run with PYTHONDONTWRITEBYTECODE; a host's jobs do not): each package directory it
    imports from gets a ``__pycache__``."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    subprocess.run([python, "-c", "try:\n    import %s\nexcept ImportError:\n    pass\n" % module],
                   env=env, check=True, stdin=subprocess.DEVNULL, capture_output=True)


def caches(root: Path) -> set[Path]:
    return {p for p in root.rglob("__pycache__") if p.is_dir()}


def test_bytecode_written_by_an_import_of_the_package_keeps_the_result(store, lib, monkeypatch):
    """The flake of the suite (a check's memo stale between two runs on a loaded machine): another
    test's host agent imported vLLM from the shared source cache, writing ``vllm/__pycache__``, and the
    check's walk of the package had recorded every directory, .py files or not. The same event done
    here: no module changed, so the result is reused; a module added is still seen."""
    args, _, _, site = lib
    args = {"package": "myapp", "against": ["mylib"], "sys_path": args["sys_path"]}   # walks myapp
    app = Path(args["sys_path"][0])
    first = wire(compat.op_check(dict(args)))
    assert counts() == {"miss": 1} and first["targets"] == [{"module": "myapp.use", "path": str(app / "myapp" / "use.py")}]
    before = caches(app) | caches(site)
    import_as_a_job_does(sys.executable, "myapp.use", [str(app), str(site)])
    assert caches(app) - before and caches(site) - before        # app/myapp/__pycache__, site/mylib/__pycache__
    write(app / "myapp" / "assets" / "table.json", "{}\n")           # a folder of data, no module
    assert wire(compat.op_check(dict(args))) == first == computed(args, monkeypatch)
    assert counts() == {"hit": 1}
    # a new module in a new subpackage of the walked package: what the check reads changed
    write(app / "myapp" / "sub" / "late.py", "from mylib.core import make\n\nmake(1, c=3)\n")
    now = wire(compat.op_check(dict(args)))
    assert counts() == {"stale": 1, "miss": 1} and now == computed(args, monkeypatch)
    assert kinds(now) == {("unexpected-keyword", "c")} and {"module": "myapp.sub.late", "path": str(
        app / "myapp" / "sub" / "late.py")} in now["targets"]


def test_a_walk_records_the_modules_it_found_and_nothing_else(tmp_path):
    pkg = tmp_path / "pkg"
    write(pkg / "__init__.py", "")
    mod = write(pkg / "sub" / "mod.py", "X = 1\n")
    r = reads.Reads(record=True)
    assert r.walk_py(str(pkg)) == [(str(pkg), ["__init__.py"]), (str(pkg / "sub"), ["mod.py"])]
    import py_compile
    import importlib.util
    py_compile.compile(str(mod), cfile=importlib.util.cache_from_source(str(mod)), doraise=True)
    (pkg / "empty").mkdir()
    write(pkg / "sub" / "notes.txt", "not a module\n")
    assert (pkg / "sub" / "__pycache__").is_dir() and reads.unchanged(r.log)
    for change in (lambda: write(pkg / "empty" / "new.py", ""),               # a module in a new folder
                   lambda: mod.rename(pkg / "sub" / "moved.py"),            # one renamed
                   lambda: (pkg / "sub" / "moved.py").unlink()):            # one removed
        change()
        assert not reads.unchanged(r.log)
        r = reads.Reads(record=True)
        r.walk_py(str(pkg))
        assert reads.unchanged(r.log)


def test_a_module_shadowed_by_a_new_one_earlier_on_the_path_is_seen(store, lib, monkeypatch):
    args, _, early, _ = lib
    assert kinds(compat.op_check(dict(args))) == set()
    # the lookup of mylib found it in site/; the same lookup now finds early/mylib first
    write(early / "mylib" / "__init__.py", "")
    write(early / "mylib" / "core.py", "def make(a):\n    return a\n")
    counts()
    now = wire(compat.op_check(dict(args)))
    assert counts() == {"stale": 1, "miss": 1}
    assert kinds(now) == {("unexpected-keyword", "b")} and now == computed(args, monkeypatch)


def test_a_submodule_turned_into_a_package_is_seen(store, lib, monkeypatch):
    args, core, _, site = lib
    compat.op_check(dict(args))
    write(site / "mylib" / "core" / "__init__.py", "def make(a, b, d):\n    return a\n")   # wins over core.py
    counts()
    now = wire(compat.op_check(dict(args)))
    assert counts() == {"stale": 1, "miss": 1}
    assert kinds(now) == {("missing-argument", "d")} and now == computed(args, monkeypatch)


def test_an_installed_version_bump_is_seen(store, lib, monkeypatch):
    args, _, _, site = lib
    assert compat.op_check(dict(args))["versions"] == {"mylib": "1.0"}
    meta = site / "mylib-1.0.dist-info" / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 1.0", "Version: 1.1"))
    counts()
    now = wire(compat.op_check(dict(args)))
    assert counts() == {"stale": 1, "miss": 1} and now["versions"] == {"mylib": "1.1"}


@pytest.mark.parametrize("how", ["flip a byte", "truncate", "not json", "another key"])
def test_a_damaged_entry_is_ignored_removed_and_replaced(store, lib, monkeypatch, how):
    args, _, _, _ = lib
    first = wire(compat.op_check(dict(args)))
    (entry,) = store.glob("*.json")
    blob = entry.read_bytes()
    head, _, body = blob.partition(b"\n")
    if how == "flip a byte":
        i = body.index(b'"findings"')
        blob = head + b"\n" + body[:i + 2] + b"X" + body[i + 3:]
    elif how == "truncate":
        blob = blob[:len(blob) // 2]
    elif how == "not json":
        bad = b"{not json"
        blob = reads.digest(bad).encode() + b"\n" + bad
    else:   # well formed, but written for another key
        other = json.loads(body)
        other["key"] = "0" * 64
        body = json.dumps(other).encode()
        blob = reads.digest(body).encode() + b"\n" + body
    entry.write_bytes(blob)
    counts()
    assert wire(compat.op_check(dict(args))) == first == computed(args, monkeypatch)
    assert counts() == {"damaged": 1, "miss": 1}
    assert entry.read_bytes().partition(b"\n")[0] == reads.digest(entry.read_bytes().partition(b"\n")[2]).encode()
    compat.op_check(dict(args))
    assert counts() == {"hit": 1}


def test_nothing_is_kept_without_a_private_cache(store, lib, monkeypatch):
    args, _, _, _ = lib
    compat.op_check(dict(args))
    store.chmod(0o755)                       # readable by others: neither read nor written
    counts()
    compat.op_check(dict(args))
    compat.op_check(dict(args))
    assert counts() == {} and len(list(store.glob("*.json"))) == 1
    monkeypatch.setitem(protocol.BOOT, "cache_dir", None)      # the host cache off
    compat.op_check(dict(args))
    assert counts() == {}


def test_opaque_reads_and_refusals_are_never_kept(store):
    def opaque(r):
        r.not_replayable("imports the library")
        return {"x": 1}

    assert memo.cached("t", {"a": 1}, opaque) == {"x": 1}
    assert memo.cached("t", {"a": 1}, opaque) == {"x": 1}
    assert counts() == {"miss": 2} and not list(store.glob("*.json"))

    def refuse(r):
        raise AgentFailure("verify-failed", "no")

    for _ in range(2):
        with pytest.raises(AgentFailure):
            memo.cached("t", {"a": 2}, refuse)
    assert not list(store.glob("*.json"))


def test_a_log_this_code_did_not_write_is_not_unchanged(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x")
    r = reads.Reads(record=True)
    r.data(str(f))
    assert reads.unchanged(r.log)
    assert not reads.unchanged([["bogus", str(f), None]])
    assert not reads.unchanged([["data", str(f)]])
    f.write_bytes(b"y")
    assert not reads.unchanged(r.log)
    f.unlink()
    assert not reads.unchanged(r.log)


def test_the_store_stays_bounded(store, monkeypatch):
    monkeypatch.setattr(memo, "LIMIT", 3)
    for i in range(6):
        memo.cached("t", {"i": i}, lambda r: {"i": 1})
    assert len(list(store.glob("*.json"))) == 3


# --------------------------------------------------------------------------- over a real sshd
def test_a_repeated_patch_verifies_from_the_memo_with_the_same_result(sshd, fresh_env017, state_dir, tmp_path, cli):
    from tests.patch.test_one_exec import SHIPPED, Host, stable

    h = Host(cli, tmp_path, sshd, fresh_env017, state_dir)
    h.entry["env"][bundle.CACHE_ENV] = str(tmp_path / "agent-cache")
    from tests.conftest import write_inventory
    h.inv = write_inventory(tmp_path / "inventory.yaml", {h.name: h.entry})

    def memo_of_last_run():
        (line,) = h.stats.read_text().splitlines()
        return json.loads(line)[h.name]["check_memo"]

    first, _ = h.patch()
    assert first["changed"] and {"miss": 1} in memo_of_last_run()
    h.rollback()
    again, _ = h.patch()
    assert again["changed"] and {"hit": 1} in memo_of_last_run()
    assert stable(again)["verification"] == stable(first)["verification"]
    assert again["verification"]["verified"] and again["verification"]["targeted_gone"] == 4
    # the same check from the CLI: computed once, then reused, the same findings
    h.rollback()
    outs = []
    site = pkgsource.site_packages(fresh_env017)
    for i in range(2):
        if i:
            # between the runs the host's interpreter imports the package, as a job does, writing
            # speculators/__pycache__ into the directories the check walked: no module changed
            before = caches(site / "speculators")
            import_as_a_job_does(str(fresh_env017), "speculators", [])
            assert caches(site / "speculators") - before
        h.stats.unlink(missing_ok=True)
        status, out, err = cli("-i", str(h.inv), "check", "testhost", "-p", str(SHIPPED), "--json",
                               env={"REMOTE_OPS_STATS_FILE": str(h.stats)})
        assert status == 1, err                     # findings on the unpatched host
        outs.append((json.loads(out), memo_of_last_run()))
    (a, ma), (b, mb) = outs
    # two results reused: the call sites and the playbook's model preflight (check.model)
    assert {"hit": 2} in mb and a["findings"] == b["findings"] and len(a["findings"]) >= 4
    # the playbook's default target_model is not on this host: listed as not checked, not a finding
    assert a["model"] == b["model"] and a["model"]["findings"] == [] and a["model"]["unknown"][0]["what"] == "model"
