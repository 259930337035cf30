#!/usr/bin/env bash
# Span peers vs per-layer expert dispatch over a delayed path (moesh wan-proxy, unprivileged):
# an 8-block qwen3moe-shaped model, the experts of blocks 0-3 and 4-7 on two workers (one trip per
# MoE layer) against two span peers holding blocks 0-3 and 4-7 (one trip per span), same RTT.
# Usage: bench/span.sh [BUILD_DIR] [ONE_WAY_DELAY_MS] [TOKENS]
set -euo pipefail
B=${1:-build}; D=${2:-10}; N=${3:-24}
M="$B/bin/moesh"; T=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
"$M" make-model --out "$T/m.gguf" --n-layer 8 --type q8_0 --n-ctx 2048 > /dev/null
"$M" worker -m "$T/m.gguf" --experts '0-3:*' --listen 127.0.0.1:7201 -t 1 > "$T/w1" 2>&1 &
"$M" worker -m "$T/m.gguf" --experts '4-7:*' --listen 127.0.0.1:7202 -t 1 > "$T/w2" 2>&1 &
"$M" span -m "$T/m.gguf" --layers 0-3 --listen 127.0.0.1:7203 -t 1 > "$T/s1" 2>&1 &
"$M" span -m "$T/m.gguf" --layers 4-7 --listen 127.0.0.1:7204 -t 1 > "$T/s2" 2>&1 &
sleep 1.5
for p in 1 2 3 4; do "$M" wan-proxy --listen 127.0.0.1:730$p --to 127.0.0.1:720$p --delay-ms "$D" > "$T/p$p" 2>&1 & done
sleep 0.5
"$M" run -m "$T/m.gguf" --tokens 5,6,7,8 -n "$N" -t 1 --json --worker 127.0.0.1:7301 --worker 127.0.0.1:7302 > "$T/e.json" 2> /dev/null
"$M" run -m "$T/m.gguf" --tokens 5,6,7,8 -n "$N" -t 1 --json --span 0-3@127.0.0.1:7303 --span 4-7@127.0.0.1:7304 > "$T/s.json" 2> /dev/null
python3 - "$T/e.json" "$T/s.json" "$D" <<'PY'
import json, sys
e, s = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
te, ts = e["timings"]["predicted_per_second"], s["timings"]["predicted_per_second"]
print(f"rtt {2*int(sys.argv[3])} ms | experts per layer: {te:.2f} tok/s, {e['remote']['layer_calls']} trips | "
      f"2 spans: {ts:.2f} tok/s, {s['spans']['trips']} trips | spans/experts {ts/te:.2f}x | same tokens: {e['tokens']==s['tokens']}")
PY
