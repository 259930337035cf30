// Drives `moesh serve` with the official OpenAI Node client (pinned in package-lock.json).
// Usage: node openai_client.mjs BASE_URL CONFIG_NAME   (BASE_URL ends in /v1)
// Exits non-zero with a message on the first failed check. No timed assertions.
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, cfg] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "not-needed", maxRetries: 0 });
let checks = 0;
const ok = (what) => { checks++; console.log(`ok - [${cfg}] openai: ${what}`); };

const chatReq = {
  model: "tiny.gguf",
  messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "Name three colors." }],
  max_tokens: 24,
  temperature: 0,
  ignore_eos: true,
};

// Non-streaming chat.
const chat = await client.chat.completions.create(chatReq);
assert.equal(chat.object, "chat.completion");
assert.equal(chat.choices.length, 1);
assert.equal(chat.choices[0].message.role, "assistant");
assert.equal(chat.choices[0].finish_reason, "length");
assert.equal(chat.usage.completion_tokens, 24);
assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + 24);
assert.ok(chat.usage.prompt_tokens > 10, "ChatML prompt has its template tokens");
assert.ok(chat.choices[0].message.content.length > 0);
ok("non-streaming chat: shape, finish_reason length, usage");

// Streaming chat with usage: the client's own SSE parser must accept our events.
const stream = await client.chat.completions.create({ ...chatReq, stream: true, stream_options: { include_usage: true } });
let text = "";
let role = null;
let finish = null;
let usage = null;
let nChunks = 0;
for await (const chunk of stream) {
  nChunks++;
  if (chunk.usage) usage = chunk.usage;
  const c = chunk.choices[0];
  if (!c) continue;
  if (c.delta.role) role = c.delta.role;
  if (c.delta.content) text += c.delta.content;
  if (c.finish_reason) finish = c.finish_reason;
}
assert.equal(role, "assistant");
assert.equal(finish, "length");
assert.equal(text, chat.choices[0].message.content, "streamed text equals the non-streamed text");
assert.equal(usage.completion_tokens, 24);
assert.ok(nChunks >= 5);
ok(`streaming chat: ${nChunks} chunks, same text, usage chunk`);

// Completions, non-streaming and streaming.
const compReq = { model: "tiny.gguf", prompt: "The quick brown fox", max_tokens: 12, temperature: 0, ignore_eos: true };
const comp = await client.completions.create(compReq);
assert.equal(comp.object, "text_completion");
assert.equal(comp.choices[0].finish_reason, "length");
assert.equal(comp.usage.completion_tokens, 12);
let ctext = "";
for await (const chunk of await client.completions.create({ ...compReq, stream: true })) {
  ctext += chunk.choices[0]?.text ?? "";
}
assert.equal(ctext, comp.choices[0].text);
ok("completions: streaming equals non-streaming");

// Concurrent greedy requests equal the same requests run alone.
const prompts = ["The quick brown fox", "Once upon a time", "In the beginning", "Hello, world",
                 "Numbers: 1 2 3", "A B C D", "Dear diary,", "Q: why? A:"];
const one = (p) => client.completions.create({ prompt: p, max_tokens: 16, temperature: 0, ignore_eos: true, model: "x" })
  .then((r) => r.choices[0].text);
const alone = [];
for (const p of prompts) alone.push(await one(p));
const together = await Promise.all(prompts.map(one));
assert.deepEqual(together, alone);
assert.ok(new Set(alone).size >= 4, "outputs are not degenerate");
ok(`${prompts.length} concurrent requests equal their runs alone`);

// Concurrent streams too (each holds a server thread while it runs).
const streamed = await Promise.all(prompts.map(async (p) => {
  let t = "";
  for await (const ch of await client.completions.create({ prompt: p, max_tokens: 16, temperature: 0, ignore_eos: true, model: "x", stream: true })) {
    t += ch.choices[0]?.text ?? "";
  }
  return t;
}));
assert.deepEqual(streamed, alone);
ok("concurrent streams equal the runs alone");

// Seeds.
const seeded = (seed) => client.chat.completions.create({ ...chatReq, temperature: 1.0, seed })
  .then((r) => r.choices[0].message.content);
const a1 = await seeded(11);
const a2 = await seeded(11);
const b1 = await seeded(12);
assert.equal(a1, a2);
assert.notEqual(a1, b1);
ok("seeded sampling reproducible, another seed differs");

// Stop string through the client.
const full = comp.choices[0].text;
const stopStr = (full.slice(3).match(/[\x21-\x7e][\x20-\x7e]{2}/) ?? [""])[0];
assert.equal(stopStr.length, 3, `no ASCII window for a stop test in ${JSON.stringify(full)}`);
const stopped = await client.completions.create({ ...compReq, stop: [stopStr] });
assert.equal(stopped.choices[0].text, full.slice(0, full.indexOf(stopStr)));
assert.equal(stopped.choices[0].finish_reason, "stop");
ok("stop string");

// Errors surface as the client's typed errors with our OpenAI error body.
for (const [body, param] of [[{ ...compReq, n: 17 }, "n"], [{ ...compReq, max_tokens: "7" }, "max_tokens"],
                            [{ ...compReq, max_tokens: 1000000 }, "max_tokens"]]) {
  await assert.rejects(client.completions.create(body), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, `expected BadRequestError, got ${e}`);
    assert.equal(e.status, 400);
    assert.equal(e.param, param);
    assert.equal(e.type, "invalid_request_error");
    return true;
  });
}
await assert.rejects(client.get("/nothing-here"), (e) => e instanceof OpenAI.NotFoundError);
ok("400s as BadRequestError with param, 404 as NotFoundError");

const models = await client.models.list();
assert.equal(models.data.length, 1);
ok(`models.list: ${models.data[0].id}`);
console.log(`[${cfg}] openai client: ${checks} checks passed`);
