"""The host's agent cache, the controller's plan cache, and importing only what a command needs.

Every test crosses a real sshd (or runs the bootstrap the way LocalSession does); nothing is timed:
figures are benchmarks/controller/run.py's job.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from remote_ops.connect import bundle

from remote_ops.patch import plancache
from remote_ops.connect.transport import ConnectOptions, Session
from tests.conftest import REPO

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"
GEN = "speculators/data_generation/vllm_hidden_states_generator.py"


def site_file(python: Path, rel: str) -> Path:
    return next(Path(python).parent.parent.glob(f"lib/python*/site-packages/{rel}"))


def entry_dir(cache: Path) -> Path:
    (d,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    return d


def ping(sshd, cache, **kw) -> Session:
    """A new session (a new controller connection) running one ping; returns it for its stats."""
    sess = Session(sshd.host(env={bundle.CACHE_ENV: str(cache)}, **kw), ConnectOptions()).open()
    try:
        assert sess.call("ping.ping", {"echo": "x"})["echo"] == "x"
    finally:
        sess.close()
    return sess


# ------------------------------------------------------------------------------ host agent cache
def test_agent_cache_fills_once_then_hits_without_shipping_the_bundle(sshd, tmp_path):
    cache = tmp_path / "agent-cache"
    first = ping(sshd, cache)
    assert first.stats.agent_cache == ["filled"] and first.stats.bundles_sent == 1
    d = entry_dir(cache)
    assert d.name == f"{bundle.agent_sha256()}-" + d.name.split("-", 1)[1]
    assert d.name.split("-", 1)[1].startswith(sys.implementation.cache_tag)
    for p in (cache, d):
        st = p.stat()
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    names = sorted(p.name for p in d.iterdir())
    assert names[1] == "sources.json" and names[0].startswith("code-")
    again = ping(sshd, cache)
    assert again.stats.agent_cache == ["hit"] and again.stats.bundles_sent == 0
    # a hit sends the header and the request only: a small fraction of the bundle
    assert again.stats.bytes_sent < len(bundle.agent_payload()) / 10
    assert again.stats.execs == 1 and again.stats.host_cpu_s and again.stats.host_cpu_s[0] > 0


def read_code_file(f: Path):
    """(index bytes, {module: (offset, size, sha256)}, body) of a cache entry's code file."""
    import marshal
    raw = f.read_bytes()
    n, _, rest = raw.partition(b"\n")
    head = rest[:int(n)]
    return head, marshal.loads(head)[2], rest[int(n):]


@pytest.mark.parametrize("victim", ["code", "index", "sources"])
def test_tampered_cache_file_is_ignored_and_rebuilt(sshd, tmp_path, victim):
    cache = tmp_path / "agent-cache"
    ping(sshd, cache)
    d = entry_dir(cache)
    f = next(d.glob("code-*.bin"))
    import hashlib
    import marshal
    if victim == "code":
        # a whole file of other code with a consistent index, under the old name: its index no
        # longer matches the hash in the file's name
        evil = [marshal.dumps(compile("raise SystemExit('tampered code ran')", "x", "exec"))] * 2
        index = {k: (i * len(evil[0]), len(evil[0]), hashlib.sha256(evil[0]).hexdigest())
                 for i, k in enumerate(["_remote_ops_agent.ping", "_remote_ops_agent.protocol"])}
        head = marshal.dumps((bundle.agent_sha256(), marshal.loads(read_code_file(f)[0])[1], index))
        f.write_bytes(b"%d\n" % len(head) + head + b"".join(evil))
    elif victim == "index":
        raw = f.read_bytes()
        f.write_bytes(raw.replace(b"_remote_ops_agent.ping", b"_remote_ops_agent.pong", 1))
    else:
        f = d / "sources.json"
        f.write_bytes(f.read_bytes().replace(b"def op_ping", b"def op_pong"))
        # sources are read only when a source is needed: a crash's traceback lines
        sess = Session(sshd.host(env={bundle.CACHE_ENV: str(cache)}), ConnectOptions()).open()
        try:
            with pytest.raises(Exception) as err:
                sess.call("ping.ticks", {"n": "not a number"})
        finally:
            sess.close()
        assert sess.stats.agent_cache == ["hit"]
        tb = getattr(err.value, "remote_traceback", "") or ""
        assert "ValueError" in tb and "op_pong" not in tb and "int(args.get" not in tb   # no unchecked line
        assert not d.exists()   # found damaged when needed: removed, so the next exec rebuilds it
    rebuilt = ping(sshd, cache)   # ping() asserts the real agent answered
    assert rebuilt.stats.agent_cache == ["filled"] and rebuilt.stats.bundles_sent == 1
    assert ping(sshd, cache).stats.agent_cache == ["hit"]


def test_damaged_module_code_is_compiled_from_the_checked_sources_then_rebuilt(sshd, tmp_path):
    """One module's bytes no longer match their hash in the (intact) index: that module is compiled
    from sources.json (checked against the entry's hash), the answer is right, the next exec refills."""
    cache = tmp_path / "agent-cache"
    ping(sshd, cache)
    d = entry_dir(cache)
    f = next(d.glob("code-*.bin"))
    head, index, body = read_code_file(f)
    off, size, _ = index["_remote_ops_agent.ping"]
    evil = bytearray(body)
    evil[off + size // 2] ^= 0xFF
    f.write_bytes(b"%d\n" % len(head) + head + bytes(evil))
    damaged = ping(sshd, cache)   # ping() asserts the real agent answered
    assert damaged.stats.agent_cache == ["hit"] and damaged.stats.bundles_sent == 0
    assert not d.exists()
    assert ping(sshd, cache).stats.agent_cache == ["filled"]
    assert ping(sshd, cache).stats.agent_cache == ["hit"]


def test_a_hit_loads_only_the_modules_an_op_imports(tmp_path):
    """Per-module code: a hit on ping unmarshals the index and the package, protocol, core/jsonio and ping, not
    the other ~35 modules (the bytes given to marshal.loads are counted)."""
    cache = tmp_path / "agent-cache"
    env = dict(os.environ, **{bundle.CACHE_ENV: str(cache)})
    count = ("import marshal as _m, sys as _s\n_loads = _m.loads\n_n = []\n"
             "def _count(b):\n    if _s._getframe(1).f_code.co_filename == '<string>':   # the bootstrap's, not .pyc imports\n"
             "        _n.append(len(b))\n    return _loads(b)\n_m.loads = _count\n"
             "def _exit(rc):\n    _s.stderr.write('unmarshalled %r' % _n)\n    _s.exit(rc)\n")
    script = count + bundle._BOOT.replace("sys.exit(protocol.", "_exit(protocol.")
    assert "_exit(protocol." in script
    for expect in ("filled", "hit"):
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, cwd=tmp_path,
                              input=bundle.encode_probe([{"op": "ping.ping", "args": {}}], {bundle.CACHE_ENV: str(cache)})
                              + bundle.agent_payload())
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.splitlines()[-1])["agent"]["cache"] == expect
    sizes = eval(proc.stderr.decode().rsplit("unmarshalled ", 1)[1])
    head, index, body = read_code_file(next(entry_dir(cache).glob("code-*.bin")))
    assert len(index) > 30
    assert sizes == [len(head)] + [index["_remote_ops_agent." + m][1] for m in ("__init__", "protocol", "core.__init__", "core.jsonio", "ping")]


def test_cache_entry_with_loose_permissions_is_not_used(sshd, tmp_path):
    cache = tmp_path / "agent-cache"
    ping(sshd, cache)
    d = entry_dir(cache)
    d.chmod(0o777)
    assert ping(sshd, cache).stats.agent_cache == ["filled"]
    assert stat.S_IMODE(entry_dir(cache).stat().st_mode) == 0o700
    assert ping(sshd, cache).stats.agent_cache == ["hit"]


def test_unwritable_cache_works_without_it_and_stops_probing(sshd, tmp_path):
    home = tmp_path / "home-is-a-file"
    home.write_text("not a directory\n")   # unwritable even for root (mode bits are not enough)
    sess = Session(sshd.host(env={bundle.CACHE_ENV: str(home / ".cache" / "agent")}), ConnectOptions()).open()
    try:
        assert sess.call("ping.ping", {"echo": "a"})["echo"] == "a"
        assert sess.call("ping.ping", {"echo": "b"})["echo"] == "b"
    finally:
        sess.close()
    # first exec: probed, shipped on request, could not store; second: self-contained form at once
    assert sess.stats.agent_cache == ["unwritable", "shipped"]
    assert sess.stats.bundles_sent == 1


def test_cache_off_ships_the_bundle_as_before(sshd, tmp_path):
    sess = ping(sshd, "off")
    assert sess.stats.agent_cache == ["shipped"] and sess.stats.bundles_sent == 0
    assert sess.stats.bytes_sent > len(bundle.agent_payload())


def test_unwritable_home_default_location(tmp_path):
    """The default cache root is under $HOME: a HOME that cannot hold it still runs the agent."""
    home = tmp_path / "home"
    home.write_text("a file, not a directory\n")
    proc = subprocess.Popen(["sh", "-c", bundle.agent_command(sys.executable)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            env=dict(os.environ, HOME=str(home)))
    proc.stdin.write(bundle.encode_probe([{"op": "ping.ping", "args": {"echo": "h"}}]))
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == bundle.NEED_BUNDLE
    proc.stdin.write(bundle.agent_payload())
    proc.stdin.close()
    out = proc.stdout.read()
    assert proc.wait() == 0, proc.stderr.read()
    last = json.loads(out.splitlines()[-1])
    assert last["results"][0]["result"]["echo"] == "h" and last["agent"]["cache"] == "unwritable"


def test_two_controllers_racing_to_fill_the_cache_both_succeed(sshd, tmp_path, inventory_file):
    """Separate controller processes, started together on an empty cache, several rounds."""
    for round_ in range(3):
        cache = tmp_path / f"agent-cache-{round_}"
        inv = inventory_file(env={bundle.CACHE_ENV: str(cache)})
        procs = [subprocess.Popen([sys.executable, "-m", "remote_ops", "-i", str(inv), "facts", "--json"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path) for _ in range(3)]
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()
            assert json.loads(out)["python"]["version"]
        assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []   # no temp dir left
        assert ping(sshd, cache).stats.agent_cache == ["hit"]


def test_racing_sessions_in_one_controller(sshd, tmp_path):
    cache = tmp_path / "agent-cache"
    errors, states = [], []

    def one():
        try:
            states.extend(ping(sshd, cache).stats.agent_cache)
        except Exception as exc:   # collected: the assertion below names it
            errors.append(exc)
    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and len(states) == 4
    assert set(states) <= {"filled", "hit"} and "filled" in states
    assert ping(sshd, cache).stats.agent_cache == ["hit"]


def test_local_connection_keeps_the_self_contained_form(tmp_path):
    """LocalSession writes stdin in one go: it must not get the probe form."""
    from remote_ops.connect.inventory import Host
    from remote_ops.connect.localsession import LocalSession

    sess = LocalSession(Host(name="me", hostname="localhost", python=sys.executable, proxy_jump=()))
    assert sess.call("ping.ping", {"echo": "l"})["echo"] == "l"
    assert sess.stats.agent_cache == ["shipped"]


# ------------------------------------------------------------------------------ plan cache
def _patch_json(cli, inv, *args):
    status, out, err = cli("-i", str(inv), "patch", *args, "--json")
    assert status == 0, err
    return json.loads(out)


def test_plan_is_computed_once_then_reused_from_disk(sshd, fresh_env017, state_dir, inventory_file, cli):
    inv = inventory_file(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)},
                         playbook=str(SHIPPED))
    first = _patch_json(cli, inv, "testhost", "--dry-run")
    assert {t["plan"] for t in first["targets"]} == {"computed"}
    plancache.clear_memory()   # as a new controller process would start
    second = _patch_json(cli, inv, "testhost", "--dry-run")
    assert {t["plan"] for t in second["targets"]} == {"cached"}
    assert second["diff"] == first["diff"] and second["edits"] == first["edits"]

    # apply from the cached plan: the bytes are those a fresh computation gives
    target = site_file(fresh_env017, GEN)
    applied = _patch_json(cli, inv, "testhost", "--yes")
    assert applied["changed"] and {t["plan"] for t in applied["targets"]} == {"cached"}
    patched = target.read_bytes()
    assert b"block_size=VLLM_BLOCK_SIZE" in patched
    # a rewritten target has a new sha256: its no-op plan is computed once, then cached
    rerun = _patch_json(cli, inv, "testhost", "--yes")
    assert not rerun["changed"]
    assert [t["plan"] for t in rerun["targets"]] == \
        ["computed" if t["changed"] else "cached" for t in applied["targets"]]
    plancache.clear_memory()
    rerun2 = _patch_json(cli, inv, "testhost", "--yes")
    assert not rerun2["changed"] and {t["plan"] for t in rerun2["targets"]} == {"cached"}
    # (every edit in place; the transformers-5 one is not for this host: no transformers there)
    assert {e["state"] for e in rerun2["edits"]} == {"applied", "not-applicable"}
    assert [e["edit"] for e in rerun2["edits"] if e["state"] == "not-applicable"] == ["pydantic-rebuild-knows-torch"]
    assert target.read_bytes() == patched


def test_tampered_plan_entry_is_ignored_and_recomputed(sshd, fresh_env017, state_dir, inventory_file, cli,
                                                       tmp_path):
    inv = inventory_file(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)},
                         playbook=str(SHIPPED))
    first = _patch_json(cli, inv, "testhost", "--dry-run")
    (entry,) = [p for p in (tmp_path / "plan-cache").glob("*/*.json")
                if "block_size=VLLM_BLOCK_SIZE" in (json.loads(p.read_text()).get("new_text") or "")]
    data = json.loads(entry.read_text())
    data_label = next(t["label"] for t in first["targets"] if GEN.replace("/", ".")[:-3] in (t["label"] or "")
                      or (t["real"] or "").endswith(GEN))
    data["new_text"] = data["new_text"].replace("block_size=VLLM_BLOCK_SIZE", "block_size=666")
    entry.write_text(json.dumps(data))
    plancache.clear_memory()
    again = _patch_json(cli, inv, "testhost", "--dry-run")
    plans = {t["label"]: t["plan"] for t in again["targets"]}
    assert plans[data_label] == "computed" and again["diff"] == first["diff"]
    assert "666" not in json.loads(entry.read_text())["new_text"]   # rewritten with the right plan


def test_fleet_of_identical_hosts_computes_the_plan_once(sshd, tmp_path, cli):
    from remote_ops import pkgsource
    from tests.conftest import SPECULATORS, VLLM_NEW, write_inventory

    hosts, targets = {}, []
    for i in range(3):
        py = pkgsource.make_env(tmp_path / f"venv{i}", [SPECULATORS, VLLM_NEW])
        state = tmp_path / f"state{i}"
        state.mkdir()
        hosts[f"h{i}"] = sshd.host_entry(python=str(py), env={"REMOTE_OPS_STATE_DIR": str(state)},
                                         playbook=str(SHIPPED))
        targets.append(site_file(py, GEN))
    inv = write_inventory(tmp_path / "fleet.yaml", hosts, groups={"all": list(hosts)})
    out = _patch_json(cli, inv, "all", "--yes")
    assert out["failed"] == []
    n_targets = len(out["hosts"][0]["result"]["targets"])
    for i in range(n_targets):   # each target's plan: computed on one host, reused on the others
        plans = sorted(h["result"]["targets"][i]["plan"] for h in out["hosts"])
        assert plans == ["cached", "cached", "computed"]
    assert len({t.read_bytes() for t in targets}) == 1 and b"block_size=VLLM_BLOCK_SIZE" in targets[0].read_bytes()


# ------------------------------------------------------------------------------ imports
def _imported(inv, tmp_path, *args, env=None) -> set[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "remote_ops", "-i", str(inv), *args],
                          capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, **(env or {})))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def _loaded(mods: set[str], package: str) -> bool:
    """Really imported: its submodules ran (a blocked ``import invoke`` still prints one line)."""
    return any(m.startswith(package + ".") for m in mods)


def test_json_commands_import_only_what_they_need(sshd, fresh_env017, state_dir, inventory_file, tmp_path):
    inv = inventory_file(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)},
                         playbook=str(SHIPPED))
    mods = _imported(inv, tmp_path, "facts", "--json")
    assert "paramiko" in mods   # the measurement sees the real imports
    for heavy in ("rich", "libcst", "fabric", "invoke", "concurrent.futures"):
        assert not _loaded(mods, heavy), f"facts --json imported {heavy}"
    env = {"REMOTE_OPS_PLAN_CACHE": str(tmp_path / "plans")}
    first = _imported(inv, tmp_path, "patch", "--dry-run", "--json", env=env)
    assert _loaded(first, "libcst")        # an edit had to be computed
    cached = _imported(inv, tmp_path, "patch", "--dry-run", "--json", env=env)
    for heavy in ("libcst", "rich", "invoke"):
        assert not _loaded(cached, heavy), f"patch with a cached plan imported {heavy}"
    assert "symtable" not in cached   # no validation either


def test_match_exec_in_ssh_config_still_reaches_invoke(tmp_path):
    """paramiko is imported without invoke; a ``Match exec`` line still gets it when evaluated."""
    pytest.importorskip("invoke")
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Match exec \"true\"\n    User matched\n")
    code = ("import sys; from remote_ops.connect import transport; c = transport._ssh_config(sys.argv[1]); "
            "assert 'invoke' not in sys.modules, 'imported at start'; print(c.lookup('x').get('user'))")
    proc = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "matched"


def test_bundle_hash_is_computed_once_when_a_fleet_asks_at_once(monkeypatch):
    """16 hosts' threads asking for the agent's hash and payload at the same moment read and
    hash the agent's sources once (an lru_cache computed them once per thread that missed)."""
    calls = []
    real = bundle._read_sources
    gate = threading.Barrier(16)

    def counted():
        calls.append(1)
        threading.Event().wait(0.05)   # a slow disk: every thread that misses would get here
        return real()
    for f in (bundle._sources_json, bundle.agent_sha256, bundle.agent_payload):
        f.cache_clear()
    monkeypatch.setattr(bundle, "_read_sources", counted)
    got = []

    def host():
        gate.wait()
        got.append((bundle.agent_sha256(), bundle.agent_payload()))
    threads = [threading.Thread(target=host) for _ in range(16)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for f in (bundle._sources_json, bundle.agent_sha256, bundle.agent_payload):
            f.cache_clear()
    assert len(got) == 16 and len(set(got)) == 1 and calls == [1]
    import hashlib
    import zlib
    sha, payload = got[0]
    n, blob = payload.split(b"\n", 1)
    assert int(n) == len(blob) and hashlib.sha256(zlib.decompress(blob)).hexdigest() == sha


@pytest.mark.parametrize("kind,pem", [("ed25519", False), ("rsa", False), ("ecdsa", False), ("rsa", True),
                                      ("ecdsa", True)])
def test_identity_file_is_parsed_once_as_the_type_it_declares(tmp_path, monkeypatch, kind, pem):
    """A fleet with a key per host: each key file is parsed by the class it declares, not tried
    as RSA, then ECDSA, then Ed25519 (paramiko's order, kept for a file that declares nothing)."""
    import paramiko

    from remote_ops.connect import sshconn

    path = tmp_path / f"id_{kind}"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)] + (["-m", "PEM"] if pem else []),
                   check=True)
    tried = []
    for klass in (paramiko.RSAKey, paramiko.ECDSAKey, paramiko.Ed25519Key):
        real = klass.from_private_key_file.__func__

        def spy(cls, filename, password=None, _real=real):
            tried.append(cls.__name__)
            return _real(cls, filename, password)
        monkeypatch.setattr(klass, "from_private_key_file", classmethod(spy))
    key = sshconn.identity_key(str(path))
    want = {"ed25519": "Ed25519Key", "rsa": "RSAKey", "ecdsa": "ECDSAKey"}[kind]
    assert type(key).__name__ == want and tried == [want]
    assert key.get_base64() == path.with_suffix(".pub").read_text().split()[1]
    # a file that declares no type keeps paramiko's order
    assert sshconn._key_classes(b"not a key", paramiko) == (paramiko.RSAKey, paramiko.ECDSAKey, paramiko.Ed25519Key)
