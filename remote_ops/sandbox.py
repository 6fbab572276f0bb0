"""The embedded sandbox host: a real OpenSSH sshd on 127.0.0.1 with fresh keys, and a remote Python
environment holding the real speculators and vLLM sources from PyPI (no torch/CUDA needed for those;
torch CPU is added so the stand-in extraction job can run).

Layout (next to the inventory, git-ignored): ``.remote-ops/sandbox/``
    sshd/        host key, user key, known_hosts, sshd_config, pid, log
    venv/        the host's interpreter (``python`` of the inventory entry)
    workdir/     the host's workdir (stand-in job, outputs)
    host-state/  remote-ops' own state on the host (journal, backups, jobs)
    server/      the server-flow host ``sandbox-server`` (same sshd): its venv/ (speculators 0.9.0 and
                 vLLM sources, torch CPU, pyarrow), workdir/ (the stand-in server and client, the
                 prepared Arrow data, its playbook) and host-state/
    sandbox.json versions and ports
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from remote_ops import pkgsource
from remote_ops.errors import RemoteOpsError, UsageError
from remote_ops.sshd import SshdServer

HOST_NAME = "sandbox"
SERVER_HOST_NAME = "sandbox-server"    # the server flow (speculators >= 0.5): stand-in server + client
SERVER_SPECULATORS = "0.9.0"           # the shipped server-flow playbook's release
SERVER_PLAYBOOK = "eagle3-speculators-0.9.0"
PREPARED = "prepared"                  # the Arrow directory `speculators prepare-data` would have saved
DATASET = "dataset.jsonl"
STANDIN_IMPORTS = ["torch", "tqdm"]     # what the stand-in imports (it imports no speculators, no vLLM)
DEFAULT_PLAYBOOK = "eagle3-speculators-0.3.0"      # a name: found in the shipped playbooks (playbook/loader.py)
BEGIN = "  # >>> sandbox: written by `remote-ops sandbox up`; edits between these markers are overwritten"
END = "  # <<< sandbox"


@dataclass
class SandboxPaths:
    root: Path

    @property
    def sshd(self) -> Path:
        return self.root / "sshd"

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def workdir(self) -> Path:
        return self.root / "workdir"

    @property
    def host_state(self) -> Path:
        return self.root / "host-state"

    @property
    def state_file(self) -> Path:
        return self.root / "sandbox.json"

    @property
    def server(self) -> "SandboxPaths":
        """The server-flow host's paths (its venv, workdir and host-state under ``server/``)."""
        return SandboxPaths(self.root / "server")

    @property
    def playbook(self) -> Path:
        """The server-flow host's playbook (written by ``up`` into its workdir)."""
        return self.workdir / f"{SERVER_PLAYBOOK}-sandbox.yaml"


def sandbox_root(inventory_path: str) -> Path:
    """The sandbox root for an inventory: $REMOTE_OPS_SANDBOX_DIR, else ``.remote-ops/sandbox`` beside it."""
    return root_for(inventory_path)[0]


def root_for(inventory_path: str) -> tuple[Path, str]:
    """(root, why that one): $REMOTE_OPS_SANDBOX_DIR; else the sandbox the inventory's ``sandbox``
    host already points at (its state dir inside a root with a sandbox.json: an inventory copied
    elsewhere, or one given with -i, still names the sandbox it uses); else ``.remote-ops/sandbox``
    beside the inventory."""
    env = os.environ.get("REMOTE_OPS_SANDBOX_DIR")
    if env:
        return Path(env).expanduser().resolve(), "$REMOTE_OPS_SANDBOX_DIR"
    path = Path(inventory_path).expanduser()
    if path.exists():
        from remote_ops.connect import inventory
        host = inventory.load(str(path)).hosts.get(HOST_NAME)
        state = (host.env or {}).get("REMOTE_OPS_STATE_DIR") if host is not None else None
        if state:
            root = Path(state).expanduser().resolve().parent
            if (root / "sandbox.json").exists():
                return root, f"host {HOST_NAME} of {host.inventory_path}"
    return path.resolve().parent / ".remote-ops" / "sandbox", f"beside {path}"


def _read_state(paths: SandboxPaths) -> dict:
    try:
        return json.loads(paths.state_file.read_text())
    except (OSError, ValueError):
        return {}


def _server(paths: SandboxPaths, port: int | None) -> SshdServer:
    return SshdServer(paths.sshd, port=port)


def up(inventory_path: str, *, speculators: str = "0.3.0", vllm: str = "0.17.0", port: int | None = None,
       torch: bool = True, progress=lambda msg: None) -> dict:
    """Prepare the host's Python and workdir, start its sshd (unless running) and write the host into
    the inventory. The inventory is checked first, with the entry it will get, before anything is
    prepared or started; an sshd this call started is stopped again when the inventory cannot be
    written (no sshd is left behind by a failed ``up``)."""
    root, why = root_for(inventory_path)          # reads the inventory: a broken one fails here
    paths = SandboxPaths(root)
    progress(f"sandbox root {root} ({why})")
    state = _read_state(paths)
    plan_inventory_entry(inventory_path, hosts(paths, _server(paths, port or state.get("port")),
                                               state.get("server_port") or 0))
    paths.root.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.root, 0o700)
    state = _read_state(paths)
    t0 = time.monotonic()

    wanted = {"speculators": speculators, "vllm": vllm, "torch": torch}
    if state.get("packages") != wanted or not paths.python.exists():
        progress(f"preparing the host's Python: speculators=={speculators}, vllm=={vllm} (real sources from PyPI)"
                 + (", torch==2.13.0 CPU" if torch else ""))
        shutil.rmtree(paths.venv, ignore_errors=True)
        pkgsource.make_env(paths.venv, [("speculators", speculators), ("vllm", vllm)], with_torch=torch)
    prepare_workdir(paths)
    srv = paths.server
    server_wanted = {"speculators": SERVER_SPECULATORS, "vllm": vllm, "torch": torch, "pyarrow": pkgsource.PYARROW}
    if state.get("server_packages") != server_wanted or not srv.python.exists():
        progress(f"preparing the server-flow host's Python: speculators=={SERVER_SPECULATORS}, vllm=={vllm} "
                 f"(real sources), {pkgsource.PYARROW}" + (", torch==2.13.0 CPU" if torch else ""))
        shutil.rmtree(srv.venv, ignore_errors=True)
        srv.root.mkdir(parents=True, exist_ok=True)
        pkgsource.make_env(srv.venv, [("speculators", SERVER_SPECULATORS), ("vllm", vllm)], with_torch=torch,
                           with_pyarrow=True)
    prepare_server_workdir(srv)
    server_port = state.get("server_port") if _port_free(state.get("server_port")) else _free_port()

    server = _server(paths, port or state.get("port"))
    if server.running() and port and port != state.get("port"):
        server.stop()
    started = False
    if not server.running():
        progress(f"starting sshd on 127.0.0.1:{server.port}")
        try:
            server.start(foreground=False)
        except RemoteOpsError:
            if port:
                raise
            # the remembered port may be taken now: take a free one
            server = _server(paths, None)
            server.start(foreground=False)
        started = True
    try:
        written = write_inventory_entry(inventory_path, hosts(paths, server, server_port))
    except BaseException:
        if started:
            server.stop()         # never leave an sshd behind that no inventory names
        raise
    state = {"port": server.port, "packages": wanted, "root": str(paths.root),
             "python": str(paths.python), "workdir": str(paths.workdir),
             "server_port": server_port, "server_packages": server_wanted,
             "server_host": {"name": SERVER_HOST_NAME, "python": str(srv.python), "workdir": str(srv.workdir),
                             "prepared": str(srv.workdir / PREPARED), "playbook": str(srv.playbook)}}
    paths.state_file.write_text(json.dumps(state, indent=2))
    state.update({"running": True, "inventory": inventory_path, "host_written_to": str(written),
                  "root_from": why, "seconds": round(time.monotonic() - t0, 2)})
    return state


def prepare_workdir(paths: SandboxPaths) -> None:
    """The host's workdir and state dir, the stand-in job and its dataset."""
    paths.workdir.mkdir(parents=True, exist_ok=True)
    paths.host_state.mkdir(parents=True, exist_ok=True, mode=0o700)
    assets = Path(__file__).parent / "sandbox_assets"
    for asset in assets.glob("*.py"):
        if asset.name != "__init__.py":
            shutil.copy2(asset, paths.workdir / asset.name)
    write_dataset(paths.workdir / DATASET)


def prepared_rows(rows: int = 12) -> list[list[int]]:
    """The server-flow host's prepared rows: token ids, 6 to 39 tokens (under its max_model_len of 64)."""
    return [[1] + [(i * 37 + k * 11) % 1000 + 4 for k in range(5 + (i * 7) % 34)] for i in range(rows)]


def prepare_server_workdir(paths: SandboxPaths) -> None:
    """The server-flow host's workdir and state dir: the stand-ins, the prepared Arrow directory (written
    by the host's own interpreter, whose pyarrow reads it) and the playbook that runs the stand-ins."""
    import subprocess
    paths.workdir.mkdir(parents=True, exist_ok=True)
    paths.host_state.mkdir(parents=True, exist_ok=True, mode=0o700)
    assets = Path(__file__).parent / "sandbox_assets"
    for name in ("server_standin.py", "client_standin.py", "prepared_data.py"):
        shutil.copy2(assets / name, paths.workdir / name)
    proc = subprocess.run([str(paths.python), str(paths.workdir / "prepared_data.py"), str(paths.workdir / PREPARED)],
                          input=json.dumps(prepared_rows()), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RemoteOpsError(f"cannot write the server-flow host's prepared data in {paths.workdir / PREPARED}: "
                             + (proc.stderr.strip().splitlines() or ["?"])[-1],
                             "remote-ops sandbox down --purge, then sandbox up again")
    tmp = paths.playbook.with_name(f".{paths.playbook.name}.tmp")
    tmp.write_text(server_playbook_text())
    os.replace(tmp, paths.playbook)


def server_playbook_text() -> str:
    """The shipped server-flow playbook with the STAND-INs in place of vLLM's server and speculators'
    client (the same output layout, output directory, expected count, env, GPUs and stop); the
    commands take the host's vars, so the inventory entry says where everything is."""
    import importlib.resources

    import yaml

    shipped = importlib.resources.files("remote_ops") / "playbook" / "shipped" / f"{SERVER_PLAYBOOK}.yaml"
    doc = yaml.safe_load(shipped.read_text())
    doc["name"] = f"{SERVER_PLAYBOOK}-sandbox"
    doc["description"] = (f"STAND-IN of {SERVER_PLAYBOOK} for the sandbox: stdlib server (torch CPU) and client "
                          "(pyarrow), no vLLM, no GPU")
    ex = doc["extract"]
    ex["server"]["command"] = ["{vars.server_python}", "{vars.server_script}", "{vars.target_model}",
                               "--host", "127.0.0.1", "--port", "{port}",
                               "--hidden-states-path", "{vars.preprocessed_data}/.hs_staging",
                               "--layers", "{vars.standin_layers}", "--hidden", "{vars.standin_hidden}",
                               "--max-model-len", "{vars.max_model_len}"]
    ex["server"]["import_check"] = "{vars.server_import_check}"
    # the shipped launcher (run_clients.py, uploaded by the shipped `files:`) runs the stand-in client as it
    # runs speculators' one: --clients {vars.clients}, the health wait; it preloads pyarrow, what the stand-in reads
    ex["command"] = ["{python}", "run_clients.py", "--clients", "{vars.clients}",
                     "--health", "http://127.0.0.1:{port}/health", "--preload", "pyarrow", "--",
                     "{vars.client_script}", "--endpoint", "http://127.0.0.1:{port}/v1",
                     "--preprocessed-data", "{vars.preprocessed_data}", "--output", "{output_dir}",
                     "--max-samples", "{vars.max_samples}", "--concurrency", "{vars.concurrency}",
                     "--sample-delay", "{vars.sample_delay}"]
    ex["import_check"] = "{vars.import_check}"
    ex["stop_grace_seconds"] = 5
    head = (f"# written by `remote-ops sandbox up` from the shipped {SERVER_PLAYBOOK}.yaml, rewritten each time:\n"
            "# the server and the client are the sandbox's STAND-INs (remote_ops/sandbox_assets/server_standin.py,\n"
            "# client_standin.py); everything else is the shipped playbook's.\n")
    return head + yaml.safe_dump(doc, sort_keys=False)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_free(port) -> bool:
    import socket
    if not isinstance(port, int) or port <= 0:
        return False
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def write_dataset(path: Path, samples: int = 24) -> None:
    """The sandbox's dataset: token-id lines of 5 to 120 tokens (some longer than the sandbox's
    max_model_len of 64, so truncation runs), every fourth one a text line with a loss_mask."""
    import random
    rng = random.Random(0)
    lines = []
    for i in range(samples):
        if i % 4 == 3:
            text = f"Sample {i}: the quick brown fox jumps over the lazy dog."
            n = len(text.encode())
            lines.append({"text": text, "loss_mask": [0] * (n // 2) + [1] * (n - n // 2)})
        else:
            lines.append({"input_ids": [rng.randrange(1000) for _ in range(rng.randrange(5, 121))]})
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    os.replace(tmp, path)


def _connection(server: SshdServer) -> dict:
    """How both sandbox hosts reach the one sshd (address, port, user, key, known_hosts)."""
    return {
        "hostname": server.address,
        "port": server.port,
        "user": server.user,
        "identity_file": str(server.identity_file),
        "known_hosts": str(server.known_hosts),
    }


def host_entry(paths: SandboxPaths, server: SshdServer) -> dict:
    return {
        **_connection(server),
        "python": str(paths.python),
        "workdir": str(paths.workdir),
        "playbook": DEFAULT_PLAYBOOK,
        "env": {"REMOTE_OPS_STATE_DIR": str(paths.host_state)},
        "vars": {
            # STAND-IN: the shipped script is uploaded and driven, with a torch-CPU generator
            # in place of speculators' vLLM one (see extract_standin.py's docstring)
            "extract_script": str(paths.workdir / "extract_standin.py"),
            "target_model": "tiny-standin",
            "dataset": str(paths.workdir / DATASET),
            "output_dir": str(paths.workdir / "hidden_states"),
            "max_samples": 24,
            "batch_size": 4,
            "max_model_len": 64,
            "gpus": 0,
            "import_check": list(STANDIN_IMPORTS),
        },
    }


def server_host_entry(paths: SandboxPaths, server: SshdServer, port: int, torch: bool = True) -> dict:
    """The server-flow host: the same sshd, its own interpreter, workdir, state dir and vars."""
    srv = paths.server
    return {
        **_connection(server),
        "python": str(srv.python),
        "workdir": str(srv.workdir),
        "playbook": str(srv.playbook),
        "env": {"REMOTE_OPS_STATE_DIR": str(srv.host_state)},
        "vars": {
            # STAND-IN: server_standin.py answers as vLLM's server with ExampleHiddenStatesConnector,
            # client_standin.py reads the prepared Arrow data as speculators' generate-offline-data
            "server_script": str(srv.workdir / "server_standin.py"),
            "client_script": str(srv.workdir / "client_standin.py"),
            "target_model": "tiny-standin",
            "preprocessed_data": str(srv.workdir / PREPARED),
            "port": port,
            "max_model_len": 64,
            "concurrency": 4,
            "sample_delay": 0,          # STAND-IN: seconds per sample, for a job slow enough to watch or stop
            "standin_layers": 4,
            "standin_hidden": 16,
            "server_ready_seconds": 60,
            "gpus": 0,
            "import_check": ["pyarrow"],
            "server_import_check": ["torch"],
        },
    }


def hosts(paths: SandboxPaths, server: SshdServer, server_port: int) -> dict:
    """The hosts ``up`` writes into the inventory: ``sandbox`` and ``sandbox-server``."""
    return {HOST_NAME: host_entry(paths, server), SERVER_HOST_NAME: server_host_entry(paths, server, server_port)}


def _block(entries: dict) -> str:
    import yaml

    body = yaml.safe_dump(entries, sort_keys=False, default_flow_style=False)
    indented = "".join("  " + line + "\n" for line in body.splitlines())
    return f"{BEGIN}\n{indented}{END}\n"


def _includes_local(path: Path) -> bool:
    """Whether the inventory at ``path`` includes its git-ignored ``.local`` companion."""
    from remote_ops.connect import inventory
    from remote_ops.yamlsrc import load_file

    data = load_file(path).data
    inc = data.get("include") if isinstance(data, dict) else None
    names = [inc] if isinstance(inc, str) else inc if isinstance(inc, list) else []
    local = inventory.local_path(path)
    return any(isinstance(n, str) and (path.parent / n).resolve() == local.resolve() for n in names)


NEW_INVENTORY = ("# remote-ops inventory (see README). `default` is used when a command names no host.\n"
                 "# `remote-ops sandbox up` writes its host into {local} (included below).\n"
                 "default: " + HOST_NAME + "\ninclude: [{local}]\nhosts: {{}}\n")
BLOCK_RE = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.S)


def plan_inventory_entry(inventory_path: str, entries: dict) -> list[tuple[Path, str]]:
    """The files ``write_inventory_entry`` would write, and their text, each checked as an inventory
    under its own name (errors name the inventory, never a temporary file): what ``up`` checks before
    it starts anything. ``entries``: host name -> entry (``hosts``). Refuses an inventory that defines
    host ``sandbox`` or ``sandbox-server`` itself (not in the block ``sandbox up`` manages): a second
    definition would be a duplicate."""
    from remote_ops.connect import inventory
    from remote_ops.errors import ConfigError
    from remote_ops.yamlsrc import load_text

    path = Path(inventory_path).expanduser()
    local = inventory.local_path(path)
    block = _block(entries)
    out: list[tuple[Path, str]] = []
    if not path.exists():
        out.append((path, NEW_INVENTORY.format(local=local.name)))
        main_text = out[0][1]
        includes_local = True
    else:
        main_text = path.read_text()
        includes_local = _includes_local(path)
        current = inventory.load(str(path))            # as it is: a broken inventory fails here, named
        managed_here = BLOCK_RE.search(main_text) is not None
        for name in entries:
            own = current.hosts.get(name)
            if own is not None and Path(own.inventory_path).resolve() == path.resolve() and not managed_here:
                raise ConfigError(str(path), current.doc.line("hosts", name) if current.doc else None,
                                  f"host {name!r} is already defined here (not by `remote-ops sandbox up`)",
                                  f"remove it (sandbox up writes its own), or give another inventory with -i")
    if includes_local:
        local_text = (f"# written by `remote-ops sandbox up`, rewritten each time (git-ignored): put your own\n"
                      f"# hosts in {path.name}, which includes this file\nhosts:\n{block}")
        inventory.parse(load_text(local_text, str(local)))
        out.append((local, local_text))
        if BLOCK_RE.search(main_text):     # a block written by an older `sandbox up`: the host lives in local now
            out.append((path, BLOCK_RE.sub("", main_text, count=1)))
        return out
    text = main_text
    if BLOCK_RE.search(text):
        text = BLOCK_RE.sub(lambda m: block, text, count=1)
    else:
        m = re.search(r"^hosts:[ \t]*(#.*)?\n", text, re.M)
        if not m:
            if re.search(r"^hosts:", text, re.M):
                raise UsageError(f"{path}: cannot add the sandbox host: 'hosts:' must be a block mapping",
                                 "write hosts one per line, or point --inventory at a new file")
            text = text.rstrip("\n") + f"\nhosts:\n{block}"
        else:
            text = text[: m.end()] + block + text[m.end():]
    if not re.search(r"^default:", text, re.M):
        text = f"default: {HOST_NAME}\n" + text
    inventory.parse(load_text(text, str(path)))
    out.append((path, text))
    return out


def write_inventory_entry(inventory_path: str, entries: dict) -> Path:
    """Write the sandbox's hosts (``hosts``); returns the file they went into. An inventory that includes its
    ``.local`` companion (the repository's does; a new one is written so) is left as it is, and the
    host goes into that git-ignored file, rewritten each time. Another inventory gets a managed
    block inside ``hosts:`` (inserted or refreshed, everything else kept). Every text is checked
    before any file is written (``plan_inventory_entry``)."""
    from remote_ops.connect import inventory

    path = Path(inventory_path).expanduser()
    plan = plan_inventory_entry(inventory_path, entries)
    for target, text in plan:
        _replace(target, text)
    if plan[0][0] != path:
        inventory.load(str(path))     # the two files read together
    return plan[0][0]


def _replace(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary beside it (renamed over it: never half written);
    the text was checked as an inventory under ``path``'s own name (plan_inventory_entry)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def down(inventory_path: str, *, purge: bool = False) -> dict:
    root, why = root_for(inventory_path)
    paths = SandboxPaths(root)
    state = _read_state(paths)
    server = _server(paths, state.get("port"))
    was_running = server.running()
    server.stop()
    if purge:
        shutil.rmtree(paths.root, ignore_errors=True)
    return {"stopped": was_running, "purged": purge, "root": str(paths.root), "root_from": why}


def status(inventory_path: str) -> dict:
    root, why = root_for(inventory_path)
    paths = SandboxPaths(root)
    state = _read_state(paths)
    if not state:
        return {"exists": False, "running": False, "root": str(paths.root), "root_from": why}
    server = _server(paths, state.get("port"))
    return {"exists": True, "running": server.running(), **state, "root": str(paths.root), "root_from": why}
