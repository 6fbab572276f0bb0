"""Agent op ``serverflow.check``: what a server-flow playbook's server command needs of the host's vLLM.

The server flow (playbooks/eagle3-speculators-0.9.0.yaml) patches nothing and calls no vLLM function
from speculators' modules, so ``compat.check`` has nothing to bind there. What can break instead is
the server: the speculative method, the KV connector named on its command line, the config keys the
command passes, its flags, what the connector writes and returns, and the request/response fields
the client reads. This op checks those on the vLLM the host's interpreter would import (its sources,
parsed: nothing is imported), one check per need, each ``ok`` true, false (a finding, with the file
and what to do) or null (could not be decided, with the reason).

``op_check(args)``
    command: [str, ...]    the server command as the playbook fills it for the host
                           (``-m vllm.entrypoints.cli.main serve MODEL --flag value ...``)
    client: {class: [field, ...]}
                           request/response fields the flow's client uses, by class name in vLLM's
                           OpenAI protocol module (CompletionRequest, CompletionResponse, ...)
    python: str            the server's interpreter: its sys.path is read (default: this interpreter)
    sys_path: [str, ...]   search path (default: ``python``'s sys.path)
    Returns {"python", "library": {"name", "version", "path"} | None, "checks": [{id, what, ok,
    detail, where, fix}], "elapsed_s"}.

Also used, unchanged, by benchmarks/server_flow_evidence.py over each release's unpacked sources:
one implementation of the evidence and of the host's check.
"""

import json
import os
import re
import sys
import time

from .core.pythons import sys_path_of
from .protocol import AgentFailure
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

    def add(self, cid, what, ok, detail="", where=None, fix=None):
        rec = {"id": cid, "what": what, "ok": ok, "detail": detail}
        if where:
            rec["where"] = where
        if fix and ok is False:
            rec["fix"] = fix
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
    out = check(root, site, command, client, sys_path)
    out["python"] = args.get("python") or sys.executable
    out["elapsed_s"] = round(time.perf_counter() - t0, 4)
    return out


def check(root, site, command, client, sys_path):
    c = _Checks(root)
    static = StaticResolver(sys_path)
    module, sub, flags = parse_command(command)
    lib = "vllm/"

    # the entry point and its subcommand
    if module and module.startswith("vllm."):
        mod_rel = module[len("vllm."):].replace(".", "/") + ".py"
        have = os.path.isfile(c.rel(mod_rel))
        sub_ok = sub is None or os.path.isfile(os.path.join(os.path.dirname(c.rel(mod_rel)), sub + ".py"))
        c.add("entry-point", "%s %s" % (module, sub or ""), have and sub_ok,
              "" if have and sub_ok else "no %s%s" % (lib + mod_rel, "" if sub_ok else " or its %s command" % sub),
              fix="use the entry point this vLLM has (vllm serve)")

    spec_flag, spec = _json_flag(flags, SPEC_FLAGS)
    kv_flag, kv = _json_flag(flags, KV_FLAGS)
    spec_src = c.text("config/speculative.py") or ""

    # the speculative method, and what it reads of the draft config
    if spec is not None:
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

    # the KV connector: registered, its config keys, what it writes and returns
    conn_src = ""
    if kv is not None:
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

    # chunked prefill: some releases refuse this connector with chunked prefill on
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
                  fix="add %s to the server command (playbooks/eagle3-speculators-0.9.0-no-chunked-prefill.yaml "
                      "does)" % NO_CHUNKED)
        else:
            c.add("chunked-prefill", "%s allows chunked prefill (vLLM's default)" % name, True,
                  "the command turns it off" if NO_CHUNKED in flags else "")

    # GET /health
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

    # the request/response fields the client uses
    proto = next((m for m in PROTOCOLS if os.path.isfile(os.path.join(os.path.dirname(root),
                                                                       m.replace(".", "/") + ".py"))), PROTOCOLS[-1])
    for cls in sorted(client):
        need = set(client[cls])
        _fields(c, "fields-" + cls, "%s has %s" % (cls, ", ".join(sorted(need))), need,
                _params(static, "%s:%s" % (proto, cls)), None)

    # every flag is an EngineArgs or FrontendArgs parameter (--no-X: the boolean X)
    eng = _params(static, ENGINE_ARGS)
    front = next((_params(static, s) for s in FRONTEND_ARGS
                  if os.path.isfile(os.path.join(os.path.dirname(root), s.partition(":")[0].replace(".", "/") + ".py"))),
                 "FrontendArgs: none of %s" % ", ".join(FRONTEND_ARGS))
    if isinstance(eng, set) and isinstance(front, set):
        known = eng | front
        unknown = []
        for f in flags:
            n = f[2:].replace("-", "_")
            if n not in known and not (n.startswith("no_") and n[3:] in known):
                unknown.append(f)
        c.add("flags", "every flag of the server command is an EngineArgs/FrontendArgs parameter", not unknown,
              "" if not unknown else "unknown: " + ", ".join(unknown),
              fix="remove or rename the flag (vllm serve --help lists this release's)")
    else:
        c.add("flags", "every flag of the server command is an EngineArgs/FrontendArgs parameter", None,
              "; ".join(x for x in (eng, front) if isinstance(x, str)))
    version = _version(site)
    return {"library": {"name": "vllm", "version": version, "path": root},
            "checks": c.out}


def _fields(c, cid, what, need, got, flag):
    if isinstance(got, str):
        c.add(cid, what, None, "not decided: " + got)
        return
    missing = sorted(need - got)
    c.add(cid, what, not missing, "" if not missing else "missing " + ", ".join(missing),
          fix=("remove %s from %s" % (", ".join(missing), flag)) if flag else "a vLLM release whose API has them")
