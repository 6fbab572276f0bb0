"""The sandbox's STAND-IN job end to end with the SHIPPED playbook: the sandbox's own inventory vars
(remote_ops/sandbox.py), the shipped script uploaded by extract, extract --tail, status, verify.
The host is this machine through the test sshd, with this venv's python (torch 2.13.0 CPU, tqdm):
what the sandbox venv provides for the stand-in."""

from __future__ import annotations

import hashlib
import json
import sys

import pytest
import torch
import yaml

from remote_ops import sandbox
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(240)

PLAYBOOK = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"
SCRIPT = REPO / "remote_ops" / "playbook" / "shipped" / "scripts" / "extract_hidden_states.py"


@pytest.fixture
def sandbox_host(tmp_path, sshd):
    paths = sandbox.SandboxPaths(tmp_path / "sandbox")
    sandbox.prepare_workdir(paths)
    entry = sandbox.host_entry(paths, sshd.server)
    entry["python"] = sys.executable          # the sandbox venv's stand-in needs only torch + tqdm
    entry["playbook"] = str(PLAYBOOK)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": "sandbox", "hosts": {"sandbox": entry}}))
    return paths, entry, inv


@pytest.mark.long
def test_standin_through_extract_tail_status_verify(sandbox_host, cli):
    paths, entry, inv = sandbox_host
    status, out, err = cli("-i", str(inv), "extract", "--tail", "--skip-check")
    assert status == 0, err
    # labelled STAND-IN by extract (from the job record) and by the job's own output
    assert "STAND-IN: torch-CPU stand-in for extract_hidden_states.py" in " ".join(err.split())
    assert "STAND-IN: torch-CPU stand-in generator driven by the shipped extract_hidden_states.py" in out
    assert "succeeded" in out and "24/24 samples" in out and "(STAND-IN)" in out
    # the hand-off line names the stand-in, not an unpatched vLLM worker (the sandbox is patched)
    assert ("captured states did not come through shared memory: the STAND-IN generator computes them in "
            "this process (no vLLM worker to hand them over)") in out
    assert "worker is not patched" not in out
    # the shipped script was uploaded into the workdir, byte for byte, and is what ran
    uploaded = paths.workdir / "extract_hidden_states.py"
    assert hashlib.sha256(uploaded.read_bytes()).hexdigest() == hashlib.sha256(SCRIPT.read_bytes()).hexdigest()
    out_dir = paths.workdir / "hidden_states"
    files = sorted(out_dir.glob("data_*.pt"))
    assert len(files) == 24
    dataset = [json.loads(l) for l in (paths.workdir / sandbox.DATASET).read_text().splitlines()]
    limit = int(entry["vars"]["max_model_len"]) - 1
    assert any(len(r.get("input_ids") or []) > limit for r in dataset)      # truncation was exercised
    for i, row in enumerate(dataset):
        s = torch.load(out_dir / f"data_{i}.pt", weights_only=True)
        ids = row.get("input_ids") or list(row["text"].encode())
        assert s["input_ids"].tolist() == ids[:limit]
        assert s["loss_mask"].tolist() == (row.get("loss_mask") or [1] * len(ids))[:limit]
        assert [tuple(h.shape) for h in s["hidden_states"]] == [(min(len(ids), limit), 64)] * 4
    cfg = json.loads((out_dir / "data_config.json").read_text())
    assert cfg["hidden_states"]["layer_ids"] == [2, 4, 5, 7] and cfg["model"]["hidden_size"] == 64

    status, out, err = cli("-i", str(inv), "status")
    assert status == 0 and "(STAND-IN)" in out and "STAND-IN: torch-CPU stand-in" in " ".join(out.split())
    status, out, err = cli("-i", str(inv), "verify", "--all", "--json")
    rec = json.loads(out)
    assert status == 0 and rec["ok"] and rec["files"] == 24 and rec["checked"] == 24
    assert rec["layers_hidden"] == [[4, 64]] and rec["config"]["layers"] == 4
    status, out, err = cli("-i", str(inv), "status", "--json")
    assert json.loads(out)["job"]["label"].startswith("STAND-IN")

    # a second extract: nothing re-uploaded, nothing regenerated
    status, out, err = cli("-i", str(inv), "extract", "--tail", "--skip-check", "--json")
    events = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    files_ev = events[0]["preflight"]["files"]
    assert status == 0 and [f["action"] for f in files_ev] == ["unchanged"] * 3    # the script, run_identity.py, layout.py
    assert "all 24 samples are already in" in out
