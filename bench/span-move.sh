#!/usr/bin/env bash
# What a live span move costs (SpanClient::move, POST /swarm/spans/move): a gateway serving an
# 8-block q8_0 model with blocks 4-7 on a span peer holds one sequence of L cells; the span moves
# to a second peer (its inputs replayed first, from a snapshot, while steps go on on the old peer)
# and back. A stream runs across the second move: its largest gap between two tokens is the stall
# a request in flight sees, beside its median gap. Loopback, no delay.
# Usage: bench/span-move.sh [BUILD_DIR] [CONTEXTS...]   (default build, 256 1024 3072)
set -euo pipefail
B=$(cd "${1:-build}" && pwd); shift || true
CTXS=("${@:-256 1024 3072}")
# shellcheck disable=SC2206
CTXS=(${CTXS[*]})
M="$B/bin/moesh"; T=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
"$M" make-model --out "$T/m.gguf" --n-layer 8 --type q8_0 --n-ctx 4096 > /dev/null
port() { while ! grep -q "^listening on" "$1" 2>/dev/null; do sleep 0.1; done; sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$1"; }
"$M" span -m "$T/m.gguf" --layers 4-7 --listen 127.0.0.1:0 -t 1 --name a > "$T/a" 2>&1 &
"$M" span -m "$T/m.gguf" --layers 4-7 --listen 127.0.0.1:0 -t 1 --name b > "$T/b" 2>&1 &
A="127.0.0.1:$(port "$T/a")"; Bp="127.0.0.1:$(port "$T/b")"
"$M" serve -m "$T/m.gguf" --span "4-7@$A" --admin-key k --parallel 2 -c 4096 -t 1 --port 0 > "$T/gw" 2> "$T/gw.err" &
G="http://127.0.0.1:$(port "$T/gw")"
move() {  # to -> seconds
  curl -sS -o "$T/mv" -w '%{time_total}' -H 'Authorization: Bearer k' -H 'Content-Type: application/json' \
    --data-binary "{\"layers\":\"4-7\",\"to\":\"$1\"}" "$G/swarm/spans/move"
}
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$(dirname "$0")/.." rev-parse --short HEAD)"
echo "cells,step_ms,move_a_to_b_ms,move_b_to_a_ms,rows_replayed_per_move,stream_median_gap_ms,stream_max_gap_ms"
prev=0
for L in "${CTXS[@]}"; do
  ids=$(python3 -c "import random; random.seed($L); print(','.join(str(random.randrange(2,500)) for _ in range($L)))")
  curl -sS -o /dev/null -H 'Content-Type: application/json' \
    --data-binary "{\"prompt\":[${ids}],\"max_tokens\":1,\"temperature\":0}" "$G/v1/completions"
  # One decode step on this context (a 1-token continuation of the cached prompt) for scale.
  st=$(curl -sS -o "$T/c" -w '%{time_total}' -H 'Content-Type: application/json' \
    --data-binary "{\"prompt\":[${ids}],\"max_tokens\":1,\"temperature\":0}" "$G/v1/completions")
  ab=$(move "$Bp"); total=$(python3 -c "import json; print(json.load(open('$T/mv'))['move_rows'])")
  # A stream (its own sequence) across the move back: chunk arrival times.
  node -e 'const t0 = Date.now(); const gaps = []; let last = 0;
    fetch(process.argv[1] + "/v1/completions", {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({prompt: "Once upon a time", max_tokens: 400, temperature: 0, ignore_eos: true, stream: true})})
    .then(async (r) => { for await (const c of r.body) { const n = Date.now(); if (last) gaps.push(n - last); last = n; }
      gaps.sort((a, b) => a - b);
      require("fs").writeFileSync(process.argv[2], gaps[gaps.length >> 1] + "," + gaps[gaps.length - 1]); });' \
    "$G" "$T/gaps" &
  np=$!
  sleep 0.3
  ba=$(move "$A")
  wait "$np"
  python3 -c "print(f'$L,{1e3*$st:.1f},{1e3*$ab:.1f},{1e3*$ba:.1f},{$total - $prev},$(cat "$T/gaps")')"
  prev=$(python3 -c "import json; print(json.load(open('$T/mv'))['move_rows'])")
done
