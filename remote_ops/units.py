"""Sizes for people: the one byte formatter of the controller (facts, extract's disk preflight)."""

from __future__ import annotations


def human_bytes(n: float | None) -> str:
    """``1536`` -> ``1.5 KiB``; whole bytes below 1 KiB; ``?`` for unknown."""
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"   # not reached: TiB takes every size from 1024 GiB up


def fmt_duration(s: float | None) -> str:
    """Seconds as 1h02m05s / 3m07s / 42s ("?" when unknown): the one duration formatter."""
    if s is None:
        return "?"
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")
