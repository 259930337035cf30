#!/usr/bin/env bash
# `make demo`: generate a small MoE model (with a real BPE tokenizer and a ChatML template) on the
# spot, split its experts across two worker processes on loopback, run it through them, then
# serve it as an OpenAI-compatible gateway and stream a chat answer through the swarm.
set -euo pipefail
BUILD=${1:-build}
MOESH="$BUILD/bin/moesh"
WORK=$(mktemp -d /tmp/moesh-demo.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

wait_port() {  # $1 = worker log; prints the port once the worker says it is listening
  for _ in $(seq 1 200); do
    if grep -q "listening on" "$1" 2>/dev/null; then
      grep -o "listening on [0-9.]*:[0-9]*" "$1" | head -n1 | sed 's/.*://'
      return 0
    fi
    sleep 0.05
  done
  echo "worker did not start; its log:" >&2; cat "$1" >&2; return 1
}

echo "== 1. generate a random-weight qwen3moe model (Q8_0, 16 experts, top-4, BPE vocabulary) =="
"$MOESH" make-model --arch qwen3moe --type q8_0 --seed 7 --n-expert 16 --n-expert-used 4 --n-vocab 1196 \
  --out "$WORK/demo.gguf" | tail -n 3
echo
echo "== 2. cut it: a backbone without routed experts, and two expert slices =="
"$MOESH" slice -m "$WORK/demo.gguf" --backbone --out "$WORK/backbone.gguf" | tail -n 1
"$MOESH" slice -m "$WORK/demo.gguf" --experts '*:0-7' --out "$WORK/experts-a.gguf" | tail -n 1
"$MOESH" slice -m "$WORK/demo.gguf" --experts '*:8-15' --out "$WORK/experts-b.gguf" | tail -n 1
echo
echo "== 3. start two workers on loopback =="
"$MOESH" worker -m "$WORK/experts-a.gguf" --listen 127.0.0.1:0 --name worker-a -t 1 > "$WORK/a.log" 2>&1 &
PIDS+=($!)
"$MOESH" worker -m "$WORK/experts-b.gguf" --listen 127.0.0.1:0 --name worker-b -t 1 > "$WORK/b.log" 2>&1 &
PIDS+=($!)
PA=$(wait_port "$WORK/a.log"); PB=$(wait_port "$WORK/b.log")
sed 's/^/  worker-a | /' "$WORK/a.log"; sed 's/^/  worker-b | /' "$WORK/b.log"
echo
echo "== 4. generate 16 tokens on the backbone, every routed expert computed by the workers =="
"$MOESH" run -m "$WORK/backbone.gguf" --worker 127.0.0.1:$PA --worker 127.0.0.1:$PB \
  --tokens 1,2,3,4 -n 16 -t 1
echo
echo "== 5. the same, all local on the full model (must print the same tokens) =="
"$MOESH" run -m "$WORK/demo.gguf" --tokens 1,2,3,4 -n 16 -t 1
echo
echo "== 6. validation gate: exact f32 (must be bit-identical) and q8 + partial sums (lossy) =="
echo "   (on tiny random-weight models near-tied logits can flip an argmax; the gate then says FAIL)"
"$MOESH" gate -m "$WORK/demo.gguf" --worker 127.0.0.1:$PA --worker 127.0.0.1:$PB --wire f32 --combine exact -t 1 || true
"$MOESH" gate -m "$WORK/demo.gguf" --worker 127.0.0.1:$PA --worker 127.0.0.1:$PB --wire q8 --combine partial -t 1 || true
echo
echo "== 7. an OpenAI-compatible gateway on the backbone, experts on the two workers =="
"$MOESH" serve -m "$WORK/backbone.gguf" --worker 127.0.0.1:$PA --worker 127.0.0.1:$PB \
  --host 127.0.0.1 --port 0 --parallel 4 -c 512 -t 1 > "$WORK/serve.log" 2>&1 &
SERVE_PID=$!
PIDS+=($SERVE_PID)
PS=$(wait_port "$WORK/serve.log")
sed 's/^/  gateway  | /' "$WORK/serve.log"
echo
echo "== 8. a streamed chat request (POST /v1/chat/completions, stream: true) =="
echo "   (random weights: the words are real tokens of the vocabulary, the sense is not)"
echo "user: Tell me what a swarm of machines can do together."
printf "assistant: "
"$MOESH" chat --url http://127.0.0.1:$PS -n 48 --seed 1 --temp 0.8 --summary \
  "Tell me what a swarm of machines can do together."
echo
echo "== 9. stop the gateway, then the workers =="
kill -TERM "$SERVE_PID" 2>/dev/null || true
wait "$SERVE_PID" 2>/dev/null || true
tail -n 1 "$WORK/serve.log" | sed 's/^/  gateway  | /'
for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
PIDS=()
tail -n 2 "$WORK/a.log" | sed 's/^/  worker-a | /'
tail -n 2 "$WORK/b.log" | sed 's/^/  worker-b | /'
echo
echo "demo done"
