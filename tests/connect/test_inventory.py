"""Inventory loading: the shape users write, and one clear line for every kind of mistake."""

from __future__ import annotations

import pytest

from remote_ops.connect import inventory
from remote_ops.errors import ConfigError, UsageError
from remote_ops.yamlsrc import load_text

GOOD = """\
default: gpu-host
hosts:
  gpu-host:
    hostname: gpu01.example.internal
    user: ml
    identity_file: ~/.ssh/id_ed25519
    proxy_jump: bastion.example.internal, jump2
    python: /opt/venvs/eagle3/bin/python
    workdir: /data/eagle3
    playbook: eagle3-speculators-0.3.0
    env: {HF_HOME: /data/hf}
    vars: {output_dir: /data/out}
  gpu-2:
    hostname: gpu02
    port: 2200
groups:
  gpus: [gpu-host, gpu-2]
"""


def parse(text: str) -> inventory.Inventory:
    return inventory.parse(load_text(text, "inv.yaml"))


def test_good_inventory_values():
    inv = parse(GOOD)
    h = inv.hosts["gpu-host"]
    assert h.hostname == "gpu01.example.internal" and h.user == "ml"
    assert h.proxy_jump == ("bastion.example.internal", "jump2")
    assert h.python == "/opt/venvs/eagle3/bin/python"
    assert h.env == {"HF_HOME": "/data/hf"} and h.vars == {"output_dir": "/data/out"}
    assert inv.hosts["gpu-2"].port == 2200 and inv.hosts["gpu-2"].python is None
    assert [x.name for x in inv.resolve(None)] == ["gpu-host"]
    assert [x.name for x in inv.resolve("gpus")] == ["gpu-host", "gpu-2"]
    assert [x.name for x in inv.resolve("gpu-2,gpu-host,gpu-2")] == ["gpu-2", "gpu-host"]


def test_single_host_is_the_default():
    inv = parse("hosts:\n  only:\n    hostname: 10.0.0.1\n")
    assert [h.name for h in inv.resolve(None)] == ["only"]


def test_no_default_with_many_hosts_is_a_usage_error():
    inv = parse("hosts:\n  a: {}\n  b: {}\n")
    with pytest.raises(UsageError, match="no host given"):
        inv.resolve(None)


@pytest.mark.parametrize("text,line,fragment", [
    ("hosts:\n  a:\n    hostnme: x\n", 3, "unknown key 'hostnme'"),
    # (a quoted number is that number: tests/cli/test_newcomer.py)
    ("hosts:\n  a:\n    port: 'ssh'\n", 3, "port of host 'a' must be an integer, got string 'ssh'"),
    ("hosts:\n  a:\n    port: 70000\n", 3, "1-65535"),
    ("hosts:\n  a:\n    env: [1]\n", 3, "env of host 'a' must be a mapping"),
    ("hosts: [a, b]\n", 1, "'hosts' must be a mapping"),
    ("hosts:\n  a: {}\ngroups:\n  g: [a, zz]\n", 4, "unknown host 'zz'"),
    ("hosts:\n  a: {hostname: [x\n", 2, "YAML syntax error"),
    ("hosts:\n  a: {}\n  a: {}\n", 3, "duplicate key 'a'"),
    ("colour: blue\n", 1, "unknown top-level key 'colour'"),
    ("hosts:\n  a:\n    proxy_jump: [1]\n", 3, "proxy_jump entries must be strings"),
    ("hosts: {}\ngroups:\n  g: [[a]]\n", 3, "group 'g' must list host names, got list"),
    ("hosts:\n  a: {}\ngroups:\n  g: [n]\n  n: [[a]]\n", 4, "group 'g' nests 'n'"),
])
def test_bad_inventory_names_file_line_and_problem(text, line, fragment):
    with pytest.raises(ConfigError) as err:
        parse(text)
    msg = err.value.one_line()
    assert msg.startswith(f"inv.yaml:{line}:"), msg
    assert fragment in msg
    assert "\n" not in msg


def test_unknown_host_on_command_line():
    inv = parse(GOOD)
    with pytest.raises(UsageError, match="unknown host or group 'nope'"):
        inv.resolve("nope")


def test_dangling_default_hints_at_sandbox():
    inv = parse("default: sandbox\nhosts:\n  a: {}\n  b: {}\n")
    with pytest.raises(UsageError) as err:
        inv.resolve(None)
    assert "sandbox up" in err.value.one_line() and "inv.yaml:1" in err.value.one_line()


@pytest.mark.parametrize("text,fragment", [
    ("hosts:\n  a:\n    hostnme: x\n", "unknown key"),
    ("hosts:\n  a: {hostname: [x\n", "YAML syntax error"),
])
def test_cli_bad_inventory_one_line_exit_2(tmp_path, cli, text, fragment):
    inv = tmp_path / "inv.yaml"
    inv.write_text(text)
    status, out, err = cli("hosts", "-i", str(inv))
    assert status == 2
    assert fragment in err and str(inv) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_unknown_host_exit_2(tmp_path, cli):
    inv = tmp_path / "inv.yaml"
    inv.write_text(GOOD)
    status, out, err = cli("facts", "nope", "-i", str(inv))
    assert status == 2 and "unknown host or group 'nope'" in err


def test_env_var_selects_inventory(tmp_path, cli):
    inv = tmp_path / "inv.yaml"
    inv.write_text(GOOD)
    status, out, err = cli("hosts", "--json", env={"REMOTE_OPS_INVENTORY": str(inv)})
    assert status == 0
    import json
    data = json.loads(out)
    assert data["default"] == "gpu-host"
    assert {h["name"] for h in data["hosts"]} == {"gpu-host", "gpu-2"}
    assert data["groups"] == {"gpus": ["gpu-host", "gpu-2"]}


@pytest.mark.parametrize("ch", ["\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_cli_argument_with_any_line_break_stays_one_line(tmp_path, cli, ch):
    """Found by the fuzzer: \\x1e (and the other separators str.splitlines() honours) split the error."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(GOOD)
    status, out, err = cli("hosts", f"a{ch}b", "-i", str(inv))
    assert status == 2
    assert len(err.splitlines()) == 1, err
