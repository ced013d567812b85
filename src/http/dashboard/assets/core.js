// The dashboard's core: an error collector, DOM helpers, the API client (one token from
// sessionStorage, asked for in the page, whose owner and scope the header shows), the live feed (SSE read with fetch, so that
// it can carry the Authorization header), confirmation, and a hash router. Pages
// register themselves in A.pages (pages.js, graphs.js, upload.js).
"use strict";
const A = (window.A = { pages: {}, errors: [] });

// Anything that goes wrong in the page is kept (and shown in the console as usual):
// the browser tests read A.errors and require it empty.
window.addEventListener("error", (e) => A.errors.push("error: " + (e.message || e.type)));
window.addEventListener("unhandledrejection", (e) => A.errors.push("rejection: " + String(e.reason)));
document.addEventListener("securitypolicyviolation", (e) =>
  A.errors.push("csp: " + e.violatedDirective + " " + e.blockedURI));
const consoleError = console.error.bind(console);
console.error = (...args) => { A.errors.push("console: " + args.join(" ")); consoleError(...args); };

// ---- DOM ----------------------------------------------------------------------------
// h("a", {href: "#/"}, "text", child…): an element; strings become text nodes (never
// HTML), null/false children are skipped, arrays are flattened.
A.h = function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  A.append(el, children);
  return el;
};
A.append = function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
};
// As Element.replaceChildren, skipping null, undefined and false as `A.h` does (the
// DOM's own would print them as text: "null").
A.replace = (el, ...children) => { el.replaceChildren(); return A.append(el, children); };
A.add = (el, ...children) => A.append(el, children);
A.svg = function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
};
A.status = (s) => A.h("span", { class: "status s-" + s, "data-status": s }, s);
// A task's progress (ctx.progress in its handler) as a bar and a percentage, with its
// message unless small (lists show the message on hover); null when never reported. A
// <progress> element: the style policy forbids inline widths.
A.progress = function progress(p, message, small) {
  if (p === null || p === undefined) return null;
  const pct = Math.round(p * 100) + "%";
  return A.h("span", { class: "progress" + (small ? " small" : ""), "data-progress": p, title: message || pct },
    A.h("progress", { value: p, max: 1 }), " ", pct, !small && message ? [" ", A.h("span", { class: "muted" }, message)] : null);
};
// A kind's retry policy (artex kind retry) as words: "fixed 200 ms",
// "exponential 1.00 s … 600.00 s, 5 attempts"; the default without one.
A.policy = function policy(p) {
  if (!p) return "default (exponential, 3 retries)";
  const wait = p.backoff === "fixed" ? "fixed " + A.ms(p.base_ms) : p.backoff + " " + A.ms(p.base_ms) + " … " + A.ms(p.cap_ms);
  return wait + (p.max_attempts ? ", " + p.max_attempts + " attempts" : "");
};
A.short = (id) => (id ? String(id).slice(0, 8) + "…" + String(id).slice(-4) : "-");
A.taskLink = (id) => A.h("a", { href: "#/tasks/" + id, class: "mono", title: id }, A.short(id));
A.time = (t) => (t ? new Date(t).toLocaleString() : "-");
A.ago = function ago(t) {
  if (!t) return "-";
  const s = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
  if (s < 60) return s.toFixed(0) + " s ago";
  if (s < 3600) return (s / 60).toFixed(0) + " min ago";
  return (s / 3600).toFixed(1) + " h ago";
};
A.ms = (v) => (v === null || v === undefined ? "-" : v < 1000 ? v.toFixed(0) + " ms" : (v / 1000).toFixed(2) + " s");
// A JSON value; none at all (a task without a result yet) shows as "none", not "null".
A.json = (v) => (v === null || v === undefined ? A.h("p", { class: "muted" }, "none") : A.h("pre", { class: "mono" }, JSON.stringify(v, null, 2)));
A.sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- tokens and the API -------------------------------------------------------------
// One token: asked for in the page when the server says 401, kept in sessionStorage (this
// tab only, gone when it closes, never in a URL, so never in a server's or proxy's log).
// /api/v1/whoami says whose it is and its scope: the header shows it, and body's
// data-scope hides what the scope cannot do (app.css: [data-needs]). Public reads
// without a token hide nothing: acting asks for a token.
const TOKEN_KEY = "artex.token";
A.token = () => sessionStorage.getItem(TOKEN_KEY) || "";
A.authHeaders = function () {
  const t = A.token();
  return t ? { Authorization: "Bearer " + t } : {};
};
A.caller = null;
A.whoami = async function whoami() {
  let who = null;
  try {
    const res = await fetch("/api/v1/whoami", { headers: A.authHeaders(), cache: "no-store" });
    if (res.ok) who = await res.json();
  } catch (_) { /* the server is away: the feed's reconnection asks again */ }
  A.caller = who;
  const named = who && who.by !== "public";
  if (named) document.body.dataset.scope = who.scope;
  else delete document.body.dataset.scope;
  const el = document.getElementById("who");
  if (el) {
    // A public-read server answers a token it does not know (mistyped, revoked,
    // expired) as a public read: say so, or its holder would never learn it.
    el.textContent = !who ? "no token"
      : who.by === "public" ? (A.token() ? "token not known · public read" : "public read")
      : (who.name || "token file") + " · " + who.scope;
    el.dataset.by = who ? who.by : "none";
  }
  return who;
};
let asking = null;
A.askToken = function askToken(why) {
  if (asking) return asking;
  const dlg = document.getElementById("token-dialog");
  document.getElementById("token-why").textContent = why || "";
  const input = document.getElementById("token-input");
  input.value = "";
  asking = new Promise((resolve) => {
    dlg.addEventListener("close", async function done() {
      dlg.removeEventListener("close", done);
      if (dlg.returnValue === "ok" && input.value.trim()) {
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        await A.whoami();
        asking = null;
        window.dispatchEvent(new Event("artex-token"));
        resolve(true);
      } else { asking = null; resolve(false); }
    });
  });
  dlg.showModal();
  return asking;
};

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || "HTTP " + status);
    this.status = status;
    this.body = body;
  }
}

// Read-your-writes when reads come from a replica: a change's answer carries the
// primary's WAL position (Artex-Lsn); the reads of the next half minute send it back
// (Artex-After-Lsn), and the server answers them from wherever that change is visible.
A.written = null;
const WRITTEN_FOR_MS = 30000;

// One API call: JSON in and out; a 401 asks for a token (one that can) and tries again.
A.api = async function api(method, path, body) {
  for (;;) {
    const headers = A.authHeaders();
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (method === "GET" && A.written && Date.now() - A.written.at < WRITTEN_FOR_MS) {
      headers["Artex-After-Lsn"] = A.written.lsn;
    }
    const res = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store",
    });
    const lsn = method === "GET" ? null : res.headers.get("Artex-Lsn");
    if (lsn) A.written = { lsn, at: Date.now() };
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = { error: text }; }
    if (res.status === 401) {
      const why = (data && data.error) || "";
      if (await A.askToken(why)) continue;
    }
    if (!res.ok) throw new ApiError(res.status, data);
    return data;
  }
};

// ---- confirmation -------------------------------------------------------------------
// Resolves to {reason} when confirmed, null when not.
A.confirm = function confirm(title, text) {
  const dlg = document.getElementById("confirm-dialog");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const reason = document.getElementById("confirm-reason");
  reason.value = "";
  return new Promise((resolve) => {
    dlg.addEventListener("close", function done() {
      dlg.removeEventListener("close", done);
      resolve(dlg.returnValue === "ok" ? { reason: reason.value.trim() } : null);
    });
    dlg.returnValue = "";
    dlg.showModal();
  });
};

// A button that runs `control` (pause, resume, cancel, retry) on a task or a flow after
// a confirmation, then calls `after`.
A.controlButton = function controlButton(what, id, control, after) {
  const b = A.h("button", { class: control === "cancel" ? "danger" : "", "data-action": control, "data-needs": "write" }, control);
  b.addEventListener("click", async () => {
    const ok = await A.confirm(control + " " + what + "?", control + " " + what + " " + id + ".");
    if (!ok) return;
    b.disabled = true;
    try {
      const body = ok.reason ? { reason: ok.reason } : {};
      await A.api("POST", "/api/v1/" + what + "s/" + id + "/" + control, body);
      A.flash(control + ": done");
    } catch (e) {
      A.flash(control + " refused: " + e.message, true);
    } finally {
      b.disabled = false;
      if (after) after();
    }
  });
  return b;
};
A.flash = function flash(text, bad) {
  const el = document.getElementById("flash");
  if (el) { el.textContent = text; el.className = bad ? "error" : "muted"; }
};

// ---- the live feed ------------------------------------------------------------------
// Reads /api/v1/events with fetch (EventSource cannot send a bearer token), from the
// head of the feed at the first connection and after the last event seen afterwards;
// when the stream ends (a drain, a hot upgrade) it checks /health and reconnects, so
// the page never dies. Each event goes to A.recent and to the current page.
A.recent = [];
A.live = { after: null };
function setLive(on, text) {
  const el = document.getElementById("live");
  el.className = "live " + (on ? "on" : "off");
  el.textContent = text || (on ? "live" : "offline");
}
function dispatch(block) {
  let event = "message", id = null, data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue;
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    const value = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
    if (field === "event") event = value;
    else if (field === "id") id = value;
    else if (field === "data") data += (data ? "\n" : "") + value;
  }
  if (id) A.live.after = id;
  if ((event !== "task" && event !== "progress") || !data) return;
  let ev;
  try { ev = JSON.parse(data); } catch (_) { return; }
  // Progress is not a transition: not in the feed's list, only shown where the task is.
  if (event === "progress") {
    if (A.current && A.current.onProgress) A.current.onProgress(ev);
    return;
  }
  A.recent.unshift(ev);
  if (A.recent.length > 200) A.recent.length = 200;
  const page = A.current;
  if (page && page.onEvent) page.onEvent(ev);
}
async function follow() {
  let backoff = 500;
  for (;;) {
    try {
      if (!A.live.after) A.live.after = (await A.api("GET", "/api/v1/events/head")).after;
      const res = await fetch("/api/v1/events?after=" + encodeURIComponent(A.live.after), {
        headers: A.authHeaders(), cache: "no-store",
      });
      if (res.status === 410) { A.live.after = null; A.refresh(); continue; }
      if (res.status === 401) {
        if (await A.askToken("the live feed needs a token that may read")) continue;
        throw new ApiError(401, null);
      }
      if (!res.ok || !res.body) throw new Error("events: HTTP " + res.status);
      setLive(true);
      backoff = 500;
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value.replace(/\r\n?/g, "\n");
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          dispatch(buf.slice(0, i));
          buf = buf.slice(i + 2);
        }
      }
    } catch (e) {
      // Refused a token: wait for one (given at the page's next ask) instead of asking
      // again and again. Network errors are expected while a server restarts or
      // upgrades: retried below.
      if (e instanceof ApiError && e.status === 401) {
        setLive(false, "no token");
        await new Promise((r) => window.addEventListener("artex-token", r, { once: true }));
        continue;
      }
    }
    setLive(false, "reconnecting");
    await A.sleep(backoff);
    backoff = Math.min(backoff * 2, 8000);
    try {
      const h = await fetch("/health", { cache: "no-store" });
      if (h.ok) A.refresh();
    } catch (_) { /* still down: try again */ }
  }
}

// ---- router -------------------------------------------------------------------------
// #/page/arg?query → A.pages[page].show(main, arg, params). A page may define
// onEvent(ev) (live updates) and leave() (stop timers). A.refresh() reads it again; a
// failed read leaves the page as it was, for the next event or reconnection to redo
// (as the pages' own live reloads do), instead of an unhandled rejection.
A.route = function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, qs] = hash.split("?");
  const [name, ...rest] = (path || "").split("/");
  const page = A.pages[name || "overview"] || A.pages.overview;
  if (A.current && A.current.leave) A.current.leave();
  A.current = page;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("on", a.dataset.nav === page.name);
  A.arg = rest.join("/") || null;
  const main = document.getElementById("main");
  A.replace(main);
  page.show(main, A.arg, new URLSearchParams(qs || "")).catch((e) => A.failed(main, e));
};
A.refresh = () => { if (A.current && A.current.reload) A.current.reload().catch(() => {}); };
A.failed = function failed(main, e) {
  A.replace(main, A.h("p", { class: "error" }, e.message || String(e)),
    A.h("p", { class: "muted" }, e.status === 404 ? "Not found." : "Is the server up? The page retries when the feed reconnects."));
};

// Calls fn at most once per `ms`, the last call always honoured (live refreshes).
A.throttle = function throttle(fn, ms) {
  let timer = null, again = false;
  return function run() {
    if (timer) { again = true; return; }
    fn();
    timer = setTimeout(() => { timer = null; if (again) { again = false; run(); } }, ms);
  };
};

window.addEventListener("DOMContentLoaded", () => {
  window.addEventListener("hashchange", A.route);
  document.getElementById("who").addEventListener("click", () => A.askToken("another token: its scope decides what the page offers"));
  A.whoami();
  A.route();
  follow();
});
