"""The Python API (remote_ops.api): the README's example, run as written against a real sshd host,
and a group whose hosts get different playbook values from their inventory vars."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from remote_ops import pkgsource
from tests.conftest import REPO, SPECULATORS, STANDIN, VLLM_NEW, write_inventory

PLAYBOOK = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"

def _readme_example() -> str:
    """The README's "Python API" example, as written there (it expects ./inventory.yaml with the
    sandbox host). No fallback copy: if the README loses it, this test fails."""
    readme = (REPO / "README.md").read_text()
    assert "import remote_ops.api as ro" in readme, "README.md has no Python API example any more"
    start = readme.index("import remote_ops.api as ro")
    return readme[start: readme.index("```", start)]


def test_readme_example_runs_against_sshd(tmp_path, sshd, fresh_env017, state_dir):
    write_inventory(tmp_path / "inventory.yaml",
                    {"sandbox": sshd.host_entry(str(fresh_env017), playbook=str(PLAYBOOK),
                                                env={"REMOTE_OPS_STATE_DIR": str(state_dir)})},
                    default="sandbox")
    code = _readme_example()
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "vllm 0.17.0"
    assert lines[1].endswith("findings") and int(lines[1].split()[0]) > 0
    assert lines[2] == "changed True then False"


def test_api_records_match_cli_json(tmp_path, sshd, env_vllm017, cli):
    import remote_ops.api as ro

    inv_path = write_inventory(tmp_path / "inventory.yaml", {"one": sshd.host_entry(str(env_vllm017))})
    status, out, _ = cli("-i", str(inv_path), "facts", "one", "--json")
    assert status == 0
    with ro.open_inventory(str(inv_path)) as inv:
        res = inv.facts("one")
    assert res.ok and res.exit_status == 0
    api = res["one"].value
    cli_json = json.loads(out)
    assert set(api) == set(cli_json)
    assert api["packages"] == cli_json["packages"]


def test_api_bad_inventory_and_unknown_host(tmp_path, sshd):
    import remote_ops.api as ro
    from remote_ops.errors import ConfigError, UsageError

    # the error types the API's docstring names are the API's own names too
    assert ro.ConfigError is ConfigError and ro.UsageError is UsageError
    assert {"UsageError", "ConfigError", "RemoteOpsError"} <= set(ro.__all__)

    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  a:\n    port: seventy\n")
    with pytest.raises(ConfigError) as exc:
        ro.open_inventory(str(bad))
    assert ":3:" in exc.value.message
    good = write_inventory(tmp_path / "inventory.yaml", {"a": sshd.host_entry()})
    with ro.open_inventory(str(good)) as inv, pytest.raises(UsageError):
        inv.facts("nope")


@pytest.mark.long
def test_group_extract_uses_each_hosts_vars(tmp_path, sshd):
    """One playbook, two hosts: each host's vars choose its output dir and sample count."""
    import remote_ops.api as ro

    py = pkgsource.make_env(tmp_path / "venv", [SPECULATORS, VLLM_NEW], with_torch=True)
    pb = yaml.safe_load(PLAYBOOK.read_text())
    pb["extract"] = {"command": ["{python}", "{vars.script}", "--output-dir", "{output_dir}",
                                 "--max-samples", "{vars.samples}"],
                     "output_dir": "{vars.out}", "gpus": {"count": 0, "free": False}}
    pb_path = tmp_path / "pb.yaml"
    pb_path.write_text(yaml.safe_dump(pb, sort_keys=False))
    hosts = {}
    for name, samples in (("a", 4), ("b", 8)):
        state = tmp_path / f"state-{name}"
        state.mkdir()
        hosts[name] = sshd.host_entry(str(py), playbook=str(pb_path), workdir=str(tmp_path),
                                      env={"REMOTE_OPS_STATE_DIR": str(state)},
                                      vars={"script": str(STANDIN), "samples": samples, "target_model": "tiny-standin",
                                            "out": str(tmp_path / f"out-{name}")})
    inv_path = write_inventory(tmp_path / "inventory.yaml", hosts, {"pair": ["a", "b"]})
    with ro.open_inventory(str(inv_path)) as inv:
        # the same site-packages for both hosts: patch once, then both preflights pass
        assert inv.patch("a").ok
        started = inv.extract("pair")
        assert started.ok, started.to_json()
        for name in ("a", "b"):
            cmd = started[name].value["job"]["command"]
            assert str(tmp_path / f"out-{name}") in cmd
        deadline = time.monotonic() + 120
        while True:
            st = inv.status("pair")
            assert st.ok, st.to_json()
            states = {r.host: r.value["job"]["state"] for r in st}
            if all(s in ("succeeded", "failed", "stopped", "lost") for s in states.values()) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert states == {"a": "succeeded", "b": "succeeded"}, st.to_json()
    assert len(list((tmp_path / "out-a").glob("data_*.pt"))) == 4
    assert len(list((tmp_path / "out-b").glob("data_*.pt"))) == 8
