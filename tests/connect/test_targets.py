"""Ad-hoc targets, ~/.ssh/config aliases (Include, Match, ProxyJump through a second sshd), Ansible
YAML and INI inventories, did-you-mean, one error prefix, shell completion: over the real sshd."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from remote_ops.errors import ConfigError, Exit
from remote_ops.sshd import SshdServer, free_port
from tests.conftest import write_inventory

PY = sys.executable


def _second_sshd(root: Path, sshd, extra: str = "") -> SshdServer:
    """Another sshd (a bastion) that accepts the same user key as the main one."""
    root.mkdir(parents=True)
    for suffix in ("", ".pub"):
        shutil.copy(str(sshd.identity_file) + suffix, root / ("id_ed25519" + suffix))
    return SshdServer(root, extra_config=extra).start()


@pytest.fixture(scope="module")
def bastion(sshd, tmp_path_factory):
    server = _second_sshd(tmp_path_factory.mktemp("bastion") / "b", sshd)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def nofwd_bastion(sshd, tmp_path_factory):
    """A bastion that refuses TCP forwarding: a jump through it must fail (proves the jump is used)."""
    server = _second_sshd(tmp_path_factory.mktemp("nofwd") / "b", sshd, "AllowTcpForwarding no")
    yield server
    server.stop()


@pytest.fixture
def known_both(tmp_path, sshd, bastion, nofwd_bastion) -> Path:
    kh = tmp_path / "known_hosts"
    kh.write_text(sshd.known_hosts.read_text() + bastion.known_hosts.read_text()
                  + nofwd_bastion.known_hosts.read_text())
    return kh


@pytest.fixture
def ssh_config(tmp_path, sshd, bastion, nofwd_bastion, known_both, monkeypatch) -> Path:
    """A ~/.ssh/config (through $REMOTE_OPS_SSH_CONFIG) whose aliases reach the test sshd."""
    inc = tmp_path / "conf.d"
    inc.mkdir()
    (inc / "10-jump.conf").write_text(f"""\
Host jumpbox
    HostName 127.0.0.1
    Port {bastion.port}
Host closedjump
    HostName 127.0.0.1
    Port {nofwd_bastion.port}
""")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"""\
Host gpu01
    HostName 127.0.0.1
    Port {sshd.port}
    ProxyJump jumpbox
Host gpu-direct
    Include {inc}/*.none
    HostName 127.0.0.1
    Port {sshd.port}
Host gpu-blocked
    HostName 127.0.0.1
    Port {sshd.port}
    ProxyJump closedjump
Include {inc}/*.conf
Match originalhost matched-*
    HostName 127.0.0.1
    Port {sshd.port}
Host *
    User {sshd.user}
    IdentityFile {sshd.identity_file}
    UserKnownHostsFile {known_both}
""")
    monkeypatch.setenv("REMOTE_OPS_SSH_CONFIG", str(cfg))
    return cfg


def _facts(cli, *args):
    status, out, err = cli("facts", *args, "--json")
    return status, (json.loads(out) if out.strip() else None), err


def _comparable(facts: dict) -> dict:
    f = {k: v for k, v in facts.items() if k not in ("host", "disk", "memory", "load")}   # these move between calls
    return f


# ---------------------------------------------------------------------------------- ad-hoc
def test_adhoc_user_host_port_without_inventory(sshd, ssh_config, tmp_path, cli):
    """`user@127.0.0.1:PORT`: no inventory at all; keys and known_hosts come from ssh_config's Host *."""
    target = f"{sshd.user}@127.0.0.1:{sshd.port}"
    status, facts, err = _facts(cli, target, "--python", PY)
    assert status == 0, err
    assert facts["host"] == target
    assert facts["python"]["executable"] == PY or os.path.realpath(facts["python"]["executable"]) == os.path.realpath(PY)
    assert facts["python"]["requested"] == PY and facts["python"]["found_by"] == "configured path"
    # the same host named by an inventory gives the same result
    inv = write_inventory(tmp_path / "inv.yaml", {"viainv": sshd.host_entry(PY)})
    status, named, err = _facts(cli, "viainv", "-i", str(inv))
    assert status == 0, err
    assert _comparable(named) == _comparable(facts)


def test_adhoc_port_and_user_win_over_ssh_config(sshd, ssh_config, cli):
    """A typed port wins over the config's (ssh -p semantics): a dead port fails, the right one works."""
    dead = free_port()
    status, _, err = _facts(cli, f"127.0.0.1:{dead}", "--python", PY)
    assert status == Exit.UNREACHABLE and f"127.0.0.1:{dead}" in err
    status, _, err = _facts(cli, f"nobody-{os.getpid()}@127.0.0.1:{sshd.port}", "--python", PY)
    assert status == Exit.AUTH, err


def test_bad_adhoc_port_is_usage_error(cli, ssh_config):
    status, out, err = cli("facts", "gpu01:99999")
    assert status == Exit.USAGE and "port must be a number 1-65535" in err
    assert err.count("remote-ops:") == 1


def test_default_python_is_python3_of_a_login_shell(sshd, ssh_config, cli):
    """No --python and no inventory: python3 from the PATH the account's login shell sets; facts says so."""
    import pwd
    status, facts, err = _facts(cli, "gpu-direct")
    assert status == 0, err
    assert facts["python"]["requested"] == "python3"
    assert facts["python"]["found_by"] == "login shell PATH"
    shell = pwd.getpwuid(os.getuid()).pw_shell
    home = pwd.getpwuid(os.getuid()).pw_dir
    # what a person gets after `ssh host`: a login shell's python3 (pyenv shims, conda, ~/.local/bin...)
    want = subprocess.run([shell, "-lc", "python3 -c 'import sys; print(sys.executable)'"],
                          capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, env={"HOME": home, "PATH": "/usr/bin:/bin",
                                                         "USER": sshd.user, "SHELL": shell})
    expected = want.stdout.strip().splitlines()[-1]
    assert os.path.realpath(facts["python"]["executable"]) == os.path.realpath(expected)


def test_python_flag_overrides_the_inventory(sshd, tmp_path, cli):
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry("/nonexistent/python")})
    status, _, err = _facts(cli, "h", "-i", str(inv))
    assert status == Exit.REMOTE and "not found" in err
    status, facts, err = _facts(cli, "h", "-i", str(inv), "--python", PY)
    assert status == 0, err
    assert facts["python"]["requested"] == PY


# ---------------------------------------------------------------------------------- ssh_config
def test_alias_with_proxyjump_through_a_second_sshd(ssh_config, cli):
    status, facts, err = _facts(cli, "gpu01", "--python", PY)
    assert status == 0, err
    assert facts["host"] == "gpu01"
    # the same alias through a bastion that refuses forwarding fails: the jump really is taken
    status, _, err = _facts(cli, "gpu-blocked", "--python", PY)
    assert status != 0 and "gpu-blocked" in err


def test_alias_jump_opens_a_gateway(ssh_config):
    from remote_ops.connect.targets import adhoc_host
    from remote_ops.connect import sshconfig
    from remote_ops.connect.transport import ConnectOptions, Session
    import dataclasses

    host = dataclasses.replace(adhoc_host("gpu01", sshconfig.load()), python=PY)
    with Session(host, ConnectOptions()) as sess:
        assert len(sess._gateways) == 1
        assert sess.call("ping.ping", {"echo": "via"})["echo"] == "via"


def test_match_originalhost_and_include(ssh_config, cli):
    """`Match originalhost matched-*` (paramiko) and a Host block from an Included file (ours)."""
    status, facts, err = _facts(cli, "matched-7", "--python", PY)
    assert status == 0, err
    assert facts["host"] == "matched-7"


def test_include_keeps_the_including_block_scope(tmp_path, monkeypatch):
    from remote_ops.connect import sshconfig
    inc = tmp_path / "inc.conf"
    inc.write_text("Host other\n    Port 2200\n")
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Host a\n    Include {inc}\n    Port 2201\nHost b\n    HostName bee\n")
    c = sshconfig.load(str(cfg))
    assert c.lookup("a").get("port") == "2201"        # the line after Include stays in "Host a"
    assert c.lookup("other").get("port") == "2200"
    assert c.lookup("b")["hostname"] == "bee" and "port" not in c.lookup("b")
    assert sshconfig.aliases(c) == ["a", "other", "b"] or set(sshconfig.aliases(c)) == {"a", "other", "b"}


def test_unsupported_match_keyword_is_refused_with_file_and_line(tmp_path, monkeypatch, cli):
    cfg = tmp_path / "cfg"
    cfg.write_text("Host x\n    Port 1\nMatch localnetwork 10.0.0.0/8\n    User root\n")
    monkeypatch.setenv("REMOTE_OPS_SSH_CONFIG", str(cfg))
    status, _, err = cli("facts", "somehost.example")
    assert status == Exit.USAGE
    assert f"{cfg}:3:" in err and "Match localnetwork" in err and "not supported" in err


def test_inventory_host_wins_over_alias_of_same_name(sshd, ssh_config, tmp_path, cli):
    """`gpu-blocked` is an alias that cannot connect; an inventory host of that name is used instead."""
    inv = write_inventory(tmp_path / "inv.yaml", {"gpu-blocked": sshd.host_entry(PY)})
    status, facts, err = _facts(cli, "gpu-blocked", "-i", str(inv))
    assert status == 0, err
    assert facts["host"] == "gpu-blocked"


# ---------------------------------------------------------------------------------- Ansible
def _ansible_vars(sshd, known: Path) -> dict:
    return {"ansible_host": "127.0.0.1", "ansible_port": sshd.port, "ansible_user": sshd.user,
            "ansible_ssh_private_key_file": str(sshd.identity_file), "ansible_python_interpreter": PY}


def test_ansible_yaml_inventory_groups_children_and_jump(sshd, bastion, nofwd_bastion, known_both, tmp_path, cli):
    kh = f"-o UserKnownHostsFile={known_both}"
    base = _ansible_vars(sshd, known_both)
    data = {"all": {
        "vars": {"ansible_become": True, "max_samples": 7},
        "children": {
            "gpus": {
                "hosts": {
                    "direct": {**base, "ansible_ssh_common_args": kh},
                    "jumped": {**base, "ansible_ssh_common_args":
                               f"-o ProxyCommand='ssh -W %h:%p -q {sshd.user}@127.0.0.1 -p {bastion.port}' {kh}"},
                },
                "vars": {"output_dir": "/data/out"},
            },
            "cluster": {"children": {"gpus": None,
                                     "broken": {"hosts": {"blocked": {
                                         **base, "ansible_ssh_common_args":
                                         f"-J {sshd.user}@127.0.0.1:{nofwd_bastion.port} {kh}"}}}}},
        }}}
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    status, out, err = cli("hosts", "-i", str(inv), "--json")
    assert status == 0, err
    listing = json.loads(out)
    assert listing["format"] == "ansible-yaml"
    rows = {r["name"]: r for r in listing["hosts"]}
    assert rows["jumped"]["proxy_jump"] == [f"{sshd.user}@127.0.0.1:{bastion.port}"]
    assert rows["direct"]["known_hosts"] == str(known_both) and rows["direct"]["port"] == sshd.port
    assert rows["direct"]["vars"] == {"max_samples": 7, "output_dir": "/data/out"}
    assert set(listing["groups"]["cluster"]) == {"direct", "jumped", "blocked"}
    assert listing["ignored"] == {"ansible_become": ["direct", "jumped", "blocked"]}
    # reported once, on one line
    assert err.count("ansible_become") == 1 and len(err.strip().splitlines()) == 1

    status, out, err = cli("facts", "gpus", "-i", str(inv), "--json")
    assert status == 0, err
    res = json.loads(out)
    assert res["failed"] == [] and [h["host"] for h in res["hosts"]] == ["direct", "jumped"]
    assert _comparable(res["hosts"][0]["result"]) == _comparable(res["hosts"][1]["result"])
    status, out, err = cli("facts", "cluster", "-i", str(inv), "--json")
    assert status != 0 and json.loads(out)["failed"] == ["blocked"]
    assert any(line.startswith("remote-ops: blocked: ") for line in err.splitlines())


def test_ansible_ini_inventory_groups_children_and_jump(sshd, bastion, known_both, tmp_path, cli):
    inv = tmp_path / "hosts"          # no suffix: sniffed as INI, as Ansible does
    inv.write_text(f"""\
# Ansible INI inventory
[gpus]
direct ansible_host=127.0.0.1 ansible_port={sshd.port}
jumped ansible_host=127.0.0.1 ansible_port={sshd.port} ansible_ssh_common_args='-o ProxyJump={sshd.user}@127.0.0.1:{bastion.port}'

[gpus:vars]
output_dir=/data/out

[cluster:children]
gpus

[all:vars]
ansible_user={sshd.user}
ansible_ssh_private_key_file={sshd.identity_file}
ansible_python_interpreter={PY}
ansible_ssh_extra_args=-o UserKnownHostsFile={known_both}
ansible_pipelining=true
""")
    status, out, err = cli("hosts", "-i", str(inv), "--json")
    assert status == 0, err
    listing = json.loads(out)
    assert listing["format"] == "ansible-ini"
    assert listing["groups"] == {"gpus": ["direct", "jumped"], "cluster": ["direct", "jumped"]}
    rows = {r["name"]: r for r in listing["hosts"]}
    assert rows["jumped"]["proxy_jump"] == [f"{sshd.user}@127.0.0.1:{bastion.port}"]
    assert rows["direct"]["python"] == PY and rows["direct"]["vars"] == {"output_dir": "/data/out"}
    assert listing["ignored"] == {"ansible_pipelining": ["direct", "jumped"]}
    status, out, err = cli("facts", "cluster", "-i", str(inv), "--json")
    assert status == 0, err
    res = json.loads(out)
    assert [h["host"] for h in res["hosts"]] == ["direct", "jumped"] and res["failed"] == []


@pytest.mark.parametrize("text,fragment", [
    ("[gpus\nh1\n", "unreadable section"),
    ("[gpus:hosts]\nh1\n", "unreadable section"),
    ("[g]\nh1 ansible_port\n", "expected key=value"),
    ("[g]\nh1 ansible_port=abc\n", "must be a port number"),
    ("[g]\nh1 ansible_host='{{ lookup(\"x\") }}'\n", "Jinja2 template"),
    ("[g]\nweb[05:01]\n", "empty"),
])
def test_bad_ini_inventory_is_one_line_with_file_and_line(tmp_path, cli, text, fragment):
    inv = tmp_path / "hosts.ini"
    inv.write_text(text)
    status, _, err = cli("hosts", "-i", str(inv))
    assert status == Exit.USAGE and fragment in err and str(inv) in err
    assert len(err.strip().splitlines()) == 1


def test_ansible_ranges_group_vars_precedence_and_local(tmp_path, cli):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  vars: {tier: all, x: 1}\n  children:\n    gpus:\n      vars: {tier: gpus}\n"
                   "      hosts:\n        gpu[08:10]:\n        gpu09: {tier: host}\n"
                   "    here:\n      hosts:\n        control: {ansible_connection: local, ansible_python_interpreter: auto}\n"
                   "    odd:\n      hosts:\n        box: {ansible_connection: docker}\n")
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpus.yml").write_text("x: 2\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "gpu10.yaml").write_text("x: 3\n")
    status, out, err = cli("hosts", "-i", str(inv), "--json")
    assert status == 0, err
    rows = {r["name"]: r for r in json.loads(out)["hosts"]}
    assert list(rows) == ["gpu08", "gpu09", "gpu10", "control"]
    assert rows["gpu08"]["vars"] == {"tier": "gpus", "x": 2}
    assert rows["gpu09"]["vars"] == {"tier": "host", "x": 2}
    assert rows["gpu10"]["vars"] == {"tier": "gpus", "x": 3}
    assert rows["control"]["connection"] == "local" and rows["control"]["python"] is None
    assert "box (docker)" in err and "left out" in err


def test_ini_sniffing_and_parse_errors_in_python():
    from remote_ops.connect.ansible_inventory import expand_range
    assert expand_range("web[1:3].x", "f", 1) == ["web1.x", "web2.x", "web3.x"]
    assert expand_range("db-[a:c]", "f", 1) == ["db-a", "db-b", "db-c"]
    assert expand_range("n[00:04:2]", "f", 1) == ["n00", "n02", "n04"]
    with pytest.raises(ConfigError):
        expand_range("n[1:x]", "f", 1)


# ---------------------------------------------------------------------------------- did-you-mean
def test_command_typo_one_line_one_prefix_exit_2(cli):
    status, out, err = cli("pach")
    assert status == Exit.USAGE
    assert err.strip() == "remote-ops: unknown command 'pach': did you mean 'patch'?"


def test_subcommand_errors_have_one_prefix(cli):
    status, _, err = cli("sandbox", "upp")
    assert status == Exit.USAGE and err.strip() == "remote-ops: sandbox: unknown choice 'upp': did you mean 'up'?"
    status, _, err = cli("facts", "--parallel", "x")
    assert status == Exit.USAGE and err.count("remote-ops") == 2 and err.startswith("remote-ops: facts: ")


def test_host_and_group_typos_suggest(sshd, ssh_config, tmp_path, cli):
    inv = write_inventory(tmp_path / "inv.yaml", {"gpu-host": sshd.host_entry(PY)}, groups={"trainers": ["gpu-host"]})
    for typo, want in (("gpu-hots", "gpu-host"), ("trainer", "trainers"), ("gpu-blockd", "gpu-blocked")):
        status, out, err = cli("facts", typo, "-i", str(inv))
        assert status == Exit.USAGE, err
        assert err.strip() == f"remote-ops: {inv}: unknown host or group {typo!r}: did you mean {want!r}?"
    status, _, err = cli("facts", "zzzz", "-i", str(inv))
    assert status == Exit.USAGE and "user@zzzz or zzzz:22" in err and len(err.strip().splitlines()) == 1


def test_no_inventory_no_host_says_how_to_name_one(cli):
    status, _, err = cli("facts")
    assert status == Exit.USAGE and "user@host[:port]" in err and err.count("remote-ops:") == 1


# ---------------------------------------------------------------------------------- completion
def _bash_complete(words: list[str], inventory: Path | None = None, cword: int | None = None) -> list[str]:
    exe = Path(sys.executable).parent / "remote-ops"
    if not exe.exists():
        pytest.skip("remote-ops entry point not installed in this venv (pip install -e .)")
    script = subprocess.run([str(exe), "completion", "bash"], capture_output=True, text=True, check=True).stdout
    comp_words = " ".join(f"'{w}'" for w in [str(exe)] + words)
    cw = len(words) if cword is None else cword
    prog = f"{script}\nCOMP_WORDS=({comp_words})\nCOMP_CWORD={cw}\n_remote_ops\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    res = subprocess.run(["bash", "--norc", "--noprofile", "-c", prog], capture_output=True, text=True,
                         cwd=inventory.parent if inventory else None, timeout=60)
    assert res.returncode == 0, res.stderr
    return [line for line in res.stdout.splitlines() if line]


def test_bash_completion_commands_flags_hosts_files(sshd, ssh_config, tmp_path):
    inv = write_inventory(tmp_path / "inv.yaml", {"gpu-host": sshd.host_entry(PY)}, groups={"trainers": ["gpu-host"]})
    assert _bash_complete(["pa"]) == ["patch"]
    assert set(_bash_complete(["ch"])) == {"check"}
    assert "--playbook" in _bash_complete(["patch", "--pl"])
    hosts = _bash_complete(["-i", str(inv), "facts", ""])
    assert {"gpu-host", "trainers", "all", "gpu01", "jumpbox", "localhost"} <= set(hosts)
    assert _bash_complete(["-i", str(inv), "facts", "tr"]) == ["trainers"]
    files = _bash_complete(["facts", "-i", str(tmp_path / "in")])
    assert files == [str(inv)]
    assert _bash_complete(["sandbox", "d"]) == ["down"]


def test_completion_install_bash_and_zsh(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("ZDOTDIR", raising=False)
    status, out, err = cli("completion", "install", "--shell", "bash", "--json")
    assert status == 0, err
    target = tmp_path / "data" / "bash-completion" / "completions" / "remote-ops"
    assert json.loads(out)["written"] == [str(target)] and "complete -o bashdefault -F _remote_ops" in target.read_text()
    for _ in range(2):    # idempotent: .zshrc gets its lines once
        status, out, err = cli("completion", "install", "--shell", "zsh")
        assert status == 0, err
    assert (tmp_path / ".zfunc" / "_remote-ops").read_text().startswith("#compdef remote-ops")
    assert (tmp_path / ".zshrc").read_text().count("fpath=(~/.zfunc $fpath)") == 1
    monkeypatch.setenv("SHELL", "/bin/fish")
    status, _, err = cli("completion", "install")
    assert status == Exit.USAGE and "--shell" in err
    if shutil.which("zsh"):
        res = subprocess.run(["zsh", "-n", str(tmp_path / ".zfunc" / "_remote-ops")], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


def test_alias_takes_connect_timeout_from_ssh_config(tmp_path, monkeypatch, cli):
    """ConnectTimeout of ~/.ssh/config applies to an alias (a port that accepts TCP and never speaks SSH)."""
    from tests.conftest import silent_port
    with silent_port() as port:
        cfg = tmp_path / "cfg"
        cfg.write_text(f"Host silent\n    HostName 127.0.0.1\n    Port {port}\n    ConnectTimeout 1\n"
                       f"    UserKnownHostsFile {tmp_path / 'kh'}\n")
        monkeypatch.setenv("REMOTE_OPS_SSH_CONFIG", str(cfg))
        status, _, err = cli("facts", "silent", "--python", PY)
    assert status == Exit.TIMEOUT, err
    assert "within 1s" in err or "after 1s" in err


def test_zsh_completion_function(sshd, ssh_config, tmp_path):
    """The zsh script's function, run by a real zsh with compadd/_files recorded instead of drawn."""
    if not shutil.which("zsh"):
        pytest.skip("zsh is not installed")
    exe = Path(sys.executable).parent / "remote-ops"
    if not exe.exists():
        pytest.skip("remote-ops entry point not installed in this venv (pip install -e .)")
    inv = write_inventory(tmp_path / "inv.yaml", {"gpu-host": sshd.host_entry(PY)}, groups={"trainers": ["gpu-host"]})
    script = subprocess.run([str(exe), "completion", "zsh"], capture_output=True, text=True, check=True).stdout

    def zsh(*words: str) -> list[str]:
        prog = (f"compdef() {{ : }}\ncompadd() {{ shift 2; print -l -- \"$@\" }}\n_files() {{ print FILES }}\n"
                f"{script}\nwords=({' '.join(repr(w) for w in (str(exe),) + words)})\nCURRENT={len(words) + 1}\n"
                "_remote_ops\n")
        res = subprocess.run(["zsh", "-f", "-c", prog], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return [line for line in res.stdout.splitlines() if line]

    assert zsh("pat") == ["patch"]
    assert zsh("-i", str(inv), "facts", "tr") == ["trainers"]
    assert {"gpu-host", "gpu01", "localhost"} <= set(zsh("-i", str(inv), "check", ""))
    assert zsh("facts", "-i", "") == ["FILES"]


def test_api_and_comma_lists_mix_adhoc_targets(sshd, ssh_config, tmp_path):
    """The Python API takes the same targets; a comma list mixes an alias, an address and localhost."""
    import remote_ops.api as ro
    inv_path = write_inventory(tmp_path / "inv.yaml", {"named": sshd.host_entry(PY)})
    with ro.open_inventory(str(inv_path), python=PY) as inv:
        spec = f"named,gpu01,{sshd.user}@127.0.0.1:{sshd.port},localhost"
        assert inv.hosts(spec) == ["named", "gpu01", f"{sshd.user}@127.0.0.1:{sshd.port}", "localhost"]
        res = inv.facts(spec)
        assert res.ok, {h: e.one_line() for h, e in res.failed.items()}
        versions = {r.host: r.value["python"]["version"] for r in res}
        assert len(set(versions.values())) == 1 and len(versions) == 4


def test_login_shell_lookup_runs_once_per_session(sshd, ssh_config):
    """The first call finds python3 through a login shell; later calls exec what it found, with
    the login shell's PATH in their environment (so a job's `python3` is the same interpreter)."""
    from remote_ops.connect import bundle, sshconfig
    from remote_ops.connect.targets import adhoc_host
    from remote_ops.connect.transport import ConnectOptions, Session

    host = adhoc_host("gpu-direct", sshconfig.load())
    assert host.python is None and "-lc" in bundle.agent_command(None)
    with Session(host, ConnectOptions()) as sess:
        first = sess.call("facts.gather", {})["python"]["executable"]
        assert sess._login["executable"] == first
        assert sess._python() == first and "-lc" not in bundle.agent_command(sess._python())
        again = sess.call("facts.gather", {})["python"]["executable"]
        assert again == first and sess.stats.execs == 2
        assert sess._login["path"] and ":" in sess._login["path"]


def test_ssh_config_is_parsed_once_per_text_and_an_edit_is_seen(tmp_path):
    from remote_ops.connect import sshconfig
    inc = tmp_path / "inc.conf"
    inc.write_text("Host a\n    Port 2200\n")
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Include {tmp_path}/*.conf\nHost b\n    HostName bee\n")
    first = sshconfig.load(str(cfg))
    assert sshconfig.load(str(cfg)) is first                 # a fleet's hosts share one parse
    inc.write_text("Host a\n    Port 2201\n")                # an included file changes
    assert sshconfig.load(str(cfg)).lookup("a")["port"] == "2201"
    (tmp_path / "new.conf").write_text("Host c\n    User cee\n")   # a new file the glob matches
    assert sshconfig.load(str(cfg)).lookup("c")["user"] == "cee"
