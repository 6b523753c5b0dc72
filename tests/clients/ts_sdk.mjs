// The TypeScript SDK through the proxy: create, stream helper, raw stream, count_tokens.
// Run: node ts_sdk.mjs <node_modules dir>  with PROXY_URL set. Prints one JSON line of results.
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.argv[2], "noop.js"));
const Anthropic = require("@anthropic-ai/sdk").default ?? require("@anthropic-ai/sdk");
const client = new Anthropic({ baseURL: process.env.PROXY_URL, apiKey: "sk-ts-test", maxRetries: 0, timeout: 20_000 });
const model = "claude-sonnet-4-6";
const system = [{ type: "text", text: "You are a careful agent. ".repeat(300), cache_control: { type: "ephemeral" } }];
const headers = { "x-cachecompact-session": "ts-sdk" };
const out = {};

const msgs = [{ role: "user", content: "hello from typescript" }];
const a = await client.messages.create({ model, max_tokens: 20, system, messages: msgs }, { headers });
out.create = a.content[0].text;
msgs.push({ role: "assistant", content: a.content[0].text }, { role: "user", content: "again" });

const s = client.messages.stream({ model, max_tokens: 20, system, messages: msgs }, { headers });
let deltas = 0;
s.on("text", () => { deltas += 1; });
const fin = await s.finalMessage();
out.stream = { text: fin.content[0].text, deltas, read: fin.usage.cache_read_input_tokens };
msgs.push({ role: "assistant", content: fin.content[0].text }, { role: "user", content: "raw" });

const raw = await client.messages.create({ model, max_tokens: 20, system, messages: msgs, stream: true }, { headers });
const kinds = [];
for await (const ev of raw) kinds.push(ev.type);
out.raw = kinds;

const n = await client.messages.countTokens({ model, messages: msgs });
out.count = n.input_tokens;
console.log(JSON.stringify(out));
