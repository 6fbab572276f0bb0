"""A repeated patch of a host in the state it was last planned for is ONE exec (read + conditional
apply); any difference (a target's bytes, a package version, the host's Python, the remembered
file itself) makes the agent skip the apply and the patch goes on in two execs, as before.

Real sshd, real speculators 0.3.0 + vLLM 0.17.0 sources. Execs are counted by the CLI's own stats
(REMOTE_OPS_STATS_FILE: every exec with the ops it carried) and by the --json ``round_trips``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from remote_ops import pkgsource
from remote_ops.connect.transport import ConnectOptions, Session
from remote_ops.patch import hoststate, patching, plancache
from remote_ops.playbook import loader as playbook
from tests.conftest import REPO, SPECULATORS, VLLM_NEW, write_inventory
from tests.connect.test_persist import muxdir, sshd_log  # noqa: F401  (fixtures)

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"
GEN = "speculators/data_generation/vllm_hidden_states_generator.py"
READ, APPLY = "patching.read", "patching.apply"
# what differs between two runs of the same patch whatever the path (ids, clocks)
VOLATILE = {"txid", "journal", "wall_s", "lock_wait_s", "round_trips"}


def site_file(python: Path, rel: str) -> Path:
    return next(Path(python).parent.parent.glob(f"lib/python*/site-packages/{rel}"))


def journal(state: Path) -> list[dict]:
    p = state / "journal" / "journal.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


class Host:
    """One inventory host on the test sshd, driven through the CLI, counting its execs."""

    def __init__(self, cli, tmp_path, sshd, python, state_dir, name="testhost"):
        self.cli, self.tmp, self.state, self.name = cli, tmp_path, state_dir, name
        self.entry = sshd.host_entry(str(python), env={"REMOTE_OPS_STATE_DIR": str(state_dir)},
                                     playbook=str(SHIPPED))
        self.inv = write_inventory(tmp_path / "inventory.yaml", {name: self.entry})
        self.stats = tmp_path / "stats.jsonl"

    def run(self, *args, env=None) -> tuple[dict, list[list[str]]]:
        self.stats.unlink(missing_ok=True)
        status, out, err = self.cli("-i", str(self.inv), *args, "--json",
                                    env=dict({"REMOTE_OPS_STATS_FILE": str(self.stats)}, **(env or {})))
        assert status == 0, err
        (line,) = self.stats.read_text().splitlines()
        return json.loads(out), json.loads(line)[self.name]["ops"]

    def patch(self, env=None):
        return self.run("patch", self.name, "--yes", env=env)

    def rollback(self):
        out, _ = self.run("rollback", self.name)
        assert out["changed"]

    def host(self):
        from remote_ops.connect.inventory import load
        return load(str(self.inv)).hosts[self.name]


def stable(out: dict) -> dict:
    return {k: v for k, v in out.items() if k not in VOLATILE}


@pytest.fixture
def one(sshd, fresh_env017, state_dir, tmp_path, cli):
    return Host(cli, tmp_path, sshd, fresh_env017, state_dir), site_file(fresh_env017, GEN)


def state_files(tmp_path) -> list[Path]:
    return sorted((tmp_path / "plan-cache").glob("*/host-*.state"))


def test_repeat_after_rollback_is_one_exec_with_the_same_files_and_journal(one, tmp_path):
    h, target = one
    original = target.read_bytes()
    first, ops = h.patch()
    assert first["changed"] and first["round_trips"] == 2 and ops == [[READ], [APPLY]]
    patched = target.read_bytes()
    (state,) = state_files(tmp_path)
    assert state.stat().st_mode & 0o777 == 0o600 and state.parent.stat().st_mode & 0o777 == 0o700
    h.rollback()
    assert target.read_bytes() == original

    fast, ops = h.patch()                                  # the host is as it was: one exec
    assert ops == [[READ, APPLY]] and fast["round_trips"] == 1 and fast["changed"]
    assert target.read_bytes() == patched
    h.rollback()
    state.unlink()                                         # forgotten: today's two execs
    slow, ops = h.patch()
    assert ops == [[READ], [APPLY]] and slow["round_trips"] == 2
    assert target.read_bytes() == patched
    # the same record (plans, diff, edits, verification, notes) and the same transaction
    assert stable(fast) == stable(slow) and fast["verification"]["verified"]
    assert set(fast) == set(slow) == set(first)
    entries = [e for e in journal(h.state) if e["action"] == "patch"]
    assert len(entries) == 3 and entries[1]["txid"] == fast["txid"] and entries[2]["txid"] == slow["txid"]
    key = lambda e: (e["playbook"], e["edits"], [(t["real"], t["before"], t["after"]) for t in e["targets"]])
    assert key(entries[0]) == key(entries[1]) == key(entries[2])
    assert fast["journal"]["targets"] == [dict(t, backup=f["backup"]) for t, f in
                                          zip(slow["journal"]["targets"], fast["journal"]["targets"])]

    again, ops = h.patch()                                 # a no-op rerun: still one exec
    assert ops == [[READ, APPLY]] and again["round_trips"] == 1 and not again["changed"]
    assert target.read_bytes() == patched and len(journal(h.state)) == 5


def test_a_target_that_differs_from_the_remembered_one_falls_back(one, tmp_path):
    h, target = one
    h.patch()
    h.rollback()
    target.write_bytes(target.read_bytes() + b"# changed on the host\n")
    changed_sha = hashlib.sha256(target.read_bytes()).hexdigest()

    # the agent's own answer to the conditional apply: skipped, saying what differed, nothing written
    pb = playbook.load(SHIPPED)
    host = h.host()
    early = patching.planned_for_seen(pb, host)
    assert early is not None and early["args"]["only_if"]["python"] == list(sys.version_info[:2])
    with Session(host, ConnectOptions()).open() as sess:
        raw, first = patching.read_then_apply(sess, pb, host, early["args"])
        assert sess.stats.execs == 1
    assert first["ok"] and set(first["result"]) == {"skipped", "recovered"}
    assert "vllm_hidden_states_generator" in first["result"]["skipped"] and "sha256" in first["result"]["skipped"]
    assert len(journal(h.state)) == 2 and target.read_bytes().endswith(b"# changed on the host\n")

    out, ops = h.patch()
    assert ops == [[READ, APPLY], [APPLY]] and out["round_trips"] == 2 and out["changed"]
    gen = next(t for t in out["targets"] if t["real"] == str(target.resolve()))
    assert gen["sha256_before"] == changed_sha
    data = target.read_bytes()
    assert b"block_size=VLLM_BLOCK_SIZE" in data and data.endswith(b"# changed on the host\n")
    assert changed_sha in {t["before"] for t in journal(h.state)[-1]["targets"]}
    # the host's new state is remembered: the next repeat is one exec again
    h.rollback()
    out, ops = h.patch()
    assert ops == [[READ, APPLY]] and out["changed"] and target.read_bytes() == data


def test_the_one_exec_read_leaves_out_the_bytes_the_plan_was_made_from(one, tmp_path):
    """In the remembered state the read answers each target's sha256 without its bytes (the plan
    was made from them); a host that differs gets its bytes read as before."""
    import base64

    h, target = one
    h.patch()
    patched = target.read_bytes()
    h.rollback()
    pb, host = playbook.load(SHIPPED), h.host()
    early = patching.planned_for_seen(pb, host)
    assert early["plan"] is not None
    with Session(host, ConnectOptions()).open() as sess:
        raw, first = patching.read_then_apply(sess, pb, host, early["args"], omit_data=True)
    assert raw["data_omitted"] and [t["data"] for t in raw["targets"]] == [None] * len(pb.patches)
    assert [t["sha256"] for t in raw["targets"]] == [t["sha256"] for t in early["seen"]["targets"]]
    assert first["ok"] and first["result"]["changed"] and target.read_bytes() == patched

    h.rollback()
    target.write_bytes(target.read_bytes() + b"# changed on the host\n")
    with Session(host, ConnectOptions()).open() as sess:
        raw, first = patching.read_then_apply(sess, pb, host, early["args"], omit_data=True)
    assert "data_omitted" not in raw and first["result"]["skipped"]
    assert [base64.b64decode(t["data"]) for t in raw["targets"]] == [Path(t["real"]).read_bytes()
                                                                    for t in raw["targets"]]


class _ApplySkips:
    """A session whose one-exec apply finds another state than the read did (as when another
    controller changes the host between the two ops of that exec): its only_if names other bytes."""

    def __init__(self, sess):
        self.sess = sess
        self.stats = sess.stats

    def call_many(self, ops, **kw):
        if [op for op, _ in ops] == [READ, APPLY]:
            (rop, rargs), (aop, aargs) = ops
            cond = dict(aargs["only_if"], targets=[dict(t, sha256="0" * 64) for t in aargs["only_if"]["targets"]])
            ops = [(rop, rargs), (aop, dict(aargs, only_if=cond))]
        return self.sess.call_many(ops, **kw)


def test_a_host_that_leaves_the_state_between_read_and_apply_is_read_again(one, tmp_path):
    h, target = one
    h.patch()
    patched = target.read_bytes()
    h.rollback()
    pb, host = playbook.load(SHIPPED), h.host()
    with Session(host, ConnectOptions()).open() as sess:
        out = patching.run_host(_ApplySkips(sess), host, pb)
        # the read left the bytes out, the apply skipped: the bytes are read, then applied as planned
        assert sess.stats.op_log == [[READ, APPLY], [READ], [APPLY]]
    assert out["changed"] and target.read_bytes() == patched and out["round_trips"] == 3
    assert {t["sha256_before"] for t in out["targets"] if t["changed"]} == \
        {t["before"] for t in journal(h.state)[-1]["targets"]}


def test_a_package_version_that_differs_falls_back(one, fresh_env017):
    h, target = one
    h.patch()
    h.rollback()
    _vllm_reports(fresh_env017, "0.17.1")
    pb, host = playbook.load(SHIPPED), h.host()
    with Session(host, ConnectOptions()).open() as sess:
        _raw, first = patching.read_then_apply(sess, pb, host, patching.planned_for_seen(pb, host)["args"])
    assert first["result"]["skipped"] == "vllm 0.17.1, not 0.17.0"

    out, ops = h.patch()
    assert ops == [[READ, APPLY], [APPLY]] and out["changed"] and out["packages"]["vllm"] == "0.17.1"
    assert b"block_size=VLLM_BLOCK_SIZE" in target.read_bytes()


def _venv(base_python: str, where: Path) -> Path:
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = pkgsource.site_packages(python)
    pkgsource.install_sources(site, *SPECULATORS, copy=True)
    pkgsource.install_sources(site, *VLLM_NEW, copy=False)
    return python


def test_another_python_minor_falls_back(sshd, state_dir, tmp_path, cli):
    """The same interpreter path (same inventory entry) now a Python of another minor version."""
    import os
    from tests.agent.test_host_pythons import _interpreter
    mine = "%d.%d" % sys.version_info[:2]
    other = next((p for p in (_interpreter(m) for m in ("3.12", "3.10", "3.13") if m != mine) if p), None)
    if other is None or subprocess.run([other, "-c", "1"], capture_output=True).returncode != 0:
        pytest.skip("no second Python minor version on this machine")
    venv = tmp_path / "venv"
    python = _venv(sys.executable, venv)
    h = Host(cli, tmp_path, sshd, python, state_dir)
    first, _ = h.patch()
    assert first["changed"] and first["python"][:2] == list(sys.version_info[:2])
    h.rollback()
    os.rename(venv, tmp_path / "venv-before")
    _venv(other, venv)                                    # same path, same pristine sources, new minor
    target = site_file(python, GEN)
    out, ops = h.patch()
    assert ops == [[READ, APPLY], [APPLY]] and out["changed"] and out["python"][:2] != first["python"][:2]
    assert {t["plan"] for t in out["targets"]} == {"computed"}        # planned for that Python
    assert b"block_size=VLLM_BLOCK_SIZE" in target.read_bytes()


def test_plan_cache_off_is_two_execs(one, tmp_path):
    h, target = one
    off = {"REMOTE_OPS_PLAN_CACHE": "off"}
    out, ops = h.patch(env=off)
    assert ops == [[READ], [APPLY]] and out["changed"]
    h.rollback()
    out, ops = h.patch(env=off)
    assert ops == [[READ], [APPLY]] and out["changed"] and b"block_size=VLLM_BLOCK_SIZE" in target.read_bytes()
    assert state_files(tmp_path) == []


@pytest.mark.parametrize("how", ["garbage", "truncated", "other-host", "wrong-sha", "wrong-real", "python"])
def test_a_tampered_remembered_state_is_ignored(one, tmp_path, how):
    h, target = one
    h.patch()
    patched = target.read_bytes()
    h.rollback()
    (state,) = state_files(tmp_path)
    text = state.read_text()
    doc = json.loads(text)
    if how == "garbage":
        state.write_bytes(b"\x00not json")
    elif how == "truncated":
        state.write_text(text[: len(text) // 2])
    elif how == "other-host":
        doc["host"] = "0" * 64
        state.write_text(json.dumps(doc))
    elif how == "wrong-sha":                             # well formed, but not what the host has
        doc["targets"][0]["sha256"] = "ab" * 32
        state.write_text(json.dumps(doc))
    elif how == "wrong-real":                            # a path the playbook does not resolve to
        decoy = tmp_path / "decoy.py"
        decoy.write_bytes(target.read_bytes())
        doc["targets"] = [dict(t, real=str(decoy)) for t in doc["targets"]]
        state.write_text(json.dumps(doc))
    else:                                                # a Python the host does not have
        doc["python"] = [3, 99, 0]
        state.write_text(json.dumps(doc))
    out, ops = h.patch()
    assert out["changed"] and target.read_bytes() == patched and out["round_trips"] == len(ops) == 2
    assert ops[-1] == [APPLY]
    if how == "wrong-real":
        assert (tmp_path / "decoy.py").read_bytes() != patched
    # the file is rewritten with what the host has: the next repeat is one exec
    h.rollback()
    out, ops = h.patch()
    assert ops == [[READ, APPLY]] and target.read_bytes() == patched


def test_a_prompt_or_a_dry_run_takes_the_two_step_path(one, tmp_path):
    h, target = one
    h.patch()
    h.rollback()
    dry, ops = h.run("patch", h.name, "--dry-run")
    assert ops == [[READ], ["patching.verify"]] and not dry["changed"]
    pb, host = playbook.load(SHIPPED), h.host()
    with Session(host, ConnectOptions()).open() as sess:
        out = patching.run_host(sess, host, pb, confirm=lambda plan: False)
        assert out["declined"] and sess.stats.op_log == [[READ]]
    assert hoststate.recall(pb, host, patching.packages_to_query(pb)) is not None
    plancache.clear_memory()


def _vllm_reports(python: Path, version: str) -> None:
    """vLLM ``version`` now, as the host's interpreter finds it: a dist-info of that version in
    site-packages, ahead of the linked sources' own (those stay untouched: shared between tests)."""
    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    src = Path(next(site.glob("_remote_ops_vllm.pth")).read_text().strip())
    (info,) = src.glob("vllm-*.dist-info")
    shutil.copytree(info, site / f"vllm-{version}.dist-info")
    meta = site / f"vllm-{version}.dist-info" / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.17.0", f"Version: {version}", 1))


def test_one_exec_through_a_kept_connection_and_its_resident_agent(sshd_log, muxdir, fresh_env017, state_dir,
                                                                   tmp_path, cli):
    """With --persist the read + conditional apply go to the host's resident agent, which compares
    the state as a fresh process would (a package version changed between two commands is seen)."""
    h = Host(cli, tmp_path, sshd_log, fresh_env017, state_dir)
    target = site_file(fresh_env017, GEN)
    h.patch()
    patched = target.read_bytes()
    h.rollback()
    out, ops = h.patch()
    st = json.loads(h.stats.read_text().splitlines()[-1])[h.name]
    assert ops == [[READ, APPLY]] and out["changed"] and target.read_bytes() == patched
    assert st["mux_execs"] == 1 and st["agent_cache"] == ["resident"]
    h.rollback()
    _vllm_reports(fresh_env017, "0.17.1")
    out, ops = h.patch()
    st = json.loads(h.stats.read_text().splitlines()[-1])[h.name]
    assert ops == [[READ, APPLY], [APPLY]] and out["packages"]["vllm"] == "0.17.1"
    assert st["agent_cache"] == ["resident", "resident"] and target.read_bytes() == patched
