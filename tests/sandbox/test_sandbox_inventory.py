"""`remote-ops sandbox` with a non-default inventory (-i / $REMOTE_OPS_INVENTORY), over real sshd:
status tells which sandbox the inventory uses, up reuses it (no second sshd), an inventory that
defines `sandbox` by hand is refused before any sshd starts and the error names the inventory
(never a temporary file). REMOTE_OPS_SANDBOX_DIR is unset here: the root comes from the inventory."""

from __future__ import annotations

import json

from remote_ops import sandbox


def test_another_inventory_finds_the_sandbox_and_a_bad_one_starts_nothing(tmp_path, cli, monkeypatch):
    monkeypatch.delenv("REMOTE_OPS_SANDBOX_DIR")
    first = tmp_path / "a" / "inventory.yaml"
    first.parent.mkdir()
    root = first.parent / ".remote-ops" / "sandbox"
    try:
        status, out, err = cli("-i", str(first), "sandbox", "up", "--no-torch", "--json")
        assert status == 0, err
        up = json.loads(out)
        assert up["root"] == str(root) and up["root_from"] == f"beside {first}"
        # another inventory naming the same host (a copy kept elsewhere, given with -i or the env)
        other = tmp_path / "b" / "inventory.yaml"
        other.parent.mkdir()
        other.write_text((first.parent / "inventory.local.yaml").read_text())
        monkeypatch.setenv("REMOTE_OPS_INVENTORY", str(other))
        status, out, err = cli("sandbox", "status")
        assert status == 0 and f"running on 127.0.0.1:{up['port']} at {root}" in out, out + err
        assert f"host sandbox of {other}" in " ".join(out.split()), out
        # up with it reuses that sandbox's sshd (same port, no second one) and refreshes its block
        status, out, err = cli("sandbox", "up", "--no-torch", "--json")
        assert status == 0, err
        assert json.loads(out)["port"] == up["port"] and json.loads(out)["root"] == str(root)
        assert not (other.parent / ".remote-ops").exists()
        # a hand-written `sandbox` host: refused before anything starts, naming the inventory and line
        bad = tmp_path / "c" / "inventory.yaml"
        bad.parent.mkdir()
        bad.write_text("hosts:\n  gpu: {hostname: x}\n  sandbox: {hostname: y}\n")
        status, out, err = cli("-i", str(bad), "sandbox", "up", "--no-torch")
        assert status == 2 and f"{bad}:3: host 'sandbox' is already defined here" in err, err
        assert ".tmp" not in err and not (bad.parent / ".remote-ops").exists()     # no sshd, no root
        assert bad.read_text() == "hosts:\n  gpu: {hostname: x}\n  sandbox: {hostname: y}\n"
        status, out, err = cli("-i", str(bad), "sandbox", "status", "--json")
        assert status == 1 and json.loads(out)["exists"] is False and json.loads(out)["root"] == str(bad.parent / ".remote-ops" / "sandbox")
    finally:
        down = sandbox.down(str(first), purge=True)
    assert down["stopped"] and down["root"] == str(root)
