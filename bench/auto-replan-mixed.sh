#!/usr/bin/env bash
# What pricing peers at their measured compute speed buys (docs/swarm.md, "Measured compute
# speeds"): two workers on this host hold half the experts each of an 8-block q8_0 model (1024 wide,
# 16 experts top-2, so an expert's compute counts), one of them computing as a machine SPEED times
# as fast (`moesh worker --emulate-speed`: each pass waits out the difference). Every MoE layer
# waits for the slow half. The gateway's experts-only re-plan (`serve --auto-replan`) prices each
# worker at its measured speed: the slow one's experts go to the quick one (which keeps replicas),
# copied at the next forward pass, and the pairs then go to the nearest holder. Per round: a greedy
# completion of N tokens timed before the re-plan and one after it (same gateway, prompt and
# text). With SPEED 1 (two like machines) the re-plan finds nothing worth its moves (the control).
# Usage: bench/auto-replan-mixed.sh [BUILD_DIR] [SPEED] [N] [ROUNDS] (default build 0.25 32 3)
set -euo pipefail
B=$(cd "${1:-build}" && pwd)
S=${2:-0.25}
N=${3:-32}
R=${4:-3}
M="$B/bin/moesh"; T=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
"$M" make-model --out "$T/m.gguf" --n-layer 8 --type q8_0 --n-ctx 4096 --n-embd 1024 --n-ff-exp 512 \
  --n-head 8 --head-dim 128 --n-expert 16 --n-expert-used 2 > /dev/null
source "$(dirname "$0")/replan_lib.sh"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$(dirname "$0")/.." rev-parse --short HEAD), slow worker at speed $S, $N tokens"
echo "round,before_ms_per_token,after_ms_per_token,before_over_after,replanned,slow_priced_at,predicted_gain,copies,same_text,why"
for r in $(seq 1 "$R"); do
  "$M" worker -m "$T/m.gguf" --experts '*:0-7' --no-blocks --replica-dir "$T/rep$r" --replica-mb 1024 \
    --listen 127.0.0.1:0 -t 1 --name quick > "$T/quick" 2>&1 &
  "$M" worker -m "$T/m.gguf" --experts '*:8-15' --no-blocks --emulate-speed "$S" \
    --listen 127.0.0.1:0 -t 1 --name slow > "$T/slow" 2>&1 &
  Q=$(port "$T/quick"); SL=$(port "$T/slow")
  # The first check after 15 s: the "before" completion runs first.
  "$M" serve -m "$T/m.gguf" --worker "127.0.0.1:$Q" --worker "127.0.0.1:$SL" --auto-replan 15 -c 4096 -t 1 \
    --port 0 > "$T/gw" 2> "$T/gw.err" &
  G="http://127.0.0.1:$(port "$T/gw")"
  complete "$T/warm" > /dev/null
  before=$(complete "$T/before")
  # What the re-plan priced the slow worker at (the dashboard's plan.replan), then its check (at
  # most 20 s more): applied, with the gain it predicted for the experts-only plan, or why not.
  curl -sS "$G/swarm/dashboard.json" > "$T/dash"
  priced=$(python3 -c "import json; r=json.load(open('$T/dash'))['plan']['replan']; print(f\"{[p['speed'] for p in r['peers'] if p['name']=='slow'][0]:.2f}\")")
  for _ in $(seq 1 40); do [ "$(auto_status "['checks']")" = 0 ] || break; sleep 0.5; done
  applied=$(auto_status "['applied']")
  gain=$(auto_status ".get('last', {}).get('gain', 0)")
  why=$(auto_status "['last_why']" | tr ',' ';')
  complete "$T/warm2" > /dev/null  # the copies are made at its first forward pass
  after=$(complete "$T/after")
  copies=$(auto_status "['experts']['copies']")
  same=$(same_text "$T/before" "$T/after")
  python3 -c "print(f'$r,{1e3*$before/$N:.1f},{1e3*$after/$N:.1f},{$before/$after:.2f},$applied,$priced,{$gain:.2f},$copies,$same,$why')"
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
done
