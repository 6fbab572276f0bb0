"""What a playbook covers, and the one line for a host it does not: shared by ``patch`` and by
``extract``'s preflight (so a release past the range is refused before any change and before any
GPU time, with the same words).

The line names the version the host has and the range the playbook's ``requires`` states, then what
changed there (the host's findings that no edit of the playbook fixes: symbols gone, arguments that no
longer bind), and what to do: ``remote-ops check HOST --candidates`` lists the package's releases
with their own findings against this host's library. Pure: the check result is passed in.
"""

from __future__ import annotations


def unfixed(pb, findings: list[dict]) -> list[dict]:
    """The findings that no edit of the playbook names in its ``fixes`` (kind, name, and the symbol as
    spelled in the finding or where it is defined)."""
    fixes = [f for p in pb.patches for e in p.edits for f in e.fixes]

    def named(f):
        return any(x["kind"] == f.get("kind") and (x.get("name") is None or str(x["name"]) == str(f.get("name")))
                   and x["symbol"] in (f.get("symbol"), f.get("defined")) for x in fixes)
    return [f for f in findings if not named(f)]


def what_changed(findings: list[dict], limit: int = 4) -> str:
    """Findings for one line: symbols gone grouped by module, then the others (kind symbol name)."""
    gone: dict[str, list[str]] = {}
    other: list[str] = []
    for f in findings:
        sym = f.get("symbol") or ""
        if f.get("kind") in ("missing-symbol", "missing-module") and "." in sym:
            mod, _, name = sym.rpartition(".")
            gone.setdefault(mod, []).append(name)
        else:
            other.append(f"{f.get('kind')} {sym}" + (f" {f['name']}" if f.get("name") else ""))
    parts = [f"{', '.join(sorted(set(names)))} gone from {mod}" for mod, names in gone.items()]
    parts += sorted(set(other))
    if len(parts) > limit:
        parts = parts[:limit] + [f"{len(parts) - limit} more"]
    return "; ".join(parts)


def refusal(pb, versions: dict[str, str | None], findings: list[dict] | None, host: str | None = None):
    """None when ``versions`` meet the playbook's ``requires``; else (message, hint) of one line."""
    problems = pb.check_requires(versions)
    if not problems:
        return None
    libs = list((pb.check or {}).get("against") or [])
    # the library (check.against) installed in a version outside the range: what changed is its findings
    out_of_range = [n for n in pb.requires if n in libs and versions.get(n) is not None
                    and any(p.startswith(f"{n} ") for p in problems)]
    msg = f"playbook {pb.name} does not cover this host: " + "; ".join(problems)
    if out_of_range and findings is not None:
        left = unfixed(pb, findings)
        if left:
            msg += f" (there: {what_changed(left)})"
        else:
            msg += " (no finding its edits do not fix; widen requires only with evidence: benchmarks/playbook_evidence.py)"
    target = host or "HOST"
    package = _package(pb)
    hint = (f"nothing was changed; `remote-ops check {target} --candidates` lists the {package} releases "
            f"and their findings against this host's {', '.join(libs) or 'libraries'}")
    return msg, hint


def _package(pb) -> str:
    mods = [p.module for p in pb.patches if p.module] + list((pb.check or {}).get("targets") or [])
    return mods[0].split(".")[0] if mods else "package"
