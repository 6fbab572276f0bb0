"""A part of README.md kept between two marker comments, read or written anew by the script that renders it
(render/versions_table.py, render/throughput_table.py, controller/scale.py, controller/dataset_memory.py)."""
from __future__ import annotations


def read(text: str, start: str, end: str) -> str | None:
    """What stands between the markers (without the newlines beside them), or None without both markers."""
    if start not in text or end not in text:
        return None
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n")


def replace(text: str, start: str, end: str, body: str) -> str | None:
    """``text`` with ``body`` between the markers (the markers kept, each on its own line), or None without both."""
    if read(text, start, end) is None:
        return None
    head, rest = text.split(start, 1)
    return head + start + "\n" + body + "\n" + end + rest.split(end, 1)[1]
