"""What the default interpreter costs: with no ``python`` set, a session's first agent call looks
python3 up through the account's login shell (inside the same exec) and later calls run what it
found directly; against the same interpreter named by path. Over a real sshd on 127.0.0.1 (no
added latency), the two kinds interleaved so machine load hits both alike.

    python benchmarks/controller/login_python.py [--reps 20]

Prints median and p90 milliseconds of the first and of the second ``ping.ping`` of a fresh
session, for both, and the login shell used.
"""

from __future__ import annotations

import argparse
import os
import pwd
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from remote_ops.connect.inventory import Host  # noqa: E402
from remote_ops.sshd import SshdServer  # noqa: E402
from remote_ops.connect.transport import ConnectOptions, Session  # noqa: E402


def one_session(host: Host) -> tuple[float, float]:
    with Session(host, ConnectOptions()) as sess:
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            sess.call("ping.ping", {})
            times.append((time.perf_counter() - t0) * 1000)
    return times[0], times[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {"unset": [], "set": []}
    with tempfile.TemporaryDirectory() as tmp:
        server = SshdServer(Path(tmp) / "sshd").start()
        try:
            base = dict(name="bench", hostname=server.address, port=server.port, user=server.user,
                        identity_file=(str(server.identity_file),), known_hosts=str(server.known_hosts),
                        proxy_jump=())
            with Session(Host(**base), ConnectOptions()) as sess:
                resolved = sess.call("facts.gather", {})["python"]["executable"]
            for _ in range(args.reps):
                runs["unset"].append(one_session(Host(**base)))
                runs["set"].append(one_session(Host(**base, python=resolved)))
        finally:
            server.stop()

    def stat(xs):
        xs = sorted(xs)
        return f"median {statistics.median(xs):6.1f} ms  p90 {xs[int(0.9 * (len(xs) - 1))]:6.1f} ms"
    shell = pwd.getpwuid(os.getuid()).pw_shell
    for key, label in (("unset", "python unset (login shell lookup)"), ("set", f"python={resolved}")):
        print(f"{label:<48} first call {stat([a for a, _ in runs[key]])} | second call "
              f"{stat([b for _, b in runs[key]])}  (n={args.reps})")
    print(f"login shell: {shell}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
