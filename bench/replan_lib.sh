# Helpers of the re-plan benchmarks (auto-replan*.sh): sourced, not run.
# port FILE: the port a moesh process printed ("listening on HOST:PORT") in FILE, once it has.
port() { while ! grep -q "^listening on" "$1" 2>/dev/null; do sleep 0.1; done; sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$1"; }
# complete OUT: a greedy completion of $N tokens from the gateway $G into OUT; prints its seconds.
complete() {
  local req="{\"prompt\":\"Once upon a time\",\"max_tokens\":$N,\"temperature\":0,\"ignore_eos\":true}"
  curl -sS -o "$1" -w '%{time_total}' -H 'Content-Type: application/json' --data-binary "$req" "$G/v1/completions"
}
# auto_status EXPR: the gateway's /swarm/status auto_replan, then EXPR (Python: "['applied']").
auto_status() { curl -sS "$G/swarm/status" | python3 -c "import json,sys; print(json.load(sys.stdin)['auto_replan']$1)"; }
# same_text A B: True when two completions have the same text.
same_text() { python3 -c "import json; a=json.load(open('$1')); b=json.load(open('$2')); print(a['choices'][0]['text'] == b['choices'][0]['text'])"; }
