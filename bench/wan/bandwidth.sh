#!/usr/bin/env bash
# The bandwidth-bound regime over the emulated WAN (moesh wan-emu): prefill of a long prompt and
# batch-32 decode vs the links' rate cap, per wire dtype and combine mode. Root only.
#
#   bench/wan/bandwidth.sh [BUILD_DIR] [OUT_DIR]              (default build/, docs/perf/)
#   RTT=5 RATES="0 100 10" WIRES="f32 f16 q8" COMBINES="exact partial" P=2048 WORKERS=2 bench/wan/bandwidth.sh
#
# One emulator per rate (WORKERS peers at delay RTT/2, rate R Mbit/s each, 0 = unlimited), workers
# splitting every layer's experts evenly, and per wire dtype and combine mode
#   moesh bench -p P -n 8 -r 1 -t 1 --streams 32 --micro-batches off --wire W --combine C --worker ...
# in the hub namespace: ppP (one prompt of P tokens), tg8 and tg8x32 (32 streams). Bytes per
# token and layer follow from the dtype (f32 4, f16 2, q8 1.06 bytes per value) and, for the
# return, the mode (exact: one row per pair, k = 4 per token; partial: one per token and worker).
# The lossy dtypes are what `moesh gate` checks before they may be used.
set -euo pipefail
source "$(dirname "$0")/common.sh"
wan_init wbw "$@"
rtt="${RTT:-5}"
rates="${RATES:-0 100 10}"
wires="${WIRES:-f32 f16 q8}"
combines="${COMBINES:-exact partial}"
p="${P:-2048}"
w="${WORKERS:-2}"
n_expert=32

csv="$out/wan-bandwidth.csv"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) model $(basename "$model") pp$p, tg8 x 32 streams, RTT $rtt ms, $w workers" > "$csv"
echo "rate_mbit,wire,combine,pp_tps,tg1_tps,tg32_tps" >> "$csv"
half=$(python3 -c "print($rtt / 2)")
for rate in $rates; do
  peers=()
  for i in $(seq 1 "$w"); do
    spec="p$i:delay=${half}ms"
    [ "$rate" != 0 ] && spec="$spec,rate=${rate}mbit"
    peers+=(--peer "$spec")
  done
  wan_up wbw "${peers[@]}"
  wan_workers wbw "$w" "$n_expert"
  for wire in $wires; do
    for combine in $combines; do
      ip netns exec moesh-wbw-hub "$moesh" bench -m "$model" -p "$p" -n 8 -r 1 -t 1 --streams 32 \
        --micro-batches off --wire "$wire" --combine "$combine" --timeout-ms 600000 "${worker_args[@]}" \
        2>"$logs/bench.err" > "$logs/bench" || { echo "bench failed ($rate Mbit, $wire, $combine):" >&2; tail -5 "$logs/bench.err" >&2; }
      pp=$(grep -o "| *pp$p *| *[0-9.]*" "$logs/bench" | grep -o '[0-9.]*$' || echo "")
      tg=$(grep -o "| *tg8 *| *[0-9.]*" "$logs/bench" | grep -o '[0-9.]*$' || echo "")
      tg32=$(grep -o "tg8x32[^|]*| *[0-9.]*" "$logs/bench" | grep -o '[0-9.]*$' || echo "")
      echo "$rate,$wire,$combine,$pp,$tg,$tg32" | tee -a "$csv"
    done
  done
  wan_down
done
echo "bench-wan-bandwidth: wrote $csv"
