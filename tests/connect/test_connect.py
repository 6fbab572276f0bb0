"""Connections over a real sshd: host keys, distinct errors, facts, one round trip per step."""

from __future__ import annotations

import json
import sys

import pytest

from remote_ops.errors import Exit


def test_facts_on_sandbox_layout(sshd, inventory_file, env_vllm017, cli):
    inv = inventory_file(python=str(env_vllm017))
    status, out, err = cli("facts", "testhost", "--json", "-i", str(inv))
    assert status == 0, err
    facts = json.loads(out)
    assert facts["packages"]["speculators"]["version"] == "0.3.0"
    assert facts["packages"]["vllm"]["version"] == "0.17.0"
    assert facts["packages"]["transformers"] == {"name": "transformers", "present": False}
    assert facts["python"]["executable"].startswith(str(env_vllm017.parent.parent))
    assert facts["gpu"]["present"] in (True, False)
    assert facts["disk"]["free_bytes"] > 0


def test_facts_human_output(sshd, inventory_file, env_vllm017, cli):
    inv = inventory_file(python=str(env_vllm017))
    status, out, err = cli("facts", "-i", str(inv))
    assert status == 0, err
    assert "speculators" in out and "0.3.0" in out and "0.17.0" in out


def test_one_exec_per_step(sshd, env_vllm017):
    from remote_ops import facts
    with sshd.session(python=str(env_vllm017)) as sess:
        facts.gather(sess)
        assert sess.stats.execs == 1
        results = sess.call_many([("ping.ping", {"echo": "a"}), ("ping.ping", {"echo": "b"})])
        assert [r["result"]["echo"] for r in results] == ["a", "b"]
        assert sess.stats.execs == 2


def test_unknown_host_key_refused_then_accept_new_records_one_line(sshd, tmp_path, cli):
    kh = tmp_path / "known_hosts"
    inv = tmp_path / "inv.yaml"
    from tests.conftest import write_inventory
    write_inventory(inv, {"h": sshd.host_entry(known_hosts=str(kh))})
    status, out, err = cli("facts", "h", "-i", str(inv))
    assert status == Exit.HOSTKEY
    assert "unknown host key" in err and "SHA256:" in err and "--accept-new" in err
    assert not kh.exists() or kh.read_text() == ""
    status, out, err = cli("facts", "h", "-i", str(inv), "--accept-new")
    assert status == 0, err
    lines = kh.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    # now known: works without the flag, and nothing more is written
    status, out, err = cli("facts", "h", "-i", str(inv))
    assert status == 0 and len(kh.read_text().splitlines()) == 1


def test_changed_host_key_always_refused(sshd, tmp_path, cli):
    import subprocess
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    pub = other.with_suffix(".pub").read_text().split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    from tests.conftest import write_inventory
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(known_hosts=str(kh))})
    for extra in ([], ["--accept-new"]):
        status, out, err = cli("facts", "h", "-i", str(inv), *extra)
        assert status == Exit.HOSTKEY
        assert "HOST KEY CHANGED" in err and "ssh-keygen -R" in err and "SHA256:" in err
    assert kh.read_text().count("\n") == 1  # untouched


def test_unreachable_host(tmp_path, sshd, cli):
    from remote_ops.sshd import free_port
    from tests.conftest import write_inventory
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(port=free_port())})
    status, out, err = cli("facts", "h", "-i", str(inv))
    assert status == Exit.UNREACHABLE and "connection refused" in err
    assert len(err.strip().splitlines()) == 1


def test_auth_refused(tmp_path, sshd, cli):
    import subprocess
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    from tests.conftest import write_inventory
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(identity_file=str(key))})
    status, out, err = cli("facts", "h", "-i", str(inv), env={"SSH_AUTH_SOCK": ""})
    assert status == Exit.AUTH and "authentication refused" in err


def test_timeout_on_silent_port(tmp_path, sshd, cli):
    """A port that accepts TCP but never speaks SSH (a hung host) times out with its own status."""
    from tests.conftest import silent_port, write_inventory
    with silent_port() as port:
        inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(port=port, connect_timeout=1)})
        status, out, err = cli("facts", "h", "-i", str(inv))
    assert status == Exit.TIMEOUT, err
    assert "timed out" in err or "no SSH greeting" in err


def test_missing_remote_interpreter(sshd, inventory_file, cli):
    inv = inventory_file(python="/nonexistent/bin/python")
    status, out, err = cli("facts", "-i", str(inv))
    assert status == Exit.REMOTE and "not found" in err and "'python'" in err


def test_proxy_jump_through_a_gateway(sshd, tmp_path, env_vllm017, cli):
    """ProxyJump via another inventory host (here: the same sshd as bastion)."""
    from tests.conftest import write_inventory
    inv = write_inventory(tmp_path / "inv.yaml", {
        "bastion": sshd.host_entry(),
        "target": sshd.host_entry(python=str(env_vllm017), proxy_jump="bastion"),
    })
    status, out, err = cli("facts", "target", "--json", "-i", str(inv))
    assert status == 0, err
    assert json.loads(out)["packages"]["vllm"]["version"] == "0.17.0"


def test_host_env_reaches_agent_on_stdin_not_command_line(sshd, env_vllm017):
    with sshd.session(python=str(env_vllm017), env={"REMOTE_OPS_PROBE": "x; touch /tmp/pwned"}) as sess:
        res = sess.call("ping.ping", {"echo": "$(touch /tmp/pwned2)"})
    assert res["echo"] == "$(touch /tmp/pwned2)"


def test_values_fall_back_to_ssh_config(sshd, tmp_path, env_vllm017, cli):
    """Only the alias in the inventory: HostName, Port, User, IdentityFile, UserKnownHostsFile
    come from ~/.ssh/config, as OpenSSH would take them."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"""\
Host gpu-alias
    HostName 127.0.0.1
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.identity_file}
    UserKnownHostsFile {sshd.known_hosts}
""")
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"hosts:\n  gpu-alias:\n    python: {env_vllm017}\n")
    status, out, err = cli("facts", "--json", "-i", str(inv), env={"REMOTE_OPS_SSH_CONFIG": str(cfg)})
    assert status == 0, err
    assert json.loads(out)["packages"]["speculators"]["version"] == "0.3.0"


def test_an_empty_ssh_config_answers_lookups_without_paramikos_expansion(monkeypatch):
    """No ~/.ssh/config: every host's lookup is {} at once (paramiko would expand its default
    tokens, asking the password database for the local user); a real config is still looked up."""
    import getpass

    import paramiko

    from remote_ops.connect import sshconfig

    asked = []
    monkeypatch.setattr(getpass, "getuser", lambda: asked.append(1) or "someone")
    assert sshconfig.lookup(paramiko.SSHConfig(), "gpu1") == {} and sshconfig.lookup(None, "gpu1") == {}
    assert asked == []
    cfg = paramiko.SSHConfig.from_text("Host gpu1\n  HostName 10.0.0.9\n  Port 2222\n")
    entry = sshconfig.lookup(cfg, "gpu1")
    assert entry["hostname"] == "10.0.0.9" and entry["port"] == "2222"
    assert sshconfig.lookup(cfg, "gpu2")["hostname"] == "gpu2"


def test_verbose_reports_round_trips(sshd, inventory_file, env_vllm017, cli):
    inv = inventory_file(python=str(env_vllm017))
    status, out, err = cli("facts", "-v", "-i", str(inv))
    assert status == 0
    assert "1 connection(s), 1 exec round trip(s)" in err


def test_ssh_agent_authenticates_without_identity_file(sshd, tmp_path, env_vllm017, cli):
    """No identity_file anywhere: the key comes from a running ssh-agent (SSH_AUTH_SOCK)."""
    import os
    import shutil
    import subprocess

    if not shutil.which("ssh-agent") or not shutil.which("ssh-add"):
        pytest.skip("ssh-agent is not installed")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            import time
            time.sleep(0.05)
        env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", str(sshd.identity_file)], env=env, check=True, capture_output=True)
        from tests.conftest import write_inventory
        entry = sshd.host_entry(python=str(env_vllm017))
        del entry["identity_file"]
        inv = write_inventory(tmp_path / "inv.yaml", {"h": entry})
        home = tmp_path / "home"          # no ~/.ssh keys to fall back on
        home.mkdir()
        status, out, err = cli("facts", "h", "--json", "-i", str(inv),
                               env={"SSH_AUTH_SOCK": str(sock), "HOME": str(home),
                                    "REMOTE_OPS_SSH_CONFIG": str(home / "none")})
        assert status == 0, err
        assert json.loads(out)["packages"]["speculators"]["version"] == "0.3.0"
        # and without the agent, the same inventory is refused authentication
        status, out, err = cli("facts", "h", "-i", str(inv),
                               env={"SSH_AUTH_SOCK": str(tmp_path / "no-agent"), "HOME": str(home)})
        assert status == Exit.AUTH, err
    finally:
        agent.terminate()
        agent.wait()


def test_multi_hop_proxy_jump(sshd, tmp_path, env_vllm017, cli):
    """Two hops (user@host:port strings, as in ssh -J a,b): both gateways verified against known_hosts."""
    from tests.conftest import write_inventory
    hop = f"{sshd.user}@127.0.0.1:{sshd.port}"
    inv = write_inventory(tmp_path / "inv.yaml", {
        "target": sshd.host_entry(python=str(env_vllm017), proxy_jump=[hop, hop]),
    })
    status, out, err = cli("facts", "target", "--json", "-i", str(inv))
    assert status == 0, err
    assert json.loads(out)["packages"]["vllm"]["version"] == "0.17.0"


def test_streamed_events_arrive_in_order_then_the_result(sshd, env_vllm017):
    """Generator ops stream events on the same exec channel (what --tail and verify use)."""
    with sshd.session(python=str(env_vllm017)) as sess:
        msgs = list(sess.stream("ping.ticks", {"n": 5, "every": 0.01}))
        assert sess.stats.execs == 1
    assert [m["event"]["i"] for m in msgs[:-1]] == [0, 1, 2, 3, 4]
    assert msgs[-1] == {"result": {"done": True}}


def _other_key_line(tmp_path, name: str) -> str:
    import subprocess
    other = tmp_path / f"other_key_{len(list(tmp_path.glob('other_key_*')))}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kt, b64 = other.with_suffix(".pub").read_text().split()[:2]
    return f"{name} {kt} {b64}\n"


def test_fleet_parses_known_hosts_once_and_checks_each_host_against_its_own_entry(sshd, tmp_path, monkeypatch,
                                                                                   cli):
    """Two hosts through one known_hosts file: parsed once, yet each host's offered key is checked
    against that host's own line (the wrong line of one host refuses that host only)."""
    from remote_ops.connect import hostkeys
    from tests.conftest import write_inventory

    good = sshd.known_hosts.read_text().split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {good[-2]} {good[-1]}\n"
                  + _other_key_line(tmp_path, f"[localhost]:{sshd.port}"))
    loads = []
    real_parse = hostkeys.parse_known_hosts
    monkeypatch.setattr(hostkeys, "parse_known_hosts", lambda text, f: (loads.append(f), real_parse(text, f))[1])
    inv = write_inventory(tmp_path / "inv.yaml", {
        "ok": sshd.host_entry(known_hosts=str(kh)),
        "bad": sshd.host_entry(known_hosts=str(kh), hostname="localhost"),
    }, groups={"both": ["ok", "bad"]})
    status, out, err = cli("facts", "both", "--json", "-i", str(inv))
    doc = json.loads(out)
    assert status == Exit.HOSTKEY and doc["failed"] == ["bad"], err
    assert "HOST KEY CHANGED for localhost" in err and "ok" not in doc["failed"]
    assert loads == [str(kh)]   # one parse for both hosts


def test_known_hosts_change_is_seen_by_the_next_connection(sshd, tmp_path, cli):
    """The parse is reused only for the same bytes: a key line replaced by another of the same
    length right away (same size, same mtime tick) is what the next connection checks against."""
    from tests.conftest import write_inventory

    good = sshd.known_hosts.read_text().split()
    right = f"[127.0.0.1]:{sshd.port} {good[-2]} {good[-1]}\n"
    wrong = _other_key_line(tmp_path, f"[127.0.0.1]:{sshd.port}")
    assert len(right) == len(wrong)
    kh = tmp_path / "known_hosts"
    kh.write_text(right)
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(known_hosts=str(kh))})
    assert cli("facts", "h", "-i", str(inv))[0] == 0
    kh.write_text(wrong)
    status, _, err = cli("facts", "h", "-i", str(inv))
    assert status == Exit.HOSTKEY and "HOST KEY CHANGED" in err
    kh.write_text(right)
    assert cli("facts", "h", "-i", str(inv))[0] == 0


def test_closing_a_session_ends_paramikos_reader_thread(sshd):
    """After the handshake paramiko's reader waits up to IDLE_POLL_S between reads; close() shuts
    the socket down, so the reader ends and the server sees the connection end."""
    from remote_ops.connect.sshconn import IDLE_POLL_S

    sess = sshd.session()
    t = sess.transport
    assert t.sock.gettimeout() == IDLE_POLL_S
    assert sess.call("ping.ping", {"echo": "x"})["echo"] == "x"
    sess.close()
    t.join(timeout=30)
    assert not t.is_alive() and not t.active


def test_one_identity_file_is_loaded_once_and_still_authenticates(sshd, tmp_path, monkeypatch):
    """Several connections with one identity file load the key once; a changed file is loaded
    again, and a key the server does not accept is still refused."""
    import shutil
    import subprocess

    import paramiko
    from remote_ops.connect import sshconn
    from remote_ops.errors import AuthError
    from remote_ops.connect.transport import ConnectOptions, Session

    key = tmp_path / "id_ed25519"
    shutil.copy(sshd.identity_file, key)
    key.chmod(0o600)
    loads = []
    real = paramiko.Ed25519Key.from_private_key_file.__func__
    monkeypatch.setattr(paramiko.Ed25519Key, "from_private_key_file",
                        classmethod(lambda cls, *a, **k: (loads.append(a[0]), real(cls, *a, **k))[1]))
    for _ in range(3):
        with Session(sshd.host(identity_file=str(key)), ConnectOptions()) as sess:
            assert sess.call("ping.ping", {"echo": "k"})["echo"] == "k"
    assert loads == [str(key)]
    key.unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(AuthError):   # same path, another key: loaded again, and refused by the server
        Session(sshd.host(identity_file=str(key)), ConnectOptions()).open()
    assert loads == [str(key), str(key)]
    assert sshconn.identity_key(str(key)).get_base64() == key.with_suffix(".pub").read_text().split()[1]
