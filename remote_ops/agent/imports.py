"""Import probe: can the job's interpreter, with the job's environment, import the job's modules?

Runs ``python -c PROBE`` in the job's workdir with the job's env (no secrets), in its own session,
killed after ``timeout`` seconds. The probe imports each module in order and reports the first
failure with the versions of the distributions involved: the module's own package, every
installed package a traceback frame passes through, and the names the caller asks for (the
playbook's ``requires``). A failure is the ``import-failed`` kind, which the controller maps to its
own exit status.
"""

import json
import os
import signal
import subprocess
import sys

from .core.pythons import sys_path_of
from .protocol import AgentFailure

# Runs in the job's interpreter: stdlib only, prints one JSON line.
PROBE = r'''
import importlib, json, os, sys, traceback
mods, extra = json.loads(sys.argv[1]), json.loads(sys.argv[2])
_DISTS = []
def dists():
    """importlib.metadata.packages_distributions(), read once (it scans every installed package)."""
    if not _DISTS:
        try:
            from importlib import metadata
            _DISTS.append(metadata.packages_distributions())
        except Exception:
            _DISTS.append({})
    return _DISTS[0]
def versions(names):
    try:
        from importlib import metadata
    except ImportError:
        return {}
    out = {}
    for n in names:
        for d in dists().get(n) or [n]:
            try:
                out[d] = metadata.version(d)
            except Exception:
                pass
    return out
STDLIB = {os.path.realpath(os.path.dirname(os.__file__)),
          os.path.realpath(os.path.join(os.path.dirname(os.__file__), "lib-dynload"))}
PATHS = sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}, key=len, reverse=True)
def top_of(filename):
    """The top-level package a traceback frame's file belongs to, through the sys.path entry that
    holds it (site-packages, dist-packages, a PYTHONPATH folder, ...); None for the stdlib."""
    fn = os.path.realpath(filename)
    for entry in PATHS:   # longest first: site-packages before the stdlib folder that holds it
        if fn.startswith(entry + os.sep):
            if entry in STDLIB:
                return None
            top = fn[len(entry) + 1:].split(os.sep)[0]
            return top[:-3] if top.endswith(".py") else top
    return None
def required_loaded(top):
    """Import names of the distributions that ``top``'s distribution requires and that the failed
    import had loaded (e.g. speculators -> transformers, pydantic)."""
    try:
        from importlib import metadata
    except ImportError:
        return []
    mods_of = {}
    for mod, owners in dists().items():
        for o in owners:
            mods_of.setdefault(o.lower().replace("-", "_"), []).append(mod)
    names = []
    for dist in dists().get(top) or [top]:
        try:
            reqs = metadata.requires(dist) or []
        except Exception:
            continue
        for r in reqs:
            if "extra ==" in r.replace('"', "").replace("'", ""):
                continue
            name = r.split(";")[0].strip()
            for ch in "<>=!~[( ":
                name = name.split(ch)[0]
            for mod in mods_of.get(name.lower().replace("-", "_"), []):
                if mod in sys.modules and mod not in names:
                    names.append(mod)
    return names
res = {"ok": True, "versions": {}, "python": sys.version.split()[0], "executable": sys.executable}
for m in mods:
    try:
        importlib.import_module(m)
    except BaseException as exc:
        tops = [m.split(".")[0]]
        for fr in traceback.extract_tb(exc.__traceback__):
            top = top_of(fr.filename)
            if top and top not in tops:
                tops.append(top)
        for top in required_loaded(m.split(".")[0]):
            if top not in tops:
                tops.append(top)
        msg = str(exc).strip().splitlines()
        res.update(ok=False, module=m, error="%s: %s" % (type(exc).__name__, msg[0] if msg else ""),
                   packages=tops, traceback=traceback.format_exc()[-4000:])
        res["versions"] = versions(tops + extra)
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        if missing and missing.split(".")[0] not in res["versions"]:
            res["versions"][missing.split(".")[0]] = "not installed"
        break
if res["ok"]:
    res["versions"] = versions([m.split(".")[0] for m in mods] + extra)
sys.stdout.flush()
sys.__stdout__.write("\n@@remote-ops-probe@@" + json.dumps(res) + "\n")
'''
MARK = "@@remote-ops-probe@@"


def _fmt_versions(v):
    return ", ".join("%s %s" % (k, v[k]) for k in sorted(v))


def model_module(model, library="vllm", workdir=None, sys_path=None):
    """(module, note): the library module of the class its model registry picks for the checkpoint's
    config.json ``architectures`` (e.g. vllm.model_executor.models.kimi_k25 for Kimi-K2.5), read from
    the sources (nothing imported); module None with the reason when it cannot be told."""
    from .check.checkpoint import read_config
    from .core.reads import Reads
    from .model import registry
    from .resolve.resolver import StaticResolver
    reads = Reads()
    path, cfg, problem = read_config(model, reads, workdir)
    if cfg is None:
        return None, problem or "%s is not a directory here nor in the local HF hub cache" % model
    archs = [a for a in cfg.get("architectures") or [] if isinstance(a, str)]
    reg = registry(StaticResolver(sys_path or sys.path, reads=reads), library, reads)
    if reg is None:
        return None, "%s has no model registry here" % library
    for arch in archs:
        if arch in reg[1]:
            return "%s.model_executor.models.%s" % (library, reg[1][arch][0]), None
    return None, "no architecture of %s (%s) is in %s's registry" % (path, ", ".join(archs) or "none", library)


def op_probe(args):
    """args: python, modules, env, workdir, timeout, packages, unless_running (a job key), model (a
    checkpoint: the library module of the class its registry picks is imported too, last).
    Result: {ok, skipped?, modules, versions, seconds, model_module?, model_note?}; an import failure
    raises import-failed."""
    modules = list(args.get("modules") or [])
    extra = {}
    if args.get("model"):
        # the registry of the vLLM the job's interpreter imports (its sys.path, with the job's env)
        mod, note = model_module(args["model"], workdir=args.get("workdir"),
                                 sys_path=sys_path_of(args.get("python") or sys.executable, args.get("env")))
        if mod and mod not in modules:
            modules.append(mod)
        extra = {"model_module": mod} if mod else {"model_note": "the model's module was not probed: %s" % note}
    if not modules:
        return {"ok": True, "modules": [], "versions": {}, "skipped": "no modules to check"}
    key = args.get("unless_running")
    if key:
        from .job import status as jobstatus
        running = jobstatus.running_job(key)
        if running:
            return {"ok": True, "modules": modules, "versions": {},
                    "skipped": "job %s is running" % running}
    python = args.get("python") or sys.executable
    timeout = float(args.get("timeout") or 120)
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (args.get("env") or {}).items()})
    workdir = os.path.expanduser(args.get("workdir") or "~")
    cwd = workdir if os.path.isdir(workdir) else None
    import time
    t0 = time.time()
    try:
        proc = subprocess.Popen([python, "-c", PROBE, json.dumps(modules), json.dumps(args.get("packages") or [])],
                                cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        raise AgentFailure("import-failed", "cannot run %s to check imports: %s" % (python, exc.strerror or exc),
                           "set 'python' in the inventory to the job's interpreter")
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.communicate()
        raise AgentFailure("import-failed", "import %s did not finish within %g s" % (", ".join(modules), timeout),
                           "a hung import (a CUDA or network call at import time?); raise "
                           "extract.import_check_timeout_seconds if the host is just slow",
                           modules=modules, timed_out=True)
    seconds = round(time.time() - t0, 2)
    text = out.decode("utf-8", "replace")
    res = None
    if MARK in text:
        try:
            res = json.loads(text.rsplit(MARK, 1)[1].strip().splitlines()[0])
        except (ValueError, IndexError):
            res = None
    if res is None:
        last = [l for l in text.strip().splitlines() if l.strip()][-1:] or ["no output"]
        raise AgentFailure("import-failed", "the import check of %s died (exit %s): %s"
                           % (", ".join(modules), proc.returncode, last[0][:300]),
                           "run %s -c 'import %s' on the host to see why" % (python, modules[0]),
                           modules=modules)
    if not res["ok"]:
        versions = res.get("versions") or {}
        msg = "import %s failed: %s" % (res["module"], res["error"])
        if versions:
            msg += " (%s)" % _fmt_versions(versions)
        raise AgentFailure("import-failed", msg,
                           "the job would fail the same way at start; fix the packages of %s "
                           "or change extract.import_check" % res.get("executable", python),
                           module=res["module"], versions=versions, packages=res.get("packages"),
                           traceback=res.get("traceback"), python=res.get("executable"))
    return dict({"ok": True, "modules": modules, "versions": res.get("versions") or {},
                 "python": res.get("executable"), "seconds": seconds}, **extra)
