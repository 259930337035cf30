#!/usr/bin/env bash
# Which hot-expert policy wins for which budget, over the emulated WAN (moesh wan-emu). Root only.
#
#   bench/wan/hot.sh [BUILD_DIR] [OUT_DIR]                     (default build/, docs/perf/)
#   RTT=50 BUDGETS_MB="0 14 27 54 108" WORKERS=2 N=40 bench/wan/hot.sh
#
# One emulator (WORKERS peers at delay RTT/2), workers splitting every layer's experts evenly, and
# per budget and policy (trip: trip_planner.h, expected latency; hottest: most activated experts
# per byte, wherever they are) one
#   moesh bench -p 0 -n N -r 1 -t 1 --local-experts-mb B --local-experts-policy P --worker ...
# in the hub namespace. The untimed warm-up run routes N tokens, so the hot set is chosen (after
# 32 tokens) before the timed run. Rows: tok/s, round trips per token, what was chosen. Model: the
# narrow one of bench/wan/run.sh (4 MoE layers x 32 experts of 1.6 MiB each, Q8_0).
set -euo pipefail
source "$(dirname "$0")/common.sh"
wan_init wh "$@"
rtt="${RTT:-50}"
budgets="${BUDGETS_MB:-0 14 27 54 108}"
w="${WORKERS:-2}"
n="${N:-40}"
n_expert=32

half=$(python3 -c "print($rtt / 2)")
peers=()
for i in $(seq 1 "$w"); do peers+=(--peer "p$i:delay=${half}ms"); done
wan_up wh "${peers[@]}"
wan_workers wh "$w" "$n_expert"

csv="$out/wan-hot.csv"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) model $(basename "$model") tg$n, RTT $rtt ms, $w workers" > "$csv"
echo "budget_mb,policy,tg_tps,trips_per_token,experts_local,layers_without_trip,predicted_ms_none,predicted_ms_chosen" >> "$csv"
for b in $budgets; do
  for pol in trip hottest; do
    [ "$b" = 0 ] && [ "$pol" = hottest ] && continue  # no budget: the two are the same run
    ip netns exec moesh-wh-hub "$moesh" bench -m "$model" -p 0 -n "$n" -r 1 -t 1 --local-experts-mb "$b" \
      --local-experts-policy "$pol" "${worker_args[@]}" 2>/dev/null > "$logs/bench"
    tps=$(grep -o "| *tg$n *| *[0-9.]*" "$logs/bench" | grep -o '[0-9.]*$')
    trips=$(grep -o 'trips: [0-9.]*' "$logs/bench" | grep -o '[0-9.]*$')
    if [ "$b" = 0 ]; then
      echo "$b,none,$tps,$trips,0,0,," | tee -a "$csv"
    else
      hot=$(grep '^hot experts:' "$logs/bench")
      experts=$(echo "$hot" | sed -E 's/hot experts: ([0-9]+) computed.*/\1/')
      layers=$(echo "$hot" | sed -E 's/.*, ([0-9]+) MoE layers without a trip.*/\1/')
      pred=$(echo "$hot" | sed -E 's/.*latency ([0-9.]+) -> ([0-9.]+) ms.*/\1,\2/')
      echo "$b,$pol,$tps,$trips,$experts,$layers,$pred" | tee -a "$csv"
    fi
  done
done
echo "bench-wan-hot: wrote $csv"
