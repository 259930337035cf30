#!/usr/bin/env bash
# Speculative decoding over the emulated WAN (moesh wan-emu): greedy generation plain vs with
# drafts, alternated rep by rep in one process, one worker at RTT ms. Root only.
#
#   bench/wan/speculative.sh [BUILD_DIR] [OUT_DIR]          (default build/, docs/perf/)
#   RTT=80 N=48 R=1 bench/wan/speculative.sh
#
# Two models, because what drafts can do depends on what the model writes:
#   cycling — qwen3moe 256 wide, 4 layers, 16 experts top-4, vocab 256: a random-weight model
#             whose greedy output falls into short cycles (e.g. "173 203 173 203 ..."), the
#             repetitive case n-gram drafts are for;
#   narrow  — the model of bench/wan/run.sh (vocab 2048), whose output rarely repeats: drafting
#             must then cost (almost) nothing;
#   oracle  — glm4moe from `make-model --nextn-oracle` with --draft nextn: a NextN head that
#             drafts every token right (as a trained head would most of the time), at most 3 per
#             step: what the model's own head saves in round trips.
# Each: `moesh bench -p 0 -n N -r R -t 1 --draft ngram --worker ...` in the hub (rows genN and
# genN+ngram after a grounded prompt: a 16-token phrase said four times).
set -euo pipefail
source "$(dirname "$0")/common.sh"
wan_init wsp "$@"
rtt="${RTT:-80}"
n="${N:-48}"
reps="${R:-1}"
cycling="${TMPDIR:-/tmp}/moesh-wan-cycling.gguf"
oracle="${TMPDIR:-/tmp}/moesh-wan-nextn-oracle.gguf"
[ -f "$oracle" ] || "$moesh" make-model --arch glm4moe --nextn-oracle --vocab none --out "$oracle" >/dev/null
[ -f "$cycling" ] || "$moesh" make-model --arch qwen3moe --type q8_0 --vocab none --out "$cycling" --n-embd 256 \
  --n-layer 4 --n-head 4 --n-head-kv 2 --head-dim 64 --n-expert 16 --n-expert-used 4 --n-ff-exp 128 \
  --n-vocab 256 --n-ctx 512 >/dev/null

half=$(python3 -c "print($rtt / 2)")
wan_up wsp --peer "p1:delay=${half}ms"
csv="$out/wan-speculative.csv"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) gen$n, RTT $rtt ms, 1 worker" > "$csv"
echo "model,draft,plain_tps,drafted_tps,ratio,tokens_per_pass,accepted,drafted" >> "$csv"
for which in cycling narrow oracle; do
  m="$model" ne=32 src=ngram dmax=16
  [ "$which" = cycling ] && m="$cycling" ne=16
  [ "$which" = oracle ] && m="$oracle" ne=8 src=nextn dmax=3
  pkill -f "moesh worker -m" 2>/dev/null || true
  sleep 0.5
  rm -f "$logs"/w*
  model="$m" wan_workers wsp 1 "$ne"
  ip netns exec moesh-wsp-hub "$moesh" bench -m "$m" -p 0 -n "$n" -r "$reps" -t 1 --draft "$src" \
    --draft-max "$dmax" "${worker_args[@]}" 2>/dev/null > "$logs/bench"
  plain=$(grep -o "| *gen$n *| *[0-9.]*" "$logs/bench" | grep -o '[0-9.]*$')
  spec=$(grep -o "gen$n+$src *| *[0-9.]*" "$logs/bench" | grep -o '[0-9.]*$')
  line=$(grep "^draft $src" "$logs/bench")
  tpp=$(echo "$line" | sed -E 's/.*; ([0-9.]+) tokens per forward pass.*/\1/')
  acc=$(echo "$line" | sed -E 's/.*pass, ([0-9]+) of ([0-9]+) drafts.*/\1,\2/')
  python3 -c "print(f'$which,$src,$plain,$spec,{$spec/$plain:.2f},$tpp,$acc')" | tee -a "$csv"
done
echo "bench-wan-speculative: wrote $csv"
