"""Ctrl-C trials: SIGINT at a random moment of `patch --yes`, `rollback` and `extract` (launch) over a
real sshd on loopback; after each, the host's own record (the patch journal, the job directory) is
compared with what the command said.

    .venv/bin/python benchmarks/faults/sigint_trials.py --trials 30          # prints the tally (~15 min)
    .venv/bin/python benchmarks/faults/sigint_trials.py --trials 30 --json out.json
    .venv/bin/python benchmarks/faults/sigint_trials.py --from-json benchmarks/results/sigint_trials.json \
        --md benchmarks/SIGINT_TRIALS.md                                # the recorded run, tallied again

A trial matches when the command's words agree with the host:
  exit 0      the command's own success output names what changed (journal id / job id), and it did;
  exit 130    stderr says "interrupted after <what> (<id>)" naming the journal entry / job that the
              host really has, or "interrupted before anything changed on HOST" and nothing changed.
Anything else (a bare "interrupted" while the host changed, success output then exit 130, a
traceback) is a mismatch. The signal goes to the command's process group, as a terminal's Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402

HOST = "trialhost"
PLAYBOOK = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"


class Rig:
    """A real sshd, a host Python holding speculators 0.3.0 + vLLM 0.17.0 sources, an inventory."""

    def __init__(self, root: Path):
        from remote_ops import pkgsource
        from remote_ops.sshd import SshdServer

        self.root = root
        self.server = SshdServer(root / "sshd").start()
        self.python = pkgsource.make_env(root / "venv", [("speculators", "0.3.0"), ("vllm", "0.17.0")])
        self.state = root / "host-state"
        self.state.mkdir()
        self.work = root / "work"
        self.work.mkdir()
        import yaml
        entry = {"hostname": self.server.address, "port": self.server.port, "user": self.server.user,
                 "identity_file": str(self.server.identity_file), "known_hosts": str(self.server.known_hosts),
                 "python": str(self.python), "workdir": str(self.work), "playbook": str(PLAYBOOK),
                 "env": {"REMOTE_OPS_STATE_DIR": str(self.state)}}
        self.inventory = root / "inventory.yaml"
        self.inventory.write_text(yaml.safe_dump({"hosts": {HOST: entry}}, sort_keys=False))
        # the launch trials: a job that sleeps (no torch needed), stopped after each trial
        self.job_playbook = root / "sleeper.yaml"
        self.job_playbook.write_text(yaml.safe_dump({"name": "sleeper", "extract": {
            "command": ["{python}", "-c", "import time; time.sleep(120)"], "workdir": str(self.work),
            "output_dir": str(root / "out"), "stop_grace_seconds": 1}}, sort_keys=False))
        self.env = dict(os.environ, REMOTE_OPS_INVENTORY=str(self.inventory), REMOTE_OPS_PERSIST="0",
                        REMOTE_OPS_PLAN_CACHE=str(root / "plans"), REMOTE_OPS_MUX_DIR=str(root / "mux"))

    def close(self) -> None:
        try:
            self.stop_jobs()          # no sleeper left behind, even when the trials were interrupted
        finally:
            self.server.stop()

    # ---------------------------------------------------------------- the host's own record
    def journal(self) -> list[dict]:
        p = self.state / "journal" / "journal.jsonl"
        if not p.exists():
            return []
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]

    def open_patches(self) -> list[str]:
        entries = self.journal()
        undone = {e.get("of") for e in entries if e.get("action") == "rollback"}
        return [e["txid"] for e in entries if e.get("action") == "patch" and e["txid"] not in undone]

    def jobs(self) -> list[str]:
        root = self.state / "jobs"
        return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.exists() else []

    # ---------------------------------------------------------------- commands
    def ro(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([sys.executable, "-m", "remote_ops", *args], cwd=REPO, env=self.env,
                           capture_output=True, text=True, timeout=300)
        if check and p.returncode != 0:
            raise RuntimeError(f"remote-ops {' '.join(args)} -> {p.returncode}: {p.stderr.strip()}")
        return p

    def interrupted(self, args: list[str], delay: float) -> tuple[int, str, str, bool]:
        """Run ``remote-ops ARGS``; SIGINT its process group after ``delay`` s (unless it ended)."""
        p = subprocess.Popen([sys.executable, "-m", "remote_ops", *args], cwd=REPO, env=self.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        sent = False
        try:
            p.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGINT)
            sent = True
        out, err = p.communicate(timeout=300)
        return p.returncode, out, err, sent

    def set_state(self, op: str) -> None:
        """Before a trial: patch trials start unpatched, rollback trials patched, launch trials jobless."""
        if op == "patch" and self.open_patches():
            self.ro("rollback", HOST)
        if op == "rollback" and not self.open_patches():
            self.ro("patch", HOST, "--yes")
        if op == "extract":
            self.stop_jobs()

    def stop_jobs(self) -> None:
        self.ro("stop", HOST, "--playbook", str(self.job_playbook), "--grace", "1", check=False)
        import shutil
        shutil.rmtree(self.state / "jobs", ignore_errors=True)

    def command(self, op: str) -> list[str]:
        return {"patch": ["patch", HOST, "--yes"], "rollback": ["rollback", HOST],
                "extract": ["extract", HOST, "--playbook", str(self.job_playbook)]}[op]


def verdict(op: str, rc: int, out: str, err: str, before: dict, after: dict) -> tuple[bool, str]:
    """Whether what the command said matches what the host has; and the case's name."""
    if op == "patch":
        new = [t for t in after["open"] if t not in before["open"]]
        ids, changed_word = new, "the patch was applied"
    elif op == "rollback":
        ids = [t for t in before["open"] if t not in after["open"]]
        changed_word = "the rollback was done"
    else:
        ids = [j for j in after["jobs"] if j not in before["jobs"]]
        changed_word = "the job was started"
    changed = bool(ids)
    if "Traceback" in err:
        # Python's own start (runpy, importlib) before any remote-ops code: it says nothing of the host
        early = err.strip().endswith("KeyboardInterrupt") and f"{REPO}/remote_ops/" not in err
        if early and not changed and not out:
            return True, "killed while Python started"
        return False, "traceback"
    if rc == 0:
        if not changed:
            return False, "exit 0, nothing changed"
        if op == "extract":
            return (ids[0] in out, "finished")
        return (all(i in out for i in ids), "finished")
    if rc == -signal.SIGINT and not changed and not out:
        return True, "killed before it started"       # the signal came before Python's own handler
    if rc != 130:
        return False, f"exit {rc}" + (" after its success output" if out else "")
    if changed:
        ok = f"interrupted after {changed_word}" in err and all(i in err for i in ids)
        return ok, "interrupted after the change" if ok else "interrupted, change not reported"
    # (before the command line was read, no host is named: nothing was contacted)
    ok = re.search(rf"interrupted before anything changed( on {HOST})?$", err.strip()) is not None
    return ok, "interrupted before any change" if ok else "interrupted, unclear message"


def state(rig: Rig) -> dict:
    return {"open": rig.open_patches(), "jobs": rig.jobs()}


def tally(rows: list[dict], ops: list[str], seed) -> list[str]:
    out = [f"SIGINT trials over a real sshd (seed {seed}):"]
    for op in ops:
        mine = [r for r in rows if r["op"] == op]
        cases: dict = {}
        for r in mine:
            cases[r["case"]] = cases.get(r["case"], 0) + 1
        out.append(f"  {op:9s} {sum(r['match'] for r in mine)}/{len(mine)} messages match the host  "
                   + ", ".join(f"{k}: {v}" for k, v in sorted(cases.items())))
    out.append(f"  total     {sum(r['match'] for r in rows)}/{len(rows)} match")
    return out


def markdown(lines: list[str], argv: list[str], trials_by: str) -> str:
    return ("# Ctrl-C trials (issue 28)\n\n"
            "Written by `python benchmarks/faults/sigint_trials.py " + " ".join(argv) + "` from the trials it recorded "
            "(`benchmarks/results/sigint_trials.json`, run by " + trials_by + "; rerun with `--trials 30 --json FILE`)."
            "\n\n"
            "SIGINT to the command's process group (as a terminal's Ctrl-C) at a uniformly random moment in "
            "[0, 1.2 x the command's median uninterrupted time], over a real OpenSSH sshd on 127.0.0.1; after each "
            "trial the host's own record (patch journal, job directory) is compared with what the command said "
            "(see the module docstring for the cases).\n\n```\n" + "\n".join(lines) + "\n```\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=30, help="trials per operation (default 30)")
    ap.add_argument("--ops", default="patch,rollback,extract")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE", help="write every trial here")
    ap.add_argument("--from-json", metavar="FILE", help="tally the trials recorded in FILE instead of running")
    ap.add_argument("--md", metavar="FILE", help="also write the tally as Markdown")
    a = ap.parse_args(argv)
    ops = [o for o in a.ops.split(",") if o]
    if a.from_json:
        doc = json.loads(Path(a.from_json).read_text())
        rows, seed = doc["trials"], doc["seed"]
    else:
        rows, seed = run(a.trials, ops, a.seed), a.seed
    lines = tally(rows, ops, seed)
    print("\n".join(lines))
    if a.json:
        Path(a.json).write_text(json.dumps({"written_by": provenance.written_by(__file__), "seed": seed, "trials": rows},
                                           indent=1))
    if a.md:
        Path(a.md).write_text(markdown(lines, sys.argv[1:] if argv is None else list(argv),
                                       provenance.shown(doc, "benchmarks/sigint_trials.py") if a.from_json
                                       else provenance.shown({"written_by": provenance.written_by(__file__)})))
    return 0 if all(r["match"] for r in rows) else 1


def run(trials: int, ops: list[str], seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sigint-trials-") as tmp:
        rig = Rig(Path(tmp))
        try:
            rig.ro("hosts")
            for op in ops:
                spans = []
                for _ in range(3):     # the first run may compute and cache a plan: the median of 3
                    rig.set_state(op)
                    t0 = time.monotonic()
                    rig.ro(*rig.command(op))
                    spans.append(time.monotonic() - t0)
                span = sorted(spans)[1]
                for i in range(trials):
                    rig.set_state(op)
                    before = state(rig)
                    delay = rng.uniform(0.0, span * 1.2)
                    rc, out, err, sent = rig.interrupted(rig.command(op), delay)
                    after = state(rig)
                    ok, case = verdict(op, rc, out, err, before, after)
                    rows.append({"op": op, "trial": i, "delay_s": round(delay, 3), "signal_sent": sent, "rc": rc,
                                 "match": ok, "case": case, "stderr": err.strip()[-400:]})
                    if not ok:
                        print(f"MISMATCH {op} #{i} delay {delay:.2f}s rc {rc} ({case}): {err.strip()[-300:]!r}",
                              file=sys.stderr)
        finally:
            rig.close()
    return rows


if __name__ == "__main__":
    sys.exit(main())
