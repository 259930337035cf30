#!/usr/bin/env bash
# Failover under load: throughput of `moesh serve` with three replicated workers while one of
# them is killed (-9) every ~10 s and restarted on its port, against the same setup left alone,
# phases alternated in the same run. The issue's target: throughput loss <= 2 %, 0 failed requests.
#
#   bench/failover.sh [BUILD_DIR] [OUT_DIR]          (default build/, docs/perf/)
#   PHASES=2 REQUESTS=160 CONCURRENCY=4 KILL_EVERY=10 bench/failover.sh
#
# The backbone is a backbone slice (no experts of its own): every pair goes to a worker, so a
# killed worker's pairs must fail over to the two replicas, and it must rejoin when restarted.
# Load: tests/serve/server/load.mjs (streaming chat, temperature 0, fixed tokens per request).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
out="${2:-$root/docs/perf}"
moesh="$build/bin/moesh"
phases="${PHASES:-2}"
requests="${REQUESTS:-160}"
conc="${CONCURRENCY:-4}"
every="${KILL_EVERY:-10}"
tmp="$(mktemp -d)"
pids=()
trap 'kill ${killer:-} 2>/dev/null || true; pkill -f "worker -m $tmp/m.gguf" 2>/dev/null || true
      for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"' EXIT
mkdir -p "$out"

"$moesh" make-model --arch qwen3moe --out "$tmp/m.gguf" --seed 7 --n-embd 256 --n-layer 4 --n-expert 16 \
  --n-expert-used 4 --n-ff-exp 256 --n-head 4 --head-dim 64 --n-ctx 2048 >/dev/null
"$moesh" slice -m "$tmp/m.gguf" --backbone --out "$tmp/bb.gguf" >/dev/null
ports=($(python3 -c 'import socket
for _ in range(3):
    s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'))
wpid=()
start_worker() {  # index
  "$moesh" worker -m "$tmp/m.gguf" --experts '*:*' --listen "127.0.0.1:${ports[$1]}" -t 1 --name "w$1" \
    >"$tmp/w$1.log" 2>&1 &
  wpid[$1]=$!
  pids+=("$!")
  for _ in $(seq 1 100); do grep -q 'listening on' "$tmp/w$1.log" && return 0; sleep 0.05; done
  echo "worker $1 did not start" >&2; exit 1
}
for i in 0 1 2; do start_worker "$i"; done
"$moesh" serve -m "$tmp/bb.gguf" --worker "127.0.0.1:${ports[0]}" --worker "127.0.0.1:${ports[1]}" \
  --worker "127.0.0.1:${ports[2]}" --parallel "$conc" -c 2048 --threads 1 --port 0 >"$tmp/serve.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 100); do grep -q '^listening on' "$tmp/serve.log" && break; sleep 0.1; done
base="http://$(sed -n 's/^listening on //p' "$tmp/serve.log" | head -1)"
metric() { curl -sS "$base/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }

load() {  # -> JSON line
  node "$root/tests/serve/server/load.mjs" --base "$base" --requests "$requests" --concurrency "$conc" \
    --max-tokens 64 --json || true
}
kill_loop() {
  local i=0
  while :; do
    sleep "$every"
    # By port, not by pid: this loop runs in a subshell, restarted workers' pids live here only.
    if pkill -KILL -f -- "--listen 127.0.0.1:${ports[$i]} "; then echo "$(date +%s.%N) killed w$i" >>"$tmp/kills"; fi
    while pgrep -f -- "--listen 127.0.0.1:${ports[$i]} " >/dev/null; do sleep 0.05; done
    sleep 1
    start_worker "$i"
    i=$(( (i + 1) % 3 ))
  done
}

load >/dev/null  # warm-up
csv="$out/failover.csv"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) 3 replicated workers, $conc streams, $requests requests x 64 tokens per phase, one worker killed every ${every} s" >"$csv"
echo "phase,mode,tok_per_s,failed,kills" >>"$csv"
steady_sum=0; killed_sum=0; failed_total=0; kills_total=0
for p in $(seq 1 "$phases"); do
  s=$(load); st=$(echo "$s" | python3 -c 'import json,sys; print(json.load(sys.stdin)["generated_tok_per_s"])')
  sf=$(echo "$s" | python3 -c 'import json,sys; print(json.load(sys.stdin)["failed"])')
  echo "$p,steady,$st,$sf,0" | tee -a "$csv"
  : >"$tmp/kills"
  kill_loop & killer=$!
  k=$(load)
  kill "$killer" 2>/dev/null || true; wait "$killer" 2>/dev/null || true; killer=""
  for i in 0 1 2; do pgrep -f -- "--listen 127.0.0.1:${ports[$i]} " >/dev/null || start_worker "$i"; done
  kt=$(echo "$k" | python3 -c 'import json,sys; print(json.load(sys.stdin)["generated_tok_per_s"])')
  kf=$(echo "$k" | python3 -c 'import json,sys; print(json.load(sys.stdin)["failed"])')
  nk=$(wc -l <"$tmp/kills")
  echo "$p,killing,$kt,$kf,$nk" | tee -a "$csv"
  steady_sum=$(python3 -c "print($steady_sum + $st)"); killed_sum=$(python3 -c "print($killed_sum + $kt)")
  failed_total=$((failed_total + sf + kf)); kills_total=$((kills_total + nk))
done
python3 -c "r=$killed_sum/$steady_sum; print(f'# killing/steady throughput {r:.3f} (loss {100*(1-r):.1f} %), {$kills_total} kills, {$failed_total} failed requests')" | tee -a "$csv"
echo "# gateway: moesh_requests_failed_total $(metric moesh_requests_failed_total), rejoins $(curl -sS "$base/metrics" | awk '/^moesh_worker_rejoins_total/ { s += $NF } END { print s }')" | tee -a "$csv"
