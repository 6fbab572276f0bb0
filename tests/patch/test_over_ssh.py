"""patch / rollback / history over a real sshd against real speculators 0.3.0 + vLLM 0.17.0 sources."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from remote_ops.patch import patching
from remote_ops.playbook import loader as playbook
from remote_ops.errors import RefusedError
from tests.conftest import REPO

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"
GEN = "speculators/data_generation/vllm_hidden_states_generator.py"
FIXED_KINDS = {"unexpected-keyword", "missing-argument"}


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def site_file(python: Path, rel: str) -> Path:
    return next(Path(python).parent.parent.glob(f"lib/python*/site-packages/{rel}"))


def journal(state: Path) -> list[dict]:
    p = state / "journal" / "journal.jsonl"
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []


def findings(sess) -> list[dict]:
    pb = playbook.load(SHIPPED)
    return sess.call("compat.check", patching.check_args(pb))["findings"]


@pytest.mark.long
def test_sandbox_round_trip(sshd, fresh_env017, state_dir, inventory_file, cli):
    target = site_file(fresh_env017, GEN)
    original = target.read_bytes()
    inv = inventory_file(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)},
                         playbook=str(SHIPPED))
    sess = sshd.session(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    before = findings(sess)
    assert {(f["kind"], f["name"]) for f in before} >= {
        ("unexpected-keyword", "eos_token_id"), ("unexpected-keyword", "kv_cache_specs"),
        ("missing-argument", "block_size"), ("missing-argument", "is_encoder_decoder")}

    status, out, err = cli("-i", str(inv), "patch", "testhost", "--dry-run", "--json")
    assert status == 0, err
    dry = json.loads(out)
    # a dry run re-checks the new text on the host too (read + verify), and writes nothing
    assert dry["diff"] and not dry["changed"] and dry["round_trips"] == 2
    assert dry["verification"]["verified"] and dry["verification"]["targeted_gone"] == 4
    assert target.read_bytes() == original and journal(state_dir) == []

    status, out, err = cli("-i", str(inv), "patch", "testhost", "--yes", "--json")
    assert status == 0, err
    res = json.loads(out)
    # the dry run saw this host's state and planned for it: the apply travels with the read (one
    # exec; the agent checked the state was unchanged: tests/patch/test_one_exec.py)
    assert res["changed"] and res["round_trips"] == 1
    ver = res["verification"]
    # the four findings the edits' `fixes` name were there before and are gone; nothing else remains
    assert ver["verified"] and ver["targeted_gone"] == 4 and ver["remaining"] == []
    assert ver["calls_rechecked"] > 0 and ver["line"].startswith(
        f"verified: 4 targeted findings gone, {ver['calls_rechecked']} calls re-checked")
    # edits that fix no finding (semantic changes) are named as unverified, not passed over in silence
    assert "execute-model-then-sample-tokens" in ver["line"] and "declare no fixes" in ver["line"]
    patched = target.read_bytes()
    assert patched != original and b"block_size=VLLM_BLOCK_SIZE" in patched
    assert b"self.executor.sample_tokens(None, non_block=True)" in patched
    # the behaviour fixes measured on a real GPU (issue 10): prefix caching and chunked prefill off,
    # rank 0's reply used as is, the renamed embedding method in the bound forward
    assert b"enable_prefix_caching=False" in patched and b"enable_chunked_prefill=False" in patched
    assert b"captured_states_list[0]" not in patched
    worker = site_file(fresh_env017, GEN.replace("vllm_hidden_states_generator", "custom_worker")).read_text()
    assert "self.embed_input_ids(input_ids)" in worker and "get_input_embeddings" not in worker
    import ast
    ast.parse(patched.decode()), ast.parse(worker)
    # checked against the host after patching: no finding of the fixed kinds is left
    assert [f for f in findings(sess) if f["kind"] in FIXED_KINDS] == []
    # the old bytecode can never run: the cached pyc is a hash-checked one of the new source
    pycs = list((target.parent / "__pycache__").glob("vllm_hidden_states_generator.*.pyc"))
    assert pycs and all(int.from_bytes(p.read_bytes()[4:8], "little") & 0b11 == 0b11 for p in pycs)

    mtime = target.stat().st_mtime_ns
    status, out, err = cli("-i", str(inv), "patch", "testhost", "--yes", "--json")
    again = json.loads(out)
    assert status == 0 and not again["changed"] and again["diff"] == "" and again["round_trips"] == 1
    states = {e["edit"]: e["state"] for e in again["edits"]}
    # (the transformers-5 edit: this host's environment has no transformers: not for it)
    assert states.pop("pydantic-rebuild-knows-torch") == "not-applicable"
    assert set(states.values()) == {"applied"}
    assert target.read_bytes() == patched and target.stat().st_mtime_ns == mtime
    entries = journal(state_dir)
    assert [e["action"] for e in entries] == ["patch"]
    e = entries[0]
    assert e["targets"][0]["before"] == hashlib.sha256(original).hexdigest()
    assert e["targets"][0]["after"] == hashlib.sha256(patched).hexdigest()
    backup = Path(e["targets"][0]["backup"])
    assert backup.read_bytes() == original
    assert oct(backup.stat().st_mode & 0o777) == oct(0o600 & (target.stat().st_mode | 0o200))
    assert (state_dir / "journal").stat().st_mode & 0o777 == 0o700
    assert e["who"]["controller"] and e["edits"] and e["playbook"] == "eagle3-speculators-0.3.0"

    status, out, err = cli("-i", str(inv), "history", "testhost", "--json")
    assert status == 0 and json.loads(out)["entries"][0]["txid"] == e["txid"]

    status, out, err = cli("-i", str(inv), "rollback", "testhost", "--json")
    assert status == 0, err
    assert target.read_bytes() == original
    assert len(findings(sess)) == len(before)
    status, out, err = cli("-i", str(inv), "rollback", "testhost", "--json")
    assert status == 0 and not json.loads(out)["changed"]
    assert [x["action"] for x in journal(state_dir)] == ["patch", "rollback"]
    sess.close()


# ------------------------------------------------------------------------------ refusals
@pytest.fixture
def workhost(sshd, tmp_path, state_dir):
    """A host with a workdir holding a small package and a playbook factory."""
    work = tmp_path / "work"
    (work / "app").mkdir(parents=True)
    (work / "app" / "__init__.py").write_text("")
    (work / "app" / "mod.py").write_text(
        "BLOCK = 16\n\n\ndef f(**kw):\n    return kw\n\n\ndef go():\n    return f(a=1, b=2)\n")
    (work / "app" / "other.py").write_text("X = 1\nY = 2\n")
    host = sshd.host(python=sys.executable, workdir=str(work), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    from remote_ops.connect.transport import ConnectOptions, Session
    sess = Session(host, ConnectOptions()).open()

    def book(body: str, requires: str = "") -> playbook.Playbook:
        p = tmp_path / "pb.yaml"
        p.write_text(requires + "patches:\n" + body)
        return playbook.load(p)
    yield work, host, sess, book
    sess.close()


def snapshot(work: Path) -> dict:
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in work.rglob("*") if p.is_file()}


REFUSALS = [
    ("syntax", "  - path: app/mod.py\n    edits:\n      - id: broken\n        replace: {old: 'BLOCK = 16', new: 'BLOCK = (16'}\n",
     "", "does not compile"),
    ("undefined-name", "  - module: app.mod\n    edits:\n      - id: add-bs\n        call: f\n        add: {block_size: VLLM_BLOCK_SIZE}\n",
     "", "name 'VLLM_BLOCK_SIZE' is not defined"),
    ("missing-anchor", "  - module: app.mod\n    edits:\n      - id: ok\n        call: f\n        drop: [b]\n"
     "      - id: gone\n        replace: {old: 'BLOCK = 32', new: 'BLOCK = 64'}\n", "", "edit 'gone' on "),
    ("ambiguous-anchor", "  - module: app.other\n    edits:\n      - id: amb\n        replace: {old: ' = ', new: ' == '}\n",
     "", "ambiguous"),
    ("version", "  - module: app.mod\n    edits:\n      - id: ok\n        call: f\n        drop: [b]\n",
     "requires:\n  pytest: '<1'\n", "does not satisfy pytest<1"),
    ("outside", "  - path: /etc/hostname\n    edits:\n      - id: x\n        replace: {old: a, new: b}\n", "", "outside"),
]


@pytest.mark.parametrize("name,body,requires,message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals_leave_host_untouched(workhost, state_dir, name, body, requires, message):
    work, host, sess, book = workhost
    before = snapshot(work)
    pb = book(body, requires)
    with pytest.raises(RefusedError, match=message):
        patching.run_host(sess, host, pb)
    assert snapshot(work) == before
    assert journal(state_dir) == []


def test_unknown_callee_is_a_playbook_error(workhost):
    work, host, sess, book = workhost
    from remote_ops.errors import ConfigError
    pb = book("  - module: app.mod\n    edits:\n      - id: nope\n        call: Nope\n        drop: [b]\n")
    with pytest.raises(ConfigError, match=r"pb.yaml:4: unknown callee in edit 'nope'"):
        patching.run_host(sess, host, pb)


def test_changed_between_read_and_write(workhost, state_dir):
    work, host, sess, book = workhost
    pb = book("  - module: app.mod\n    edits:\n      - id: ok\n        call: f\n        drop: [b]\n")
    plan = patching.compute(pb, patching.read(sess, pb, host), host.name)
    target = work / "app" / "mod.py"
    target.write_text(target.read_text() + "# someone else\n")
    before = snapshot(work)
    with pytest.raises(RefusedError, match="changed underneath"):
        patching.apply(sess, plan, host)
    assert snapshot(work) == before and journal(state_dir) == []


def test_import_check_failure_rolls_back(sshd, fresh_env017, state_dir):
    """speculators needs packages (pydantic, torch) this host env lacks: the import check fails -> rolled back."""
    target = site_file(fresh_env017, GEN)
    original = target.read_bytes()
    host = sshd.host(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    from remote_ops.connect.transport import ConnectOptions, Session
    with Session(host, ConnectOptions()).open() as sess:
        with pytest.raises(RefusedError, match=r"importing the patched modules failed: .*No module named .*rolled back"):
            patching.run_host(sess, host, playbook.load(SHIPPED), import_check=True)
        assert sess.stats.execs == 2
    assert target.read_bytes() == original
    assert [e["action"] for e in journal(state_dir)] == ["patch", "rollback"]


def test_import_check_success_symlink_crlf(workhost, state_dir):
    work, host, sess, book = workhost
    real = work / "real_mod.py"
    real.write_bytes(b"def f(**kw):\r\n    return kw\r\n\r\n\r\nVALUE = f(a=1, b=2)\r\n")
    real.chmod(0o640)
    (work / "app" / "linked.py").symlink_to(real)
    pb = book("  - module: app.linked\n    edits:\n      - id: drop-b\n        call: f\n        drop: [b]\n")
    out = patching.run_host(sess, host, pb, import_check=True)
    assert out["changed"] and out["import_check"]["error"] is None
    assert (work / "app" / "linked.py").is_symlink()
    assert real.read_bytes() == b"def f(**kw):\r\n    return kw\r\n\r\n\r\nVALUE = f(a=1)\r\n"
    assert real.stat().st_mode & 0o777 == 0o640
    backup = Path(out["journal"]["targets"][0]["backup"])
    assert backup.stat().st_mode & 0o777 == 0o600 & (0o640 | 0o200)
    assert patching.rollback(sess, to=None, force=False, while_running=False)["changed"]
    assert real.read_bytes().endswith(b"VALUE = f(a=1, b=2)\r\n")


def test_an_edit_whose_text_changed_since_the_host_was_patched_names_that_patch(workhost, state_dir):
    """A newer playbook whose edit writes other text than the one that patched the host: its old text
    is gone and its new one is not there. The refusal names the patch that wrote the file and the way
    out (rollback, then patch); after the rollback the newer playbook applies."""
    work, host, sess, book = workhost
    original = (work / "app" / "mod.py").read_bytes()
    first = patching.run_host(sess, host, book(
        "  - path: app/mod.py\n    edits:\n      - id: block\n        replace: {old: 'BLOCK = 16', new: 'BLOCK = 32'}\n"))
    txid = first["journal"]["txid"]
    newer = book("  - path: app/mod.py\n    edits:\n      - id: block\n        replace: {old: 'BLOCK = 16', new: 'BLOCK = 64'}\n")
    patched = snapshot(work)
    with pytest.raises(RefusedError, match="anchor not found") as info:
        patching.run_host(sess, host, newer)
    line = info.value.one_line()
    assert f"the file is as patch {txid} (playbook {first['playbook']}, " in line, line
    assert f"run `remote-ops rollback {host.name}` (or --to {txid})" in line
    assert snapshot(work) == patched and [e["action"] for e in journal(state_dir)] == ["patch"]
    assert patching.rollback(sess, to=None, force=False, while_running=False)["changed"]
    assert (work / "app" / "mod.py").read_bytes() == original
    assert patching.run_host(sess, host, newer)["changed"]
    assert "BLOCK = 64" in (work / "app" / "mod.py").read_text()
    # a file no patch of this host wrote (edited by hand): the refusal has no such tail
    (work / "app" / "mod.py").write_text("BLOCK = 8\n")
    with pytest.raises(RefusedError, match="anchor not found") as info:
        patching.run_host(sess, host, newer)
    assert "remote-ops rollback" not in info.value.one_line()


def test_rollback_refuses_when_file_changed(workhost, state_dir):
    work, host, sess, book = workhost
    pb = book("  - module: app.mod\n    edits:\n      - id: ok\n        call: f\n        drop: [b]\n")
    original = (work / "app" / "mod.py").read_bytes()
    patching.run_host(sess, host, pb)
    (work / "app" / "mod.py").write_text("edited by hand\n")
    with pytest.raises(RefusedError, match="changed since patch") as info:
        patching.rollback(sess, to=None, force=False, while_running=False)
    assert "--force" in info.value.one_line()
    assert (work / "app" / "mod.py").read_text() == "edited by hand\n"
    assert patching.rollback(sess, to=None, force=True, while_running=False)["changed"]
    assert (work / "app" / "mod.py").read_bytes() == original


def test_edit_that_does_not_fix_what_it_claims_is_refused_on_the_host(sshd, fresh_env017, state_dir,
                                                                         inventory_file, cli, tmp_path):
    """The edits' `fixes` are verified against the NEW text before anything is written: an edit that
    claims to fix Request(eos_token_id=...) but changes something else is refused, host untouched."""
    target = site_file(fresh_env017, GEN)
    original = target.read_bytes()
    pb = tmp_path / "liar.yaml"
    pb.write_text(
        "name: liar\n"
        "check:\n  targets: [speculators.data_generation.vllm_hidden_states_generator]\n  against: [vllm]\n"
        "patches:\n"
        "  - module: speculators.data_generation.vllm_hidden_states_generator\n"
        "    edits:\n"
        "      - id: pretend-to-fix-request\n"
        "        call: Request\n"
        "        add: {priority: '0'}\n"
        "        fixes: [{kind: unexpected-keyword, symbol: vllm.v1.request.Request, name: eos_token_id}]\n")
    inv = inventory_file(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    status, out, err = cli("-i", str(inv), "patch", "testhost", "--playbook", str(pb), "--yes")
    assert status == 8, err
    assert "still has 1 finding" in err and "eos_token_id" in err
    assert target.read_bytes() == original
    assert journal(state_dir) == []


@pytest.mark.long
def test_a_host_patched_by_an_earlier_playbook_is_told_to_roll_back_then_takes_the_new_one(
        sshd, fresh_env017, state_dir, tmp_path):
    """The upgrade path on the real speculators 0.3.0 sources: the shipped playbook of an earlier
    remote-ops (7a3c5d8, before the generator's non-blocking sample_tokens) patched the host; today's
    playbook rewrote one of its edits' texts, so it finds neither text there. It refuses, naming the
    earlier patch and `remote-ops rollback`; after the rollback it applies, and the file is exactly
    what today's playbook makes of the release."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gt", REPO / "benchmarks" / "gpu" / "throughput.py")
    gt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gt)
    if gt.prepare_before(gt.BEFORE_REV, tmp_path / "before") is None:
        pytest.skip(f"git cannot show {gt.BEFORE_REV} here (not a clone with history)")
    earlier = playbook.load(tmp_path / "before" / "playbooks" / SHIPPED.name)
    target = site_file(fresh_env017, GEN)
    release = target.read_bytes()
    host = sshd.host(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    from remote_ops.connect.transport import ConnectOptions, Session
    with Session(host, ConnectOptions()).open() as sess:
        first = patching.run_host(sess, host, earlier)
        assert first["changed"]
        by_earlier = target.read_bytes()
        with pytest.raises(RefusedError, match="anchor not found") as info:
            patching.run_host(sess, host, playbook.load(SHIPPED))
        line = info.value.one_line()
        assert f"the file is as patch {first['journal']['txid']} (playbook {first['playbook']}, " in line, line
        assert f"run `remote-ops rollback {host.name}`" in line
        assert target.read_bytes() == by_earlier
        assert patching.rollback(sess, to=None, force=False, while_running=False)["changed"]
        assert target.read_bytes() == release
        assert patching.run_host(sess, host, playbook.load(SHIPPED))["changed"]
        assert b"non_block=True" in target.read_bytes()
    assert [e["action"] for e in journal(state_dir)] == ["patch", "rollback", "patch"]
