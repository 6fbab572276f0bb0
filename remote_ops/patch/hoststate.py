"""The host state the controller last planned a patch for: per host and playbook, a small file next
to the plan cache, so that a repeated patch can send its apply in the same exec as its read.

What is remembered is what the read step returned when the plan changed something: the host's
Python version, the versions of the packages the playbook queries, and each target's resolved
path and sha256. ``patching.run_host`` builds the apply for that state from the plan cache and
sends it with the read, guarded by ``only_if`` (the agent compares all of it with its own state and
does nothing when anything differs). Nothing here is trusted beyond choosing what to try: a wrong,
stale or forged file makes the agent skip the apply (and the controller then plans from the read
as before); the plan's new bytes come from the plan cache, checked as always.

File: ``<plan cache>/<playbook fingerprint>/host-<host key>.state`` (the directory of that
playbook's plans: it changes with the playbook's edits and the code that computes plans), one JSON
object, 0600 in a 0700 directory, written atomically; one entry per file (host x playbook). Anything
that does not validate is ignored. ``REMOTE_OPS_PLAN_CACHE=off`` turns it off with the plan cache.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from remote_ops.cachedir import write_private
from remote_ops.patch import plancache

FORMAT = 2
_SHA = re.compile(r"[0-9a-f]{64}\Z")


_keys: dict[int, tuple[Any, str]] = {}   # id(host) -> (host, its key): asked a few times per host


def host_key(host) -> str:
    """Everything of the inventory entry that decides which machine, account, interpreter and
    state directory a patch reaches."""
    hit = _keys.get(id(host))
    if hit is not None and hit[0] is host:
        return hit[1]
    ident = [host.name, host.hostname, host.port, host.user, host.python, host.workdir,
             getattr(host, "connection", "ssh"), list(host.proxy_jump or ()),
             sorted((str(k), str(v)) for k, v in (host.env or {}).items())]
    key = hashlib.sha256(json.dumps(ident, default=str).encode()).hexdigest()
    if len(_keys) >= 1024:
        _keys.clear()
    _keys[id(host)] = (host, key)   # (the entry holds the host: its id is not reused meanwhile)
    return key


def _path(pb, host) -> Path | None:
    d = plancache.book_dir(pb)
    return None if d is None else d / f"host-{host_key(host)[:32]}.state"


def state_of(pb, raw: dict, plan=None) -> dict:
    """The part of a read result (``patching.read``) that a plan depends on; with the ``plan``, which
    edits applied to each target (``active``) and which were not for this host (``skipped``: the
    playbook's ``when:`` conditions, conditions.py), so a repeated patch selects the same."""
    out = {"python": list(raw.get("python") or [])[:3], "packages": dict(raw.get("packages") or {}),
           "targets": [{"label": p.label, "real": t["real"], "sha256": t["sha256"]}
                       for p, t in zip(pb.patches, raw["targets"])]}
    if plan is not None:
        out["active"] = [[r.edit_id for r in t.result.results] for t in plan.targets]
        out["skipped"] = [list(t.skipped) for t in plan.targets]
    return out


def same_state(pb, raw: dict, seen: dict) -> bool:
    """Whether a read result shows the remembered state, as ``only_if`` compares it (Python
    major.minor, exact package versions, every target's sha256)."""
    now = state_of(pb, raw)
    return (now["python"][:2] == list(seen["python"])[:2] and now["packages"] == seen["packages"]
            and [t["sha256"] for t in now["targets"]] == [t["sha256"] for t in seen["targets"]])


def _valid(entry: Any, pb, host, packages: list[str]) -> bool:
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("host") != host_key(host) \
            or entry.get("book") != plancache.book_fingerprint(pb):
        return False
    py = entry.get("python")
    if not isinstance(py, list) or len(py) < 2 or not all(type(x) is int for x in py):
        return False
    pk = entry.get("packages")
    if not isinstance(pk, dict) or sorted(pk) != sorted(packages) or \
            not all(v is None or isinstance(v, str) for v in pk.values()):
        return False
    ts = entry.get("targets")
    if not isinstance(ts, list) or len(ts) != len(pb.patches):
        return False
    for p, t in zip(pb.patches, ts):
        if not isinstance(t, dict) or t.get("label") != p.label or not isinstance(t.get("real"), str) \
                or not t["real"].startswith("/") or not isinstance(t.get("sha256"), str) or not _SHA.match(t["sha256"]):
            return False
    active, skipped = entry.get("active"), entry.get("skipped")
    if not isinstance(active, list) or len(active) != len(pb.patches) or not isinstance(skipped, list) \
            or len(skipped) != len(pb.patches):
        return False
    for p, ids, sk in zip(pb.patches, active, skipped):
        known = {e.id for e in p.edits}
        if not isinstance(ids, list) or not all(isinstance(i, str) and i in known for i in ids) \
                or not isinstance(sk, list) or not all(isinstance(x, dict) and x.get("edit") in known for x in sk):
            return False
    return True


def recall(pb, host, packages: list[str]) -> dict | None:
    """The state this host was in when a plan of this playbook last changed something on it (or
    None: never seen, cache off, unreadable or invalid file)."""
    path = _path(pb, host)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            entry = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    return entry if _valid(entry, pb, host, packages) else None


def remember(pb, host, raw: dict, seen: dict | None = None, plan=None) -> None:
    """Store the state of ``raw`` (a read result whose ``plan`` changed something) for this host;
    nothing is written when it is the state already remembered (``seen``)."""
    state = state_of(pb, raw, plan)
    if seen is not None and all(seen.get(k) == v for k, v in state.items()):
        return   # (a fleet's repeated patch: no write per host)
    path = _path(pb, host)
    if path is None:
        return
    write_private(path, dict(state, format=FORMAT, host=host_key(host),
                                       book=plancache.book_fingerprint(pb)))
