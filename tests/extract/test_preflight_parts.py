"""extract's preflight, part by part (remote_ops/extract/preflight.py PARTS), on recorded agent answers: each
part asks for what it needs in the one round trip and turns the answers into problems (the last one decides)
and notes. The whole preflight over the real sshd is in extract/test_jobs.py, extract/test_ship.py and others."""

from __future__ import annotations

import dataclasses

import pytest

from remote_ops.extract import preflight as P
from remote_ops.extract.extract_spec import ExtractSpec, ServerSpec
from remote_ops.playbook.loader import loads

PLAYBOOK = """
name: pf
requires: {vllm: ">=0.17,<0.40"}
extract:
  command: [python, x.py, --output-dir, out]
  output_dir: /data/out
"""


class _Session:
    label = "h1"


def ok(result):
    return {"ok": True, "result": result}


def failed(kind, message, hint=None):
    return {"ok": False, "error": {"kind": kind, "message": message, "hint": hint}}


def spec(**kw) -> ExtractSpec:
    base = ExtractSpec(key="pf", command=["python", "x.py"], workdir="/w", output_dir="/data/out")
    return dataclasses.replace(base, **kw)


def ctx(sp=None, **kw) -> P.Context:
    return P.Context(_Session(), sp or spec(), loads(PLAYBOOK), **kw)


def read(part, c, raw, pf=None):
    pf = pf or P.Preflight()
    return part.read(c, pf, raw), pf


def test_the_registry_reads_in_order_and_every_part_has_a_name():
    names = [p.name for p in P.PARTS]
    assert len(set(names)) == len(names)
    assert names[0] == "probe" and names.index("imports") > names.index("dataset") and names[-1] == "coverage"


def test_running_job_of_the_same_share_is_attached_and_stops_the_preflight():
    c = ctx()
    raw = {"probe": ok({"job": {"state": "running", "job_id": "j1", "shard": None}})}
    assert P.read(c, raw).running["job_id"] == "j1"
    stop, pf = read(P.RunningJob(), c, raw)
    assert stop == P.STOP and pf.problems == []


def test_running_job_of_another_share_refuses_in_one_line():
    c = ctx(spec(shard=(1, 3)))
    stop, pf = read(P.RunningJob(), c, {"probe": ok({"job": {"state": "running", "job_id": "j9", "shard": [0, 3]}})})
    assert stop == P.STOP
    assert pf.problems == ["/data/out is being written by job j9 (shard 0/3); this launch is shard 1/3"]
    assert "one output directory holds one job" in pf.hint


def test_an_output_dir_held_by_another_job_refuses_with_its_line():
    held = {"line": "/data/out is held by job j2 on other-host", "hint": "stop it there"}
    stop, pf = read(P.RunningJob(), ctx(), {"probe": ok({"disk": {"held_by": held}})})
    assert stop == P.STOP and pf.problems == [held["line"]] and pf.hint == "stop it there"


def test_the_probe_asks_for_the_run_identity_and_the_disk_need():
    sp = spec(disk={"dataset": "d.jsonl", "model": "/m", "layer_ids": None}, expected_samples=10)
    (name, req), = P.RunningJob().ops(ctx(sp)).items()
    args = req[1]
    assert name == "probe" and args["need"]["max_samples"] == 10 and args["identity"]["flow"] == "generator"


def test_files_uploaded_are_notes_and_a_failed_upload_is_a_problem(tmp_path):
    from remote_ops.extract.extract_spec import ShippedFile
    f = ShippedFile(local=tmp_path / "x.py", name="x.py", data=b"print(1)\n", sha256="ab" * 32, mode=0o644)
    c = ctx(spec(files=[f]))
    assert set(P.Files().ops(c)) == {"files"}
    _, pf = read(P.Files(), c, {"files": ok({"files": [{"name": "x.py", "action": "written", "sha256": "ab" * 32,
                                                        "mode": "0600"}]})})
    assert pf.notes == [f"file x.py: written (sha256 abababababab, mode 0600) from laptop file {tmp_path / 'x.py'}"] \
        and not pf.problems
    _, pf = read(P.Files(), c, {"files": failed("write-failed", "disk full")})
    assert pf.problems == [f"cannot upload {tmp_path / 'x.py'}: disk full"]
    assert P.Files().ops(ctx()) == {}


@pytest.mark.parametrize("gpu,count,free,problem", [
    ({"present": False}, 1, True, "the job needs 1 GPU(s) but nvidia-smi is not on the host"),
    ({"present": True, "gpus": [{}]}, 2, True, "the job needs 2 GPU(s), the host has 1"),
    ({"present": True, "error": "NVML mismatch"}, 1, True, "GPUs: NVML mismatch"),
    ({"present": True, "gpus": [{}], "processes": [{"gpu_index": 0, "pid": 7, "name": "python",
                                                     "used_memory_mib": 900}]}, 1, True,
     "GPUs are not free: stop those processes (or set extract.gpus.free: false)"),
    ({"present": True, "gpus": [{}], "processes": [{"gpu_index": 0, "pid": 7}]}, 1, False, None),
    ({"present": True, "gpus": [{}, {}]}, 2, True, None),
])
def test_gpus(gpu, count, free, problem):
    pf = P.Preflight(gpu=gpu)
    P.Gpus().read(ctx(spec(gpu_count=count, gpus_free=free)), pf, {})
    assert (pf.problems[-1] if pf.problems else None) == problem


def test_disk_from_the_need_and_from_the_files_already_there():
    c = ctx(spec(expected_samples=10))
    pf = P.Preflight(disk={"need": {"fits": False, "line": "needs 9 GiB, 1 GiB free"}})
    P.Disk().read(c, pf, {})
    assert pf.problems == ["needs 9 GiB, 1 GiB free"]
    pf = P.Preflight(disk={"mean_sample_bytes": 1 << 30, "existing_samples": 4, "free_bytes": 2 << 30})
    P.Disk().read(c, pf, {})
    assert pf.problems == ["not enough disk at /data/out: 6 more samples need about 6.0 GiB, 2.0 GiB free"]
    pf = P.Preflight(disk={"mean_sample_bytes": 1 << 20, "existing_samples": 4, "free_bytes": 2 << 30})
    P.Disk().read(c, pf, {})
    assert not pf.problems and pf.notes[0].startswith("disk: 6 samples need")
    pf = P.Preflight(disk={"error": "ENOENT"})
    P.Disk().read(c, pf, {})
    assert pf.problems == ["cannot measure free disk at /data/out: ENOENT"]


def test_disk_refuses_a_share_recorded_for_another_assignment():
    pf = P.Preflight(disk={"shard": [0, 2]})
    P.Disk().read(ctx(spec(shard=(0, 3))), pf, {})
    assert len(pf.problems) == 1 and "0/2" in pf.problems[0]
    pf = P.Preflight(disk={"shard": [0, 2]})
    P.Disk().read(ctx(spec(shard=(0, 3)), overwrite=True), pf, {})
    assert not pf.problems


def test_identity_differs_refuses_unless_overwrite():
    differs = {"digest": "f" * 64, "state": "differs", "problem": True, "samples": 3,
               "differences": ["layer_ids [2,4,5,7] -> [1,3,5,7]"],
               "line": "/data/out holds 3 sample file(s) of another run: layer_ids [2,4,5,7] -> [1,3,5,7]"}
    c = ctx()
    c.probe = {"identity": differs}
    _, pf = read(P.Identity(), c, {})
    assert pf.problems == [differs["line"]] and pf.identity == differs
    c = ctx(overwrite=True)
    c.probe = {"identity": differs}
    _, pf = read(P.Identity(), c, {})
    assert not pf.problems and "will be moved into /data/out/.replaced-" in pf.notes[0]
    c = ctx()
    c.probe = {"identity": {"digest": "a" * 64, "state": "same", "samples": 3}}
    _, pf = read(P.Identity(), c, {})
    assert not pf.problems and "resuming" in pf.notes[0]


def test_port_of_the_server_must_be_free():
    server = ServerSpec(command=["vllm", "serve", "m"], port=8000)
    c = ctx(spec(server=server))
    c.probe = {"port": {"free": False, "error": "address in use"}}
    _, pf = read(P.Port(), c, {})
    assert pf.problems[0].startswith("port 8000 is not free on the host (address in use)")
    c.probe = {"port": {"free": True}}
    _, pf = read(P.Port(), c, {})
    assert not pf.problems and pf.server == {"port": {"free": True}}


def test_imports_failure_is_the_deciding_problem_with_its_exit_status():
    from remote_ops.errors import Exit
    c = ctx(spec(import_check=["speculators.data_generation"]))
    assert set(P.Imports().ops(c)) == {"imports"}
    _, pf = read(P.Imports(), c, {"imports": failed("import-failed", "cannot import speculators", "pip install it")})
    assert pf.problems == ["cannot import speculators"] and pf.hint == "pip install it"
    assert pf.exit_status == int(Exit.IMPORT) and pf.imports["ok"] is False
    _, pf = read(P.Imports(), c, {"imports": ok({"modules": ["speculators.data_generation"], "seconds": 1.5})})
    assert pf.notes == ["imports: speculators.data_generation import in 1.5s"] and not pf.problems


def test_requires_holds_a_server_flow_to_the_playbook_range():
    server = ServerSpec(command=["vllm", "serve", "m"], port=8000, import_check=["vllm"])
    c = ctx(spec(server=server, import_check=[]))
    raw = {"server_imports": ok({"versions": {"vllm": "0.16.0"}})}
    _, pf = read(P.Requires(), c, raw)
    assert pf.problems and pf.problems[0].startswith("requires: vllm 0.16.0")
    raw = {"server_imports": ok({"versions": {"vllm": "0.20.0"}})}
    _, pf = read(P.Requires(), c, raw)
    assert not pf.problems and pf.notes == ["requires: vllm 0.20.0 (import probes)"]


def test_coverage_refuses_a_host_outside_requires_with_the_patch_line():
    pf = P.Preflight(check={"versions": {"vllm": "0.50.0"}, "findings": []})
    P.Coverage().read(ctx(), pf, {})
    assert pf.problems and "0.50.0" in pf.problems[-1]
    pf = P.Preflight(check={"versions": {"vllm": "0.20.0"}, "findings": []})
    P.Coverage().read(ctx(), pf, {})
    assert not pf.problems


def test_call_sites_findings_then_the_hint_to_patch():
    c = ctx()
    c.playbook.check = {"targets": ["speculators.x"]}
    raw = {"check": ok({"findings": [{"path": "g.py", "line": 3, "message": "unexpected keyword"}],
                        "unknown": [], "drift": [], "baseline": {"unavailable": "offline"}})}
    _, pf = read(P.CallSites(), c, raw)
    assert pf.problems == ["check: g.py:3: unexpected keyword",
                           "the job would fail on these calls after loading the model: see them with remote-ops check HOST, "
                           "fix them with remote-ops patch HOST"]
    _, pf = read(P.CallSites(), c, {"check": failed("missing-target", "speculators is not installed")})
    assert pf.problems == ["check could not run: speculators is not installed"]
    _, pf = read(P.CallSites(), ctx(skip_check=True), {})
    assert pf.notes == ["playbook has no 'check' section: call sites not verified"]


def test_installed_ranges_name_the_version_that_breaks_the_import():
    pb = loads('requires:\n  vllm: ">=0.17"\n  transformers: {version: "<5.24", if_installed: true}\n'
               'extract:\n  command: [python, x.py]\n  output_dir: /data/out\n')
    c = P.Context(_Session(), spec(import_check=["speculators.data_generation.vllm_hidden_states_generator"]), pb)
    err = {"kind": "import-failed", "message": "cannot import speculators.data_generation.vllm_hidden_states_generator",
           "module": "speculators.data_generation.vllm_hidden_states_generator",
           "versions": {"speculators": "0.3.0", "transformers": "5.24.0", "vllm": "0.25.0"}}
    pf = P.read(c, {"probe": ok({}), "gpu": ok({"present": False}), "imports": {"ok": False, "error": err}},
                parts=(P.Imports(), P.InstalledRanges()))
    assert pf.problems[-1].startswith("requires: transformers 5.24.0 does not satisfy transformers<5.24 (required "
                                      "when installed): it breaks the import of "
                                      "speculators.data_generation.vllm_hidden_states_generator")
    assert pf.exit_status is not None          # still the import's refusal status
    # in range, or not installed: no problem
    _, pf = read(P.InstalledRanges(), c, {"imports": ok({"versions": {"transformers": "5.23.0"}})})
    assert not pf.problems and "transformers 5.23.0" in pf.notes[0]
    _, pf = read(P.InstalledRanges(), c, {"imports": ok({"versions": {"transformers": "not installed"}})})
    assert not pf.problems and not pf.notes


def test_server_model_checks_refuse_and_the_other_server_checks_are_notes():
    """ServerModel: the served model's checks of serverflow.check (a warning included) refuse the job;
    the server's other failed checks are notes (check --strict reports them); a failed op is a note."""
    server = ServerSpec(command=["python", "-m", "vllm.entrypoints.cli.main", "serve", "/m"], port=8000)
    c = ctx(spec(server=server))
    req = P.ServerModel().ops(c)["server_model"]
    assert req[0] == "serverflow.check" and req[1]["command"][-1] == "/m"
    assert P.ServerModel().ops(ctx(spec(server=server), skip_check=True)) == {}
    assert P.ServerModel().ops(ctx()) == {}          # no server: nothing asked
    checks = [{"id": "trust-remote-code", "what": "custom code", "ok": False, "detail": "auto_map",
               "where": "/m/config.json", "fix": "set the playbook var trust_remote_code: true",
               "severity": "warning"},
              {"id": "aux-layer-ids", "what": "ids", "ok": True, "detail": ""},
              {"id": "chunked-prefill", "what": "chunked prefill", "ok": False, "detail": "ValueError"},
              {"id": "flags", "what": "flags", "ok": None, "detail": "not decided"}]
    _, pf = read(P.ServerModel(), c, {"server_model": ok({"checks": checks})})
    assert pf.problems == ["server flow: /m/config.json: custom code: auto_map (fix: set the playbook var "
                           "trust_remote_code: true)"]
    assert pf.notes == ["server flow: chunked prefill: ValueError", "not checked: server flow: flags: not decided"]
    _, pf = read(P.ServerModel(), c, {"server_model": failed("missing-target", "vllm is not installed")})
    assert pf.notes == ["server-flow checks could not run: vllm is not installed"] and not pf.problems
