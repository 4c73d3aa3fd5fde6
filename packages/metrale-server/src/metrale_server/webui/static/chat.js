// The chat page: conversations kept in this browser (localStorage), replies streamed from
// v1/chat/completions (SSE) and rendered as they arrive; a stop button aborts the request,
// which the server then aborts too (a client that goes away frees its KV blocks).

import { apiFetch, apiJson, el, errorMessage, formatNumber } from "./common.js";
import { renderMarkdown } from "./markdown.js";

const STORE = "metrale.conversations";
const CURRENT = "metrale.currentConversation";
const SETTINGS = "metrale.chatSettings";
const DEFAULT_SETTINGS = {
  system: "",
  temperature: "",
  top_p: "",
  max_tokens: "",
  seed: "",
  json_schema: "",
  tools: "",
  tool_choice: "auto",
};

const $ = (id) => document.getElementById(id);
const state = {
  conversations: load(STORE, []),
  currentId: localStorage.getItem(CURRENT),
  settings: { ...DEFAULT_SETTINGS, ...load(SETTINGS, {}) },
  model: null,
  streaming: null, // { controller, message, view }
  pendingImages: [], // data URLs attached to the next message
};

function load(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch (_) {
    return fallback;
  }
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(state.conversations));
    if (state.currentId) localStorage.setItem(CURRENT, state.currentId);
    else localStorage.removeItem(CURRENT);
  } catch (error) {
    console.warn("the conversations could not be saved:", error);
  }
}

function current() {
  return state.conversations.find((c) => c.id === state.currentId) || null;
}

function newConversation() {
  const conversation = { id: crypto.randomUUID(), title: "New chat", createdAt: Date.now(), messages: [] };
  state.conversations.unshift(conversation);
  state.currentId = conversation.id;
  save();
  return conversation;
}

// ---- settings ------------------------------------------------------------------------------

function showSettings() {
  for (const [name, value] of Object.entries(state.settings)) {
    const input = $(name);
    if (input) input.value = value;
  }
}

function readSettings() {
  for (const name of Object.keys(DEFAULT_SETTINGS)) state.settings[name] = $(name).value;
  localStorage.setItem(SETTINGS, JSON.stringify(state.settings));
  try {
    requestOptions();
    $("settings-error").textContent = "";
  } catch (error) {
    $("settings-error").textContent = error.message;
  }
}

function parseJsonSetting(text, what) {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new Error(`${what} is not valid JSON: ${error.message}`);
  }
}

// The request fields the settings ask for; blank ones are left to the server's defaults.
function requestOptions() {
  const s = state.settings;
  const options = {};
  for (const name of ["temperature", "top_p"]) if (s[name] !== "") options[name] = Number(s[name]);
  for (const name of ["max_tokens", "seed"]) if (s[name] !== "") options[name] = parseInt(s[name], 10);
  if (s.json_schema.trim()) {
    const schema = parseJsonSetting(s.json_schema, "The JSON schema");
    options.response_format = { type: "json_schema", json_schema: { name: "reply", schema, strict: true } };
  }
  if (s.tools.trim()) {
    const tools = parseJsonSetting(s.tools, "The tools");
    if (!Array.isArray(tools)) throw new Error("The tools must be a JSON list");
    options.tools = tools;
    options.tool_choice = s.tool_choice;
  }
  return options;
}

// ---- rendering -----------------------------------------------------------------------------

function renderConversationList() {
  const list = $("conversations");
  list.replaceChildren(
    ...state.conversations.map((conversation) =>
      el(
        "li",
        { class: conversation.id === state.currentId ? "active" : "" },
        el("button", {
          type: "button",
          class: "conversation-title",
          text: conversation.title,
          title: conversation.title,
          onclick: () => selectConversation(conversation.id),
        }),
        el("button", {
          type: "button",
          class: "icon-button delete-conversation",
          "aria-label": `Delete ${conversation.title}`,
          text: "×",
          onclick: () => deleteConversation(conversation.id),
        }),
      ),
    ),
  );
}

function renderMessages() {
  const conversation = current();
  const box = $("messages");
  const messages = conversation ? conversation.messages : [];
  box.replaceChildren();
  if (!messages.length) box.append(el("p", { id: "empty-hint", class: "empty-hint", text: "Ask the served model something. Enter sends, Shift+Enter starts a new line." }));
  messages.forEach((message, index) => box.append(messageView(message, index === messages.length - 1).root));
  box.scrollTop = box.scrollHeight;
}

function messageView(message, isLast) {
  const root = el("article", { class: `message ${message.role}` });
  const role = el("div", { class: "role", text: message.role === "user" ? "You" : state.model || "assistant" });
  const reasoningBody = el("div", { class: "reasoning-body" });
  const reasoning = el("details", { class: "reasoning", hidden: true }, el("summary", { text: "Reasoning" }), reasoningBody);
  const content = el("div", { class: "content" });
  const tools = el("div", { class: "tool-calls" });
  const stats = el("div", { class: "stats" });
  const actions = el("div", { class: "actions" });
  root.append(role, reasoning, content, tools, stats, actions);
  const view = { root, reasoning, reasoningBody, content, tools, stats, actions };
  updateMessageView(view, message);
  if (message.role === "assistant" && isLast) {
    actions.append(el("button", { type: "button", class: "regenerate", text: "Regenerate", onclick: regenerate }));
  }
  return view;
}

function updateMessageView(view, message) {
  if (message.reasoning) {
    view.reasoning.hidden = false;
    view.reasoningBody.textContent = message.reasoning;
  }
  if (message.role === "user") {
    view.content.replaceChildren(...message.content.split("\n").flatMap((line, i) => (i ? [el("br"), line] : [line])));
    if (message.images?.length) {
      view.content.append(el("div", { class: "images" }, message.images.map((url, i) => el("img", { class: "thumb", src: url, alt: `image ${i + 1}` }))));
    }
  }
  else if (message.isJson) view.content.replaceChildren(el("pre", { class: "json-reply" }, el("code", { text: message.content })));
  else view.content.replaceChildren(renderMarkdown(message.content || ""));
  view.tools.replaceChildren(
    ...(message.toolCalls || []).map((call) =>
      el(
        "details",
        { class: "tool-call", open: true },
        el("summary", {}, "Tool call ", el("code", { text: call.name || "?" })),
        el("pre", {}, el("code", { text: prettyJson(call.arguments) })),
      ),
    ),
  );
  const parts = [];
  if (message.stats) {
    const s = message.stats;
    parts.push(`${s.tokens} tokens`);
    if (s.tokensPerSecond !== null) parts.push(`${formatNumber(s.tokensPerSecond)} tok/s`);
    if (s.ttftMs !== null) parts.push(`TTFT ${Math.round(s.ttftMs)} ms`);
    if (s.finishReason) parts.push(s.finishReason);
  }
  if (message.stopped) parts.push("stopped");
  view.stats.textContent = parts.join(" · ");
  view.root.classList.toggle("has-error", Boolean(message.error));
  if (message.error) view.content.append(el("p", { class: "error-text", text: message.error }));
}

function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch (_) {
    return text || "";
  }
}

// ---- conversations -------------------------------------------------------------------------

function selectConversation(id) {
  if (state.streaming) stop();
  state.currentId = id;
  save();
  renderConversationList();
  renderMessages();
  closeSidebarOnPhone();
}

function deleteConversation(id) {
  if (state.streaming && current()?.id === id) stop();
  state.conversations = state.conversations.filter((c) => c.id !== id);
  if (state.currentId === id) state.currentId = state.conversations[0]?.id || null;
  save();
  renderConversationList();
  renderMessages();
}

// ---- sending -------------------------------------------------------------------------------

async function send(text, images = []) {
  let options;
  try {
    options = requestOptions();
  } catch (error) {
    $("settings-error").textContent = error.message;
    openSettings(true);
    return;
  }
  const conversation = current() || newConversation();
  if (text || images.length) {
    conversation.messages.push(images.length ? { role: "user", content: text, images } : { role: "user", content: text });
    if (conversation.title === "New chat") conversation.title = (text || "Image").slice(0, 60);
  }
  save();
  renderConversationList();
  await streamReply(conversation, options);
}

function historyOf(conversation) {
  const messages = [];
  if (state.settings.system.trim()) messages.push({ role: "system", content: state.settings.system });
  for (const message of conversation.messages) {
    if (message.error && !message.content) continue;
    messages.push({ role: message.role, content: contentOf(message) });
  }
  return messages;
}

// A user message with images is text and image_url parts (data URLs), in that order.
function contentOf(message) {
  if (!message.images?.length) return message.content || "";
  const parts = message.content ? [{ type: "text", text: message.content }] : [];
  return parts.concat(message.images.map((url) => ({ type: "image_url", image_url: { url } })));
}

// ---- attached images -----------------------------------------------------------------------

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function attachFiles(files) {
  for (const file of files) {
    if (!file.type.startsWith("image/")) continue;
    state.pendingImages.push(await readAsDataUrl(file));
  }
  renderAttachments();
}

function renderAttachments() {
  const box = $("attachments");
  box.hidden = !state.pendingImages.length;
  box.replaceChildren(
    ...state.pendingImages.map((url, index) =>
      el(
        "div",
        { class: "attachment" },
        el("img", { class: "thumb", src: url, alt: `attached image ${index + 1}` }),
        el("button", {
          type: "button",
          class: "remove-attachment",
          "aria-label": "Remove image",
          text: "×",
          onclick: () => {
            state.pendingImages.splice(index, 1);
            renderAttachments();
          },
        }),
      ),
    ),
  );
}

async function streamReply(conversation, options) {
  const message = {
    role: "assistant",
    content: "",
    reasoning: "",
    toolCalls: [],
    isJson: Boolean(options.response_format),
  };
  const body = {
    messages: historyOf(conversation),
    stream: true,
    stream_options: { include_usage: true },
    ...options,
  };
  if (state.model) body.model = state.model;
  conversation.messages.push(message);
  renderMessages();
  const box = $("messages");
  const view = messageView(message, false);
  box.lastChild.replaceWith(view.root);
  view.root.classList.add("streaming");
  const controller = new AbortController();
  state.streaming = { controller, message, view };
  setStreaming(true);

  const startedAt = performance.now();
  let firstAt = null;
  let lastAt = null;
  let numChunks = 0;
  let usage = null;
  let finishReason = null;
  let isRenderPending = false;
  const onDelta = (delta) => {
    let isToken = false;
    if (delta.reasoning_content) {
      message.reasoning += delta.reasoning_content;
      isToken = true;
    }
    if (delta.content) {
      message.content += delta.content;
      isToken = true;
    }
    for (const call of delta.tool_calls || []) {
      const slot = (message.toolCalls[call.index ?? 0] ||= { id: null, name: "", arguments: "" });
      if (call.id) slot.id = call.id;
      if (call.function?.name) slot.name += call.function.name;
      if (call.function?.arguments) slot.arguments += call.function.arguments;
      isToken = true;
    }
    if (isToken) {
      lastAt = performance.now();
      firstAt ??= lastAt;
      numChunks++;
    }
  };
  try {
    const response = await apiFetch("v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    for await (const event of serverSentEvents(response.body)) {
      if (event.error) throw new Error(event.error.message || "the server reported an error");
      if (event.usage) usage = event.usage;
      for (const choice of event.choices || []) {
        if (choice.delta) onDelta(choice.delta);
        if (choice.finish_reason) finishReason = choice.finish_reason;
      }
      // At most one render a frame, however fast the tokens come (each render parses the
      // whole reply so far).
      if (!isRenderPending) {
        isRenderPending = true;
        requestAnimationFrame(() => {
          isRenderPending = false;
          if (state.streaming?.message !== message) return;
          updateMessageView(view, message);
          keepScrolledDown(box);
        });
      }
    }
  } catch (error) {
    if (error.name === "AbortError") message.stopped = true;
    else message.error = error.message;
  } finally {
    const tokens = usage ? usage.completion_tokens : numChunks;
    const decodeMs = firstAt !== null && lastAt > firstAt ? lastAt - firstAt : null;
    message.stats = {
      tokens,
      ttftMs: firstAt === null ? null : firstAt - startedAt,
      tokensPerSecond: decodeMs && tokens > 1 ? ((tokens - 1) * 1000) / decodeMs : null,
      finishReason,
    };
    state.streaming = null;
    setStreaming(false);
    save();
    renderMessages();
  }
}

// The data events of an SSE body, parsed from JSON (``[DONE]`` ends it).
async function* serverSentEvents(stream) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = frame
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

function keepScrolledDown(box) {
  if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
}

function stop() {
  if (state.streaming) state.streaming.controller.abort();
}

async function regenerate() {
  const conversation = current();
  if (!conversation || state.streaming) return;
  while (conversation.messages.length && conversation.messages.at(-1).role === "assistant") conversation.messages.pop();
  if (!conversation.messages.length) return renderMessages();
  await send(null);
}

function setStreaming(isStreaming) {
  $("send").hidden = isStreaming;
  $("stop").hidden = !isStreaming;
  document.body.classList.toggle("is-streaming", isStreaming);
}

// ---- layout --------------------------------------------------------------------------------

function openSettings(open) {
  $("settings").hidden = !open;
  $("toggle-settings").setAttribute("aria-expanded", String(open));
}

function closeSidebarOnPhone() {
  document.body.classList.remove("sidebar-open");
  $("toggle-sidebar").setAttribute("aria-expanded", "false");
}

function growPrompt() {
  const prompt = $("prompt");
  prompt.style.height = "auto";
  prompt.style.height = `${Math.min(prompt.scrollHeight, 240)}px`;
}

function submitPrompt() {
  if (state.streaming) return;
  const prompt = $("prompt");
  const text = prompt.value.trim();
  const images = state.pendingImages;
  if (!text && !images.length) return;
  prompt.value = "";
  state.pendingImages = [];
  renderAttachments();
  growPrompt();
  send(text, images);
}

function wire() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    submitPrompt();
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      submitPrompt();
    }
  });
  $("prompt").addEventListener("input", growPrompt);
  $("attach-button").addEventListener("click", () => $("attach").click());
  $("attach").addEventListener("change", async (event) => {
    await attachFiles([...event.target.files]);
    event.target.value = "";
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", () => {
    if (state.streaming) stop();
    newConversation();
    renderConversationList();
    renderMessages();
    closeSidebarOnPhone();
    $("prompt").focus();
  });
  $("toggle-settings").addEventListener("click", () => openSettings($("settings").hidden));
  $("toggle-sidebar").addEventListener("click", () => {
    const open = document.body.classList.toggle("sidebar-open");
    $("toggle-sidebar").setAttribute("aria-expanded", String(open));
  });
  $("settings-form").addEventListener("input", readSettings);
  $("settings-form").addEventListener("change", readSettings);
  $("reset-settings").addEventListener("click", () => {
    state.settings = { ...DEFAULT_SETTINGS };
    showSettings();
    readSettings();
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.streaming) stop();
  });
  window.addEventListener("storage", (event) => {
    if (event.key === STORE && !state.streaming) {
      state.conversations = load(STORE, []);
      renderConversationList();
      renderMessages();
    }
  });
}

async function loadModel() {
  try {
    const models = await apiJson("v1/models");
    state.model = models.data?.[0]?.id || null;
    // Images only to a model that takes them (the model card says so).
    $("attach-button").hidden = !(models.data?.[0]?.input_modalities || []).includes("image");
    $("model-name").textContent = state.model || "";
    document.body.dataset.ready = "true";
    renderMessages();
  } catch (error) {
    $("model-name").textContent = `unavailable (${error.message})`;
  }
}

wire();
showSettings();
if (!current() && state.conversations.length) state.currentId = state.conversations[0].id;
renderConversationList();
renderMessages();
loadModel();
$("prompt").focus();
