"""CPU rehearsal of benchmarks/gpu/server_check.py: everything of the server flow except vLLM itself.

What is real here: remote-ops (over a ``connection: local`` host, as on the GPU machines), the shipped
playbook playbooks/eagle3-speculators-0.9.0.yaml, speculators 0.9.0's own client (``python -m speculators
generate-offline-data --validate-outputs``) with the exact wheels of benchmarks/gpu/wheels/server.txt and
spec090.txt (for this machine's Python), transformers 5.17.0, the Arrow datasets the harness builds, the
model builder, verify, stop and relaunch.

What is NOT: vLLM. The ``vllm`` package on the server's path is a STAND-IN written by this script:
``vllm/entrypoints/cli/main.py`` runs remote_ops/sandbox_assets/server_standin.py with the port, the
connector's shared_storage_path and the number of layer ids of the playbook's server command (so the
hidden states are not the model's and step (e) is not run), the import-checked modules are empty, and
the dist-info is vLLM 0.20.0's (for ``requires``). No GPU: the harness runs with ``--no-gpu``.

It answers, before any GPU time is spent: do the carried wheels import and run speculators' real client
under transformers 5.17, does the stand-in server speak what that client checks (``prompt_token_ids``,
``kv_transfer_params.hidden_states_path``, the safetensors it loads with --validate-outputs), and do the
harness's steps (c) (d) (f) (g) work. One pass per --passes entry: ``playbook`` runs the shipped playbook
with its own vars (clients: 1, the client started with the server through run_clients.py), a number N the
same with the var clients N (run_clients.py's N processes, each speculators' --world-size N --rank r;
steps (c) (f) (g) check each rank's line and the "Processing K samples" shares in the job's log). Writes
benchmarks/results/server_flow_rehearsal.json and server_flow_rehearsal_clients<N>.json (the harness's own
result documents, marked ``rehearsal``, the hosts' vars in ``host_vars``). Then, with the REAL vLLM 0.20.0 package on the path (CPU
platform forced, nothing run): vLLM's own ``serve`` parser takes the playbook's server arguments and its
FastAPI app, built with the carried server/ wheels, has /health, /v1/models and /v1/completions
(benchmarks/results/server_flow_rehearsal_app.json).

    python benchmarks/evidence/server_flow_rehearsal.py          # downloads ~100 MB of wheels once (cached)
    python benchmarks/evidence/server_flow_rehearsal.py --passes 3 --no-app-probe
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402

# What the lent GPU machines have and this one lacks (../shared/GPU-NOTES.md: transformers 5.17.0 and what
# it needs); torch and numpy come from this interpreter.
MACHINE = ["transformers==5.17.0", "tokenizers==0.23.1", "safetensors==0.8.0", "huggingface_hub==1.33.0",
           "hf_xet==1.8.0", "regex==2026.11.19", "pyyaml==6.0.4", "filelock==4.3.1", "packaging==26.4",
           "psutil==7.2.2", "tqdm==4.70.1", "typer_slim==0.24.0", "shellingham==1.5.4", "fsspec==2026.2.0",
           "httpx==0.28.1", "httpcore==1.0.9", "h11==0.16.0", "anyio==4.16.0", "certifi==2026.10.19.post1",
           "idna==3.20", "click==8.5.1"]
STANDIN_MAIN = '''# remote-ops: STAND-IN for `vllm serve` (benchmarks/evidence/server_flow_rehearsal.py): NOT vLLM
import json, sys
sys.path.insert(0, {repo!r})
from remote_ops.sandbox_assets import server_standin
a = sys.argv[1:]
assert a[0] == "serve", a
get = lambda k: a[a.index(k) + 1]
spec, kv = json.loads(get("--speculative_config")), json.loads(get("--kv_transfer_config"))
ids = spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"]
sys.exit(server_standin.main([a[1], "--port", get("--port"), "--host", get("--host"), "--hidden-states-path",
         kv["kv_connector_extra_config"]["shared_storage_path"], "--layers", str(len(ids)), "--hidden", "256",
         "--startup-seconds", "3", "--max-model-len", get("--max-model-len"), "--delay", "0.02"]))
'''
STANDIN_MODULES = ["vllm/entrypoints/openai/api_server.py", "vllm/v1/spec_decode/extract_hidden_states.py",
                   "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"]


def install(dest: Path, specs: list[str], wheels: Path) -> None:
    """``pip download --no-deps`` (this interpreter's platform) + ``pip install --no-deps --target``, once."""
    stamp = dest / ".installed"
    want = "\n".join(sorted(specs))
    if stamp.exists() and stamp.read_text() == want:
        return
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["download", "--no-deps", "--only-binary=:all:", "-d", str(wheels), *specs], check=True)
    subprocess.run(pip + ["install", "--no-deps", "--no-compile", "--no-index", "--target", str(dest),
                          *map(str, sorted(wheels.glob("*.whl")))], check=True)
    stamp.write_text(want)


def standin_vllm(site: Path) -> None:
    from remote_ops import pkgsource
    root = site / "vllm"
    shutil.rmtree(root, ignore_errors=True)
    for rel in ["vllm/entrypoints/cli/main.py"] + STANDIN_MODULES:
        path = site / rel
        for parent in list(path.relative_to(site).parents)[:-1]:
            init = site / parent / "__init__.py"
            init.parent.mkdir(parents=True, exist_ok=True)
            if not init.exists():
                init.write_text("# remote-ops: STAND-IN package (benchmarks/evidence/server_flow_rehearsal.py): NOT vLLM\n")
        path.write_text(STANDIN_MAIN.format(repo=str(REPO)) if rel.endswith("cli/main.py") else
                        "# remote-ops: STAND-IN module (benchmarks/evidence/server_flow_rehearsal.py): NOT vLLM\n")
    for old in site.glob("vllm-*.dist-info"):
        shutil.rmtree(old)
    src = next(pkgsource.unpacked("vllm", "0.20.0").glob("vllm-0.20.0.dist-info"))
    shutil.copytree(src, site / src.name)


# vLLM 0.20.0 itself (the real package, CPU platform forced: nothing is run): its own parser takes the
# playbook's server argv, and its FastAPI app, built with the carried server/ wheels, serves the routes the
# client uses
APP_PROBE = r'''
import json, sys
import vllm.platforms as P
from vllm.platforms.cpu import CpuPlatform
P._current_platform = CpuPlatform()
from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
import vllm.entrypoints.cli.serve as serve_mod
parser = FlexibleArgumentParser()
serve_mod.ServeSubcommand().subparser_init(parser.add_subparsers())
args = parser.parse_args(json.loads(sys.argv[1]))
validate_parsed_serve_args(args)
from vllm.entrypoints.openai.api_server import build_app
app = build_app(args, ("generate",))
paths = sorted({getattr(r, "path", type(r).__name__) for r in app.routes})
kv = args.kv_transfer_config
print(json.dumps({"speculative_config": args.speculative_config,
                  "kv_transfer_config": {"kv_connector": kv.kv_connector, "kv_role": kv.kv_role,
                                         "kv_connector_extra_config": kv.kv_connector_extra_config},
                  "host": args.host, "port": args.port, "tensor_parallel_size": args.tensor_parallel_size,
                  "disable_uvicorn_access_log": args.disable_uvicorn_access_log, "routes": len(paths),
                  "client_routes": [p for p in ("/health", "/v1/models", "/v1/completions") if p in paths]}))
'''


def app_probe(work: Path, out: Path) -> dict:
    """vLLM 0.20.0's parser and app over the carried wheels (the real vllm package: site-real/)."""
    import json
    import zipfile

    from remote_ops import pkgsource
    from remote_ops.connect.inventory import Host
    from remote_ops.extract import jobs
    from remote_ops.playbook import loader as playbook
    real = work / "site-real"
    if not (real / "vllm" / "__init__.py").exists():
        for e in (work / "site").iterdir():
            if e.name != "vllm" and not e.name.startswith("vllm-"):
                (real / e.name).parent.mkdir(parents=True, exist_ok=True)
                if not (real / e.name).exists():
                    (real / e.name).symlink_to(e)
        with zipfile.ZipFile(pkgsource.fetch_wheel("vllm", "0.20.0")) as zf:
            zf.extractall(real)
    spec = jobs.parse_spec(playbook.load(str(REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.9.0.yaml")),
                           Host(name="rehearsal", hostname="localhost", python=sys.executable,
                                vars={"layer_ids": [2, 4, 5, 8], "target_model": str(work / "model")}))
    env = {**os.environ, "PYTHONPATH": f"{work / 'server'}:{real}:{work / 'machine'}"}
    p = subprocess.run([sys.executable, "-c", APP_PROBE, __import__("json").dumps(spec.server.command[3:])],
                       capture_output=True, text=True, env=env, timeout=900)
    res = {"what": "vLLM 0.20.0's own serve parser and build_app over benchmarks/gpu/wheels/server.txt "
                   "(CPU platform forced, nothing run)", "rc": p.returncode, "written_by": provenance.written_by(__file__)}
    try:
        res.update(json.loads(p.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        res["stderr"] = p.stderr[-3000:]
    res["ok"] = p.returncode == 0 and res.get("client_routes") == ["/health", "/v1/models", "/v1/completions"]
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))
    return res


def lines(path: Path) -> list[str]:
    return [l.strip() for l in path.read_text().splitlines() if l.strip() and not l.startswith("#")]


def main(argv=None) -> int:
    from benchmarks.gpu.lib import bundle as gpu_bundle
    from remote_ops.cachedir import cache_dir
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(cache_dir() / "server-flow-rehearsal"))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "server_flow_rehearsal.json"))
    ap.add_argument("--steps", default="c,d,f,g")
    ap.add_argument("--passes", default="playbook,3",
                    help="comma-separated: 'playbook' (the playbook's own vars) or N (var clients N); one result each")
    ap.add_argument("--no-app-probe", action="store_true", help="skip vLLM 0.20.0's parser and app probe")
    args = ap.parse_args(argv)
    passes = [p.strip() for p in args.passes.split(",") if p.strip()]
    bad = [p for p in passes if p != "playbook" and not (p.isdigit() and int(p) >= 1)]
    if bad or not passes:
        ap.error(f"--passes: 'playbook' or a number of clients >= 1, got {args.passes!r}")
    work = Path(args.work)
    wheels = work / "wheels"
    wl = REPO / "benchmarks" / "gpu" / "wheels"
    install(work / "server", lines(wl / "server.txt"), wheels / "server")
    install(work / "spec090", lines(wl / "spec090.txt"), wheels / "spec090")
    install(work / "site", gpu_bundle.SITE, wheels / "site")
    install(work / "machine", MACHINE, wheels / "machine")
    standin_vllm(work / "site")
    tf = work / "tf"
    if not tf.exists():
        tf.symlink_to(work / "machine")     # the reference interpreter: transformers 5.17.0 here
    base = work / "bin" / "base" / "python"
    base.parent.mkdir(parents=True, exist_ok=True)
    base.write_text(f"#!/bin/sh\nPYTHONPATH=${{PYTHONPATH:+$PYTHONPATH:}}{work / 'machine'} exec {sys.executable} \"$@\"\n")
    base.chmod(0o755)
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    env = {**os.environ, "REMOTE_OPS_REHEARSAL": "CPU; vLLM replaced by the STAND-IN server "
                                                 "(benchmarks/evidence/server_flow_rehearsal.py)"}
    rc = 0
    for p in passes:
        out = Path(args.out)
        if p != "playbook":
            out = out.with_name(f"{out.stem}_clients{p}{out.suffix}")
        cmd = [sys.executable, str(REPO / "benchmarks" / "gpu" / "server_check.py"), "--work", str(work), "--out",
               str(out), "--base-python", str(base), "--controller-python", sys.executable, "--no-gpu", "--fresh",
               "--steps", args.steps, "--stop-rows", "600", "--job-timeout", "600", "--budget", "3000"]
        cmd += [] if p == "playbook" else ["--clients", p]
        if rev:
            cmd += ["--code-rev", rev]
        print(f"pass {p}: {out}", flush=True)
        rc = subprocess.run(cmd, env=env).returncode or rc
    if args.no_app_probe:
        return rc
    probe = app_probe(work, Path(args.out).with_name("server_flow_rehearsal_app.json"))   # after: the model exists
    return rc or (0 if probe["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
