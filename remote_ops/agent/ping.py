"""Trivial ops used to measure round trips and check the interpreter."""

import os
import sys


def op_ping(args):
    return {"pong": True, "python": sys.executable, "version": list(sys.version_info[:3]),
            "pid": os.getpid(), "echo": args.get("echo")}
