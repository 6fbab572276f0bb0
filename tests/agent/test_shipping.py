"""The agent ships as a package with subpackages: one list of its sources (``bundle.agent_source_files``)
feeds the bundle, the drift memo's key and the guard tests, and an op whose code lives in nested modules
runs on the host in every shipping form: the full bundle, the host's compiled cache (filled, then hit)
and the resident agent of a kept connection. Real sshd."""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import pytest

from remote_ops.connect import bundle
from remote_ops.connect.transport import ConnectOptions, Session
from tests.connect.test_persist import _kept_host, muxdir, sshd_log  # noqa: F401

PY = sys.executable
AGENT = Path(bundle.__file__).resolve().parent.parent / "agent"
pytestmark = pytest.mark.timeout(300)

# an op served from nested modules: compat.inspect runs resolve/resolver.py, resolve/modules.py, ...
INSPECT = ("compat.inspect", {"symbols": ["json:dumps"]})


def shipped_sources() -> dict[str, str]:
    payload = bundle.agent_payload()
    n, _, rest = payload.partition(b"\n")
    return json.loads(zlib.decompress(rest[:int(n)]))


def test_every_agent_file_is_listed_once_with_its_package_key():
    files = bundle.agent_source_files()
    on_disk = sorted(p for p in AGENT.rglob("*.py") if "__pycache__" not in p.parts)
    assert sorted(files.values()) == on_disk
    nested = [k for k in files if k.count(".") >= 2]
    assert nested, "the agent has subpackages"
    for key, path in files.items():
        rel = path.relative_to(AGENT).with_suffix("")
        assert key == ".".join((bundle.AGENT_PACKAGE,) + rel.parts)
    # every subpackage ships its (empty) __init__, so the host can import its modules
    for pkg in {p.parent for p in on_disk if p.parent != AGENT}:
        assert (pkg / "__init__.py") in files.values()
        assert (pkg / "__init__.py").read_text().strip() == "", f"{pkg.name}/__init__.py stays empty"


def test_the_bundle_holds_exactly_the_listed_sources():
    listed = {k: p.read_text(encoding="utf-8") for k, p in bundle.agent_source_files().items()}
    assert shipped_sources() == listed


def test_a_new_module_in_a_subfolder_is_shipped(tmp_path):
    root = tmp_path / "agent"
    (root / "deep" / "deeper").mkdir(parents=True)
    for f in ("__init__.py", "deep/__init__.py", "deep/deeper/__init__.py", "deep/deeper/part.py", "top.py"):
        (root / f).write_text("")
    keys = set(bundle.agent_source_files(root))
    p = bundle.AGENT_PACKAGE
    assert keys == {f"{p}.__init__", f"{p}.top", f"{p}.deep.__init__", f"{p}.deep.deeper.__init__",
                    f"{p}.deep.deeper.part"}


def _inspect(sess: Session) -> dict:
    res = sess.call(*INSPECT)
    (sym,) = res["symbols"]
    assert sym["symbol"] == "json:dumps" and sym["kind"] == "function", sym
    assert "obj" in [p["name"] for p in sym["parameters"]]
    return res


def test_an_op_from_nested_modules_runs_from_the_bundle_and_the_host_cache(sshd, tmp_path):
    # the full form: no cache on the host, the bundle travels and runs from memory
    with Session(sshd.host(PY, env={bundle.CACHE_ENV: "off"}), ConnectOptions()) as sess:
        _inspect(sess)
        assert sess.stats.agent_cache == ["shipped"] and sess.stats.bytes_sent >= len(bundle.agent_payload())
    cache = tmp_path / "agent-cache"
    # first upload into the host's cache, then a hit: the nested modules come from the compiled entry
    for want in ("filled", "hit"):
        with Session(sshd.host(PY, env={bundle.CACHE_ENV: str(cache)}), ConnectOptions()) as sess:
            _inspect(sess)
            assert sess.stats.agent_cache == [want]
    (entry,) = [d for d in cache.iterdir() if not d.name.startswith(".")]
    assert json.loads((entry / "sources.json").read_bytes()) == shipped_sources()


def test_an_op_from_nested_modules_runs_in_the_resident_agent(sshd_log, muxdir):
    host = _kept_host(sshd_log, muxdir)
    for _ in range(2):
        with Session(host, ConnectOptions(persist=30)) as sess:
            _inspect(sess)
            assert sess.stats.agent_cache == ["resident"]
