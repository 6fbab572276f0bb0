#!/usr/bin/env bash
# Runs the whole test suite; installs everything it needs first (see scripts/bootstrap.sh).
# Parallel: $REMOTE_OPS_TEST_WORKERS pytest-xdist workers (default 4), each with its own sshd on a
# port of its own, handed one test at a time, the longest first (tests/conftest.py), the tests of an
# xdist_group on one worker (tests/extract/test_slurm.py: one Slurm at a time); 0 runs
# everything in one process. Arguments go to pytest (-n N there wins).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh" --test
cd "$ROOT"
parallel=(-n "${REMOTE_OPS_TEST_WORKERS:-4}" --dist loadgroup --maxschedchunk 1)
for a in "$@"; do
  case "$a" in -n|-n[0-9]*|--numprocesses|--numprocesses=*|no:xdist) parallel=() ;; esac
done
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider "${parallel[@]}" "$@"
