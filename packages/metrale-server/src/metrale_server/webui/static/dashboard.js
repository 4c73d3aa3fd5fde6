// The dashboard: /metrics polled once a second into rolling charts, /memory as bars of bytes
// by owner (plan vs ledger), /v1/requests/recent (ids and counts), and /v1/server's boot
// facts. Polling pauses while the tab is hidden, so an open dashboard costs the server nothing
// when nobody looks at it.

import { LineChart } from "./charts.js";
import { apiJson, apiFetch, el, errorMessage, formatBytes, formatNumber, formatSeconds } from "./common.js";

const POLL_MS = 1000;
const MEMORY_POLL_MS = 5000;
// TTFT and TPOT quantiles over the requests finished in this many seconds.
const LATENCY_WINDOW_S = 10;
const $ = (id) => document.getElementById(id);

const charts = {
  throughput: new LineChart($("chart-throughput"), {
    title: "Output tokens / s",
    series: [{ name: "tok/s" }],
  }),
  requests: new LineChart($("chart-requests"), {
    title: "Requests",
    series: [{ name: "running" }, { name: "waiting" }],
    minMax: 4,
    format: (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1)),
  }),
  kv: new LineChart($("chart-kv"), {
    title: "KV cache in use",
    series: [{ name: "KV" }],
    fixedMax: 100,
    format: (v) => `${v.toFixed(0)}%`,
  }),
  latency: new LineChart($("chart-latency"), {
    title: `Latency (requests of the last ${LATENCY_WINDOW_S} s)`,
    series: [{ name: "TTFT p50" }, { name: "TTFT p99" }, { name: "TPOT p50" }, { name: "TPOT p99" }],
    format: (v) => formatSeconds(v),
  }),
};

// ---- Prometheus text -----------------------------------------------------------------------

export function parsePrometheus(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    for (const label of (match[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[label[1]] = label[2];
    samples.push({ name: match[1], labels, value: Number(match[4]) });
  }
  return samples;
}

function sum(samples, name) {
  return samples.filter((s) => s.name === name).reduce((total, s) => total + s.value, 0);
}

function buckets(samples, name) {
  const byBound = new Map();
  for (const s of samples) {
    if (s.name !== `${name}_bucket`) continue;
    const bound = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
    byBound.set(bound, (byBound.get(bound) || 0) + s.value);
  }
  return [...byBound.entries()].sort((a, b) => a[0] - b[0]);
}

// Prometheus's histogram_quantile: linear within the bucket the rank falls in.
export function quantile(q, cumulative) {
  if (!cumulative.length) return null;
  const total = cumulative.at(-1)[1];
  if (!(total > 0)) return null;
  const rank = q * total;
  let lowerBound = 0;
  let lowerCount = 0;
  for (const [bound, count] of cumulative) {
    if (count >= rank) {
      if (bound === Infinity) return lowerBound;
      if (count === lowerCount) return bound;
      return lowerBound + ((bound - lowerBound) * (rank - lowerCount)) / (count - lowerCount);
    }
    lowerBound = bound;
    lowerCount = count;
  }
  return lowerBound;
}

function difference(now, before) {
  const old = new Map(before || []);
  return now.map(([bound, count]) => [bound, count - (old.get(bound) || 0)]);
}

// ---- polling -------------------------------------------------------------------------------

const history = []; // { t, tokens, ttft, tpot }

function setStatus(text, kind) {
  const status = $("status");
  status.textContent = text;
  status.dataset.state = kind;
}

async function pollMetrics() {
  const response = await apiFetch("metrics");
  if (!response.ok) throw new Error(await errorMessage(response));
  const samples = parsePrometheus(await response.text());
  const now = { t: performance.now() / 1000 };
  now.tokens = sum(samples, "metrale_generation_tokens_total");
  now.ttft = buckets(samples, "metrale_time_to_first_token_seconds");
  now.tpot = buckets(samples, "metrale_time_per_output_token_seconds");
  const previous = history.at(-1);
  history.push(now);
  while (history.length > 1 && now.t - history[0].t > LATENCY_WINDOW_S + 0.5) history.shift();

  const dt = previous ? now.t - previous.t : null;
  charts.throughput.push([dt ? Math.max(0, now.tokens - previous.tokens) / dt : null]);
  charts.requests.push([sum(samples, "metrale_num_requests_running"), sum(samples, "metrale_num_requests_waiting")]);
  charts.kv.push([100 * sum(samples, "metrale_kv_cache_usage_perc")]);
  const oldest = history[0] === now ? null : history[0];
  const ttft = difference(now.ttft, oldest?.ttft);
  const tpot = difference(now.tpot, oldest?.tpot);
  charts.latency.push([quantile(0.5, ttft), quantile(0.99, ttft), quantile(0.5, tpot), quantile(0.99, tpot)]);
}

async function pollRecent() {
  const recent = await apiJson("v1/requests/recent");
  const rows = (recent.data || []).slice(0, 12).map((r) =>
    el(
      "tr",
      {},
      el("td", {}, el("code", { text: r.request_id, title: r.request_id })),
      el("td", { class: "number", text: String(r.num_prompt_tokens) }),
      el("td", { class: "number", text: String(r.num_completion_tokens) }),
      el("td", { class: "number", text: formatSeconds(r.latency_s) }),
      el("td", { class: "number", text: r.latency_s > 0 ? formatNumber(r.num_completion_tokens / r.latency_s) : "–" }),
      el("td", { text: r.finish_reason }),
      el("td", { text: new Date(r.finished_at * 1000).toLocaleTimeString() }),
    ),
  );
  const body = $("recent").tBodies[0];
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 7, class: "muted", text: "No request has finished yet." })));
  body.replaceChildren(...rows);
}

const FACTS = [
  ["model", "model"],
  ["task", "task"],
  ["format", (s) => [s.dtype, s.quantization].filter((v) => v && v !== "None" && v !== "none").join(" · ")],
  ["kernels", "kernels"],
  ["device", "device"],
  ["compile state", "layer_steps"],
  ["context", (s) => `${s.max_seq_len} tokens`],
  ["KV cache", (s) => `${s.num_kv_blocks} blocks × ${s.block_size} tokens`],
  ["batch", (s) => `${s.max_batch_size} sequences, ${s.max_batch_tokens} tokens`],
  ["prefix cache", (s) => (s.is_prefix_caching ? "on" : "off")],
  ["structured outputs", "structured_outputs"],
  ["parsers", (s) => [s.tool_call_parser && `tools: ${s.tool_call_parser}`, s.reasoning_parser && `reasoning: ${s.reasoning_parser}`].filter(Boolean).join(", ") || "none"],
  ["uptime", (s) => formatSeconds(s.uptime_s)],
  ["in flight", (s) => String(s.num_active_requests)],
];

async function pollServer() {
  const info = await apiJson("v1/server");
  $("facts").replaceChildren(
    ...FACTS.map(([label, read]) => {
      const value = typeof read === "string" ? info[read] : read(info);
      const text = value === null || value === undefined || value === "" ? "–" : String(value);
      return el("div", { class: "fact" }, el("dt", { text: label }), el("dd", { text, "data-fact": label }));
    }),
  );
  document.title = `${info.model} · Metrale dashboard`;
}

function memoryBar(label, byOwner, scale, owners) {
  const total = Object.values(byOwner).reduce((a, b) => a + b, 0);
  const bar = el("div", { class: "memory-bar", role: "img", "aria-label": `${label}: ${formatBytes(total)}` });
  for (const owner of owners) {
    const bytes = byOwner[owner] || 0;
    if (!bytes) continue;
    const segment = el("div", {
      class: `segment owner-${owners.indexOf(owner) % 8}`,
      title: `${owner}: ${formatBytes(bytes)}`,
      "data-owner": owner,
      "data-bytes": bytes,
    });
    segment.style.width = `${(100 * bytes) / scale}%`;
    bar.append(segment);
  }
  return el("div", { class: "memory-row" }, el("span", { class: "memory-label", text: label }), bar, el("span", { class: "memory-value", text: formatBytes(total) }));
}

async function pollMemory() {
  const report = await apiJson("memory");
  const plan = report.plan_by_owner || {};
  const ledger = report.ledger_by_owner || {};
  const owners = [...new Set([...Object.keys(plan), ...Object.keys(ledger)])]
    .filter((owner) => plan[owner] || ledger[owner])
    .sort((a, b) => (plan[b] || 0) - (plan[a] || 0));
  const planTotal = Object.values(plan).reduce((a, b) => a + b, 0);
  const ledgerTotal = Object.values(ledger).reduce((a, b) => a + b, 0);
  const scale = Math.max(planTotal, ledgerTotal, 1);
  $("memory-total").textContent = `(${report.device}; budget ${formatBytes(report.budget_bytes)}, the plan ${formatBytes(planTotal)} of it)`;
  $("memory").replaceChildren(
    memoryBar("plan", plan, scale, owners),
    memoryBar("ledger", ledger, scale, owners),
    el(
      "ul",
      { class: "memory-legend" },
      owners.map((owner, index) =>
        el(
          "li",
          {},
          el("span", { class: `swatch owner-${index % 8}` }),
          el("span", { text: owner }),
          el("span", { class: "muted", text: ` plan ${formatBytes(plan[owner] || 0)} · ledger ${formatBytes(ledger[owner] || 0)}` }),
        ),
      ),
    ),
  );
}

// Each poller runs on its own clock, never two of one at a time, and skips while hidden.
function every(ms, poll) {
  let timer = null;
  let isRunning = false;
  const tick = async () => {
    timer = null;
    if (document.hidden || isRunning) return;
    isRunning = true;
    try {
      await poll();
      setStatus("live", "live");
    } catch (error) {
      setStatus(`unreachable: ${error.message}`, "error");
    } finally {
      isRunning = false;
    }
    if (!document.hidden) timer = setTimeout(tick, ms);
  };
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timer === null) tick();
  });
  tick();
}

every(POLL_MS, pollMetrics);
every(POLL_MS, pollRecent);
every(POLL_MS * 5, pollServer);
every(MEMORY_POLL_MS, pollMemory);
