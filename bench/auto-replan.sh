#!/usr/bin/env bash
# What the gateway's own re-plan buys (`moesh serve --auto-replan`, docs/span.md "Loading blocks"):
# an 8-block q8_0 model whose blocks 0-3 and 4-7 run on two span peers, each behind a delaying
# proxy (moesh wan-proxy, D ms each way: a 2·D ms round trip), so a decode step costs two trips.
# The planner sees that one peer running 0-7 costs one trip; the gateway has that peer load 0-7
# from its model file and resplits, the other letting go. Per round: a greedy completion of N
# tokens timed before the re-plan and one after it, on the same gateway, same prompt, same text.
# Usage: bench/auto-replan.sh [BUILD_DIR] [DELAY_MS] [N] [ROUNDS] (default build 10 32 3)
set -euo pipefail
B=$(cd "${1:-build}" && pwd)
D=${2:-10}
N=${3:-32}
R=${4:-3}
M="$B/bin/moesh"; T=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
"$M" make-model --out "$T/m.gguf" --n-layer 8 --type q8_0 --n-ctx 4096 > /dev/null
source "$(dirname "$0")/replan_lib.sh"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$(dirname "$0")/.." rev-parse --short HEAD), delay ${D} ms each way, $N tokens"
echo "round,before_ms_per_token,after_ms_per_token,before_over_after,spans_after,same_text"
for r in $(seq 1 "$R"); do
  "$M" span -m "$T/m.gguf" --layers 0-3 --listen 127.0.0.1:0 -t 1 --name a > "$T/a" 2>&1 &
  "$M" span -m "$T/m.gguf" --layers 4-7 --listen 127.0.0.1:0 -t 1 --name b > "$T/b" 2>&1 &
  A=$(port "$T/a"); Bq=$(port "$T/b")
  "$M" wan-proxy --to "127.0.0.1:$A" --delay-ms "$D" > "$T/pa" 2>&1 &
  "$M" wan-proxy --to "127.0.0.1:$Bq" --delay-ms "$D" > "$T/pb" 2>&1 &
  PA=$(port "$T/pa"); PB=$(port "$T/pb")
  # The first check after 15 s: the "before" completion runs first.
  "$M" serve -m "$T/m.gguf" --span "0-3@127.0.0.1:$PA" --span "4-7@127.0.0.1:$PB" --auto-replan 15 -c 4096 -t 1 \
    --port 0 > "$T/gw" 2> "$T/gw.err" &
  G="http://127.0.0.1:$(port "$T/gw")"
  complete "$T/warm" > /dev/null
  before=$(complete "$T/before")
  while [ "$(auto_status "['applied']")" = 0 ]; do
    sleep 0.5
  done
  complete "$T/warm2" > /dev/null
  after=$(complete "$T/after")
  spans=$(curl -sS "$G/swarm/status" | python3 -c 'import json,sys; print(" ".join(s["layers"] for s in json.load(sys.stdin)["spans"] if s["state"] == "up"))')
  same=$(same_text "$T/before" "$T/after")
  python3 -c "print(f'$r,{1e3*$before/$N:.1f},{1e3*$after/$N:.1f},{$before/$after:.2f},$spans,$same')"
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
done
