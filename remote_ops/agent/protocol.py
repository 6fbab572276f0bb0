"""Wire protocol of the agent: JSON request on stdin, JSON lines on stdout.

Request: ``{"ops": [{"op": "module.name", "args": {...}}, ...], "env": {...}}``.
Output lines: ``{"event": {...}, "i": N}`` while op N streams, then one final
``{"results": [{"ok": true, "result": ...} | {"ok": false, "error": {...}}, ...]}``.
Ops of one request run in order; a failed op does not stop the ones after it unless the
request says ``"stop_on_error": true``.
"""

import os
import sys

from .core import jsonio  # json's own C codec without importing json (and re): see jsonio

# Filled by the bootstrap: how the agent's code was obtained ("hit": the host's cache,
# "filled": compiled and stored, "shipped"/"off"/"unwritable"/"unsafe": compiled from stdin only).
BOOT = {}
# Caches an op keeps for the life of its process that are only valid for one request (directory
# listings and the like). A one-shot agent never sees them go stale; a resident agent (``resident``)
# empties every one of them before each request. Caches keyed by content (resolve/modules.py's parsed
# trees, keyed by the source text itself) are not registered: they stay valid and are the point.
PER_REQUEST = []


def per_request(cache):
    """Register a process-level cache that must be emptied between a resident agent's requests."""
    PER_REQUEST.append(cache)
    return cache


# What the check memo did in this request (``memo``): {"hit"|"miss"|"stale"|"damaged": count}
MEMO = per_request({})
_CO_GENERATOR = 0x20   # inspect.CO_GENERATOR, without importing inspect (~10 ms on a small host)


class AgentFailure(Exception):
    """An expected failure, reported to the controller as a typed error (not a crash)."""

    def __init__(self, kind, message, hint=None, **details):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.hint = hint
        self.details = details

    def to_json(self):
        out = {"kind": self.kind, "message": self.message, "hint": self.hint}
        out.update(self.details)
        return out


def _emit(obj, out):
    out.write(jsonio.dumps(obj, default=str) + "\n")
    out.flush()


def _run_one(spec, index, out, package):
    name = spec.get("op", "")
    args = spec.get("args") or {}
    module_name, _, func_name = name.rpartition(".")
    if not module_name or not func_name.isidentifier() or not all(
            p.isidentifier() for p in module_name.split(".")):
        raise AgentFailure("bad-op", "unknown agent operation %r" % name)
    try:
        # importlib.import_module("." + module_name, package) without importing importlib
        full = package + "." + module_name
        __import__(full)
        module = sys.modules[full]
    except ModuleNotFoundError:
        raise AgentFailure("bad-op", "unknown agent module %r" % module_name)
    func = getattr(module, "op_" + func_name, None)
    if func is None:
        raise AgentFailure("bad-op", "unknown agent operation %r" % name)
    code = getattr(func, "__code__", None)
    if code is not None and code.co_flags & _CO_GENERATOR:
        gen = func(args)
        while True:
            try:
                event = next(gen)
            except StopIteration as stop:
                return stop.value
            _emit({"event": event, "i": index}, out)
    return func(args)


_SINCE = [0.0, 0.0]   # (process CPU, children CPU) when the current request began (resident: not 0)


def agent_stats():
    """This process's own CPU (interpreter start to now) and its waited-for children's, and how
    the agent's code was obtained: the host-side cost of one exec, for Session.stats. A resident
    agent reports the CPU of this request alone (its start and bootstrap were paid once, before)."""
    import time
    t = os.times()
    return {"cpu_s": round(time.process_time() - _SINCE[0], 4),
            "children_cpu_s": round(t.children_user + t.children_system - _SINCE[1], 4),
            "cache": BOOT.get("cache"),
            # of cpu_s: the interpreter's own start before the bootstrap ran, and the bootstrap
            # (reading the request, the cache or the shipped sources, compiling)
            "start_cpu_s": BOOT.get("start_cpu_s"), "boot_cpu_s": BOOT.get("boot_cpu_s"),
            **({"memo": dict(MEMO)} if MEMO else {})}


def serve(stdin, out, package, request_text=None):
    """Read one request from ``stdin`` (or take ``request_text``) and answer it on ``out``."""
    try:
        request = jsonio.loads((stdin.read() if request_text is None else request_text) or "{}")
    except ValueError as exc:
        _emit({"results": [{"ok": False, "error": {"kind": "bad-request", "message": str(exc)}}],
               "agent": agent_stats()}, out)
        return 2
    # set by bundle's wrapper when python3 was looked up through a login shell: report what was
    # found, so the controller runs it directly (with that PATH) for the rest of the session
    login = os.environ.pop("REMOTE_OPS_LOGIN_LOOKUP", None) or BOOT.get("login")
    env = request.get("env") or {}
    for key, value in env.items():
        os.environ[str(key)] = str(value)
    results = []
    for index, spec in enumerate(request.get("ops") or []):
        try:
            results.append({"ok": True, "result": _run_one(spec, index, out, package)})
        except AgentFailure as exc:
            results.append({"ok": False, "error": exc.to_json()})
        except Exception as exc:  # a crash: report it with the traceback, keep serving
            import traceback   # only then (~3 ms of every exec otherwise)
            results.append({"ok": False, "error": {
                "kind": "crash", "message": "%s: %s" % (type(exc).__name__, exc),
                "traceback": traceback.format_exc()}})
        if request.get("stop_on_error") and not results[-1]["ok"]:
            break
    final = {"results": results, "agent": agent_stats()}
    if login:
        final["login"] = {"executable": sys.executable, "path": os.environ.get("PATH", "")}
    _emit(final, out)
    return 0


def main(package, request_text=None):
    stdin = sys.stdin
    out = sys.stdout
    # Nothing an op prints by accident may corrupt the protocol stream.
    sys.stdout = sys.stderr
    return serve(stdin, out, package, request_text)


SERVED = b'{"served":'   # a resident agent's end-of-request line: {"served": <exit status>}
RESTART = b'{"restart":'  # its answer instead, unanswered, when its sys.path may be stale: start a new one


def _path_state():
    """What decides the sys.path a new interpreter would get, cheaply comparable: whether each path
    entry and site directory exists, and the .pth files in them (names, mtime, size: one added,
    removed or edited). A resident agent whose state differs from its start's must not answer
    (``pip install -e``, a conda change: a new process would see another sys.path). Packages
    installed or replaced without a .pth file do not count: the path is the same, and the import
    system's directory caches are emptied before every request anyway."""
    import site

    dirs = list(sys.path)
    try:
        dirs += list(site.getsitepackages()) + [site.getusersitepackages()]
    except AttributeError:   # an old virtualenv's site module
        pass
    state = []
    for d in dirs:
        d = d or "."
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".pth"))
        except NotADirectoryError:
            state.append((d, "file"))
            continue
        except OSError:
            state.append((d, None))
            continue
        state.append((d, "dir"))
        for n in names:
            try:
                st = os.stat(os.path.join(d, n))
                state.append((d, n, st.st_mtime_ns, st.st_size))
            except OSError:
                state.append((d, n, None))
    return state


def resident(package, stdin=None, out=None):
    """A long-lived agent (``--persist``: the kept connection's process keeps one per host): reads
    requests framed as ``<n>\\n`` + n bytes of request JSON from stdin (after one first line
    ``{"resident": {"cache", "pid"}}`` saying it is ready), answers each exactly as a
    one-shot agent would (the same output lines), then writes ``{"served": <status>}``. Ends at EOF
    (the kept connection closed its channel). Between requests the process is put back as it began:
    the environment, the working directory, sys.path, every ``per_request`` cache, importlib's
    directory caches. Only operations the contract declares ``resident`` are sent here (none imports
    a host package in this process or changes process state beyond that). When what decides a new
    interpreter's sys.path changed since it started (``_path_state``), it answers a request with
    ``{"restart": ...}`` instead, without running it, and exits: the kept connection then starts a
    new one and sends it the request."""
    import importlib
    import json   # once per resident process (one-shot agents use jsonio)
    import time

    stdin = stdin or sys.stdin.buffer
    out = out or sys.stdout
    sys.stdout = sys.stderr   # nothing an op prints by accident may corrupt the protocol stream
    login = os.environ.pop("REMOTE_OPS_LOGIN_LOOKUP", None)
    if login:
        BOOT["login"] = login
    base_env, base_cwd, base_path = dict(os.environ), os.getcwd(), list(sys.path)
    base_state = _path_state()
    out.write(json.dumps({"resident": {"cache": BOOT.get("cache"), "pid": os.getpid()}}) + "\n")
    out.flush()
    BOOT.update(cache="resident", start_cpu_s=0.0, boot_cpu_s=0.0)
    while True:
        line = stdin.readline()
        if not line.strip():
            return 0
        try:
            n = int(line)
        except ValueError:
            return 2
        body = stdin.read(n)
        if len(body) < n:
            return 0
        if _path_state() != base_state:
            out.write(json.dumps({"restart": "the interpreter's path changed since this agent started"}) + "\n")
            out.flush()
            return 0
        t = os.times()
        _SINCE[:] = [time.process_time(), t.children_user + t.children_system]
        try:
            status = serve(None, out, package, body.decode("utf-8"))
        finally:
            os.environ.clear()
            os.environ.update(base_env)
            try:
                os.chdir(base_cwd)
            except OSError:
                pass
            sys.path[:] = base_path
            for cache in PER_REQUEST:
                cache.clear()
            importlib.invalidate_caches()
        out.write('{"served":%d}\n' % status)
        out.flush()
