#!/usr/bin/env python3
"""Run a server flow's client as N processes at once, each its share of the rows (stdlib only).

    python run_clients.py --clients N [--health URL] [--preload MODULE]
                          [--shard-args "--world-size {n} --rank {r}"] -- -m MODULE ARGS...
    python run_clients.py --clients N ... -- SCRIPT ARGS...

Shipped with the speculators 0.9.0 playbooks (``extract.files``) and run by the job's interpreter in the
workdir. Each client imports MODULE (``--preload``: the client's heavy imports, torch, datasets, openai...,
happen now, while the server may still be starting), then waits until URL (``--health``) answers 200
(a GET every 0.25 s; no timeout of its own: the supervisor owns the health timeout and ends the job),
then runs the target as ``python -m MODULE ARGS...`` (or ``python SCRIPT ARGS...``) would, with the
shard arguments appended when N > 1 ({n} = N, {r} = the client's rank 0..N-1; speculators'
generate-offline-data then takes its contiguous share of the first min(max_samples, rows) rows:
speculators/data_generation/offline.py get_indices_to_process).

N = 1: everything in this process; the client's output and exit status are its own.
N > 1: N child processes in this process group (the supervisor and ``stop`` signal the group and the job's
marker variable, which the children inherit), stdout and stderr inherited. SIGTERM, SIGINT and SIGHUP
are forwarded to the children; this process waits for all of them: exit status 0 when all exit 0, else
the status of the first child to fail (128 + the signal for one killed by a signal). A child that fails
does not stop the others (their rows are written; a later extract writes only the missing ones). Each
child prints one line on stderr when its work starts:
``[run_clients] rank r/N: imports 3.1 s, server ready after 40.2 s`` (seconds from the child's start).
"""

import importlib
import os
import runpy
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

USAGE = ('usage: run_clients.py --clients N [--health URL] [--preload MODULE] [--shard-args "--world-size {n} '
         '--rank {r}"] -- (-m MODULE | SCRIPT) ARGS...')
DEFAULT_SHARD_ARGS = "--world-size {n} --rank {r}"
POLL_SECONDS = 0.25
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class UsageError(Exception):
    pass


def parse(argv):
    """{"clients", "health", "preload", "shard_args", "child", "target"} of the command line."""
    if "--" not in argv:
        raise UsageError("no '--' before the client's command (-m MODULE ARGS... or SCRIPT ARGS...)")
    cut = argv.index("--")
    own, target = argv[:cut], argv[cut + 1:]
    opts = {"clients": None, "health": None, "preload": None, "shard_args": DEFAULT_SHARD_ARGS, "child": None}
    names = {"--clients": "clients", "--health": "health", "--preload": "preload", "--shard-args": "shard_args",
             "--child": "child"}
    i = 0
    while i < len(own):
        word = own[i]
        name, eq, value = word.partition("=")
        if name not in names:
            raise UsageError("unknown option %r" % word)
        if not eq:
            if i + 1 >= len(own):
                raise UsageError("%s needs a value" % name)
            i += 1
            value = own[i]
        opts[names[name]] = value
        i += 1
    raw = opts["clients"]
    if raw is None:
        raise UsageError("--clients N is required")
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise UsageError("--clients must be an integer >= 1, got %r" % raw)
    opts["clients"] = int(raw)
    if opts["child"] is not None:
        try:
            opts["child"] = int(opts["child"])
        except ValueError:
            raise UsageError("--child must be a rank, got %r" % opts["child"]) from None
        if not 0 <= opts["child"] < opts["clients"]:
            raise UsageError("--child %d is not a rank of %d clients" % (opts["child"], opts["clients"]))
    if opts["health"] is not None and not opts["health"].startswith(("http://", "https://")):
        raise UsageError("--health must be an http:// URL, got %r" % opts["health"])
    try:
        words = shlex.split(opts["shard_args"])
        [w.format(n=1, r=0) for w in words]
    except (ValueError, KeyError, IndexError) as exc:
        raise UsageError("--shard-args %r: %s (placeholders: {n} clients, {r} rank)" % (opts["shard_args"], exc)) \
            from None
    opts["shard_args"] = words
    if not target or (target[0] == "-m" and (len(target) < 2 or not target[1])):
        raise UsageError("nothing to run after '--' (give -m MODULE ARGS... or SCRIPT ARGS...)")
    if target[0].startswith("-") and target[0] != "-m":
        raise UsageError("after '--': -m MODULE or a script path, got %r" % target[0])
    opts["target"] = target
    return opts


def wait_healthy(url):
    """Return once ``url`` answers 200; connection errors and other statuses: try again. No proxy: the
    server is on loopback, and an http_proxy in the job's environment must not carry the check elsewhere."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while True:
        try:
            with opener.open(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(POLL_SECONDS)


def run_target(target, extra):
    """Run ``target`` (["-m", MODULE, ARGS...] or [SCRIPT, ARGS...]) as python would, in this process,
    with ``extra`` appended to its arguments; its SystemExit goes through unchanged."""
    if target[0] == "-m":
        module, args = target[1], target[2:] + extra
        sys.argv = [module] + args          # run_module sets argv[0] to the module's file
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, args = target[0], target[1:] + extra
        sys.argv = [script] + args
        runpy.run_path(script, run_name="__main__")


def client(opts, rank):
    """One client: preload, wait for the server, run the target with its share (``rank`` None: N = 1,
    nothing appended, nothing printed)."""
    t0 = time.monotonic()
    # sys.path[0] as python gives the target (the preload imports as the target will): the working
    # directory for `-m MODULE`, the script's folder for a script
    target = opts["target"]
    sys.path[0] = os.getcwd() if target[0] == "-m" else os.path.dirname(os.path.abspath(target[0]))
    if opts["preload"]:
        importlib.import_module(opts["preload"])
    imported = time.monotonic()
    if opts["health"]:
        wait_healthy(opts["health"])
    ready = time.monotonic()
    extra = []
    if rank is not None:
        n = opts["clients"]
        extra = [w.format(n=n, r=rank) for w in opts["shard_args"]]
        sys.stderr.write("[run_clients] rank %d/%d: imports %.1f s, %s\n" % (
            rank, n, imported - t0,
            "server ready after %.1f s" % (ready - t0) if opts["health"] else "no health check"))
        sys.stderr.flush()
    run_target(opts["target"], extra)


def supervise(argv, opts):
    """Start the N children, forward the signals, wait for all: the exit status."""
    n = opts["clients"]
    me = os.path.abspath(__file__)
    children = {}                              # pid -> rank, while not reaped
    received = []

    def forward(signum, _frame):
        received.append(signum)
        for pid in list(children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    for s in FORWARDED:
        signal.signal(s, forward)
    for rank in range(n):
        if received:                           # signalled while starting them: start no more
            break
        proc = subprocess.Popen([sys.executable, me, "--child", str(rank)] + argv)
        proc.returncode = 0                    # reaped below with os.wait, not by Popen
        children[proc.pid] = rank
    started = len(children)
    status = 0
    while children:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            break
        if pid not in children:
            continue
        del children[pid]
        if os.WIFSIGNALED(raw):
            code = 128 + os.WTERMSIG(raw)
        else:
            code = os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else 1
        if code and not status:
            status = code
    if started < n and not status:             # ranks never started: their rows are not done
        status = 128 + received[0]
    return status


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        opts = parse(argv)
    except UsageError as exc:
        sys.stderr.write("run_clients.py: %s (%s)\n" % (exc, USAGE))
        return 2
    if opts["child"] is not None:
        client(opts, opts["child"])
        return 0
    if opts["clients"] == 1:
        client(opts, None)
        return 0
    return supervise(argv, opts)


if __name__ == "__main__":
    sys.exit(main())
