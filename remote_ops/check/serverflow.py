"""The server flow's part of ``check``, controller side: the request for the agent op
``serverflow.check`` (remote_ops/agent/serverflow.py) built from a playbook's ``extract.server``, and
its answer turned into findings and unknowns.

A server-flow playbook (speculators >= 0.5: the hidden states come from a vLLM server) patches nothing,
and speculators' modules call no vLLM function, so the call-site check has nothing to bind there. What
the flow needs of vLLM is the server's: that op checks it on the host's own vLLM.
"""

from __future__ import annotations

from remote_ops.connect import agent_requests as rq

# What speculators 0.9.0's client (speculators/data_generation/vllm_client.py) sends and reads, by
# class of vLLM's OpenAI protocol module: the prompt token ids with return_token_ids and max_tokens=1,
# then choices[0].prompt_token_ids and kv_transfer_params.hidden_states_path
# (benchmarks/evidence/server_flow_evidence.py checks these against the client's source).
CLIENT_FIELDS = {
    "CompletionRequest": ["model", "prompt", "max_tokens", "return_token_ids"],
    "CompletionResponseChoice": ["prompt_token_ids", "token_ids"],
    "CompletionResponse": ["choices", "kv_transfer_params"],
}


def request(command: list[str] | None, model: str | None = None, client_command: list[str] | None = None):
    """The ``serverflow.check`` request for a server command as filled for the host
    (``extract.extract_spec.server_command``); None when the playbook has no server. ``model``
    (``check --model``) replaces the model the command serves (``serve MODEL``). ``client_command``
    (``extract_spec.client_command``): its timeout and concurrency decide the ``abort-safe`` check."""
    if command is None:
        return None
    import re
    if model:
        command = list(command)
        if "serve" in command and command.index("serve") + 1 < len(command) and \
                not command[command.index("serve") + 1].startswith("-"):
            command[command.index("serve") + 1] = model
        else:
            command += ["--model", model]
    # the server's interpreter (the command's first word when it is a python, as extract.ServerSpec.python):
    # its vLLM is the one checked
    python = command[0] if re.search(r"(^|/)python[0-9.]*$", command[0]) else rq._UNSET
    return rq.serverflow_check(command=list(command), client={k: list(v) for k, v in CLIENT_FIELDS.items()},
                               python=python,
                               client_command=list(client_command) if client_command else rq._UNSET)


def summarize(raw: dict, playbook: str | None) -> dict:
    """The record's ``server_flow``: the op's checks, the failed ones as findings, the undecided ones."""
    checks = raw.get("checks") or []
    return {"playbook": playbook, "library": raw.get("library"), "checks": checks,
            "checked": sum(1 for c in checks if c.get("ok") is not None),
            "findings": [c for c in checks if c.get("ok") is False and c.get("severity") != "warning"],
            "warnings": [c for c in checks if c.get("ok") is False and c.get("severity") == "warning"],
            "unknown": [c for c in checks if c.get("ok") is None]}


def explain(c: dict) -> str:
    where = f"{c['where']}: " if c.get("where") else ""
    return f"server flow: {where}{c['what']}: {c.get('detail') or 'no'}"


def preflight_lines(raw: dict) -> tuple[list[str], list[str]]:
    """extract's preflight of a server-flow job: (problems, notes). The served model's checks
    (``SERVED_MODEL_CHECKS`` of agent/contract.py: custom code without --trust-remote-code, layer ids the
    model's forward does not capture) refuse the job, warning or not: the server would fail after
    loading the model. The other failed checks are notes (``check --strict`` says them as findings)."""
    from remote_ops.agent.contract import SERVED_MODEL_CHECKS as MODEL_CHECKS
    problems, notes = [], []
    for c in raw.get("checks") or []:
        line = explain(c) + (f" (fix: {c['fix']})" if c.get("fix") else "")
        if c.get("ok") is False:
            (problems if c["id"] in MODEL_CHECKS else notes).append(line)
        elif c.get("ok") is None:
            notes.append("not checked: " + line)
    return problems, notes
