"""Hostile values over the real sshd: nothing runs beyond what was meant, secrets stay secret,
files remote-ops creates are private, targets outside the package/workdir are refused, host keys hold.

Every injection payload tries to create a *canary* file; the canary must never appear.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import stat
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from remote_ops.errors import AgentError
from tests.conftest import write_inventory

SECRET = "hf_SECRETtoken0123456789abcdef"


def payloads(canary: Path) -> list[str]:
    c = str(canary)
    return [f"$(touch {c})", f"`touch {c}`", f"; touch {c}", f"&& touch {c}", f"| touch {c}",
            f"\ntouch {c}\n", f"'; touch {c}; '", f"\"; touch {c}; \"", f"-oProxyCommand=touch {c}",
            f"--help; touch {c}", f"${{IFS}}touch${{IFS}}{c}", f"x\x00; touch {c}"]


@pytest.fixture
def canary(tmp_path) -> Path:
    c = tmp_path / "CANARY"
    yield c
    assert not c.exists(), f"an injected command ran: {c} exists"


def _canary_free(c: Path) -> None:
    assert not c.exists(), f"an injected command ran: {c} exists"


# ------------------------------------------------------------------------------ injection
def test_host_names_with_shell_payloads(sshd, tmp_path, env_vllm017, cli, canary):
    """Inventory host names are labels: any text, never reaching a shell."""
    hosts = {}
    for i, p in enumerate(payloads(canary)):
        name = f"h{i}{p}".replace(",", ";")
        if "\x00" in name or "\n" in name:
            continue
        hosts[name] = sshd.host_entry(str(env_vllm017))
    inv = write_inventory(tmp_path / "inv.yaml", hosts)
    status, out, err = cli("hosts", "--json", "-i", str(inv))
    assert status == 0, err
    for name in hosts:
        status, out, err = cli("facts", "--json", "-i", str(inv), "--", name)
        assert status == 0, (name, err)
        assert json.loads(out)["python"]["executable"]
    # names that could not be typed back (line breaks, surrounding spaces) are refused, in one line
    bad = write_inventory(tmp_path / "bad.yaml", {f"h\ntouch {canary}\n": sshd.host_entry(str(env_vllm017))})
    status, out, err = cli("hosts", "-i", str(bad))
    assert status == 2 and "invalid host name" in err and len(err.strip().splitlines()) == 1, err
    _canary_free(canary)


@pytest.mark.parametrize("field", ["python", "workdir", "user"])
def test_inventory_values_with_shell_payloads(sshd, tmp_path, env_vllm017, cli, canary, field):
    for i, p in enumerate(payloads(canary)):
        if "\x00" in p:
            continue
        entry = sshd.host_entry(str(env_vllm017))
        entry[field] = (entry.get(field) or "/tmp") + p if field != "user" else p
        inv = write_inventory(tmp_path / f"inv{i}.yaml", {"h": entry})
        status, out, err = cli("facts", "-i", str(inv), "h")
        assert "Traceback" not in err and "internal error" not in err, err
        if field == "python":
            assert status == 7 and "not found" in err, err     # the quoted path does not exist: nothing else ran
        elif field == "user":
            assert status == 4, err
        else:
            assert status == 0, err
        _canary_free(canary)


def test_env_values_and_job_arguments_with_payloads(sshd, tmp_path, env_vllm017, canary, state_dir):
    """Env values travel as JSON on stdin; job arguments are an argv list, never a shell line."""
    env = {f"V{i}": p for i, p in enumerate(payloads(canary)) if "\x00" not in p}   # NUL: refused by the inventory
    env["REMOTE_OPS_STATE_DIR"] = str(state_dir)
    sess = sshd.session(str(env_vllm017), env=env, workdir=str(tmp_path))
    try:
        pong = sess.call("ping.ping", {"echo": env["V0"]})      # the session works with these values set
        assert pong["pong"] is True and pong["echo"] == env["V0"]
        out = tmp_path / "argv.json"
        args = payloads(canary)
        args = [a for a in args if "\x00" not in a]   # argv cannot hold NUL: refused below on its own
        code = "import json,os,sys; json.dump([sys.argv[1:], {k: os.environ.get(k) for k in os.environ if k.startswith('V')}], open(%r,'w'))" % str(out)
        res = sess.call("jobs.launch", {"key": "inj; touch " + str(canary), "workdir": str(tmp_path),
                                        "command": [str(env_vllm017), "-c", code] + args,
                                        "env": {k: v for k, v in env.items() if "\x00" not in v and k != "REMOTE_OPS_STATE_DIR"}})
        job = res["job"]["job_id"]
        assert "/" not in job and ";" not in job and " " not in job
        deadline = time.time() + 30
        while time.time() < deadline and not out.exists():
            time.sleep(0.1)
        time.sleep(0.3)
        got_args, got_env = json.loads(out.read_text())
        assert got_args == args                       # every payload arrived as one literal argument
        for k, v in env.items():
            if k.startswith("V") and "\x00" not in v:
                assert got_env[k] == v
        # NUL in an argument: refused or a job that fails to start; either way nothing else runs
        sess.call_many([("jobs.launch", {"key": "nul", "workdir": str(tmp_path),
                                         "command": [str(env_vllm017), "-c", "pass", "a\x00; touch " + str(canary)]})])
        time.sleep(1)
    finally:
        sess.close()
    _canary_free(canary)


def test_module_and_path_payloads_refused_by_playbook_and_agent(sshd, tmp_path, env_vllm017, canary):
    from remote_ops.playbook import loader as playbook
    from remote_ops.errors import ConfigError

    for p in payloads(canary):
        with pytest.raises(ConfigError):
            playbook.loads(yaml.safe_dump({"patches": [{"module": "speculators" + p,
                                                        "edits": [{"id": "e", "replace": {"old": "a", "new": "b"}}]}]}))
    sess = sshd.session(str(env_vllm017), workdir=str(tmp_path))
    try:
        for p in payloads(canary):
            if "\x00" in p:
                continue   # see test_nul_in_playbook_path_is_refused_by_the_loader
            for target in ({"module": "speculators" + p}, {"path": "x" + p + ".py"}):
                (res,) = sess.call_many([("patching.read", {"targets": [target], "workdir": str(tmp_path)})])
                assert not res["ok"] and res["error"]["kind"] in ("no-module", "no-file", "outside", "not-source"), res
    finally:
        sess.close()
    _canary_free(canary)


# ------------------------------------------------------------------------------ patch helpers
def _read(sess, workdir, targets):
    return sess.call("patching.read", {"targets": targets, "workdir": str(workdir)})


def _apply_text(sess, workdir, target: dict, old: str, new: str, **extra):
    """Compute a text edit locally (the patch feature's way) and apply it in one transaction."""
    from remote_ops.playbook import edits

    t = _read(sess, workdir, [target])["targets"][0]
    text, enc = edits.decode_source(base64.b64decode(t["data"]))
    fr = edits.apply_edits(text, [edits.TextEdit(id="e1", old=old, new=new)], t["real"])
    return sess.call("patching.apply", {"targets": [{"real": t["real"], "label": t["label"], "module": t["module"],
                                                     "expected": t["sha256"], "encoding": enc, "spec": target,
                                                     "data": base64.b64encode(edits.encode_source(fr.new_text, enc)).decode()}],
                                        "playbook": "sec", "edit_ids": ["e1"], "who": "test",
                                        "workdir": str(workdir), **extra})


def test_playbook_text_with_payloads_is_only_file_content(sshd, tmp_path, env_vllm017, canary, state_dir):
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "mod.py").write_text("X = 1\n")
    sess = sshd.session(str(env_vllm017), workdir=str(wd), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    try:
        new = "X = 2\n# " + " ".join(p.replace("\n", " ").replace("\x00", "") for p in payloads(canary)) + "\n"
        res = _apply_text(sess, wd, {"path": "mod.py"}, "X = 1\n", new)
        assert res["changed"]
        assert (wd / "mod.py").read_text() == new
    finally:
        sess.close()
    _canary_free(canary)


# ------------------------------------------------------------------------------ secrets
def _all_cmdlines() -> str:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return "\n".join(out)


@pytest.fixture
def verbose_sshd(tmp_path):
    """An sshd of its own that logs at DEBUG3 and accepts every environment variable: a secret sent as
    an SSH env request (or anything else sshd records) would be in its log with its value."""
    from remote_ops.sshd import SshdServer
    from tests.conftest import SshdFixture

    server = SshdServer(tmp_path / "sshd-debug3", log_level="DEBUG3", extra_config="AcceptEnv *").start()
    yield SshdFixture(server)
    server.stop()


def test_secrets_never_on_command_line_ps_logs_journal_or_json(verbose_sshd, tmp_path, env_vllm017, cli,
                                                                state_dir):
    sshd = verbose_sshd
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "mod.py").write_text("X = 1\n")
    env = {"HF_TOKEN": SECRET, "REMOTE_OPS_STATE_DIR": str(state_dir)}
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(str(env_vllm017), env=env, workdir=str(wd))})
    status, out, err = cli("facts", "--json", "-v", "-i", str(inv), "h")
    assert status == 0, err
    assert SECRET not in out + err
    status, out, err = cli("hosts", "--json", "-i", str(inv))
    assert status == 0 and SECRET not in out + err

    # hold the transaction lock so the agent waits while we look at every process's command line
    state_dir.mkdir(exist_ok=True)
    fd = os.open(state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    sess = sshd.session(str(env_vllm017), env=env, workdir=str(wd))
    seen = []
    try:
        result = {}
        th = threading.Thread(target=lambda: result.update(r=_apply_text(sess, wd, {"path": "mod.py"}, "X = 1", "X = 2",
                                                                           lock_timeout=20)))
        th.start()
        for _ in range(20):
            time.sleep(0.1)
            seen.append(_all_cmdlines())
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        th.join(30)
        assert result["r"]["changed"]
        # a job given the secret as a secret: its files and command line must not show it
        res = sess.call("jobs.launch", {"key": "sec", "workdir": str(wd), "secrets": {"HF_TOKEN": SECRET},
                                        "command": [str(env_vllm017), "-c", "import time; time.sleep(2)"]})
        seen.append(_all_cmdlines())
        job_id = res["job"]["job_id"]
        sess.call("jobs.stop", {"job_id": job_id, "grace": 1})
    finally:
        sess.close()
    assert "_remote_ops_agent" in "".join(seen), "the agent was never seen running: the ps check proved nothing"
    assert not any(SECRET in s for s in seen), "the secret appeared in a process command line"
    assert SECRET not in (state_dir / "journal" / "journal.jsonl").read_text()
    for p in state_dir.rglob("*"):
        if p.is_file() and p.name != "secrets.json":
            assert SECRET.encode() not in p.read_bytes(), f"secret written to {p}"
        if p.name == "secrets.json":
            assert stat.S_IMODE(p.stat().st_mode) == 0o600
    sshd_log = sshd.server.log_file.read_text(errors="replace")     # an empty log would prove nothing
    assert "Accepted publickey" in sshd_log and "req exec" in sshd_log, "the sshd log misses this test's sessions"
    assert SECRET not in sshd_log


# ------------------------------------------------------------------------------ file modes
@pytest.mark.parametrize("target_mode", [0o644, 0o640, 0o600, 0o444, 0o400])
def test_created_files_are_private(sshd, tmp_path, env_vllm017, target_mode):
    wd = tmp_path / "wd"
    wd.mkdir()
    state = tmp_path / "state"
    state.mkdir(mode=0o777)
    os.chmod(state, 0o777)                      # a sloppy pre-existing state dir gets tightened
    mod = wd / "mod.py"
    mod.write_text("X = 1\n")
    os.chmod(mod, target_mode)
    # hostile: the host's interpreter runs under umask 000 (a wrapper, as a login shell profile could
    # set it), so every mode below must be the agent's own doing
    python = tmp_path / "python-umask-000"
    seen = tmp_path / "agent-umask"
    python.write_text(f"#!/bin/sh\numask 000\numask > {seen}\nexec {env_vllm017} \"$@\"\n")
    python.chmod(0o755)
    sess = sshd.session(str(python), workdir=str(wd), env={"REMOTE_OPS_STATE_DIR": str(state)})
    try:
        res = _apply_text(sess, wd, {"path": "mod.py"}, "X = 1", "X = 2")
        assert res["changed"]
        assert stat.S_IMODE(mod.stat().st_mode) == target_mode          # mode kept across the replace
        launched = sess.call("jobs.launch", {"key": "modes", "workdir": str(wd),
                                             "command": [str(env_vllm017), "-c", "pass"]})
        time.sleep(0.5)
        assert launched["job"]["job_id"]
        assert seen.read_text().strip() == "0000", "the agent did not run under the hostile umask"
    finally:
        sess.close()
    for p in [state, *state.rglob("*")]:
        m = stat.S_IMODE(p.lstat().st_mode)
        if p.is_dir():
            assert m == 0o700, f"{p} is {m:o}"
        else:
            assert m & 0o077 == 0, f"{p} is {m:o}: readable by others"
    backup = Path(res["entry"]["targets"][0]["backup"])
    bm = stat.S_IMODE(backup.stat().st_mode)
    assert bm & ~target_mode & 0o444 == 0, f"backup {bm:o} more readable than its original {target_mode:o}"
    assert backup.read_text() == "X = 1\n"


# ------------------------------------------------------------------------------ outside targets
def test_targets_outside_workdir_or_package_refused(sshd, tmp_path, env_vllm017):
    wd = tmp_path / "wd"
    wd.mkdir()
    outside = tmp_path / "outside.py"
    outside.write_text("X = 1\n")
    (wd / "link.py").symlink_to(outside)
    sess = sshd.session(str(env_vllm017), workdir=str(wd))
    try:
        for target in ({"path": str(outside)}, {"path": "../outside.py"}, {"path": "link.py"},
                       {"path": "/etc/passwd"}, {"path": "~/../../etc/passwd"}):
            (res,) = sess.call_many([("patching.read", {"targets": [target], "workdir": str(wd)})])
            assert not res["ok"] and res["error"]["kind"] == "outside", (target, res)
            assert "allow_outside" in (res["error"].get("hint") or "")
        # explicitly allowed: read works (and nothing else changes)
        res = _read(sess, wd, [{"path": str(outside), "allow_outside": True}])
        assert res["targets"][0]["real"] == str(outside)
        # a module inside the package is fine; the same file named by path outside the workdir is not
        res = _read(sess, wd, [{"module": "speculators.data_generation.vllm_hidden_states_generator"}])
        real = res["targets"][0]["real"]
        (res2,) = sess.call_many([("patching.read", {"targets": [{"path": real}], "workdir": str(wd)})])
        assert not res2["ok"] and res2["error"]["kind"] == "outside"
    finally:
        sess.close()


def test_apply_rechecks_outside_targets(sshd, tmp_path, env_vllm017):
    """Defence in depth: a forged or stale apply request naming a file outside is refused, nothing written."""
    wd = tmp_path / "wd"
    wd.mkdir()
    outside = tmp_path / "outside.py"
    outside.write_text("X = 1\n")
    sess = sshd.session(str(env_vllm017), workdir=str(wd), env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "st")})
    try:
        before = outside.read_bytes()
        for spec in (None, {"path": str(outside)}, {"path": "inside.py"}):
            (res,) = sess.call_many([("patching.apply", {"targets": [{
                "real": str(outside), "expected": hashlib.sha256(before).hexdigest(), "spec": spec,
                "data": base64.b64encode(b"X = 666\n").decode()}], "workdir": str(wd)})])
            written = outside.read_bytes() != before
            outside.write_bytes(before)
            assert not written, f"apply wrote a file outside the workdir without allow_outside ({spec})"
            assert not res["ok"]
    finally:
        sess.close()


def test_nul_in_playbook_path_is_refused_by_the_loader():
    """Found here: a NUL in a patch path passed the loader and crashed the agent's realpath."""
    from remote_ops.playbook import loader as playbook
    from remote_ops.errors import ConfigError

    with pytest.raises(ConfigError):
        playbook.loads('patches:\n  - path: "a\\0b.py"\n    edits: [{id: e, replace: {old: a, new: b}}]\n')


def test_nul_in_inventory_env_is_refused(tmp_path, cli):
    inv = tmp_path / "inv.yaml"
    inv.write_text('hosts:\n  h:\n    hostname: 127.0.0.1\n    env: {A: "x\\0; touch /tmp/c"}\n')
    status, out, err = cli("hosts", "-i", str(inv))
    assert status == 2 and "NUL" in err and f"{inv}:4" in err


# ------------------------------------------------------------------------------ host keys
def _kh_inventory(sshd, tmp_path, env_python, known: Path) -> Path:
    return write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(str(env_python), known_hosts=str(known))})


def test_accept_new_records_exactly_one_key_even_when_run_again(sshd, tmp_path, env_vllm017, cli):
    known = tmp_path / "kh"
    known.write_text("# a comment, no final newline")
    inv = _kh_inventory(sshd, tmp_path, env_vllm017, known)
    for _ in range(3):
        status, out, err = cli("facts", "h", "-i", str(inv), "--accept-new")
        assert status == 0, err
    lines = [ln for ln in known.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(lines) == 1 and lines[0].startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    assert known.read_text().startswith("# a comment, no final newline\n")
    fresh = tmp_path / "sub" / "known_hosts"            # created by remote-ops: private
    inv = _kh_inventory(sshd, tmp_path, env_vllm017, fresh)
    status, out, err = cli("facts", "h", "-i", str(inv), "--accept-new")
    assert status == 0, err
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600 and len(fresh.read_text().splitlines()) == 1


def test_key_for_another_port_or_host_is_not_trusted(sshd, tmp_path, env_vllm017, cli):
    key = sshd.known_hosts.read_text().split()[1:3]
    known = tmp_path / "kh"
    known.write_text(f"[127.0.0.1]:{sshd.port + 1} {key[0]} {key[1]}\n127.0.0.2 {key[0]} {key[1]}\n")
    inv = _kh_inventory(sshd, tmp_path, env_vllm017, known)
    status, out, err = cli("facts", "h", "-i", str(inv))
    assert status == 6 and "unknown host key" in err


def test_hashed_known_hosts_entry_is_honoured_and_a_changed_key_refused(sshd, tmp_path, env_vllm017, cli):
    import subprocess

    known = tmp_path / "kh"
    known.write_text(sshd.known_hosts.read_text())
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    assert known.read_text().startswith("|1|")
    inv = _kh_inventory(sshd, tmp_path, env_vllm017, known)
    status, out, err = cli("facts", "h", "-i", str(inv))
    assert status == 0, err
    # same name, other key: refused with or without --accept-new, file untouched
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    pub = (tmp_path / "other.pub").read_text().split()
    known.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    before = known.read_bytes()
    for extra in ([], ["--accept-new"]):
        status, out, err = cli("facts", "h", "-i", str(inv), *extra)
        assert status == 6 and "CHANGED" in err, err
    assert known.read_bytes() == before
