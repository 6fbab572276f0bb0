"""Playbook templates, filled for one host: ``{vars.NAME}`` (host vars over playbook vars),
``{python}``, ``{host}``, and those the extract spec adds (``{workdir}``, ``{output_dir}``, ``{port}``).
Used by the extract spec (extract/extract_spec.py) and the model preflight's section (check/model.py).
"""

from __future__ import annotations

import re
from typing import Any

_WHOLE_VAR = re.compile(r"^\{(vars\.[A-Za-z_][A-Za-z0-9_]*)\}$")
_TEMPLATE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")
_BUILTINS = ("python", "host", "workdir", "output_dir", "port")


def _fill(value: str, ctx: dict, err) -> str:
    def sub(m):
        name = m.group(1)
        if name in ctx:
            found = str(ctx[name])
            if name.startswith("vars.") and "{" in found:
                # a var's value may use the built-in templates ({python}: a server's interpreter that
                # defaults to the host's), once; vars inside vars are not expanded
                found = _TEMPLATE.sub(lambda v: str(ctx[v.group(1)]) if v.group(1) in _BUILTINS
                                      and v.group(1) in ctx else v.group(0), found)
            return found
        if name.startswith("vars."):
            known = sorted(k[5:] for k in ctx if k.startswith("vars."))
            raise err(f"{{{name}}} is not a var of this host or playbook",
                      f"known vars: {', '.join(known) or 'none'} (set them under the host's 'vars:')")
        raise err(f"unknown template {{{name}}}",
                  "known: {vars.NAME}, {output_dir}, {workdir}, {python}, {host}, {port} (with extract.server)")
    return _TEMPLATE.sub(sub, value)


def template_context(playbook, host) -> dict[str, Any]:
    """What templates are filled from on ``host``: ``vars.NAME`` (host vars over playbook vars),
    ``python``, ``host``."""
    pb_vars = (playbook.doc.data or {}).get("vars") if playbook.doc else None
    variables = dict(pb_vars or {}) if isinstance(pb_vars, dict) else {}
    variables.update(host.vars or {})
    ctx: dict[str, Any] = {f"vars.{k}": v for k, v in variables.items()}
    ctx["python"] = host.python or "python3"   # unset: the agent runs with the login shell's PATH
    ctx["host"] = host.name
    return ctx


def fill_for_host(playbook, host, value, keys: tuple):
    """A playbook value outside ``extract:`` filled for ``host``: exactly ``{vars.NAME}`` is the var's
    value as it is; other strings have their templates filled (errors name ``keys``' line)."""
    if not isinstance(value, str):
        return value
    ctx = template_context(playbook, host)
    m = _WHOLE_VAR.match(value)
    if m and m.group(1) in ctx:
        return ctx[m.group(1)]
    return _fill(value, ctx, lambda problem, hint=None: playbook.error(keys, problem, hint))


