// What both pages share: requests to this server (relative URLs, with the tab's API key) and
// small DOM helpers. No HTML is ever parsed from a string: nodes are built, text is text.

const KEY_STORAGE = "metrale.apiKey";
let keyPrompt = null;

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name in node && typeof value !== "string") node[name] = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

function askForKey(refused) {
  if (keyPrompt) return keyPrompt;
  const dialog = document.getElementById("key-dialog");
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  document.getElementById("key-error").textContent = refused
    ? "The server refused that key; try another."
    : "";
  keyPrompt = new Promise((resolve) => {
    const submitted = (event) => {
      event.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      form.removeEventListener("submit", submitted);
      sessionStorage.setItem(KEY_STORAGE, key);
      input.value = "";
      dialog.close();
      keyPrompt = null;
      resolve(key);
    };
    form.addEventListener("submit", submitted);
  });
  dialog.showModal();
  input.focus();
  return keyPrompt;
}

// fetch() of a path of this server, with the tab's key; on a 401 the page asks for the key
// (once for every request waiting on it) and tries again.
export async function apiFetch(path, init = {}) {
  for (let attempt = 0; ; attempt++) {
    const headers = new Headers(init.headers || {});
    const key = apiKey();
    if (key) headers.set("Authorization", `Bearer ${key}`);
    const response = await fetch(path, { ...init, headers, credentials: "omit" });
    if (response.status !== 401 || attempt > 4) return response;
    await askForKey(Boolean(key));
  }
}

export async function apiJson(path, init = {}) {
  const response = await apiFetch(path, init);
  if (!response.ok) throw new Error(await errorMessage(response));
  return response.json();
}

export async function errorMessage(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    if (body && body.error && body.error.message) return `${response.status}: ${body.error.message}`;
  } catch (_) {
    // not JSON: the text itself
  }
  return `${response.status}: ${text.slice(0, 500) || response.statusText}`;
}

export function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(unit === 0 ? 0 : value < 10 ? 2 : 1)} ${units[unit]}`;
}

export function formatNumber(value, digits = 1) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (Math.abs(value) >= 1000) return Math.round(value).toLocaleString("en-US");
  return value.toFixed(digits);
}

export function formatSeconds(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(2)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 120) return `${minutes} min`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}
