#!/usr/bin/env bash
# One session on a lent GPU machine (see ../shared/GPU-NOTES.md): the bundle built here by
# `python benchmarks/gpu_bundle.py --out .gpu` travels one part per device call (carry .gpu/part.NN and
# .gpu/SHA256SUMS; the first call also .gpu/baseline.tar.gz), then the harnesses run from this checkout.
#
#   bash benchmarks/gpu_session.sh stash              # every call that carries parts: keep them outside
#                                                     # the checkout (a carried path is gone next call)
#   bash benchmarks/gpu_session.sh run NAME [ARGS]    # unpack once (sha256 checked), then one harness:
#       model        benchmarks/gpu_model_check.py    (issue 22: DeepSeek-V3, Kimi-K2.5-shaped, Qwen3)
#       extract      benchmarks/gpu_extract_check.py  (the dense Llama end-to-end check)
#       throughput   benchmarks/gpu_throughput.py     (issue 25)
#       server       benchmarks/gpu_server_check.py   (issue 24)
#   Results go to $OUT/<name>.json (the device tool brings $OUT back), logs to $OUT/<name>.log.
set -euo pipefail
E2E="${E2E:-/root/e2e}"
OUT="${OUT:-$E2E/out}"
mkdir -p "$E2E/parts" "$OUT"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

stash() {
  shopt -s nullglob
  for f in "$ROOT"/.gpu/part.* "$ROOT"/.gpu/SHA256SUMS "$ROOT"/.gpu/baseline.tar.gz; do
    cp -f "$f" "$E2E/parts/"
  done
  (cd "$E2E/parts" && ls -l)
}

unpack() {
  [ -f "$E2E/.bundle-ok" ] && return 0
  cd "$E2E/parts"
  grep ' part\.' SHA256SUMS | sha256sum -c --quiet
  cat part.* > "$E2E/bundle.tar.gz"
  (cd "$E2E" && grep ' bundle.tar.gz' parts/SHA256SUMS | sha256sum -c --quiet)
  mkdir -p "$E2E/rocache/src"
  tar xzf "$E2E/parts/baseline.tar.gz" -C "$E2E/rocache/src"
  tar xzf "$E2E/bundle.tar.gz" -C "$E2E"      # site/, tf/ and the gpu_wheels folders
  touch "$E2E/.unpacked" "$E2E/.bundle-ok"
  cd - >/dev/null
}

case "${1:-}" in
  stash) stash ;;
  run)
    name="${2:?which harness}"; shift 2
    stash; unpack
    rev="${REV:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}"   # REV: the commit here (the device copy may lack .git)
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_HOST_IP=127.0.0.1 NCCL_NVLS_ENABLE=0
    common=(--work "$E2E" --code-rev "$rev")
    case "$name" in
      model)      script=gpu_model_check.py; common+=(--controller-cache "$E2E/rocache") ;;
      extract)    script=gpu_extract_check.py
                  common+=(--bundle "$E2E/bundle.tar.gz" --controller-cache "$E2E/rocache") ;;
      throughput) script=gpu_throughput.py ;;
      server)     script=gpu_server_check.py ;;
      *) echo "unknown harness $name" >&2; exit 2 ;;
    esac
    set +e
    python3 "$ROOT/benchmarks/$script" "${common[@]}" --out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    set -e
    tail -c 6000 "$OUT/$name.log"
    cp -f "$E2E"/commands.log "$OUT/$name.commands.log" 2>/dev/null || true
    exit $rc ;;
  *) sed -n 2,16p "$0"; exit 2 ;;
esac
