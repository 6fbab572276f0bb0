#!/usr/bin/env bash
# Runs the whole test suite; installs everything it needs first (see scripts/bootstrap.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/scripts/bootstrap.sh" --test
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
