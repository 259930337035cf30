#!/usr/bin/env bash
# Span lanes over the packet-level emulated WAN (moesh wan-emu: network namespaces, netem delay,
# real kernel TCP), where bench/span-lanes.sh uses a user-space delaying proxy: S streams decoded
# together through a span of every block on one `moesh span` peer, against the same span with a
# second peer as its lane, alternated round by round. Each peer runs in its own namespace at RTT/2
# one way, 1 thread; the backbone (1 thread, hub namespace) runs only the embeddings and the head.
# Root only.
#
#   bench/wan/lanes.sh [BUILD_DIR] [OUT_DIR]          (default build/, docs/perf/)
#   RTTS="2 20" STREAMS=8 N=16 R=3 bench/wan/lanes.sh
#
# The model is span-lanes.sh's (qwen3moe, 8 blocks, 1024 wide, 16 experts top-2, Q8_0): wide enough
# that a step's compute, not only its round trip, counts. The planner's predicted step for the same
# setup (its cost per byte measured here) is printed beside the measured one.
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODEL="${TMPDIR:-/tmp}/moesh-wan-lanes.gguf"
export MODEL
wan_make_model() {
  [ -f "$model" ] && return 0
  "$moesh" make-model --out "$model" --n-layer 8 --type q8_0 --n-ctx 2048 --n-embd 1024 --n-ff-exp 512 \
    --n-head 8 --head-dim 128 --n-expert 16 --n-expert-used 2 --vocab none >/dev/null
}
wan_init wl "$@"
trap 'pkill -f "moesh span -m $model" 2>/dev/null || true; wan_down; "$moesh" wan-emu down --name wl >/dev/null 2>&1 || true; rm -rf "$logs"' EXIT
rtts="${RTTS:-2 20}"
streams="${STREAMS:-8}"
n="${N:-16}"
reps="${R:-3}"

txt="$out/wan-lanes-$(git -C "$root" rev-parse --short HEAD).txt"
{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD): bench/wan/lanes.sh"
  echo "# span 0-7 of $(basename "$model") on one peer vs plus a lane; wan-emu, each peer at RTT/2 one way, -t 1"
  echo "rtt_ms,streams,one_peer_tps,with_lane_tps,ratio,measured_step_ms_one,measured_step_ms_lane,planned_step_ms_one,planned_step_ms_lane"
} > "$txt"
for rtt in $rtts; do
  half=$(python3 -c "print($rtt / 2)")
  wan_up wl --peer "p1:delay=${half}ms" --peer "p2:delay=${half}ms"
  for i in 1 2; do
    ip netns exec "moesh-wl-p$i" "$moesh" span -m "$model" --layers 0-7 --listen "10.77.$i.2:7400" -t 1 \
      >"$logs/s$i" 2>&1 &
    for _ in $(seq 1 100); do grep -aq 'listening on' "$logs/s$i" && break; sleep 0.1; done
    grep -aq 'listening on' "$logs/s$i" || { cat "$logs/s$i" >&2; exit 1; }
  done
  common=(-m "$model" -p 0 -n "$n" -r 1 -t 1 --streams "$streams" --span 0-7@10.77.1.2:7400)
  : >"$logs/one"
  : >"$logs/lane"
  for r in $(seq 1 "$reps"); do
    ip netns exec moesh-wl-hub "$moesh" bench "${common[@]}" 2>/dev/null >>"$logs/one"
    ip netns exec moesh-wl-hub "$moesh" bench "${common[@]}" --span-lane 0-7@10.77.2.2:7400 2>/dev/null >>"$logs/lane"
  done
  planned=()
  for nl in "" --no-lanes; do
    planned+=("$("$moesh" swarm plan -m "$model" --calibrate --calibrate-threads 1 --streams "$streams" \
      --backbone-mem 64MiB --peer "a:mem=4GiB,rtt=${rtt}ms" --peer "b:mem=4GiB,rtt=${rtt}ms" --no-standby $nl \
      2>/dev/null | sed -n 's/^predicted: \([0-9.]*\) ms per step.*/\1/p')")
  done
  python3 - "$logs" "$rtt" "$streams" "$n" "${planned[0]}" "${planned[1]}" >>"$txt" <<'PY'
import statistics, sys
logs, rtt, S, N, pl_lane, pl_one = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
def rates(path):  # every t/s of row tgNxS (llama-bench style table), one per round
    out = []
    for line in open(path).read().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[3] == f"tg{N}x{S}":
            out.append(float(cells[4].split()[0]))
    if not out:
        raise SystemExit(f"{path}: no row tg{N}x{S}")
    return out
one, lane = statistics.median(rates(f"{logs}/one")), statistics.median(rates(f"{logs}/lane"))
print(f"{rtt},{S},{one:.2f},{lane:.2f},{lane/one:.2f},{S/one*1e3:.1f},{S/lane*1e3:.1f},{pl_one:.1f},{pl_lane:.1f}")
PY
  tail -1 "$txt"
  pkill -f "moesh span -m $model" 2>/dev/null || true
  wan_down
done
echo "bench-wan-lanes: wrote $txt"
