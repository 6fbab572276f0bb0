"""Did-you-mean: the closest known word to a mistyped one (commands, hosts, groups)."""

from __future__ import annotations

import difflib
from typing import Iterable


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The best near miss of ``word`` among ``candidates``, or None when nothing is close."""
    cands = sorted(set(c for c in candidates if c))
    if not cands or not word:
        return None
    lower = {c.lower(): c for c in cands}
    if word.lower() in lower:                      # only the case differs
        return lower[word.lower()]
    prefixed = [c for c in cands if c.startswith(word) and len(word) >= 2]
    if len(prefixed) == 1:                         # an unambiguous abbreviation
        return prefixed[0]
    found = difflib.get_close_matches(word, cands, n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    best = closest(word, candidates)
    return f"did you mean {best!r}?" if best else None
