#!/usr/bin/env bash
# What `moesh simulate` predicts for the seed's large models on an internet-scale swarm: the
# published shapes (qwen3-30b-a3b, deepseek-v3, kimi-k2, glm-4.5) on 64 peers of 16 GiB with RTTs
# log-normal around 30 ms (sigma 0.5), a backbone of 64 GiB (embeddings, head, dense parts), for
# the layouts experts / spans / plan, single stream and 16 streams, and with drafts (4 per step,
# each accepted with 0.6: an assumption, not a measurement). Costs: --seconds-per-byte and
# --message-us as calibrated by bench/wan/headline.sh on this machine type (C16), peers and backbone
# SPEED (default 8) times faster than one core of it. Writes
# OUT_DIR/simulate.csv. These are predictions of the model, not measurements.
#
#   bench/simulate.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
out="${2:-$root/docs/perf}"
moesh="$build/bin/moesh"
spb="${SPB:-2.1e-10}"
msg="${MSG_US:-78}"
speed="${SPEED:-8}"  # peers and backbone: desktop/GPU-class, 8x one core of this machine (an assumption)
peers="--peers 64 --peer-memory 16GiB --rtt-median 30ms --rtt-sigma 0.5 --seed 7 --peer-speed $speed"
csv="$out/simulate.csv"
mkdir -p "$out"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD); $peers; backbone 64GiB; ${spb} s/byte, ${msg} us/message" > "$csv"
echo "shape,layout,streams,draft,span_peers,expert_peers,tokens_per_s,step_ms,trips_per_step,predicted_tokens_per_s" >> "$csv"
for shape in qwen3-30b-a3b deepseek-v3 kimi-k2 glm-4.5; do
  for layout in experts spans plan; do
    for cfg in "1 0" "16 0" "1 4"; do
      set -- $cfg
      json=$("$moesh" simulate --shape "$shape" $peers --backbone-mem 64GiB --backbone-speed "$speed" --seconds-per-byte "$spb" \
               --message-us "$msg" --layout "$layout" --streams "$1" --draft "$2" --accept 0.6 --steps 24 --json 2>&1) ||
        { echo "$shape,$layout,$1,$2,does not fit: $(echo "$json" | tail -1 | tr ',' ';')" | tee -a "$csv"; continue; }
      echo "$json" | python3 -c '
import json, sys
j = json.load(sys.stdin); s = j["simulated"]
spans = sum(r["role"] == "span" for r in j["roles"]); experts = sum(r["role"] == "experts" for r in j["roles"])
row = [sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], spans, experts, "%.2f" % s["tokens_per_s"],
       "%.1f" % s["step_mean_ms"], "%.2f" % s["trips_per_step"], "%.2f" % j["predicted_tokens_per_s"]]
print(",".join(map(str, row)))' \
        "$shape" "$layout" "$1" "$2" | tee -a "$csv"
    done
  done
done
echo "simulate: wrote $csv"
