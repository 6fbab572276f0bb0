"""Host CPU per exec: what the agent computes without the stdlib modules it no longer
imports gives the same values as those modules (on this interpreter, and, for the bootstrap, on every
other CPython 3.10-3.13 found here), and ``facts`` on a host without jobs or nvidia-smi imports none
of them. Nothing here is timed: the figures come from a measurement, not from tests."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from remote_ops.agent import facts, gpu
from remote_ops.agent.core import dists, jsonio
from remote_ops.connect import bundle


# ------------------------------------------------------------------------------ jsonio == json
VALUES = [
    {}, [], "", "plain", "ünï\u2028code \"quoted\" \\ back\nslash \x00\x1f \ud83d\ude00 \udc80", 0, -1, 2 ** 70, -(2 ** 64),
    1.5, -0.0, 1e300, 5e-324, float("inf"), float("-inf"), True, False, None,
    {"a": [1, 2.25, {"b": None}], "ü": "x", 1: "int key", 2.5: "float key", True: "bool key", None: "none key"},
    (1, 2, (3,)), [[[[[]]]]], {"nested": {"deep": [{"x": [1, {"y": "z"}]}]}},
    {"obj": object, "path": Path("/x/y"), "set": {3}, "bytes": b"raw"},   # default=str
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_dumps_is_json_dumps(value):
    want = json.dumps(value, default=str, separators=(",", ":"))
    if "object at 0x" not in want:
        assert jsonio.dumps(value, default=str) == want


def test_dumps_nan_and_errors_are_json_s():
    assert jsonio.dumps([float("nan")], default=str) == "[NaN]"
    loop = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        jsonio.dumps(loop, default=str)
    with pytest.raises(TypeError) as mine:
        jsonio.dumps({(1, 2): "tuple key"}, default=str)
    with pytest.raises(TypeError) as theirs:
        json.dumps({(1, 2): "tuple key"}, default=str, separators=(",", ":"))
    assert str(mine.value) == str(theirs.value)


TEXTS = [
    '{"ops": [{"op": "facts.gather", "args": {"workdir": "~/w"}}], "env": {}}', " \t\n\r[1, 2.5, -3e2]\n ",
    '"\\u00fc\\ud83d\\ude00"', "1e400", "-Infinity", "NaN", "[Infinity]", "12345678901234567890", "true",
    "null", '{"a": 1, "a": 2}', '{"x": "\\n\\t\\"\\\\/"}', "[]", "{}", '"ü"',
]
BAD = ["", " ", "[1,]", "{'a': 1}", "[1] x", '"\x01"', "\ufeff[]", "[", "01", "nul", '{"a" 1}', "1 2", "[1e]"]


@pytest.mark.parametrize("text", TEXTS)
def test_loads_is_json_loads(text):
    mine, theirs = jsonio.loads(text), json.loads(text)
    assert json.dumps(mine) == json.dumps(theirs) and type(mine) is type(theirs)
    assert bundle_loads(text.encode()) == mine or (isinstance(mine, float) and math.isnan(mine))


@pytest.mark.parametrize("text", BAD)
def test_loads_fails_as_json_loads(text):
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    with pytest.raises(ValueError) as mine:
        jsonio.loads(text)
    assert type(mine.value) is type(theirs.value) and str(mine.value) == str(theirs.value)
    # the bootstrap parses bytes, as json.loads(bytes) does (which reads a UTF-8 BOM, for one)
    try:
        want = ("ok", json.loads(text.encode()))
    except ValueError as exc:
        want = ("error", str(exc))
    try:
        got = ("ok", bundle_loads(text.encode()))
    except ValueError as exc:
        got = ("error", str(exc))
    assert got == want


def bundle_loads(data: bytes):
    """The bootstrap's loads (the probe header's parser), run as the bootstrap defines it."""
    boot = bundle._BOOT
    head = boot[:boot.index('P="')]
    ns: dict = {}
    exec(compile(head.replace("T0=time.process_time()", "T0=0"), "<boot>", "exec"), ns)
    return ns["loads"](data)


# ------------------------------------------------------------------------------ facts without modules
def test_system_names_are_platform_and_socket_s():
    host, impl, names = facts.system_names()
    assert host == socket.gethostname()
    assert impl == platform.python_implementation()
    assert names == {"system": platform.system(), "release": platform.release(), "machine": platform.machine()}
    assert list(names) == ["system", "release", "machine"]


def test_disk_usage_is_shutil_s(tmp_path):
    for path in (tmp_path, "/", "/proc"):
        usage = shutil.disk_usage(path)
        assert facts.disk_usage(path) == (usage.free, usage.total) or path == tmp_path   # tmp can change
    with pytest.raises(OSError):
        facts.disk_usage(tmp_path / "absent")


@pytest.mark.parametrize("name", ["json", "os", "sys", "pytest", "yaml", "remote_ops", "no_such_module_xyz",
                                  "os.path", "json.decoder", "email.mime", "_json", "encodings"])
def test_find_spec_is_importlib_util_s(name):
    mine, theirs = dists.find_spec(name), importlib.util.find_spec(name)
    if theirs is None:
        assert mine is None
    else:
        assert (mine.name, mine.origin, mine.submodule_search_locations, type(mine.loader)) == \
               (theirs.name, theirs.origin, theirs.submodule_search_locations, type(theirs.loader))


def test_find_spec_of_a_module_only_on_a_fresh_path(tmp_path, monkeypatch):
    (tmp_path / "lean_fresh_pkg").mkdir()
    (tmp_path / "lean_fresh_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    mine, theirs = dists.find_spec("lean_fresh_pkg"), importlib.util.find_spec("lean_fresh_pkg")
    assert mine.origin == theirs.origin == str(tmp_path / "lean_fresh_pkg" / "__init__.py")


@pytest.mark.parametrize("name", ["vllm", "Vllm", "my-pkg", "my.pkg", "my__pkg", "a-_.b", "-x-", "...", "", "Zope.Interface"])
def test_norm_is_the_regex_s(name):
    assert dists._norm(name) == re.sub(r"[-_.]+", "_", name).lower()


# ------------------------------------------------------------------------------ gpu.which == shutil.which
def _exe(path: Path, mode=0o755):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def test_which_is_shutil_which(tmp_path, monkeypatch):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _exe(a / "tool", 0o644)             # not executable
    (b / "tool").mkdir(parents=True)    # a directory
    _exe(c / "tool")
    _exe(tmp_path / "rel" / "tool")
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "tool").symlink_to(c / "tool")
    monkeypatch.chdir(tmp_path / "rel")
    paths = [f"{a}:{b}:{c}", f"{a}:{tmp_path / 'link'}:{c}", "", ":", f"{a}::{c}", f"{c}:{c}", "/nonexistent",
             f"{a}:{b}", ".", f"{tmp_path}/rel/../c"]
    for path in paths:
        monkeypatch.setenv("PATH", path)
        for cmd in ("tool", "sh", "absent"):
            assert gpu.which(cmd) == shutil.which(cmd), (path, cmd)
    monkeypatch.delenv("PATH")
    assert gpu.which("sh") == shutil.which("sh")


# ------------------------------------------------------------------------------ what facts imports
def _boot_modules(tmp_path, ops, env):
    """Run the bootstrap (cache hit) with ``ops``; the set of modules loaded when it finished."""
    script = ("def _exit(rc):\n    import sys\n    sys.stderr.write('MODULES ' + ' '.join(sorted(sys.modules)))\n"
              "    sys.exit(rc)\n" + bundle._BOOT.replace("sys.exit(protocol.", "_exit(protocol."))
    assert "_exit(protocol." in script
    env = dict(env, **{bundle.CACHE_ENV: str(tmp_path / "cache")})
    for _ in range(2):   # fill, then hit
        proc = subprocess.run([sys.executable, "-c", script], input=bundle.encode_probe(ops, env) + bundle.agent_payload(),
                              capture_output=True, env=dict(os.environ, **env), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    last = json.loads(proc.stdout.splitlines()[-1])
    assert last["agent"]["cache"] == "hit" and all(r["ok"] for r in last["results"]), last
    return last, set(proc.stderr.decode().rsplit("MODULES ", 1)[1].split())


HEAVY = {"json", "re", "enum", "hashlib", "_hashlib", "subprocess", "socket", "platform", "shutil", "importlib.util",
         "signal", "secrets", "py_compile", "traceback", "importlib.machinery"}


def test_facts_on_a_bare_host_imports_none_of_the_heavy_modules(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {"PATH": str(bare), "REMOTE_OPS_STATE_DIR": str(tmp_path / "state")}
    last, modules = _boot_modules(tmp_path, [{"op": "facts.gather", "args": {"workdir": str(tmp_path)}}], env)
    result = last["results"][0]["result"]
    assert result["gpu"]["present"] is False and result["jobs"] == []
    assert result["hostname"] == socket.gethostname() and result["os"]["system"] == platform.system()
    # what the interpreter's own start imports (site, .pth files such as an editable install's finder)
    # is not the agent's doing
    start = subprocess.run([sys.executable, "-c", "import sys;print(' '.join(sys.modules))"], capture_output=True,
                           text=True, env=dict(os.environ, **env), cwd=tmp_path).stdout.split()
    assert not (modules - set(start)) & HEAVY, (modules - set(start)) & HEAVY


def test_facts_with_an_nvidia_smi_on_path_runs_it(tmp_path):
    fake = _exe(tmp_path / "bin" / "nvidia-smi")
    fake.write_text("#!/bin/sh\ncase \"$1\" in\n  --query-gpu*) echo '0, GPU-1, NVIDIA H200, 10, 143771, 0, 30, 70.5';;\n"
                    "  --version) echo 'DRIVER version : 570.1';;\nesac\n")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "REMOTE_OPS_STATE_DIR": str(tmp_path / "state")}
    last, modules = _boot_modules(tmp_path, [{"op": "facts.gather", "args": {"workdir": str(tmp_path)}}], env)
    gpu_ = last["results"][0]["result"]["gpu"]
    assert gpu_["present"] and gpu_["gpus"][0]["name"] == "NVIDIA H200" and gpu_["driver"] == "570.1"
    assert "subprocess" in modules


# ------------------------------------------------------------------------------ other interpreters
def _pythons():
    """One CPython of each minor 3.10-3.13 found on PATH or in pyenv (its real executable, not a shim)."""
    found = []
    for minor in (10, 11, 12, 13):
        pyenv = sorted(Path(os.path.expanduser("~/.pyenv/versions")).glob(f"3.{minor}.*/bin/python3"))
        for cand in [shutil.which(f"python3.{minor}")] + pyenv:
            if not cand:
                continue
            proc = subprocess.run([str(cand), "-c", "import sys;print(sys.executable, sys.version_info[1])"],
                                  capture_output=True, text=True)
            if proc.returncode == 0 and proc.stdout.split()[1:] == [str(minor)]:
                found.append(proc.stdout.split()[0])
                break
    return found


@pytest.mark.parametrize("python", _pythons() or [pytest.param(None, marks=pytest.mark.skip("no other CPython here"))])
def test_bootstrap_fill_hit_and_facts_on_other_pythons(tmp_path, python):
    env = {bundle.CACHE_ENV: str(tmp_path / "cache"), "REMOTE_OPS_STATE_DIR": str(tmp_path / "state"),
           "PATH": str(tmp_path)}
    ops = [{"op": "facts.gather", "args": {"workdir": str(tmp_path)}}, {"op": "ping.ping", "args": {"echo": "ü"}}]
    states = []
    for _ in range(2):
        proc = subprocess.run([python, "-c", bundle._BOOT], input=bundle.encode_probe(ops, env) + bundle.agent_payload(),
                              capture_output=True, env=dict(os.environ, **env), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        last = json.loads(proc.stdout.splitlines()[-1])
        assert [r["ok"] for r in last["results"]] == [True, True], last
        states.append(last["agent"]["cache"])
    assert states == ["filled", "hit"]
    want = subprocess.run([python, "-c", "import json,platform,socket;print(json.dumps([socket.gethostname(),"
                           "platform.python_implementation(),platform.system(),platform.release(),platform.machine()]))"],
                          capture_output=True, text=True).stdout
    got = last["results"][0]["result"]
    assert [got["hostname"], got["python"]["implementation"], got["os"]["system"], got["os"]["release"],
            got["os"]["machine"]] == json.loads(want)
    assert last["results"][1]["result"]["echo"] == "ü"
