"""Property-based fuzzing of what users type: inventory YAML, playbook YAML, CLI arguments.

Whatever the input, the CLI answers with a legitimate exit status and, when it fails, exactly one
line on stderr (``remote-ops: ...``); never a traceback, never an "internal error". Bad input is exit 2.

Nothing here reaches beyond loopback: every inventory that could connect names 127.0.0.1 on a port
where nothing listens, with ``proxy_jump: none`` so no ~/.ssh/config hop is followed.

``REMOTE_OPS_FUZZ_EXAMPLES`` raises the number of examples (the long form in benchmarks/faults/suites.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from remote_ops.cli import main
from remote_ops.errors import ConfigError, Exit, RemoteOpsError
from tests.conftest import REPO

EXAMPLES = int(os.environ.get("REMOTE_OPS_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("REMOTE_OPS_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.filter_too_much])
STATUSES = {int(e) for e in Exit}
from tests.faults import FUZZ_COUNTER as COUNTER  # noqa: E402  (shared with benchmarks/faults/suites.py)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]   # nothing listens once the socket closes


CLOSED_PORT = _closed_port()


@pytest.fixture(scope="module", autouse=True)
def _adhoc_targets_stay_on_loopback(tmp_path_factory):
    """A fuzzed target like ``a.b`` or ``x@y:1`` is an ad-hoc host: an ssh_config ``Host *`` sends
    every name to the closed loopback port, so nothing is looked up in DNS or reached off-host."""
    cfg = tmp_path_factory.mktemp("sshcfg") / "config"
    cfg.write_text(f"Host *\n    HostName 127.0.0.1\n    Port {CLOSED_PORT}\n    ProxyJump none\n"
                   "    ConnectTimeout 2\n")
    old = os.environ.get("REMOTE_OPS_SSH_CONFIG")
    os.environ["REMOTE_OPS_SSH_CONFIG"] = str(cfg)
    yield
    if old is None:
        os.environ.pop("REMOTE_OPS_SSH_CONFIG", None)
    else:
        os.environ["REMOTE_OPS_SSH_CONFIG"] = old


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in this process; SystemExit (argparse --help/--version) counts as its status."""
    COUNTER["inputs"] += 1
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return status, out.getvalue(), err.getvalue()


def assert_clean(status: int, out: str, err: str, allowed: set[int] | None = None, per_host: bool = False) -> None:
    """``per_host``: a command over several hosts prints one line per failed host ("remote-ops: HOST: ..."),
    each host once; otherwise one line in all."""
    assert "Traceback" not in err + out, err
    assert "internal error" not in err, err
    assert status in (allowed or STATUSES), (status, err)
    if status != 0:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert all(ln.startswith("remote-ops: ") for ln in lines), lines
        if per_host and len(lines) > 1:
            hosts = [ln[len("remote-ops: "):].split(": ", 1)[0] for ln in lines]
            assert len(set(hosts)) == len(hosts), f"a host named twice: {err!r}"
        else:
            assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err!r}"


# ------------------------------------------------------------------------------ value strategies
HOSTILE = st.sampled_from(["$(touch /tmp/x)", "`id`", "; rm -rf ~", "&& echo hi", "a\nb", "'", '"', "-rf",
                           "--help", "\x00", "\ud800" if False else "\u202e", "~", "../../etc/passwd", "",
                           " ", "*", "{{ x }}", "%s%n", "\\", "x" * 300, "FILL-ME", "127.0.0.1:22", "[::1]"])
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40), HOSTILE)
ANY = st.recursive(SCALAR, lambda c: st.one_of(st.lists(c, max_size=4),
                                               st.dictionaries(st.one_of(st.text(max_size=12), HOSTILE), c,
                                                               max_size=4)), max_leaves=12)
HOST_KEYS = ["hostname", "port", "user", "identity_file", "proxy_jump", "known_hosts", "python", "workdir",
             "env", "vars", "playbook", "connect_timeout", "keepalive"]


@st.composite
def host_entries(draw):
    keys = draw(st.lists(st.sampled_from(HOST_KEYS + ["bogus"]), max_size=6, unique=True))
    entry = {}
    for k in keys:
        if k == "env":
            entry[k] = draw(st.one_of(st.dictionaries(st.one_of(st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,8}\Z"), HOSTILE),
                                                      SCALAR, max_size=3), ANY))
        elif k in ("port", "keepalive"):
            entry[k] = draw(st.one_of(st.integers(min_value=-5, max_value=70000), ANY))
        elif k == "connect_timeout":
            entry[k] = draw(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 10**20), ANY))
        else:
            entry[k] = draw(st.one_of(SCALAR, ANY))
    return entry


@st.composite
def inventories(draw):
    hosts = draw(st.dictionaries(st.one_of(st.text(max_size=10), HOSTILE, st.integers()),
                                 st.one_of(host_entries(), ANY), max_size=3))
    data = {"hosts": hosts}
    if draw(st.booleans()):
        data["groups"] = draw(st.one_of(ANY, st.dictionaries(st.text(max_size=6), st.lists(
            st.sampled_from(list(hosts) + ["nope", "all"]) if hosts else st.text(max_size=4), max_size=3), max_size=2)))
    if draw(st.booleans()):
        data["default"] = draw(st.one_of(SCALAR, st.sampled_from(list(hosts) or ["x"])))
    if draw(st.integers(0, 9)) == 0:
        data[draw(st.text(max_size=6))] = draw(ANY)
    return data


def _dump(data) -> str:
    try:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError:
        return yaml.safe_dump(repr(data))


VALID_INVENTORY = """\
default: gpu
hosts:
  gpu:
    hostname: 127.0.0.1
    port: 22
    python: /opt/venv/bin/python
    env: {HF_TOKEN: abc}
groups:
  all-gpus: [gpu]
"""


@st.composite
def mutated_text(draw, base: str):
    """A valid document with a few random insertions, deletions or replacements."""
    text = base
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["ins", "del", "rep"]))
        piece = draw(st.one_of(st.text(max_size=6), st.sampled_from([":", "- ", "\n  ", "{", "[", "&a", "*a", "!!python/object:os.system", "\t", "'", "\x00", "\ufeff", "? "])))
        if op == "ins":
            text = text[:i] + piece + text[i:]
        elif op == "del":
            text = text[:i] + text[i + draw(st.integers(1, 8)):]
        else:
            text = text[:i] + piece + text[i + len(piece):]
    return text


INVENTORY_TEXT = st.one_of(inventories().map(_dump), mutated_text(VALID_INVENTORY), st.text(max_size=200),
                           st.binary(max_size=80).map(lambda b: b.decode("latin-1")))


def _force_loopback(text: str) -> str:
    """Make every host of a parsed inventory point at the closed loopback port (never off-host)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(data, dict) and isinstance(data.get("hosts"), dict):
        for name, entry in list(data["hosts"].items()):
            if isinstance(entry, dict):
                entry.update(hostname="127.0.0.1", port=CLOSED_PORT, proxy_jump="none")
            else:
                data["hosts"][name] = {"hostname": "127.0.0.1", "port": CLOSED_PORT, "proxy_jump": "none"}
        return _dump(data)
    return text


# ------------------------------------------------------------------------------ inventory
@FUZZ
@given(text=INVENTORY_TEXT)
def test_fuzz_inventory_hosts_command(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("inv") / "inventory.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    status, out, err = run_cli(["hosts", "-i", str(path)])
    assert_clean(status, out, err, {0, 2})


@FUZZ
@given(data=inventories(), spec=st.one_of(st.none(), st.text(max_size=12), HOSTILE))
@example(data={"hosts": {}}, spec="0,1")     # found by benchmarks/faults/suites.py's fuzzing on 2026-12-03
def test_fuzz_inventory_through_connect(tmp_path_factory, data, spec):
    """Inventory values that parse must still fail cleanly when used to connect (closed loopback port)."""
    path = tmp_path_factory.mktemp("inv") / "inventory.yaml"
    path.write_text(_force_loopback(_dump(data)))
    argv = ["facts", "-i", str(path), "--connect-timeout", "2"] + ([spec] if spec is not None else [])
    if spec is not None and spec.startswith("-"):
        argv = argv[:-1] + ["--", spec]
    status, out, err = run_cli(argv)
    assert_clean(status, out, err, {2, 3, 4, 5, 6}, per_host=True)   # spec "0,1": two hosts, a line each


# ------------------------------------------------------------------------------ playbooks
VALID_PLAYBOOK = (REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml").read_text()


@st.composite
def playbooks(draw):
    edit = st.one_of(
        st.fixed_dictionaries({"id": st.one_of(st.text(max_size=8), HOSTILE), "call": st.one_of(st.text(max_size=10), HOSTILE, ANY)},
                              optional={"drop": ANY, "add": st.one_of(st.dictionaries(st.text(max_size=6), st.one_of(SCALAR, HOSTILE)), ANY),
                                        "rename": ANY, "expect": st.one_of(st.integers(-2, 3), st.just("any"), ANY), "fixes": ANY}),
        st.fixed_dictionaries({"id": st.text(max_size=8), "replace": st.one_of(
            st.fixed_dictionaries({"old": st.one_of(st.text(max_size=20), HOSTILE), "new": st.one_of(st.text(max_size=20), HOSTILE)}), ANY)}),
        ANY)
    patch = st.one_of(st.fixed_dictionaries({}, optional={"module": st.one_of(st.text(max_size=20), HOSTILE, ANY),
                                                          "path": st.one_of(st.text(max_size=20), HOSTILE, ANY),
                                                          "edits": st.one_of(st.lists(edit, max_size=3), ANY),
                                                          "allow_outside": ANY}), ANY)
    return draw(st.fixed_dictionaries({}, optional={
        "name": st.one_of(st.text(max_size=10), ANY), "description": ANY,
        "requires": st.one_of(st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=8), HOSTILE, SCALAR)), ANY),
        "check": st.one_of(st.fixed_dictionaries({}, optional={"targets": ANY, "against": ANY}), ANY),
        "patches": st.one_of(st.lists(patch, max_size=3), ANY), "allow_outside": ANY, "extract": ANY,
        "vars": ANY, "junk": ANY}))


PLAYBOOK_TEXT = st.one_of(playbooks().map(_dump), mutated_text(VALID_PLAYBOOK), st.text(max_size=200))


@FUZZ
@given(text=PLAYBOOK_TEXT)
def test_fuzz_playbook_loader(text):
    """The loader either returns a playbook or raises ConfigError with one line naming the file."""
    from remote_ops.playbook import loader as playbook

    COUNTER["inputs"] += 1
    try:
        playbook.loads(text, "fuzz.yaml")
    except ConfigError as exc:
        assert exc.exit_status == Exit.USAGE
        assert "\n" not in exc.one_line(), exc.one_line()
        assert exc.one_line().startswith("fuzz.yaml"), exc.one_line()


# ------------------------------------------------------------------------------ CLI arguments
def _commands() -> list[str]:
    from remote_ops.cli import _load_commands
    return [m.NAME for m in _load_commands() if m.NAME not in ("sandbox", "completion")]


TOKENS = st.one_of(
    st.sampled_from(_commands()), st.sampled_from(["--json", "--debug", "-v", "--accept-new", "--parallel",
                                                   "--connect-timeout", "-i", "--inventory", "--playbook", "--yes",
                                                   "--force", "--to", "--follow", "-f", "--job", "--dry-run",
                                                   "--help", "--version", "0", "-1", "nan", "inf", "1e309",
                                                   "h", "all", "nope", "--", "-"]),
    HOSTILE, st.text(max_size=12))


@pytest.fixture(scope="module")
def fuzz_inventory(tmp_path_factory) -> Path:
    """One host on a closed loopback port: any command that gets as far as connecting fails fast."""
    path = tmp_path_factory.mktemp("fuzzinv") / "inventory.yaml"
    path.write_text(yaml.safe_dump({"default": "h", "hosts": {"h": {
        "hostname": "127.0.0.1", "port": CLOSED_PORT, "proxy_jump": "none", "connect_timeout": 2,
        "known_hosts": str(path.parent / "known_hosts")}}}))
    return path


@FUZZ
@given(argv=st.lists(TOKENS, max_size=7))
@example(argv=["facts", "-v"])   # found by fuzzing: a failing command with -v (its counters line too)
@example(argv=["hosts", " "])    # found by fuzzing: an unrecognized argument of blanks (no first word)
def test_fuzz_cli_argv(fuzz_inventory, monkeypatch, argv):
    if any("sandbox".startswith(a) and a for a in argv) or any(a.startswith("sa") for a in argv):
        return   # sandbox up would build a venv and start an sshd: not an argument-parsing question
    monkeypatch.setenv("REMOTE_OPS_INVENTORY", str(fuzz_inventory))
    monkeypatch.chdir(fuzz_inventory.parent)
    status, out, err = run_cli(argv)
    if "--debug" in argv:          # --debug shows tracebacks on purpose
        assert status in STATUSES
        return
    if status == 2 and not err and out.startswith("usage: remote-ops"):
        return   # no command given: the overview, like git with no arguments
    if any(re.fullmatch(r"-v+", a) or (len(a) > 2 and "--verbose".startswith(a)) for a in argv):
        # -v adds a per-host counters line when the command ends (asked for): the error is still one line
        err = "".join(ln for ln in err.splitlines(keepends=True) if not VERBOSE_STATS.match(ln))
    assert_clean(status, out, err)


VERBOSE_STATS = re.compile(r"remote-ops: \S+: \d+ connection\(s\), \d+ exec round trip\(s\)")


# ------------------------------------------------------------------------------ found by fuzzing
@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "1e309"])
def test_connect_timeout_out_of_range_is_a_usage_error(fuzz_inventory, monkeypatch, value):
    monkeypatch.setenv("REMOTE_OPS_INVENTORY", str(fuzz_inventory))
    status, out, err = run_cli(["facts", "--connect-timeout", value])
    assert_clean(status, out, err, {2})


@pytest.mark.parametrize("value", [".inf", ".nan", "-1", "0", "1e400"])
def test_inventory_connect_timeout_out_of_range_is_a_config_error(tmp_path, value):
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts:\n  h:\n    hostname: 127.0.0.1\n    port: {CLOSED_PORT}\n    proxy_jump: none\n"
                    f"    connect_timeout: {value}\n")
    status, out, err = run_cli(["facts", "h", "-i", str(path)])
    assert_clean(status, out, err, {2})
    assert "connect_timeout" in err and f"{path}:6" in err


@pytest.mark.parametrize("value", ["-1", "100000000000000000000"])
def test_inventory_keepalive_out_of_range_is_a_config_error(tmp_path, value):
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts:\n  h:\n    hostname: 127.0.0.1\n    port: {CLOSED_PORT}\n    proxy_jump: none\n"
                    f"    keepalive: {value}\n")
    status, out, err = run_cli(["facts", "h", "-i", str(path)])
    assert_clean(status, out, err, {2})
