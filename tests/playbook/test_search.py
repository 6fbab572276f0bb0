"""Playbooks found by name (remote_ops/playbook/search.py): the search order (a path; playbooks/
beside the inventory; $XDG_CONFIG_HOME/remote-ops/playbooks; the shipped ones), shadowing said once by
a command that uses it, `remote-ops playbooks --json`, and the one list `check --candidates` and a
refusal's pointers choose from. conftest points XDG_CONFIG_HOME into the test's tmp dir."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from remote_ops.errors import ConfigError, UsageError
from remote_ops.playbook import coverage, loader, search
from tests.conftest import REPO, write_inventory

SHIPPED_DIR = REPO / "remote_ops" / "playbook" / "shipped"
SHIPPED_NAMES = [p.stem for p in sorted(SHIPPED_DIR.glob("*.yaml"))]     # in file-name order, as listed


def _book(name: str, vllm: str = ">=0.1", speculators: str = "0.3.0") -> str:
    return f"name: {name}\nrequires:\n  speculators: \"=={speculators}\"\n  vllm: \"{vllm}\"\n"


@pytest.fixture
def dirs(tmp_path):
    """An inventory with playbooks/ beside it, and the user's directory (conftest's XDG_CONFIG_HOME)."""
    (tmp_path / "site").mkdir()
    inv = write_inventory(tmp_path / "site" / "inventory.yaml", {})
    beside = tmp_path / "site" / "playbooks"
    user = Path(os.environ["XDG_CONFIG_HOME"]) / "remote-ops" / "playbooks"
    beside.mkdir()
    user.mkdir(parents=True)
    return inv, beside, user


def test_the_shipped_dir_is_read_through_importlib_resources():
    from importlib.resources import files
    assert search.shipped_dir() == files("remote_ops.playbook") / "shipped" == SHIPPED_DIR
    assert sorted(SHIPPED_NAMES) == ["eagle3-speculators-0.3.0", "eagle3-speculators-0.9.0",
                                     "eagle3-speculators-0.9.0-no-chunked-prefill"]


def test_search_order_and_shadowing(dirs, monkeypatch, tmp_path):
    inv, beside, user = dirs
    assert search.user_dir() == user
    assert [o for o, _ in search.search_dirs(str(inv))] == ["inventory", "user", "shipped"]
    # with nothing of the user's, every name is the shipped file
    assert [(f.name, f.origin) for f in search.listing(str(inv))] == [(n, "shipped") for n in SHIPPED_NAMES]
    (user / "mine.yaml").write_text(_book("mine"))
    (user / "eagle3-speculators-0.3.0.yaml").write_text(_book("eagle3-speculators-0.3.0"))
    (beside / "mine.yaml").write_text(_book("mine"))
    got = search.by_name("mine", str(inv))
    assert (got.origin, got.path) == ("inventory", beside / "mine.yaml")
    assert got.shadows == [("user", user / "mine.yaml")]
    assert got.note == f"playbook mine: using {beside / 'mine.yaml'} (inventory), which shadows the user one ({user / 'mine.yaml'})"
    shadowing = search.by_name("eagle3-speculators-0.3.0", str(inv))
    assert shadowing.origin == "user" and shadowing.shadows == [("shipped", SHIPPED_DIR / "eagle3-speculators-0.3.0.yaml")]
    assert search.by_name("eagle3-speculators-0.9.0", str(inv)).origin == "shipped"
    assert search.by_name("eagle3-speculators-0.9.0", str(inv)).note is None
    # a path wins over every name, relative to the current directory for --playbook ...
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text(_book("mine"))
    assert search.find("./mine.yaml", None, str(inv)).origin == "path"
    assert search.find("mine", None, str(inv)).origin == "inventory"
    # ... and relative to the inventory for a host's playbook:
    from remote_ops.connect.inventory import Host
    host = Host(name="h", hostname="x", playbook="playbooks/mine.yaml", inventory_path=str(inv))
    assert search.find(None, host).path == beside / "mine.yaml"
    by_name = Host(name="h", hostname="x", playbook="mine", inventory_path=str(inv))
    assert search.find(None, by_name).origin == "inventory"
    # XDG_CONFIG_HOME unset: ~/.config
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert search.user_dir() == tmp_path / "home" / ".config" / "remote-ops" / "playbooks"


def test_names_paths_and_what_is_not_found(dirs, tmp_path):
    inv, beside, user = dirs
    # a playbooks/NAME.yaml path of an inventory written before 0.2.0 (the checkout's old layout)
    from remote_ops.connect.inventory import Host
    old = Host(name="h", hostname="x", playbook="playbooks/eagle3-speculators-0.3.0.yaml", inventory_path=str(inv))
    found = search.find(None, old)
    assert found.origin == "shipped" and "name it `eagle3-speculators-0.3.0`" in found.note
    with pytest.raises(ConfigError) as e:
        search.find("eagle3-speculators-0.3", None, str(inv))
    assert "no playbook named 'eagle3-speculators-0.3'" in e.value.one_line()
    assert "eagle3-speculators-0.3.0" in e.value.one_line() and "remote-ops playbooks" in e.value.one_line()
    with pytest.raises(ConfigError) as e:
        search.find(str(tmp_path / "nowhere.yaml"), None, str(inv))
    assert e.value.one_line().startswith(f"{tmp_path / 'nowhere.yaml'}: playbook not found")
    with pytest.raises(UsageError):
        search.find(None, Host(name="h", hostname="x"))


def test_available_is_the_one_list_of_candidates_and_pointers(dirs):
    inv, beside, user = dirs
    (user / "eagle3-speculators-0.9.0.yaml").write_text(_book("eagle3-speculators-0.9.0", ">=0.40", "0.9.0"))
    (beside / "broken.yaml").write_text("requires: [not, a, mapping]\n")
    (beside / "site-0.3.0.yaml").write_text(_book("site-0.3.0", ">=0.17,<0.18"))
    books = {pb.name: pb for pb in loader.available(str(inv))}
    assert sorted(books) == sorted(["site-0.3.0", *SHIPPED_NAMES])        # the broken one is no candidate
    assert books["eagle3-speculators-0.9.0"].origin == "user"            # the user's shadows the shipped
    from remote_ops.check import candidates
    assert candidates.covering(candidates.found_playbooks(str(inv)), "speculators",
                               {"speculators": "0.3.0", "vllm": "0.17.0"}) == ["site-0.3.0", "eagle3-speculators-0.3.0"]
    assert candidates.covering(candidates.found_playbooks(str(inv)), "speculators",
                               {"speculators": "0.9.0", "vllm": "0.41.0"}) == ["eagle3-speculators-0.9.0"]
    # a refusal's "X claims vllm V" pointers: the same list, from the playbook's own inventory
    pb = books["site-0.3.0"]
    assert [o.name for o in coverage.other_playbooks(pb, {"vllm": "0.17.0"})] == [
        "eagle3-speculators-0.3.0", "eagle3-speculators-0.9.0-no-chunked-prefill"]
    assert [o.name for o in coverage.other_playbooks(pb, {"vllm": "0.45.0"})] == ["eagle3-speculators-0.9.0"]


def test_playbooks_command_lists_origin_flow_requires(dirs, cli):
    inv, beside, user = dirs
    (beside / "eagle3-speculators-0.3.0.yaml").write_text((SHIPPED_DIR / "eagle3-speculators-0.3.0.yaml").read_text())
    (user / "bad.yaml").write_text("name: [1]\n")
    status, out, err = cli("-i", str(inv), "playbooks", "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["inventory"] == str(inv)
    assert [s["origin"] for s in data["search"]] == ["inventory", "user", "shipped"]
    rows = {(r["name"], r["origin"]): r for r in data["playbooks"]}
    mine = rows[("eagle3-speculators-0.3.0", "inventory")]
    assert mine["flow"] == "in-process" and mine["requires"]["speculators"] == "==0.3.0"
    assert mine["if_installed"] == ["transformers"] and mine["shadowed_by"] is None
    assert mine["shadows"] == [str(SHIPPED_DIR / "eagle3-speculators-0.3.0.yaml")]
    assert rows[("eagle3-speculators-0.3.0", "shipped")]["shadowed_by"] == str(beside / "eagle3-speculators-0.3.0.yaml")
    assert rows[("eagle3-speculators-0.9.0", "shipped")]["flow"] == "server"
    assert "name must be a string" in rows[("bad", "user")]["error"]
    status, out, err = cli("-i", str(inv), "playbooks")
    assert status == 0 and "shadowed by" in out and "(inventory)" in out, out


def test_a_command_says_once_that_its_playbook_shadows_another(sshd, tmp_path, cli):
    """Two hosts, both naming the playbook that shadows the shipped one: `check` says so once."""
    site = tmp_path / "site"
    (site / "playbooks").mkdir(parents=True)
    mine = site / "playbooks" / "eagle3-speculators-0.3.0.yaml"
    mine.write_text(_book("eagle3-speculators-0.3.0") + "check:\n  targets: [json]\n  against: [json]\n")
    inv = write_inventory(site / "inventory.yaml", {
        "a": sshd.host_entry(playbook="eagle3-speculators-0.3.0"),
        "b": sshd.host_entry(playbook="eagle3-speculators-0.3.0")})
    status, out, err = cli("-i", str(inv), "check", "a,b", "--no-drift")
    line = (f"remote-ops: playbook eagle3-speculators-0.3.0: using {mine} (inventory), which shadows the "
            f"shipped one ({SHIPPED_DIR / 'eagle3-speculators-0.3.0.yaml'})")
    assert err.count("which shadows") == 1 and line in err, err
    # the same playbook given by name with --playbook: the same one line
    status, out, err = cli("-i", str(inv), "check", "a", "--no-drift", "--playbook", "eagle3-speculators-0.3.0")
    assert err.count(line) == 1, err


def test_a_missing_include_is_an_error_at_its_line(tmp_path, cli):
    inv = tmp_path / "inventory.yaml"
    inv.write_text("default: a\ninclude:\n  - inventory.local.yaml\n  - more-hosts.yaml\nhosts:\n  a: {hostname: x}\n")
    status, out, err = cli("-i", str(inv), "hosts")
    assert status == 2 and f"{inv}:4: included inventory more-hosts.yaml not found" in err, err
    # the inventory's own .local companion (written by sandbox up) may be absent
    inv.write_text("include: [inventory.local.yaml]\nhosts:\n  a: {hostname: x}\n")
    status, out, err = cli("-i", str(inv), "hosts", "--json")
    assert status == 0 and [h["name"] for h in json.loads(out)["hosts"]] == ["a"], err


def test_version_is_written_once():
    import subprocess
    import sys

    import remote_ops
    from remote_ops.cli import version_line
    text = (REPO / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and 'version = {attr = "remote_ops.__version__"}' in text
    assert f"## {remote_ops.__version__}" in (REPO / "CHANGELOG.md").read_text()
    proc = subprocess.run([sys.executable, "-m", "remote_ops", "--version"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == version_line()
    if (REPO / ".git").exists():
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        assert proc.stdout.startswith(f"remote-ops {remote_ops.__version__} (git {head}"), proc.stdout
