"""A job's cold start: seconds from its launch to the engine's readiness and to its first output file.

Readiness, by flow: the server flow's server answering its health check (``server.json`` healthy_at,
which the supervisor records); the 0.3.0 flow's generator up, which the shipped script marks by writing
``data_config.json`` right after its "generator ready" line (scripts/extract_hidden_states.py,
``_generate``). The first file: the oldest sample file (outputs/layout.py names) written since the launch.
Once both are known they are kept in the job's directory (``coldstart.json``), so that a later status does
not list the output again. Stdlib only.
"""

import os

from . import jobfiles as sup

CACHE = "coldstart.json"


def measure(jobdir, job, run, dirs):
    """{ready_after_s, ready_from, first_file_after_s, first_file_after_ready_s} of a job, seconds from its
    launch (job.json created_at, else run.json started_at); a figure not known yet is None. None for a job
    that never started."""
    launched = job.get("created_at") or run.get("started_at")
    started = run.get("started_at")
    if not launched or not started:
        return None
    cached = sup.read_json(os.path.join(jobdir, CACHE))
    if isinstance(cached, dict) and cached.get("launched") == launched and isinstance(cached.get("cold_start"), dict):
        return cached["cold_start"]
    ready_at, ready_from = _ready(jobdir, dirs, started)
    first_at = first_file_at(dirs, job.get("layout"), started)
    out = {"ready_after_s": _after(ready_at, launched), "ready_from": ready_from,
           "first_file_after_s": _after(first_at, launched),
           "first_file_after_ready_s": _after(first_at, ready_at) if ready_at else None}
    if ready_at is not None and first_at is not None:
        try:
            sup.write_json(os.path.join(jobdir, CACHE), {"launched": launched, "cold_start": out})
        except OSError:
            pass      # measured again by the next status
    return out


def _after(t, since):
    return round(max(0.0, t - since), 1) if t is not None and since is not None else None


def _ready(jobdir, dirs, started):
    """(when the engine was ready, how that is known), or (None, None) while it is not (yet)."""
    srv = sup.read_json(os.path.join(jobdir, "server.json"))
    if isinstance(srv, dict):
        at = srv.get("healthy_at")
        return (at, "the server's health check") if isinstance(at, (int, float)) else (None, None)
    for d in dirs[:1]:
        try:
            at = os.stat(os.path.join(d, "data_config.json")).st_mtime
        except OSError:
            continue
        if at >= started:     # this job's (an earlier run's is older than its start)
            return at, "data_config.json, written once the generator is up"
    return None, None


def first_file_at(dirs, layout, since):
    """The modification time of the oldest sample file in ``dirs`` written at or after ``since``, or None."""
    from ..outputs import layout as layout_mod
    first = None
    for d in dirs:
        try:
            with os.scandir(d) as it:
                for entry in it:
                    if layout_mod.index_of(entry.name, layout) is None:
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_mtime >= since and (first is None or st.st_mtime < first):
                        first = st.st_mtime
        except OSError:
            continue
    return first
