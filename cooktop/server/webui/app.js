// cooktop's web chat page: the OpenAI chat API of the server it is served by, streamed (no libraries).
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];  // {role, content} of the conversation so far
let controller = null;  // AbortController of the running request

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function bubble(role) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  $("messages").appendChild(div);
  return div;
}

function addText(div, text) {
  const span = document.createElement("span");
  span.className = "content";
  span.textContent = text;
  div.appendChild(span);
  return span;
}

async function loadProps() {
  try {
    const r = await fetch("props", { headers: headers() });
    if (r.status === 401) { $("model-info").textContent = "API key required: enter it in the settings"; return; }
    if (!r.ok) { $("model-info").textContent = "model: loading (" + r.status + ")"; setTimeout(loadProps, 1000); return; }
    const p = await r.json();
    const s = p.default_generation_settings || {};
    $("model-info").textContent = `${p.model_alias} · n_ctx ${s.n_ctx} · ${p.total_slots} slot(s) · ${p.build_info}`;
    const d = s.params || {};
    for (const k of ["temperature", "top_k", "top_p", "min_p"]) if (d[k] !== undefined) $(k).value = d[k];
  } catch (e) {
    $("model-info").textContent = "model info unavailable";
  }
}

function number(id) {
  const v = parseFloat($(id).value);
  return Number.isFinite(v) ? v : undefined;
}

async function send(text) {
  history.push({ role: "user", content: text });
  addText(bubble("user"), text);
  const div = bubble("assistant");
  let details = null, thinking = null;
  const content = addText(div, "");
  let answer = "";
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...history);
  const body = { messages, stream: true, temperature: number("temperature"), top_k: number("top_k"),
                 top_p: number("top_p"), min_p: number("min_p"), max_tokens: number("max_tokens") };
  controller = new AbortController();
  $("send").disabled = true; $("stop").disabled = false;
  $("status").textContent = "generating…";
  const t0 = performance.now();
  let n = 0;
  try {
    const r = await fetch("v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body),
                                                     signal: controller.signal });
    if (!r.ok) {
      const err = await r.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || ("HTTP " + r.status));
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (!data || data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        const delta = (chunk.choices && chunk.choices[0] && chunk.choices[0].delta) || {};
        if (delta.reasoning_content) {
          if (!details) {
            details = document.createElement("details");
            const summary = document.createElement("summary");
            summary.textContent = "Reasoning";
            thinking = document.createElement("div");
            details.append(summary, thinking);
            div.insertBefore(details, content);
          }
          thinking.textContent += delta.reasoning_content;
        }
        if (delta.content) { answer += delta.content; content.textContent = answer; n++; }
        $("messages").scrollTop = $("messages").scrollHeight;
      }
    }
    $("status").textContent = `${n} chunks in ${((performance.now() - t0) / 1000).toFixed(1)} s`;
  } catch (e) {
    if (e.name === "AbortError") {
      const s = document.createElement("div");
      s.className = "stopped";
      s.textContent = "(stopped)";
      div.appendChild(s);
      $("status").textContent = "stopped";
    } else {
      div.className = "msg error";
      content.textContent = "Error: " + e.message;
      $("status").textContent = "error";
    }
  } finally {
    history.push({ role: "assistant", content: answer });
    controller = null;
    $("send").disabled = false; $("stop").disabled = true;
  }
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", () => { if (controller) controller.abort(); });
$("api_key").addEventListener("change", loadProps);
$("new-chat").addEventListener("click", () => { history.length = 0; $("messages").innerHTML = ""; });
loadProps();
