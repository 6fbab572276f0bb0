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

    python benchmarks/evidence/server_flow_evidence.py        # 0.11.0 and every release 0.16.0-0.33.0 (downloads what is missing)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402

PLAYBOOKS = [REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.9.0.yaml",
             REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.9.0-no-chunked-prefill.yaml"]
PLAYBOOK = PLAYBOOKS[0]
SPECULATORS = ["0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.9.0"]
FIRST, LAST = "0.16.0", "0.33.0"       # every release from FIRST to LAST on PyPI (patch releases included)
MACHINE = {"python": "3.12.3", "torch": "2.11.0", "transformers": "5.17.0"}   # ../shared/GPU-NOTES.md


def vllm_releases() -> list[str]:
    """0.11.0 (speculators 0.3.0's pin, for contrast) and every final release FIRST..LAST on PyPI."""
    from packaging.version import Version

    from remote_ops import pkgsource
    return ["0.11.0"] + [v for v in pkgsource.releases("vllm") if Version(FIRST) <= Version(v) <= Version(LAST)]


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


def server_command(path: Path) -> list[str]:
    from remote_ops.connect.inventory import Host
    from remote_ops.extract.extract_spec import server_command as filled
    from remote_ops.playbook import loader as playbook
    return filled(playbook.load(str(path)), Host(name="evidence", hostname="h", python="python3"))


def client_command(path: Path) -> list[str]:
    """The playbook's client command, filled as for a host (the abort-safe check reads its timeout)."""
    from remote_ops.connect.inventory import Host
    from remote_ops.extract.extract_spec import client_command as filled
    from remote_ops.playbook import loader as playbook
    return filled(playbook.load(str(path)), Host(name="evidence", hostname="h", python="python3"))


# vLLM's own bugs the server flow guards against (issue 50), checked per release on a variant of the command:
# (check id, bug, what the shipped playbooks do about it)
GUARDS = (("prefix-caching", "#44485 short states with prefix caching", "--no-enable-prefix-caching"),
          ("abort-safe", "#56841 an aborted queued request kills the server", "--request-timeout"),
          ("mla-tp-page-size", "#51016 MLA page size at TP > 1 (fix #50894)", None),
          ("mla-kv-groups", "MLA KV cache groups ('MLA verifiers are unsupported')", None),
          ("last-chunk", "a chunked prompt's last chunk without new blocks left unwritten", "--no-enable-chunked-prefill"))
MLA_CONFIG = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "kv_lora_rank": 512,
              "num_hidden_layers": 61, "hidden_size": 7168}


def _drop(command: list[str], flag: str, takes_value: bool) -> list[str]:
    out, skip = [], False
    for a in command:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = takes_value
            continue
        out.append(a)
    return out


def guards(src: Path, command: list[str], client: list[str]) -> dict:
    """Per guard: its outcome WITHOUT the shipped guard (the command less --no-enable-prefix-caching, the client
    less --request-timeout: its default then, chunked prefill on as in the first playbook), and the MLA checks for a DeepSeek-V3-shaped checkpoint (config.json
    with kv_lora_rank) at --tensor-parallel-size 8: {id: {"bug", "guard", "ok", "detail"}}. ok False: the release
    has the bug and the guard is what holds it; None: the source does not decide it; True: not there."""
    import tempfile

    from remote_ops.agent import serverflow as agent_sf
    from remote_ops.check import serverflow
    out = {}
    bare = _drop(command, agent_sf.NO_PREFIX, False)
    res = agent_sf.op_check({"command": bare, "client": serverflow.CLIENT_FIELDS, "sys_path": [str(src)],
                             "client_command": _drop(client, agent_sf.CLIENT_TIMEOUT, True)})
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(MLA_CONFIG))
        mla = list(command)
        i = mla.index("serve") + 1 if "serve" in mla else None
        if i is not None:
            mla[i] = tmp
        mla = _drop(mla, "--tensor-parallel-size", True) + ["--tensor-parallel-size", "8"]
        res_mla = agent_sf.op_check({"command": mla, "client": serverflow.CLIENT_FIELDS, "sys_path": [str(src)],
                                     "client_command": client})
    checks = {c["id"]: c for c in res["checks"] if c["id"] in ("prefix-caching", "abort-safe", "last-chunk")}
    checks.update({c["id"]: c for c in res_mla["checks"] if c["id"] in ("mla-tp-page-size", "mla-kv-groups")})
    for cid, bug, guard in GUARDS:
        c = checks.get(cid)
        if c is not None:
            out[cid] = {"bug": bug, "guard": guard, "ok": c["ok"], "detail": c.get("detail"), "where": c.get("where")}
    return out


def server_flags(path: Path = PLAYBOOK) -> list[str]:
    return [a for a in server_command(path) if a.startswith("--")]


def vllm_row(version: str, commands: dict[str, list[str]], clients: dict[str, list[str]] | None = None) -> dict:
    """The agent op serverflow.check (what `remote-ops check HOST --playbook ...` runs on a host) over
    the release's unpacked sources, once per playbook's server command (with its client command)."""
    from remote_ops import pkgsource
    from remote_ops.agent import serverflow as agent_sf
    from remote_ops.agent.contract import SERVED_MODEL_CHECKS
    from remote_ops.check import serverflow
    src = pkgsource.unpacked("vllm", version)
    per = {}
    for name, command in commands.items():
        res = agent_sf.op_check({"command": command, "client": serverflow.CLIENT_FIELDS, "sys_path": [str(src)],
                                 **({"client_command": clients[name]} if clients and clients.get(name) else {})})
        # the checks of the served model (remote code, layer ids) are about the user's checkpoint, which the
        # evidence has none of (the playbook's default target_model): what a release supports is the rest
        res["checks"] = [c for c in res["checks"] if c["id"] not in SERVED_MODEL_CHECKS]
        checks = {c["what"]: (True if c["ok"] is True else (c.get("detail") or "undecided")) for c in res["checks"]}
        per[name] = {"ok": all(v is True for v in checks.values()), "checks": checks,
                     "failed": [dict(c) for c in res["checks"] if c["ok"] is not True]}
    first = next(iter(commands))
    return {"version": version, "playbooks": per, "aux_capture": aux_capture(src),
            "guards": guards(src, commands[first], (clients or {}).get(first) or [])}


# the text models whose forward gathers the aux hidden states: DeepSeek-V2/V3 (Kimi-K2.5's text model) and Llama
AUX_MODULES = ("deepseek_v2", "llama")


def aux_capture(src: Path) -> dict:
    """Per model module: which aux layer ids its forward meets (agent/check/auxcapture.py, the code of the
    server flow's aux-layer-ids check): the shape, whether id num_hidden_layers is met, and where."""
    from remote_ops.agent.check.auxcapture import capture
    out = {}
    for m in AUX_MODULES:
        rel = f"vllm/model_executor/models/{m}.py"
        got = capture(rel, text(src, rel) or "")
        out[m] = got if not isinstance(got, dict) else {
            "class": got["class"], "shape": got["shape"], "last_id": got["last_id"],
            "where": f"{rel}:{got['last_line'] or got['line']}", "first_id_adds_none": got["first_id_adds_none"]}
    return out


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
    # the playbooks' options, and world_size/rank, which run_clients.py appends when the var clients > 1
    need = {"endpoint", "preprocessed_data", "output", "max_samples", "concurrency", "validate_outputs",
            "world_size", "rank"}
    got = params(src, ["speculators.cli.generate_offline_data:generate_offline_data"])
    names = set(next(iter(got.values())).get("names") or [])
    transfer = text(hsc, "hs_connectors/transfer.py") or ""
    client = text(src, "speculators/data_generation/vllm_client.py") or ""
    cli = text(src, "speculators/cli/__init__.py") or ""
    main = text(src, "speculators/__main__.py") or ""
    prep = text(src, "speculators/cli/prepare_data.py") or ""
    gen = text(src, "speculators/cli/generate_offline_data.py") or ""
    entry = text(next(src.glob("speculators-*.dist-info")), "entry_points.txt") or ""
    return {
        "`python -m speculators` and the `speculators` console script run the typer app (speculators/__main__.py)":
            "from speculators.cli import app" in main and "app()" in main and "speculators = speculators.__main__:app" in entry,
        "the app has the commands prepare-data and generate-offline-data (speculators/cli/__init__.py)":
            "app.command(rich_help_panel=\"Pipeline\")(prepare_data)" in cli
            and "app.command(rich_help_panel=\"Pipeline\")(generate_offline_data)" in cli,
        "prepare-data writes an Arrow dataset to --output (dataset.save_to_disk(output)), token_freq.pt beside it":
            "dataset.save_to_disk(output)" in prep and '"token_freq.pt"' in prep,
        "generate-offline-data loads that directory (load_from_disk(preprocessed_data))":
            "load_from_disk(preprocessed_data)" in gen,
        "its default --output is <preprocessed-data>/hidden_states, the playbook's output_dir":
            'Path(preprocessed_data) / "hidden_states"' in gen,
        "generate_offline_data takes " + ", ".join(sorted(need)): True if need <= names else
        "missing " + ", ".join(sorted(need - names)),
        "client sends prompt token ids with return_token_ids and max_tokens=1":
            '"return_token_ids": True' in client and "max_tokens=1" in client,
        "client checks choices[0].prompt_token_ids and reads kv_transfer_params hidden_states_path":
            'getattr(response.choices[0], "prompt_token_ids"' in client and '"hidden_states_path"' in client,
        "client waits on <hidden_states_path>.lock before moving the file (vLLM >= 0.22 writes after the response)":
            'lock_path = hidden_states_path + ".lock"' in gen and "await wait_for_lock_async(lock_path)" in gen,
        "training reads <data>/hidden_states/hs_<i>.safetensors (hs_connectors 0.9.0 FileTransfer)":
            'f"hs_{file_idx}.safetensors"' in transfer and '"hidden_states"' in transfer,
        "hs-connectors 0.9.0's file backend asks vLLM for ExampleHiddenStatesConnector + shared_storage_path":
            '"kv_connector": "ExampleHiddenStatesConnector"' in transfer and '"shared_storage_path"' in transfer,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", default="all", help="comma-separated releases, or all (0.11.0 and %s-%s)" % (FIRST, LAST))
    ap.add_argument("--speculators", default=",".join(SPECULATORS))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "SERVER_FLOW_EVIDENCE.md"))
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "server_flow_evidence.json"))
    args = ap.parse_args(argv)
    t0 = time.time()
    from packaging.specifiers import SpecifierSet

    from remote_ops.playbook import loader as playbook
    books = [playbook.load(str(p)) for p in PLAYBOOKS]
    commands = {pb.name: server_command(p) for pb, p in zip(books, PLAYBOOKS)}
    clients = {pb.name: client_command(p) for pb, p in zip(books, PLAYBOOKS)}
    versions = vllm_releases() if args.vllm == "all" else [v for v in args.vllm.split(",") if v]
    spec_rows = [speculators_row(v) for v in args.speculators.split(",") if v]
    vllm_rows = [vllm_row(v, commands, clients) for v in versions]
    client = client_checks()
    claims = []
    for i, pb in enumerate(books):
        claimed = SpecifierSet(pb.requires["vllm"])
        passing = [r["version"] for r in vllm_rows if r["playbooks"][pb.name]["ok"]]
        in_claim = [r["version"] for r in vllm_rows if r["version"] in claimed]
        claims.append({"playbook": pb.name, "requires": pb.requires, "flags": [a for a in commands[pb.name]
                                                                              if a.startswith("--")],
                       "claimed_and_checked": in_claim, "passing": passing,
                       # the first playbook claims exactly where it passes; the sibling claims only where the
                       # first fails (its flag passes elsewhere too, but there chunked prefill stays on, as
                       # vLLM defaults: speculators PR #976)
                       "matches": in_claim == passing if i == 0 else
                       (set(in_claim) <= set(passing) and not set(in_claim) & set(claims[0]["passing"]))})
    newest = max((r for r in spec_rows if r["runs_there"] and r["server_flow_client"]),
                 key=lambda r: tuple(map(int, r["version"].split("."))), default=None)
    uncovered = [r["version"] for r in vllm_rows if not any(r["playbooks"][c["playbook"]]["ok"] for c in claims)]
    claimed_once = all(sum(r["version"] in c["claimed_and_checked"] for c in claims) == (r["version"] not in uncovered)
                       for r in vllm_rows)
    doc = {"generated_by": "python benchmarks/evidence/server_flow_evidence.py" + ("" if args.vllm == "all" else
                                                                          " --vllm " + args.vllm),
           "written_by": provenance.written_by(__file__),
           "generated_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": round(time.time() - t0, 1),
           "machine": MACHINE, "speculators": spec_rows, "newest_speculators_for_the_machine":
           newest and newest["version"], "vllm": vllm_rows, "client_0_9_0": client, "claims": claims,
           "no_playbook_passes": uncovered, "every_passing_release_claimed_once": claimed_once,
           "requires_matches_evidence": all(c["matches"] for c in claims) and claimed_once
           and all(v is True for v in client.values())}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    Path(args.out).write_text(render(doc))
    print(render(doc))
    return 0 if doc["requires_matches_evidence"] else 1


def render(doc: dict) -> str:
    yes = lambda v: "yes" if v is True else ("no" if v is False else f"no: {v}")   # noqa: E731
    L = ["# Server-flow evidence (playbooks/eagle3-speculators-0.9.0*.yaml)", "",
         f"Generated by `{doc['generated_by']}` at {doc['generated_at']}, "
         f"commit{(' ' + doc['written_by']['commit']) if doc.get('written_by') else ': not recorded'} ({doc['seconds']} s), "
         "from the real wheels "
         "(sources read, nothing imported). The vLLM checks are the agent op `serverflow.check` "
         "(remote_ops/agent/serverflow.py), the same code `remote-ops check HOST --playbook "
         "eagle3-speculators-0.9.0.yaml` runs on a host. Static only: a GPU run is benchmarks/gpu/server_check.py.", "",
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
    L += ["", f"Newest release that fits and has the client: **{doc['newest_speculators_for_the_machine']}**.", ""]
    for c in doc["claims"]:
        name = c["playbook"]
        L += [f"## vLLM: the server side, playbook {name}", "",
              f"Server flags: {', '.join('`' + f + '`' for f in c['flags'])}.", ""]
        names = list(doc["vllm"][0]["playbooks"][name]["checks"]) if doc["vllm"] else []
        for r in doc["vllm"]:       # a release without the method has fewer checks: the union, in order
            for n in r["playbooks"][name]["checks"]:
                if n not in names:
                    names.append(n)
        L.append("| check | " + " | ".join(r["version"] for r in doc["vllm"]) + " |")
        L.append("|---|" + "---|" * len(doc["vllm"]))
        for n in names:
            L.append(f"| {n} | " + " | ".join(
                yes(r["playbooks"][name]["checks"].get(n)) if n in r["playbooks"][name]["checks"] else "-"
                for r in doc["vllm"]) + " |")
        L.append("| **all** | " + " | ".join("**yes**" if r["playbooks"][name]["ok"] else "no" for r in doc["vllm"])
                 + " |")
        L += ["", f"`requires`: `vllm{c['requires']['vllm']}`, `speculators{c['requires']['speculators']}`. "
              f"Checked releases inside the claim: {', '.join(c['claimed_and_checked']) or 'none'}; releases where "
              f"every check holds: {', '.join(c['passing']) or 'none'}. "
              + (("They are the same." if c is doc["claims"][0] else "It claims only releases where the first "
                  "playbook fails (elsewhere chunked prefill stays vLLM's default: speculators PR #976).")
                 if c["matches"] else "**They differ.**"), ""]
        fails = {}
        for r in doc["vllm"]:
            for f in r["playbooks"][name]["failed"]:
                fails.setdefault((f["what"], f.get("detail") or "", f.get("fix") or ""), []).append(r["version"])
        if fails:
            L += ["What breaks where (each failed check, its reason and the edit):", ""]
            for (what, detail, fix), vs in fails.items():
                L.append(f"- {', '.join(vs)}: {what}: {detail}" + (f"; edit: {fix}" if fix else ""))
            L.append("")
    L += ["## Which aux layer ids the model's forward captures", "",
          "Id k is the input of decoder layer k (the output of layer k-1); id n = num_hidden_layers is the last "
          "layer's output, which speculators' launch_vllm.py puts last ([2, n//2, n-3, n]). Read from each "
          "release's model source by remote_ops/agent/check/auxcapture.py (what `check` and extract's preflight "
          "say for the served model). \"id n\": whether the forward meets it; \"id 0\": whether id 0 adds a "
          "residual that is None before the first layer (a TypeError). Without a capture the release's class "
          "cannot serve the method (gpu_model_runner.py refuses a model without SupportsEagle3).", "",
          "| vLLM | " + " | ".join(f"{m}: id n | {m}: id 0 | {m}: where" for m in AUX_MODULES) + " |",
          "|---|" + "---|---|---|" * len(AUX_MODULES)]
    for r in doc["vllm"]:
        cells = []
        for m in AUX_MODULES:
            a = (r.get("aux_capture") or {}).get(m)
            if isinstance(a, dict):
                cells += ["captured" if a["last_id"] else "**not captured**",
                          "TypeError" if a["first_id_adds_none"] else "ok", f"`{a['where']}` ({a['shape']})"]
            else:
                cells += ["no capture", "-", a or "-"]
        L.append(f"| {r['version']} | " + " | ".join(cells) + " |")
    L += ["", "## vLLM's own bugs, per release, without the shipped guards (issue 50)", "",
          "Each is the agent op's check on a variant of the first playbook's command: prefix caching and aborts "
          "without `--no-enable-prefix-caching` and with the client's default `--request-timeout` (120 s, "
          "concurrency 32), the last chunk with chunked prefill on (vLLM's default, the first playbook's; the "
          "guard: `--no-enable-chunked-prefill`, the no-chunked-prefill playbook); the MLA checks for a "
          "DeepSeek-V3-shaped checkpoint (kv_lora_rank) at "
          "--tensor-parallel-size 8. **bug**: the release has it (the guard holds it); undecided: the source "
          "does not tell (the guard holds it either way, or only the start can tell); no: not there.", "",
          "| vLLM | " + " | ".join(g[1] for g in GUARDS) + " |", "|---|" + "---|" * len(GUARDS)]
    for r in doc["vllm"]:
        g = r.get("guards") or {}
        L.append(f"| {r['version']} | " + " | ".join(
            "-" if cid not in g else ("**bug**" if g[cid]["ok"] is False else "undecided" if g[cid]["ok"] is None
                                      else "no") for cid, _b, _g in GUARDS) + " |")
    L += ["", "## speculators 0.9.0's CLI and client", ""]
    for k, v in doc["client_0_9_0"].items():
        L.append(f"- {k}: {yes(v)}")
    L += ["", "## Every release covered", "",
          "Releases where neither server-flow playbook passes: "
          + (", ".join(doc["no_playbook_passes"]) or "none") + "; every other checked release is claimed by "
          + ("exactly one of them." if doc["every_passing_release_claimed_once"] else "**not exactly one of them**."),
          "**`requires` matches the evidence for both playbooks.**" if doc["requires_matches_evidence"]
          else "**`requires` and the evidence differ.**", ""]
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
