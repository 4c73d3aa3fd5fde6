// A small Markdown renderer of our own: it builds DOM nodes (text goes in as text nodes, so
// nothing the model writes can become markup) for the subset chat replies use: fenced code,
// headings, lists, quotes, tables, rules, paragraphs; inline code, bold, italics, strikes and
// http(s) links. An unclosed fence (a reply still streaming) renders as code so far.

import { el } from "./common.js";

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_DIVIDER = /^\s*\|?\s*:?-{1,}:?\s*(\|\s*:?-{1,}:?\s*)*\|?\s*$/;
const INLINE = new RegExp(
  [
    "(?<code>`+)(?<codeText>[^`]|[^`][\\s\\S]*?[^`])\\k<code>(?!`)",
    "\\*\\*(?<strong>(?=\\S)[\\s\\S]*?\\S)\\*\\*",
    "__(?<strong2>(?=\\S)[\\s\\S]*?\\S)__",
    "~~(?<strike>(?=\\S)[\\s\\S]*?\\S)~~",
    "\\*(?<em>(?=[^\\s*])[^*]*?[^\\s*]|[^\\s*])\\*",
    "(?<![\\w])_(?<em2>(?=[^\\s_])[^_]*?[^\\s_]|[^\\s_])_(?![\\w])",
    "\\[(?<label>[^\\]\\n]+)\\]\\((?<href>[^)\\s]+)\\)",
    "(?<url>https?:\\/\\/[^\\s<>()\\[\\]]*[^\\s<>()\\[\\].,;:!?'\"])",
  ].join("|"),
  "g",
);

export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  renderBlocks(text.replace(/\r\n?/g, "\n").split("\n"), fragment);
  return fragment;
}

function isBlockStart(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

function renderBlocks(lines, parent) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) {
      i++;
      continue;
    }
    let match;
    if ((match = FENCE.exec(line))) {
      const marker = match[1];
      const body = [];
      i++;
      while (i < lines.length && !isClosingFence(lines[i], marker)) body.push(lines[i++]);
      i++; // the closing fence, or past the end
      parent.append(codeBlock(body.join("\n"), match[2]));
    } else if (RULE.test(line)) {
      parent.append(el("hr"));
      i++;
    } else if ((match = HEADING.exec(line))) {
      const heading = el(`h${Math.min(match[1].length + 2, 6)}`);
      renderInline(match[2], heading);
      parent.append(heading);
      i++;
    } else if (QUOTE.test(line)) {
      const inner = [];
      while (i < lines.length && (match = QUOTE.exec(lines[i]))) {
        inner.push(match[1]);
        i++;
      }
      const quote = el("blockquote");
      renderBlocks(inner, quote);
      parent.append(quote);
    } else if (ITEM.test(line)) {
      i = renderList(lines, i, parent);
    } else if (line.includes("|") && i + 1 < lines.length && TABLE_DIVIDER.test(lines[i + 1])) {
      i = renderTable(lines, i, parent);
    } else {
      const paragraph = [];
      while (i < lines.length && lines[i].trim() && !(paragraph.length && isBlockStart(lines[i]))) {
        paragraph.push(lines[i++].trim());
      }
      const p = el("p");
      renderInline(paragraph.join("\n"), p);
      parent.append(p);
    }
  }
}

function isClosingFence(line, marker) {
  const trimmed = line.trim();
  return trimmed.startsWith(marker) && new RegExp(`^\\${marker[0]}+$`).test(trimmed);
}

function codeBlock(code, language) {
  const copy = el("button", { type: "button", class: "copy-button", text: "Copy" });
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(code);
      copy.textContent = "Copied";
    } catch (_) {
      copy.textContent = "Select and copy";
    }
    setTimeout(() => (copy.textContent = "Copy"), 1500);
  });
  const codeNode = el("code", { text: code });
  if (language) codeNode.dataset.language = language;
  return el(
    "div",
    { class: "code-block" },
    el("div", { class: "code-head" }, el("span", { text: language || "code" }), copy),
    el("pre", {}, codeNode),
  );
}

function renderList(lines, start, parent) {
  const first = ITEM.exec(lines[start]);
  const isOrdered = /\d/.test(first[2]);
  const list = el(isOrdered ? "ol" : "ul");
  if (isOrdered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  let i = start;
  let isLoose = false;
  const items = [];
  while (i < lines.length) {
    const match = ITEM.exec(lines[i]);
    if (!match || /\d/.test(match[2]) !== isOrdered) break;
    const body = [match[3]];
    const indent = match[1].length + match[2].length + 1;
    i++;
    while (i < lines.length) {
      const next = lines[i];
      if (!next.trim()) {
        const following = lines[i + 1];
        if (following !== undefined && /^\s{2,}\S/.test(following)) {
          body.push("");
          isLoose = true;
          i++;
          continue;
        }
        break;
      }
      if (/^\s{2,}\S/.test(next)) body.push(next.slice(Math.min(indent, next.search(/\S/))));
      else if (ITEM.test(next) || isBlockStart(next)) break;
      else body.push(next.trim()); // a lazy continuation line
      i++;
    }
    items.push(body);
    // A blank line between items of one list.
    if (i + 1 < lines.length && !lines[i]?.trim() && ITEM.test(lines[i + 1] || "")) {
      const next = ITEM.exec(lines[i + 1]);
      if (/\d/.test(next[2]) === isOrdered) {
        isLoose = true;
        i++;
      }
    }
  }
  for (const body of items) {
    const item = el("li");
    if (body.length === 1 && !isLoose) renderInline(body[0], item);
    else renderBlocks(body, item);
    list.append(item);
  }
  parent.append(list);
  return i;
}

function tableCells(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  return row.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

function renderTable(lines, start, parent) {
  const head = tableCells(lines[start]);
  const aligns = tableCells(lines[start + 1]).map((cell) =>
    cell.endsWith(":") ? (cell.startsWith(":") ? "center" : "right") : cell.startsWith(":") ? "left" : "",
  );
  const row = (cells, tag) =>
    el(
      "tr",
      {},
      head.map((_, column) => {
        const cell = el(tag);
        if (aligns[column]) cell.className = `align-${aligns[column]}`;
        renderInline(cells[column] || "", cell);
        return cell;
      }),
    );
  const body = el("tbody");
  let i = start + 2;
  while (i < lines.length && lines[i].includes("|") && lines[i].trim()) body.append(row(tableCells(lines[i++]), "td"));
  parent.append(el("div", { class: "table-scroll" }, el("table", {}, el("thead", {}, row(head, "th")), body)));
  return i;
}

function isSafeHref(href) {
  return /^(https?:|mailto:)/i.test(href);
}

function appendText(text, parent) {
  const parts = text.split("\n");
  parts.forEach((part, index) => {
    if (index) parent.append(el("br"));
    if (part) parent.append(document.createTextNode(part));
  });
}

export function renderInline(text, parent) {
  let last = 0;
  INLINE.lastIndex = 0;
  for (const match of text.matchAll(INLINE)) {
    appendText(text.slice(last, match.index), parent);
    last = match.index + match[0].length;
    const g = match.groups;
    if (g.code !== undefined) {
      parent.append(el("code", { text: g.codeText.replace(/^ (.*) $/, "$1") }));
    } else if (g.strong !== undefined || g.strong2 !== undefined) {
      const node = el("strong");
      renderInline(g.strong ?? g.strong2, node);
      parent.append(node);
    } else if (g.strike !== undefined) {
      const node = el("del");
      renderInline(g.strike, node);
      parent.append(node);
    } else if (g.em !== undefined || g.em2 !== undefined) {
      const node = el("em");
      renderInline(g.em ?? g.em2, node);
      parent.append(node);
    } else if (g.label !== undefined) {
      if (isSafeHref(g.href)) {
        const link = el("a", { href: g.href, target: "_blank", rel: "noopener noreferrer" });
        renderInline(g.label, link);
        parent.append(link);
      } else {
        appendText(match[0], parent);
      }
    } else if (g.url !== undefined) {
      parent.append(el("a", { href: g.url, target: "_blank", rel: "noopener noreferrer", text: g.url }));
    }
  }
  appendText(text.slice(last), parent);
}
