"""Trivial ops used to measure round trips and check the interpreter."""

import os
import sys


def op_ping(args):
    return {"pong": True, "python": sys.executable, "version": list(sys.version_info[:3]),
            "pid": os.getpid(), "echo": args.get("echo")}


def op_ticks(args):
    """Stream ``n`` timestamps, one every ``every`` seconds (measures delivery latency of events)."""
    import time
    for i in range(int(args.get("n", 10))):
        yield {"i": i, "t": time.time()}
        time.sleep(float(args.get("every", 0.1)))
    return {"done": True}
