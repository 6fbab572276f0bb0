"""The playbook's ``extract:`` section, parsed and checked locally into an ``ExtractSpec`` (controller
side; ``jobs.py`` runs it: preflight, launch, the records status / logs / stop / verify read).

    extract:
      command: ["{python}", "scripts/data_generation_offline.py",      # argv list (or one string,
                "--target-model-path", "{vars.model}",                # split like a shell would,
                "--output-dir", "{output_dir}", "--max-samples", "5000"]   # but never run by one)
      workdir: "{vars.workdir}"          # default: the host's workdir, else ~
      output_dir: "{vars.data_root}/hidden_states"   # or a list, one directory per disk:
                                         # [/nvme0/hs, /nvme1/hs]: sample N in the (N % k)-th (sharded n
                                         # ways: (N // n) % k); {output_dir} is then "A:B" (PATH-like)
      expected_samples: 5000
      disk:                              # refuse a job whose outputs cannot fit, from real sizes:
        dataset: "{vars.dataset}"        # hidden size x captured layers (the checkpoint's config.json)
        max_model_len: "{vars.max_model_len}"   # x tokens of the samples still to write x 2 bytes
        # model / layer_ids: default check.model's path / layer_ids (agent/job/diskneed.py)
      env: {CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7", TQDM_MININTERVAL: "5"}
      secrets:                           # delivered on stdin, to a 0600 file the supervisor deletes
        HF_TOKEN: {from_env: HF_TOKEN}
        WANDB_API_KEY: {from_file: ~/.wandb_key}
      files:                             # local files (relative to the playbook) -> names in the
        scripts/extract.py: extract.py   # workdir: uploaded before launch when their sha256 differs,
                                         # with the local mode capped at 0700; listed by full path
      import_check: [speculators.data_generation.vllm_hidden_states_generator]   # imported by the
      import_check_timeout_seconds: 120  # job's interpreter with the job's env before launch
      gpus: {count: 8, free: true}       # refuse unless 8 GPUs and no foreign compute process
      watchdog_seconds: 900              # flag a job whose log and outputs stop advancing
      stop_grace_seconds: 30             # SIGTERM -> SIGKILL delay of `stop` and of cleanup
      shard: true                        # a group splits the samples: host k of N writes i % N == k
                                         # (the command gets --shard K/N; docs/SCALE-OUT.md)
      output_layout: hs_safetensors      # data_pt (default: data_<N>.pt) | hs_safetensors (hs_<N>.safetensors)
      server:                            # a two-process job: this server first, healthy, then the command
        command: ["{python}", "-m", "vllm.entrypoints.cli.main", "serve", "{vars.model}", "--port", "{port}"]
        port: 8000                       # must be free on the host; {port} in both commands
        health: {path: /health, timeout_seconds: 900}   # GET http://127.0.0.1:{port}/health must answer 200
        env: {VLLM_WORKER_MULTIPROC_METHOD: spawn}      # added to extract.env for the server only
        import_check: [vllm.entrypoints.openai.api_server]   # imported by the server's interpreter
        api_key: {client_env: OPENAI_API_KEY}   # a key made for each launch: the server gets it as
                                         # VLLM_API_KEY, the client as OPENAI_API_KEY (secrets, never argv)
        client_start: healthy            # the client once the server answers (default), or launch: right
                                         # after the server, its start overlapping (it waits itself)

A command item may be ``{flag: "--trust-remote-code", if: "{vars.trust_remote_code}"}``: the flag when
the var is true, nothing when it is false; or ``{flag: "--max-num-batched-tokens", value:
"{vars.max_num_batched_tokens}"}``: the flag and the var's value (a number as text) when the var is set,
nothing when it is null or an empty string.

Templates ``{vars.NAME}`` (host vars over playbook vars), ``{output_dir}``, ``{workdir}``,
``{python}`` (the host's interpreter) and ``{host}`` are filled in locally; every value reaches the
host as JSON on stdin, never through a shell. A value that is exactly one ``{vars.NAME}`` takes the
var's value as it is (a list for ``import_check``, a number for ``gpus.count``).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


from remote_ops.errors import ConfigError
from remote_ops.playbook.templates import _TEMPLATE, _WHOLE_VAR, _fill, fill_for_host, template_context  # noqa: F401
from remote_ops.extract import flows
from remote_ops.extract.server_section import ENV_NAME as _ENV_NAME, MODULE as _MODULE, ServerSpec
from remote_ops.yamlsrc import type_name

EXTRACT_KEYS = {"command", "workdir", "output_dir", "expected_samples", "disk", "env",
                "secrets", "gpus", "watchdog_seconds", "stop_grace_seconds", "files", "import_check",
                "import_check_timeout_seconds", "shard", "slurm", "output_layout"}   # and each flow's section (flows.sections)
LAYOUTS = ("data_pt", "hs_safetensors")     # agent/job/supervisor.py LAYOUTS: the file name of one sample
MAX_FILE_BYTES = 4 << 20


@dataclass
class SecretRef:
    name: str
    source: str        # "env" | "file"
    ref: str
    line: int | None = None
    optional: bool = False


@dataclass
class ShippedFile:
    local: Path        # on this machine
    name: str          # relative to the job's workdir on the host
    data: bytes
    sha256: str
    mode: int          # the local file's, capped at 0700 (shipped_mode)
    line: int | None = None

    @property
    def full_path(self) -> str:
        """The laptop file read, as a full path with every link followed: what a launch shows."""
        return str(self.local.resolve())

    def to_wire(self) -> dict:
        import base64
        return {"name": self.name, "data": base64.b64encode(self.data).decode(), "sha256": self.sha256,
                "mode": self.mode}


@dataclass
class ExtractSpec:
    key: str
    command: list[str]
    workdir: str
    output_dir: str | None               # the first (or only) output directory
    expected_samples: int | None = None
    disk: dict | None = None      # {model, layer_ids, default_layer_ids, dataset, max_model_len}: the disk need
    env: dict[str, str] = field(default_factory=dict)
    secrets: list[SecretRef] = field(default_factory=list)
    gpu_count: int = 0
    gpus_free: bool = True
    watchdog_seconds: float | None = None
    stop_grace: float = 30.0
    playbook_path: str | None = None
    files: list[ShippedFile] = field(default_factory=list)
    import_check: list[str] = field(default_factory=list)
    import_timeout: float = 120.0
    requires: list[str] = field(default_factory=list)    # package names, for the versions of a failed import
    sharded: bool = False                 # the playbook's extract.shard: a group run splits the samples
    shard: tuple[int, int] | None = None  # this host's (k, n) once assigned (extract/shard.py)
    server: ServerSpec | None = None      # the server flow's section (extract/flows.py)
    sections: dict = field(default_factory=dict)     # other registered flows' sections, by key
    layout: str | None = None            # None: data_pt
    output_dirs: list[str] = field(default_factory=list)   # every output directory, in order (one: [output_dir])

    @property
    def flow(self) -> flows.Flow:
        """The kind of job this is (extract/flows.py): the flow whose section the playbook gives."""
        return flows.of(self)

    @property
    def several_dirs(self) -> list[str] | None:
        """The output directories when there are several (the job's samples spread over them), else None."""
        return self.output_dirs if len(self.output_dirs) > 1 else None

    def to_json(self) -> dict:
        """What may be shown: secret *names* and where they come from, never values."""
        extra = self.flow.spec_json(self)
        if self.layout:
            extra["output_layout"] = self.layout
        return {**extra, "key": self.key, "command": self.command, "workdir": self.workdir,
                "output_dir": self.output_dir, **({"output_dirs": self.output_dirs} if self.several_dirs else {}),
                "expected_samples": self.expected_samples,
                "env": self.env, "secrets": {s.name: f"{s.source}:{s.ref}" for s in self.secrets},
                "gpus": {"count": self.gpu_count, "free": self.gpus_free},
                "watchdog_seconds": self.watchdog_seconds, "stop_grace_seconds": self.stop_grace,
                "files": {f.name: {"local": f.full_path, "sha256": f.sha256, "mode": f"{f.mode:04o}"}
                          for f in self.files},
                "import_check": self.import_check, "import_check_timeout_seconds": self.import_timeout,
                **({"shard": list(self.shard)} if self.shard else {})}

    @property
    def job_python(self) -> str | None:
        """The interpreter the command runs, when its first word is a python (else None: the host's)."""
        return self.command[0] if re.search(r"(^|/)python[0-9.]*$", self.command[0]) else None


# ------------------------------------------------------------------ schema


class _Section:
    """The playbook's ``extract:`` mapping being read for one host: where an error points (file:line),
    the template context (vars, {workdir}, {output_dir}) and the readers every part uses."""

    def __init__(self, playbook, host, raw):
        self.playbook, self.host, self.raw = playbook, host, raw
        self.ctx = template_context(playbook, host)

    def err_at(self, keys):
        def err(problem, hint=None):
            return self.playbook.error(("extract",) + tuple(keys), problem, hint)
        return err

    def whole_var(self, value):
        """A value that is exactly ``{vars.NAME}`` is the var's value as it is (list, number...)."""
        m = _WHOLE_VAR.match(value) if isinstance(value, str) else None
        return self.ctx[m.group(1)] if m and m.group(1) in self.ctx else value

    def text(self, keys, value, what):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.err_at(keys)(f"{what} must be a string, got {type_name(value)}")
        return _fill(str(value), self.ctx, self.err_at(keys))

    def argv(self, keys, cmd):
        if isinstance(cmd, str):
            try:
                parts = shlex.split(cmd)
            except ValueError as exc:
                raise self.err_at(keys)(f"cannot split command: {exc}") from None
            command = [_fill(p, self.ctx, self.err_at(keys)) for p in parts]
        elif isinstance(cmd, list) and cmd:
            command = []
            for i, c in enumerate(cmd):
                if isinstance(c, dict):
                    command += self.optional_flag(keys + (i,), c)
                else:
                    command.append(self.text(keys + (i,), c, "every command item"))
        else:
            raise self.err_at(keys)(f"command must be a list of strings or one string, got {type_name(cmd)}")
        if not command or not command[0]:
            raise self.err_at(keys)("command is empty")
        return command

    def optional_flag(self, keys, item):
        """A command item that is a mapping: ``{flag: --name, if: "{vars.NAME}"}``, the flag when the var is
        true, nothing when it is false (a boolean, or the text true/false); or ``{flag: --name, value:
        "{vars.NAME}"}``, the flag then the value when the var is set, nothing when it is null or empty; or
        ``{select: "{vars.NAME}", cases: {...}}`` (``select``). Anything else is an error here."""
        if set(item) == {"flag", "value"}:
            return self.flag_value(keys, item)
        if set(item) == {"select", "cases"}:
            return self.select(keys, item)
        if set(item) != {"flag", "if"}:
            raise self.err_at(keys)(f"a command item that is a mapping must be {{flag, if}}, {{flag, value}} or "
                                    f"{{select, cases}}, got keys {', '.join(sorted(map(str, item)))}",
                                    'e.g. {flag: "--trust-remote-code", if: "{vars.trust_remote_code}"} or '
                                    '{flag: "--max-num-batched-tokens", value: "{vars.max_num_batched_tokens}"}')
        cond = self.whole_var(item["if"])
        if isinstance(cond, str) and cond.strip().lower() in ("true", "false"):
            cond = cond.strip().lower() == "true"
        if not isinstance(cond, bool):
            raise self.err_at(keys + ("if",))(f"{item['if']!r} gives {cond!r}: a flag's 'if' must be true or false")
        return [self.text(keys + ("flag",), item["flag"], "a flag")] if cond else []

    def select(self, keys, item):
        """``{select: "{vars.NAME}", cases: {A: [items], B: [items]}}``: the items of the case the var's value
        names (strings, templates filled; a case may be one string or an empty list); a value that names no
        case is an error that lists them."""
        cases = item["cases"]
        if not isinstance(cases, dict) or not cases:
            raise self.err_at(keys + ("cases",))("'cases' must be a mapping of values to lists of command items")
        raw = item["select"]
        value = self.whole_var(raw) if isinstance(raw, str) else raw
        key = value if isinstance(value, str) else None
        if key not in cases:
            raise self.err_at(keys + ("select",))(f"{raw!r} gives {value!r}: one of {', '.join(map(str, cases))}",
                                                  f"set it to one of {', '.join(map(str, cases))} (the host's "
                                                  "'vars:' or the playbook's)")
        chosen = cases[key]
        chosen = [chosen] if isinstance(chosen, str) else chosen
        if not isinstance(chosen, list):
            raise self.err_at(keys + ("cases", key))(f"case {key!r} must be a list of strings, got "
                                                     f"{type_name(chosen)}")
        return [self.text(keys + ("cases", key, i), c, "every command item") for i, c in enumerate(chosen)]

    def flag_value(self, keys, item):
        """``{flag: --name, value: ...}``: [flag, value] when the value is set; [] when it is null or an empty
        string (after its templates are filled). A number is rendered as text; a list or mapping is an error."""
        raw = item["value"]
        value = self.whole_var(raw) if isinstance(raw, str) else raw
        if value is None:
            return []
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.err_at(keys + ("value",))(f"{raw!r} gives {type_name(value)}: a flag's 'value' must be a "
                                                 "string or a number, or null for no flag")
        text = self.text(keys + ("value",), value, "a flag's value")
        if text == "":
            return []
        return [self.text(keys + ("flag",), item["flag"], "a flag"), text]

    def templated_number(self, keys, v):
        """A number written as a template ("{vars.gpus}") is filled in, then read as a number."""
        if isinstance(v, str) and _TEMPLATE.search(v):
            filled = _fill(v, self.ctx, self.err_at(keys)).strip()
            try:
                return int(filled)
            except ValueError:
                try:
                    return float(filled)
                except ValueError:
                    raise self.err_at(keys)(f"{v} gives {filled!r}, which is not a number") from None
        return v

    def number(self, key, kind, minimum):
        v = self.templated_number((key,), self.raw.get(key))
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)) \
                or v < minimum:
            raise self.err_at((key,))(f"{key} must be a {'whole ' if kind is int else ''}number >= {minimum}, got {v!r}")
        return kind(v)


def _no_placeholders(sec):
    """A playbook placeholder (``<...>``, left for the user to fill) anywhere in the section."""
    from remote_ops.playbook.loader import PLACEHOLDER_RE

    def scan(value, keys):
        if isinstance(value, dict):
            for k, v in value.items():
                scan(v, keys + (k,))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                scan(v, keys + (i,))
        elif isinstance(value, str) and PLACEHOLDER_RE.search(value):
            raise sec.err_at(keys)(f"placeholder left in extract: {value.strip()[:60]!r}", "replace it with a real value")
    scan(sec.raw, ())
    return {}


def _places(sec, subdir):
    """workdir (default: the host's) and output_dir (relative to workdir; a moved share's ``subdir``
    appended), both set in the template context before any command is filled."""
    raw = sec.raw
    workdir = raw.get("workdir")
    workdir = sec.text(("workdir",), workdir, "workdir") if workdir is not None else (sec.host.workdir or "~")
    sec.ctx["workdir"] = workdir
    out = sec.whole_var(raw.get("output_dir"))
    sec.output_dirs = []
    if out is None:
        return {"workdir": workdir, "output_dir": None, "output_dirs": []}
    from remote_ops.agent.outputs.run_identity import DIR_SEP
    items = out if isinstance(out, list) else [out]
    if not items:
        raise sec.err_at(("output_dir",))("output_dir is an empty list", "name one directory, or one per disk")
    dirs = []
    for i, item in enumerate(items):
        keys = ("output_dir",) + ((i,) if isinstance(out, list) else ())
        d = sec.text(keys, item, "output_dir" + (" entries" if isinstance(out, list) else ""))
        if DIR_SEP in d:      # the job would split it into two directories
            raise sec.err_at(keys)(f"output_dir {d!r} holds {DIR_SEP!r}, which separates the directories on the "
                                   f"job's command line (--output-dir A{DIR_SEP}B)",
                                   "rename that directory; several directories are a list: output_dir: [A, B]")
        if not d.startswith(("/", "~")):
            d = workdir.rstrip("/") + "/" + d
        if subdir:
            d = d.rstrip("/") + "/" + subdir
        if d.rstrip("/") in [x.rstrip("/") for x in dirs]:
            raise sec.err_at(keys)(f"output_dir names {d} twice", "give each disk's directory once")
        dirs.append(d)
    sec.ctx["output_dir"] = DIR_SEP.join(dirs)       # the job's --output-dir: A:B for several
    sec.output_dirs = dirs
    return {"workdir": workdir, "output_dir": dirs[0], "output_dirs": dirs}


def _commands(sec):
    """The job's command, a two-process job's server, and the output layout."""
    raw = sec.raw
    given = [(key, flow) for key, flow in flows.sections().items() if raw.get(key) is not None]
    if len(given) > 1:
        raise sec.err_at((given[1][0],))(f"extract has {given[0][0]} and {given[1][0]}: a job is of one flow",
                                         "keep the section of the flow this playbook runs")
    fields = {}
    for key, flow in given:      # the section's templates may set ctx (the server's {port}) for the commands
        value = flow.parse(raw[key], sec)
        fields = flow.spec_fields(value)
    cmd = raw.get("command")
    if cmd is None:
        raise sec.err_at(())("extract needs a 'command'", 'e.g. command: ["{python}", "02_extract_hidden_states.py", ...]')
    command = sec.argv(("command",), cmd)
    layout = raw.get("output_layout")
    if layout is not None and layout not in LAYOUTS:
        raise sec.err_at(("output_layout",))(f"output_layout must be one of {', '.join(LAYOUTS)}, got {layout!r}",
                                             "hs_safetensors: speculators >= 0.5 (hs_<N>.safetensors); "
                                             "data_pt: speculators 0.3 (data_<N>.pt)")
    if len(sec.output_dirs) > 1 and (any(flow.one_output_dir for _, flow in given) or layout == "hs_safetensors"):
        raise sec.err_at(("output_dir",))(
            "output_dir names several directories, but this job writes one: the server flow's files come "
            "through vLLM's connector into one directory", "give output_dir one directory (one disk), or use "
            "the 0.3.0 flow (eagle3-speculators-0.3.0) to spread samples over several")
    return {**fields, "command": command, "layout": None if layout in (None, "data_pt") else layout}


def _environment(sec):
    """env (filled templates) and secrets (references only: never a value in a playbook)."""
    raw = sec.raw
    env_raw = raw.get("env") or {}
    if not isinstance(env_raw, dict):
        raise sec.err_at(("env",))(f"env must be a mapping of NAME: value, got {type_name(env_raw)}")
    env = {}
    for k, v in env_raw.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise sec.err_at(("env", k))(f"{k!r} is not a valid environment variable name")
        if v is None:
            v = ""
        env[k] = sec.text(("env", k), v, f"env value {k}")

    secrets_raw = raw.get("secrets") or {}
    if not isinstance(secrets_raw, dict):
        raise sec.err_at(("secrets",))(f"secrets must be a mapping of NAME: {{from_env|from_file: ...}}, got {type_name(secrets_raw)}")
    secrets = []
    for k, v in secrets_raw.items():
        keys = ("secrets", k)
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise sec.err_at(keys)(f"{k!r} is not a valid environment variable name")
        if k in env:
            raise sec.err_at(keys)(f"{k} is both in env and in secrets; keep it in secrets only")
        optional = v.get("optional", False) if isinstance(v, dict) else False
        source = {kk: vv for kk, vv in v.items() if kk != "optional"} if isinstance(v, dict) else v
        if not isinstance(source, dict) or len(source) != 1 or next(iter(source)) not in ("from_env", "from_file") \
                or not isinstance(next(iter(source.values())), str) or not isinstance(optional, bool):
            raise sec.err_at(keys)(f"secret {k} must be {{from_env: NAME}} or {{from_file: PATH}} "
                                   "(plus optional: true|false)", "secret values never go into a playbook")
        (src, ref), = source.items()
        secrets.append(SecretRef(k, src[5:], ref, sec.playbook.line("extract", "secrets", k), optional))
    return {"env": env, "secrets": secrets}


def _gpus(sec):
    """gpus: N, or {count: N, free: true|false}."""
    gpus = sec.raw.get("gpus") or {}
    if isinstance(gpus, (int, str)) and not isinstance(gpus, bool):
        gpus = {"count": gpus}
    if not isinstance(gpus, dict) or set(gpus) - {"count", "free"}:
        raise sec.err_at(("gpus",))("gpus must be a mapping {count: N, free: true|false}")
    count = sec.templated_number(("gpus", "count"), gpus.get("count", 0))
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise sec.err_at(("gpus", "count"))(f"gpus.count must be a whole number >= 0, got {count!r}")
    free = gpus.get("free", True)
    if not isinstance(free, bool):
        raise sec.err_at(("gpus", "free"))("gpus.free must be true or false")
    return {"gpu_count": count, "gpus_free": free}


def _job_files_and_imports(sec):
    """The files shipped into the workdir and the modules the import probe imports."""
    raw = sec.raw
    files = _shipped_files(sec.playbook, raw.get("files"), sec.err_at)
    checks = sec.whole_var(raw.get("import_check"))
    if checks is None or checks == "":
        checks = []
    if isinstance(checks, str):
        checks = [checks]
    if not isinstance(checks, list) or not all(isinstance(c, str) and _MODULE.match(c) for c in checks):
        raise sec.err_at(("import_check",))(f"import_check must be a list of module names, got {checks!r}",
                                            "e.g. import_check: [speculators.data_generation.vllm_hidden_states_generator]")
    import_timeout = sec.number("import_check_timeout_seconds", float, 1)
    return {"files": files, "import_check": list(checks), "import_timeout": import_timeout or 120.0}


def _limits(sec):
    """expected_samples, the disk need's inputs, the watchdog, the stop grace, and whether it shards."""
    raw = sec.raw
    sharded = raw.get("shard", False)
    if not isinstance(sharded, bool):
        raise sec.err_at(("shard",))(f"shard must be true or false, got {sharded!r}")
    return {"sharded": sharded, "expected_samples": sec.number("expected_samples", int, 1),
            "disk": _disk(sec.playbook, sec.host, raw.get("disk"), sec.err_at),
            "watchdog_seconds": sec.number("watchdog_seconds", float, 1),
            "stop_grace": sec.number("stop_grace_seconds", float, 0) if raw.get("stop_grace_seconds") is not None
            else 30.0}


def parse_spec(playbook, host, *, subdir: str | None = None) -> ExtractSpec:
    """The playbook's ``extract:`` section for ``host``, validated with file:line errors; ``subdir``
    (a moved shard's) is appended to output_dir before ``{output_dir}`` fills the command. Read in
    parts, in this order (the places go into the template context before any command is filled)."""
    raw = playbook.extract
    if raw is None:
        raise ConfigError(playbook.path, None, f"playbook {playbook.name} has no 'extract' section",
                          "add extract: {command: [...], output_dir: ...}")
    sec = _Section(playbook, host, raw)
    from remote_ops.yamlsrc import unknown_key_check
    unknown_key_check(raw, EXTRACT_KEYS | set(flows.sections()), "in extract", lambda k, problem, hint: sec.err_at((k,))(problem, hint))
    fields = {}
    for part in (_no_placeholders, lambda s: _places(s, subdir), _commands, _environment, _gpus,
                 _job_files_and_imports, _limits):
        fields.update(part(sec))
    return ExtractSpec(requires=sorted(playbook.requires), key=playbook.name, playbook_path=playbook.path, **fields)


DISK_KEYS = ("dataset", "max_model_len", "model", "layer_ids")


def _disk(playbook, host, raw, err_at) -> dict | None:
    """``disk: {dataset, max_model_len, model, layer_ids}`` filled for ``host``; model and layer ids
    default to ``check.model``'s (path, layer_ids, default_layer_ids), the one place they are named."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - set(DISK_KEYS) or "dataset" not in raw:
        raise err_at(("disk",))(f"disk must be a mapping with dataset (and max_model_len, model, layer_ids), "
                                f"got {raw!r}")
    from remote_ops.playbook.model_section import parse_layer_ids
    section = (getattr(playbook, "check", None) or {}).get("model") or {}

    def filled(key, fallback=None):
        if key in raw:
            return fill_for_host(playbook, host, raw[key], ("extract", "disk", key))
        return fill_for_host(playbook, host, section[fallback], ("check", "model", fallback)) \
            if fallback and section.get(fallback) is not None else None
    out = {"dataset": str(filled("dataset")), "model": filled("model", "path"),
           "layer_ids": parse_layer_ids(filled("layer_ids", "layer_ids"), host.name),
           "default_layer_ids": list(section.get("default_layer_ids") or []) or None}
    mml = filled("max_model_len")
    if mml not in (None, ""):
        try:
            out["max_model_len"] = int(mml)
        except (TypeError, ValueError):
            raise err_at(("disk", "max_model_len"))(f"disk.max_model_len must be a whole number, got {mml!r}") from None
    if out["model"] is not None:
        out["model"] = str(out["model"])
    return out


def shipped_mode(path: Path) -> int:
    """The mode a laptop file gets on the host: its own, capped at 0700 (a key file stays 0600, a
    script that is executable here stays executable, nobody else on the host reads either)."""
    return os.stat(path).st_mode & 0o700


PACKAGE_PREFIX = "remote-ops:"


def package_path(local: str, err) -> Path:
    """``remote-ops:REL``: the file REL inside the installed remote_ops package (the shipped
    playbooks name their script, run_identity.py and layout.py so, and a copy of one kept elsewhere
    still finds them)."""
    import remote_ops
    rel = local[len(PACKAGE_PREFIX):]
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in rel.split("/")):
        raise err(f"{local!r}: a file of the remote-ops package is named remote-ops:PATH, PATH relative to the "
                  "package without '..'")
    return Path(remote_ops.__file__).resolve().parent / rel


def _shipped_files(playbook, raw, err_at) -> list[ShippedFile]:
    """``files: {local path (relative to the playbook, or remote-ops:PATH inside the package): name in
    the workdir}``, read now."""
    import hashlib
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise err_at(("files",))(f"files must be a mapping of local path: name in the workdir, got {type_name(raw)}")
    base = Path(playbook.path).parent
    out, names = [], set()
    for local, name in raw.items():
        keys = ("files", local)
        if not isinstance(local, str) or not local.strip():
            raise err_at(keys)(f"{local!r} is not a file path")
        if not isinstance(name, str) or not name or name.startswith(("/", "~")) or "\x00" in name \
                or any(p in ("", ".", "..") for p in name.split("/")):
            raise err_at(keys)(f"{name!r} must be a relative path inside the workdir (no '..', not absolute)")
        if name in names:
            raise err_at(keys)(f"two files are shipped as {name}")
        names.add(name)
        path = package_path(local, err_at(keys)) if local.startswith(PACKAGE_PREFIX) else Path(local).expanduser()
        path = path if path.is_absolute() else base / path
        try:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                raise err_at(keys)(f"{path} is {size} bytes; files shipped with a playbook are at most {MAX_FILE_BYTES}")
            data = path.read_bytes()
        except OSError as exc:
            raise err_at(keys)(f"cannot read {path}: {exc.strerror or exc}",
                               "paths are relative to the playbook file") from None
        out.append(ShippedFile(path, name, data, hashlib.sha256(data).hexdigest(), shipped_mode(path),
                               playbook.line("extract", "files", local)))
    return out


def secret_path(spec: ExtractSpec, s: SecretRef) -> Path:
    """The laptop file a ``from_file`` secret is read from (relative: to the playbook's folder)."""
    path = Path(os.path.expanduser(s.ref))
    if not path.is_absolute() and spec.playbook_path:
        path = Path(spec.playbook_path).parent / path
    return path


def resolve_secrets(spec: ExtractSpec) -> dict[str, str]:
    """Secret values from the local environment or local files (never logged, never on argv), and
    the server's API key generated for this launch when extract.server has ``api_key``."""
    out = {}
    for s in spec.secrets:
        if s.optional and ((s.source == "env" and not os.environ.get(s.ref)) or
                           (s.source == "file" and not secret_path(spec, s).exists())):
            continue  # optional and not provided here: the job runs without it
        if s.source == "env":
            value = os.environ.get(s.ref)
            if not value:
                raise ConfigError(spec.playbook_path or "playbook", s.line,
                                  f"secret {s.name}: environment variable {s.ref} is not set here",
                                  f"export {s.ref}=... before running remote-ops")
        else:
            path = secret_path(spec, s)
            try:
                value = path.read_text().strip()
            except OSError as exc:
                raise ConfigError(spec.playbook_path or "playbook", s.line,
                                  f"secret {s.name}: cannot read {path}: {exc.strerror}") from None
            if not value:
                raise ConfigError(spec.playbook_path or "playbook", s.line, f"secret {s.name}: {path} is empty")
        out[s.name] = value
    out.update(spec.flow.secrets(spec, out))
    return out


def assignment_changed(spec, recorded) -> str:
    """The preflight problem when the output directory holds another shard's samples."""
    k, n = recorded
    now = f"shard {spec.shard[0]}/{spec.shard[1]}" if spec.shard else "an unsharded run"
    return (f"{spec.output_dir} holds shard {k}/{n} of a sharded run, this run is {now}: the group "
            f"changed (hosts are assigned sorted by name); run the same hosts with --shard, or move "
            f"that share to a host with: remote-ops extract HOST --shard {k}/{n}")


def server_command(playbook, host) -> list[str] | None:
    """The playbook's ``extract.server`` command filled for ``host`` (None: the playbook has no server);
    what ``check`` checks the host's vLLM against (check/serverflow.py)."""
    if playbook is None or not isinstance(getattr(playbook, "extract", None), dict) \
            or not playbook.extract.get("server"):
        return None
    spec = parse_spec(playbook, host)
    return spec.flow.model_command(spec) or None


def client_command(playbook, host) -> list[str] | None:
    """The client command of a server-flow playbook filled for ``host`` (None: no server); its timeout and
    concurrency are checked against the host's connector (check/serverflow.py)."""
    if server_command(playbook, host) is None:
        return None
    return [str(a) for a in parse_spec(playbook, host).command]
