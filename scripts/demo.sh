#!/usr/bin/env bash
# `make demo`: generate a small model on the spot and show what moesh does with it.
set -euo pipefail
BUILD=${1:-build}
MOESH="$BUILD/bin/moesh"
WORK=$(mktemp -d /tmp/moesh-demo.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

echo "== 1. generate a random-weight qwen3moe model (Q4_K_M) =="
"$MOESH" make-model --arch qwen3moe --type q4_k_m --seed 7 --out "$WORK/demo.gguf"
echo
echo "== 2. inspect it =="
"$MOESH" inspect "$WORK/demo.gguf" | head -n 40
echo
echo "== 3. generate 16 tokens (greedy) =="
"$MOESH" run -m "$WORK/demo.gguf" --tokens 1,2,3,4 -n 16 -t 2
echo
echo "== 4. same prompt, --json =="
"$MOESH" run -m "$WORK/demo.gguf" --tokens 1,2,3,4 -n 8 -t 2 --json
echo
echo "demo done (model files were in $WORK and are removed now)"
