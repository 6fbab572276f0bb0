"""The dataset part of extract's preflight (the agent's ``dataset.check``, in the same round
trip as the other probes): a missing or unreadable dataset, a line the job would refuse, an empty
dataset refuse the launch with one line; fewer samples than ``max_samples`` is a note and lowers
the job's expected count to what the dataset holds.

Which file and how many samples are read from the job's own command line (``--dataset PATH``,
``--max-samples N``, as remote_ops/playbook/shipped/scripts/extract_hidden_states.py and the sandbox's stand-in take
them); a command without ``--dataset`` gets no dataset check.
"""

from __future__ import annotations

from typing import Any

from remote_ops.connect import agent_requests as rq

BUDGET_S = 2.0       # parse for at most this long, then count lines for at most as long again
FORMAT = ('one JSON object per line: {"input_ids": [ints]} or {"text": "..."}, optionally '
          '"loss_mask": [0/1 per token]')


def _flag(command: list[str], name: str) -> str | None:
    for i, word in enumerate(command):
        if word == name and i + 1 < len(command):
            return command[i + 1]
        if word.startswith(name + "="):
            return word[len(name) + 1:]
    return None


def dataset_args(command: list[str]) -> tuple[str, int | None] | None:
    """(the dataset path, max_samples or None) the job's command gives, or None (no ``--dataset``)."""
    path = _flag(command, "--dataset")
    if not path:
        return None
    raw = _flag(command, "--max-samples")
    try:
        limit = int(raw) if raw not in (None, "") else None
    except ValueError:
        limit = None
    return path, limit if limit is None or limit > 0 else None


def request(spec) -> rq.Request | None:
    args = dataset_args(spec.command)
    if args is None:
        return None
    return rq.dataset_check(path=args[0], workdir=spec.workdir, max_samples=args[1], budget=BUDGET_S)


def preflight(pf, res: dict, spec) -> dict[str, Any] | None:
    """The agent's answer into ``pf``'s problems and notes; returns the dataset record (with
    ``expected``: the samples the job will write, when known) or None when the check failed."""
    if not res.get("ok"):
        err = res.get("error") or {}
        pf.notes.append(f"dataset not checked: {err.get('message')}")
        return None
    d = dict(res["result"])
    if d.get("problem"):
        pf.problems.append(f"dataset {d['problem']}" if not d["problem"].startswith(("dataset ", "cannot read"))
                           else d["problem"])
        pf.hint = pf.hint or f"fix the dataset ({FORMAT}) or point the host's dataset var at another file"
        return d
    n, limit = d["samples"], d.get("max_samples")
    d["expected"] = min(n, limit) if limit and d["exact"] else (limit if limit else (n if d["exact"] else None))
    if limit and d["exact"] and n < limit:
        pf.notes.append(f"dataset: {n} samples, fewer than max_samples {limit}: the job will write {n} "
                        f"(expected count {n})")
    else:
        size = "at least " if not d["exact"] else ""
        pf.notes.append(f"dataset: {size}{n} samples, lines parsed as the job reads them: {d['parsed']}"
                        + (f" (max_samples {limit})" if limit else ""))
    return d
