"""Static evidence for playbooks/eagle3-speculators-0.9.0.yaml (the server flow), from the real wheels.

Writes benchmarks/SERVER_FLOW_EVIDENCE.md and benchmarks/results/server_flow_evidence.json. Nothing is
imported: vLLM's and speculators' sources are read (pkgsource: the wheels from PyPI, cached) with the
project's static resolver (agent/compat.py op_inspect: parameters of classes and functions) and exact
text checks. Three questions:

1. Which speculators release is the newest whose declared requirements hold on the lent GPU machines
   (Python 3.12, torch 2.11.0, transformers 5.17.0), and which releases have the server-flow client?
2. For each vLLM release: does it have every server-side piece the flow needs (the speculative method
   ``extract_hidden_states``, ExampleHiddenStatesConnector registered, what it writes and returns, the
   request/response fields speculators' client reads, the /health route, the ``vllm.entrypoints.cli.main``
   entry point) and does every flag of the playbook's server command name a parameter of EngineArgs or
   FrontendArgs? ``requires.vllm`` must be exactly the checked releases where all hold.
3. Does speculators 0.9.0's client take the options the playbook passes, and write the layout
   (hs_<i>.safetensors) its training reads?

    python benchmarks/server_flow_evidence.py                 # the releases below (downloads what is missing)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PLAYBOOK = REPO / "playbooks" / "eagle3-speculators-0.9.0.yaml"
SPECULATORS = ["0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.9.0"]
VLLM = ["0.11.0", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1",
        "0.20.2", "0.21.0"]
MACHINE = {"python": "3.12.3", "torch": "2.11.0", "transformers": "5.17.0"}   # ../shared/GPU-NOTES.md

CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"
PROTOCOLS = ("vllm.entrypoints.openai.completion.protocol", "vllm.entrypoints.openai.protocol")
# what the flow needs of each class (parameters the playbook's server command or the client use)
NEEDS = {
    "vllm.engine.arg_utils:EngineArgs": {"model", "speculative_config", "kv_transfer_config"},
    "vllm.config.speculative:SpeculativeConfig": {"method", "num_speculative_tokens", "draft_model_config"},
    "vllm.config.kv_transfer:KVTransferConfig": {"kv_connector", "kv_role", "kv_connector_extra_config"},
    "CompletionRequest": {"model", "prompt", "max_tokens", "return_token_ids"},
    "CompletionResponseChoice": {"prompt_token_ids", "token_ids"},
    "CompletionResponse": {"choices", "kv_transfer_params"},
}


def params(src: Path, symbols: list[str]) -> dict[str, dict]:
    from remote_ops.agent import compat
    res = compat.op_inspect({"symbols": symbols, "sys_path": [str(src)]})
    out = {}
    for rec in res["symbols"]:
        if rec.get("kind") in ("class", "function") and "parameters" in rec:
            out[rec["symbol"]] = {"names": [p["name"] for p in rec["parameters"]]}
        else:
            out[rec["symbol"]] = {"missing": rec.get("reason") or rec.get("kind")}
    return out


def text(src: Path, rel: str) -> str | None:
    p = src / rel
    return p.read_text(errors="replace") if p.is_file() else None


def server_flags() -> list[str]:
    from remote_ops.connect.inventory import Host
    from remote_ops.extract import jobs
    from remote_ops.playbook import loader as playbook
    spec = jobs.parse_spec(playbook.load(str(PLAYBOOK)), Host(name="evidence", hostname="h", python="python3"))
    return [a for a in spec.server.command if a.startswith("--")]


def vllm_row(version: str, flags: list[str]) -> dict:
    from remote_ops import pkgsource
    src = pkgsource.unpacked("vllm", version)
    checks: dict[str, bool | str] = {}
    spec_src = text(src, "vllm/config/speculative.py") or ""
    checks["method extract_hidden_states (config/speculative.py)"] = '"extract_hidden_states"' in spec_src
    checks["v1/spec_decode/extract_hidden_states.py"] = (src / "vllm/v1/spec_decode/extract_hidden_states.py").is_file()
    checks["model_executor/models/extract_hidden_states.py reads eagle_aux_hidden_state_layer_ids"] = \
        "eagle_aux_hidden_state_layer_ids" in (text(src, "vllm/model_executor/models/extract_hidden_states.py") or "")
    factory = text(src, "vllm/distributed/kv_transfer/kv_connector/factory.py") or ""
    checks["ExampleHiddenStatesConnector registered (kv_connector/factory.py)"] = \
        bool(re.search(r'register_connector\(\s*"ExampleHiddenStatesConnector"', factory))
    conn = text(src, CONNECTOR) or ""
    checks["connector reads shared_storage_path"] = '"shared_storage_path"' in conn
    checks["connector writes hidden_states + token_ids (safetensors)"] = \
        '"hidden_states":' in conn and '"token_ids":' in conn and "save_file" in conn
    checks["connector returns kv_transfer_params.hidden_states_path"] = \
        bool(re.search(r'return False, \{"hidden_states_path": ', conn))
    health = any('"/health"' in (p.read_text(errors="replace")) for p in (src / "vllm/entrypoints").rglob("*.py"))
    checks["GET /health route"] = health
    checks["vllm.entrypoints.cli.main + serve"] = (src / "vllm/entrypoints/cli/main.py").is_file() and \
        (src / "vllm/entrypoints/cli/serve.py").is_file()
    # request / response fields and the server's flags, by the static resolver
    proto = next((m for m in PROTOCOLS if (src / (m.replace(".", "/") + ".py")).is_file()), PROTOCOLS[-1])
    symbols = {k if ":" in k else f"{proto}:{k}": need for k, need in NEEDS.items()}
    frontend = "vllm.entrypoints.openai.cli_args:FrontendArgs"
    got = params(src, list(symbols) + [frontend])
    for sym, need in symbols.items():
        g = got[sym]
        missing = sorted(need - set(g.get("names") or [])) if "names" in g else ["(" + str(g["missing"]) + ")"]
        checks[f"{sym.split(':')[1]} has {', '.join(sorted(need))}"] = True if not missing else \
            "missing " + ", ".join(missing)
    known = set(got["vllm.engine.arg_utils:EngineArgs"].get("names") or []) | set(got[frontend].get("names") or [])
    unknown = [f for f in flags if f[2:].replace("-", "_") not in known]
    checks["every flag of the playbook's server command is an EngineArgs/FrontendArgs parameter"] = \
        True if not unknown and known else "unknown: " + ", ".join(unknown or ["(no parameters found)"])
    ok = all(v is True for v in checks.values())
    return {"version": version, "ok": ok, "checks": checks}


def speculators_row(version: str) -> dict:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from remote_ops import pkgsource
    src = pkgsource.unpacked("speculators", version)
    meta = next(src.glob("speculators-*.dist-info/METADATA")).read_text(errors="replace")
    reqs = {}
    for line in meta.splitlines():
        m = re.match(r"Requires-Dist: (torch|transformers)\b([^;]*)$", line)
        if m:
            reqs[m.group(1)] = m.group(2).strip().strip("()")
        m = re.match(r"Requires-Python: (.*)$", line)
        if m:
            reqs["python"] = m.group(1).strip()
    fits = {k: Version(MACHINE[k]) in SpecifierSet(reqs.get(k, "")) for k in MACHINE}
    client = text(src, "speculators/data_generation/vllm_client.py") or ""
    cli = text(src, "speculators/cli/generate_offline_data.py")
    return {"version": version, "requires": reqs, "fits_lent_machine": fits, "runs_there": all(fits.values()),
            "server_flow_client": bool(client) and "hidden_states_path" in client and "prompt_token_ids" in client,
            "generate_offline_data_cli": cli is not None,
            "writes_hs_safetensors": bool(cli) and 'f"hs_{idx}.safetensors"' in cli}


def client_checks() -> dict:
    from remote_ops import pkgsource
    src = pkgsource.unpacked("speculators", "0.9.0")
    hsc = pkgsource.unpacked("hs-connectors", "0.9.0")
    need = {"endpoint", "preprocessed_data", "output", "max_samples", "concurrency", "validate_outputs"}
    got = params(src, ["speculators.cli.generate_offline_data:generate_offline_data"])
    names = set(next(iter(got.values())).get("names") or [])
    transfer = text(hsc, "hs_connectors/transfer.py") or ""
    client = text(src, "speculators/data_generation/vllm_client.py") or ""
    return {
        "generate_offline_data takes " + ", ".join(sorted(need)): True if need <= names else
        "missing " + ", ".join(sorted(need - names)),
        "client sends prompt token ids with return_token_ids and max_tokens=1":
            '"return_token_ids": True' in client and "max_tokens=1" in client,
        "client checks choices[0].prompt_token_ids and reads kv_transfer_params hidden_states_path":
            'getattr(response.choices[0], "prompt_token_ids"' in client and '"hidden_states_path"' in client,
        "training reads <data>/hidden_states/hs_<i>.safetensors (hs_connectors 0.9.0 FileTransfer)":
            'f"hs_{file_idx}.safetensors"' in transfer and '"hidden_states"' in transfer,
        "hs-connectors 0.9.0's file backend asks vLLM for ExampleHiddenStatesConnector + shared_storage_path":
            '"kv_connector": "ExampleHiddenStatesConnector"' in transfer and '"shared_storage_path"' in transfer,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", default=",".join(VLLM))
    ap.add_argument("--speculators", default=",".join(SPECULATORS))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "SERVER_FLOW_EVIDENCE.md"))
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "server_flow_evidence.json"))
    args = ap.parse_args(argv)
    t0 = time.time()
    from remote_ops.playbook import loader as playbook
    pb = playbook.load(str(PLAYBOOK))
    flags = server_flags()
    spec_rows = [speculators_row(v) for v in args.speculators.split(",") if v]
    vllm_rows = [vllm_row(v, flags) for v in args.vllm.split(",") if v]
    client = client_checks()
    from packaging.specifiers import SpecifierSet
    claimed = SpecifierSet(pb.requires["vllm"])
    passing = [r["version"] for r in vllm_rows if r["ok"]]
    in_claim = [r["version"] for r in vllm_rows if r["version"] in claimed]
    newest = max((r for r in spec_rows if r["runs_there"] and r["server_flow_client"]),
                 key=lambda r: tuple(map(int, r["version"].split("."))), default=None)
    doc = {"generated_by": "python benchmarks/server_flow_evidence.py",
           "generated_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": round(time.time() - t0, 1),
           "machine": MACHINE, "speculators": spec_rows, "newest_speculators_for_the_machine":
           newest and newest["version"], "vllm": vllm_rows, "server_flags": flags, "client_0_9_0": client,
           "requires": pb.requires, "claimed_and_checked": in_claim, "passing": passing,
           "requires_matches_evidence": in_claim == passing and all(client.get(k) is True for k in client)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    Path(args.out).write_text(render(doc))
    print(render(doc))
    return 0 if doc["requires_matches_evidence"] else 1


def render(doc: dict) -> str:
    yes = lambda v: "yes" if v is True else ("no" if v is False else f"no: {v}")   # noqa: E731
    L = ["# Server-flow evidence (playbooks/eagle3-speculators-0.9.0.yaml)", "",
         f"Generated by `{doc['generated_by']}` at {doc['generated_at']} ({doc['seconds']} s), from the real wheels "
         "(sources read, nothing imported). Static only: a GPU run is benchmarks/gpu_server_check.py.", "",
         "## Which speculators release", "",
         f"Lent GPU machines: Python {doc['machine']['python']}, torch {doc['machine']['torch']}, "
         f"transformers {doc['machine']['transformers']}.", "",
         "| speculators | Requires-Python | torch | transformers | fits the machine | server-flow client | "
         "generate-offline-data (hs_<i>.safetensors) |", "|---|---|---|---|---|---|---|"]
    for r in doc["speculators"]:
        q = r["requires"]
        L.append(f"| {r['version']} | {q.get('python', '')} | {q.get('torch', '')} | {q.get('transformers', '')} | "
                 f"{'yes' if r['runs_there'] else 'no (' + ', '.join(k for k, v in r['fits_lent_machine'].items() if not v) + ')'} | "
                 f"{yes(r['server_flow_client'])} | {yes(r['generate_offline_data_cli'] and r['writes_hs_safetensors'])} |")
    L += ["", f"Newest release that fits and has the client: **{doc['newest_speculators_for_the_machine']}**.", "",
          "## vLLM: the server side", "",
          f"The playbook's server flags: {', '.join('`' + f + '`' for f in doc['server_flags'])}.", ""]
    names = list(doc["vllm"][0]["checks"]) if doc["vllm"] else []
    L.append("| check | " + " | ".join(r["version"] for r in doc["vllm"]) + " |")
    L.append("|---|" + "---|" * len(doc["vllm"]))
    for n in names:
        L.append(f"| {n} | " + " | ".join(yes(r["checks"].get(n)) for r in doc["vllm"]) + " |")
    L.append("| **all** | " + " | ".join("**yes**" if r["ok"] else "no" for r in doc["vllm"]) + " |")
    L += ["", "## speculators 0.9.0's client", ""]
    for k, v in doc["client_0_9_0"].items():
        L.append(f"- {k}: {yes(v)}")
    L += ["", "## requires", "",
          f"The playbook claims `vllm{doc['requires']['vllm']}`, `speculators{doc['requires']['speculators']}`. "
          f"Checked releases inside the claim: {', '.join(doc['claimed_and_checked']) or 'none'}; releases where "
          f"every check holds: {', '.join(doc['passing']) or 'none'}. "
          + ("They are the same." if doc["requires_matches_evidence"] else "**They differ.**"), ""]
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
