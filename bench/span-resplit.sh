#!/usr/bin/env bash
# What new span edges cost while serving (SpanClient::resplit, POST /swarm/spans/resplit), beside a
# plain move of the same blocks (SpanClient::move) in the same run: a gateway serving an 8-block
# q8_0 model with blocks 4-7 on span peer a holds one sequence of L cells; then
#   move      4-7 -> peer b               (the L logged inputs replayed to one peer: the baseline)
#   split     4-7 -> 4-5 on c + 6-7 on d  (c fed the log, d fed what c computes: twice the rows)
#   merge     4-5 + 6-7 -> 4-7 on a       (a fed the log again), with a 400-token stream of another
#             sequence running across it: its largest gap between two tokens is the stall a request
#             in flight sees (the warm-up runs beside the steps; the catch-up waits for one pass).
# Loopback, no delay. Usage: bench/span-resplit.sh [BUILD_DIR] [CONTEXTS...] (default build, 256 1024 3072)
set -euo pipefail
B=$(cd "${1:-build}" && pwd); shift || true
CTXS=("${@:-256 1024 3072}")
# shellcheck disable=SC2206
CTXS=(${CTXS[*]})
M="$B/bin/moesh"; T=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
"$M" make-model --out "$T/m.gguf" --n-layer 8 --type q8_0 --n-ctx 4096 > /dev/null
port() { while ! grep -q "^listening on" "$1" 2>/dev/null; do sleep 0.1; done; sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$1"; }
span() { "$M" span -m "$T/m.gguf" --layers "$2" --listen 127.0.0.1:0 -t 1 --name "$1" > "$T/$1" 2>&1 & }
span a 4-7; span b 4-7; span c 4-5; span d 6-7
A="127.0.0.1:$(port "$T/a")"; Bp="127.0.0.1:$(port "$T/b")"; C="127.0.0.1:$(port "$T/c")"; D="127.0.0.1:$(port "$T/d")"
"$M" serve -m "$T/m.gguf" --span "4-7@$A" --admin-key k --parallel 2 -c 4096 -t 1 --port 0 > "$T/gw" 2> "$T/gw.err" &
G="http://127.0.0.1:$(port "$T/gw")"
admin() {  # route body -> seconds (answer in $T/ans)
  curl -sS -o "$T/ans" -w '%{time_total}' -H 'Authorization: Bearer k' -H 'Content-Type: application/json' \
    --data-binary "$2" "$G/swarm/spans/$1"
}
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$(dirname "$0")/.." rev-parse --short HEAD)"
echo "cells,move_ms,split_ms,split_rows,merge_ms,split_over_move,stream_median_gap_ms,stream_max_gap_ms"
prev=0
for L in "${CTXS[@]}"; do
  ids=$(python3 -c "import random; random.seed($L); print(','.join(str(random.randrange(2,500)) for _ in range($L)))")
  curl -sS -o /dev/null -H 'Content-Type: application/json' \
    --data-binary "{\"prompt\":[${ids}],\"max_tokens\":1,\"temperature\":0}" "$G/v1/completions"
  mv=$(admin move "{\"layers\":\"4-7\",\"to\":\"$Bp\"}")
  sp=$(admin resplit "{\"spans\":[\"4-5@$C\",\"6-7@$D\"]}")
  rows=$(python3 -c "import json; print(json.load(open('$T/ans'))['resplit_rows'])")
  node -e 'const gaps = []; let last = 0;
    fetch(process.argv[1] + "/v1/completions", {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({prompt: "Once upon a time", max_tokens: 400, temperature: 0, ignore_eos: true, stream: true})})
    .then(async (r) => { for await (const c of r.body) { const n = Date.now(); if (last) gaps.push(n - last); last = n; }
      gaps.sort((a, b) => a - b);
      require("fs").writeFileSync(process.argv[2], gaps[gaps.length >> 1] + "," + gaps[gaps.length - 1]); });' \
    "$G" "$T/gaps" &
  np=$!
  sleep 0.3
  mg=$(admin resplit "{\"spans\":[\"4-7@$A\"]}")
  after=$(python3 -c "import json; print(json.load(open('$T/ans'))['resplit_rows'])")
  wait "$np"
  python3 -c "print(f'$L,{1e3*$mv:.1f},{1e3*$sp:.1f},{$rows - $prev},{1e3*$mg:.1f},{$sp/$mv:.2f},$(cat "$T/gaps")')"
  prev=$after
done
