"""Where an edit applies: a playbook edit's (or a patch group's) ``when:`` condition. Pure.

    patches:
      - module: speculators.data_generation.vllm_hidden_states_generator
        when: {vllm: ">=0.16"}                # a group's condition: every edit below has it too
        edits:
          - id: request-drop-eos-token-id
            when: {vllm: ">=0.17"}            # a version specifier on an installed distribution
            ...
          - id: some-fix
            when: {finding: present}          # only where one of its ``fixes`` findings is on the host
            ...
          - id: some-text-fix
            when: {anchor: present}           # only where its old text (or callee) is in the file

Three kinds of key, all of which must hold:

- a distribution name -> a version specifier (packaging), against the version the host has installed
  (``patching.read`` reports it); a distribution that is not installed does not satisfy it.
- ``finding: present``: the edit needs ``fixes``; on the host, the unpatched module is checked (in the
  read's exec, the same check and symbol matcher as the verification) and the edit applies only where
  one of its ``fixes`` entries matches a finding. An edit already in place stays "applied" (its finding
  is gone because of it).
- ``anchor: present``: the edit applies only where its anchor is in the file (its kind's ``anchor_in``,
  edits.py): a text edit's old (or new) text, a call edit's callee. Without it a missing anchor stops
  the whole patch, as before.

An edit whose condition does not hold is *not for this host*: it is left out of the plan (it changes
nothing, its ``fixes`` are not verified) and ``patch`` reports it with the reason. The verification
counts only the edits that applied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PRESENT = "present"
FLAGS = ("finding", "anchor")
_DIST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class When:
    """A parsed ``when:``: version specifiers by distribution, and the two presence flags."""

    versions: tuple[tuple[str, str], ...] = ()
    finding: bool = False
    anchor: bool = False

    def merged(self, inner: "When | None") -> "When":
        """This (a group's) condition and an edit's own: both must hold."""
        if inner is None:
            return self
        specs: dict[str, list[str]] = {}
        for name, spec in self.versions + inner.versions:
            if spec not in specs.setdefault(name, []):
                specs[name].append(spec)
        return When(tuple((n, ",".join(s)) for n, s in specs.items()), self.finding or inner.finding,
                    self.anchor or inner.anchor)

    def to_json(self) -> dict:
        out: dict = {name: spec for name, spec in self.versions}
        if self.finding:
            out["finding"] = PRESENT
        if self.anchor:
            out["anchor"] = PRESENT
        return out

    def version_problem(self, packages: dict[str, str | None]) -> str | None:
        """Why the host's versions do not satisfy this condition (None: they do)."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        for name, spec in self.versions:
            have = packages.get(name)
            if have is None:
                return f"{name} is not installed (when: {name}{spec})"
            try:
                ok = Version(have) in SpecifierSet(spec, prereleases=True)
            except InvalidVersion:
                ok = False
            if not ok:
                return f"{name} {have} does not satisfy {name}{spec}"
        return None


def parse(doc, keys: tuple, raw, what: str, *, has_fixes: bool | None) -> When | None:
    """``when:`` of an edit (``has_fixes``: whether it declares fixes) or of a patch group
    (``has_fixes`` None: checked per edit). ConfigError at the line of anything else."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    from remote_ops.yamlsrc import type_name

    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise doc.error(keys, f"when of {what} must be a mapping such as {{vllm: \">=0.17\"}} or "
                        f"{{finding: present}}, got {type_name(raw)}")
    versions, flags = [], {}
    for k, v in raw.items():
        k = str(k)
        if k in FLAGS:
            if v != PRESENT:
                raise doc.error(keys + (k,), f"when.{k} of {what} must be 'present', got {v!r}",
                                f"when: {{{k}: present}} applies the edit only where its "
                                f"{'finding' if k == 'finding' else 'anchor'} is present")
            flags[k] = True
            continue
        if not _DIST.match(k):
            raise doc.error(keys + (k,), f"when of {what}: {k!r} is neither a distribution name nor one of "
                            f"{', '.join(FLAGS)}")
        if not isinstance(v, str) or not v.strip():
            raise doc.error(keys + (k,), f"when.{k} of {what} must be a version specifier string, got "
                            f"{type_name(v)}", 'write e.g. ">=0.17"')
        try:
            SpecifierSet(v)
        except InvalidSpecifier:
            raise doc.error(keys + (k,), f"invalid version specifier {v!r} for {k} in when of {what}",
                            'write e.g. ">=0.17" or ">=0.17,<0.21"') from None
        versions.append((k, v.strip()))
    if flags.get("finding") and has_fixes is False:
        raise doc.error(keys + ("finding",), f"when: {{finding: present}} of {what} needs fixes: entries "
                        "(the findings whose presence decides)", "add fixes, or use a version condition")
    return When(tuple(versions), flags.get("finding", False), flags.get("anchor", False))


@dataclass
class Selection:
    """One target's edits for one host: those that apply, and those that are not for it (why)."""

    active: list = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)   # {"edit", "why", "when"}

    @property
    def active_ids(self) -> list[str]:
        return [e.id for e in self.active]


def by_version(edits: list, packages: dict[str, str | None]) -> Selection:
    """Step 1, before the file is looked at: the version conditions."""
    sel = Selection()
    for e in edits:
        w = getattr(e, "when", None)
        why = w.version_problem(packages) if w is not None else None
        if why is None:
            sel.active.append(e)
        else:
            sel.skipped.append({"edit": e.id, "why": f"not for this version: {why}", "when": w.to_json()})
    return sel


def by_anchor(sel: Selection, text: str) -> Selection:
    """Step 2: edits with ``anchor: present`` whose anchor is not in the file are skipped."""
    out = Selection(skipped=list(sel.skipped))
    for e in sel.active:
        w = getattr(e, "when", None)
        if w is not None and w.anchor and not e.anchor_in(text):
            why = f"not for this file: {e.anchor_what()} is not in it (anchor: present)"
            out.skipped.append({"edit": e.id, "why": why, "when": w.to_json()})
        else:
            out.active.append(e)
    return out


def finding_edits(edits: list) -> list:
    """The edits whose condition asks for their finding on the host."""
    return [e for e in edits if getattr(e, "when", None) is not None and e.when.finding]


def by_finding(sel: Selection, states: dict[str, str], present: dict[str, bool]) -> Selection:
    """Step 3, after the edits' states on the file are known: a pending edit with ``finding: present``
    whose fixes match no finding of the host's unpatched module (``present[edit id]``) is skipped;
    an edit already in place stays (its finding is gone because of it)."""
    out = Selection(skipped=list(sel.skipped))
    for e in sel.active:
        w = getattr(e, "when", None)
        if w is not None and w.finding and states.get(e.id) == "pending" and not present.get(e.id, False):
            names = "; ".join(f"{f['kind']} {f['symbol']}" + (f" {f['name']}" if f.get("name") else "")
                              for f in e.fixes)
            out.skipped.append({"edit": e.id, "why": f"not for this host: its finding ({names}) is not on it "
                                "(finding: present)", "when": w.to_json()})
        else:
            out.active.append(e)
    return out


def packages(pb) -> list[str]:
    """Distribution names the playbook's conditions ask about (the read reports their versions)."""
    out: list[str] = []
    for p in pb.patches:
        for e in p.edits:
            for name, _spec in (getattr(e, "when", None) or When()).versions:
                if name not in out:
                    out.append(name)
    return out
