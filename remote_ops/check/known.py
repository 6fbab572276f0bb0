"""Per-release knowledge about model families: releases known to break a family (a regression that the
sources do not show, so no check can decide it), kept in ONE data file with its sources,
``remote_ops/check/known_breakages.yaml``, and reported by ``check --model`` as warnings naming the
release and the source."""

from __future__ import annotations

import functools
from pathlib import Path

DATA = Path(__file__).with_name("known_breakages.yaml")
KEYS = {"family", "library", "versions", "what", "source"}


@functools.lru_cache(maxsize=4)
def load(path: str = str(DATA)) -> tuple[dict, ...]:
    """The entries, checked: every key present, a valid specifier, a source that says something."""
    import yaml
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    doc = yaml.safe_load(Path(path).read_text()) or {}
    out = []
    for i, e in enumerate(doc.get("breakages") or []):
        missing = KEYS - set(e or {})
        if missing:
            raise ValueError(f"{path}: entry {i} lacks {', '.join(sorted(missing))}")
        try:
            SpecifierSet(e["versions"])
        except InvalidSpecifier as exc:
            raise ValueError(f"{path}: entry {i}: {exc}") from None
        if not str(e["source"]).strip():
            raise ValueError(f"{path}: entry {i} names no source")
        out.append(e)
    return tuple(out)


def warnings_for(model: dict, versions: dict, entries=None) -> list[dict]:
    """Warnings for a model preflight record (its model_type and architectures) and the host's versions."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    archs = set(model.get("architectures") or [])
    mtype = model.get("model_type")
    out = []
    for e in load() if entries is None else entries:
        fam = e["family"]
        if mtype not in (fam.get("model_type") or []) and not archs & set(fam.get("architectures") or []):
            continue
        have = versions.get(e["library"])
        try:
            hit = have is not None and Version(str(have)) in SpecifierSet(e["versions"])
        except InvalidVersion:
            hit = False
        if hit:
            out.append({"library": e["library"], "version": str(have), "what": e["what"],
                        "source": " ".join(str(e["source"]).split()),
                        "message": f"{e['library']} {have}: {e['what']}"})
    return out
