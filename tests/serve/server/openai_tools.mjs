// Tool calls and reasoning through the official OpenAI Node client, against `moesh serve
// --test-hooks` on a model whose GGUF carries Qwen3's real chat template (tools, <think>).
// Random weights never write a tool call, so each request's output starts with a scripted text
// (moesh_scripted_output, tokenized and forced token by token; the model runs every step).
// Usage: node openai_tools.mjs BASE_URL   (BASE_URL ends in /v1)
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "not-needed", maxRetries: 0 });
let checks = 0;
const ok = (what) => { checks++; console.log(`ok - [tools] openai: ${what}`); };

const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" }, unit: { type: "string" } }, required: ["city"] },
  },
}];
const user = { role: "user", content: "What is the weather in Paris?" };
const CALL = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"°C\"}}\n</tool_call>";
const SCRIPT = "<think>\nThe user wants the weather in Paris.\n</think>\n\n" + CALL + "<|im_end|>";
const req = { model: "qwen3", messages: [user], tools, max_tokens: 200, temperature: 0, moesh_scripted_output: SCRIPT };

// Non-streaming: tool_calls with a JSON-string arguments, reasoning apart, content null.
const r = await client.chat.completions.create(req);
const m = r.choices[0].message;
assert.equal(r.choices[0].finish_reason, "tool_calls");
assert.equal(m.role, "assistant");
assert.equal(m.content, null);
assert.equal(m.reasoning_content, "The user wants the weather in Paris.");
assert.equal(m.tool_calls.length, 1);
const call = m.tool_calls[0];
assert.equal(call.type, "function");
assert.match(call.id, /^call_/);
assert.equal(call.function.name, "get_weather");
assert.equal(typeof call.function.arguments, "string");
assert.deepEqual(JSON.parse(call.function.arguments), { city: "Paris", unit: "°C" });
ok("non-streaming: tool_calls, reasoning_content, content null, finish_reason tool_calls");

// Streaming, assembled by hand from the deltas...
let reasoning = "", content = "", finish = null;
const acc = [];
for await (const chunk of await client.chat.completions.create({ ...req, stream: true })) {
  const c = chunk.choices[0];
  if (!c) continue;
  if (c.delta.reasoning_content) reasoning += c.delta.reasoning_content;
  if (c.delta.content) content += c.delta.content;
  for (const tc of c.delta.tool_calls ?? []) {
    acc[tc.index] ??= { id: "", name: "", arguments: "" };
    if (tc.id) acc[tc.index].id = tc.id;
    if (tc.function?.name) acc[tc.index].name += tc.function.name;
    if (tc.function?.arguments) acc[tc.index].arguments += tc.function.arguments;
  }
  if (c.finish_reason) finish = c.finish_reason;
}
assert.equal(finish, "tool_calls");
assert.equal(reasoning, m.reasoning_content);
assert.equal(content, "");
assert.equal(acc.length, 1);
assert.equal(acc[0].name, "get_weather");
assert.equal(acc[0].arguments, call.function.arguments);
ok("streaming: deltas assemble to the same call and reasoning");

// ...and by the client's own stream helper.
const helper = client.chat.completions.stream({ ...req, stream: true });
const fin = await helper.finalChatCompletion();
assert.equal(fin.choices[0].finish_reason, "tool_calls");
assert.equal(fin.choices[0].message.tool_calls[0].function.name, "get_weather");
assert.deepEqual(JSON.parse(fin.choices[0].message.tool_calls[0].function.arguments), { city: "Paris", unit: "°C" });
ok("streaming: the client's stream helper assembles the call");

// The follow-up turn: the assistant's tool call and the tool's result go back through the template.
const toolMsg = (text) => ({ role: "tool", tool_call_id: call.id, content: text });
const follow = (text, extra = {}) => client.chat.completions.create({
  model: "qwen3", tools, max_tokens: 50, temperature: 0,
  messages: [user, { role: "assistant", content: null, tool_calls: m.tool_calls }, toolMsg(text)],
  moesh_scripted_output: "It is 21 °C and sunny in Paris.<|im_end|>", ...extra,
});
const f1 = await follow("{\"temperature\": 21, \"sky\": \"sunny\"}");
assert.equal(f1.choices[0].finish_reason, "stop");
assert.equal(f1.choices[0].message.content, "It is 21 °C and sunny in Paris.");
assert.equal(f1.choices[0].message.tool_calls, undefined);
const f2 = await follow("{\"temperature\": 21, \"sky\": \"sunny\", \"wind\": \"strong from the north west\"}");
assert.ok(f2.usage.prompt_tokens > f1.usage.prompt_tokens, "the tool result is in the prompt");
assert.ok(f1.usage.prompt_tokens > r.usage.prompt_tokens + 20, "the call and its result are in the prompt");
ok(`role: tool follow-up renders (${r.usage.prompt_tokens} -> ${f1.usage.prompt_tokens} prompt tokens)`);

// tool_choice "none": no tools shown, nothing parsed; the call text stays content.
const n = await client.chat.completions.create({ ...req, tool_choice: "none", moesh_scripted_output: CALL + "<|im_end|>" });
assert.equal(n.choices[0].finish_reason, "stop");
assert.equal(n.choices[0].message.content, CALL);
assert.equal(n.choices[0].message.tool_calls, undefined);
assert.ok(n.usage.prompt_tokens < r.usage.prompt_tokens, "no tools in the prompt");
ok("tool_choice none: the call text is content");

// A malformed call comes back as content, never an error.
const bad = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {oops}\n</tool_call>";
const b = await client.chat.completions.create({ ...req, moesh_scripted_output: bad + "<|im_end|>" });
assert.equal(b.choices[0].finish_reason, "stop");
assert.equal(b.choices[0].message.content, bad);
ok("malformed call: returned as content");

// tool_choice "required" / a named function: constrained decoding forces a call. No script: the
// random weights write whatever the mask leaves them, and it must still be a call to a given tool
// with arguments matching its schema (thinking off, so the answer starts with the call).
const forced = [
  { type: "function", function: { name: "get_weather", parameters: { type: "object", properties: {
    city: { type: "string", maxLength: 10 }, unit: { enum: ["C", "F"] } }, required: ["city", "unit"] } } },
  { type: "function", function: { name: "get_time", parameters: { type: "object", properties: {
    tz: { enum: ["UTC", "CET", "JST"] } }, required: ["tz"], additionalProperties: false } } },
];
const argsOk = (name, a) => name === "get_weather"
  ? typeof a.city === "string" && [...a.city].length <= 10 && ["C", "F"].includes(a.unit) &&
    Object.keys(a).every((k) => k === "city" || k === "unit")
  : Object.keys(a).length === 1 && ["UTC", "CET", "JST"].includes(a.tz);
// One call per answer (parallel_tool_calls false) is bounded — a 10-character city, enums, at most
// llama.cpp's whitespace between JSON tokens — so it always ends inside max_tokens; with parallel
// calls random weights may keep calling until max_tokens.
const base = { model: "qwen3", messages: [user], tools: forced, max_tokens: 600, temperature: 1.0,
               chat_template_kwargs: { enable_thinking: false }, parallel_tool_calls: false };
let calls = 0, names = new Set();
for (let seed = 1; seed <= 6; seed++) {
  const f = await client.chat.completions.create({ ...base, tool_choice: "required", seed });
  const c = f.choices[0];
  assert.equal(c.finish_reason, "tool_calls", `seed ${seed}: ${JSON.stringify(c.message)}`);
  assert.equal(c.message.content, null);
  for (const tc of c.message.tool_calls) {
    names.add(tc.function.name);
    assert.ok(argsOk(tc.function.name, JSON.parse(tc.function.arguments)), `seed ${seed}: ${tc.function.arguments}`);
    calls++;
  }
}
assert.equal(calls, 6);
ok(`tool_choice required (random weights, 6 seeds): ${calls} calls to ${[...names].join(", ")}, every one matching its schema`);
for (let seed = 1; seed <= 3; seed++) {
  const f = await client.chat.completions.create({
    ...base, seed, tool_choice: { type: "function", function: { name: "get_time" } } });
  assert.equal(f.choices[0].finish_reason, "tool_calls");
  assert.equal(f.choices[0].message.tool_calls.length, 1);
  assert.equal(f.choices[0].message.tool_calls[0].function.name, "get_time");
  assert.ok(argsOk("get_time", JSON.parse(f.choices[0].message.tool_calls[0].function.arguments)));
}
ok("named tool_choice: exactly that function, arguments in its enum");
{
  let streamedArgs = "", streamedName = "", finish = null;
  for await (const c of await client.chat.completions.create({ ...base, seed: 4, tool_choice: "required",
                                                                stream: true })) {
    for (const tc of c.choices[0]?.delta?.tool_calls ?? []) {
      assert.equal(tc.index, 0, "parallel_tool_calls false: one call");
      streamedName += tc.function?.name ?? "";
      streamedArgs += tc.function?.arguments ?? "";
    }
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, "tool_calls");
  assert.ok(argsOk(streamedName, JSON.parse(streamedArgs)), streamedArgs);
  ok(`streamed forced call with parallel_tool_calls false: one call to ${streamedName}`);
}
{
  // Parallel calls allowed: whatever ended is calls only, each valid.
  const p = await client.chat.completions.create({ ...base, seed: 9, tool_choice: "required", parallel_tool_calls: true });
  const c = p.choices[0];
  if (c.finish_reason === "tool_calls") {
    for (const tc of c.message.tool_calls) assert.ok(argsOk(tc.function.name, JSON.parse(tc.function.arguments)));
    assert.equal(c.message.content, null);
  } else {
    assert.equal(c.finish_reason, "length");
  }
  ok(`parallel forced calls: ${c.finish_reason === "tool_calls" ? c.message.tool_calls.length + " valid calls" : "cut by max_tokens"}`);
}

// Bad tool definitions are 400s naming the field.
await assert.rejects(client.chat.completions.create({ ...req, tools: [{ type: "function", function: { name: "no spaces" } }] }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === "tools[0].function.name");
await assert.rejects(client.chat.completions.create({ ...req, tool_choice: { type: "function", function: { name: "nope" } } }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === "tool_choice");
ok("bad tools / tool_choice: 400 naming the field");
console.log(`[tools] openai client: ${checks} checks passed`);
