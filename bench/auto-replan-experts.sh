#!/usr/bin/env bash
# What the expert part of the gateway's own re-plan buys (`moesh serve --auto-replan` without
# --span, docs/swarm.md#plan): an 8-block q8_0 model whose experts are all on a far worker (behind
# a delaying proxy, moesh wan-proxy, D ms each way) and one expert on a near worker that keeps
# replicas; every MoE layer of a decode step costs a far trip. The experts-only re-plan gives the
# near worker every expert; the gateway copies them to it (STORE, hash-checked) at the next forward
# pass, and the pairs go to the nearest holder. Per round: a greedy completion of N tokens timed
# before the re-plan and one after it (the copies made during a warm-up completion between),
# same gateway, same prompt, same text.
# Usage: bench/auto-replan-experts.sh [BUILD_DIR] [DELAY_MS] [N] [ROUNDS] (default build 5 32 3)
set -euo pipefail
B=$(cd "${1:-build}" && pwd)
D=${2:-5}
N=${3:-32}
R=${4:-3}
M="$B/bin/moesh"; T=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
"$M" make-model --out "$T/m.gguf" --n-layer 8 --type q8_0 --n-ctx 4096 > /dev/null
source "$(dirname "$0")/replan_lib.sh"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$(dirname "$0")/.." rev-parse --short HEAD), far worker ${D} ms each way, $N tokens"
echo "round,before_ms_per_token,after_ms_per_token,before_over_after,copies,same_text"
for r in $(seq 1 "$R"); do
  "$M" worker -m "$T/m.gguf" --experts '*:*' --no-blocks --listen 127.0.0.1:0 -t 1 --name far > "$T/far" 2>&1 &
  "$M" worker -m "$T/m.gguf" --experts '0:0' --no-blocks --replica-dir "$T/rep$r" --replica-mb 1024 \
    --listen 127.0.0.1:0 -t 1 --name near > "$T/near" 2>&1 &
  F=$(port "$T/far"); NR=$(port "$T/near")
  "$M" wan-proxy --to "127.0.0.1:$F" --delay-ms "$D" > "$T/pf" 2>&1 &
  PF=$(port "$T/pf")
  # The first check after 15 s: the "before" completion runs first.
  "$M" serve -m "$T/m.gguf" --worker "127.0.0.1:$PF" --worker "127.0.0.1:$NR" --auto-replan 15 -c 4096 -t 1 \
    --port 0 > "$T/gw" 2> "$T/gw.err" &
  G="http://127.0.0.1:$(port "$T/gw")"
  complete "$T/warm" > /dev/null
  before=$(complete "$T/before")
  while [ "$(auto_status "['applied']")" = 0 ]; do sleep 0.5; done
  complete "$T/warm2" > /dev/null  # the copies are made at its first forward pass
  after=$(complete "$T/after")
  copies=$(auto_status "['experts']['copies']")
  same=$(same_text "$T/before" "$T/after")
  python3 -c "print(f'$r,{1e3*$before/$N:.1f},{1e3*$after/$N:.1f},{$before/$after:.2f},$copies,$same')"
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
done
