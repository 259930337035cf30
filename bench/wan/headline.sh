#!/usr/bin/env bash
# Issue 13's headline: a 48-layer Qwen3-30B-A3B-shaped model (narrow: the trip structure is what
# matters; 128 experts top-8) on the packet-level emulator (moesh wan-emu, real kernel TCP), 4 peers
# that each hold about a third of the model, a backbone holding only embeddings and head, single
# stream, at 20 and 100 ms RTT:
#   (a) experts: every peer an equal share of every layer's experts (one trip per layer)
#   (b) spans:   4 equal spans, Petals-style (one trip per span)
#   (c) plan:    `moesh swarm plan`'s choice, with speculative decoding (--draft ngram)
#   (c5)         the same with a fifth, phone-sized peer (little memory, slow, 80 ms RTT)
# For each: measured tok/s and trips per token, the planner's prediction and `moesh simulate`'s,
# calibrated by a local decode (seconds per byte) and a zero-delay run (cost per message).
# CSV and a PNG in OUT_DIR. Root only.
#
#   bench/wan/headline.sh [BUILD_DIR] [OUT_DIR]      RTTS="20 100" N=16 bench/wan/headline.sh
set -euo pipefail
export MODEL="${MODEL:-${TMPDIR:-/tmp}/moesh-headline-48.gguf}"
source "$(dirname "$0")/common.sh"
wan_make_model() {
  [ -f "$model" ] && return 0
  "$moesh" make-model --arch qwen3moe --type q8_0 --vocab none --out "$model" --n-embd 256 --n-layer 48 \
    --n-head 4 --n-head-kv 2 --head-dim 64 --n-expert 128 --n-expert-used 8 --n-ff-exp 32 --n-vocab 2048 \
    --n-ctx 512 >/dev/null
}
wan_init hl "$@"
rtts="${RTTS:-20 100}"
n="${N:-16}"
prompt="5,6,7,8,9,5,6,7,8,9,5,6,7,8,9"
port=7001

model_bytes=$(stat -c %s "$model")
peer_mem=$((model_bytes * 40 / 100))  # a third of the layers and their KV, a little more
bb_mem=$((model_bytes * 27 / 100))     # embeddings, head and the dense parts (attention, router) of every layer: layout (a) needs them
phone_mem=$((model_bytes * 4 / 100))

# Calibration 1: the compute cost per byte, from a local decode here.
spb=$("$moesh" swarm plan -m "$model" --calibrate --peer x:mem=1GiB --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds_per_byte"])')
local_ms=$("$moesh" run -m "$model" --tokens "$prompt" -n "$n" -t 1 --json 2>/dev/null |
           python3 -c 'import json,sys; t=json.load(sys.stdin)["timings"]; print(1000/t["predicted_per_second"])')
echo "calibration: $spb s/byte; local decode $local_ms ms/token"

peers_for() {  # peers_for RTT_MS [phone]: --peer options for the planner and the simulator
  local rtt="$1" i
  for i in 1 2 3 4; do echo "--peer p$i:mem=${peer_mem},rtt=${rtt}ms,addr=10.77.$i.2:$port"; done
  [ "${2:-}" = phone ] && echo "--peer p5:mem=${phone_mem},rtt=80ms,speed=0.3,addr=10.77.5.2:$port"
  return 0
}

# start_roles PLAN_JSON: starts every role's process in its namespace, sets $backbone_args.
start_roles() {
  backbone_args=()
  role_pids=()
  local line name role what addr i
  while IFS=' ' read -r name role what addr; do
    i="${name#p}"
    case "$role" in
      span)
        ip netns exec "moesh-hl-$name" "$moesh" span -m "$model" --layers "$what" --listen "$addr" -t 1 -c 512 \
          >"$logs/$name" 2>&1 &
        backbone_args+=(--span "$what@$addr") ;;
      experts)
        ip netns exec "moesh-hl-$name" "$moesh" worker -m "$model" --experts "$what" --listen "$addr" -t 1 \
          >"$logs/$name" 2>&1 &
        backbone_args+=(--worker "$addr") ;;
      *) continue ;;
    esac
    role_pids+=($!)
    for _ in $(seq 1 200); do grep -aq 'listening on' "$logs/$name" && break; sleep 0.1; done
    grep -aq 'listening on' "$logs/$name" || { cat "$logs/$name" >&2; exit 1; }
  done < <(python3 -c '
import json,sys
for r in json.load(open(sys.argv[1]))["roles"]:
    print(r["peer"], r["role"], r.get("layers") or r.get("experts") or "-", r.get("addr","-"))' "$1")
}
stop_roles() { for p in "${role_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }

csv="$out/headline.csv"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) model 48 layers 128x top-8 narrow tg$n; $spb s/byte" > "$csv"
echo "rtt_ms,config,peers,tok_s,trips_per_token,predicted_tok_s,simulated_tok_s,sim_vs_measured,tokens_equal,passes,drafted,accepted,roles" >> "$csv"

# measure CONFIG RTT LAYOUT [draft] [phone]
measure() {
  local config="$1" rtt="$2" layout="$3" draft="${4:-}" phone="${5:-}" npeers=4
  [ "$phone" = phone ] && npeers=5
  local pargs; mapfile -t pargs < <(peers_for "$rtt" "$phone" | tr ' ' '\n')
  local common=(-m "$model" -c 512 "${pargs[@]}" --backbone-mem "$bb_mem" --seconds-per-byte "$spb"
                --message-us "$msg_us" --layout "$layout")
  "$moesh" swarm plan "${common[@]}" --json > "$logs/plan.json"
  start_roles "$logs/plan.json"
  local dargs=()
  [ -n "$draft" ] && dargs=(--draft ngram)
  ip netns exec moesh-hl-hub "$moesh" run -m "$model" --tokens "$prompt" -n "$n" -t 1 --json "${dargs[@]}" \
    "${backbone_args[@]}" > "$logs/run.json" 2>"$logs/run.err" || { cat "$logs/run.err" >&2; exit 1; }
  stop_roles
  "$moesh" simulate "${common[@]}" --steps "$n" --json > "$logs/sim.json"
  python3 - "$logs/run.json" "$logs/plan.json" "$logs/sim.json" "$rtt" "$config" "$npeers" "$local_tokens" <<'PY' | tee -a "$csv"
import json, sys
run, plan, sim = (json.load(open(p)) for p in sys.argv[1:4])
rtt, config, npeers, ref = sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
t = run["timings"]
tps = t["predicted_per_second"]
trips = 0
if "spans" in run: trips += run["spans"]["trips"]
if "remote" in run: trips += run["remote"]["layer_calls"]
trips_per_token = trips / t["predicted_n"]  # every pass, the prefill's too, per token generated
sim_tps = sim["simulated"]["tokens_per_s"]
# The simulator runs plain decoding: compare like with like (tokens per step x steps).
sim_note = sim_tps / tps if "draft" not in run else float("nan")
same = ",".join(map(str, run["tokens"])) == ref
d = run.get("draft", {"passes": t["predicted_n"], "drafted": 0, "accepted": 0})
roles = " ".join(f"{r['peer']}={r['role']}:{r.get('layers') or r.get('experts') or '-'}" for r in plan["roles"])
print(f"{rtt},{config},{npeers},{tps:.2f},{trips_per_token:.2f},{plan['predicted_tokens_per_s']:.2f},{sim_tps:.2f},"
      f"{sim_note:.3f},{same},{d['passes']},{d['drafted']},{d['accepted']},{roles}")
PY
}

# Calibration 2: the cost of one message through this code and the emulator, from a zero-delay
# run of layout (a): (its ms/token - the local ms/token) / (2 x trips per token).
local_tokens=$("$moesh" run -m "$model" --tokens "$prompt" -n "$n" -t 1 --json 2>/dev/null |
               python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["tokens"])))')
msg_us=150
wan_up hl --peer p1 --peer p2 --peer p3 --peer p4
measure calib 0 experts > /dev/null
wan_down
msg_us=$(python3 - "$logs/run.json" "$local_ms" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = r["timings"]
ms = 1000 / t["predicted_per_second"]
trips = r["remote"]["layer_calls"] / t["predicted_n"]  # passes: the prefill and n-1 decode steps
print(f"{max(0.0, (ms - float(sys.argv[2])) / (2 * trips)) * 1e3:.1f}")
PY
)
echo "calibration: $msg_us us per message (zero-delay run of layout a)"
sed -i "1s|\$|; ${msg_us} us/message|" "$csv"

for rtt in $rtts; do
  half=$(python3 -c "print($rtt / 2)")
  wan_up hl --peer "p1:delay=${half}ms" --peer "p2:delay=${half}ms" --peer "p3:delay=${half}ms" \
    --peer "p4:delay=${half}ms" --peer "p5:delay=40ms"
  measure a "$rtt" experts
  measure b "$rtt" spans
  measure c-plain "$rtt" plan
  measure c "$rtt" plan draft
  measure c5 "$rtt" plan draft phone
  wan_down
done

if command -v gnuplot >/dev/null 2>&1; then
  gnuplot <<GP
set datafile separator ","
set terminal pngcairo size 900,520 noenhanced
set output "$out/headline.png"
set title "48-layer MoE (128 experts top-8), 4 peers on the emulated WAN: tokens/s (measured)"
set style data histograms; set style histogram clustered gap 1; set style fill solid 0.8 border -1
set ylabel "tokens/s"; set grid y; set key outside right; set yrange [0:*]
plot "< grep -v '^#' $csv | awk -F, 'NR>1 && \$1==$(echo $rtts | cut -d' ' -f1)'" using 4:xtic(2) title "$(echo $rtts | cut -d' ' -f1) ms RTT", \
     "< grep -v '^#' $csv | awk -F, 'NR>1 && \$1==$(echo $rtts | awk '{print $NF}')'" using 4 title "$(echo $rtts | awk '{print $NF}') ms RTT"
GP
  echo "headline: wrote $csv and $out/headline.png"
else
  echo "headline: wrote $csv (gnuplot not installed: no plot)"
fi
