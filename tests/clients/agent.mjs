// Node 20's built-in fetch as an agent of Trinity's endpoint: two chat completions, one streamed,
// POST /feedback with the ids, POST /commit. Prints one JSON line; exits 1 on any failure.
//   node agent.mjs BASE_URL REWARD [--no-content-type]
// --no-content-type: no headers at all (fetch then labels a string body text/plain).
const [base, reward, flag] = process.argv.slice(2);
const headers = flag === "--no-content-type" ? {} : { "Content-Type": "application/json" };
const out = { requests_ok: 0, requests_failed: 0, msg_ids: [], failures: [] };
const fail = (what) => { out.requests_failed++; out.failures.push(what); };
const post = (path, body) => fetch(base + path, { method: "POST", headers, body: JSON.stringify(body) });

const model = (await (await fetch(base + "/v1/models")).json()).data[0].id;
for (let i = 0; i < 2; i++) {
  const r = await post("/v1/chat/completions", { model, messages: [{ role: "user", content: `node ${i}` }], max_tokens: 5 });
  const text = await r.text();
  if (r.status === 200) { out.requests_ok++; out.msg_ids.push(JSON.parse(text).id); } else fail(`chat ${r.status} ${text}`);
}
{
  const r = await post("/v1/chat/completions", { model, messages: [{ role: "user", content: "node streams" }], max_tokens: 5, stream: true });
  const events = (await r.text()).split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim());
  const ids = new Set(events.filter((e) => e !== "[DONE]").map((e) => JSON.parse(e).id));
  if (r.status === 200 && events.at(-1) === "[DONE]" && ids.size === 1) { out.requests_ok++; out.msg_ids.push([...ids][0]); }
  else fail(`stream ${r.status} ${events.join(" | ")}`);
}
for (const [path, body] of [["/feedback", { msg_ids: out.msg_ids, reward: Number(reward), task_id: "node", run_id: 0 }], ["/commit", {}]]) {
  const r = await post(path, body);
  const text = await r.text();
  if (r.status === 200) out.requests_ok++; else fail(`${path} ${r.status} ${text}`);
}
console.log(JSON.stringify(out));
process.exit(out.requests_failed ? 1 : 0);
