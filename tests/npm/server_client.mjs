// Drives a running `mlaserve serve` with the official `openai` npm client, as a user's program
// would, and prints one JSON object of what it saw (the C++ e2e test asserts on it).
// Usage: node server_client.mjs BASE_URL MODEL API_KEY MODE [N]   (MODE: basic | leak [N requests, default 200])
import OpenAI from "openai";

const [baseURL, model, apiKey, mode, size] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });

async function basic() {
  const out = {};
  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);

  const c = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 8, temperature: 0 });
  out.completion = { text: c.choices[0].text, finish_reason: c.choices[0].finish_reason, usage: c.usage, object: c.object };

  let streamed = "", chunks = 0, usage = null, finish = null;
  const cs = await client.completions.create({
    model, prompt: "Once upon a time", max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  for await (const ch of cs) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    for (const choice of ch.choices) {
      streamed += choice.text;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  out.completion_stream = { text: streamed, chunks, usage, finish_reason: finish };

  const lp = await client.completions.create({ model, prompt: "The cat", max_tokens: 3, temperature: 0, logprobs: 2 });
  out.completion_logprobs = lp.choices[0].logprobs;

  const messages = [{ role: "system", content: "You are helpful." }, { role: "user", content: "Tell me a story." }];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, seed: 7 });
  out.chat = { message: chat.choices[0].message, finish_reason: chat.choices[0].finish_reason, usage: chat.usage, object: chat.object };

  let content = "", role = null, cfinish = null, cusage = null;
  const st = await client.chat.completions.create({
    model, messages, max_tokens: 8, temperature: 0, seed: 7, stream: true, stream_options: { include_usage: true },
  });
  for await (const ch of st) {
    if (ch.usage) cusage = ch.usage;
    for (const choice of ch.choices) {
      if (choice.delta.role) role = choice.delta.role;
      if (choice.delta.content) content += choice.delta.content;
      if (choice.finish_reason) cfinish = choice.finish_reason;
    }
  }
  out.chat_stream = { content, role, finish_reason: cfinish, usage: cusage };

  const tools = [{
    type: "function",
    function: { name: "get_weather", description: "Weather of a city",
                parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
  }];
  const tc = await client.chat.completions.create({ model, messages, tools, max_tokens: 6, temperature: 0 });
  out.chat_tools = { message: tc.choices[0].message, finish_reason: tc.choices[0].finish_reason };
  let tcontent = "", tfinish = null;
  const tst = await client.chat.completions.create({ model, messages, tools, max_tokens: 6, temperature: 0, stream: true });
  for await (const ch of tst) for (const choice of ch.choices) {
    if (choice.delta.content) tcontent += choice.delta.content;
    if (choice.finish_reason) tfinish = choice.finish_reason;
  }
  out.chat_tools_stream = { content: tcontent, finish_reason: tfinish };

  const clp = await client.chat.completions.create({ model, messages, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2 });
  out.chat_logprobs = clp.choices[0].logprobs;

  try {
    await client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 1 });
    out.unknown_model = "accepted";
  } catch (e) {
    out.unknown_model = { status: e.status, code: e.code, type: e.type };
  }
  try {
    await client.completions.create({ model, prompt: "x", max_tokens: 1, temperature: -1 });
    out.bad_temperature = "accepted";
  } catch (e) {
    out.bad_temperature = { status: e.status, param: e.param };
  }
  return out;
}

// N requests at a fixed concurrency; every third one is cancelled after its first chunk.
async function leak(total = 200, concurrency = 16) {
  let next = 0, ok = 0, cancelled = 0, failed = 0;
  const errors = [];
  async function one(i) {
    const cancel = i % 3 === 0;
    const ac = new AbortController();
    try {
      const st = await client.completions.create(
        { model, prompt: `Story ${i}: once`, max_tokens: cancel ? 400 : 6, temperature: 0.8, seed: i, stream: true,
          ignore_eos: true },
        { signal: ac.signal });
      for await (const _ of st) {
        if (cancel) { ac.abort(); break; }
      }
      if (cancel) cancelled++; else ok++;
    } catch (e) {
      if (cancel && (e.name === "AbortError" || e.constructor?.name === "APIUserAbortError")) cancelled++;
      else { failed++; if (errors.length < 5) errors.push(String(e)); }
    }
  }
  async function worker() {
    while (next < total) await one(next++);
  }
  await Promise.all(Array.from({ length: concurrency }, worker));
  return { ok, cancelled, failed, errors };
}

const run = mode === "leak" ? () => leak(size ? Number(size) : 200) : basic;
run().then((r) => { console.log(JSON.stringify(r)); }, (e) => { console.log(JSON.stringify({ fatal: String(e), stack: e.stack })); process.exit(1); });
