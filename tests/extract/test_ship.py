"""extract's preflight ships the playbook's files into the workdir and probes the job's imports,
over a real sshd, in the same round trip as the rest of the preflight."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from remote_ops.extract import jobs

from remote_ops.playbook import loader as playbook
from remote_ops.connect.transport import ConnectOptions, Session
from tests.conftest import standin_extract, write_playbook

pytestmark = pytest.mark.timeout(180)


# A hand-made module that fails the way speculators 0.3.0 fails under transformers 5.x: a pydantic
# model whose annotation names torch, which its module never imports.
BROKEN = '''
from pydantic import BaseModel


class GeneratorConfig(BaseModel):
    dtype: "torch.dtype"


GeneratorConfig.model_rebuild()
'''


class Host:
    def __init__(self, tmp_path, sshd, *, files=None, import_check=None, extra=None):
        self.tmp = tmp_path
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.local = tmp_path / "local"
        (self.local / "scripts").mkdir(parents=True)
        entry = sshd.host_entry(sys.executable, env={"REMOTE_OPS_STATE_DIR": str(self.state)},
                                workdir=str(self.work))
        self.inventory = tmp_path / "inventory.yaml"
        self.inventory.write_text(yaml.safe_dump({"hosts": {"testhost": entry}}))
        ex = standin_extract("--max-samples", "2", output_dir="out")
        if files is not None:
            ex["files"] = files
        if import_check is not None:
            ex["import_check"] = import_check
        ex.update(extra or {})
        self.playbook = write_playbook(self.local / "pb.yaml", "ship", ex)

    def argv(self, *args):
        return ["-i", str(self.inventory)] + list(args) + ["--playbook", str(self.playbook)]

    def spec(self):
        from remote_ops.connect import inventory
        host = inventory.load(str(self.inventory)).hosts["testhost"]
        pb = playbook.load(self.playbook)
        return host, pb, jobs.parse_spec(pb, host)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_upload_first_unchanged_changed(tmp_path, sshd):
    h = Host(tmp_path, sshd, files={"scripts/job.py": "job.py", "scripts/lib.py": "sub/lib.py"})
    (h.local / "scripts" / "job.py").write_text("print('v1')\n")
    (h.local / "scripts" / "lib.py").write_text("X = 1\n")
    host, pb, spec = h.spec()
    with Session(host, ConnectOptions()).open() as sess:
        pf = jobs.preflight(sess, spec, pb, dry_run=True)          # dry run: nothing written
        assert [f["action"] for f in pf.files] == ["would-write", "would-write"]
        assert not (h.work / "job.py").exists()
        before = sess.stats.execs
        pf = jobs.preflight(sess, spec, pb)
        assert sess.stats.execs == before + 1                      # the whole preflight: one exec
        assert [f["action"] for f in pf.files] == ["written", "written"]
        assert (h.work / "job.py").read_text() == "print('v1')\n"
        assert (h.work / "sub" / "lib.py").read_text() == "X = 1\n"
        assert pf.files[0]["sha256"] == _sha(h.local / "scripts" / "job.py")
        ino = (h.work / "job.py").stat().st_ino
        mtime = (h.work / "job.py").stat().st_mtime_ns

        pf = jobs.preflight(sess, spec, pb)                        # unchanged: not rewritten
        assert [f["action"] for f in pf.files] == ["unchanged", "unchanged"]
        assert (h.work / "job.py").stat().st_ino == ino
        assert (h.work / "job.py").stat().st_mtime_ns == mtime

        (h.local / "scripts" / "job.py").write_text("print('v2')\n")   # changed: atomic replace
        host, pb, spec = h.spec()
        pf = jobs.preflight(sess, spec, pb)
        assert [f["action"] for f in pf.files] == ["written", "unchanged"]
        assert (h.work / "job.py").read_text() == "print('v2')\n"
        assert (h.work / "job.py").stat().st_ino != ino           # a new file renamed over the old
        assert not [p for p in h.work.iterdir() if p.name.endswith(".tmp")]


def test_upload_refuses_a_name_outside_the_workdir(tmp_path, sshd, cli):
    h = Host(tmp_path, sshd, files={"scripts/job.py": "../escape.py"})
    (h.local / "scripts" / "job.py").write_text("pass\n")
    status, out, err = cli(*h.argv("extract", "testhost", "--dry-run"))
    assert status == 2 and "pb.yaml:" in err and "inside the workdir" in err
    h2 = Host(tmp_path / "b" if (tmp_path / "b").mkdir() is None else None, sshd,
              files={"scripts/missing.py": "job.py"})
    status, out, err = cli(*h2.argv("extract", "testhost", "--dry-run"))
    assert status == 2 and "pb.yaml:" in err and "cannot read" in err and "missing.py" in err


def test_import_probe_failure_refuses_with_versions_and_its_own_exit_status(tmp_path, sshd, cli):
    pytest.importorskip("pydantic")
    h = Host(tmp_path, sshd, files={"scripts/broken_generator.py": "broken_generator.py"},
             import_check=["json", "broken_generator"])
    (h.local / "scripts" / "broken_generator.py").write_text(BROKEN)
    status, out, err = cli(*h.argv("extract", "testhost"))
    from importlib.metadata import version
    assert status == 9, err
    line = next(l for l in err.splitlines() if l.startswith("remote-ops:"))
    assert "import broken_generator failed: PydanticUndefinedAnnotation: name 'torch' is not defined" in line
    assert f"pydantic {version('pydantic')}" in line                # the package in the traceback
    assert "fix the packages of" in line
    assert not (h.state / "jobs").exists() or not [p for p in (h.state / "jobs").iterdir() if p.is_dir()]
    s, out, err = cli(*h.argv("extract", "testhost", "--json"))
    doc = json.loads(out)
    assert s == 9 and doc["error"] == "RefusedError" and doc["exit_status"] == 9 and doc["host"] == "testhost"
    assert doc["preflight"]["imports"]["module"] == "broken_generator"
    assert doc["preflight"]["imports"]["versions"]["pydantic"] == version("pydantic")


def test_import_probe_success_then_launch_and_env_reaches_it(tmp_path, sshd, cli):
    # the probe runs with the job's env: the module imports only when that variable is set
    h = Host(tmp_path, sshd, files={"scripts/needs_env.py": "needs_env.py"}, import_check=["needs_env", "torch"],
             extra={"env": {"RO_PROBE_FLAG": "yes"}})
    (h.local / "scripts" / "needs_env.py").write_text(
        "import os\nassert os.environ.get('RO_PROBE_FLAG') == 'yes', 'job env missing'\n")
    status, out, err = cli(*h.argv("extract", "testhost", "--dry-run"))   # not shipped yet: not importable
    assert status == 9 and "import needs_env failed: ModuleNotFoundError" in err
    status, out, err = cli(*h.argv("extract", "testhost", "--json"))   # shipped, then probed, then started
    doc = json.loads(out)
    assert status == 0, err
    assert doc["job"]["state"] in ("starting", "running", "succeeded")
    assert doc["preflight"]["imports"]["modules"] == ["needs_env", "torch"]
    import torch
    assert doc["preflight"]["imports"]["versions"]["torch"] == torch.__version__.split("+")[0] or \
        doc["preflight"]["imports"]["versions"]["torch"] == torch.__version__
    h2 = Host(tmp_path / "b" if (tmp_path / "b").mkdir() is None else None, sshd,
              files={"scripts/needs_env.py": "needs_env.py"}, import_check=["needs_env"])
    (h2.local / "scripts" / "needs_env.py").write_text(
        "import os\nassert os.environ.get('RO_PROBE_FLAG') == 'yes', 'job env missing'\n")
    (h2.work / "needs_env.py").write_text((h2.local / "scripts" / "needs_env.py").read_text())
    status, out, err = cli(*h2.argv("extract", "testhost", "--dry-run"))
    assert status == 9 and "import needs_env failed: AssertionError: job env missing" in err


def test_import_probe_names_a_missing_package(tmp_path, sshd, cli):
    h = Host(tmp_path, sshd, import_check=["json", "ro_no_such_package_xyz.sub"])
    status, out, err = cli(*h.argv("extract", "testhost", "--dry-run"))
    assert status == 9
    assert ("import ro_no_such_package_xyz.sub failed: ModuleNotFoundError: No module named "
            "'ro_no_such_package_xyz' (ro_no_such_package_xyz not installed)") in " ".join(err.split())


def test_import_probe_is_time_boxed(tmp_path, sshd, cli):
    h = Host(tmp_path, sshd, files={"scripts/slow.py": "slow.py"}, import_check=["slow"],
             extra={"import_check_timeout_seconds": 1})
    (h.local / "scripts" / "slow.py").write_text("import time\ntime.sleep(60)\n")
    (h.work / "slow.py").write_text("import time\ntime.sleep(60)\n")
    status, out, err = cli(*h.argv("extract", "testhost", "--dry-run"))
    assert status == 9 and "import slow did not finish within 1 s" in err
    # the probe's process is gone (killed with its session)
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            assert b"@@remote-ops-probe@@" not in cmd or b"slow" not in cmd


def test_import_check_schema_errors(tmp_path, sshd, cli):
    h = Host(tmp_path, sshd, import_check=["not a module"])
    status, out, err = cli(*h.argv("extract", "testhost", "--dry-run"))
    assert status == 2 and "pb.yaml:" in err and "import_check must be a list of module names" in err


def _dist(root: Path, name: str, version: str, requires: list[str], source: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(source)
    info = root / f"{name}-{version}.dist-info"
    info.mkdir()
    meta = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"] + \
        [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    (info / "top_level.txt").write_text(name + "\n")


def test_import_probe_names_the_versions_outside_site_packages(tmp_path, sshd, cli):
    """Packages on a PYTHONPATH folder (not named site-packages) and a requirement that the
    failing package loaded but no traceback frame passes through are both named, with versions:
    the shape of speculators 0.3.0 failing under transformers 5.x."""
    pytest.importorskip("pydantic")
    libs = tmp_path / "libs"
    _dist(libs, "fakeconfigs", "5.17.0", [], "TORCH_DTYPE_ANNOTATION = 'torch.dtype'\n")
    _dist(libs, "fakespec", "0.3.0", ["fakeconfigs>=5", "pydantic>=2", "notinstalled; extra == 'dev'"],
          "import fakeconfigs\n" + BROKEN)
    h = Host(tmp_path, sshd, import_check=["fakespec"], extra={"env": {"PYTHONPATH": str(libs)}})
    status, out, err = cli(*h.argv("extract", "testhost", "--json"))
    assert status == 9, err
    doc = json.loads(out)
    versions = doc["preflight"]["imports"]["versions"]
    from importlib.metadata import version
    assert versions["fakespec"] == "0.3.0" and versions["fakeconfigs"] == "5.17.0"
    assert versions["pydantic"] == version("pydantic") and "notinstalled" not in versions
    assert "fakeconfigs 5.17.0" in doc["message"]


def _find_key(doc, key):
    """The first value of ``key`` anywhere in a JSON document (a host's record sits under its name)."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        doc = list(doc.values())
    for v in doc if isinstance(doc, list) else []:
        got = _find_key(v, key)
        if got is not None:
            return got
    return None


def _mode(path: Path) -> int:
    return os.stat(path, follow_symlinks=False).st_mode & 0o7777


def test_laptop_files_keep_their_mode_capped_at_0700_and_are_listed_by_full_path(tmp_path, sshd, cli):
    """A key file stays 0600 on the host (it used to land 0644), a script 0644 here is 0600 there, an
    executable stays its owner's executable (0700), a folder made for a file is 0700; the dry run and
    the launch name every laptop file the playbook reads, by full path, flagging any outside its folder."""
    home = tmp_path / "home" / ".ssh"
    home.mkdir(parents=True)
    key = home / "id_test"
    key.write_text("PRIVATE KEY BYTES\n")
    key.chmod(0o600)
    token = tmp_path / "home" / "token"
    token.write_text("tok-SECRET-value\n")
    h = Host(tmp_path, sshd, files={str(key): "k", "scripts/job.py": "job.py", "scripts/run.sh": "bin/run.sh",
                                    "scripts/link.py": "link.py"},
             extra={"secrets": {"TOKEN": {"from_file": str(token)}}})
    (h.local / "scripts" / "job.py").write_text("print('job')\n")
    (h.local / "scripts" / "job.py").chmod(0o644)
    (h.local / "scripts" / "run.sh").write_text("#!/bin/sh\n")
    (h.local / "scripts" / "run.sh").chmod(0o755)
    (h.local / "scripts" / "link.py").symlink_to(key)          # a link in the playbook's folder, to the key

    status, out, err = cli(*h.argv("extract", "testhost", "--dry-run"))
    assert status == 0, err
    flat = " ".join(out.split())                               # rich may wrap a long note
    outside = f"(outside the playbook's folder {h.local.resolve()})"
    assert f"file k: would-write (sha256 {_sha(key)[:12]}, mode 0600) from laptop file {key.resolve()} {outside}" in flat
    assert f"file link.py: would-write (sha256 {_sha(key)[:12]}, mode 0600) from laptop file {key.resolve()} {outside}" in flat
    assert f"file job.py: would-write" in flat and f"mode 0600) from laptop file {h.local.resolve()}/scripts/job.py" in flat
    assert f"file bin/run.sh: would-write" in flat and "mode 0700" in flat
    assert f"secret TOKEN: read from laptop file {token.resolve()} {outside}" in flat
    assert "tok-SECRET-value" not in out + err
    assert not (h.work / "k").exists()

    status, out, err = cli(*h.argv("extract", "testhost", "--json"))
    assert status == 0, err
    assert "tok-SECRET-value" not in out + err
    shipped = {f["name"]: f for f in _find_key(json.loads(out), "preflight")["files"]}
    assert shipped["k"]["local"] == str(key.resolve()) and shipped["k"]["mode"] == "0600"
    assert shipped["k"]["action"] == "written" and shipped["bin/run.sh"]["mode"] == "0700"
    assert _mode(h.work / "k") == 0o600 and (h.work / "k").read_text() == "PRIVATE KEY BYTES\n"
    assert _mode(h.work / "link.py") == 0o600 and not (h.work / "link.py").is_symlink()
    assert _mode(h.work / "job.py") == 0o600
    assert _mode(h.work / "bin" / "run.sh") == 0o700 and _mode(h.work / "bin") == 0o700


def test_an_unchanged_file_left_wider_is_brought_to_the_shipped_mode_and_a_link_is_replaced(tmp_path, sshd):
    h = Host(tmp_path, sshd, files={"scripts/job.py": "job.py", "scripts/cfg.json": "cfg.json"})
    (h.local / "scripts" / "job.py").write_text("print('job')\n")
    (h.local / "scripts" / "cfg.json").write_text("{}\n")
    (h.work / "job.py").write_text("print('job')\n")           # same bytes, 0644 from an older remote-ops
    (h.work / "job.py").chmod(0o644)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}\n")
    elsewhere.chmod(0o644)
    (h.work / "cfg.json").symlink_to(elsewhere)                # same bytes, behind a link
    host, pb, spec = h.spec()
    with Session(host, ConnectOptions()).open() as sess:
        pf = jobs.preflight(sess, spec, pb, dry_run=True)
        assert [f["action"] for f in pf.files] == ["would-chmod", "would-write"]
        assert _mode(h.work / "job.py") == 0o644
        pf = jobs.preflight(sess, spec, pb)
        assert [f["action"] for f in pf.files] == ["chmod", "written"]
        pf = jobs.preflight(sess, spec, pb)
        assert [f["action"] for f in pf.files] == ["unchanged", "unchanged"]
    assert _mode(h.work / "job.py") == 0o600
    assert not (h.work / "cfg.json").is_symlink() and _mode(h.work / "cfg.json") == 0o600
    assert _mode(elsewhere) == 0o644                           # the link's target untouched
