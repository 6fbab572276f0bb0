"""Long form of the fault-injection, fuzzing and injection suites; prints the figures and writes
benchmarks/FAULTS.md.

    python benchmarks/faults/suites.py --trials 100            # ~6 minutes on an idle 2-CPU machine
    python benchmarks/faults/suites.py --trials 20 --fuzz 50   # a quick look

Trials: patch / rollback / extract launch under agent kills at every commit point, sshd session kills,
TCP cuts after a random byte count in either direction (tests/faults/cutproxy.py), controller SIGKILLs
at random moments, plus rounds of 8 controllers patching at once (tests/faults/harness.py).
Fuzzing: tests/cli/test_fuzz.py with ``--fuzz`` examples per property. Injection: tests/security/test_hostile_values.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402


class _Collect:
    def __init__(self):
        self.passed = self.failed = 0
        self.failures: list[str] = []

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.failed) or \
                (report.when == "teardown" and report.failed):
            if report.passed and report.when == "call":
                self.passed += 1
            elif report.failed:
                self.failed += 1
                self.failures.append(f"{report.nodeid}: {str(report.longrepr)[-600:]}")


def run_pytest(paths: list[str], extra_env: dict) -> _Collect:
    import pytest
    os.environ.update(extra_env)
    c = _Collect()
    pytest.main(["-q", "-p", "no:cacheprovider", *paths], plugins=[c])
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--concurrent-rounds", type=int, default=3)
    ap.add_argument("--fuzz", type=int, default=300, help="hypothesis examples per fuzzed property")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "FAULTS.md"))
    a = ap.parse_args()
    os.chdir(REPO)
    from tests.faults.harness import Rig, fault_plan

    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="remote-ops-faults-"))
    rig = Rig(root, seed=a.seed, log=lambda m: print(m, flush=True))
    try:
        rig.calibrate()
        for action, fault in fault_plan(a.trials, random.Random(a.seed)):
            rig.trial(action, fault)
        for _ in range(a.concurrent_rounds):
            rig.concurrent(8)
    finally:
        rig.close()
    figs = rig.figures()
    trial_s = time.monotonic() - t0

    t1 = time.monotonic()
    from tests.faults import FUZZ_COUNTER
    fz = run_pytest(["tests/cli/test_fuzz.py"], {"REMOTE_OPS_FUZZ_EXAMPLES": str(a.fuzz), "REMOTE_OPS_FUZZ_RANDOM": "1"})
    fuzz_inputs = FUZZ_COUNTER["inputs"]
    fuzz_s = time.monotonic() - t1

    t2 = time.monotonic()
    sec = run_pytest(["tests/security/test_hostile_values.py"], {})
    canaries = sum("an injected command ran" in f for f in sec.failures)
    sec_s = time.monotonic() - t2

    faults_total = sum(figs["faults"].values())
    rounds = figs["concurrent_rounds"]
    rows = [
        ("trials run", figs["trials"]),
        ("faults injected (hit an operation in flight)", faults_total),
        *[(f"  {k}", v) for k, v in figs["faults"].items()],
        ("faults that did not fire (not counted above)", sum(figs["not_fired"].values())),
        *[(f"  {k}", v) for k, v in figs["not_fired"].items()],
        ("rounds of concurrent controllers (no fault)",
         f"{len(rounds)} x {rounds[0]} controllers" if rounds else 0),
        ("files found partial or corrupted", figs["partial_or_corrupted"]),
        ("stuck locks", figs["stuck_locks"]),
        ("reruns that did not complete", figs["reruns_failed"]),
        ("trials leaving temp files / pending intents", figs["leftover_files"]),
        ("trials with journal/backup problems", figs["journal_problems"]),
        ("launches with two copies of the job", figs["duplicate_jobs"]),
        ("inputs fuzzed (inventory, playbook, argv)", fuzz_inputs),
        ("fuzz failures (tracebacks, multi-line or wrong status)", fz.failed),
        ("security tests passed / failed", f"{sec.passed} / {sec.failed}"),
        ("injection canaries triggered", canaries),
    ]
    width = max(len(r[0]) for r in rows)
    table = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    print("\n" + table)
    print(f"\ntrials {trial_s:.0f}s, fuzzing {fuzz_s:.0f}s, security {sec_s:.0f}s")
    failed = figs["failed_trials"]
    cmd = "python benchmarks/faults/suites.py " + " ".join(sys.argv[1:])
    md = [f"# Fault-injection figures\n", f"Command: `{cmd.strip()}` (seed {a.seed}) on commit "
          f"{provenance.commit() or 'not recorded'}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; trials {trial_s:.0f}s, fuzzing {fuzz_s:.0f}s, "
          f"security {sec_s:.0f}s.\n", "```", table, "```\n",
          "Each trial asserts on disk: target bytes are exactly the original or the fully patched text, the lock is "
          "free, a rerun completes, then no temp file or write-ahead intent is left, the journal has exactly the "
          "expected open patch whose checksum matches the file, every backup holds the original bytes and is "
          "private; an extract launch never has two jobs running at once (supervisor records).\n",
          "A fault is counted as injected only when it demonstrably hit an operation in flight: the host agent "
          "recorded that it reached the commit point where it was killed, the sshd kill found a live session, the "
          "proxy cut a connection, the controller was killed while it had an SSH session or a host agent running. "
          "The others did not fire (the reasons are listed) and are not counted as faults; their trials still "
          "check every invariant above. Concurrent controllers are listed as rounds, not as faults.\n"]
    if failed or fz.failures or sec.failures:
        md.append("## Failures\n")
        md += [f"- `{json.dumps(f, default=str)[:800]}`" for f in failed]
        md += [f"- {f[:800]}" for f in fz.failures + sec.failures]
    Path(a.out).write_text("\n".join(md) + "\n")
    print(f"wrote {a.out}")
    bad = figs["partial_or_corrupted"] + figs["stuck_locks"] + len(failed) + fz.failed + canaries + sec.failed
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
