"""The playbook's ``check.model`` section validated at load time, and the ``layer_ids`` a host's vars give
(the request built from them and how its answer reads: ``check/model.py``)."""

from __future__ import annotations

import re
from typing import Any

from remote_ops.errors import UsageError


MODEL_KEYS = ("path", "layer_ids", "default_layer_ids", "protocol", "worker", "text_model", "library",
              "tokenizer_loader")


_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_section(doc, raw) -> dict | None:
    """``check.model`` validated at load time (file:line errors); templates stay for each host."""
    if raw is None:
        return None
    keys = ("check", "model")
    if not isinstance(raw, dict):
        raise doc.error(keys, "check.model must be a mapping (path, layer_ids, protocol, worker, text_model...)")
    doc.check_keys(keys, raw, MODEL_KEYS, "in check.model")
    for k in ("protocol", "worker", "library", "tokenizer_loader"):
        v = raw.get(k)
        if v is not None and not (isinstance(v, str) and _DOTTED.match(v)):
            raise doc.error(keys + (k,), f"check.model.{k} must be a dotted name, got {v!r}")
    paths = raw.get("text_model") or []
    if not isinstance(paths, list) or not all(isinstance(p, str) and _DOTTED.match(p) for p in paths):
        raise doc.error(keys + ("text_model",), "check.model.text_model must be a list of attribute paths")
    formula = raw.get("default_layer_ids") or []
    if not isinstance(formula, list) or not all(
            (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, str) and re.fullmatch(r"[n0-9+\-*/ ()]+", x))
            for x in formula):
        raise doc.error(keys + ("default_layer_ids",),
                        "check.model.default_layer_ids must be a list of integers or formulas of n (e.g. \"n // 2\")")
    return dict(raw)


def parse_layer_ids(value: Any, where: str) -> list[int] | None:
    """"2,4,5,7", [2, 4, 5, 7], "" or None (the package's default)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "default")):
        return None
    items = value if isinstance(value, list) else str(value).replace(" ", ",").split(",")
    out = []
    for x in items:
        if x == "":
            continue
        try:
            n = int(x)
        except (TypeError, ValueError):
            raise UsageError(f"{where}: layer ids {value!r}: {x!r} is not a layer index",
                             "write them like 2,4,5,7") from None
        out.append(n)
    twice = sorted({n for n in out if out.count(n) > 1})
    if twice:      # a layer captured twice is the same tensor twice: never what was meant
        raise UsageError(f"{where}: layer ids {value!r} repeat {', '.join(map(str, twice))}",
                         "list each layer id once, e.g. 2,4,5,7")
    return out or None
