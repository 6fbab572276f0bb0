"""At the user's scale (issue 49): each command's time and memory from 1k to 100k (or more) sample files.

    python benchmarks/controller/scale.py                          # 1k, 10k, 100k files; writes benchmarks/SCALE.md
    python benchmarks/controller/scale.py --sizes 1000,10000,100000,300000
    python benchmarks/controller/scale.py --sizes 1000,10000 --no-write
    python benchmarks/controller/scale.py --sizes 300000 --workdir /tmp/ro-scale --only gather --no-write
        # builds 300k outputs in /tmp/ro-scale once (kept), later runs reuse them; only the gathers

One real OpenSSH sshd on 127.0.0.1 (remote_ops.sshd.SshdServer, fresh keys, strict host keys); the
host is this machine's interpreter with its own state dir. At each size the outputs are real: the
sandbox's stand-in job (the shipped extract_hidden_states.py driven by a torch-CPU generator, 4 layers
of 16, 8-token samples) writes them through `remote-ops extract --tail`. Then each command runs as
its own process (`python -m remote_ops ...`): status, logs, verify (sampled), verify --all, extract
--tail with nothing to do, extract --tail with 10 files missing, extract --dry-run, gather into an
empty directory and gather again into the complete one. Recorded per command: wall seconds, the
controller's peak RSS (wait4 of the command), and the host side's peak RSS (the agent and job
processes under sshd, sampled from /proc every 20 ms while the command runs). The ratio of each
command's time at the largest size to the size ten times smaller is printed beside it (linear: 10).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks.render import readme_section  # noqa: E402

from remote_ops.sshd import SshdServer  # noqa: E402

STANDIN = REPO / "remote_ops" / "sandbox_assets" / "extract_standin.py"


def playbook(path: Path, out: Path, n: int) -> None:
    path.write_text(f"""\
name: scale-extract
extract:
  command: ["{{python}}", "{STANDIN}", "--output-dir", "{{output_dir}}", "--max-samples", "{n}",
            "--batch-size", "64", "--seq-len", "8", "--num-layers", "4", "--hidden-size", "16"]
  output_dir: "{out}"
  expected_samples: {n}
  gpus: 0
  stop_grace_seconds: 1
""")


class HostRss:
    """Peak RSS (kB) of the processes under sshd's session (the agent and what it starts), sampled."""

    def __init__(self, server: SshdServer):
        self.server, self.peak, self._stop = server, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _children(self) -> list[int]:
        root = self.server.daemon_pid()
        if not root:
            return []
        kids: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as fh:
                        ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                    kids.setdefault(ppid, []).append(int(name))
                except (OSError, ValueError, IndexError):
                    pass
        out, todo = [], list(kids.get(root, []))
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(kids.get(p, []))
        return out

    def _run(self):
        while not self._stop.is_set():
            for pid in self._children():
                try:
                    with open(f"/proc/{pid}/status") as fh:
                        for line in fh:
                            if line.startswith("VmRSS:"):
                                self.peak = max(self.peak, int(line.split()[1]))
                except OSError:
                    pass
            time.sleep(0.02)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def run_rss(argv: list[str], server: SshdServer, env: dict) -> dict:
    """``run``, with the command's own peak RSS from wait4."""
    t = time.perf_counter()
    with HostRss(server) as host:
        proc = subprocess.Popen([sys.executable, "-m", "remote_ops", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=REPO, env=env)
        out_chunks, err_chunks = [], []
        t_out = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()))
        t_err = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()))
        t_out.start(), t_err.start()
        _, status, usage = os.wait4(proc.pid, 0)
        t_out.join(), t_err.join()
    secs = time.perf_counter() - t
    code = os.waitstatus_to_exitcode(status)
    return {"seconds": round(secs, 3), "exit": code, "controller_kb": usage.ru_maxrss, "host_kb": host.peak,
            "stdout": b"".join(out_chunks).decode(errors="replace"),
            "stderr": b"".join(err_chunks).decode(errors="replace")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "scale_results.json"),
                    help="each size's measurements, written as soon as that size is done")
    ap.add_argument("--render", action="store_true", help="only render SCALE.md from --results")
    ap.add_argument("--workdir", help="build each size's outputs here and keep them; a size already built there "
                    "(a complete build from an earlier run) is reused, not built again")
    ap.add_argument("--only", help="comma list: run only the commands whose label starts with one of these "
                    "(e.g. gather,extract --tail); the report then holds only those")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.render:
        doc = json.loads(Path(args.results).read_text())
        return render({int(k): v for k, v in doc["rows"].items()}, doc["sizes_asked"], doc["commit"], args)
    rows: dict[int, dict[str, dict]] = {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    only = [w.strip() for w in args.only.split(",")] if args.only else None

    def wanted(label):
        return only is None or any(label.startswith(w) for w in only)
    with tempfile.TemporaryDirectory(prefix="ro-scale-") as tmp:
        tmp = Path(tmp)
        server = SshdServer(tmp / "sshd").start()
        try:
            for n in sizes:
                root = (Path(args.workdir) if args.workdir else tmp) / f"n{n}"
                reuse = args.workdir is not None and (root / "built").exists()
                root.mkdir(parents=True, exist_ok=reuse)
                out = root / "out"
                pb = root / "pb.yaml"
                playbook(pb, out, n)
                inv = root / "inv.yaml"
                inv.write_text(json.dumps({"hosts": {"h": {
                    "hostname": server.address, "port": server.port, "user": server.user,
                    "identity_file": str(server.identity_file), "known_hosts": str(server.known_hosts),
                    "python": sys.executable, "workdir": str(root), "connect_timeout": 60,
                    "env": {"REMOTE_OPS_STATE_DIR": str(root / "state")}, "playbook": str(pb)}}}))
                env = {k: v for k, v in os.environ.items() if not k.startswith("REMOTE_OPS_")}
                base = ["-i", str(inv)]
                t = time.perf_counter()
                got = {}
                if not reuse:
                    built = run_rss([*base, "extract", "h", "--tail", "--skip-check"], server, env)
                    if built["exit"] != 0:
                        raise SystemExit(f"building {n} files failed:\n{built['stderr'][-2000:]}")
                    got["build (extract --tail)"] = built
                    if args.workdir:
                        (root / "built").write_text(json.dumps(built))
                build_s = time.perf_counter() - t
                cases = [
                    ("status", ["status", "h"]),
                    ("logs", ["logs", "h"]),
                    ("verify (sampled)", ["verify", "h"]),
                    ("verify --all", ["verify", "h", "--all"]),
                    ("extract --tail, nothing to do", ["extract", "h", "--tail", "--skip-check"]),
                    ("extract --dry-run", ["extract", "h", "--dry-run", "--skip-check"]),
                ]
                for label, argv in cases:
                    if wanted(label):
                        got[label] = run_rss([*base, *argv], server, env)
                if wanted("extract --tail, 10 missing"):
                    for i in range(10):          # 10 missing: the resume writes them
                        (out / f"data_{n - 1 - i * (n // 10)}.pt").unlink()
                    got["extract --tail, 10 missing"] = run_rss([*base, "extract", "h", "--tail", "--skip-check"],
                                                                 server, env)
                dest = root / "gathered"
                if wanted("gather (empty --to)"):
                    shutil.rmtree(dest, ignore_errors=True)         # --workdir: a gather of an earlier run
                    got["gather (empty --to)"] = run_rss([*base, "gather", "h", "--to", str(dest)], server, env)
                if wanted("gather again (complete --to)"):
                    got["gather again (complete --to)"] = run_rss([*base, "gather", "h", "--to", str(dest)],
                                                                  server, env)
                bad = {k: v for k, v in got.items() if v["exit"] not in (0,)}
                if bad:
                    raise SystemExit(f"at {n}: " + "; ".join(f"{k} exit {v['exit']}: {v['stderr'][-400:]}"
                                                             for k, v in bad.items()))
                rows[n] = {k: {f: v[f] for f in ("seconds", "exit", "controller_kb", "host_kb")}
                           for k, v in got.items()}
                Path(args.results).write_text(json.dumps({"sizes_asked": args.sizes, "commit": commit,
                                                          "rows": rows}, indent=1))
                print(f"{n:>7} files: built in {build_s:.0f} s; " + ", ".join(
                    f"{k} {v['seconds']:.2f} s" for k, v in got.items()), flush=True)
                if not args.workdir:
                    shutil.rmtree(root, ignore_errors=True)
        finally:
            server.stop()
    return render(rows, args.sizes, commit, args)


def render(rows: dict, asked: str, commit: str, args) -> int:
    """SCALE.md from the sizes measured (``rows``); a size asked for and not measured is said."""
    sizes = sorted(rows)
    head = ["command"] + [f"{n:,} files" for n in sizes]
    pair = next(((n * 10, n) for n in sizes if n * 10 in rows and n * 10 == 100_000), None) or \
        next(((n * 10, n) for n in reversed(sizes) if n * 10 in rows), None)
    if pair:
        head.append(f"time {pair[0]:,} / {pair[1]:,}")
    missing = [int(x) for x in asked.split(",") if int(x) not in rows]
    lines = ["# At the user's scale: time and memory by number of sample files", "",
             f"Generated by `python benchmarks/controller/scale.py --sizes {asked}` on {commit}, "
             f"{time.strftime('%Y-%m-%d', time.gmtime())}, on this {os.cpu_count()}-CPU machine: one real sshd on "
             "127.0.0.1; outputs written by the sandbox's stand-in job through `remote-ops extract --tail`; each "
             "command its own process. Cells: wall seconds / the controller's peak RSS (MB) / the host side's peak "
             "RSS (MB: the agent and the processes it starts under sshd, sampled every 20 ms; the detached job is not "
             "among them: its memory is benchmarks/DATASET_MEMORY.md's). The last column is the time "
             "ratio between the two sizes ten times apart (linear: 10)."
             + (f" Not measured (the run did not reach them): {', '.join(f'{n:,}' for n in missing)} files."
                if missing else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    labels = list(dict.fromkeys(k for n in sizes for k in rows[n]))      # --workdir/--only: not every size has all
    for label in labels:
        cells = [label]
        for n in sizes:
            v = rows[n].get(label)
            cells.append(f"{v['seconds']:.2f} s / {v['controller_kb'] / 1024:.0f} / {v['host_kb'] / 1024:.0f}"
                         if v else "-")
        if pair:
            a, b = (rows[pair[0]].get(label) or {}).get("seconds"), (rows[pair[1]].get(label) or {}).get("seconds")
            cells.append(f"{a / b:.1f}" if a is not None and b else "-")
        lines.append("| " + " | ".join(cells) + " |")
    worst = max(((v["controller_kb"], n, k) for n in sizes for k, v in rows[n].items()), default=(0, 0, ""))
    lines += ["", f"Largest controller peak RSS over every command and size: {worst[0] / 1024:.0f} MB "
              f"({worst[2]}, {worst[1]:,} files)."]
    for n in sizes:
        w = max(rows[n].items(), key=lambda kv: kv[1]["controller_kb"])
        first = rows[n].get("gather (empty --to)")
        lines.append(f"- at {n:,} files: largest controller peak {w[1]['controller_kb'] / 1024:.0f} MB ({w[0]})"
                     + (f"; gather into an empty --to {first['seconds'] / n * 1000:.2f} ms a file" if first else ""))
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (REPO / "benchmarks" / "SCALE.md").write_text(text)
        readme = REPO / "README.md"
        readme.write_text(with_paragraph(readme.read_text(), readme_paragraph(rows, asked)))
    return 0


README_START = "<!-- scale: start (python benchmarks/controller/scale.py writes this paragraph) -->"
README_END = "<!-- scale: end -->"
CONTROLLER_GOAL_MB = 100     # issue 49: the controller stays at or below this for every command at 300k files


def readme_paragraph(rows: dict, asked: str) -> str:
    """README's scale paragraph: the 100k/10k time ratio of every command, the second gather at 100k, and the
    controller's largest peak RSS at the largest size, against the goal."""
    ratio = {}
    if 10_000 in rows and 100_000 in rows:
        for label, v in rows[100_000].items():
            b = (rows[10_000].get(label) or {}).get("seconds")
            if b:
                ratio[label] = v["seconds"] / b
    top = max(rows)
    worst = max(rows[top].items(), key=lambda kv: kv[1]["controller_kb"])
    again = rows.get(100_000, {}).get("gather again (complete --to)")
    parts = []
    if ratio:
        lo, hi = min(ratio.values()), max(ratio.values())
        parts.append(f"From 10,000 to 100,000 sample files over a real sshd (ten times the files) every command "
                     f"took {lo:.1f}-{hi:.1f}x as long (" + ", ".join(
                         f"{k} {r:.1f}x" for k, r in sorted(ratio.items(), key=lambda kv: -kv[1])) + ")")
    if again:
        parts.append(f"a second `gather` into the complete directory took {again['seconds']:.2f} s at 100,000 files")
    mb = worst[1]["controller_kb"] / 1024
    parts.append(f"at {top:,} files the controller's largest peak RSS was {mb:.0f} MB ({worst[0]}), "
                 f"{'within' if mb <= CONTROLLER_GOAL_MB else 'above'} the {CONTROLLER_GOAL_MB} MB goal")
    text = "; ".join(parts)
    return (f"{text[0].upper() + text[1:]}: [benchmarks/SCALE.md](benchmarks/SCALE.md) "
            f"(`python benchmarks/controller/scale.py --sizes {asked}`).")


def with_paragraph(readme: str, paragraph: str) -> str:
    """README with ``paragraph`` between the markers."""
    text = readme_section.replace(readme, README_START, README_END, paragraph)
    if text is None:
        raise SystemExit(f"README.md has no {README_START} ... {README_END} section")
    return text


if __name__ == "__main__":
    sys.exit(main())
