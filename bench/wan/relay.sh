#!/usr/bin/env bash
# Relay overhead: decode through `moesh relay` vs direct, side by side, over the emulated WAN
# (moesh wan-emu) at each RTT. Root only.
#
#   bench/wan/relay.sh [BUILD_DIR] [OUT_DIR]          (default build/, docs/perf/)
#   RTTS="0 20 80" N=16 R=3 bench/wan/relay.sh
#
# Each RTT: one emulated peer per worker at delay RTT/2. In each peer namespace, next to each
# other: a worker listening (the direct path), a `moesh relay`, and a second worker holding the
# same experts that only dials out to that relay (the relayed path). Then, in the hub namespace,
# `moesh bench -p 0 -n N -r 1` alternates direct and relayed runs R times each, and the script
# prints tokens/s of both and their ratio (the relay sits next to the worker, as an operator
# would put it: the issue's target is <= 5 % overhead). A third set of workers joins the same
# relay over WebSocket (`--join ws://`) and is reached with `relay+ws://`: the WebSocket path's
# tokens/s and its ratio to direct. The model is the narrow one of run.sh.
set -euo pipefail
source "$(dirname "$0")/common.sh"
wan_init wr "$@"
rtts="${RTTS:-0 20 80}"
w=2
n="${N:-16}"
reps="${R:-3}"
n_expert=32

csv="$out/wan-relay.csv"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) model $(basename "$model") tg$n, $w workers, relay next to each worker" > "$csv"
echo "rtt_ms,direct_tps,relay_tps,relay_over_direct,ws_relay_tps,ws_over_direct" >> "$csv"
tps() { grep -o "tg$n *| *[0-9.]*" "$1" | grep -o '[0-9.]*$'; }
for rtt in $rtts; do
  half=$(python3 -c "print($rtt / 2)")
  peers=()
  for i in $(seq 1 "$w"); do peers+=(--peer "p$i:delay=${half}ms"); done
  wan_up wr "${peers[@]}"
  wan_workers wr "$w" "$n_expert"   # the direct workers: $worker_args
  relay_args=()
  ws_args=()
  per=$((n_expert / w))
  for i in $(seq 1 "$w"); do
    ns="moesh-wr-p$i"; addr="10.77.$i.2"
    ip netns exec "$ns" "$moesh" relay --listen "$addr:0" >"$logs/r$i" 2>&1 &
    for _ in $(seq 1 100); do grep -aq 'listening on' "$logs/r$i" && break; sleep 0.1; done
    rport=$(grep -ao 'listening on [0-9.]*:[0-9]*' "$logs/r$i" | sed 's/.*://')
    first=$(( (i - 1) * per )); last=$(( i * per - 1 ))
    ip netns exec "$ns" "$moesh" worker -m "$model" --experts "*:$first-$last" --join "$addr:$rport" \
      --name "rw$i" -t 1 >"$logs/rw$i" 2>&1 &
    for _ in $(seq 1 100); do grep -aq 'registered at the relay' "$logs/rw$i" && break; sleep 0.1; done
    relay_args+=(--worker "relay://$addr:$rport/rw$i")
    ip netns exec "$ns" "$moesh" worker -m "$model" --experts "*:$first-$last" --join "ws://$addr:$rport/" \
      --name "ww$i" -t 1 >"$logs/ww$i" 2>&1 &
    for _ in $(seq 1 100); do grep -aq 'registered at the relay' "$logs/ww$i" && break; sleep 0.1; done
    ws_args+=(--worker "relay+ws://$addr:$rport/ww$i")
  done
  d_sum=0; r_sum=0; w_sum=0
  for rep in $(seq 1 "$reps"); do
    ip netns exec moesh-wr-hub "$moesh" bench -m "$model" -p 0 -n "$n" -r 1 -t 1 "${worker_args[@]}" \
      2>/dev/null >"$logs/bd"
    ip netns exec moesh-wr-hub "$moesh" bench -m "$model" -p 0 -n "$n" -r 1 -t 1 "${relay_args[@]}" \
      2>/dev/null >"$logs/br"
    ip netns exec moesh-wr-hub "$moesh" bench -m "$model" -p 0 -n "$n" -r 1 -t 1 "${ws_args[@]}" \
      2>/dev/null >"$logs/bw"
    d=$(tps "$logs/bd"); r=$(tps "$logs/br"); ws=$(tps "$logs/bw")
    echo "rtt $rtt rep $rep: direct $d tok/s, relay $r tok/s, relay over websocket $ws tok/s" >&2
    d_sum=$(python3 -c "print($d_sum + $d)"); r_sum=$(python3 -c "print($r_sum + $r)")
    w_sum=$(python3 -c "print($w_sum + $ws)")
  done
  python3 -c "d=$d_sum/$reps; r=$r_sum/$reps; w=$w_sum/$reps; print(f'$rtt,{d:.2f},{r:.2f},{r/d:.3f},{w:.2f},{w/d:.3f}')" | tee -a "$csv"
  pkill -f "moesh relay --listen 10.77" 2>/dev/null || true
  wan_down
done
