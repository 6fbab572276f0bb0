"""The model preflight, controller side: the playbook's ``check.model`` section filled for a host
(its vars: ``target_model``, ``layer_ids``), the agent request (``model_check.check``, in the same
round trip as the call-site check or the extract preflight), and how its answer reads.

    check:
      model:
        path: "{vars.target_model}"         # checkpoint directory (or HF id) the job loads
        layer_ids: "{vars.layer_ids}"       # "2,4,5,7", a list, or empty: the package's default
        default_layer_ids: [2, "n // 2", "n - 3", "n - 1"]   # that default, a formula of n layers
        protocol: vllm.model_executor.models.interfaces.SupportsEagle3   # what the worker asks for
        worker: speculators.data_generation.custom_worker    # module whose bound forward needs the text model
        text_model: [model, language_model.model]            # paths the (patched) worker may take

What the worker uses of the text model (attributes, how it calls the decoder layers) is read from the
installed worker's own source on the host, so a patch that changes it changes the check.
"""

from __future__ import annotations

from typing import Any

from remote_ops.connect import agent_requests as rq
from remote_ops.errors import UsageError
from remote_ops.playbook.model_section import parse_layer_ids


def request(playbook, host, *, model: str | None = None, layer_ids: Any = None):
    """The agent request for ``host``, or None when the playbook has no ``check.model`` (or no model is
    known: neither ``model`` nor the var the section names). ``model``/``layer_ids`` override the vars."""
    section = (getattr(playbook, "check", None) or {}).get("model") if playbook is not None else None
    if not section:
        if model:
            raise UsageError("--model needs a playbook with a check.model section (what the worker needs)",
                             "pass --playbook eagle3-speculators-0.3.0, or give the host a playbook")
        return None
    from remote_ops.playbook.templates import fill_for_host
    path = model or fill_for_host(playbook, host, section.get("path"), ("check", "model", "path"))
    if not path:
        return None
    ids = layer_ids if layer_ids is not None else \
        fill_for_host(playbook, host, section.get("layer_ids"), ("check", "model", "layer_ids"))
    return rq.model_check(model=str(path), library=section.get("library") or "vllm",
                          layer_ids=parse_layer_ids(ids, f"{host.name}"),
                          default_layer_ids=list(section.get("default_layer_ids") or []),
                          protocol=section.get("protocol") or rq._UNSET, worker=section.get("worker") or rq._UNSET,
                          tokenizer_loader=section.get("tokenizer_loader") or rq._UNSET,
                          text_model=list(section.get("text_model") or []),
                          workdir=host.workdir or rq._UNSET)


def missing_as_unknown(m: dict) -> None:
    """``check`` of a playbook's model var: a model directory that is not on the host is listed as not
    checked (what to set), not as a finding; ``extract`` refuses it."""
    gone = [f for f in m.get("findings") or [] if f.get("kind") == "model-missing"]
    if gone:
        m["findings"] = [f for f in m["findings"] if f.get("kind") != "model-missing"]
        m.setdefault("unknown", []).extend(
            {"what": "model", "reason": f"{f['message']}: set the var target_model to the checkpoint the job "
                                        "loads (or pass --model)"} for f in gone)


def explain(f: dict) -> str:
    where = f"{f['path']}:{f['line']}: " if f.get("line") else (f"{f['path']}: " if f.get("path") else "")
    return f"{where}{f['kind']}: {f['message']}"


def summary(m: dict) -> str:
    """One line: what was checked of the model."""
    if not m:
        return ""
    cls = (m.get("class") or {}).get("symbol") or "?"
    text = m.get("text_model") or {}
    parts = [f"model {m.get('model')}: {m.get('architecture') or ', '.join(m.get('architectures') or []) or '?'}"
             f" -> {cls.rsplit('.', 1)[-1]}"]
    if text:
        parts.append(f"text model .{text['path']} ({text['symbol'].rsplit('.', 1)[-1]})")
    if m.get("layer_ids") is not None:
        parts.append(f"layers {m['layer_ids']} of {m.get('num_layers')} ({m.get('layer_ids_source')})")
    parts.append(f"{len(m.get('findings') or [])} finding(s), {len(m.get('unknown') or [])} unknown")
    return "; ".join(parts)
