"""Timings of one dataset over a group (docs/SCALE-OUT.md): the sandbox's STAND-IN job (torch CPU,
``--sleep`` seconds per sample standing in for the GPU's time) on one host, then sharded over a group
of hosts, a stopped host resumed, the union verified and gathered. Every host is an inventory entry
on one local sshd with its own state and output directories (as tests/extract/test_shard.py), so the hosts
share this machine's CPUs: the figures show remote-ops' overhead and the split, not GPU throughput.

    python benchmarks/controller/shard_group.py                      # 3 hosts, 30 samples, 0.5 s per sample
    python benchmarks/controller/shard_group.py --hosts 3 --samples 60 --sleep 1 --out /tmp/shard.md

Prints a Markdown table (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402

STANDIN = REPO / "remote_ops" / "sandbox_assets" / "extract_standin.py"


def cli(inv: Path, *args: str) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "remote_ops", "-i", str(inv), *args], capture_output=True, text=True,
                       cwd=str(REPO))
    return p.returncode, p.stdout, p.stderr


def wait(inv: Path, target: str, *extra: str, timeout: float = 900) -> dict:
    from remote_ops.extract import jobs
    return jobs.wait_ended(lambda: json.loads(cli(inv, "status", target, *extra, "--json")[1]), timeout=timeout,
                           every=0.3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--sleep", type=float, default=0.5, help="seconds per sample (stands in for GPU time)")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)

    from remote_ops.sshd import SshdServer
    import yaml

    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="shard-bench-") as tmp:
        tmp = Path(tmp)
        server = SshdServer(tmp / "sshd").start()
        try:
            pb = tmp / "bench.yaml"
            pb.write_text(f"""\
name: shard-bench
extract:
  command: ["{{python}}", "{STANDIN}", "--output-dir", "{{output_dir}}", "--max-samples", "{args.samples}",
            "--batch-size", "1", "--sleep", "{args.sleep}", "--num-layers", "4", "--hidden-size", "64"]
  output_dir: "{{vars.out}}"
  expected_samples: {args.samples}
  gpus: 0
  stop_grace_seconds: 1
""")
            names = [f"node-{i}" for i in range(args.hosts)]
            hosts = {}
            for name in names + ["single"]:
                hosts[name] = {"hostname": server.address, "port": server.port, "user": server.user,
                               "identity_file": str(server.identity_file), "known_hosts": str(server.known_hosts),
                               "python": sys.executable, "workdir": str(tmp), "playbook": str(pb),
                               "env": {"REMOTE_OPS_STATE_DIR": str(tmp / f"state-{name}")},
                               "vars": {"out": str(tmp / f"out-{name}")}}
            inv = tmp / "inv.yaml"
            inv.write_text(yaml.safe_dump({"hosts": hosts, "groups": {"gpus": names}}, sort_keys=False))

            t0 = time.time()
            rc, out, err = cli(inv, "extract", "single", "--skip-check")
            assert rc == 0, err
            wait(inv, "single")
            one = time.time() - t0
            rows.append((f"one host, {args.samples} samples (extract to succeeded)", f"{one:.1f} s"))

            t0 = time.time()
            rc, out, err = cli(inv, "extract", "gpus", "--shard", "--skip-check")
            assert rc == 0, err
            doc = wait(inv, "gpus")
            group = time.time() - t0
            assert doc["group"]["done"] == args.samples, doc["group"]
            rows.append((f"{args.hosts} hosts sharded (extract GROUP --shard to all succeeded)",
                         f"{group:.1f} s ({one / group:.2f}x faster)"))

            t0 = time.time()
            rc, out, err = cli(inv, "verify", "gpus", "--all", "--json")
            verify_s = time.time() - t0
            union = json.loads(out)["group"]
            assert rc == 0 and union["ok"], out
            rows.append((f"verify GROUP --all (union of {union['files']} files)", f"{verify_s:.1f} s"))

            # a stopped host: remove half its share, stop nothing else; the group run resumes only that
            victim = tmp / f"out-{names[1]}"
            removed = sorted(victim.glob("data_*.pt"))[::2]
            for p in removed:
                p.unlink()
            t0 = time.time()
            rc, out, err = cli(inv, "extract", "gpus", "--shard", "--skip-check")
            assert rc == 0, err
            wait(inv, "gpus")
            resume = time.time() - t0
            rc, out, err = cli(inv, "verify", "gpus")
            assert rc == 0, out
            rows.append((f"extract GROUP --shard again with {len(removed)} sample(s) of one host's share missing",
                         f"{resume:.1f} s"))

            t0 = time.time()
            rc, out, err = cli(inv, "gather", "gpus", "--to", str(tmp / "gathered"), "--json")
            gather_s = time.time() - t0
            g = json.loads(out)["group"]
            assert rc == 0 and g["ok"], out
            rows.append((f"gather GROUP --to DIR ({g['copied']} files, {g['bytes']} bytes, sha256-checked)",
                         f"{gather_s:.1f} s"))
            t0 = time.time()
            rc, out, err = cli(inv, "gather", "gpus", "--to", str(tmp / "gathered"), "--json")
            again = time.time() - t0
            assert rc == 0 and json.loads(out)["group"]["copied"] == 0, out
            rows.append(("gather again (every file already there: hashed, none copied)", f"{again:.1f} s"))
        finally:
            server.stop()

    lines = [f"STAND-IN job, {args.sleep} s per sample, {args.hosts} hosts on one local sshd "
             f"(`python benchmarks/controller/shard_group.py --hosts {args.hosts} --samples {args.samples} --sleep {args.sleep}`"
             f" on commit {provenance.commit() or 'not recorded'})",
             "", "| step | time |", "| --- | --- |"] + [f"| {a} | {b} |" for a, b in rows]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
