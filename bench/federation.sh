#!/usr/bin/env bash
# Federation: two backbones decoding at the same time through the same two workers, with the
# workers batching concurrent same-layer requests into one compute pass (the default) against
# one request per pass (--max-batch-tokens 1) and against batching with a 2 ms window
# (--batch-window-us 2000); modes alternated R times in the same run. Prints each mode's summed
# tokens/s of the two backbones and the ratios to one-per-pass.
#
#   bench/federation.sh [BUILD_DIR] [OUT_DIR]          (default build/, docs/perf/)
#   N=32 R=3 bench/federation.sh
#
# The model is the mid one of C5 (q8_0, n_embd 1024, 4 layers, 32 experts top-4, n_ff_exp 512):
# experts big enough that reading their weights is a real part of a pass. Workers and backbones
# run with one thread each on 127.0.0.1.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
out="${2:-$root/docs/perf}"
moesh="$build/bin/moesh"
n="${N:-32}"
reps="${R:-3}"
tmp="$(mktemp -d)"
trap 'pkill -f "worker -m $tmp/m.gguf" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"' EXIT
mkdir -p "$out"
"$moesh" make-model --arch qwen3moe --out "$tmp/m.gguf" --seed 7 --type q8_0 --n-vocab 4096 --n-ctx 4096 \
  --n-embd 1024 --n-layer 4 --n-head 16 --head-dim 64 --n-expert 32 --n-expert-used 4 --n-ff-exp 512 >/dev/null

start_workers() {  # extra worker flags...
  pkill -f "worker -m $tmp/m.gguf" 2>/dev/null || true
  while pgrep -f "worker -m $tmp/m.gguf" >/dev/null; do sleep 0.05; done
  addrs=()
  for i in 0 1; do
    "$moesh" worker -m "$tmp/m.gguf" --experts "*:$((i * 16))-$((i * 16 + 15))" --listen 127.0.0.1:0 -t 1 \
      --name "fw$i" "$@" >"$tmp/w$i.log" 2>&1 &
    for _ in $(seq 1 200); do grep -q 'listening on' "$tmp/w$i.log" && break; sleep 0.05; done
    addrs+=(--worker "$(grep -o 'listening on [0-9.:]*' "$tmp/w$i.log" | sed 's/listening on //')")
  done
}
tps() { grep -o "tg$n *| *[0-9.]*" "$1" | grep -o '[0-9.]*$'; }
pair() {  # -> summed tok/s of two concurrent backbones
  "$moesh" bench -m "$tmp/m.gguf" -p 0 -n "$n" -r 1 -t 1 "${addrs[@]}" --backbone-name b1 >"$tmp/b1" 2>/dev/null &
  local p1=$!
  "$moesh" bench -m "$tmp/m.gguf" -p 0 -n "$n" -r 1 -t 1 "${addrs[@]}" --backbone-name b2 >"$tmp/b2" 2>/dev/null
  wait "$p1"
  python3 -c "print($(tps "$tmp/b1") + $(tps "$tmp/b2"))"
}
declare -A sum=([one]=0 [batch]=0 [window]=0)
for rep in $(seq 1 "$reps"); do
  for mode in one batch window; do
    case $mode in
      one) start_workers --max-batch-tokens 1 ;;
      batch) start_workers ;;
      window) start_workers --batch-window-us 2000 ;;
    esac
    t=$(pair)
    echo "rep $rep $mode: $t tok/s (two backbones together)" >&2
    sum[$mode]=$(python3 -c "print(${sum[$mode]} + $t)")
  done
done
csv="$out/federation.csv"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) mid q8_0 model, 2 workers, 2 backbones, tg$n, $reps reps" >"$csv"
echo "one_per_pass_tps,batched_tps,batched_window2ms_tps,batched_over_one,window_over_one" >>"$csv"
python3 -c "o=${sum[one]}/$reps; b=${sum[batch]}/$reps; w=${sum[window]}/$reps; print(f'{o:.2f},{b:.2f},{w:.2f},{b/o:.3f},{w/o:.3f}')" | tee -a "$csv"
