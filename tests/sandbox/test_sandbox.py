"""`remote-ops sandbox up|down|status`, the managed inventory block, and `scripts/demo.sh` (the README's
first command) run end to end, all against real sshd daemons on 127.0.0.1 and real package sources.
The repository's own inventory and sandbox are never touched (conftest points both into tmp)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from remote_ops import sandbox
from tests.conftest import REPO

OTHER = """\
# my hosts (this comment and the host below must survive)
hosts:
  gpu-a:
    hostname: 10.0.0.5   # not contacted by this test
    python: /opt/venv/bin/python
groups:
  gpus: [gpu-a]
"""


def _block(text: str) -> str:
    start = text.index(sandbox.BEGIN)
    return text[start: text.index(sandbox.END, start) + len(sandbox.END)]


def _outside(text: str) -> str:
    b = _block(text)
    return text.replace(b, "<block>")


def test_sandbox_up_status_down_and_the_managed_block(tmp_path, cli):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(OTHER)
    root = tmp_path / "default-sandbox"          # conftest's REMOTE_OPS_SANDBOX_DIR
    try:
        status, out, err = cli("-i", str(inv), "sandbox", "up", "--no-torch", "--json")
        assert status == 0, err
        up = json.loads(out)
        assert up["running"] and up["root"] == str(root) and up["packages"]["vllm"] == "0.17.0"
        text = inv.read_text()
        assert text.count(sandbox.BEGIN) == 1 and text.startswith("default: sandbox\n")
        assert _outside(text) == "default: sandbox\n" + OTHER.replace("hosts:\n", "hosts:\n<block>\n", 1)
        assert f"port: {up['port']}" in _block(text)

        # the host it wrote is real: facts over its sshd, from its interpreter
        status, out, err = cli("-i", str(inv), "facts", "sandbox", "--json")
        assert status == 0, err
        facts = json.loads(out)
        assert facts["packages"]["vllm"]["version"] == "0.17.0"
        assert facts["python"]["executable"] == str(root / "venv" / "bin" / "python")

        status, out, err = cli("-i", str(inv), "sandbox", "status", "--json")
        assert status == 0 and json.loads(out)["running"] and json.loads(out)["port"] == up["port"]

        # a second `up` keeps the port, refreshes the block (a hand edit inside it is overwritten) and
        # keeps every edit outside it
        edited = inv.read_text().replace("max_samples: 24", "max_samples: 99999") + "# added by hand\n"
        inv.write_text(edited)
        status, out, err = cli("-i", str(inv), "sandbox", "up", "--no-torch", "--json")
        assert status == 0, err
        assert json.loads(out)["port"] == up["port"]
        again = inv.read_text()
        assert again.count(sandbox.BEGIN) == 1 and "max_samples: 24" in again and "99999" not in again
        assert _outside(again) == _outside(edited)

        # an inventory that includes its .local companion (as the repository's does): the host goes
        # there, and `up` names that file, not the one it did not write
        with_local = tmp_path / "with-local" / "inventory.yaml"
        with_local.parent.mkdir()
        with_local.write_text("include: [inventory.local.yaml]\nhosts: {}\n")
        status, out, err = cli("-i", str(with_local), "sandbox", "up", "--no-torch")
        assert status == 0, err
        local = with_local.parent / "inventory.local.yaml"
        assert f"in{local}(includedby{with_local})" in "".join(out.split()), out     # however rich wraps it
        assert "sandbox:" in local.read_text() and "sandbox" not in with_local.read_text()

        status, out, err = cli("-i", str(inv), "sandbox", "down")
        assert status == 0 and "sandbox stopped" in out, out
        status, out, err = cli("-i", str(inv), "sandbox", "status", "--json")
        assert status == 1 and json.loads(out)["running"] is False
        status, out, err = cli("-i", str(inv), "facts", "sandbox")
        assert status != 0 and "refused" in err.lower(), err
        status, out, err = cli("-i", str(inv), "sandbox", "down", "--purge", "--json")
        assert status == 0 and json.loads(out) == {"stopped": False, "purged": True, "root": str(root),
                                                       "root_from": "$REMOTE_OPS_SANDBOX_DIR"}
        assert not root.exists()
        status, out, err = cli("-i", str(inv), "sandbox", "status")
        assert status == 1 and "no sandbox yet" in out
    finally:
        sandbox.down(str(inv), purge=True)


def test_sandbox_refuses_an_inventory_it_cannot_edit_safely(tmp_path, cli):
    inv = tmp_path / "inventory.yaml"
    inv.write_text("hosts: {a: {hostname: x}}\n")
    status, out, err = cli("-i", str(inv), "sandbox", "up", "--no-torch")
    try:
        assert status == 2 and "'hosts:' must be a block mapping" in err, err
        assert inv.read_text() == "hosts: {a: {hostname: x}}\n"
    finally:
        sandbox.down(str(inv), purge=True)


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None


@pytest.mark.long
def test_demo_script_runs_end_to_end(tmp_path, monkeypatch):
    """The README's first command, as written, on a sandbox under tmp: sandbox up -> facts -> check
    (findings) -> patch (verified) -> check (clean) -> extract --tail -> verify -> status."""
    # the same inventory and sandbox dir for the script and for this process's `sandbox.down` below
    monkeypatch.setenv("REMOTE_OPS_INVENTORY", str(tmp_path / "inventory.yaml"))
    monkeypatch.setenv("REMOTE_OPS_SANDBOX_DIR", str(tmp_path / "sandbox"))
    env = dict(os.environ)
    repo_inventory = _sha(REPO / "inventory.yaml")
    # a fresh clone's inventory (it includes inventory.local.yaml, where sandbox up writes its host)
    (tmp_path / "inventory.yaml").write_bytes((REPO / "inventory.yaml").read_bytes())
    try:
        proc = subprocess.run(["bash", str(REPO / "scripts" / "demo.sh")], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=900)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        steps = ["sandbox up", "facts sandbox", "check sandbox", "patch sandbox --yes", "extract sandbox --tail",
                 "verify sandbox", "status sandbox"]
        pos = [out.find(f"$ remote-ops {s}") for s in steps]
        assert all(p >= 0 for p in pos) and pos == sorted(pos), out[-4000:]
        assert "verified: 4 targeted findings gone" in out, out[-4000:]
        clean_check = out[out.index("$ remote-ops patch sandbox --yes"):out.index("$ remote-ops extract")]
        assert "no findings" in clean_check
        assert "Done." in out
        # what it left behind is real: one journaled patch, a succeeded job, complete outputs
        status = subprocess.run([str(REPO / ".venv" / "bin" / "remote-ops"), "verify", "sandbox", "--json"],
                                env=env, capture_output=True, text=True, timeout=300)
        assert status.returncode == 0, status.stderr
        hist = subprocess.run([str(REPO / ".venv" / "bin" / "remote-ops"), "history", "sandbox", "--json"],
                              env=env, capture_output=True, text=True, timeout=120)
        assert [e["action"] for e in json.loads(hist.stdout)["entries"]] == ["patch"]
    finally:
        down = sandbox.down(env["REMOTE_OPS_INVENTORY"], purge=True)
    assert down["stopped"] and down["root"] == str(tmp_path / "sandbox"), down   # no sshd left behind
    assert _sha(REPO / "inventory.yaml") == repo_inventory, "the demo touched the repository's inventory"
    assert _sha(tmp_path / "inventory.yaml") == repo_inventory, "sandbox up rewrote the (tracked) inventory"
    assert "sandbox:" in (tmp_path / "inventory.local.yaml").read_text()


def test_sandbox_server_flow_host_extract_status_verify_gather_stop(tmp_path, cli):
    """`sandbox up` also writes sandbox-server (the same sshd; its own venv with pyarrow, workdir, state
    dir and the prepared Arrow data): the README's server-flow lines run on it over the real sshd."""
    pytest.importorskip("pyarrow")
    inv = tmp_path / "inventory.yaml"
    root = tmp_path / "default-sandbox"          # conftest's REMOTE_OPS_SANDBOX_DIR
    try:
        status, out, err = cli("-i", str(inv), "sandbox", "up", "--json")
        assert status == 0, err
        up = json.loads(out)
        srv = up["server_host"]
        assert srv["name"] == "sandbox-server" and srv["python"] == str(root / "server" / "venv" / "bin" / "python")
        assert up["server_packages"]["speculators"] == "0.9.0"
        host = f"port: {up['port']}"
        local = (tmp_path / "inventory.local.yaml").read_text()
        assert "sandbox-server:" in local and local.count(host) == 2       # both hosts on the one sshd
        # the stand-in client reads the Arrow directory with the host's own pyarrow
        probe = subprocess.run([srv["python"], "-c", "import pyarrow, torch; print(pyarrow.__version__)"],
                               capture_output=True, text=True)
        assert probe.returncode == 0, probe.stderr

        status, out, err = cli("-i", str(inv), "extract", "sandbox-server", "--tail")
        assert status == 0, err + out
        rows = len(sandbox.prepared_rows())
        assert f"{rows}/{rows} samples" in out
        status, out, err = cli("-i", str(inv), "status", "sandbox-server", "--json")
        job = json.loads(out)["job"]
        assert status == 0 and job["state"] == "succeeded" and job["layout"] == "hs_safetensors"
        assert job["samples"]["done"] == job["samples"]["expected"] == rows
        assert job["tokens"]["done"] == sum(len(r) for r in sandbox.prepared_rows())
        status, out, err = cli("-i", str(inv), "verify", "sandbox-server", "--all")
        assert status == 0, err + out
        assert f"{rows} hs_<N>.safetensors files of {rows} expected" in out
        assert f"token ids of {rows} file(s) compared with their prepared data rows, 0 differ" in out
        assert "data_<N>.pt" not in out and "data_config.json" not in out
        # the client ran through the shipped launcher, uploaded into the workdir (one client: no line of its own)
        workdir = Path(srv["workdir"])
        assert (workdir / "run_clients.py").read_bytes() == \
            (Path(sandbox.__file__).parent / "playbook" / "shipped" / "scripts" / "run_clients.py").read_bytes()
        assert job["label"].startswith("STAND-IN")           # the stand-in named after the launcher's --
        # clients: 3 (a host var): three stand-in clients, each its contiguous third, every file written again
        for f in (Path(srv["prepared"]) / "hidden_states").glob("hs_*.safetensors"):
            f.unlink()
        local = tmp_path / "inventory.local.yaml"
        local.write_text(re.sub(r"\n( +)sample_delay: 0\n", r"\n\1sample_delay: 0\n\1clients: 3\n", local.read_text()))
        assert "clients: 3" in local.read_text()
        status, out, err = cli("-i", str(inv), "extract", "sandbox-server", "--tail")
        assert status == 0, err + out
        assert all(f"[run_clients] rank {r}/3: imports " in out for r in range(3))
        assert out.count(f"Processing {rows // 3} samples") == 3 and f"{rows}/{rows} samples" in out
        status, out, err = cli("-i", str(inv), "verify", "sandbox-server", "--all")
        assert status == 0 and f"{rows} hs_<N>.safetensors files of {rows} expected" in out, err + out

        # gather does not copy this layout: one line naming the flow, nothing written
        dest = tmp_path / "gathered"
        status, out, err = cli("-i", str(inv), "gather", "sandbox-server", "--to", str(dest))
        assert status != 0
        assert "gather does not copy the server flow's hs_<N>.safetensors files" in err, err
        assert "data_config.json" not in out + err and not list(dest.glob("*"))

        # stop: the run resumed (its files lost, each sample slowed down) and stopped; both processes gone
        for f in (Path(srv["prepared"]) / "hidden_states").glob("hs_*.safetensors"):
            f.unlink()
        local.write_text(local.read_text().replace("sample_delay: 0", "sample_delay: 5"))
        status, out, err = cli("-i", str(inv), "extract", "sandbox-server")
        assert status == 0, err + out
        status, out, err = cli("-i", str(inv), "stop", "sandbox-server")
        assert status == 0, err + out
        status, out, err = cli("-i", str(inv), "status", "sandbox-server", "--json")
        job = json.loads(out)["job"]
        assert job["state"] == "stopped" and job["server"]["state"] != "running", job

        status, out, err = cli("-i", str(inv), "sandbox", "status", "--json")
        assert status == 0 and json.loads(out)["server_host"]["workdir"] == srv["workdir"]
    finally:
        down = sandbox.down(str(inv), purge=True)
    assert down["stopped"] and not root.exists()
