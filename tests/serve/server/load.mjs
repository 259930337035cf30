// Bounded load test for `moesh serve`: a fixed number of streaming chat requests issued by a
// fixed number of concurrent clients; reports throughput and latency percentiles.
//
//   node tests/serve/server/load.mjs --base http://127.0.0.1:8080 [--concurrency 32]
//        [--requests 128] [--max-tokens 64] [--json]
//
// Each client loops: send a streaming /v1/chat/completions request (stream_options.include_usage,
// temperature 0, ignore_eos so every request generates exactly --max-tokens tokens), read the SSE
// stream to [DONE], record time to first token (first non-empty delta) and total time, repeat
// until --requests have been sent in all. Uses only Node's built-in fetch (no npm packages).
// Output: requests/s, generated tok/s (completion tokens from the usage chunks / wall time),
// p50/p99 of TTFT and total latency, and the number of failed requests (non-200 or no [DONE]).

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => {
    if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith("--") ? all[i + 1] : "true"]);
    return acc;
  }, []));
const base = args.base ?? "http://127.0.0.1:8080";
const concurrency = Number(args.concurrency ?? 32);
const total = Number(args.requests ?? 128);
const maxTokens = Number(args["max-tokens"] ?? 64);

const topics = ["colors", "rivers", "planets", "metals", "birds", "trees", "rocks", "clouds"];
let next = 0;
const results = [];
let failures = 0;

async function one(i) {
  const body = {
    model: "load",
    messages: [{ role: "system", content: "You are terse." },
               { role: "user", content: `Request ${i}: list some ${topics[i % topics.length]}.` }],
    max_tokens: maxTokens, temperature: 0, ignore_eos: true,
    stream: true, stream_options: { include_usage: true },
  };
  const t0 = performance.now();
  let ttft = null;
  let tokens = 0;
  let done = false;
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (res.status !== 200) { failures++; await res.text(); return; }
  const dec = new TextDecoder();
  let buf = "";
  for await (const part of res.body) {
    buf += dec.decode(part, { stream: true });
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (!ev.startsWith("data: ")) continue;
      const data = ev.slice(6);
      if (data === "[DONE]") { done = true; continue; }
      const j = JSON.parse(data);
      if (j.usage) tokens = j.usage.completion_tokens;
      if (ttft === null && j.choices?.[0]?.delta?.content) ttft = performance.now() - t0;
    }
  }
  if (!done) { failures++; return; }
  results.push({ ttft: ttft ?? performance.now() - t0, total: performance.now() - t0, tokens });
}

async function client() {
  for (;;) {
    const i = next++;
    if (i >= total) return;
    try { await one(i); } catch { failures++; }
  }
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] : NaN;
};

const t0 = performance.now();
await Promise.all(Array.from({ length: concurrency }, client));
const wall = (performance.now() - t0) / 1000;
const gen = results.reduce((a, r) => a + r.tokens, 0);
const out = {
  concurrency, requests: total, ok: results.length, failed: failures, max_tokens: maxTokens,
  wall_s: +wall.toFixed(2),
  requests_per_s: +(results.length / wall).toFixed(2),
  generated_tok_per_s: +(gen / wall).toFixed(1),
  ttft_ms: { p50: +pct(results.map((r) => r.ttft), 50).toFixed(0), p99: +pct(results.map((r) => r.ttft), 99).toFixed(0) },
  total_ms: { p50: +pct(results.map((r) => r.total), 50).toFixed(0), p99: +pct(results.map((r) => r.total), 99).toFixed(0) },
};
if (args.json) {
  console.log(JSON.stringify(out));
} else {
  console.log(`${out.ok}/${total} requests ok (${failures} failed), ${concurrency} concurrent streams, ${maxTokens} tokens each, ${out.wall_s} s`);
  console.log(`throughput: ${out.requests_per_s} requests/s, ${out.generated_tok_per_s} generated tok/s`);
  console.log(`time to first token: p50 ${out.ttft_ms.p50} ms, p99 ${out.ttft_ms.p99} ms`);
  console.log(`total latency:       p50 ${out.total_ms.p50} ms, p99 ${out.total_ms.p99} ms`);
}
process.exit(failures > 0 ? 1 : 0);
