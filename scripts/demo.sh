#!/usr/bin/env bash
# The main job, end to end, against the embedded sandbox host (a real sshd on 127.0.0.1):
#   sandbox up -> facts -> check (finds the breakages) -> patch -> check (clean)
#   -> extract --tail (stand-in job on torch CPU) -> verify
# Installs what it needs first (scripts/bootstrap.sh). Safe to rerun: patch is then a no-op.
# With $REMOTE_OPS set to an installed remote-ops (pipx, uv tool, a venv: README "Install"), it runs
# that one in the current directory instead (its inventory.yaml and sandbox are made there).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -n "${REMOTE_OPS:-}" ]; then
  RO="$REMOTE_OPS"
else
  bash "$ROOT/scripts/bootstrap.sh"
  cd "$ROOT"
  RO="$ROOT/.venv/bin/remote-ops"
fi
step() { printf '\n\033[1m$ remote-ops %s\033[0m\n' "$*"; }

step sandbox up;            "$RO" sandbox up
step facts sandbox;         "$RO" facts sandbox
step check sandbox
set +e; "$RO" check sandbox; rc=$?; set -e
case $rc in 0|1) ;; *) echo "check failed (exit $rc)" >&2; exit $rc;; esac
step patch sandbox --yes;   "$RO" patch sandbox --yes
step check sandbox;         "$RO" check sandbox
step extract sandbox --tail; "$RO" extract sandbox --tail
step verify sandbox;        "$RO" verify sandbox
step status sandbox;        "$RO" status sandbox
printf '\nDone. Undo the patch with: remote-ops rollback sandbox; stop the host with: remote-ops sandbox down\n'
