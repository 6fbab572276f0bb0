"""extract's launch plan: what one host's job will write, how long its disk and its GPUs need for it,
and which of the two bounds it; and, for a running job, which bound it is at.

``build`` computes the plan from the preflight's agent answers (the disk need of agent/job/diskneed.py,
the disk's write speed of agent/job/diskspeed.py, the model's active parameters of
agent/job/activeparams.py, nvidia-smi's GPU names) and the GPU table ``gpu_peaks.json`` (dense BF16
peaks with their sources, and the efficiency points by model size with where they were measured). The disk figures are the
disk need's own (the refusal of a job that cannot fit uses the same numbers). The CLI renders the plan.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

PEAKS_FILE = Path(__file__).with_name("gpu_peaks.json")

# A running job is called disk-bound when it writes at DISK_BOUND_AT of its disk's measured speed or more.
# The write test is short (TEST_BYTES of agent/job/diskspeed.py, once) and the job's writes are spread
# over time with the page cache in between, so a job held back by its disk does not reach exactly 1.0 of
# the test's figure (nor stays below it); a job whose GPUs hold it back writes well below it. 0.8 leaves
# the test's own spread on the disk-bound side.
DISK_BOUND_AT = 0.8


@functools.lru_cache(maxsize=1)
def peaks() -> dict:
    return json.loads(PEAKS_FILE.read_text())


def gpu_peak(name: str | None) -> dict | None:
    """The table's entry for nvidia-smi's GPU ``name`` ({model, bf16_dense_tflops, source}), else None."""
    low = (name or "").lower()
    for entry in peaks()["gpus"]:
        if all(m.lower() in low for m in entry["match"]) and not any(x.lower() in low for x in entry["exclude"]):
            return entry
    return None


def efficiency_for(active_params: int) -> dict:
    """The table's efficiency point nearest ``active_params`` on a log scale ({active_params, factor,
    source, ...}): the share of the dense BF16 peak vLLM's prefill reached on a model of about that size
    (benchmarks/render/plan_efficiency.py writes the points; beyond the largest, the largest's)."""
    pts = peaks()["efficiency"]["points"]
    return min(pts, key=lambda p: abs(math.log(max(active_params, 1) / p["active_params"])))


@dataclass(frozen=True)
class Plan:
    samples: int | None = None
    tokens: int | None = None
    tokens_exact: bool | None = None
    tokens_how: str | None = None
    bytes: int | None = None               # to write (diskneed.need_bytes), the refusal's own figure
    bytes_per_token: float | None = None
    free_bytes: int | None = None
    fits: bool | None = None
    disk_path: str | None = None
    disk_bytes_per_s: int | None = None
    disk_speed: dict | None = None         # the measurement: method, bytes, seconds, mount, cached, age_s,
                                           # source (test | job: a finished job's own writes), job_id, test
    disk_hours: float | None = None
    disk_unknown: str | None = None
    gpus: list | None = None               # [{name, model, bf16_dense_tflops, source}] the job's GPUs
    active_params: int | None = None
    params_how: str | None = None
    flops_per_token: int | None = None
    efficiency: float | None = None
    efficiency_model: str | None = None    # the model the measured point was measured on (efficiency_for)
    efficiency_from: str | None = None     # that model and the runs the point comes from
    compute_tokens_per_s: float | None = None
    compute_hours: float | None = None
    compute_unknown: str | None = None
    bound: str = "unknown"                 # disk | compute | unknown
    cold_start: dict | None = None         # a previous job's here (extract/coldstart.py for_plan): seconds from
                                           # launch to the engine's readiness and to the first file, its job_id

    def to_json(self) -> dict:
        return asdict(self)


def build(need: dict | None, speed: dict | None, gpu: dict | None, gpu_count: int | None,
          output_dir: str | None) -> Plan | None:
    """The plan from the probe's ``need`` (diskneed.for_job), ``speed`` (diskspeed.for_dir) and ``gpu``
    (gpu.query); the job's GPUs are the first ``gpu_count`` of the host's, else all of them.
    None when there is no disk need to plan from (no extract.disk section)."""
    if not need or "need_bytes" not in need:
        return None
    counts = need.get("counts") or {}
    tokens, samples, nbytes = need["tokens"], need["samples"], need["need_bytes"]
    how = "exact (input_ids)" if counts.get("exact", not need.get("estimated")) else "estimated (" + ", ".join(
        x for x in (f"{counts.get('text_samples')} text samples at 4 UTF-8 bytes per token"
                    if counts.get("text_samples") else "",
                    f"{counts.get('extrapolated_samples')} samples past the count's time budget at the mean"
                    if counts.get("extrapolated_samples") else "") if x) + ")"
    f = dict(samples=samples, tokens=tokens, tokens_exact=not need.get("estimated"), tokens_how=how,
             bytes=nbytes, bytes_per_token=round(nbytes / tokens, 1) if tokens else None,
             free_bytes=need.get("free_bytes"), fits=need.get("fits"), disk_path=output_dir)
    if not speed or speed.get("error") or not speed.get("bytes_per_s"):
        f["disk_unknown"] = (speed or {}).get("error") or "the disk's write speed was not measured"
    else:
        f["disk_bytes_per_s"] = int(speed["bytes_per_s"])
        f["disk_speed"] = {k: speed.get(k) for k in ("method", "bytes", "seconds", "mount", "cached", "age_s",
                                                      "source", "job_id", "test")}
        f["disk_hours"] = nbytes / speed["bytes_per_s"] / 3600
    f.update(_compute(need.get("active") or {}, gpu or {}, gpu_count, tokens))
    disk_h, comp_h = f.get("disk_hours"), f.get("compute_hours")
    if disk_h is not None and comp_h is not None:
        f["bound"] = "disk" if disk_h >= comp_h else "compute"
    return Plan(**f)


def _compute(active: dict, gpu: dict, gpu_count: int | None, tokens: int) -> dict:
    """The compute bound's fields: FLOPs per token = 2 x active parameters, over the job's GPUs' dense
    BF16 peak times the table's efficiency for a model of that size (efficiency_for); ``compute_unknown``
    says what is missing."""
    out: dict = {}
    if active.get("active_params"):
        out.update(active_params=active["active_params"], params_how=active.get("how"),
                   flops_per_token=2 * active["active_params"])
    found = gpu.get("gpus") or []
    used = found[:gpu_count] if gpu_count else found
    if used:
        out["gpus"] = [{"name": g.get("name"), **({k: e[k] for k in ("model", "bf16_dense_tflops", "source")}
                                                    if (e := gpu_peak(g.get("name"))) else {})} for g in used]
    if "flops_per_token" not in out:
        out["compute_unknown"] = "model size unknown: " + (active.get("unknown") or "no config.json read")
    elif not used:
        out["compute_unknown"] = "no GPU on the host (nvidia-smi)" if not gpu.get("error") else f"GPUs: {gpu['error']}"
    elif any("bf16_dense_tflops" not in g for g in out["gpus"]):
        names = sorted({g["name"] for g in out["gpus"] if "bf16_dense_tflops" not in g})
        out["compute_unknown"] = f"no peak figure for {', '.join(map(str, names))} in {PEAKS_FILE.name}"
    else:
        point = efficiency_for(active["active_params"])
        eff = point["factor"]
        flops = sum(g["bf16_dense_tflops"] for g in out["gpus"]) * 1e12 * eff
        model = f"dense model of {point['active_params'] / 1e9:.2f}B parameters"
        out.update(efficiency=eff, efficiency_model=model,
                   efficiency_from=f"{model}, median of {point['runs']} run(s) on {point['gpu']}",
                   compute_tokens_per_s=round(flops / out["flops_per_token"], 1),
                   compute_hours=tokens * out["flops_per_token"] / flops / 3600)
    return out


def bound_of(st: dict) -> dict:
    """Which bound a running job is at, from its status record's (or snapshot's) ``write``: the job's
    write rate (its tokens/s x the plan's bytes per token) against its disk's cached write speed.
    {bound: disk | gpu | unknown, ratio, write_bytes_per_s, disk_bytes_per_s, why, missing: disk | plan | rate}."""
    w = st.get("write") or {}
    rate, disk = w.get("bytes_per_s"), (w.get("disk") or {}).get("bytes_per_s")
    out = {"bound": "unknown", "ratio": None, "write_bytes_per_s": rate, "disk_bytes_per_s": disk, "why": None,
           "missing": None}
    if not disk:
        out["why"], out["missing"] = "no measured disk speed for its output directory (extract measures it)", "disk"
    elif not w.get("bytes_per_token"):
        out["why"], out["missing"] = "the job was started without a plan (no extract.disk section)", "plan"
    elif not rate:
        out["why"], out["missing"] = "no tokens/s from the job yet", "rate"
    else:
        out["ratio"] = round(rate / disk, 3)
        out["bound"] = "disk" if out["ratio"] >= DISK_BOUND_AT else "gpu"
    return out
