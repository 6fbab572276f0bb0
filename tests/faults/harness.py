"""Fault-injection trials against a real sshd and real files.

One *trial* runs a controller (``patch``, ``rollback`` or ``launch`` of an extract job) in its own
process, injects one fault while it runs, then inspects what is on the host's disk:

- the target's bytes are exactly the original or exactly the fully patched text (never partial);
- the transaction lock can be taken (a dead controller leaves no stuck lock);
- rerunning the same command completes it, after which no temporary file is left beside the target,
  no write-ahead intent is pending, the journal holds exactly one open patch whose checksums match
  the file and whose backup holds the original bytes (private, never more readable than the target);
- for an extract launch: after the rerun exactly one copy of the job runs.

Faults: ``agent-kill@POINT`` (the host agent dies at a commit point, REMOTE_OPS_FAULT), ``sshd-kill``
(the sshd process serving the session is SIGKILLed at a random moment), ``cut-up`` / ``cut-down``
(a TCP proxy in front of sshd resets the connection after N bytes in one direction),
``controller-kill`` (the controller process is SIGKILLed at a random moment).

A fault counts as *injected* only when it demonstrably hit an operation in flight: the agent wrote
its fault mark at the commit point (``REMOTE_OPS_FAULT_MARK``), the sshd kill found a live session,
the proxy really cut a connection, the controller was killed while it had a session or a host agent
running. The others (a kill during the controller's Python start-up, after it had exited, a cut point
past the last byte, a commit point never reached) are counted separately with the reason; their
trials still check every invariant. Concurrent controllers are rounds, not faults.

The controller is ``python -m remote_ops patch|rollback|extract`` once those commands exist and
``python -m tests.faults.harness drive ...`` (below: the same agent ops through the real transport)
until then, so the trials exercise the host side either way.

Run ``python -m tests.faults.harness drive patch -i INV --host H --playbook P`` to drive by hand.
"""

from __future__ import annotations

import argparse
import base64
import collections
import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"
MODULE = "speculators.data_generation.vllm_hidden_states_generator"
SPECULATORS = ("speculators", "0.3.0")
VLLM = ("vllm", "0.17.0")
AGENT_POINTS = ("after-intent", "after-rename-0", "before-journal", "after-journal")
CONTROLLER_TIMEOUT = 90


# ---------------------------------------------------------------------------------------- driver
def _drive(argv: list[str]) -> int:
    """A minimal controller over the real transport: the agent ops the patch feature uses."""
    p = argparse.ArgumentParser(prog="harness drive")
    p.add_argument("action", choices=["patch", "rollback", "launch"])
    p.add_argument("-i", "--inventory", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--playbook", default=str(PLAYBOOK))
    p.add_argument("--key", default="fault-trial")
    p.add_argument("--token", default="")
    a = p.parse_args(argv)
    from remote_ops.connect import inventory
    from remote_ops.playbook import edits
    from remote_ops.playbook import loader as playbook
    from remote_ops.errors import RemoteOpsError
    from remote_ops.connect.transport import ConnectOptions, Session

    try:
        host = inventory.load(a.inventory).resolve(a.host)[0]
        with Session(host, ConnectOptions()) as sess:
            if a.action == "patch":
                pb = playbook.load(a.playbook)
                facts = sess.call("patching.read", {"targets": [t.to_wire() for t in pb.patches],
                                                    "workdir": host.workdir, "packages": list(pb.requires)})
                wire = []
                for target, t in zip(pb.patches, facts["targets"]):
                    text, enc = edits.decode_source(base64.b64decode(t["data"]))
                    fr = edits.apply_edits(text, target.edits, t["real"])
                    if fr.changed:
                        wire.append({"real": t["real"], "label": t["label"], "module": t["module"],
                                     "expected": t["sha256"], "encoding": enc, "spec": target.to_wire(),
                                     "data": base64.b64encode(edits.encode_source(fr.new_text, enc)).decode()})
                res = {"changed": False}
                if wire:
                    res = sess.call("patching.apply", {"targets": wire, "playbook": pb.name,
                                                       "edit_ids": pb.edit_ids, "who": "fault-harness",
                                                       "workdir": host.workdir})
            elif a.action == "rollback":
                res = sess.call("patching.rollback", {"who": "fault-harness"})
            else:
                res = sess.call("jobs.launch", {
                    "key": a.key, "workdir": host.workdir,
                    "command": [host.python, "-c", "import sys,time; time.sleep(300)", a.token]})
        sys.stdout.write(json.dumps(res, default=str) + "\n")
        return 0
    except RemoteOpsError as exc:
        sys.stderr.write(f"remote-ops: {exc.one_line()}\n")
        return int(exc.exit_status)
    except ValueError as exc:   # undecodable target (edits.decode_source)
        sys.stderr.write(f"remote-ops: {exc}\n")
        return 8


# ------------------------------------------------------------------------------------------ rig
@dataclass
class Outcome:
    trial: int
    action: str
    fault: str
    status: int | None
    state: str = "?"                 # original | patched | PARTIAL
    stuck_lock: bool = False
    rerun_ok: bool = True
    leftovers: list = field(default_factory=list)
    journal_problems: list = field(default_factory=list)
    job_copies: int | None = None
    stderr: str = ""
    rerun_output: str = ""
    seconds: float = 0.0
    hit: bool = False                # the fault demonstrably hit an operation in flight
    miss: str | None = None          # else why it did not fire

    @property
    def ok(self) -> bool:
        return (self.state in ("original", "patched") and not self.stuck_lock and self.rerun_ok
                and not self.leftovers and not self.journal_problems
                and (self.job_copies is None or self.job_copies == 1))


class Rig:
    """Own sshd (so killing its sessions hits nobody else) + cut proxy + a host venv to patch."""

    def __init__(self, root: Path, seed: int = 0, log=None):
        from remote_ops import pkgsource
        from remote_ops.playbook import edits
        from remote_ops.playbook import loader as playbook
        from remote_ops.sshd import SshdServer
        from tests.faults.cutproxy import CutProxy

        self.root = Path(root)
        self.rng = random.Random(seed)
        self.log = log or (lambda msg: None)
        self.server = SshdServer(self.root / "sshd").start()
        self.proxy = CutProxy("127.0.0.1", self.server.port).start()
        self.python = pkgsource.make_env(self.root / "venv", [SPECULATORS, VLLM])
        self.site = pkgsource.site_packages(self.python)
        self.target = self.site / (MODULE.replace(".", "/") + ".py")
        self.original = self.target.read_bytes()
        self.mode = self.target.stat().st_mode & 0o777
        pb = playbook.load(PLAYBOOK)
        text, enc = edits.decode_source(self.original)
        self.patched = edits.encode_source(edits.apply_edits(text, pb.patches[0].edits, "t").new_text, enc)
        self.state = self.root / "state"
        self.workdir = self.root / "work"
        self.workdir.mkdir(exist_ok=True)
        self.known_hosts = self.root / "known_hosts"
        key = self.server.known_hosts.read_text().split()[1:3]
        self.known_hosts.write_text("".join(f"[127.0.0.1]:{p} {key[0]} {key[1]}\n"
                                            for p in (self.server.port, self.proxy.port)))
        self.counts: collections.Counter = collections.Counter()     # faults that hit, by type
        self.missed: collections.Counter = collections.Counter()     # (type, why) of faults that did not
        self.concurrent_rounds: list[int] = []
        self.outcomes: list[Outcome] = []
        self.calib: dict = {}
        self.uses_cli = (REPO / "remote_ops" / "commands" / "patch.py").exists() and \
            os.environ.get("REMOTE_OPS_FAULTS_DRIVER") != "1"

    def close(self) -> None:
        self.kill_jobs()
        self.proxy.stop()
        self.server.stop()

    # ------------------------------------------------------------------ host-side state
    def inventory(self, via_proxy: bool = False, env: dict | None = None) -> Path:
        entry = {"hostname": "127.0.0.1", "port": self.proxy.port if via_proxy else self.server.port,
                 "user": self.server.user, "identity_file": str(self.server.identity_file),
                 "known_hosts": str(self.known_hosts), "python": str(self.python),
                 "workdir": str(self.workdir), "connect_timeout": 10, "keepalive": 2,
                 "env": {"REMOTE_OPS_STATE_DIR": str(self.state), **(env or {})}}
        path = self.root / f"inventory-{'proxy' if via_proxy else 'direct'}.yaml"
        path.write_text(yaml.safe_dump({"hosts": {"h": entry}}, sort_keys=False))
        return path

    def reset(self, patched: bool = False) -> None:
        self.wait_agents()
        shutil.rmtree(self.state, ignore_errors=True)
        for tmp in self.target.parent.glob(".*remote-ops*"):
            tmp.unlink()
        tmp = self.target.with_name(".reset.tmp")
        tmp.write_bytes(self.original)
        os.chmod(tmp, self.mode)
        os.replace(tmp, self.target)
        if patched:
            r = self.controller("patch", self.inventory()).wait(CONTROLLER_TIMEOUT)
            assert r == 0 and self.target.read_bytes() == self.patched, "setup patch failed"

    def agent_pids(self) -> list[int]:
        """Host agents of this rig still running (orphans of a killed session finish on their own)."""
        out = []
        exe = str(self.python).encode()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0] == exe and len(argv) > 2 and argv[1] == b"-c" and b"_remote_ops_agent" in argv[2]:
                out.append(int(d.name))
        return out

    def wait_agents(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.agent_pids() and time.monotonic() < deadline:
            time.sleep(0.05)

    def job_pids(self, token: str) -> list[int]:
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
                st = (d / "stat").read_text()
            except OSError:
                continue
            if token.encode() in argv and st.rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(d.name))
        return out

    def kill_jobs(self) -> None:
        """SIGKILL the extract stand-ins this rig started (by pid, found through their unique token)."""
        for token in getattr(self, "_tokens", []):
            for pid in self.job_pids(token):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def overlapping_jobs(self, key: str) -> int:
        """Most jobs of ``key`` that were running at the same instant, from the supervisors' own records
        (run.json: started_at; exit.json: ended_at). A job that ended before the next one started is
        not a duplicate, whoever ended it."""
        spans = []
        for d in (self.state / "jobs").glob(f"{key}-*"):
            try:
                run = json.loads((d / "run.json").read_text())
            except (OSError, ValueError):
                continue                       # never started
            try:
                end = json.loads((d / "exit.json").read_text()).get("ended_at") or float("inf")
            except (OSError, ValueError):
                end = float("inf")
            spans.append((run["started_at"], end))
        events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
        most = cur = 0
        for _, step in events:
            cur += step
            most = max(most, cur)
        return most

    def lock_free(self, timeout: float = 10.0) -> bool:
        path = self.state / "lock"
        if not path.exists():
            return True
        fd = os.open(path, os.O_RDWR)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    return True
                except OSError:
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.05)
        finally:
            os.close(fd)

    def target_state(self) -> str:
        data = self.target.read_bytes()
        return "original" if data == self.original else "patched" if data == self.patched else "PARTIAL"

    def leftovers(self) -> list[str]:
        left = [p.name for p in self.target.parent.iterdir() if "remote-ops" in p.name and p.name.endswith(".tmp")]
        jd = self.state / "journal"
        if jd.is_dir():
            left += [f"intent {p.parent.name}" for p in jd.glob("*/intent.json")]
            left += [p.name for p in jd.glob("*/*.tmp-*")]
        return left

    def journal(self) -> list[dict]:
        path = self.state / "journal" / "journal.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def journal_problems(self, expect_open: int) -> list[str]:
        """Open patches must match the file; backups must hold the original, privately."""
        problems = []
        try:
            entries = self.journal()
        except ValueError as exc:
            return [f"journal line does not parse: {exc}"]
        undone = {e.get("of") for e in entries if e.get("action") == "rollback"}
        open_ = [e for e in entries if e.get("action") == "patch" and e.get("txid") not in undone]
        if len(open_) != expect_open:
            problems.append(f"{len(open_)} open patch entries, expected {expect_open}")
        import hashlib
        cur = hashlib.sha256(self.target.read_bytes()).hexdigest()
        for e in open_:
            for t in e.get("targets") or []:
                if t["after"] != cur:
                    problems.append(f"open entry {e['txid']} says after={t['after'][:12]}, file is {cur[:12]}")
        for e in entries:
            if e.get("action") != "patch":
                continue
            for t in e.get("targets") or []:
                b = Path(t["backup"])
                if not b.exists():
                    problems.append(f"backup {b} of {e['txid']} is gone")
                    continue
                if hashlib.sha256(b.read_bytes()).hexdigest() != t["before"]:
                    problems.append(f"backup {b} does not hold the original bytes")
                bmode = b.stat().st_mode & 0o777
                if bmode & 0o077 or bmode & ~self.mode & 0o777:
                    problems.append(f"backup {b} mode {bmode:o} is more open than 0600 / target {self.mode:o}")
        for d in [self.state, self.state / "journal"]:
            if d.exists() and d.stat().st_mode & 0o077:
                problems.append(f"{d} is mode {d.stat().st_mode & 0o777:o}, not private")
        return problems

    # ------------------------------------------------------------------ controllers
    def controller_argv(self, action: str, inv: Path, token: str = "", key: str = "fault-trial") -> list[str]:
        if self.uses_cli and action == "patch":
            return [sys.executable, "-m", "remote_ops", "patch", "h", "-i", str(inv), "--playbook", str(PLAYBOOK),
                    "--yes", "--json"]
        if self.uses_cli and action == "rollback":
            return [sys.executable, "-m", "remote_ops", "rollback", "h", "-i", str(inv), "--json"]
        return [sys.executable, "-m", "tests.faults.harness", "drive", action, "-i", str(inv), "--host", "h",
                "--playbook", str(PLAYBOOK), "--key", key, "--token", token]

    def controller(self, action: str, inv: Path, token: str = "", key: str = "fault-trial") -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
        return subprocess.Popen(self.controller_argv(action, inv, token, key), cwd=str(REPO), env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def calibrate(self) -> dict:
        """A clean run of each action through the proxy: how long it takes and how many bytes flow."""
        for action in ("patch", "rollback"):
            self.reset(patched=(action == "rollback"))
            before = len(self.proxy.stats.per_connection)
            t0 = time.monotonic()
            p = self.controller(action, self.inventory(via_proxy=True))
            out, err = p.communicate(timeout=CONTROLLER_TIMEOUT)
            assert p.returncode == 0, f"calibration {action} failed: {err.decode()}"
            time.sleep(0.2)
            conns = self.proxy.stats.per_connection[before:]
            self.calib[action] = {"seconds": time.monotonic() - t0,
                                  "up": sum(c[0] for c in conns), "down": sum(c[1] for c in conns)}
        token = f"remote-ops-fault-token-{os.getpid()}-calibration"
        self._tokens = getattr(self, "_tokens", []) + [token]
        before = len(self.proxy.stats.per_connection)
        t0 = time.monotonic()
        p = self.controller("launch", self.inventory(via_proxy=True), token, "calibration")
        out, err = p.communicate(timeout=CONTROLLER_TIMEOUT)
        assert p.returncode == 0, f"calibration launch failed: {err.decode()}"
        time.sleep(0.2)
        conns = self.proxy.stats.per_connection[before:]
        self.calib["launch"] = {"seconds": time.monotonic() - t0,
                                "up": sum(c[0] for c in conns), "down": sum(c[1] for c in conns)}
        self.kill_jobs()
        return self.calib

    # ------------------------------------------------------------------ one trial
    def trial(self, action: str, fault: str, delay: float | None = None) -> Outcome:
        """Run ``action`` under ``fault``; inspect; rerun; inspect again. ``delay``: when a kill fault
        strikes (default: a random moment within the calibrated run time)."""
        if not self.calib:
            self.calibrate()
        n = len(self.outcomes) + 1
        t0 = time.monotonic()
        token = f"remote-ops-fault-token-{os.getpid()}-{n}"
        self._tokens = getattr(self, "_tokens", []) + [token]
        key = f"trial{n}"
        self.reset(patched=(action == "rollback"))
        env = {}
        via_proxy = fault.startswith("cut-")
        mark = self.root / f"fault-mark-{n}"
        if fault.startswith("agent-kill@"):
            env["REMOTE_OPS_FAULT"] = fault.split("@", 1)[1]
            env["REMOTE_OPS_FAULT_MARK"] = str(mark)
        inv = self.inventory(via_proxy=via_proxy, env=env)
        cuts_before = self.proxy.stats.cuts
        hit, miss = False, None
        cal = self.calib[action]
        if fault == "cut-up":
            self.proxy.arm(up=self.rng.randint(1, max(2, cal["up"])), sticky=True)
        elif fault == "cut-down":
            self.proxy.arm(down=self.rng.randint(1, max(2, cal["down"])), sticky=True)
        proc = self.controller(action, inv, token, key)
        if fault in ("sshd-kill", "controller-kill"):
            # the controller's own start-up (imports) is the first part of the window
            delay = self.rng.uniform(0.0, cal["seconds"]) if delay is None else delay
            try:
                proc.wait(delay)
                miss = "the controller had already exited"
            except subprocess.TimeoutExpired:
                if fault == "sshd-kill":
                    hit = self.server.kill_sessions() > 0
                    miss = None if hit else "no live SSH session (controller starting up or between connections)"
                else:
                    in_flight = bool(self.server.session_pids() or self.agent_pids())
                    proc.kill()
                    hit = in_flight
                    miss = None if hit else "killed before it opened a connection (Python start-up)"
        try:
            _, err = proc.communicate(timeout=CONTROLLER_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        self.proxy.disarm()
        if fault.startswith("cut-"):
            hit = self.proxy.stats.cuts > cuts_before
            miss = None if hit else "the connections carried fewer bytes than the cut point"
        elif fault.startswith("agent-kill@"):
            hit = mark.exists()
            miss = None if hit else "the transaction never reached that commit point"
        kind = fault.split("@")[0] if not fault.startswith("agent-kill") else fault
        if hit:
            self.counts[kind] += 1
        else:
            self.missed[(kind, miss)] += 1
        full = err.decode(errors="replace").strip()
        out = Outcome(n, action, fault, proc.returncode, stderr=full[-400:], hit=hit, miss=miss)
        if "Traceback" in full or "internal error" in full:
            out.journal_problems.append("controller printed a traceback: " + full[-300:])
        self.wait_agents()
        if action != "launch":
            out.state = self.target_state()
            out.stuck_lock = not self.lock_free()
        # rerun without fault: it must complete
        rerun = self.controller(action, self.inventory(), token, key)
        rout, rerr = rerun.communicate(timeout=CONTROLLER_TIMEOUT)
        out.rerun_output = rout.decode(errors="replace")[-600:]
        if rerun.returncode != 0:
            out.rerun_ok = False
            out.stderr += " | rerun: " + rerr.decode(errors="replace").strip()[-400:]
        if action == "launch":
            out.state = "original"
            deadline = time.monotonic() + 10
            while not self.job_pids(token) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)                      # a late second copy would show up here
            live = len(self.job_pids(token))
            out.job_copies = max(live, self.overlapping_jobs(key))
            if out.job_copies != 1:
                out.stderr += f" | {out.job_copies} copies of the job ({live} alive); rerun said: {out.rerun_output}"
                for f in sorted((self.state / "jobs").glob(f"{key}-*/*")):
                    if f.name in ("log", "exit.json", "run.json"):
                        out.stderr += f" | {f.parent.name}/{f.name}: {f.read_text(errors='replace')[-300:]}"
            self.kill_jobs()
        else:
            want = "patched" if action == "patch" else "original"
            final = self.target_state()
            if final != want:
                out.rerun_ok = False
                out.stderr += f" | after rerun the target is {final}, expected {want}"
            out.leftovers = self.leftovers()
            out.journal_problems += self.journal_problems(expect_open=1 if action == "patch" else 0)
        out.seconds = time.monotonic() - t0
        self.outcomes.append(out)
        self.log(f"trial {n:3d} {action:8s} {fault:26s} {'hit ' if hit else 'MISS'} exit={out.status!s:>4} "
                 f"state={out.state:8s} "
                 f"{'ok' if out.ok else 'FAIL ' + out.stderr[-200:] + ' ' + '; '.join(out.journal_problems + out.leftovers)}")
        return out

    def concurrent(self, n: int = 8) -> Outcome:
        """``n`` controllers patch the same host at once: one clean result, one journal entry."""
        if not self.calib:
            self.calibrate()
        self.reset()
        t0 = time.monotonic()
        inv = self.inventory()
        procs = [self.controller("patch", inv) for _ in range(n)]
        results = [(p.wait(CONTROLLER_TIMEOUT), p.stderr.read().decode(errors="replace")) for p in procs]
        self.concurrent_rounds.append(n)
        out = Outcome(len(self.outcomes) + 1, "patch", f"concurrent x{n}", max(r for r, _ in results))
        bad = [e.strip() for r, e in results if r != 0]
        if bad:
            out.rerun_ok = False
            out.stderr = " | ".join(bad)[-400:]
        self.wait_agents()
        out.state = self.target_state()
        if out.state != "patched":
            out.rerun_ok = False
        out.stuck_lock = not self.lock_free()
        out.leftovers = self.leftovers()
        entries = [e for e in self.journal() if e.get("action") == "patch"]
        if len(entries) != 1:
            out.journal_problems.append(f"{len(entries)} patch journal entries, expected 1")
        out.journal_problems += self.journal_problems(expect_open=1)
        out.seconds = time.monotonic() - t0
        self.outcomes.append(out)
        self.log(f"trial {out.trial:3d} patch    {out.fault:26s} state={out.state:8s} {'ok' if out.ok else 'FAIL ' + out.stderr}")
        return out

    def figures(self) -> dict:
        return {
            "trials": len(self.outcomes),
            "faults": dict(sorted(self.counts.items())),
            "not_fired": {f"{k}: {why}": v for (k, why), v in sorted(self.missed.items())},
            "concurrent_rounds": list(self.concurrent_rounds),
            "partial_or_corrupted": sum(o.state not in ("original", "patched") for o in self.outcomes),
            "stuck_locks": sum(o.stuck_lock for o in self.outcomes),
            "reruns_failed": sum(not o.rerun_ok for o in self.outcomes),
            "leftover_files": sum(bool(o.leftovers) for o in self.outcomes),
            "journal_problems": sum(bool(o.journal_problems) for o in self.outcomes),
            "duplicate_jobs": sum(o.job_copies is not None and o.job_copies != 1 for o in self.outcomes),
            "failed_trials": [o.__dict__ for o in self.outcomes if not o.ok],
        }


def fault_plan(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """``n`` (action, fault) pairs covering every fault type on patch, rollback and launch."""
    base = [("patch", f"agent-kill@{p}") for p in AGENT_POINTS] + \
           [("rollback", f"agent-kill@{p}") for p in AGENT_POINTS] + \
           [(a, f) for a in ("patch", "rollback") for f in ("sshd-kill", "cut-up", "cut-down", "controller-kill")] + \
           [("launch", f) for f in ("controller-kill", "sshd-kill", "cut-down")]
    plan = list(base)
    while len(plan) < n:
        plan.append(rng.choice(base))
    return plan[:n] if n >= len(base) else rng.sample(base, n)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "drive":
        sys.exit(_drive(sys.argv[2:]))
    sys.exit("usage: python -m tests.faults.harness drive patch|rollback|launch -i INV --host H")
