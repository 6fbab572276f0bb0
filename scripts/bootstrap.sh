#!/usr/bin/env bash
# Installs what remote-ops needs on a fresh Debian/Ubuntu machine: OpenSSH (server + client),
# python3-venv, and a virtualenv at .venv with remote-ops (and, with --test, the test tools).
# Idempotent: a second run only checks. Sourced by scripts/demo.sh and scripts/test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WANT_TEST="${1:-}"
PY="${PYTHON:-python3}"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
  echo "remote-ops bootstrap: need root (or sudo) to run: $*" >&2; return 1; fi; }

need_apt=()
[ -x /usr/sbin/sshd ] || command -v sshd >/dev/null || need_apt+=(openssh-server)
command -v ssh-keygen >/dev/null || need_apt+=(openssh-client)
if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then need_apt+=(python3-venv); fi
# tests/extract/test_slurm.py starts a real one-node Slurm (slurmctld + slurmd) from the distribution's packages
if [ "$WANT_TEST" = "--test" ] && ! command -v slurmctld >/dev/null; then need_apt+=(slurm-wlm); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "remote-ops bootstrap: installing ${need_apt[*]} (apt-get)" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

"$PY" -c 'import sys; assert sys.version_info >= (3, 10), "remote-ops needs Python >= 3.10"'
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  "$PY" -m venv "$ROOT/.venv"
fi
stamp="$ROOT/.venv/.remote-ops-installed${WANT_TEST:+-test}"
# the test install is the plain one and more: scripts/demo.sh run by the suite (tests/sandbox/test_sandbox.py) after
# scripts/test.sh's bootstrap --test does not reinstall (a pip upgrade and an editable build: ~25 s)
if [ -z "$WANT_TEST" ] && [ -f "$ROOT/.venv/.remote-ops-installed-test" ]; then
  stamp="$ROOT/.venv/.remote-ops-installed-test"
fi
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  "$ROOT/.venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
  if [ "$WANT_TEST" = "--test" ]; then
    "$ROOT/.venv/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test]"
  else
    "$ROOT/.venv/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT"
  fi
  touch "$stamp"
fi
