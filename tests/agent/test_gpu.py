"""GPU parsing over real nvidia-smi outputs (fixtures/nvidia-smi), and query() with a stand-in binary."""

import os
import stat
import sys

import pytest

from remote_ops.agent import gpu
from tests.conftest import FIXTURES

FIX = FIXTURES / "nvidia-smi"
UUID = "GPU-47483a40-15b2-7836-a31a-7f523c61f5b0"


def fixture(name):
    p = FIX / name
    if not p.exists():
        pytest.skip(f"fixture {p} missing")
    return p.read_text()


def test_busy_gpu_and_process():
    gpus = gpu.parse_gpus(fixture("query-gpu_busy.csv"))
    assert gpus == [{"index": 0, "uuid": UUID, "name": "NVIDIA H200", "memory_used_mib": 1395,
                     "memory_total_mib": 143771, "utilization_pct": 100, "temperature_c": 58,
                     "power_w": 667.64}]
    procs = gpu.parse_apps(fixture("query-apps_busy.csv"), gpus)
    assert procs == [{"pid": 429, "name": "python3", "used_memory_mib": 1386, "gpu_uuid": UUID,
                      "gpu_index": 0}]


def test_idle_gpu_no_processes():
    gpus = gpu.parse_gpus(fixture("query-gpu_idle.csv"))
    assert gpus[0]["memory_used_mib"] == 0 and gpus[0]["utilization_pct"] == 0
    assert gpus[0]["power_w"] == pytest.approx(90.15)
    assert gpu.parse_apps(fixture("query-apps_idle.csv"), gpus) == []


def test_driver_version():
    assert gpu.parse_version(fixture("version.txt")) == "580.159.04"
    assert gpu.parse_version("") is None


@pytest.mark.parametrize("cell", ["[N/A]", "[Not Supported]", "N/A", ""])
def test_placeholders_become_none(cell):
    line = f"3, GPU-x, NVIDIA A100-SXM4-80GB, 10, 81920, {cell}, {cell}, {cell}\n"
    (g,) = gpu.parse_gpus(line)
    assert g["index"] == 3 and g["memory_total_mib"] == 81920
    assert g["utilization_pct"] is None and g["temperature_c"] is None and g["power_w"] is None
    (p,) = gpu.parse_apps(f"77, VLLM::EngineCore, {cell}, GPU-x\n", [g])
    assert p == {"pid": 77, "name": "VLLM::EngineCore", "used_memory_mib": None,
                 "gpu_uuid": "GPU-x", "gpu_index": 3}


def test_name_with_comma_keeps_columns():
    (g,) = gpu.parse_gpus("1, GPU-y, Odd, Name, 5, 10, 1, 30, 50.5\n")
    assert g["name"] == "Odd, Name" and g["memory_used_mib"] == 5 and g["power_w"] == 50.5


def _fake_smi(tmp_path, gpu_file, apps_file):
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"""#!{sys.executable}
import sys
a = " ".join(sys.argv[1:])
if "--query-gpu=" in a: sys.stdout.write(open({str(FIX / gpu_file)!r}).read())
elif "--query-compute-apps=" in a: sys.stdout.write(open({str(FIX / apps_file)!r}).read())
elif "--version" in a: sys.stdout.write(open({str(FIX / 'version.txt')!r}).read())
else: sys.exit(9)
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_query_with_stand_in_binary(tmp_path, monkeypatch):
    fixture("query-gpu_busy.csv")
    monkeypatch.setenv("REMOTE_OPS_NVIDIA_SMI", str(_fake_smi(tmp_path, "query-gpu_busy.csv",
                                                              "query-apps_busy.csv")))
    out = gpu.query()
    assert out["present"] and out["error"] is None and out["driver"] == "580.159.04"
    assert out["gpus"][0]["name"] == "NVIDIA H200"
    assert out["processes"][0]["pid"] == 429 and out["processes"][0]["gpu_index"] == 0


def test_query_absent(monkeypatch, tmp_path):
    monkeypatch.setenv("REMOTE_OPS_NVIDIA_SMI", str(tmp_path / "nope" / "nvidia-smi"))
    assert gpu.query() == {"present": False, "driver": None, "gpus": [], "processes": [], "error": None}


def test_query_failing_binary_reports_error(tmp_path, monkeypatch):
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n")
    exe.chmod(0o755)
    monkeypatch.setenv("REMOTE_OPS_NVIDIA_SMI", str(exe))
    out = gpu.query()
    assert out["present"] and out["gpus"] == []
    assert "could not communicate" in out["error"]
