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
