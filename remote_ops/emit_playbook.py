"""``remote-ops check HOST --emit-playbook FILE``: a draft playbook with mechanical fixes for findings.

Called by the check command with the findings of ``compat.check`` (each carrying module, symbol, kind,
name, call, fix). Per (module, callee) one call edit: drop an unexpected keyword, rename it when check
found a close parameter name, add a missing argument from the module-level constant of matching name
when one exists, otherwise a ``FILL-ME`` placeholder that ``playbook.load`` refuses until a person fills
it in. Findings without a mechanical fix become a text edit whose ``new`` is a placeholder.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from remote_ops.playbook import PLACEHOLDER


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
        callee = symbol.rsplit(".", 1)[-1]
        fix = f.get("fix") or {}
        edits = by_module.setdefault(mod, {})
        action = fix.get("action")
        if action in ("remove-keyword", "rename-keyword", "add-keyword"):
            e = edits.setdefault(("call", callee), {"id": None, "call": callee, "fixes": []})
            e["fixes"].append({"kind": f.get("kind"), "symbol": symbol, "name": f.get("name")})
            if action == "remove-keyword":
                e.setdefault("drop", []).append(fix["keyword"])
            elif action == "rename-keyword":
                e.setdefault("rename", {})[fix["keyword"]] = fix["to"]
            else:
                value = fix.get("constant") or fix.get("value")
                e.setdefault("add", {})[fix["keyword"]] = value if value else \
                    f"{PLACEHOLDER} value for {fix['keyword']}"
        else:
            key = ("text", f.get("line"), f.get("name"))
            edits[key] = {"id": _edit_id(callee, f"{f.get('kind', 'fix')}-line-{f.get('line')}"),
                          "note": f.get("message") or f.get("suggestion") or "",
                          "replace": {"old": (f.get("call") or "") + "", "new": f"{PLACEHOLDER}: {f.get('suggestion') or 'rewrite this call'}"},
                          "fixes": [{"kind": f.get("kind"), "symbol": symbol, "name": f.get("name")}]}
    patches = []
    for mod, edits in by_module.items():
        out = []
        for key, e in edits.items():
            if key[0] == "call":
                parts = [p for p in ("drop", "add", "rename") if p in e]
                e["id"] = _edit_id(e["call"], "-".join(parts) if parts else "fix")
                e = {k: e[k] for k in ("id", "call", "drop", "add", "rename", "fixes") if k in e}
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
