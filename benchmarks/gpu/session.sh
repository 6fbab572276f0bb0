#!/usr/bin/env bash
# One session on a lent GPU machine (see ../shared/GPU-NOTES.md): the bundle built here by
# `python benchmarks/gpu/lib/bundle.py --out .gpu` travels one part per device call (carry .gpu/part.NN and
# .gpu/SHA256SUMS; the first call also .gpu/baseline.tar.gz), then the harnesses run from this checkout.
#
#   bash benchmarks/gpu/session.sh stash              # every call that carries parts: keep them outside
#                                                     # the checkout (a carried path is gone next call)
#   bash benchmarks/gpu/session.sh run NAME [ARGS]    # unpack once (sha256 checked), then one harness:
#       model        benchmarks/gpu/model_check.py    (issue 22: DeepSeek-V3, Kimi-K2.5-shaped, Qwen3)
#       extract      benchmarks/gpu/extract_check.py  (the dense Llama end-to-end check)
#       throughput   benchmarks/gpu/throughput.py     (issue 25)
#       server       benchmarks/gpu/server_check.py   (issue 24)
#   Results go to $OUT/<name>.json (the device tool brings $OUT back), logs to $OUT/<name>.log.
#
#   A whole session in the background, so that it outlasts one device call (10 min) and the parts of
#   the bundle can travel first (the device copies the session's main checkout: this checkout travels as
#   .gpu/code.tar.gz and runs from $E2E/code):
#   bash benchmarks/gpu/session.sh batch PLAN        # unpack, then run PLAN's lines one after another
#                                                     # (setsid: the call may return), log $E2E/batch/
#   bash benchmarks/gpu/session.sh collect SECONDS    # wait until the batch ends or SECONDS pass, then
#                                                     # pack $E2E/batch into $OUT/batch.tar.gz
#   bash benchmarks/gpu/session.sh stop               # end the batch: every process of its session
#   PLAN: benchmarks/gpu/plans/default.txt by default: one harness command a line, with DEADLINE (epoch seconds
#   the batch must end by, from BATCH_SECONDS) and REV substituted; a line starting with "if-time N"
#   runs only when N seconds are left before DEADLINE.
set -euo pipefail
E2E="${E2E:-/root/e2e}"
OUT="${OUT:-$E2E/out}"
mkdir -p "$E2E/parts" "$OUT"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"

stash() {
  shopt -s nullglob
  for f in "$ROOT"/.gpu/part.* "$ROOT"/.gpu/apart.[0-9]* "$ROOT"/.gpu/SHA256SUMS "$ROOT"/.gpu/baseline.tar.gz; do
    cp -f "$f" "$E2E/parts/"
  done
  (cd "$E2E/parts" && ls -l)
}

unpack() {
  [ -f "$E2E/.bundle-ok" ] && return 0
  cd "$E2E/parts"
  grep ' part\.' SHA256SUMS | sha256sum -c --quiet
  ls apart.[0-9]* >/dev/null 2>&1 && { grep ' apart\.[0-9]' SHA256SUMS | sha256sum -c --quiet; }
  cat part.* > "$E2E/bundle.tar.gz"
  (cd "$E2E" && grep ' bundle.tar.gz' parts/SHA256SUMS | sha256sum -c --quiet)
  mkdir -p "$E2E/rocache/src"
  tar xzf "$E2E/parts/baseline.tar.gz" -C "$E2E/rocache/src"
  tar xzf "$E2E/bundle.tar.gz" -C "$E2E"      # site/, tf/ and a folder per benchmarks/gpu/wheels/*.txt
  if ls "$E2E"/parts/apart.* >/dev/null 2>&1; then   # packages the machine's own versions do not cover
    cat "$E2E"/parts/apart.[0-9]* > "$E2E/apart.tar.gz"
    (cd "$E2E" && grep ' apart.tar.gz' parts/SHA256SUMS | sha256sum -c --quiet)
    tar xzf "$E2E/apart.tar.gz" -C "$E2E"
  fi
  touch "$E2E/.unpacked" "$E2E/.bundle-ok"
  cd - >/dev/null
}

batch_run() {   # the plan's lines, one after another; each one's exit status in $B/status
  local plan="$1" B="$E2E/batch"
  local deadline=$(( $(date +%s) + ${BATCH_SECONDS:-1200} ))
  export DEADLINE=$deadline REV="${REV:-unknown}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
         VLLM_HOST_IP=127.0.0.1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
         PYTHONUNBUFFERED=1 ROOT E2E B
  echo "start $(date +%s) deadline $deadline rev $REV" >> "$B/status"
  local n=0 line need
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in ''|'#'*) continue ;; esac
    n=$((n + 1))
    if [[ "$line" == if-time* ]]; then
      need=$(echo "$line" | awk '{print $2}'); line="${line#if-time $need }"
      if [ $(( deadline - $(date +%s) )) -lt "$need" ]; then
        echo "step $n skipped: less than ${need}s left: $line" >> "$B/status"; continue
      fi
    fi
    echo "step $n start $(date +%s): $line" >> "$B/status"
    local rc=0
    ( cd "$ROOT" && eval "$line" ) > "$B/step$n.log" 2>&1 || rc=$?    # a failed step does not end the batch
    echo "step $n rc $rc at $(date +%s)" >> "$B/status"
  done < "$plan"
  echo "done $(date +%s)" >> "$B/status"
}

collect() {   # wait for the batch (or SECONDS), then everything under $B as one file in $OUT
  local secs="${1:-480}" B="$E2E/batch" t0
  t0=$(date +%s)
  while [ $(( $(date +%s) - t0 )) -lt "$secs" ] && ! grep -q '^done' "$B/status" 2>/dev/null; do sleep 5; done
  cat "$B/status" 2>/dev/null
  for f in "$B"/step*.log; do [ -f "$f" ] && { echo "== $f"; tail -c 1500 "$f"; }; done
  mkdir -p "$OUT"
  tar czf "$OUT/batch.tar.gz" -C "$E2E" batch 2>/dev/null || true
  ls -l "$OUT"
}

case "${1:-}" in
  stash) stash ;;
  batch)
    plan="${2:-$ROOT/benchmarks/gpu/plans/default.txt}"
    unpack
    mkdir -p "$E2E/batch/results"
    setsid nohup bash "$0" batch-run "$plan" > "$E2E/batch/batch.log" 2>&1 < /dev/null &
    echo $! > "$E2E/batch/pid"                       # setsid: its pid is the session id of everything it runs
    echo "batch started: pid $!, plan $plan" ;;
  stop)   # end the batch and everything it started (its session), then say what GPU memory is left
    sid="$(cat "$E2E/batch/pid" 2>/dev/null || true)"
    if [ -n "$sid" ]; then
      pkill -TERM -s "$sid" || true; sleep 5; pkill -KILL -s "$sid" || true
      echo "stopped session $sid" >> "$E2E/batch/status"
    fi
    nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null || true ;;
  batch-run) batch_run "$2" ;;
  collect) collect "${2:-480}" ;;
  run)
    name="${2:?which harness}"; shift 2
    stash; unpack
    rev="${REV:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}"   # REV: the commit here (the device copy may lack .git)
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_HOST_IP=127.0.0.1 NCCL_NVLS_ENABLE=0
    common=(--work "$E2E" --code-rev "$rev")
    case "$name" in
      model)      script=benchmarks/gpu/model_check.py; common+=(--controller-cache "$E2E/rocache") ;;
      extract)    script=benchmarks/gpu/extract_check.py
                  common+=(--bundle "$E2E/bundle.tar.gz" --controller-cache "$E2E/rocache") ;;
      throughput) script=benchmarks/gpu/throughput.py ;;
      server)     script=benchmarks/gpu/server_check.py ;;
      *) echo "unknown harness $name" >&2; exit 2 ;;
    esac
    set +e
    python3 "$ROOT/$script" "${common[@]}" --out "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    set -e
    tail -c 6000 "$OUT/$name.log"
    cp -f "$E2E"/commands.log "$OUT/$name.commands.log" 2>/dev/null || true
    exit $rc ;;
  *) sed -n 2,16p "$0"; exit 2 ;;
esac
