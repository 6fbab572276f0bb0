"""``remote-ops check HOST --emit-playbook FILE``: a draft playbook with mechanical fixes for findings
and drift.

Called by the check command with the findings of ``compat.check`` (each carrying module, symbol, kind,
name, call, source, fix) and the drift records. Per (module, callee) one call edit: drop an unexpected
keyword, rename it when check found a close parameter name, add a missing argument. A value taken from a
module-level constant because of its name (``block_size: VLLM_BLOCK_SIZE``) is a guess: the edit's note
says so with a ``FILL-ME`` that ``playbook.load`` refuses until a person confirms it (deletes the marker).
Drift: a changed default is kept by passing the baseline's value (a guessed value, e.g. False for a
None that is no longer accepted, is marked the same way); a renamed attribute and a dropped index
become text edits whose ``old`` is the exact source text. Anything else becomes a text edit with the
exact source as ``old`` and a placeholder ``new``.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from remote_ops.playbook.loader import PLACEHOLDER


def _edit_id(callee: str, suffix: str) -> str:
    base = re.sub(r"(?<!^)(?=[A-Z])", "-", callee.rsplit(".", 1)[-1]).lower().replace("_", "-")
    return f"{base}-{suffix}"


def draft(findings: list[dict], *, requires: dict | None = None, check: dict | None = None,
          name: str | None = None) -> dict:
    """The draft playbook as plain data (see ``write`` for the YAML file)."""
    by_module: dict[str, dict] = {}
    for f in findings:
        mod = f.get("module") or "?"
        symbol = f.get("symbol") or "?"
        callee = symbol.rsplit(".", 1)[-1].split("(", 1)[0]
        fix = f.get("fix") or {}
        edits = by_module.setdefault(mod, {})
        action = fix.get("action")
        is_drift = "baseline" in f and "installed" in f
        # drift is not a binding finding: the patch's verification cannot target it by `fixes`
        target = [] if is_drift else [{"kind": f.get("kind"), "symbol": symbol, "name": f.get("name")}]
        if action in ("remove-keyword", "rename-keyword", "add-keyword"):
            e = edits.setdefault(("call", callee), {"id": None, "call": callee, "fixes": [], "notes": []})
            e["fixes"] += target
            if action == "remove-keyword":
                e.setdefault("drop", []).append(fix["keyword"])
            elif action == "rename-keyword":
                e.setdefault("rename", {})[fix["keyword"]] = fix["to"]
            else:
                value = fix.get("constant") or fix.get("value")
                e.setdefault("add", {})[fix["keyword"]] = value if value else \
                    f"{PLACEHOLDER} value for {fix['keyword']}"
                if fix.get("constant"):
                    e["notes"].append(f"{PLACEHOLDER} (guess, confirm and delete this marker): "
                                      f"{fix['keyword']}={fix['constant']} was chosen because the module-level "
                                      f"constant's name matches the parameter's")
                elif fix.get("guess"):
                    e["notes"].append(f"{PLACEHOLDER} (guess, confirm and delete this marker): "
                                      f"{fix['keyword']}={value}: {fix['guess']}")
                elif value and is_drift:
                    e["notes"].append(f"{fix['keyword']}={value} keeps the default of "
                                      f"{(f.get('baseline') or {}).get('version')}: {f.get('message')}")
        elif action in ("replace-text", "rename-attribute") and fix.get("old") and fix.get("new"):
            key = ("text", f.get("line"), f.get("name"))
            edits[key] = {"id": _edit_id(callee if not is_drift else f.get("name") or callee,
                                         f"{f.get('kind', 'fix')}-line-{f.get('line')}"),
                          "note": f"{f.get('message')}; {f.get('suggestion')}",
                          "replace": {"old": fix["old"], "new": fix["new"]}}
            if target:
                edits[key]["fixes"] = target
        else:
            key = ("text", f.get("line"), f.get("name"))
            old = f.get("source") or f"{PLACEHOLDER}: the exact source text at line {f.get('line')}"
            edits[key] = {"id": _edit_id(callee, f"{f.get('kind', 'fix')}-line-{f.get('line')}"),
                          "note": f.get("message") or f.get("suggestion") or "",
                          "replace": {"old": old,
                                      "new": f"{PLACEHOLDER}: {f.get('suggestion') or 'rewrite this call'}"}}
            if target:
                edits[key]["fixes"] = target
    patches = []
    for mod, edits in by_module.items():
        out = []
        for key, e in edits.items():
            if key[0] == "call":
                parts = [p for p in ("drop", "add", "rename") if p in e]
                e["id"] = _edit_id(e["call"], "-".join(parts) if parts else "fix")
                if e.get("notes"):
                    e["note"] = "; ".join(e["notes"])
                if not e.get("fixes"):
                    e.pop("fixes", None)
                e = {k: e[k] for k in ("id", "note", "call", "drop", "add", "rename", "fixes") if k in e}
            out.append(e)
        patches.append({"module": mod, "edits": out})
    doc: dict = {"name": name or "draft"}
    if requires:
        doc["requires"] = dict(requires)
    if check:
        doc["check"] = dict(check)
    doc["patches"] = patches
    return doc


def write(path: str | Path, findings: list[dict], *, requires: dict | None = None,
          check: dict | None = None, name: str | None = None) -> Path:
    """Write the draft to ``path``; returns it. Placeholders make the loader refuse it until filled."""
    p = Path(path)
    doc = draft(findings, requires=requires, check=check, name=name or p.stem)
    n_fill = yaml.safe_dump(doc).count(PLACEHOLDER)
    head = ("# Draft written by `remote-ops check --emit-playbook` from the check's findings.\n"
            "# Review every edit against the library's source before use.\n")
    if n_fill:
        head += (f"# {n_fill} value(s) say {PLACEHOLDER}: remote-ops refuses this playbook until a person "
                 "replaces them.\n")
    p.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True))
    return p


def write_for_hosts(path: str | Path, results: list[dict], *, targets: list[str] | None = None,
                    against: list[str] | None = None) -> tuple[Path, int]:
    """One draft for every host checked (``check --json`` records): findings and drift merged (each
    site once), ``requires`` pinned to the version the hosts run when they all agree, ``check``
    targets as asked (else the modules the hosts checked). Returns (the file, findings in it)."""
    seen, findings, versions = set(), [], {}
    for value in sorted(results, key=lambda v: v["host"]):
        for pkg, ver in (value.get("versions") or {}).items():
            versions.setdefault(pkg, set()).add(ver)
        for f in list(value["findings"]) + list(value.get("drift") or []):
            key = (f.get("module"), f.get("line"), f.get("symbol"), f.get("kind"), f.get("name"))
            if key not in seen:
                seen.add(key)
                findings.append(f)
    requires = {pkg: "==" + next(iter(v)) for pkg, v in sorted(versions.items()) if len(v) == 1 and next(iter(v))}
    check: dict = {}
    targets = list(targets or []) or sorted({t["module"] if isinstance(t, dict) else t
                                            for v in results for t in (v.get("targets") or [])})
    if targets:
        check["targets"] = targets
    if against:
        check["against"] = list(against)
    return write(path, findings, requires=requires or None, check=check or None), len(findings)
