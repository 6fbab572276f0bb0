"""The server flow's prepared data in extract's preflight: the Arrow directory the client reads
(``--preprocessed-data``), its rows' lengths against the server's ``--max-model-len`` before any GPU
time, and the job's expected count (min of max_samples and its rows). Read on the host by the job's
interpreter (agent/outputs/prepared.py), in the shared probe's round trip (``jobs.probe``'s ``prepared``).
"""

from __future__ import annotations

from remote_ops.extract import flows
from remote_ops.extract.dataset import _flag


def _int(text) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except (TypeError, ValueError):
        return None


def max_model_len(spec) -> int | None:
    """The server's ``--max-model-len`` (None: not given, vLLM's default: the model's own length)."""
    return _int(_flag(spec.flow.model_command(spec), "--max-model-len"))


def max_samples(spec) -> int | None:
    n = _int(_flag(list(spec.command), "--max-samples"))
    return n if n and n > 0 else None


def request(spec) -> dict | None:
    """The probe's ``prepared`` argument for a server-flow job whose client names its data, else None."""
    if not flows.runs_part(spec, "prepared") or not _flag(list(spec.command), "--preprocessed-data"):
        return None
    return {"command": list(spec.command), "workdir": spec.workdir, "python": spec.job_python, "env": spec.env,
            "max_samples": max_samples(spec), "max_model_len": max_model_len(spec)}


def too_long(res: dict, limit: int, samples: int | None) -> tuple[str, str]:
    """(the refusal, its fix) for rows of ``limit`` tokens or more."""
    where = f"the first {res['checked']} rows" if samples and res["checked"] < res["rows"] else f"its {res['checked']} rows"
    rows = ", ".join(str(i) for i in res["indexes"]) + (" ..." if res["count"] > len(res["indexes"]) else "")
    line = (f"prepared data {res['path']}: {res['count']} of {where} have max_model_len ({limit}) tokens or more "
            f"(longest {res['longest']}; rows {rows}): the server would refuse them and the job would lose them")
    fix = (f"run speculators prepare-data again with --seq-length {limit - 1} (or less), or raise the server's "
           f"--max-model-len to {res['longest'] + 1} or more (the playbook var max_model_len)")
    return line, fix


def preflight(pf, res: dict | None, spec) -> None:
    """The probe's answer into ``pf``: a refusal for rows the server would refuse, notes, and
    ``pf.dataset`` (``expected``: what the job will write) when no other dataset check gave one."""
    if res is None:
        return
    if res.get("error"):
        pf.notes.append(f"prepared data not read: {res['error']} (row lengths not compared with max_model_len)")
        return
    limit, samples = max_model_len(spec), max_samples(spec)
    expected = min(samples, res["rows"]) if samples else res["rows"]
    if pf.dataset is None:
        pf.dataset = {"prepared": res["path"], "samples": res["rows"], "max_samples": samples, "exact": True,
                      "expected": expected, "tokens": res.get("tokens"), "longest": res.get("longest")}
    if limit is None:
        pf.notes.append(f"prepared data: {res['rows']} rows, the longest {res['longest']} tokens; the server's "
                        "max_model_len is the model's own (no --max-model-len): not compared")
    elif res["count"]:
        line, fix = too_long(res, limit, samples)
        pf.problems.append(line)
        pf.hint = fix
        return
    else:
        pf.notes.append(f"prepared data: {res['rows']} rows ({res['lengths_from']}), the longest of the "
                        f"{res['checked']} the job sends {res['longest']} tokens, under max_model_len {limit}")
    if samples and res["rows"] < samples:
        pf.notes.append(f"prepared data: {res['rows']} rows, fewer than max_samples {samples}: the job will write "
                        f"{res['rows']} (expected count {res['rows']})")


class PreparedData:
    """A preflight part (extract/preflight.py PARTS): reads the probe's ``prepared`` answer."""
    name = "prepared"

    def ops(self, c):
        return {}

    def read(self, c, pf, raw):
        preflight(pf, (c.probe or {}).get("prepared"), c.spec)
