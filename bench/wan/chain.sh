#!/usr/bin/env bash
# Chained spans against star trips on the packet-level emulator (moesh wan-emu, real kernel TCP):
# the 48-layer headline model in 4 equal spans on 4 peers, single stream, the backbone in a
# namespace of its own (with the backbone in the hub, peer <-> peer paths would be twice as long
# as its own and a chain could only break even). Two geometries, each at two RTTs:
#   even  every pair of hosts RTT apart (each link RTT/4 one way): star 4 RTT per token,
#         chain 1/2 + 3 x 1/2 + 1/2 = 2.5 RTT
#   far   the peers 20 ms apart from each other, RTT from the backbone: star 4 RTT,
#         chain RTT + 3 x 10 ms
# For each: --span-chain off, on and auto; tok/s, trips and chains per token, tokens equal to
# all-local. CSV (and a PNG with gnuplot) in OUT_DIR. Root only.
#
#   bench/wan/chain.sh [BUILD_DIR] [OUT_DIR]        RTTS="20 100" N=16 bench/wan/chain.sh
set -euo pipefail
export MODEL="${MODEL:-${TMPDIR:-/tmp}/moesh-headline-48.gguf}"
source "$(dirname "$0")/common.sh"
wan_make_model() {  # the headline's model (bench/wan/headline.sh)
  [ -f "$model" ] && return 0
  "$moesh" make-model --arch qwen3moe --type q8_0 --vocab none --out "$model" --n-embd 256 --n-layer 48 \
    --n-head 4 --n-head-kv 2 --head-dim 64 --n-expert 128 --n-expert-used 8 --n-ff-exp 32 --n-vocab 2048 \
    --n-ctx 512 >/dev/null
}
wan_init ch "$@"
rtts="${RTTS:-20 100}"
n="${N:-16}"
prompt="5,6,7,8,9,5,6,7,8,9,5,6,7,8,9"
port=7001
spans=(0-11 12-23 24-35 36-47)
local_tokens=$("$moesh" run -m "$model" --tokens "$prompt" -n "$n" -t 1 --json 2>/dev/null |
               python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["tokens"])))')
# The planner's and the simulator's predictions beside each measurement: compute cost per byte
# from a local decode here, message cost as C16 measured it (MSG_US).
spb=$("$moesh" swarm plan -m "$model" --calibrate --peer x:mem=1GiB --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds_per_byte"])')
msg_us="${MSG_US:-77.6}"

start_peers() {
  peer_pids=()
  span_args=()
  local i
  for i in 1 2 3 4; do
    ip netns exec "moesh-ch-p$i" "$moesh" span -m "$model" --layers "${spans[$((i - 1))]}" \
      --listen "10.77.$i.2:$port" -t 1 -c 512 >"$logs/p$i" 2>&1 &
    peer_pids+=($!)
    span_args+=(--span "${spans[$((i - 1))]}@10.77.$i.2:$port")
  done
  for i in 1 2 3 4; do
    for _ in $(seq 1 200); do grep -aq 'listening on' "$logs/p$i" && break; sleep 0.1; done
    grep -aq 'listening on' "$logs/p$i" || { cat "$logs/p$i" >&2; exit 1; }
  done
}
stop_peers() { for p in "${peer_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }

csv="$out/chain.csv"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) model 48 layers in 4 spans, tg$n, backbone in its own namespace" > "$csv"
echo "geometry,rtt_ms,peer_rtt_ms,mode,tok_s,trips_per_token,chains_per_token,chain_breaks,tokens_equal,predicted_tok_s,simulated_tok_s,sim_vs_measured" >> "$csv"

# measure GEOMETRY RTT PEER_RTT MODE
measure() {
  local geometry="$1" rtt="$2" peer_rtt="$3" mode="$4"
  ip netns exec moesh-ch-bb "$moesh" run -m "$model" --tokens "$prompt" -n "$n" -t 1 --json \
    --span-chain "$mode" "${span_args[@]}" > "$logs/run.json" 2>"$logs/run.err" || { cat "$logs/run.err" >&2; exit 1; }
  local i pargs=() chain=()
  for i in 1 2 3 4; do pargs+=(--peer "p$i:mem=1GiB,rtt=${rtt}ms"); done
  [ "$mode" = off ] && chain=(--no-chain)
  local common=(-m "$model" -c 512 "${pargs[@]}" --peer-rtt "${peer_rtt}ms" "${chain[@]}" --seconds-per-byte "$spb"
                --message-us "$msg_us" --layout spans)
  "$moesh" swarm plan "${common[@]}" --json > "$logs/plan.json"
  "$moesh" simulate "${common[@]}" --steps "$n" --json > "$logs/sim.json"
  python3 - "$logs/run.json" "$logs/plan.json" "$logs/sim.json" "$geometry" "$rtt" "$peer_rtt" "$mode" \
    "$local_tokens" <<'PY' | tee -a "$csv"
import json, sys
run, plan, sim = (json.load(open(p)) for p in sys.argv[1:4])
geometry, rtt, peer_rtt, mode, ref = sys.argv[4:9]
t, s = run["timings"], run["spans"]
n = t["predicted_n"]
same = ",".join(map(str, run["tokens"])) == ref
tps, sim_tps = t["predicted_per_second"], sim["simulated"]["tokens_per_s"]
print(f"{geometry},{rtt},{peer_rtt},{mode},{tps:.2f},{s['trips'] / n:.2f},"
      f"{s['chains'] / n:.2f},{s['chain_breaks']},{same},{plan['predicted_tokens_per_s']:.2f},{sim_tps:.2f},"
      f"{sim_tps / tps:.3f}")
PY
}

for rtt in $rtts; do
  # even: every link rtt/4 one way, so every pair of hosts is rtt apart.
  q=$(python3 -c "print($rtt / 4)")
  wan_up ch --peer "p1:delay=${q}ms" --peer "p2:delay=${q}ms" --peer "p3:delay=${q}ms" --peer "p4:delay=${q}ms" \
    --peer "bb:delay=${q}ms"
  start_peers
  for mode in off on auto; do measure even "$rtt" "$rtt" "$mode"; done
  stop_peers
  wan_down
  # far: the peers 5 ms from the hub (20 ms apart), the backbone rtt from each of them.
  b=$(python3 -c "print(max($rtt / 2 - 5, 0))")
  wan_up ch --peer "p1:delay=5ms" --peer "p2:delay=5ms" --peer "p3:delay=5ms" --peer "p4:delay=5ms" \
    --peer "bb:delay=${b}ms"
  start_peers
  for mode in off on auto; do measure far "$rtt" 20 "$mode"; done
  stop_peers
  wan_down
done

if command -v gnuplot >/dev/null 2>&1; then
  gnuplot <<GP
set datafile separator ","
set terminal pngcairo size 900,520 noenhanced
set output "$out/chain.png"
set title "4 spans of a 48-layer MoE on the emulated WAN: star vs chained (tokens/s, measured)"
set style data histograms; set style histogram clustered gap 1; set style fill solid 0.8 border -1
set ylabel "tokens/s"; set grid y; set key outside right; set yrange [0:*]
plot "< grep -v '^#' $csv | awk -F, 'NR>1 && \$4==\"off\"'" using 5:xtic(sprintf("%s %s ms", stringcolumn(1), stringcolumn(2))) title "star", \
     "< grep -v '^#' $csv | awk -F, 'NR>1 && \$4==\"on\"'" using 5 title "chain", \
     "< grep -v '^#' $csv | awk -F, 'NR>1 && \$4==\"auto\"'" using 5 title "auto"
GP
  echo "chain: wrote $csv and $out/chain.png"
else
  echo "chain: wrote $csv (gnuplot not installed: no plot)"
fi
