#!/usr/bin/env bash
# Many streams over the emulated WAN (moesh wan-emu): S sequences decoded together vs one, with
# two micro-batches off, on and auto, alternated rep by rep in the same process. Root only.
#
#   bench/wan/streams.sh [BUILD_DIR] [OUT_DIR]          (default build/, docs/perf/)
#   RTTS="0 5 20 80" STREAMS=16 WORKERS=2 N=8 R=2 bench/wan/streams.sh
#
# Each RTT: `wan-emu up` with one peer per worker at delay RTT/2, workers splitting every layer's
# experts evenly in the peer namespaces, then in the hub namespace
#   moesh bench -p 0 -n N -r R -t 1 --streams S --compare-micro-batches --worker ...
# which prints tgN (one stream), tgNxS with micro-batching off, on and auto, and the ratios. The model
# is the narrow one of bench/wan/run.sh (qwen3moe, 4 layers, 1024 wide, 32 experts top-4, Q8_0).
set -euo pipefail
source "$(dirname "$0")/common.sh"
wan_init ws "$@"
rtts="${RTTS:-0 5 20 80}"
streams="${STREAMS:-16}"
w="${WORKERS:-2}"
n="${N:-8}"
reps="${R:-2}"
n_expert=32

csv="$out/wan-streams.csv"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) model $(basename "$model") tg$n x $streams streams, $w workers" > "$csv"
echo "rtt_ms,tg1_tps,tgS_off_tps,tgS_on_tps,tgS_auto_tps,streams_gain_off,streams_gain_on,on_over_off,auto_over_off" >> "$csv"
for rtt in $rtts; do
  half=$(python3 -c "print($rtt / 2)")
  peers=()
  for i in $(seq 1 "$w"); do peers+=(--peer "p$i:delay=${half}ms"); done
  wan_up ws "${peers[@]}"
  wan_workers ws "$w" "$n_expert"
  ip netns exec moesh-ws-hub "$moesh" bench -m "$model" -p 0 -n "$n" -r "$reps" -t 1 --streams "$streams" \
    --compare-micro-batches "${worker_args[@]}" 2>/dev/null > "$logs/bench"
  cat "$logs/bench" >&2
  tg1=$(grep -o "| *tg$n *| *[0-9.]*" "$logs/bench" | grep -o '[0-9.]*$')
  off=$(grep -o "tg${n}x$streams mb=off *| *[0-9.]*" "$logs/bench" | grep -o '[0-9.]*$')
  on=$(grep -o "tg${n}x$streams mb=on *| *[0-9.]*" "$logs/bench" | grep -o '[0-9.]*$')
  auto=$(grep -o "tg${n}x$streams mb=auto *| *[0-9.]*" "$logs/bench" | grep -o '[0-9.]*$')
  python3 -c "print(f'$rtt,$tg1,$off,$on,$auto,{$off/$tg1:.2f},{$on/$tg1:.2f},{$on/$off:.3f},{$auto/$off:.3f}')" | tee -a "$csv"
  wan_down
done
echo "bench-wan-streams: wrote $csv"
