// logprobs / top_logprobs, n > 1 and response_format (constrained decoding) through the official
// OpenAI Node client, against `moesh serve` on a model with Qwen3's real tokenizer and template
// (make-model --vocab-from). Random weights: every check is on structure and invariants (the
// output parses and matches its schema, logprobs are consistent with the text and each other,
// n choices are n different reproducible samples), never on what the model "says".
// Usage: node openai_features.mjs BASE_URL   (BASE_URL ends in /v1)
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "not-needed", maxRetries: 0 });
let checks = 0;
const ok = (what) => { checks++; console.log(`ok - [features] openai: ${what}`); };
const user = (content) => [{ role: "user", content }];

// ---- logprobs ---------------------------------------------------------------------------------
{
  const r = await client.chat.completions.create({
    model: "m", messages: user("Say something."), max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3,
    ignore_eos: true,
  });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  let text = "";
  for (const e of lp) {
    assert.ok(e.logprob <= 0 && Number.isFinite(e.logprob));
    assert.equal(e.top_logprobs.length, 3);
    for (let i = 1; i < 3; i++) assert.ok(e.top_logprobs[i - 1].logprob >= e.top_logprobs[i].logprob);
    // Greedy: the chosen token is the most likely one.
    assert.equal(e.token, e.top_logprobs[0].token);
    assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6);
    text += Buffer.from(e.bytes).toString("latin1");
  }
  assert.equal(Buffer.from(text, "latin1").toString("utf8"), r.choices[0].message.content);
  ok(`chat logprobs: ${lp.length} tokens, bytes spell the content, greedy = top-1`);

  // Streaming: the per-chunk logprobs add up to the same list.
  const streamed = [];
  for await (const c of await client.chat.completions.create({
    model: "m", messages: user("Say something."), max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3,
    ignore_eos: true, stream: true,
  })) {
    for (const e of c.choices[0]?.logprobs?.content ?? []) streamed.push(e);
  }
  assert.deepEqual(streamed.map((e) => [e.token, e.logprob]), lp.map((e) => [e.token, e.logprob]));
  ok("streamed chat logprobs equal the non-streamed ones");

  // Sampling: the chosen token's logprob is one of the distribution's, top_logprobs 0 = none.
  const s = await client.chat.completions.create({
    model: "m", messages: user("Say something."), max_tokens: 8, temperature: 1.5, seed: 7, logprobs: true,
    top_logprobs: 0, ignore_eos: true,
  });
  for (const e of s.choices[0].logprobs.content) assert.deepEqual(e.top_logprobs, []);
  ok("top_logprobs 0: no alternatives");

  // Completions: the legacy shape.
  const c = await client.completions.create({ model: "m", prompt: "Hello", max_tokens: 6, temperature: 0, logprobs: 2,
                                              ignore_eos: true });
  const l = c.choices[0].logprobs;
  assert.equal(l.tokens.length, 6);
  assert.equal(l.token_logprobs.length, 6);
  assert.equal(l.top_logprobs.length, 6);
  assert.equal(l.tokens.join(""), c.choices[0].text);
  for (let i = 0; i < 6; i++) {
    assert.equal(Object.keys(l.top_logprobs[i]).length <= 2, true);
    assert.equal(l.text_offset[i], Buffer.byteLength(l.tokens.slice(0, i).join("")));
  }
  ok("completions logprobs: tokens spell the text, offsets, 2 alternatives");

  await assert.rejects(client.chat.completions.create({ model: "m", messages: user("x"), top_logprobs: 2 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "top_logprobs");
  await assert.rejects(client.chat.completions.create({ model: "m", messages: user("x"), logprobs: true, top_logprobs: 21 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "top_logprobs");
  ok("top_logprobs without logprobs, or above 20: 400 naming it");
}

// ---- n > 1 ------------------------------------------------------------------------------------
{
  const base = { model: "m", messages: user("Tell me a story about a dragon."), max_tokens: 10, temperature: 1.0,
                 seed: 11, ignore_eos: true };
  const r = await client.chat.completions.create({ ...base, n: 4 });
  assert.equal(r.choices.length, 4);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.equal(r.usage.completion_tokens, 40);
  const texts = r.choices.map((c) => c.message.content);
  assert.ok(new Set(texts).size >= 3, `n = 4 samples should differ: ${JSON.stringify(texts)}`);
  // Choice i is the sample seed + i would give alone.
  const alone = await client.chat.completions.create({ ...base, seed: 13 });
  assert.equal(alone.choices[0].message.content, texts[2]);
  const again = await client.chat.completions.create({ ...base, n: 4 });
  assert.deepEqual(again.choices.map((c) => c.message.content), texts);
  ok("n = 4: four different samples, choice i = seed + i alone, reproducible");

  // Streaming: chunks of every index, each assembling to the non-streamed choice.
  const acc = ["", "", "", ""], fin = [null, null, null, null];
  for await (const c of await client.chat.completions.create({ ...base, n: 4, stream: true })) {
    for (const ch of c.choices) {
      if (ch.delta?.content) acc[ch.index] += ch.delta.content;
      if (ch.finish_reason) fin[ch.index] = ch.finish_reason;
    }
  }
  assert.deepEqual(acc, texts);
  assert.deepEqual(fin, ["length", "length", "length", "length"]);
  ok("n = 4 streamed: per-index deltas equal the non-streamed choices");

  await assert.rejects(client.chat.completions.create({ ...base, n: 17 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "n");
  ok("n = 17: 400");
}

// ---- response_format ------------------------------------------------------------------------
// An independent check of what the schema says (the server's matcher is not used here).
function matches(v, s) {
  if (s.enum && !s.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) return false;
  if (s.anyOf) return s.anyOf.some((a) => matches(v, a));
  const type = s.type;
  if (type === "object") {
    if (typeof v !== "object" || v === null || Array.isArray(v)) return false;
    for (const r of s.required ?? []) if (!(r in v)) return false;
    for (const [k, x] of Object.entries(v)) {
      if (s.properties?.[k]) { if (!matches(x, s.properties[k])) return false; }
      else if (s.additionalProperties === false) return false;
    }
    return true;
  }
  if (type === "array") {
    if (!Array.isArray(v)) return false;
    if (s.minItems !== undefined && v.length < s.minItems) return false;
    if (s.maxItems !== undefined && v.length > s.maxItems) return false;
    return v.every((x) => matches(x, s.items ?? {}));
  }
  if (type === "string") {
    if (typeof v !== "string") return false;
    const n = [...v].length;
    return !(s.minLength !== undefined && n < s.minLength) && !(s.maxLength !== undefined && n > s.maxLength);
  }
  if (type === "integer" || type === "number") {
    if (typeof v !== "number" || (type === "integer" && !Number.isInteger(v))) return false;
    return !(s.minimum !== undefined && v < s.minimum) && !(s.maximum !== undefined && v > s.maximum);
  }
  if (type === "boolean") return typeof v === "boolean";
  if (type === "null") return v === null;
  return true;
}

{
  const schema = {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 8 },
      age: { type: "integer", minimum: 0, maximum: 120 },
      mood: { enum: ["happy", "sad", null] },
      tags: { type: "array", items: { type: "string", maxLength: 4 }, maxItems: 3 },
      admin: { type: "boolean" },
    },
    required: ["name", "age", "mood", "tags"],
    additionalProperties: false,
  };
  const rf = { type: "json_schema", json_schema: { name: "person", schema, strict: true } };
  let stopped = 0;
  for (let seed = 1; seed <= 12; seed++) {
    const r = await client.chat.completions.create({
      model: "m", messages: user("Describe a person as JSON."), max_tokens: 400, temperature: 1.0, seed,
      response_format: rf,
    });
    const text = r.choices[0].message.content;
    if (r.choices[0].finish_reason !== "stop") continue;
    stopped++;
    const v = JSON.parse(text);
    assert.ok(matches(v, schema), `seed ${seed}: ${text}`);
  }
  assert.ok(stopped >= 10, `most constrained generations end by themselves (${stopped}/12)`);
  ok(`json_schema: ${stopped}/12 sampled answers ended, every one parses and matches the schema`);

  // n > 1 and streaming keep the constraint.
  const many = await client.chat.completions.create({
    model: "m", messages: user("JSON please."), max_tokens: 400, temperature: 1.2, seed: 99, n: 3, response_format: rf,
  });
  for (const c of many.choices) if (c.finish_reason === "stop") assert.ok(matches(JSON.parse(c.message.content), schema));
  let streamed = "";
  for await (const c of await client.chat.completions.create({
    model: "m", messages: user("JSON please."), max_tokens: 400, temperature: 1.2, seed: 99, response_format: rf,
    stream: true,
  })) streamed += c.choices[0]?.delta?.content ?? "";
  assert.equal(streamed, many.choices[0].message.content);
  ok("json_schema with n = 3 and streamed: the same constrained outputs");

  // json_object: any object.
  const o = await client.chat.completions.create({
    model: "m", messages: user("JSON."), max_tokens: 60, temperature: 0.8, seed: 5,
    response_format: { type: "json_object" },
  });
  const ot = o.choices[0].message.content;
  assert.ok(ot.startsWith("{"), ot);
  if (o.choices[0].finish_reason === "stop") assert.equal(typeof JSON.parse(ot), "object");
  ok(`json_object: ${o.choices[0].finish_reason === "stop" ? "a complete object" : "an object prefix (length)"}`);

  // Schemas it cannot enforce are refused, naming the keyword.
  await assert.rejects(client.chat.completions.create({
    model: "m", messages: user("x"),
    response_format: { type: "json_schema", json_schema: { name: "p", schema: { type: "string", pattern: "^a+$" } } },
  }), (e) => e instanceof OpenAI.BadRequestError && e.param === "response_format.json_schema.schema" &&
    /pattern/.test(e.message));
  await assert.rejects(client.chat.completions.create({
    model: "m", messages: user("x"), response_format: { type: "xml" },
  }), (e) => e instanceof OpenAI.BadRequestError && e.param === "response_format.type");
  ok("unsupported schema keyword / response_format type: 400 naming it");
}
console.log(`[features] openai client: ${checks} checks passed`);
