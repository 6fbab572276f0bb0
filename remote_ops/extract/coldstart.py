"""A job's cold start in words: seconds from its launch to the engine's readiness and to its first file,
as the host measured them (agent/job/coldstart.py), for ``status`` and the launch plan."""

from __future__ import annotations

from remote_ops.units import fmt_duration


def cold_start_text(cs: dict | None, lead: str = "cold start: ") -> str:
    """One line from a status record's ``cold_start``, "" when nothing is measured yet."""
    cs = cs or {}
    parts = []
    if cs.get("ready_after_s") is not None:
        parts.append(f"engine ready {fmt_duration(cs['ready_after_s'])} after launch ({cs.get('ready_from')})")
    if cs.get("first_file_after_s") is not None:
        parts.append(f"first file {fmt_duration(cs['first_file_after_s'])} after launch"
                     + (f", {fmt_duration(cs['first_file_after_ready_s'])} after ready"
                        if cs.get("first_file_after_ready_s") is not None else ""))
    return lead + "; ".join(parts) if parts else ""


def for_plan(job: dict | None) -> dict | None:
    """The cold start a previous job of this playbook and output on the host measured (the probe's
    ``job``), with that job's id, for the launch plan; None when it measured none."""
    cs = (job or {}).get("cold_start") or {}
    if cs.get("ready_after_s") is None and cs.get("first_file_after_s") is None:
        return None
    return {**cs, "job_id": (job or {}).get("job_id")}


def plan_text(cs: dict | None) -> str:
    """The plan's part: "" when no previous job measured a cold start."""
    if not cs:
        return ""
    return cold_start_text(cs, f"cold start of job {cs.get('job_id')} here: ")
