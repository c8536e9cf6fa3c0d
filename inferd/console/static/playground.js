// The playground: calls the endpoint's own URL from this tab with its access
// token (kept in session storage, never sent to the console), streams chat
// completions, generates an image, embeds texts or ranks documents, and shows
// the time, throughput and cost.
import { tokenKey } from "./console.js";

const root = document.getElementById("playground");
const tokenInput = document.getElementById("pg-token");
const stat = (id) => root.querySelector(`[data-testid=${id}]`);
const errorBox = document.getElementById("pg-error");

function money(value) {
  if (!Number.isFinite(value)) return "-";
  const digits = value >= 0.01 ? 2 : 6;
  return `${value.toFixed(digits)} ${root.dataset.currency}`;
}

function showError(message) {
  errorBox.textContent = message;
  errorBox.hidden = false;
}

function headers() {
  return { "Authorization": `Bearer ${tokenInput.value.trim()}`, "Content-Type": "application/json" };
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body.error && body.error.message) message = `${response.status}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return message;
}

// Cost of one request: the recommender's estimate per output unit, and the
// replica time it held (its upper bound when nothing else shared the replica).
function costText(units, perUnit, seconds) {
  const hourly = Number(root.dataset.hourly);
  const parts = [];
  if (perUnit !== "" && Number.isFinite(Number(perUnit))) parts.push(`≈ ${money(units * Number(perUnit))} at the estimated rate`);
  parts.push(`≤ ${money(seconds / 3600 * hourly)} of replica time`);
  return parts.join("; ");
}

// Server-sent events from a fetch body: yields each `data:` payload.
async function* sseData(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data:")) yield line.slice(5).trim();
      }
    }
  }
}

async function chat(form) {
  const output = document.getElementById("pg-output");
  output.textContent = "";
  const data = new FormData(form);
  const messages = [];
  if (data.get("system")) messages.push({ role: "system", content: data.get("system") });
  messages.push({ role: "user", content: data.get("message") });
  const started = performance.now();
  const response = await fetch(`${root.dataset.url}/${root.dataset.compat}/v1/chat/completions`, {
    method: "POST",
    headers: headers(),
    body: JSON.stringify({
      // The base model, or the LoRA adapter picked in the form.
      model: data.get("model") || root.dataset.model,
      messages,
      temperature: Number(data.get("temperature")),
      max_tokens: Number(data.get("max_tokens")),
      stream: true,
      stream_options: { include_usage: true },
    }),
  });
  if (!response.ok) return showError(await failure(response));
  let first = null;
  let pieces = 0;
  let usage = null;
  for await (const payload of sseData(response)) {
    if (payload === "[DONE]") break;
    const chunk = JSON.parse(payload);
    if (chunk.error) return showError(chunk.error.message);
    if (chunk.usage) usage = chunk.usage;
    const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
    if (delta && delta.content) {
      if (first === null) {
        first = performance.now();
        stat("pg-ttft").textContent = `${((first - started) / 1000).toFixed(3)} s`;
      }
      pieces += 1;
      output.textContent += delta.content;
    }
  }
  const ended = performance.now();
  const tokens = usage ? usage.completion_tokens : pieces;
  const decodeSeconds = first === null ? 0 : (ended - first) / 1000;
  stat("pg-rate").textContent = decodeSeconds > 0 ? `${(tokens / decodeSeconds).toFixed(1)} tokens/s (${tokens} tokens)` : `${tokens} tokens`;
  stat("pg-cost").textContent = costText(tokens / 1e6, root.dataset.perMillion, (ended - started) / 1000);
}

async function image(form) {
  const result = document.getElementById("pg-result");
  result.replaceChildren();
  const data = new FormData(form);
  const body = { model: root.dataset.model, prompt: data.get("prompt"), size: data.get("size"), n: 1, response_format: "b64_json" };
  if (data.get("steps")) body.num_inference_steps = Number(data.get("steps"));
  if (data.get("seed") !== "") body.seed = Number(data.get("seed"));
  const started = performance.now();
  const response = await fetch(`${root.dataset.url}/v1/images/generations`, {
    method: "POST", headers: headers(), body: JSON.stringify(body),
  });
  if (!response.ok) return showError(await failure(response));
  const json = await response.json();
  const seconds = (performance.now() - started) / 1000;
  for (const item of json.data) {
    const img = document.createElement("img");
    img.alt = data.get("prompt");
    img.dataset.testid = "pg-image";
    img.src = `data:image/png;base64,${item.b64_json}`;
    result.append(img);
  }
  stat("pg-ttft").textContent = `${seconds.toFixed(3)} s`;
  stat("pg-rate").textContent = `${(json.data.length / seconds).toFixed(3)} images/s`;
  stat("pg-cost").textContent = costText(json.data.length, root.dataset.perImage, seconds);
}

function lines(text) {
  return text.split("\n").map((line) => line.trim()).filter((line) => line);
}

// A pooling request (embeddings, rerank): one answer, timed whole; its input
// tokens are what an embedding or rerank API bills.
async function pooled(path, body, show) {
  const output = document.getElementById("pg-output");
  output.textContent = "";
  const started = performance.now();
  const response = await fetch(`${root.dataset.url}${path}`, {
    method: "POST", headers: headers(), body: JSON.stringify({ model: root.dataset.model, ...body }),
  });
  if (!response.ok) return showError(await failure(response));
  const json = await response.json();
  const seconds = (performance.now() - started) / 1000;
  output.textContent = show(json);
  const tokens = json.usage ? (json.usage.prompt_tokens || json.usage.total_tokens || 0) : 0;
  stat("pg-ttft").textContent = `${seconds.toFixed(3)} s`;
  stat("pg-rate").textContent = `${(tokens / seconds).toFixed(1)} input tokens/s (${tokens} tokens)`;
  stat("pg-cost").textContent = costText(tokens / 1e6, root.dataset.perMillion, seconds);
}

async function embed(form) {
  const texts = lines(new FormData(form).get("texts"));
  await pooled(`/${root.dataset.compat}/v1/embeddings`, { input: texts, encoding_format: "float" }, (json) =>
    json.data.map((item, i) => {
      const head = item.embedding.slice(0, 6).map((x) => x.toFixed(4)).join(", ");
      return `${texts[i]}\n  ${item.embedding.length} dimensions: [${head}, …]`;
    }).join("\n"));
}

async function rerank(form) {
  const data = new FormData(form);
  const documents = lines(data.get("documents"));
  await pooled("/v1/rerank", { query: data.get("query"), documents }, (json) =>
    json.results.map((r) => `${r.relevance_score.toFixed(4)}  ${documents[r.index]}`).join("\n"));
}

tokenInput.value = sessionStorage.getItem(tokenKey(root.dataset.endpoint)) || "";
tokenInput.addEventListener("change", () => {
  sessionStorage.setItem(tokenKey(root.dataset.endpoint), tokenInput.value.trim());
});

for (const [id, run] of [["pg-chat", chat], ["pg-image", image], ["pg-embed", embed], ["pg-rerank", rerank]]) {
  const form = document.getElementById(id);
  if (!form) continue;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    errorBox.hidden = true;
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      await run(form);
    } catch (error) {
      showError(String(error));
    } finally {
      button.disabled = false;
    }
  });
}
