"""The patch operation: read (1 round trip) -> compute + validate locally -> apply (1 round trip).

A repeated patch (no prompt, not a dry run) of a host in the state it was last planned for
(hoststate.py) is one round trip: the apply built from the cached plan travels with the read,
guarded by ``only_if``; when the host differs the agent skips it and the steps below run as before.

- ``read``: one agent request returning facts (python version, package versions), every target's
  bytes/sha256/mode/owner and, when the playbook has a ``check`` section, the check result.
- ``compute``: pure; applies the edits, checks ``requires``, validates (syntax for the host's Python,
  undefined names introduced by edits). No change -> "no changes" and no second round trip.
- ``apply``: one agent request running the whole transaction (lock, recovery, re-check of the new text
  with ``compat.check`` + ``override_sources`` before anything changes, CAS, backups, atomic replace,
  bytecode invalidation, journal, optional import check with automatic rollback).
"""

from __future__ import annotations

import base64
import getpass
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from remote_ops import interrupts
from remote_ops.connect import agent_requests as rq
from remote_ops.playbook import edits as edits_mod
from remote_ops.patch import plancache
from remote_ops.errors import ConfigError, RefusedError, RemoteOpsError, agent_error
from remote_ops.playbook.loader import Playbook
from remote_ops.records import HostRecord, optional


def who() -> str:
    """``user@host`` of this controller, for the journal (looked up once per process: without
    USER/LOGNAME set, ``getuser`` reads the password database, and a fleet asks once per host)."""
    global _who
    if _who is None:
        try:
            user = getpass.getuser()
        except Exception:  # no login name in a container: the uid still identifies the controller
            import os
            user = f"uid{os.getuid()}"
        _who = f"{user}@{socket.gethostname()}"
    return _who


_who: str | None = None


def unwrap(res: dict, host: str, what: str) -> Any:
    if res.get("ok"):
        return res.get("result")
    raise agent_error(res.get("error") or {}, host, what)


@dataclass
class TargetPlan:
    label: str
    module: str | None
    path: str
    real: str
    is_link: bool
    sha256: str
    mode: int
    encoding: str
    result: edits_mod.FileResult
    new_bytes: bytes
    plan_source: str = "computed"     # "cached": plancache had it (no libcst, no validation)
    skipped: list = field(default_factory=list)   # edits not for this host: {"edit", "why", "when"}

    @property
    def changed(self) -> bool:
        return self.result.changed

    def diff(self) -> str:
        return self.result.diff(self.real)


@dataclass
class PatchPlan:
    host: str
    playbook: Playbook
    python: list[int]
    packages: dict[str, str | None]
    targets: list[TargetPlan]
    recovered: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)    # what local validation could not check

    @property
    def changed(self) -> bool:
        return any(t.changed for t in self.targets)

    def diff(self) -> str:
        return "".join(t.diff() for t in self.targets if t.changed)

    def edit_states(self) -> list[dict]:
        """Every edit of the playbook in its order: ``pending`` (applies now), ``applied`` (already in
        place) or ``not-applicable`` (its ``when`` does not hold here; ``why`` says what)."""
        out = []
        for p, t in zip(self.playbook.patches, self.targets):
            states = {r.edit_id: r for r in t.result.results}
            skipped = {s["edit"]: s for s in t.skipped}
            for e in p.edits:
                if e.id in states:
                    out.append({"target": t.label, "edit": e.id, "state": states[e.id].state,
                                "lines": states[e.id].sites})
                elif e.id in skipped:
                    out.append({"target": t.label, "edit": e.id, "state": "not-applicable", "lines": [],
                                "why": skipped[e.id]["why"], "when": skipped[e.id]["when"]})
        return out

    @property
    def skipped(self) -> list[dict]:
        return [dict(s, target=t.label) for t in self.targets for s in t.skipped]

    def pending_edits(self) -> list:
        """(target, edit) of every edit this plan applies now."""
        out = []
        for t in self.targets:
            pending = {r.edit_id for r in t.result.results if r.state == "pending"}
            out += [(t, e) for e in _edits_of(self.playbook, t.label) if e.id in pending]
        return out

    def verify_request(self, allow_findings: bool = False) -> tuple[dict | None, str | None]:
        """The agent's verification arguments, or (None, why nothing can be verified)."""
        pb = self.playbook
        changed = [t for t in self.targets if t.changed]
        if not changed:
            return None, "nothing to change (every edit is already applied)"
        if not pb.check:
            return None, (f"the playbook has no check: section ({pb.path}), so the patched modules are "
                          "not re-checked")
        unnamed = [t.label for t in changed if not t.module]
        if unnamed:
            return None, (f"{', '.join(unnamed)} is named by path, not module, and the check analyses "
                          "modules; name it by module to re-check it")
        vargs = dict(check_args(pb))
        vargs["targets"] = sorted({t.module for t in changed})
        fixes = [dict(f, edit=e.id, where=f"{pb.path}:{f.get('line') or e.line}")
                 for _t, e in self.pending_edits() for f in e.fixes]
        return {"args": vargs, "fixes": fixes, "allow_findings": bool(allow_findings)}, None


def _edits_of(pb: Playbook, label: str) -> list:
    for p in pb.patches:
        if p.label == label:
            return p.edits
    return []


def packages_to_query(pb: Playbook) -> list[str]:
    names = list(pb.requires)
    for n in (pb.check or {}).get("against", []):
        if n not in names:
            names.append(n)
    for p in pb.patches:
        if p.module and p.module.split(".")[0] not in names:
            names.append(p.module.split(".")[0])
    from remote_ops.playbook import conditions
    for n in conditions.packages(pb):
        if n not in names:
            names.append(n)
    return names


def present_request(pb: Playbook) -> dict | None:
    """``patching.read``'s ``present``: the fixes of every edit with ``when: {finding: present}``
    (None when no edit has one, or the playbook has no check: section to check them with)."""
    from remote_ops.playbook import conditions

    edits = [e for p in pb.patches for e in conditions.finding_edits(p.edits)]
    if not edits or not pb.check:
        return None
    targets = sorted({p.module for p in pb.patches if p.module and conditions.finding_edits(p.edits)})
    args = dict(check_args(pb), targets=targets)
    return {"args": args, "fixes": [{"edit": e.id, "kind": f["kind"], "symbol": f["symbol"], "name": f.get("name")}
                                    for e in edits for f in e.fixes]}


_subs: dict[tuple, Any] = {}


def sub_target(patch, active: list):
    """``patch`` with only the edits that apply on this host (the same object for the same choice,
    so plancache's fingerprint of it is computed once)."""
    if len(active) == len(patch.edits):
        return patch
    from dataclasses import replace

    k = (id(patch), tuple(e.id for e in active))
    hit = _subs.get(k)
    if hit is not None and hit[0] is patch:
        return hit[1]
    sub = replace(patch, edits=list(active))
    if len(_subs) >= 1024:
        _subs.clear()
    _subs[k] = (patch, sub)   # (holds patch: its id is not reused while the entry is here)
    return sub


def select(pb: Playbook, patch, packages: dict, text: str | None, present: dict | None,
           states_of=None):
    """The edits of ``patch`` that apply on this host (conditions.py): versions, then anchors (on the
    file's text), then findings (``states_of(sub_target) -> {edit id: state}`` decides which of
    them are still pending)."""
    from remote_ops.playbook import conditions

    sel = conditions.by_version(patch.edits, packages)
    if text is not None and any(getattr(e, "when", None) is not None and e.when.anchor for e in sel.active):
        sel = conditions.by_anchor(sel, text)
    if conditions.finding_edits(sel.active):
        if present is None:
            raise RefusedError(f"playbook {pb.name}: edits with when: {{finding: present}} need the host's check, "
                               "which the read did not return", f"give the playbook a check: section ({pb.path})")
        sel = conditions.by_finding(sel, states_of(sub_target(patch, sel.active)), present)
    return sel


def earlier_patch(by: dict | None, host_name: str) -> str:
    """The hint's tail when an edit does not apply to a file an earlier patch of this host wrote (an
    earlier version of the playbook, most often: its edit's new text is not this one's)."""
    if not by:
        return ""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(by["when"])) if by.get("when") else "an unknown time"
    return (f"; the file is as patch {by.get('txid')} (playbook {by.get('playbook') or 'unnamed'}, {when}) left it: "
            f"run `remote-ops rollback {host_name}` (or --to {by.get('txid')}) to restore what it replaced, "
            "then patch again")


def check_args(pb: Playbook) -> dict | None:
    if not pb.check:
        return None
    from remote_ops.agent.contract import DEFAULT_AGAINST   # (not remote_ops.check.check: ~30 ms of imports)
    return {"targets": pb.check["targets"], "against": pb.check.get("against") or list(DEFAULT_AGAINST)}


def read(session, pb: Playbook, host) -> dict:
    """Round trip 1: facts + targets. No check here: the edits' own ``fixes`` say which findings
    must be gone, and apply verifies that against the new text."""
    (res,) = session.call_many([read_request(pb, host)])
    return unwrap(res, host.name, "reading the patch targets")


def read_request(pb: Playbook, host, **extra):
    present = present_request(pb)
    if present is not None:
        extra["present"] = present
    return rq.patching_read(targets=[p.to_wire() for p in pb.patches], packages=packages_to_query(pb),
                            workdir=host.workdir, **extra)


def compute(pb: Playbook, raw: dict, host_name: str) -> PatchPlan:
    """Pure: requires, edits, validation. Raises RefusedError / ConfigError; nothing was changed."""
    pb.require_met(raw.get("packages") or {}, host=host_name)
    packages = raw.get("packages") or {}
    python = raw.get("python") or [3, 10]
    targets: list[TargetPlan] = []
    notes: list[str] = []
    for patch, t in zip(pb.patches, raw["targets"]):
        data = base64.b64decode(t["data"])
        label = patch.label
        try:
            text, encoding = edits_mod.decode_source(data)
        except ValueError as exc:
            raise RefusedError(f"{t['real']}: {exc}", "only Python source files can be patched",
                               host=host_name) from None

        def fresh(sub, t=t, text=text, encoding=encoding):
            def compute_one(key: str) -> dict:
                from remote_ops.patch import validate
                try:
                    result = edits_mod.apply_edits(text, sub.edits, t["real"])
                except edits_mod.UnknownCallee as exc:
                    raise ConfigError(pb.path, pb.edit_line(exc.edit_id),
                                      f"unknown callee in edit {exc.edit_id!r}: {exc.problem} in {sub.label} "
                                      f"({t['real']})") from None
                except edits_mod.EditError as exc:
                    raise RefusedError(f"{exc} (playbook {pb.path}:{pb.edit_line(exc.edit_id)})",
                                       "nothing was changed on the host" + earlier_patch(t.get("written_by"), host_name),
                                       host=host_name) from None
                problems = []
                skipped = []
                if result.changed:
                    p = validate.check_syntax(result.new_text, t["real"], python)
                    if p:
                        problems.append(p)
                    else:
                        introduced = {r.edit_id: r.introduced for r in result.results if r.state == "pending"}
                        names = validate.undefined_names(text, result.new_text, t["real"], introduced)
                        problems += names
                        if names.skipped:
                            skipped.append(names.skipped)
                if problems:
                    raise RefusedError("patched text is invalid: " + "; ".join(map(str, problems)),
                                       "nothing was changed on the host; fix the playbook", host=host_name)
                return plancache.entry_for(key, result, encoding, edits_mod.encode_source(result.new_text, encoding),
                                           notes=skipped, path=t["real"])
            return compute_one

        def states_of(sub, data=data):
            entry, _computed = plancache.plan(pb, sub, data, python, fresh(sub))
            return {r["edit_id"]: r["state"] for r in entry["results"]}

        # the edits whose when: holds on this host; then the same edits on the same bytes for the same
        # Python: computed once (this run, or before)
        sel = select(pb, patch, packages, text, raw.get("present"), states_of)
        sub = sub_target(patch, sel.active)
        entry, computed = plancache.plan(pb, sub, data, python, fresh(sub))
        result = plancache.file_result(entry, t["real"], text)
        notes += plancache.notes(entry, t["real"])
        new_bytes = edits_mod.encode_source(result.new_text, encoding) if result.changed else data
        targets.append(TargetPlan(label, patch.module, t["path"], t["real"], t.get("is_link", False),
                                  t["sha256"], t["mode"], encoding, result, new_bytes,
                                  "computed" if computed else "cached", sel.skipped))
    return PatchPlan(host_name, pb, list(python), raw.get("packages") or {}, targets,
                     raw.get("recovered") or [], notes)


def verification(plan: PatchPlan, agent_record: dict | None, reason: str | None) -> dict:
    """What was verified, for every patch result (JSON and people): ``line`` is
    ``verified: N targeted findings gone, M calls re-checked`` or ``not verified: <why>``."""
    if agent_record is None:
        why = reason or "the host's agent did not re-check the patched text"
        return {"verified": False, "line": f"not verified: {why}", "reason": why}
    v = dict(agent_record)
    unfixed = [e.id for _t, e in plan.pending_edits() if not e.fixes]
    extra = []
    if unfixed:
        extra.append(f"edit(s) {', '.join(unfixed)} declare no fixes, so nothing checks what they do")
    if v.get("remaining"):
        extra.append(f"{len(v['remaining'])} finding(s) remain in the patched module(s) (--allow-findings)")
    if v.get("unknown"):
        extra.append(f"{v['unknown']} call(s) could not be decided")
    if plan.skipped:
        extra.append(f"{len(plan.skipped)} edit(s) not for this host: {', '.join(s['edit'] for s in plan.skipped)}")
    tail = f" ({'; '.join(extra)})" if extra else ""
    if not v.get("fixes"):
        why = (f"no edit applied declares fixes; {v.get('calls_rechecked', 0)} calls re-checked, "
               f"{len(v.get('remaining') or [])} finding(s) remain")
        return dict(v, verified=False, reason=why, line=f"not verified: {why}{tail}")
    return dict(v, verified=True, reason=None,
                line=f"verified: {v['targeted_gone']} targeted findings gone, {v['calls_rechecked']} calls "
                     f"re-checked{tail}")


def verify_only(session, plan: PatchPlan, host, *, allow_findings: bool = False) -> dict:
    """The apply step's verification without the transaction (``patch --dry-run``): one round trip."""
    req, reason = plan.verify_request(allow_findings)
    if req is None:
        return verification(plan, None, reason)
    targets = [{"module": t.module, "encoding": t.encoding, "data": base64.b64encode(t.new_bytes).decode()}
               for t in plan.targets if t.changed]
    (res,) = session.call_many([rq.patching_verify(verify=req, targets=targets)])
    return verification(plan, unwrap(res, host.name, "verifying the patch")["verified"], None)


def apply_args(plan: PatchPlan, host, *, import_check: bool = False, allow_findings: bool = False,
               while_running: bool = False) -> tuple[dict[str, Any], str | None]:
    """The agent's ``patching.apply`` arguments for ``plan``, and why nothing will be verified (or None)."""
    pb = plan.playbook
    changed = [t for t in plan.targets if t.changed]
    wire = {id(t): p.to_wire() for p, t in zip(pb.patches, plan.targets)}
    args: dict[str, Any] = {
        "playbook": pb.name, "who": who(), "workdir": host.workdir,
        "edit_ids": [r.edit_id for t in changed for r in t.result.results if r.state == "pending"],
        "targets": [{"real": t.real, "label": t.label, "module": t.module, "expected": t.sha256,
                     "encoding": t.encoding, "data": base64.b64encode(t.new_bytes).decode(),
                     "spec": wire[id(t)]} for t in changed],
    }
    req, reason = plan.verify_request(allow_findings)
    if req is not None:
        args["verify"] = req
    if import_check:
        args["import_check"] = sorted({t.module for t in plan.targets if t.module})
    if while_running:
        args["while_running"] = True
    return args, reason


def apply(session, plan: PatchPlan, host, *, import_check: bool = False, allow_findings: bool = False,
          while_running: bool = False) -> dict:
    """Round trip 2: the whole transaction on the host (its result carries ``verification``)."""
    args, reason = apply_args(plan, host, import_check=import_check, allow_findings=allow_findings,
                              while_running=while_running)
    (res,) = session.call_many([rq.patching_apply(**args)])
    return applied(plan, res, host, reason)


def applied(plan: PatchPlan, res: dict, host, reason: str | None) -> dict:
    """The apply step's outcome from the agent's raw answer."""
    out = unwrap(res, host.name, "applying the patch")
    out["verification"] = verification(plan, out.get("verified"), reason or out.get("verify_skipped"))
    return out


# ------------------------------------------------------------------ read + apply in one exec
def planned_for_seen(pb: Playbook, host, *, import_check: bool = False,
                     allow_findings: bool = False, while_running: bool = False) -> dict | None:
    """The apply request for the state this host was last seen in (hoststate.py), built from the
    plan cache without the target's bytes, guarded by ``only_if`` (the host's Python major.minor,
    the exact package versions, every target's resolved path and sha256): the agent does nothing unless all of it is
    still what it has. None when anything is not known (never seen, a plan not cached, the
    remembered versions not meeting ``requires``) or the plan changes nothing."""
    from remote_ops.patch import hoststate

    packages = packages_to_query(pb)
    seen = hoststate.recall(pb, host, packages)
    if seen is None or pb.check_requires(seen["packages"]):
        return None
    python = seen["python"]
    targets = []
    notes: list[str] = []
    for patch, t, ids, skipped in zip(pb.patches, seen["targets"], seen["active"], seen["skipped"]):
        # the edits that applied in that state (the playbook's when: conditions decided it then)
        sub = sub_target(patch, [e for e in patch.edits if e.id in set(ids)])
        entry = plancache.cached(pb, sub, t["sha256"], python)
        if entry is None:
            return None
        notes += plancache.notes(entry, t["real"])
        # the old text is not known (not read yet): only whether the target changes, its edits'
        # states and its new bytes are used (apply_args)
        result = plancache.file_result(entry, t["real"], None)
        encoding = entry["encoding"]
        new_bytes = b"" if entry.get("same") else edits_mod.encode_source(entry["new_text"], encoding)
        targets.append(TargetPlan(patch.label, patch.module, t["real"], t["real"], False, t["sha256"], 0,
                                  encoding, result, new_bytes, "cached", list(skipped)))
    plan = PatchPlan(host.name, pb, list(python), dict(seen["packages"]), targets, notes=notes)
    if not plan.changed:
        return None
    args, _reason = apply_args(plan, host, import_check=import_check, allow_findings=allow_findings,
                               while_running=while_running)
    args["only_if"] = {"python": list(python[:2]), "packages": dict(seen["packages"]),
                       "targets": [{"spec": p.to_wire(), "real": t.real, "sha256": t.sha256}
                                   for p, t in zip(pb.patches, targets)]}
    # the report can be built without the targets' bytes when every diff is cached (plancache)
    reportable = all(t.result.cached_diff_body is not None for t in targets if t.changed)
    return {"args": args, "seen": seen, "plan": plan if reportable else None}


def plan_for_read(early: dict, raw: dict) -> PatchPlan:
    """The plan of ``planned_for_seen`` completed with what the read says of each target (the
    read left the bytes out: they are the remembered ones, which that plan was built from)."""
    from dataclasses import replace

    plan = early["plan"]
    targets = [replace(t, path=r["path"], is_link=r.get("is_link", False), mode=r["mode"])
               for t, r in zip(plan.targets, raw["targets"])]
    return replace(plan, python=list(raw.get("python") or plan.python), packages=raw.get("packages") or {},
                   targets=targets, recovered=raw.get("recovered") or [])


def read_then_apply(session, pb: Playbook, host, apply_req: dict, *, omit_data: bool = False) -> tuple[dict, dict | None]:
    """Round trip 1 carrying both: the read, then the conditional apply (not run if the read
    failed). Returns (the read's result, the apply's raw answer). ``omit_data``: the read leaves
    the targets' bytes out when the host is in the apply's ``only_if`` state."""
    extra = {"data_unless": apply_req["only_if"]} if omit_data else {}
    read_req = read_request(pb, host, **extra)
    res = session.call_many([read_req, rq.patching_apply(**apply_req)], stop_on_error=True)
    return unwrap(res[0], host.name, "reading the patch targets"), (res[1] if len(res) > 1 else None)


def not_covered(session, pb: Playbook, host, packages: dict) -> RefusedError:
    """The refusal of a host whose versions the playbook's ``requires`` does not cover: one line
    naming what changed there (the host's findings no edit fixes: one more round trip, the check) and
    what to do (coverage.py)."""
    from remote_ops.playbook import coverage

    findings = None
    if pb.check:
        (res,) = session.call_many([rq.compat_check(**check_args(pb))])
        if res.get("ok"):
            findings = (res.get("result") or {}).get("findings") or []
    message, hint = coverage.refusal(pb, packages, findings, host.name)
    return RefusedError(message, hint, host=host.name)


def run_host(session, host, pb: Playbook, *, dry_run: bool = False, import_check: bool = False,
             allow_findings: bool = False, confirm=None, while_running: bool = False) -> dict:
    """read -> compute -> (verify for a dry run | confirm -> apply) on one host; returns a JSON-able
    outcome whose ``verification.line`` says what was verified or why nothing was. A Ctrl-C from the
    apply's sending to its answer is held until the answer says what the host did (interrupts.py)."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        held: list = []

        def hold() -> None:        # once, from the apply's sending on
            if held:                # a second apply (the first one's only_if did not hold): not after a Ctrl-C
                interrupts.before_sending()
            else:
                held.append(stack.enter_context(interrupts.committing(host.name, "the patch",
                                                                      f"remote-ops history {host.name}")))
        return _run_host(session, host, pb, dry_run=dry_run, import_check=import_check,
                         allow_findings=allow_findings, confirm=confirm, hold=hold, while_running=while_running)


def _run_host(session, host, pb: Playbook, *, dry_run: bool, import_check: bool, allow_findings: bool,
              confirm, hold, while_running: bool = False) -> dict:
    from remote_ops.patch import hoststate

    t0 = time.perf_counter()
    execs0 = session.stats.execs
    # no prompt, not a dry run, and this host seen before: the apply for that state travels with the read
    early = None if dry_run or confirm is not None else planned_for_seen(
        pb, host, import_check=import_check, allow_findings=allow_findings, while_running=while_running)
    if early is None:
        prefetch(pb)
        raw, first = read(session, pb, host), None
    else:
        hold()
        raw, first = read_then_apply(session, pb, host, early["args"], omit_data=early["plan"] is not None)
    ran_early = first is not None and not (first.get("ok") and "skipped" in (first.get("result") or {}))
    if raw.get("data_omitted") and not ran_early:
        # the host left the remembered state between the read and the apply: read it again, bytes included
        raw, early = read(session, pb, host), None
    if ran_early and not hoststate.same_state(pb, raw, early["seen"]):
        # the apply found the remembered state, the read (a moment before, same process) did not:
        # another controller changed the host in between; the report cannot be built from this read
        unwrap(first, host.name, "applying the patch")
        raise RemoteOpsError("the host's targets changed between the read and the apply of this patch "
                             "(another controller?); the apply ran for the state it checked",
                             f"run `remote-ops history {host.name}` to see what is on the host", host=host.name)
    if pb.check_requires(raw.get("packages") or {}):
        raise not_covered(session, pb, host, raw.get("packages") or {})
    # the read left the bytes out only for the state the early plan was built for: no need to compute it again
    plan = plan_for_read(early, raw) if raw.get("data_omitted") else compute(pb, raw, host.name)
    if plan.changed:
        hoststate.remember(pb, host, raw, early and early["seen"], plan)
    out = {"host": host.name, "playbook": pb.name, "playbook_path": pb.path, "python": plan.python,
           "packages": plan.packages, "changed": False, "dry_run": dry_run,
           "targets": [{"label": t.label, "path": t.path, "real": t.real, "is_link": t.is_link,
                        "changed": t.changed, "sha256_before": t.sha256, "plan": t.plan_source}
                       for t in plan.targets],
           "edits": plan.edit_states(), "diff": plan.diff(),
           "recovered": plan.recovered, "plan": plan, "notes": list(plan.notes),
           "verification": verification(plan, None, plan.verify_request()[1])}
    if plan.changed and dry_run:
        out["verification"] = verify_only(session, plan, host, allow_findings=allow_findings)
    elif plan.changed:
        if confirm is not None and not confirm(plan):
            out["declined"] = True
            out["verification"] = verification(plan, None, "not applied (declined at the prompt)")
        else:
            if ran_early:
                # the host was in the remembered state: the apply in the read's exec was this plan's
                res = applied(plan, first, host, plan.verify_request(allow_findings)[1])
            else:   # the host differs from what was remembered (it said what): apply as planned now
                hold()
                res = apply(session, plan, host, import_check=import_check, allow_findings=allow_findings,
                            while_running=while_running)
            entry = res.get("entry")
            if entry:
                interrupts.changed(host.name, f"the patch was applied (journal {entry['txid']}): "
                                              f"undo with remote-ops rollback {host.name}")
            out.update(changed=bool(res.get("changed")), txid=entry and entry["txid"],
                       journal=entry, lock_wait_s=res.get("lock_wait_s"), verification=res["verification"],
                       import_check=res.get("import_check"), recovered=plan.recovered + (res.get("recovered") or []),
                       notes=plan.notes + list((entry or {}).get("notes") or []),
                       while_running=res.get("while_running") or [])
            if entry is None:
                out["note"] = "already applied on the host by another controller"
    out["round_trips"] = session.stats.execs - execs0
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    return out


def prefetch(pb: Playbook) -> None:
    """Import what the applies of the playbook's edit kinds need (``needs``: libcst for call edits,
    about 0.2 s) in a thread while the read round trip is on the wire, unless plans of this playbook
    are cached (then an edit is likely never computed: nothing imported at all)."""
    import sys
    import threading

    wanted = [m for m in edits_mod.needs(e for p in pb.patches for e in p.edits) if m not in sys.modules]
    if wanted and not plancache.seen(pb):
        for name in wanted:
            threading.Thread(target=__import__, args=(name,), daemon=True).start()




@dataclass(eq=False)
class PatchResult(HostRecord):
    """The record of ``patch``: what was planned, changed, verified (``verification.line``)."""

    playbook: str | None = None
    playbook_path: str | None = None
    python: Any = None
    packages: dict = field(default_factory=dict)
    changed: bool = False
    dry_run: bool = False
    targets: list = field(default_factory=list)
    edits: list = field(default_factory=list)
    diff: str = ""
    recovered: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    verification: dict = field(default_factory=dict)
    declined: bool = False
    txid: str | None = None               # the journal entry of the transaction (None: nothing written)
    journal: dict | None = None
    lock_wait_s: float | None = None
    import_check: dict | None = None
    while_running: list = field(default_factory=list)   # the jobs of this interpreter it was applied beside
    note: str | None = None
    round_trips: int = 0
    wall_s: float = 0.0


def patch(session, pb: Playbook, *, dry_run: bool, import_check: bool, allow_findings: bool,
          while_running: bool, confirm=None) -> PatchResult:
    """The patch operation on the session's host: read -> compute -> validate -> (verify | confirm ->
    apply). ``pb``: the playbook, loaded once by the caller. ``confirm(plan) -> bool`` is asked before
    writing (None: apply)."""
    out = run_host(session, session.host, pb, dry_run=dry_run, import_check=import_check, allow_findings=allow_findings,
                   confirm=confirm, while_running=while_running)
    out.pop("plan", None)
    return PatchResult.from_json(out)


@dataclass(eq=False)
class RollbackResult(HostRecord):
    """The record of ``rollback``: the transactions undone (each with its journal entry)."""

    changed: bool = False
    rolled_back: list = field(default_factory=list)
    while_running: list = field(default_factory=list)   # the jobs of this interpreter it was done beside
    message: str = optional()


@dataclass(eq=False)
class HistoryResult(HostRecord):
    """The record of ``history``: journal entries, corrupt lines, interrupted transactions."""

    entries: list = field(default_factory=list)


def rollback(session, *, to: str | None, force: bool, while_running: bool) -> RollbackResult:
    """The rollback operation on the session's host: the exact bytes from before the last (or ``to``) patch."""
    host = session.host
    with interrupts.committing(host.name, "the rollback", f"remote-ops history {host.name}"):
        (res,) = session.call_many([rq.patching_rollback(to=to, force=force, who=who(),
                                                         **({"while_running": True} if while_running else {}))])
        out = unwrap(res, host.name, "rollback")
        for d in out.get("rolled_back") or []:
            if d.get("entry"):
                interrupts.changed(host.name, f"the rollback was done ({d['of']} undone by journal "
                                              f"{d['entry']['txid']}): redo with remote-ops patch {host.name}")
    return RollbackResult.from_json(out, host=host.name)


def history(session, *, limit: int | None) -> HistoryResult:
    """The history operation on the session's host: its patch journal."""
    (res,) = session.call_many([rq.patching_history(limit=limit)])
    return HistoryResult.from_json(unwrap(res, session.label, "reading the journal"), host=session.label)
