#!/usr/bin/env bash
# Decode through workers over the emulated WAN (moesh wan-emu: real kernel TCP over TUN links):
# tok/s vs RTT x rate cap x number of workers, as CSV and a gnuplot PNG. Root only.
#
#   bench/wan/run.sh [BUILD_DIR] [OUT_DIR]        (default build/, docs/perf/)
#   RTTS="0 5 20 50 80 100 200" RATES="0 100 10" WORKERS="1 2 4" N=8 bench/wan/run.sh
#
# Each configuration: `wan-emu up` with one peer per worker at delay RTT/2 (rate R Mbit/s, 0 =
# unlimited), workers splitting every layer's experts evenly in the peer namespaces, and
# `moesh bench -p 0 -n N -r 1` in the hub namespace (one untimed warm-up run first). Only the
# trip structure matters here, so the model is narrow: qwen3moe 4 layers, 1024 wide, 32 experts
# top-4, Q8_0.
set -euo pipefail
source "$(dirname "$0")/common.sh"
wan_init wb "$@"
rtts="${RTTS:-0 5 20 50 80 100 200}"
rates="${RATES:-0 100 10}"
workers_list="${WORKERS:-1 2 4}"
n="${N:-8}"
n_expert=32

csv="$out/wan.csv"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) model $(basename "$model") tg$n" > "$csv"
echo "rtt_ms,rate_mbit,workers,tg_tps,ms_per_token" >> "$csv"
for w in $workers_list; do
  for rate in $rates; do
    for rtt in $rtts; do
      half=$(python3 -c "print($rtt / 2)")
      peers=()
      for i in $(seq 1 "$w"); do
        spec="p$i:delay=${half}ms"
        [ "$rate" != 0 ] && spec="$spec,rate=${rate}mbit"
        peers+=(--peer "$spec")
      done
      wan_up wb "${peers[@]}"
      wan_workers wb "$w" "$n_expert"
      tps=$(ip netns exec moesh-wb-hub "$moesh" bench -m "$model" -p 0 -n "$n" -r 1 -t 1 "${worker_args[@]}" 2>/dev/null |
            grep -o "tg$n *| *[0-9.]*" | grep -o '[0-9.]*$')
      ms=$(python3 -c "print(f'{1000 / $tps:.1f}')")
      echo "$rtt,$rate,$w,$tps,$ms" | tee -a "$csv"
      wan_down
    done
  done
done

if command -v gnuplot >/dev/null 2>&1; then
  gnuplot <<GP
set datafile separator ","
set terminal pngcairo size 900,560 noenhanced
set output "$out/wan.png"
set title "moesh decode over the emulated WAN (4 MoE layers, tg$n): tokens/s vs RTT"
set xlabel "RTT (ms)"; set ylabel "tokens/s"; set logscale y; set grid; set key outside right
plot for [w in "$workers_list"] for [r in "$rates"] "$csv" using (\$3==w+0 && \$2==r+0 ? \$1 : 1/0):4 \
  with linespoints title sprintf("%s worker(s), %s", w, r+0==0 ? "unlimited" : r." Mbit/s")
GP
  echo "bench-wan: wrote $csv and $out/wan.png"
else
  echo "bench-wan: wrote $csv (gnuplot not installed: no plot)"
fi
