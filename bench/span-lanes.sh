#!/usr/bin/env bash
# Span lanes (docs/span.md "Lanes"): S streams decoded together through a span of every block on
# one `moesh span` peer, against the same span with a second peer as its lane (each computing about
# half of the streams' rows, both trips in flight at once), each peer behind a delayed path
# (moesh wan-proxy) and 1 thread, as if each were its own one-core machine; the backbone (1 thread)
# runs only the embeddings and the head. Alternated runs. (That the bits equal one peer's is what the
# SpanLanes tests check; this times it.)
# Usage: bench/span-lanes.sh [BUILD_DIR] [ONE_WAY_DELAY_MS] [STREAMS] [TOKENS] [ROUNDS]
set -euo pipefail
B=${1:-build}; D=${2:-10}; S=${3:-4}; N=${4:-16}; R=${5:-3}
M="$B/bin/moesh"; T=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
# Wide enough that a step's compute, not only its round trip, counts (q8_0, 8 blocks, 16 experts).
"$M" make-model --out "$T/m.gguf" --n-layer 8 --type q8_0 --n-ctx 2048 --n-embd 1024 --n-ff-exp 512 \
  --n-head 8 --head-dim 128 --n-expert 16 --n-expert-used 2 --vocab none > /dev/null
"$M" span -m "$T/m.gguf" --layers 0-7 --listen 127.0.0.1:7211 -t 1 > "$T/a" 2>&1 &
"$M" span -m "$T/m.gguf" --layers 0-7 --listen 127.0.0.1:7212 -t 1 > "$T/b" 2>&1 &
sleep 2
for p in 1 2; do "$M" wan-proxy --listen 127.0.0.1:731$p --to 127.0.0.1:721$p --delay-ms "$D" > "$T/p$p" 2>&1 & done
sleep 0.5
common=(-m "$T/m.gguf" -p 0 -n "$N" -r 1 -t 1 --streams "$S" --span 0-7@127.0.0.1:7311)
for r in $(seq 1 "$R"); do
  "$M" bench "${common[@]}" > "$T/one.$r.txt" 2> "$T/one.$r.err"
  "$M" bench "${common[@]}" --span-lane 0-7@127.0.0.1:7312 > "$T/lane.$r.txt" 2> "$T/lane.$r.err"
done
# The planner's prediction for the same setup (its cost per byte measured here, 1 thread): the
# step with the lane and without (--no-lanes).
for nl in "" --no-lanes; do
  "$M" swarm plan -m "$T/m.gguf" --calibrate --calibrate-threads 1 --streams "$S" --backbone-mem 64MiB \
    --peer a:mem=4GiB,rtt=$((2 * D))ms --peer b:mem=4GiB,rtt=$((2 * D))ms --no-standby $nl 2>/dev/null |
    sed -n 's/^predicted: \([0-9.]*\) ms per step.*/\1/p' >> "$T/planned"
done
python3 - "$T" "$R" "$D" "$S" "$N" <<'PY'
import json, sys, statistics
t, R, D, S, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def rate(path, test):  # the t/s of the table row `test` (llama-bench style)
    text = open(path).read()
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[3] == test:
            return float(cells[4].split()[0])
    raise SystemExit(f"{path}: no row {test}:\n{text}")
test = f"tg{N}x{S}"
one = [rate(f"{t}/one.{r}.txt", test) for r in range(1, R + 1)]
lane = [rate(f"{t}/lane.{r}.txt", test) for r in range(1, R + 1)]
print(f"rtt {2*D} ms, {S} streams x {N} tokens, {R} alternated rounds (tokens/s over all streams)")
print(f"  one span peer:        {min(one):7.2f}-{max(one):7.2f} (median {statistics.median(one):.2f})")
print(f"  span + one lane:      {min(lane):7.2f}-{max(lane):7.2f} (median {statistics.median(lane):.2f})")
print(f"  lane / one: {statistics.median(lane)/statistics.median(one):.2f}x")
planned = [float(x) for x in open(f"{t}/planned").read().split()]
ml, mo = S / statistics.median(lane) * 1e3, S / statistics.median(one) * 1e3
print(f"  step, measured (medians): {ml:.1f} ms with the lane, {mo:.1f} ms without; "
      f"planned: {planned[0]:.1f} / {planned[1]:.1f} ms ({planned[1]/planned[0]:.2f}x)")
PY
