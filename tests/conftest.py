"""Shared fixtures: a real OpenSSH sshd on loopback, real package sources from PyPI, inventories.

Nothing here mocks SSH: every test that crosses the wire talks to ``sshd`` over TCP with generated
keys and strict host-key checking.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from pathlib import Path

import pytest
import yaml

from remote_ops import pkgsource
from remote_ops.connect.inventory import Host
from remote_ops.sshd import SshdServer
from remote_ops.connect.transport import ConnectOptions, Session

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
EXTRACT_SCRIPT = REPO / "remote_ops" / "playbook" / "shipped" / "scripts" / "extract_hidden_states.py"


def load_extract_script(name: str = "extract_hidden_states_under_test"):
    """A fresh module of the shipped extract script, loaded by path (it runs standalone on hosts and
    is no package module); each call gives its own copy."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, EXTRACT_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
SPECULATORS = ("speculators", "0.3.0")
VLLM_NEW = ("vllm", "0.17.0")
VLLM_PINNED = ("vllm", "0.11.0")


def pytest_collection_modifyitems(config, items):
    """In a parallel run (pytest-xdist, scripts/test.sh) the tests marked ``long`` go first: the
    workers take them at the start, so the run does not end with one of them running alone. Each
    worker computes the same order; a run in one process keeps file order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    long = [i for i in items if i.get_closest_marker("long")]
    rest = [i for i in items if not i.get_closest_marker("long")]
    # each beside a short one: xdist's --dist load first hands every worker two tests, and two long
    # ones on one worker would run one after the other
    # (more long ones than short: the rest of the long ones after the pairs, none left out)
    items[:] = [i for pair in zip(long, rest) for i in pair] + long[len(rest):] + rest[len(long):]


@pytest.fixture(autouse=True)
def _keep_the_checkout_clean(tmp_path, monkeypatch):
    """No test may read or rewrite the repository's own inventory or sandbox: the default
    inventory and sandbox dir point into the test's tmp dir (tests pass -i explicitly)."""
    monkeypatch.setenv("REMOTE_OPS_INVENTORY", str(tmp_path / "default-inventory.yaml"))
    monkeypatch.setenv("REMOTE_OPS_SANDBOX_DIR", str(tmp_path / "default-sandbox"))
    # the user's own playbooks ($XDG_CONFIG_HOME/remote-ops/playbooks, playbook/search.py): none, unless
    # a test puts some there; what a user keeps in ~/.config never reaches the suite
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    # computed patch plans: each test starts with none (remote_ops/patch/plancache.py)
    monkeypatch.setenv("REMOTE_OPS_PLAN_CACHE", str(tmp_path / "plan-cache"))
    # kept baseline drift facts (remote_ops/check/baseline_memo.py): none shared between tests
    monkeypatch.setenv("REMOTE_OPS_DRIFT_CACHE", str(tmp_path / "drift-cache"))
    # kept connections (--persist) are off unless a test turns them on (tests/connect/test_persist.py):
    # no test reuses another's connection, and none leaves a background process behind
    monkeypatch.setenv("REMOTE_OPS_PERSIST", "0")
    monkeypatch.setenv("REMOTE_OPS_MUX_DIR", str(tmp_path / "no-mux"))
    from remote_ops.patch import plancache
    plancache.clear_memory()


# A live sandbox sshd's connect timeout. The default (10 s, the SSH greeting included) is the product's,
# for a host that answers TCP but never speaks SSH; on a loaded CI machine (2 CPUs, 4 test workers)
# a live sandbox sshd once took longer than that to send its greeting (tests/fleet/test_fleet.py, CI on
# 0567699), which no test here is about. Tests of the timeout itself set their own.
LIVE_CONNECT_TIMEOUT = 60


class SshdFixture:
    """A running sshd plus helpers to describe it as an inventory host."""

    def __init__(self, server: SshdServer):
        self.server = server

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def known_hosts(self) -> Path:
        return self.server.known_hosts

    @property
    def identity_file(self) -> Path:
        return self.server.identity_file

    @property
    def user(self) -> str:
        return self.server.user

    def host_entry(self, python: str | None = None, **overrides) -> dict:
        """Inventory mapping (for YAML) describing this sshd."""
        entry = {"hostname": self.server.address, "port": self.port, "user": self.user,
                 "identity_file": str(self.identity_file), "known_hosts": str(self.known_hosts),
                 "python": str(python or sys.executable), "connect_timeout": LIVE_CONNECT_TIMEOUT}
        entry.update(overrides)
        return entry

    def host(self, name: str = "testhost", python: str | None = None, **overrides) -> Host:
        e = self.host_entry(python, **overrides)
        env = e.pop("env", {})
        return Host(name=name, hostname=e.pop("hostname"), port=e.pop("port"), user=e.pop("user"),
                    identity_file=(e.pop("identity_file"),), known_hosts=e.pop("known_hosts"),
                    python=e.pop("python"), env=env, proxy_jump=(), **e)

    def session(self, python: str | None = None, **overrides) -> Session:
        return Session(self.host(python=python, **overrides), ConnectOptions()).open()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """One sshd per test process: in a parallel run each worker has its own, on a port picked free
    (SshdServer.start moves to another one if a process beside it took that port first)."""
    server = SshdServer(tmp_path_factory.mktemp("sshd")).start()
    yield SshdFixture(server)
    server.stop()


@pytest.fixture
def state_dir(tmp_path):
    """An isolated remote-ops state dir on the 'host' (journal, jobs, locks)."""
    d = tmp_path / "remote-state"
    d.mkdir()
    return d


@contextlib.contextmanager
def silent_port():
    """A loopback port that accepts TCP and never speaks SSH (a hung host); yields the port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join()
        srv.close()
        for c in held:
            c.close()


def write_inventory(path: Path, hosts: dict, groups: dict | None = None, default: str | None = None) -> Path:
    data: dict = {"hosts": hosts}
    if groups:
        data["groups"] = groups
    if default:
        data["default"] = default
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


STANDIN = REPO / "remote_ops" / "sandbox_assets" / "extract_standin.py"


def standin_playbook(name: str, *extract_lines: str) -> str:
    """A playbook ``name`` whose extract runs the sandbox's stand-in generator (torch on CPU, 4 layers
    of 16, one sample a batch): ``vars.n`` samples (default 10), ``vars.sleep`` seconds a batch (default
    0), into ``vars.out``; no GPU, stop grace 1 s. ``extract_lines``: more ``key: value`` lines of
    extract (``shard: true``, ``slurm: {tasks: 3}``)."""
    more = "".join(f"  {line}\n" for line in extract_lines)
    return f"""\
name: {name}
vars: {{n: 10, sleep: 0}}
extract:
  command: ["{{python}}", "{STANDIN}", "--output-dir", "{{output_dir}}", "--max-samples", "{{vars.n}}",
            "--batch-size", "1", "--sleep", "{{vars.sleep}}", "--num-layers", "4", "--hidden-size", "16"]
  output_dir: "{{vars.out}}"
  expected_samples: "{{vars.n}}"
  gpus: 0
  stop_grace_seconds: 1
{more}"""


def standin_extract(*args: str, **keys) -> dict:
    """The extract section of a playbook whose job is the sandbox's stand-in generator (torch on the CPU, no
    GPU): its command with ``args`` after ``--output-dir {output_dir}``, a stop grace of 2 s, then ``keys``
    (``workdir``, ``output_dir``, ``expected_samples``, ``files``...; a key given replaces the default)."""
    ex = {"command": ["{python}", str(STANDIN), "--output-dir", "{output_dir}", *args], "stop_grace_seconds": 2}
    ex.update({k: str(v) if isinstance(v, Path) else v for k, v in keys.items()})
    return ex


def write_playbook(path: Path, name: str, extract: dict) -> Path:
    """A playbook file ``name`` with this extract section (``standin_extract``); returns its path."""
    path.write_text(yaml.safe_dump({"name": name, "extract": extract}, sort_keys=False))
    return path


@pytest.fixture
def inventory_file(tmp_path, sshd):
    """Factory: inventory with one host ``testhost`` on the sshd (python overridable)."""
    def make(python: str | None = None, name: str = "testhost", **overrides) -> Path:
        return write_inventory(tmp_path / "inventory.yaml", {name: sshd.host_entry(python, **overrides)})
    return make


@pytest.fixture(scope="session")
def env_vllm017(tmp_path_factory) -> Path:
    """Python of a venv holding real speculators 0.3.0 and vLLM 0.17.0 sources (shared, read-only use)."""
    return pkgsource.make_env(tmp_path_factory.mktemp("env017") / "venv", [SPECULATORS, VLLM_NEW])


@pytest.fixture(scope="session")
def env_vllm011(tmp_path_factory) -> Path:
    return pkgsource.make_env(tmp_path_factory.mktemp("env011") / "venv", [SPECULATORS, VLLM_PINNED])


@pytest.fixture
def fresh_env017(tmp_path) -> Path:
    """A private venv (speculators copied, so tests may patch it) with vLLM 0.17.0."""
    return pkgsource.make_env(tmp_path / "venv", [SPECULATORS, VLLM_NEW])


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run the CLI in-process: ``cli(args...) -> (status, stdout, stderr)``."""
    from remote_ops.cli import main

    def run(*args: str, env: dict | None = None):
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        status = main(list(args))
        out, err = capsys.readouterr()
        return status, out, err
    return run



@pytest.fixture
def sigint_default():
    """SIGINT as a terminal's Ctrl-C finds it, for the tests that send one: a run started in the
    background of a shell without job control inherits SIGINT ignored (POSIX), and so does every
    child it starts (Python keeps an inherited SIG_IGN): the signal would then change nothing."""
    import signal
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
