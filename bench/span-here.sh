#!/usr/bin/env bash
# What naming the backbone's own blocks as a span here costs (`--span F-L@here`, docs/span.md
# "Blocks here"): the same model decoded and prefilled with its blocks inline, with every block
# as one span here, and with half of them here, alternated R rounds in one run (moesh bench,
# -t THREADS). A span here runs on the backbone context's pool (Context::borrow_pool); before
# that it spun a second pool on the same cores.
# Usage: bench/span-here.sh [BUILD_DIR] [ROUNDS] [THREADS] (default build 3 2)
set -euo pipefail
B=$(cd "${1:-build}" && pwd)
R=${2:-3}
TH=${3:-2}
M="$B/bin/moesh"; T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
"$M" make-model --arch qwen3moe --out "$T/m.gguf" --type q4_k_m --seed 7 --n-vocab 4096 --n-ctx 1024 \
  --n-layer 8 --n-embd 1024 --n-ff-exp 512 --n-head 16 --head-dim 64 --n-expert 32 --n-expert-used 4 > /dev/null
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$(dirname "$0")/.." rev-parse --short HEAD), -t $TH"
echo "round,layout,pp64_tok_s,tg64_tok_s"
col() { awk -F'|' -v t="$1" '$5 ~ t {gsub(/ /, "", $6); split($6, v, "±"); print v[1]}'; }
for r in $(seq 1 "$R"); do
  for layout in inline all-here half-here; do
    extra=()
    [ "$layout" = all-here ] && extra=(--span 0-7@here)
    [ "$layout" = half-here ] && extra=(--span 2-5@here)
    out=$("$M" bench -m "$T/m.gguf" -p 64 -n 64 -t "$TH" -r 3 "${extra[@]}" 2> /dev/null)
    echo "$r,$layout,$(col pp64 <<< "$out"),$(col tg64 <<< "$out")"
  done
done
