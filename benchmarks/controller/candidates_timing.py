"""`remote-ops check HOST --candidates`: cold and warm, over a real sshd on loopback (0 ms added RTT).

    python benchmarks/controller/candidates_timing.py [--vllm 0.20.0,0.33.0] [--reps 3] \\
        [--json benchmarks/results/candidates_timing.json] [--results benchmarks/RESULTS.md]

The host: a venv with the real speculators 0.3.0 and vLLM sources (pkgsource.make_env). Per vLLM
release, three situations, each --reps times (median wall-clock of the whole CLI process, and the
record's own timing):

- empty controller cache: a fresh REMOTE_OPS_CACHE holding only the vLLM baselines' sources (so no
  0.4 GB vLLM wheel is downloaded): the index's release list and every speculators wheel come from
  PyPI, then as "new host";
- new host: the controller's cache holds the sources; the host has nothing (a fresh agent cache, so
  no check memo, and a fresh state dir, so nothing staged): 3 round trips, every release shipped;
- warm: the same host again: 2 round trips, nothing shipped, the checks from the host's memo.

Writes the JSON, and replaces the "check --candidates" section of RESULTS.md (benchmarks/controller/run.py
prints the same section from the JSON when it regenerates the whole file).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from remote_ops import pkgsource  # noqa: E402
from remote_ops.sshd import SshdServer  # noqa: E402

SECTION = "## check --candidates (benchmarks/controller/candidates_timing.py)"


def ro(inv: Path, env: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "remote_ops", "-i", str(inv), "--json", "check", "h", "--candidates"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"check --candidates failed (exit {p.returncode}): {p.stderr.strip()[-400:]}")
    return wall, json.loads(p.stdout)


def inventory(path: Path, server: SshdServer, python: Path, state: Path, agent_cache: Path) -> Path:
    path.write_text(json.dumps({"hosts": {"h": {
        "hostname": server.address, "port": server.port, "user": server.user,
        "identity_file": str(server.identity_file), "known_hosts": str(server.known_hosts), "python": str(python),
        "env": {"REMOTE_OPS_STATE_DIR": str(state), "REMOTE_OPS_AGENT_CACHE": str(agent_cache)}}}}))
    return path


def fresh_cache(tmp: Path, baselines: list[str]) -> Path:
    """A controller cache with only the vLLM baselines' unpacked sources (linked)."""
    root = tmp / f"cache-{time.monotonic_ns()}"
    (root / "src").mkdir(parents=True)
    for v in baselines:
        src = pkgsource.unpacked("vllm", v)
        os.symlink(src, root / "src" / src.name)
    return root


def measure(vllm: str, reps: int, tmp: Path, server: SshdServer) -> dict:
    python = pkgsource.make_env(tmp / f"venv-{vllm}", [("speculators", "0.3.0"), ("vllm", vllm)])
    base_env = dict(os.environ)
    rows: dict[str, list] = {"empty controller cache": [], "new host": [], "warm": []}
    last = None
    for i in range(reps):
        for situation in ("empty controller cache", "new host", "warm"):
            if situation != "warm":
                host_dir = tmp / f"host-{vllm}-{i}-{len(rows[situation])}-{situation.split()[0]}"
                inv = inventory(tmp / "inv.yaml", server, python, host_dir / "state", host_dir / "agent-cache")
            env = dict(base_env)
            if situation == "empty controller cache":
                env["REMOTE_OPS_CACHE"] = str(fresh_cache(tmp, ["0.11.0", "0.16.0"]))
            wall, rec = ro(inv, env)
            rows[situation].append({"wall_s": round(wall, 3), **rec["timing"]})
            last = rec
    out = {"vllm": vllm, "releases": [r["release"] for r in last["rows"]], "situations": {}}
    for situation, samples in rows.items():
        med = {k: round(statistics.median(s[k] for s in samples), 3) for k in samples[0]}
        out["situations"][situation] = {"median": med, "samples": samples}
    out["table"] = [{k: r.get(k) for k in ("release", "declared", "findings", "drift", "flow", "playbooks")}
                    for r in last["rows"]]
    return out


def section(doc: dict) -> list[str]:
    """The RESULTS.md section (also printed by benchmarks/controller/run.py from the JSON)."""
    lines = [SECTION, "",
             f"From `{doc['command']}` (remote-ops commit {doc['code_rev']}, {doc['when']}): wall-clock of the whole "
             f"CLI process over a real sshd on loopback (0 ms added RTT), median of {doc['reps']}; the record's own "
             "split: the first round trip (the host's versions, connecting included) and the release list, the "
             "sources (PyPI on an empty cache), the host's analysis (shipping included), drift on the controller.", "",
             "| host vLLM | releases | situation | wall s | total s | first s | sources s | host s | drift s | round trips | shipped |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in doc["runs"]:
        for situation, v in m["situations"].items():
            d = v["median"]
            lines.append(f"| {m['vllm']} | {len(m['releases'])} ({m['releases'][0]}..{m['releases'][-1]}) | {situation} | "
                         f"{d['wall_s']} | {d['total_s']} | {d['first_s']} | {d['sources_s']} | {d['host_s']} | {d['drift_s']} | "
                         f"{int(d['round_trips'])} | {int(d['shipped'])} |")
    return lines + [""]


def replace_section(path: Path, lines: list[str]) -> None:
    text = path.read_text() if path.exists() else ""
    if SECTION in text:
        head, _, rest = text.partition(SECTION)
        nxt = rest.find("\n## ")
        tail = rest[nxt + 1:] if nxt >= 0 else ""
        text = head + "\n".join(lines) + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(lines)
    path.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", default="0.20.0,0.33.0")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "candidates_timing.json"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "RESULTS.md"))
    ap.add_argument("--render", action="store_true", help="only print (and put into RESULTS.md) the section of "
                                                           "the JSON an earlier run wrote")
    args = ap.parse_args(argv)
    if args.render:
        lines = section(json.loads(Path(args.json).read_text()))
        replace_section(Path(args.results), lines)
        print("\n".join(lines))
        return 0
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    runs = []
    with tempfile.TemporaryDirectory(prefix="ro-candidates-") as t:
        tmp = Path(t)
        server = SshdServer(tmp / "sshd").start()
        try:
            for v in args.vllm.split(","):
                runs.append(measure(v.strip(), args.reps, tmp, server))
                print(f"{v}: {json.dumps({k: s['median'] for k, s in runs[-1]['situations'].items()})}", file=sys.stderr)
        finally:
            server.stop()
    doc = {"command": "python benchmarks/controller/candidates_timing.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "code_rev": rev.stdout.strip(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "reps": args.reps, "runs": runs}
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    lines = section(doc)
    replace_section(Path(args.results), lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
