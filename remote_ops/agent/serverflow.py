"""Agent op ``serverflow.check``: what a server-flow playbook's server command needs of the host's vLLM.

The server flow (the playbook eagle3-speculators-0.9.0) patches nothing and calls no vLLM function
from speculators' modules, so ``compat.check`` has nothing to bind there. What can break instead is
the server: the speculative method, the KV connector named on its command line, the config keys the
command passes, its flags, what the connector writes and returns, and the request/response fields
the client reads. This op checks those on the vLLM the host's interpreter would import (its sources,
parsed: nothing is imported), one check per need, each ``ok`` true, false (a finding, with the file
and what to do) or null (could not be decided, with the reason).

``op_check(args)``
    command: [str, ...]    the server command as the playbook fills it for the host
    client_command: [str, ...]
                           the client command as filled (its --request-timeout and --concurrency decide the
                           ``abort-safe`` check on a connector that is not abort-safe; absent: not decided)
                           (``-m vllm.entrypoints.cli.main serve MODEL --flag value ...``)
    client: {class: [field, ...]}
                           request/response fields the flow's client uses, by class name in vLLM's
                           OpenAI protocol module (CompletionRequest, CompletionResponse, ...)
    python: str            the server's interpreter: its sys.path is read (default: this interpreter)
    sys_path: [str, ...]   search path (default: ``python``'s sys.path)
    Returns {"python", "library": {"name", "version", "path"} | None, "checks": [{id, what, ok,
    detail, where, fix, severity}], "elapsed_s"}.

The checks of the model the command serves (``serve MODEL``: a directory, or an HF id in the local hub
cache), contract.SERVED_MODEL_CHECKS: ``trust-remote-code`` (its config.json / tokenizer_config.json name custom code in
``auto_map`` and the command has no --trust-remote-code: severity "warning", since the code may also be
one transformers knows) and ``aux-layer-ids`` (the draft config's eagle_aux_hidden_state_layer_ids
against what the model's forward captures on this vLLM: agent/check/auxcapture.py). A model that is
not there is one undecided ``model`` check.

Also used, unchanged, by benchmarks/evidence/server_flow_evidence.py over each release's unpacked sources:
one implementation of the evidence and of the host's check.
"""

import ast
import json
import os
import re
import sys
import time

from .core.pythons import sys_path_of
from .protocol import AgentFailure
from .resolve.base import Ent
from .resolve.resolver import StaticResolver
from .resolve.sigmodel import Unknown

PROTOCOLS = ("vllm.entrypoints.openai.completion.protocol", "vllm.entrypoints.openai.protocol")
ENGINE_ARGS = "vllm.engine.arg_utils:EngineArgs"
# FrontendArgs moved: openai/ (<= 0.28), launchers/ (0.29-0.32), common/ (0.33)
FRONTEND_ARGS = tuple("vllm.entrypoints.%s.cli_args:FrontendArgs" % d for d in ("openai", "launchers", "common"))
SPEC_CONFIG = "vllm.config.speculative:SpeculativeConfig"
KV_CONFIG = "vllm.config.kv_transfer:KVTransferConfig"
# the flags whose value is a JSON object the checks read
SPEC_FLAGS = ("--speculative_config", "--speculative-config")
KV_FLAGS = ("--kv_transfer_config", "--kv-transfer-config")
NO_CHUNKED = "--no-enable-chunked-prefill"
NO_PREFIX = "--no-enable-prefix-caching"
TP_FLAGS = ("--tensor-parallel-size", "--tensor_parallel_size", "-tp")
# the client's option and its default (speculators 0.9.0 vllm_client.DEFAULT_REQUEST_TIMEOUT, --concurrency)
CLIENT_TIMEOUT, CLIENT_TIMEOUT_DEFAULT, CLIENT_CONCURRENCY_DEFAULT = "--request-timeout", 120.0, 32
# on a connector that is not abort-safe: seconds of client timeout per request ahead in vLLM's queue (at most
# concurrency - 1 prefill-only requests ahead, FCFS); a prefill of max_model_len tokens that takes longer is
# a stalled server, which the job's watchdog stops anyway
QUEUE_WAIT_PER_REQUEST_S = 600
# where the connector builds the slot mapping it reads: the forward's (only the tokens this step computes:
# vLLM #44485 with prefix caching on) or the request's whole block table (cached blocks included)
FORWARD_SLOTS = "get_forward_context().slot_mapping"
TRUST = "--trust-remote-code"
EXTRACT_HS = "v1/spec_decode/extract_hidden_states.py"
STACK = "self.hidden_states[:num_tokens] = stacked_hidden_states"
RUNNER = "v1/worker/gpu_model_runner.py"
EAGLE3_REFUSAL = "Model does not support EAGLE3 interface"


def _library_root(sys_path, name="vllm"):
    for entry in sys_path:
        if not entry or not os.path.isdir(entry):
            continue
        init = os.path.join(entry, name, "__init__.py")
        if os.path.isfile(init):
            return os.path.join(entry, name), entry
    return None, None


def _version(site, name="vllm"):
    try:
        for d in os.listdir(site):
            if d.lower().startswith(name + "-") and d.endswith((".dist-info", ".egg-info")):
                return d[len(name) + 1:].rsplit(".", 1)[0]
    except OSError:
        pass
    return None


def parse_command(command):
    """(module, subcommand, {flag: value or None}) of a ``python -m MODULE SUB ... --flag value`` list."""
    args = [str(a) for a in command]
    module = sub = None
    if "-m" in args:
        i = args.index("-m")
        module = args[i + 1] if i + 1 < len(args) else None
        sub = args[i + 2] if i + 2 < len(args) and not args[i + 2].startswith("-") else None
    flags = {}
    for i, a in enumerate(args):
        if not a.startswith("--"):
            continue
        if "=" in a:
            k, _, v = a.partition("=")
            flags[k] = v
        else:
            nxt = args[i + 1] if i + 1 < len(args) else None
            flags[a] = nxt if nxt is not None and not nxt.startswith("--") else None
    return module, sub, flags


def _json_flag(flags, names):
    for n in names:
        if n in flags and flags[n] is not None:
            try:
                v = json.loads(flags[n])
            except ValueError as exc:
                return n, {"_error": "not JSON: %s" % exc}
            return n, v if isinstance(v, dict) else {"_error": "not a JSON object"}
    return None, None


class _Checks:
    def __init__(self, root):
        self.root = root
        self.out = []

    def rel(self, rel):
        return os.path.join(self.root, rel)

    def text(self, rel):
        try:
            with open(self.rel(rel), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError:
            return None

    def add(self, cid, what, ok, detail="", where=None, fix=None, severity=None):
        rec = {"id": cid, "what": what, "ok": ok, "detail": detail}
        if where:
            rec["where"] = where
        if fix and ok is False:
            rec["fix"] = fix
        if severity and ok is False:
            rec["severity"] = severity
        self.out.append(rec)


def _line_of(text, needle):
    i = text.find(needle)
    return text.count("\n", 0, i) + 1 if i >= 0 else 0


def _params(static, symbol):
    """Parameter names of ``module:Class`` (set), or an Unknown/str reason."""
    mod, _, qual = symbol.partition(":")
    e = static.module(mod)
    for p in qual.split("."):
        if e.kind in ("missing", "unknown"):
            break
        e = static.member(e, p)
    if e.kind in ("missing", "unknown"):
        return "%s: %s" % (symbol, e.reason)
    if e.kind not in ("class", "function"):
        return "%s is not a class" % symbol
    sig = static.signature(e)
    if isinstance(sig, Unknown):
        return "%s: %s" % (symbol, sig.reason)
    return {p.name for p in sig.params}


def op_check(args):
    t0 = time.perf_counter()
    command = args.get("command")
    if not isinstance(command, list) or not command:
        raise AgentFailure("bad-args", "serverflow.check needs the server command as a list")
    sys_path = list(args.get("sys_path") or sys_path_of(args.get("python") or sys.executable))
    client = args.get("client") or {}
    root, site = _library_root(sys_path)
    if root is None:
        raise AgentFailure("missing-target", "vllm is not installed for %s" % (args.get("python") or sys.executable),
                           "install vLLM into the server's environment")
    out = check(root, site, command, client, sys_path, args.get("client_command"))
    out["python"] = args.get("python") or sys.executable
    out["elapsed_s"] = round(time.perf_counter() - t0, 4)
    return out


def check(root, site, command, client, sys_path, client_command=None):
    """The server command's checks against the vLLM at ``root``, in order: entry point, speculative
    method, KV connector, chunked prefill, prefix caching, abort safety and the last chunk, /health, the client's
    fields, the flags, the served model."""
    c = _Checks(root)
    static = StaticResolver(sys_path)
    module, sub, flags = parse_command(command)
    _entry_point(c, module, sub)
    spec_flag, spec = _json_flag(flags, SPEC_FLAGS)
    kv_flag, kv = _json_flag(flags, KV_FLAGS)
    if spec is not None:
        _speculative(c, static, spec, spec_flag)
    base_kv = kv
    if kv is not None and kv.get("kv_connector_module_path"):
        # an out-of-tree subclass (hs_connectors' FP8HiddenStatesConnector): the checks of the vLLM connector it
        # extends apply to what it inherits
        base = _external_connector(c, kv, sys_path)
        base_kv = dict(kv, kv_connector=base) if base else None
    conn_rel, conn_src = _connector(c, static, base_kv, kv_flag) if base_kv is not None else (None, "")
    if kv is not None and kv.get("kv_connector_module_path") and conn_src:
        _write_hook(c, kv, conn_rel, conn_src, sys_path)
    refused_at = _chunked_prefill(c, kv, flags)
    if conn_src:
        _prefix_caching(c, conn_rel, conn_src, flags)
        _abort_safe(c, conn_rel, conn_src, client_command)
        _last_chunk(c, base_kv, conn_rel, conn_src, flags, refused_at)
    _health(c)
    _client_fields(c, static, root, client)
    _flags(c, static, root, flags)
    _model_checks(c, static, command, flags, spec, conn_rel if conn_src else None, conn_src)
    version = _version(site)
    return {"library": {"name": "vllm", "version": version, "path": root},
            "checks": c.out}


def _entry_point(c, module, sub):
    """The entry point and its subcommand."""
    lib = "vllm/"
    if module and module.startswith("vllm."):
        mod_rel = module[len("vllm."):].replace(".", "/") + ".py"
        have = os.path.isfile(c.rel(mod_rel))
        sub_ok = sub is None or os.path.isfile(os.path.join(os.path.dirname(c.rel(mod_rel)), sub + ".py"))
        c.add("entry-point", "%s %s" % (module, sub or ""), have and sub_ok,
              "" if have and sub_ok else "no %s%s" % (lib + mod_rel, "" if sub_ok else " or its %s command" % sub),
              fix="use the entry point this vLLM has (vllm serve)")


def _speculative(c, static, spec, spec_flag):
    """The speculative method, and what it reads of the draft config."""
    lib = "vllm/"
    spec_src = c.text("config/speculative.py") or ""
    method = spec.get("method")
    found = bool(method) and ('"%s"' % method) in spec_src
    c.add("method", "speculative method %s (config/speculative.py)" % method, found,
          "" if found else "this vLLM has no speculative method %r" % method,
          where=lib + "config/speculative.py:%d" % _line_of(spec_src, '"%s"' % method) if found else None,
          fix="a vLLM release that has it (SERVER_FLOW_EVIDENCE.md lists them)")
    if method == "extract_hidden_states":
        have = os.path.isfile(c.rel("v1/spec_decode/extract_hidden_states.py"))
        c.add("proposer", "v1/spec_decode/extract_hidden_states.py", have,
              "" if have else "the proposer module is missing")
        model_src = c.text("model_executor/models/extract_hidden_states.py") or ""
        hf = ((spec.get("draft_model_config") or {}).get("hf_config") or {})
        for key in sorted(hf):
            ok = key in model_src
            c.add("draft-config-" + key, "model_executor/models/extract_hidden_states.py reads %s" % key, ok,
                  "" if ok else "%s is not read there: the server would ignore it" % key)
    need = {k for k in spec if not k.startswith("_")}
    got = _params(static, SPEC_CONFIG)
    _fields(c, "speculative-config-keys", "SpeculativeConfig takes " + ", ".join(sorted(need)), need, got,
            spec_flag)


def _connector(c, static, kv, kv_flag):
    """The KV connector: registered, its config keys, what it writes and returns; (its module's path
    under vllm/ or None, its source or "")."""
    lib = "vllm/"
    name = kv.get("kv_connector")
    factory = c.text("distributed/kv_transfer/kv_connector/factory.py") or ""
    m = re.search(r'register_connector\(\s*"%s",\s*"([\w.]+)",\s*"(\w+)"' % re.escape(str(name)), factory)
    conn_rel = m.group(1)[len("vllm."):].replace(".", "/") + ".py" if m and m.group(1).startswith("vllm.") \
        else None
    conn_src = (c.text(conn_rel) if conn_rel else None) or ""
    c.add("connector", "%s registered (kv_connector/factory.py)" % name, bool(m and conn_src),
          "" if m and conn_src else "this vLLM does not register %r" % name,
          where=lib + "distributed/kv_transfer/kv_connector/factory.py:%d" % _line_of(factory, '"%s"' % name)
          if m else None, fix="a vLLM release that has it (SERVER_FLOW_EVIDENCE.md lists them)")
    need = {k for k in kv if not k.startswith("_")}
    got = _params(static, KV_CONFIG)
    _fields(c, "kv-transfer-config-keys", "KVTransferConfig takes " + ", ".join(sorted(need)), need, got,
            kv_flag)
    if conn_src:
        for key in sorted((kv.get("kv_connector_extra_config") or {})):
            ok = '"%s"' % key in conn_src
            c.add("connector-reads-" + key, "connector reads kv_connector_extra_config.%s" % key, ok,
                  "" if ok else "%s does not read %r: the setting would be ignored" % (conn_rel, key),
                  where=(lib + conn_rel + ":%d" % _line_of(conn_src, '"%s"' % key)) if ok else None)
        writes = '"hidden_states":' in conn_src and '"token_ids":' in conn_src and "save_file" in conn_src
        c.add("connector-writes", "connector writes hidden_states + token_ids (safetensors)", writes,
              "" if writes else "the file the client reads has changed in %s" % conn_rel)
        ret = re.search(r'return (True|False), \{"hidden_states_path": ', conn_src)
        c.add("connector-returns", "connector returns kv_transfer_params.hidden_states_path", bool(ret),
              "" if ret else "%s returns no hidden_states_path" % conn_rel,
              where=(lib + conn_rel + ":%d" % _line_of(conn_src, ret.group(0))) if ret else None)
        if ret and ret.group(1) == "True":
            # the file is written after the response (blocks freed later): the client must wait
            # on the <file>.lock the connector holds while it writes
            lock = '".lock"' in conn_src
            c.add("connector-write-lock", "connector writes after the response and holds <file>.lock meanwhile",
                  lock, "" if lock else "asynchronous write without a lock file: the client could read a "
                  "partial file")
    return conn_rel, conn_src


def _module_file(sys_path, module):
    rel = module.replace(".", os.sep) + ".py"
    for entry in sys_path:
        if entry and os.path.isfile(os.path.join(entry, rel)):
            return os.path.join(entry, rel)
    return None


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _external_connector(c, kv, sys_path):
    """A connector loaded from kv_connector_module_path (vLLM's factory imports that module and takes the class
    named kv_connector): the module on the server's search path, the class in it, and the vLLM connector it
    extends. Returns that vLLM connector's name, or None."""
    module, name = kv["kv_connector_module_path"], kv.get("kv_connector")
    what = "%s in %s (kv_connector_module_path), on the server's interpreter" % (name, module)
    path = _module_file(sys_path, str(module))
    if path is None:
        c.add("connector-module", what, False, "%s is not on the server interpreter's search path" % module,
              fix="install the package that has it into the server's environment (FP8HiddenStatesConnector: "
                  "hs-connectors==0.9.0, which speculators 0.9.0 requires), or the var hidden_states_dtype: bf16")
        return None
    src = _read(path)
    m = re.search(r"^class %s\(\s*([\w.]+)\s*\)" % re.escape(str(name)), src, re.M)
    if not m:
        c.add("connector-module", what, False, "%s defines no class %s" % (path, name),
              fix="a release of that package that has it (hs-connectors 0.9.0)")
        return None
    base = m.group(1).rsplit(".", 1)[-1]
    c.add("connector-module", what, True, "class %s(%s)" % (name, m.group(1)),
          where="%s:%d" % (path, _line_of(src, m.group(0))))
    return base


def _write_hook(c, kv, conn_rel, conn_src, sys_path):
    """The vLLM connector's methods the subclass overrides must be called there: FP8HiddenStatesConnector
    overrides only ``_write_tensors`` (the writer thread's save), which ExampleHiddenStatesConnector has from
    vLLM 0.22.0; before, the override is never run and the files are written in bf16 without scales."""
    path = _module_file(sys_path, str(kv["kv_connector_module_path"]))
    src = _read(path) if path else ""
    for hook in sorted(set(re.findall(r"\n    def (_\w+)\(", src))):
        if hook.startswith("__"):
            continue
        call = "self.%s," % hook if "self.%s," % hook in conn_src else "self.%s(" % hook
        where_sub = "%s:%d" % (path, _line_of(src, "def %s(" % hook))
        what = "vLLM's %s calls %s, which %s overrides (%s)" % (EXAMPLE_HS if EXAMPLE_HS in conn_src else conn_rel,
                                                                hook, kv.get("kv_connector"), where_sub)
        if call in conn_src:
            c.add("connector-hook-" + hook, what, True, "", where="vllm/%s:%d" % (conn_rel, _line_of(conn_src, call)))
        else:
            c.add("connector-hook-" + hook, what, False, "vllm/%s never calls %s: the override is never run (%s "
                  "writes what the vLLM connector writes: bf16 states, no scales)" % (conn_rel, hook,
                                                                                     kv.get("kv_connector")),
                  fix="a vLLM release whose connector has it (%s: vLLM >= 0.22.0; the shipped playbook claims "
                      "0.24-0.33), or the var hidden_states_dtype: bf16" % hook)


def _chunked_prefill(c, kv, flags):
    """Chunked prefill: some releases refuse this connector with chunked prefill on. Returns where this
    vLLM refuses it (``vllm/config/vllm.py:N``), or None."""
    lib = "vllm/"
    vcfg = c.text("config/vllm.py") or ""
    if kv is not None and kv.get("kv_connector"):
        name = kv["kv_connector"]
        pat = re.search(r'kv_connector == "%s"\s*\n\s*and self\.scheduler_config\.enable_chunked_prefill'
                        % re.escape(name), vcfg)
        if pat:
            off = NO_CHUNKED in flags
            c.add("chunked-prefill", "%s refuses chunked prefill here: the command turns it off" % name, off,
                  "" if off else "this vLLM raises ValueError at start-up ('%s does not support chunked "
                  "prefill') unless the server runs with %s" % (name, NO_CHUNKED),
                  where=lib + "config/vllm.py:%d" % _line_of(vcfg, pat.group(0)),
                  fix="add %s to the server command (the playbook eagle3-speculators-0.9.0-no-chunked-prefill "
                      "does)" % NO_CHUNKED)
            return lib + "config/vllm.py:%d" % _line_of(vcfg, pat.group(0))
        c.add("chunked-prefill", "%s allows chunked prefill (vLLM's default)" % name, True,
              "the command turns it off" if NO_CHUNKED in flags else "")
    return None


def _health(c):
    """GET /health."""
    health = False
    for dirpath, _dirs, files in os.walk(c.rel("entrypoints")):
        for f in files:
            if f.endswith(".py"):
                try:
                    with open(os.path.join(dirpath, f), encoding="utf-8", errors="replace") as fh:
                        if '"/health"' in fh.read():
                            health = True
                            break
                except OSError:
                    continue
        if health:
            break
    c.add("health", "GET /health route", health, "" if health else "no /health route in vllm/entrypoints")


def _client_fields(c, static, root, client):
    """The request/response fields the client uses."""
    proto = next((m for m in PROTOCOLS if os.path.isfile(os.path.join(os.path.dirname(root),
                                                                       m.replace(".", "/") + ".py"))), PROTOCOLS[-1])
    for cls in sorted(client):
        need = set(client[cls])
        _fields(c, "fields-" + cls, "%s has %s" % (cls, ", ".join(sorted(need))), need,
                _params(static, "%s:%s" % (proto, cls)), None)


def _parser_options(static, module):
    """The option strings (``--api-server-count``, ``-asc``, ...) of the ``add_argument(...)`` calls in
    ``module``'s ``make_arg_parser``: flags ``vllm serve`` takes that are no EngineArgs/FrontendArgs parameter
    (a set), or a str reason. Literal strings only, read from the parsed source."""
    mod = static.load(module)
    if isinstance(mod, Ent):
        return "%s: %s" % (module, mod.reason)
    fn = next((st for st in mod.tree.body if isinstance(st, ast.FunctionDef) and st.name == "make_arg_parser"), None)
    if fn is None:
        return "%s defines no make_arg_parser" % module
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            out.update(a.value for a in node.args
                       if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-"))
    return out


def _flags(c, static, root, flags):
    """Every flag is an EngineArgs or FrontendArgs parameter (--no-X: the boolean X), or an option that
    make_arg_parser adds itself in the module that has FrontendArgs (--api-server-count / -asc, --headless,
    --config, ...). A flag none of them has is a finding; where make_arg_parser's options could not be read,
    such a flag is not decided rather than reported."""
    eng = _params(static, ENGINE_ARGS)
    where = next((s for s in FRONTEND_ARGS
                  if os.path.isfile(os.path.join(os.path.dirname(root), s.partition(":")[0].replace(".", "/") + ".py"))),
                 None)
    front = _params(static, where) if where else "FrontendArgs: none of %s" % ", ".join(FRONTEND_ARGS)
    what = "every flag of the server command is an EngineArgs/FrontendArgs parameter"
    if isinstance(eng, set) and isinstance(front, set):
        known = eng | front
        unknown = []
        for f in flags:
            n = f[2:].replace("-", "_")
            if n not in known and not (n.startswith("no_") and n[3:] in known):
                unknown.append(f)
        parser = _parser_options(static, where.partition(":")[0]) if unknown else set()
        if isinstance(parser, set):
            # vLLM's FlexibleArgumentParser takes --a_b for --a-b
            own = {o[2:].replace("-", "_") if o.startswith("--") else o for o in parser}
            unknown = [f for f in unknown if (f[2:].replace("-", "_") if f.startswith("--") else f) not in own]
            c.add("flags", what, not unknown, "" if not unknown else "unknown: " + ", ".join(unknown),
                  fix="remove or rename the flag (vllm serve --help lists this release's)")
        else:
            c.add("flags", what, None, "not EngineArgs/FrontendArgs parameters: %s; %s" % (", ".join(unknown), parser))
    else:
        c.add("flags", what, None, "; ".join(x for x in (eng, front) if isinstance(x, str)))


def served_model(command):
    """MODEL of ``... serve MODEL ...`` (or --model), None when the command names none."""
    args = [str(a) for a in command]
    if "serve" in args:
        i = args.index("serve")
        if i + 1 < len(args) and not args[i + 1].startswith("-"):
            return args[i + 1]
    _m, _s, flags = parse_command(args)
    return flags.get("--model")


def remote_code(cfg, cfg_path, reads):
    """[(file name, [auto_map classes])] of a checkpoint's config.json (and its text_config) and the
    tokenizer_config.json beside it: custom code the loaders run only when trusted."""
    out = []
    maps = [m for m in (cfg.get("auto_map"), (cfg.get("text_config") or {}).get("auto_map")) if isinstance(m, dict)]
    if maps:
        out.append(("config.json", sorted({k for m in maps for k in m})))
    tok = os.path.join(os.path.dirname(cfg_path), "tokenizer_config.json")
    if reads.exists(tok):
        try:
            t = json.loads(reads.text(tok))
        except (OSError, UnicodeDecodeError, ValueError):
            t = None
        if isinstance(t, dict) and isinstance(t.get("auto_map"), dict) and t["auto_map"]:
            out.append(("tokenizer_config.json", sorted(t["auto_map"])))
    return out


def _model_checks(c, static, command, flags, spec, conn_rel=None, conn_src=""):
    from .check.checkpoint import read_config
    from .core.reads import Reads
    model = served_model(command)
    if not model:
        return
    reads = Reads()
    cfg_path, cfg, problem = read_config(model, reads)
    if cfg is None:
        c.add("model", "the served model %s" % model, None,
              "%s: its remote code and layer ids not checked" % (problem or "%s is neither a directory here nor "
                                                                 "in the local HF hub cache" % model))
        return
    # custom code (auto_map) and --trust-remote-code
    found = remote_code(cfg, cfg_path, reads)
    trusted = TRUST in flags
    what = ", ".join("%s auto_map (%s)" % (f, ", ".join(k)) for f, k in found)
    c.add("trust-remote-code", "the model's custom code (auto_map) and %s" % TRUST, not found or trusted,
          "" if not found or trusted else "%s names custom code and the server command has no %s: vLLM runs "
          "a checkpoint's own code only with it" % (what, TRUST),
          where=cfg_path if found else None,
          fix="set the playbook var trust_remote_code: true (the host's vars in the inventory) after reading "
              "that code", severity="warning")
    if conn_src:
        _mla_tp(c, cfg, cfg_path, flags, spec, conn_rel, conn_src)
    # the aux layer ids against what the model's forward captures
    hf = ((spec or {}).get("draft_model_config") or {}).get("hf_config") or {}
    ids = hf.get("eagle_aux_hidden_state_layer_ids")
    if not isinstance(ids, list):
        return
    _aux_layer_ids(c, static, cfg, cfg_path, reads, ids)


def _aux_layer_ids(c, static, cfg, cfg_path, reads, ids):
    from .check.auxcapture import capture, delegates
    from .check.checkpoint import num_layers
    from .model import registry        # as imports.py: the registry read once, in model.py
    what = "aux layer ids %s captured by the model's forward" % ids
    n = num_layers(cfg)
    if n is None:
        c.add("aux-layer-ids", what, None, "%s has no num_hidden_layers (nor text_config's)" % cfg_path)
        return
    bad = [i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i <= n]
    if bad:
        c.add("aux-layer-ids", what, False, "%s not in 0..%d (id k is the input of decoder layer k; %d: the last "
              "layer's output)" % (bad, n, n), fix="set the var layer_ids to ids in 0..%d" % n)
        return
    reg = registry(static, "vllm", reads)
    archs = list(cfg.get("architectures") or []) + list((cfg.get("text_config") or {}).get("architectures") or [])
    got, tried, queue = None, [], list(archs)
    while queue:    # a wrapper with no capturing forward of its own: the text model it builds (delegates)
        arch = queue.pop(0)
        ent = (reg[1] if reg else {}).get(arch)
        if ent is None:
            continue
        rel = "model_executor/models/%s.py" % ent[0]
        src = c.text(rel)
        if src is None or rel in tried:
            continue
        tried.append(rel)
        got = capture("vllm/" + rel, src)
        if got is not None:
            break
        queue += [a for a in delegates(src) if a not in archs]
        archs += [a for a in delegates(src) if a not in archs]
    if got is None and tried:
        # no forward of the model's classes gathers aux states: the worker refuses the model at load
        runner = c.text(RUNNER) or ""
        line = _line_of(runner, EAGLE3_REFUSAL)
        c.add("aux-layer-ids", what, False, "no forward in %s gathers aux hidden states (%s): this vLLM cannot "
              "extract hidden states of this model%s" % (", ".join("vllm/" + t for t in tried), ", ".join(archs),
                                                          (": vllm/%s:%d raises RuntimeError('%s...') at load"
                                                           % (RUNNER, line, EAGLE3_REFUSAL)) if line else ""),
              where=("vllm/%s:%d" % (RUNNER, line)) if line else None,
              fix="a vLLM release whose model class for %s supports EAGLE-3 (SupportsEagle3)" % archs[0])
        return
    if not isinstance(got, dict):
        c.add("aux-layer-ids", what, None, got if isinstance(got, str) else
              "no model module of %s in this vLLM's registry" % archs)
        return
    where = "%s:%d" % (got["path"], got["line"])
    missing, why = [], []
    if n in ids and not got["last_id"]:
        missing.append(n)
        why.append("%s.forward (%s) gathers an aux state only before decoder layer idx, idx < %d, and never "
                   "after the last layer: id %d is never met" % (got["class"], where, n, n))
    if 0 in ids and got["first_id_adds_none"]:
        missing.append(0)
        why.append("id 0 adds residual, None before the first layer (%s): TypeError" % where)
    if not missing:
        c.add("aux-layer-ids", what, True, "%s.forward, %s" % (got["class"], got["shape"]),
              where=("%s:%d" % (got["path"], got["last_line"])) if n in ids and got["last_line"] else where)
        return
    hs = c.text(EXTRACT_HS) or ""
    # without id n (and no TypeError first), the proposer gets one state fewer than its buffer has slots
    stack = ("; %s:%d then stacks %d state(s) for %d ids (a shape error at the first request, or with one "
             "state left, that one copied into every slot)" % ("vllm/" + EXTRACT_HS, _line_of(hs, STACK),
                                                               len(ids) - 1, len(ids))) \
        if STACK in hs and missing == [n] else ""
    lo, hi = (1 if got["first_id_adds_none"] else 0), (n if got["last_id"] else n - 1)
    example = sorted({min(max(i, lo), hi) for i in ids})
    c.add("aux-layer-ids", what, False, "ids %s will not be captured on this vLLM: %s%s"
          % (missing, "; ".join(why), stack), where=where,
          fix="set the var layer_ids to ids in %d..%d (id k = the output of decoder layer k-1), e.g. %s"
              % (lo, hi, example))


def _fields(c, cid, what, need, got, flag):
    if isinstance(got, str):
        c.add(cid, what, None, "not decided: " + got)
        return
    missing = sorted(need - got)
    c.add(cid, what, not missing, "" if not missing else "missing " + ", ".join(missing),
          fix=("remove %s from %s" % (", ".join(missing), flag)) if flag else "a vLLM release whose API has them")


def _prefix_caching(c, conn_rel, conn_src, flags):
    """vLLM #44485 (reported on 0.22.0): with prefix caching on, a connector that reads the forward's slot
    mapping captures only the tokens this step computes, so a prompt with a cached prefix gets
    hidden_states shorter than token_ids. Off on the command: holds on every release."""
    what = "prefix caching off, or the connector captures every token (vLLM #44485)"
    fwd = conn_src.find(FORWARD_SLOTS)
    where = "vllm/%s:%d" % (conn_rel, _line_of(conn_src, FORWARD_SLOTS)) if fwd >= 0 else None
    if NO_PREFIX in flags:
        c.add("prefix-caching", what, True, "the command turns it off (%s)" % NO_PREFIX)
    elif fwd >= 0:
        c.add("prefix-caching", what, False, "prefix caching is on (vLLM's default) and the connector reads the "
              "forward's slot mapping: a prompt whose prefix is cached gets the states of its uncached tokens only, "
              "hidden_states shorter than token_ids (vLLM #44485)", where=where,
              fix="add %s to the server command (the shipped eagle3-speculators-0.9.0 playbooks do)" % NO_PREFIX)
    else:
        c.add("prefix-caching", what, None, "prefix caching is on (vLLM's default); the connector reads the "
              "request's whole block table, cached blocks included, and whether those blocks hold this request's "
              "states is not decided from the source (vLLM #44485); %s settles it" % NO_PREFIX)


def _method(conn_src, name):
    """The source of the connector class's method ``name`` (up to the next method), or None."""
    m = re.search(r"\n    def %s\(.*?(?=\n    def |\n    @|\n\S|\Z)" % name, conn_src, re.S)
    return m.group(0) if m else None


def _request_finished(conn_src):
    return _method(conn_src, "request_finished")


def _abort_safe(c, conn_rel, conn_src, client_command):
    """vLLM #56841 ("Make ExampleHiddenStatesConnector abort-safe"): request_finished popped the request's
    file name without a default; a request aborted while queued (a client timeout) was never given one,
    and the KeyError killed EngineCore and every API process. Where the connector is not abort-safe, the
    client's timeout must be long enough that no queued request is aborted."""
    what = "an aborted queued request cannot kill the server (vLLM #56841)"
    body = _request_finished(conn_src)
    pops = re.findall(r"self\._request_filenames\.pop\(\s*req_id\s*(,[^)]*)?\)", body or "")
    if not body or not pops:
        c.add("abort-safe", what, None, "vllm/%s: no request_finished popping _request_filenames: not decided"
              % conn_rel)
        return
    unsafe = "self._request_filenames.pop(req_id)"
    if all(p for p in pops):
        fixed = "if filename is None" in body
        needle = "_request_filenames.pop(req_id,"
        c.add("abort-safe", what, True, ("#56841's guard: a request never scheduled has no file and frees its blocks"
                                         if fixed else "request_finished pops the file name with a default: no "
                                         "KeyError for a request never scheduled"),
              where="vllm/%s:%d" % (conn_rel, _line_of(conn_src, needle)))
        return
    where = "vllm/%s:%d" % (conn_rel, _line_of(conn_src, unsafe))
    crash = ("request_finished pops the file name without a default (%s): a request aborted while queued (a client "
             "timeout) raises KeyError, EngineCore dies and every API process with it (fixed by vLLM #56841)" % unsafe)
    if client_command is None:
        c.add("abort-safe", what, None, crash + "; the client's timeout is not known here", where=where)
        return
    _m, _s, cflags = parse_command(client_command)
    try:
        timeout = float(cflags.get(CLIENT_TIMEOUT) or CLIENT_TIMEOUT_DEFAULT)
        per = int(cflags.get("--concurrency") or CLIENT_CONCURRENCY_DEFAULT)
        clients = int(cflags.get("--clients") or 1)   # run_clients.py --clients N: N x --concurrency in flight
    except ValueError:
        c.add("abort-safe", what, None, crash + "; the client's %s or --concurrency is not a number"
              % CLIENT_TIMEOUT, where=where)
        return
    conc = per * max(clients, 1)
    shown = "--concurrency %d" % per + (" x --clients %d" % clients if clients > 1 else "")
    need = QUEUE_WAIT_PER_REQUEST_S * max(conc, 1)
    ok = timeout >= need
    c.add("abort-safe", what, ok, crash + ("; the client waits %gs with %d in flight (>= %ds per request ahead of a "
                                           "queued one): it aborts no queued request"
                                           % (timeout, conc, QUEUE_WAIT_PER_REQUEST_S) if ok else
                                           "; the client's %s is %gs with %s: a request queued behind "
                                           "the others can time out and be aborted" % (CLIENT_TIMEOUT, timeout, shown)),
          where=where, fix="a vLLM release with #56841's change, or the var request_timeout >= %d (%ds x concurrency "
                           "%d)" % (need, QUEUE_WAIT_PER_REQUEST_S, conc))


# the last chunk of a chunked prompt: how build_connector_meta treats a partially prefilled request the scheduler
# gave no new block (its get_block_ids(allow_none=True) is None), and a connector that saves in request_finished
EXAMPLE_HS = "ExampleHiddenStatesConnector"
SKIP_NO_BLOCKS = re.compile(r"if new_block_ids is None:\s*\n\s*continue\b")
ASSERT_BLOCKS = "assert new_block_ids is not None"
SAVE_AT_FINISH = re.compile(r"self\._pending_saves\[req_id\]\s*=")
LAST_CHUNK_FIX = ("run the server with %s: the playbook eagle3-speculators-0.9.0-no-chunked-prefill (its "
                  "max_num_batched_tokens, when set, must be >= max_model_len)" % NO_CHUNKED)


def _last_chunk(c, kv, conn_rel, conn_src, flags, refused_at):
    """With chunked prefill on, ExampleHiddenStatesConnector writes a request's file at each step that names it
    in the step's metadata. vLLM 0.18-0.21's build_connector_meta names a partially prefilled request only when
    the scheduler gave it new blocks, so a last chunk that fits in the blocks it has is never written: the file
    keeps what the KV slots held before that chunk ran (right shape, wrong states); 0.17's asserts instead, and
    the scheduler dies. A connector that saves in request_finished writes after the whole prompt."""
    if kv.get("kv_connector") != EXAMPLE_HS:
        return
    what = "with chunked prefill, a prompt's last chunk is written (the connector names it in that step's metadata)"
    if NO_CHUNKED in flags:
        c.add("last-chunk", what, True, "the command turns chunked prefill off (%s): each prompt is prefilled and "
              "written in one step" % NO_CHUNKED)
        return
    if refused_at:
        c.add("last-chunk", what, True, "not reached: this vLLM refuses %s with chunked prefill at start-up (%s, "
              "check chunked-prefill)" % (EXAMPLE_HS, refused_at), where=refused_at)
        return
    rel = "vllm/" + conn_rel
    meta = _method(conn_src, "build_connector_meta")
    skip = SKIP_NO_BLOCKS.search(meta or "")
    when = ("with chunked prefill on (vLLM's default), a prompt whose later chunk fits in the blocks it already has "
            "gets no new block from the scheduler (get_block_ids(allow_none=True) is None)")
    if skip or ASSERT_BLOCKS in (meta or ""):
        needle = skip.group(0).splitlines()[0] if skip else ASSERT_BLOCKS
        detail = ("%s, and build_connector_meta then leaves it out of the step's metadata (`%s continue`): when that "
                  "is the last chunk the file is not written again, so its last tokens hold what the KV slots held "
                  "before that chunk ran: wrong hidden states of the right shape (the client's --validate-outputs "
                  "passes)" % (when, needle.strip()) if skip else
                  "%s, and build_connector_meta asserts it has one (`%s`): AssertionError in the scheduler, the "
                  "server dies" % (when, ASSERT_BLOCKS))
        c.add("last-chunk", what, False, detail, where="%s:%d" % (rel, _line_of(conn_src, needle)),
              fix=LAST_CHUNK_FIX)
        return
    finished = _method(conn_src, "request_finished") or ""
    save = SAVE_AT_FINISH.search(finished)
    if save:
        c.add("last-chunk", what, True, "the connector saves in request_finished, after the whole prompt, from the "
              "request's blocks", where="%s:%d" % (rel, _line_of(conn_src, save.group(0))))
        return
    c.add("last-chunk", what, None, "not decided: build_connector_meta neither skips nor asserts a request without "
          "new blocks (`new_block_ids`), and request_finished does not save (`_pending_saves[req_id] =`)",
          where="%s:%d" % (rel, _line_of(conn_src, "def build_connector_meta(")) if meta else None)


# the model families whose KV cache is MLA (DeepSeek-V2/V3, Kimi-K2/K2.5: config.json has kv_lora_rank)
KV_PLANNING = ("v1/core/kv_cache_planning.py", "v1/core/kv_cache_utils.py")
PAGE_FIX = "def _ensure_min_page_size("
HIDDEN_ALIGN = "# Add hidden-state layers back with page aligned to the common page."
MLA_REFUSAL = "MLA verifiers are unsupported"


def _mla_tp(c, cfg, cfg_path, flags, spec, conn_rel, conn_src):
    """An MLA checkpoint (DeepSeek-V3, Kimi) served with tensor_parallel_size > 1: whether this release has
    the page-size fix (vLLM #50894 for #51016: TP-sharded pages smaller than the hidden-state cost per token
    failed an assertion at start) and whether the connector accepts the model's KV cache groups (the newest
    refuses a hidden-state layer that is not in its own group: "MLA verifiers are unsupported")."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    if "kv_lora_rank" not in cfg and "kv_lora_rank" not in text:
        return
    tp_raw = next((flags[f] for f in TP_FLAGS if flags.get(f) is not None), "1")
    try:
        tp = int(tp_raw)
    except ValueError:
        c.add("mla-tp-page-size", "tensor_parallel_size of an MLA model", None, "not a number: %r" % tp_raw)
        return
    if tp <= 1:
        return
    arch = ", ".join(cfg.get("architectures") or text.get("architectures") or [cfg.get("model_type") or "?"])
    rel, src = next(((r, c.text(r)) for r in KV_PLANNING if c.text(r) and "HiddenStateCacheSpec" in c.text(r)),
                    (None, None))
    what = "KV page size of %s (MLA) at tensor_parallel_size %d (vLLM #51016, fix #50894)" % (arch, tp)
    if src is None:
        c.add("mla-tp-page-size", what, True, "this release has no separate hidden-state KV cache group (the code "
              "#51016 fails in)")
    elif PAGE_FIX in src:
        c.add("mla-tp-page-size", what, True, "#50894's _ensure_min_page_size scales the pages",
              where="vllm/%s:%d" % (rel, _line_of(src, PAGE_FIX)))
    else:
        c.add("mla-tp-page-size", what, None, "this release aligns the hidden-state group to the common page "
              "without #50894's scaling: start-up fails (#51016) when a page is smaller than the hidden-state cost "
              "of one token; that depends on the block size vLLM picks at start, not decided from the source",
              where="vllm/%s:%d" % (rel, _line_of(src, HIDDEN_ALIGN)) if HIDDEN_ALIGN in src else None)
    what = "the connector accepts the KV cache groups of %s (MLA) at tensor_parallel_size %d" % (arch, tp)
    if MLA_REFUSAL in conn_src:
        c.add("mla-kv-groups", what, None, "the connector refuses a hidden-state layer not isolated in its own KV "
              "cache group ('%s'); how this model's layers are grouped is decided at start, not from the source"
              % MLA_REFUSAL, where="vllm/%s:%d" % (conn_rel, _line_of(conn_src, MLA_REFUSAL)))
    else:
        c.add("mla-kv-groups", what, None, "this connector has no check of the KV cache groups ('%s' is not in "
              "vllm/%s): it reads the first group's blocks; which group holds the hidden states is decided at start"
              % (MLA_REFUSAL, conn_rel))
