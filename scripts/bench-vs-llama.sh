#!/usr/bin/env bash
# Side-by-side prefill/decode throughput: moesh bench and llama.cpp's llama-bench on the same
# GGUF files, run interleaved (round by round, thread count by thread count) so both see the
# same machine state; prints one row per round and the moesh / llama.cpp ratio of each.
#
#   LLAMA_BENCH=/path/to/llama-bench scripts/bench-vs-llama.sh perf-q4km.gguf [perf-q8.gguf ...]
#
# Environment: MOESH (default build/bin/moesh), THREADS ("1 2"), ROUNDS (3), P (512), N (128;
# 0 skips decode), REPS (repetitions inside each program's run, 2), FA (llama.cpp -fa, 1),
# LLAMA_ARGS / MOESH_ARGS (extra arguments, e.g. LLAMA_ARGS="-mmp 0" MOESH_ARGS="--mmap").
# Without LLAMA_BENCH only moesh runs (the ratio columns stay empty).
# Model files: moesh make-model --preset perf-30b-a3b --type q4_k_m --vocab none --out F
set -euo pipefail

MOESH=${MOESH:-build/bin/moesh}
THREADS=${THREADS:-"1 2"}
ROUNDS=${ROUNDS:-3}
P=${P:-512}
N=${N:-128}
REPS=${REPS:-2}
FA=${FA:-1}
LLAMA_BENCH=${LLAMA_BENCH:-}

if [ $# -lt 1 ]; then
  echo "usage: LLAMA_BENCH=path/llama-bench $0 model.gguf [model.gguf ...]" >&2
  exit 2
fi
[ -x "$MOESH" ] || { echo "bench-vs-llama: $MOESH not built" >&2; exit 2; }

# t/s of test $2 (pp512 / tg128) from a llama-bench style markdown table on stdin.
tps_of() {
  awk -F'|' -v t="$1" '{ for (i = 1; i <= NF; ++i) { f = $i; gsub(/ /, "", f); if (f == t) { v = $(i + 1); split(v, a, "±"); gsub(/ /, "", a[1]); print a[1]; exit } } }'
}

run_moesh() {  # model threads -> "pp tg"
  local out
  # shellcheck disable=SC2086  # MOESH_ARGS is a word list
  out=$("$MOESH" bench -m "$1" -p "$P" -n "$N" -t "$2" -r "$REPS" ${MOESH_ARGS:-} 2>/dev/null)
  echo "$(echo "$out" | tps_of "pp$P") $(echo "$out" | tps_of "tg$N")"
}

run_llama() {
  [ -n "$LLAMA_BENCH" ] || { echo "- -"; return; }
  local out
  # shellcheck disable=SC2086  # LLAMA_ARGS is a word list
  out=$("$LLAMA_BENCH" -m "$1" -p "$P" -n "$N" -t "$2" -r "$REPS" -fa "$FA" ${LLAMA_ARGS:-} 2>/dev/null)
  echo "$(echo "$out" | tps_of "pp$P") $(echo "$out" | tps_of "tg$N")"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == "-" || b == "" || a == "" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }

echo "# moesh $(git -C "$(dirname "$0")/.." rev-parse --short HEAD 2>/dev/null || echo '?') vs ${LLAMA_BENCH:-'(no llama-bench)'}; p=$P n=$N reps=$REPS fa=$FA llama_args=${LLAMA_ARGS:-} moesh_args=${MOESH_ARGS:-}"
echo "| model | threads | round | llama pp$P | moesh pp$P | pp ratio | llama tg$N | moesh tg$N | tg ratio |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for model in "$@"; do
  for t in $THREADS; do
    for r in $(seq 1 "$ROUNDS"); do
      # Alternate which program goes first, so neither always runs on a cooler machine.
      if [ $((r % 2)) -eq 1 ]; then
        read -r lp lt < <(run_llama "$model" "$t")
        read -r mp mt < <(run_moesh "$model" "$t")
      else
        read -r mp mt < <(run_moesh "$model" "$t")
        read -r lp lt < <(run_llama "$model" "$t")
      fi
      [ "$N" -gt 0 ] || { lt=-; mt=-; }
      echo "| $(basename "$model") | $t | $r | $lp | $mp | $(ratio "$mp" "$lp") | $lt | $mt | $(ratio "$mt" "$lt") |"
    done
  done
done
