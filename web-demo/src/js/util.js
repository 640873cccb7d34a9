// Small DOM and formatting helpers shared by the views.

/** `h("div.card#x", {title: "t", onclick}, child, "text", ...)`: a tiny element builder. */
export function h(spec, attrs = {}, ...children) {
  const m = /^([a-z0-9]+)?((?:[.#][\w-]+)*)$/i.exec(spec);
  const el = document.createElement(m[1] || "div");
  for (const part of m[2].match(/[.#][\w-]+/g) ?? []) {
    if (part[0] === ".") el.classList.add(part.slice(1));
    else el.id = part.slice(1);
  }
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "text") el.textContent = v;
    else if (k === "html") el.innerHTML = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

/** An SVG element with attributes. */
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) el.setAttribute(k, String(v));
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Sets an attribute only when it changes (DOM writes are what costs). */
export function setAttr(el, name, value) {
  const v = String(value);
  if (el.getAttribute(name) !== v) el.setAttribute(name, v);
}

/** Sets textContent only when it changes. */
export function setText(el, value) {
  const v = String(value);
  if (el.textContent !== v) el.textContent = v;
}

/** A resource version (BigInt, number or nullish) as text. */
export function rvText(rv) {
  return rv === undefined || rv === null ? "–" : String(rv);
}

/** Milliseconds as seconds text: 1234 → "1.234 s". */
export function secText(ms) {
  return `${(ms / 1000).toFixed(3)} s`;
}

/** HTML-escapes a string. */
export function esc(x) {
  return String(x).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

/** Parses "a=b,c=d" into {a: "b", c: "d"} (labels of a written object). */
export function parseLabels(text) {
  const out = {};
  for (const part of String(text ?? "").split(",")) {
    const [k, ...rest] = part.split("=");
    if (k && k.trim()) out[k.trim()] = rest.join("=").trim();
  }
  return out;
}

/** {a: "b"} → "a=b". */
export function labelsText(labels) {
  return Object.entries(labels ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join(",");
}

/** Colours of the event types, shared by the SVG, the canvas and the CSS legend. */
export const TYPE_COLOR = {
  ADDED: "#16a34a",
  MODIFIED: "#2563eb",
  DELETED: "#dc2626",
  BOOKMARK: "#d97706",
  ERROR: "#7f1d1d",
  WRITE: "#6366f1",
  PROGRESS: "#0891b2",
};
