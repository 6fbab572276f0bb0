"""Playbooks (``<name>.yaml``, found by playbook/search.py): loader and schema, with file:line errors.

    name: eagle3-speculators-0.3.0          # optional; defaults to the file stem
    description: ...
    requires:                               # checked against the host's facts before anything changes
      speculators: "==0.3.0"
      vllm: ">=0.17"
      transformers: {version: "<5.24", if_installed: true}   # a range that applies only when it is installed
    check:                                  # used by `remote-ops check`
      targets: [speculators.data_generation.vllm_hidden_states_generator]
      against: [vllm]
    allow_outside: false                    # patch targets outside the package / workdir (default: refused)
    patches:
      - module: speculators.data_generation.vllm_hidden_states_generator   # or  path: relative/or/absolute.py
        edits:
          - id: request-drop-eos-token-id
            call: Request                   # callee as written (or its trailing dotted components)
            drop: [eos_token_id]
            add: {block_size: VLLM_BLOCK_SIZE}
            rename: {old_kw: new_kw}
            expect: 1                       # matching calls expected (default 1; "any" for one or more)
            when: {vllm: ">=0.17"}          # where it applies (conditions.py): version specifiers,
                                            # finding: present, anchor: present; also on a patch group
            fixes: [{kind: unexpected-keyword, symbol: vllm.v1.request.Request, name: eos_token_id}]
          - id: execute-then-sample
            replace:
              old: "..."
              new: "..."
    extract: {...}                          # free-form mapping, read by the extract feature

``fixes`` entries are findings as ``remote-ops check --json`` prints them: ``kind`` (one of the
check's finding kinds), ``symbol`` (the callee, spelled by the module that defines it or by one that
imports it: both resolve to the same definition on the host) and optionally ``name`` (the keyword or
parameter). Any other key is an error. ``patch`` re-checks the patched modules before writing and
refuses unless every entry matched a finding of the unpatched text and none of the patched text.

A value ``FILL-ME`` / ``<FILL ME...>`` anywhere is a placeholder (written by ``check --emit-playbook``):
the loader refuses the playbook until a person replaces it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_ops.playbook import conditions
from remote_ops.playbook import edits
from remote_ops.errors import ConfigError, RefusedError
from remote_ops.yamlsrc import YamlDoc, load_file, load_text, type_name

PLACEHOLDER_RE = re.compile(r"FILL[-_ ]?ME|<\s*FILL[^>]*>", re.I)
PLACEHOLDER = "FILL-ME"
TOP_KEYS = {"name", "description", "requires", "check", "patches", "extract", "allow_outside", "vars"}
PATCH_KEYS = {"module", "path", "edits", "allow_outside", "when"}
FIX_KEYS = {"kind", "symbol", "name"}
_DOTTED = edits.DOTTED
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class PatchTarget:
    module: str | None
    path: str | None
    edits: list[Any]
    allow_outside: bool = False
    line: int | None = None

    @property
    def label(self) -> str:
        return self.module or self.path or "?"

    def to_wire(self) -> dict:
        return {"module": self.module, "path": self.path, "allow_outside": self.allow_outside}


@dataclass
class Playbook:
    path: str
    name: str
    description: str = ""
    requires: dict[str, str] = field(default_factory=dict)
    if_installed: frozenset = frozenset()   # names in requires whose range holds only when installed
    check: dict | None = None          # {"targets": [module...], "against": [package...]}
    patches: list[PatchTarget] = field(default_factory=list)
    extract: dict | None = None
    allow_outside: bool = False
    doc: YamlDoc | None = None
    origin: str | None = None          # where it was found (playbook/search.py ORIGINS), when found by search
    inventory_path: str | None = None  # the inventory it was looked up beside (its "claims" pointers search there too)

    def line(self, *keys) -> int | None:
        return self.doc.line(*keys) if self.doc else None

    def error(self, keys: tuple, problem: str, hint: str | None = None) -> ConfigError:
        return ConfigError(self.path, self.line(*keys), problem, hint)

    @property
    def edit_ids(self) -> list[str]:
        return [e.id for p in self.patches for e in p.edits]

    def edit_line(self, edit_id: str) -> int | None:
        for p in self.patches:
            for e in p.edits:
                if e.id == edit_id:
                    return e.line
        return None

    def check_requires(self, versions: dict[str, str | None]) -> list[str]:
        """Problems with ``requires`` against the host's package versions (empty: all met)."""
        return list(_requires_problems(tuple((name, spec, versions.get(name), name in self.if_installed)
                                             for name, spec in self.requires.items())))

    def require_met(self, versions: dict[str, str | None], host: str | None = None) -> None:
        problems = self.check_requires(versions)
        if problems:
            raise RefusedError(f"playbook {self.name} does not apply: " + "; ".join(problems),
                               f"requirements are at {self.path}:{self.line('requires')}", host=host)


@functools.lru_cache(maxsize=64)
def _requires_problems(rows: tuple) -> tuple[str, ...]:
    """(name, spec, host version, only if installed) rows -> problems; a fleet's hosts mostly share one answer."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    problems = []
    for name, spec, have, optional in rows:
        if have is None:
            if not optional:
                problems.append(f"{name} is not installed (playbook requires {name}{spec})")
            continue
        try:
            ok = Version(have) in SpecifierSet(spec, prereleases=True) if spec.strip() else True
        except InvalidVersion:
            ok = False
        if not ok:
            problems.append(f"{name} {have} does not satisfy {name}{spec}" + (" (required when installed)" if optional else ""))
    return tuple(problems)


def _placeholder_scan(doc: YamlDoc, value: Any, keys: tuple) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _placeholder_scan(doc, v, keys + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _placeholder_scan(doc, v, keys + (i,))
    elif isinstance(value, str) and PLACEHOLDER_RE.search(value):
        raise doc.error(keys, f"placeholder left in {'.'.join(map(str, keys))}: {value.strip()[:60]!r}",
                        "replace it with a real value (written by check --emit-playbook for a person to fill in)")


def _str_list(doc, keys, value, what) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise doc.error(keys, f"{what} must be a list of strings, got {type_name(value)}")
    return list(value)


ACCEPTED_DRIFT_KEYS = ("kind", "symbol", "name", "why")


def _accepted_drift(doc, raw) -> list[dict]:
    """check.accepted_drift: drift items a person reviewed and kept, each with the reason.

    Matched on (kind, symbol, name) exactly as `remote-ops check --json` reports them; every key is
    required (a reason included: an acceptance nobody can explain is not a review)."""
    if raw is None:
        return []
    keys = ("check", "accepted_drift")
    if not isinstance(raw, list):
        raise doc.error(keys, f"check.accepted_drift must be a list of {{kind, symbol, name, why}}, got {type_name(raw)}")
    out = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise doc.error(keys + (i,), f"check.accepted_drift entries must be mappings, got {type_name(entry)}")
        doc.check_keys(keys + (i,), entry, ACCEPTED_DRIFT_KEYS, "in check.accepted_drift")
        for k in ACCEPTED_DRIFT_KEYS:
            v = entry.get(k)
            if not isinstance(v, str) or not v.strip():
                raise doc.error(keys + (i,), f"check.accepted_drift entry needs {k} (a non-empty string)",
                                "copy kind, symbol and name from `remote-ops check --json`; why says what was checked")
        from remote_ops.agent.contract import DRIFT_KINDS   # (declared once, with every finding kind)
        if entry["kind"] not in DRIFT_KINDS:
            raise doc.error(keys + (i, "kind"), f"unknown drift kind {entry['kind']!r}",
                            f"one of {', '.join(DRIFT_KINDS)}")
        out.append({k: entry[k].strip() for k in ACCEPTED_DRIFT_KEYS})
    return out


def _bool(doc, keys, value) -> bool:
    if not isinstance(value, bool):
        raise doc.error(keys, f"{keys[-1]} must be true or false, got {type_name(value)}")
    return value


def _parse_fixes(doc: YamlDoc, keys: tuple, raw: Any, eid: str) -> list[dict]:
    """``fixes``: a list of {kind, symbol[, name]}; anything else is an error at its line."""
    from remote_ops.agent.contract import FINDING_KINDS   # (not callsites: ~15 ms of imports)

    if raw is None:
        return []
    if not isinstance(raw, list):
        raise doc.error(keys, f"fixes of edit {eid!r} must be a list of findings, got {type_name(raw)}")
    out = []
    for i, f in enumerate(raw):
        k = keys + (i,)
        if not isinstance(f, dict):
            raise doc.error(k, f"a fixes entry of edit {eid!r} must be a mapping {{kind, symbol, name}}, "
                            f"got {type_name(f)}")
        doc.check_keys(k, f, FIX_KEYS, f"in a fixes entry of edit {eid!r}")
        for need in ("kind", "symbol"):
            if need not in f:
                raise doc.error(k, f"a fixes entry of edit {eid!r} needs {need!r}",
                                "copy kind, symbol and name from `remote-ops check --json`")
        if f["kind"] not in FINDING_KINDS:
            raise doc.error(k + ("kind",), f"unknown finding kind {f['kind']!r} in edit {eid!r}",
                            f"known kinds: {', '.join(FINDING_KINDS)}")
        if not isinstance(f["symbol"], str) or not _DOTTED.match(f["symbol"]):
            raise doc.error(k + ("symbol",), f"symbol {f['symbol']!r} of edit {eid!r} is not a dotted name",
                            "e.g. vllm.v1.request.Request")
        name = f.get("name")
        if name is not None and not isinstance(name, str):
            raise doc.error(k + ("name",), f"name of a fixes entry of edit {eid!r} must be a string")
        out.append({"kind": f["kind"], "symbol": f["symbol"], "name": name, "line": doc.line(*k)})
    return out


def _parse_edit(doc: YamlDoc, keys: tuple, raw: Any, seen: set[str], group_when=None):
    if not isinstance(raw, dict):
        raise doc.error(keys, f"an edit must be a mapping, got {type_name(raw)}")
    eid = raw.get("id")
    if not isinstance(eid, str) or not _ID.match(eid):
        raise doc.error(keys + ("id",) if "id" in raw else keys,
                        "every edit needs an 'id' (letters, digits, - _ .)")
    if eid in seen:
        raise doc.error(keys + ("id",), f"duplicate edit id {eid!r}")
    seen.add(eid)
    line = doc.line(*keys)
    fixes = _parse_fixes(doc, keys + ("fixes",), raw.get("fixes"), eid)
    when = conditions.parse(doc, keys + ("when",), raw.get("when"), f"edit {eid!r}", has_fixes=bool(fixes))
    if group_when is not None:
        if group_when.finding and not fixes:
            raise doc.error(keys, f"edit {eid!r} declares no fixes, but its group's when asks for its finding "
                            "(finding: present)", "add fixes, or move the condition to the edits that have them")
        when = group_when.merged(when)
    kind = _edit_kind(doc, keys, raw, eid)
    doc.check_keys(keys, raw, kind.playbook_keys(), f"in {kind.label} {eid!r}")
    return kind.parse(raw, lambda sub, problem, hint=None: doc.error(keys + sub, problem, hint),
                      id=eid, fixes=fixes, line=line, when=when)


def _edit_kind(doc: YamlDoc, keys: tuple, raw: dict, eid: str) -> type[edits.EditKind]:
    """The registered kind an edit's keys name (edits.KINDS), or one line saying why none does:
    no kind's key, two kinds' keys, or a key of another kind than the one it names."""
    chosen = [k for k in edits.KINDS.values() if k.selector in raw]
    if len(chosen) > 1:
        names = " and ".join(repr(k.selector) for k in chosen)
        raise doc.error(keys, f"edit {eid!r} has both {names}; use one edit for each",
                        "an edit is of one kind: " + _kinds_list())
    if not chosen:
        owners = {k: [c for c in edits.KINDS.values() if k in c.keys] for k in raw if k not in edits.COMMON_KEYS}
        hinted = [(k, c[0]) for k, c in owners.items() if len(c) == 1]
        if hinted:
            key, kind = hinted[0]
            raise doc.error(keys + (key,), f"edit {eid!r} has {key!r}, a key of {kind.label}s, but no "
                            f"{kind.selector!r}", f"{kind.label}s name what they change with {kind.selector!r}")
        unknown = [k for k, c in owners.items() if not c]
        extra = f" ({', '.join(map(repr, unknown))}: no edit kind has such a key)" if unknown else ""
        raise doc.error(keys, f"edit {eid!r} needs {_kinds_list()}{extra}")
    kind = chosen[0]
    for key in raw:
        if key in kind.playbook_keys():
            continue
        other = [c for c in edits.KINDS.values() if key in c.keys]
        if other:
            raise doc.error(keys + (key,), f"{kind.label} {eid!r} ({kind.selector!r}) has {key!r}, a key of "
                            f"{other[0].label}s ({other[0].selector!r}); use one edit for each",
                            f"{kind.label}s take {', '.join(sorted(kind.playbook_keys()))}")
    return kind


def _kinds_list() -> str:
    """``'call' (structured call edit) or 'replace' (exact text)``: every registered kind."""
    parts = [f"{k.selector!r} ({k.summary})" for k in edits.KINDS.values()]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


def parse(doc: YamlDoc) -> Playbook:
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), f"a playbook must be a mapping, got {type_name(data)}")
    doc.check_keys((), data, TOP_KEYS, "top-level")
    _placeholder_scan(doc, {k: v for k, v in data.items() if k != "extract"}, ())
    name = data.get("name") or Path(doc.path).stem
    if not isinstance(name, str):
        raise doc.error(("name",), "name must be a string")
    requires_raw = data.get("requires") or {}
    if not isinstance(requires_raw, dict):
        raise doc.error(("requires",), f"requires must be a mapping of package -> version specifier, "
                        f"got {type_name(requires_raw)}")
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    requires: dict[str, str] = {}
    if_installed = set()
    for pkg, spec in requires_raw.items():
        if isinstance(spec, dict):
            doc.check_keys(("requires", pkg), spec, ("version", "if_installed"), f"in requires.{pkg}")
            if not isinstance(spec.get("if_installed", False), bool):
                raise doc.error(("requires", pkg, "if_installed"), f"requires.{pkg}.if_installed must be true or false")
            if spec.get("if_installed"):
                if_installed.add(str(pkg))
            spec = spec.get("version")
        spec = "" if spec is None else str(spec)
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise doc.error(("requires", pkg), f"invalid version specifier {spec!r} for {pkg}",
                            'write e.g. "==0.3.0" or ">=0.17"') from None
        requires[str(pkg)] = spec
    check = None
    if data.get("check") is not None:
        c = data["check"]
        if not isinstance(c, dict):
            raise doc.error(("check",), f"check must be a mapping with targets and against, got {type_name(c)}")
        doc.check_keys(("check",), c, ("targets", "against", "accepted_drift", "model"), "in check")
        targets = _str_list(doc, ("check", "targets"), c.get("targets") or [], "check.targets")
        against = _str_list(doc, ("check", "against"), c.get("against") or [], "check.against")
        for i, t in enumerate(targets):
            if not _DOTTED.match(t):
                raise doc.error(("check", "targets", i), f"{t!r} is not a module name")
        if not targets:
            raise doc.error(("check",), "check needs at least one module in targets")
        from remote_ops.playbook.model_section import parse_section
        check = {"targets": targets, "against": against,
                 "accepted_drift": _accepted_drift(doc, c.get("accepted_drift")),
                 "model": parse_section(doc, c.get("model"))}
    allow_outside = _bool(doc, ("allow_outside",), data.get("allow_outside", False))
    patches_raw = data.get("patches") or []
    if not isinstance(patches_raw, list):
        raise doc.error(("patches",), f"patches must be a list, got {type_name(patches_raw)}")
    seen: set[str] = set()
    patches: list[PatchTarget] = []
    targets_seen: set[str] = set()
    for i, p in enumerate(patches_raw):
        keys = ("patches", i)
        if not isinstance(p, dict):
            raise doc.error(keys, f"a patch must be a mapping with module or path and edits, got {type_name(p)}")
        doc.check_keys(keys, p, PATCH_KEYS, "in patch")
        module, path = p.get("module"), p.get("path")
        if (module is None) == (path is None):
            raise doc.error(keys, "a patch names exactly one of 'module' or 'path'")
        if module is not None and (not isinstance(module, str) or not _DOTTED.match(module)):
            raise doc.error(keys + ("module",), f"{module!r} is not a module name")
        if path is not None and (not isinstance(path, str) or not path.strip()):
            raise doc.error(keys + ("path",), "path must be a non-empty string")
        if path is not None and "\x00" in path:   # crashed the host agent's realpath (ValueError)
            raise doc.error(keys + ("path",), "path holds a NUL character")
        label = module or path
        if label in targets_seen:
            raise doc.error(keys, f"{label} is patched twice; put all its edits under one entry")
        targets_seen.add(label)
        edits_raw = p.get("edits")
        if not isinstance(edits_raw, list) or not edits_raw:
            raise doc.error(keys + ("edits",) if "edits" in p else keys, f"patch of {label} needs a non-empty list of edits")
        group_when = conditions.parse(doc, keys + ("when",), p.get("when"), f"the patch of {label}", has_fixes=None)
        edits = [_parse_edit(doc, keys + ("edits", j), e, seen, group_when) for j, e in enumerate(edits_raw)]
        allow = _bool(doc, keys + ("allow_outside",), p.get("allow_outside", allow_outside))
        patches.append(PatchTarget(module, path, edits, allow, doc.line(*keys)))
    extract = data.get("extract")
    if extract is not None and not isinstance(extract, dict):
        raise doc.error(("extract",), f"extract must be a mapping, got {type_name(extract)}")
    description = data.get("description") or ""
    return Playbook(path=doc.path, name=name, description=str(description), requires=requires,
                    if_installed=frozenset(if_installed), check=check,
                    patches=patches, extract=extract, allow_outside=allow_outside, doc=doc)


def load(path: str | Path) -> Playbook:
    """Load and validate a playbook; raises ``ConfigError`` naming file and line."""
    return parse(load_file(path))


def loads(text: str, path: str = "<playbook>") -> Playbook:
    return parse(load_text(text, path))


def find(spec: str | None, host=None, inventory_path: str | None = None) -> Path:
    """The playbook file for ``--playbook SPEC`` (a path, or a name along the search order of
    playbook/search.py), else the host's."""
    from remote_ops.playbook import search
    return search.find(spec, host, inventory_path).path


def available(inventory_path: str | None) -> list:
    """The playbooks a name reaches along the search order (playbook/search.py), each loaded: the one
    list that `check --candidates` and a refusal's "X claims vllm V" pointers choose from. A shadowed
    file is not in it, nor one that does not load (a broken one is no candidate)."""
    from remote_ops.errors import RemoteOpsError
    from remote_ops.playbook import search

    out, seen = [], set()
    for f in search.listing(inventory_path):
        if f.name in seen:
            continue
        seen.add(f.name)
        try:
            pb = load(f.path)
        except RemoteOpsError:
            continue
        pb.origin, pb.inventory_path = f.origin, inventory_path
        out.append(pb)
    return out


def flow(pb) -> str:
    """``server`` (its extract starts a vLLM server) or ``in-process``; ``-`` without an extract."""
    if not pb.extract:
        return "-"
    return "server" if pb.extract.get("server") else "in-process"
