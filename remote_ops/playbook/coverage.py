"""What a playbook covers, and the one line for a host it does not: shared by ``patch`` and by
``extract``'s preflight (so a release past the range is refused before any change and before any
GPU time, with the same words).

The line names the version the host has and the range the playbook's ``requires`` states, then what
changed there (the host's findings that no edit of the playbook fixes: symbols gone, arguments that no
longer bind), and what to do: the playbooks found (playbook/search.py) that claim the host's library version (another
flow, e.g. the server flow of speculators 0.9.0 on vLLM 0.33.0), and ``remote-ops check HOST
--candidates``, which lists the package's releases with their own findings against this host's library. Pure: the check result is passed in.
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
    from remote_ops.agent.contract import DEFAULT_AGAINST
    # check.against; a server-flow playbook has no check section: the default library (vllm)
    libs = list((pb.check or {}).get("against") or [n for n in DEFAULT_AGAINST if n in pb.requires])
    # the library (check.against) installed in a version outside the range: what changed is its findings
    out_of_range = [n for n in pb.requires if n in libs and versions.get(n) is not None
                    and any(p.startswith(f"{n} ") for p in problems)]
    msg = f"playbook {pb.name} does not cover this host: " + "; ".join(problems)
    if out_of_range and findings is not None:
        left = unfixed(pb, findings)
        if left:
            msg += f" (there: {what_changed(left)})"
        else:
            script = "server_flow_evidence.py" if (pb.extract or {}).get("server") else "playbook_evidence.py"
            msg += f" (no finding its edits do not fix; widen requires only with evidence: benchmarks/evidence/{script})"
    target = host or "HOST"
    package = _package(pb)
    others = other_playbooks(pb, {n: versions.get(n) for n in libs if versions.get(n) is not None})
    # a playbook for the package release the host has first (another flow needs another release)
    others.sort(key=lambda o: bool([x for x in o.check_requires({package: versions.get(package)})
                                    if x.startswith(f"{package} ")]) if package in o.requires else True)
    way = "".join(f"; {o.name} claims {', '.join(f'{n} {versions[n]}' for n in libs if n in o.requires)} with "
                  + ", ".join(f"{k}{v}" for k, v in o.requires.items() if k not in libs)
                  + f" (then `remote-ops check {target} --playbook {o.name} --strict`)" for o in others)
    hint = (f"nothing was changed{way}; `remote-ops check {target} --candidates` lists the {package} releases "
            f"and their findings against this host's {', '.join(libs) or 'libraries'}")
    return msg, hint


def other_playbooks(pb, lib_versions: dict[str, str]) -> list:
    """The playbooks other than ``pb`` (along its search order: loader.available) whose ``requires``
    hold for the host's library versions (``lib_versions``; their other packages, e.g. another
    speculators, are what the host would install)."""
    if not lib_versions:
        return []
    from remote_ops.playbook.loader import available
    out = []
    for o in available(getattr(pb, "inventory_path", None)):
        mine = {k: v for k, v in lib_versions.items() if k in o.requires}
        problems = [x for x in o.check_requires(mine) if x.split(" ", 1)[0] in mine]
        if o.name != pb.name and mine and not problems:
            out.append(o)
    return out


def _package(pb) -> str:
    from remote_ops.agent.contract import DEFAULT_AGAINST, DEFAULT_PACKAGE
    mods = [p.module for p in pb.patches if p.module] + list((pb.check or {}).get("targets") or [])
    if mods:
        return mods[0].split(".")[0]
    top = DEFAULT_PACKAGE.split(".")[0]
    return top if top in pb.requires else next((k for k in pb.requires if k not in DEFAULT_AGAINST), "package")
