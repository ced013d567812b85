// The upload page's Web Worker: hashes the file (whole and per chunk) with the
// incremental SHA-256, creates the upload, sends the missing chunks with `fetch`, a few
// in flight, each retried with backoff, and reports progress to the page. Resuming asks
// the worker process what is missing (GET /api/v1/uploads/{id}) and sends only that.
"use strict";
let token = "";

self.onmessage = (e) => {
  const m = e.data;
  if (m.type !== "start") return;
  importScripts(m.sha256Url);
  token = m.token || "";
  run(m).then(
    (r) => self.postMessage(Object.assign({ type: "done" }, r)),
    (err) => self.postMessage({ type: "error", message: err.message || String(err), status: err.status || 0 }),
  );
};

const RETRIES = 8;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// A JSON call; network errors and 5xx/408/429 answers are retried with backoff.
async function call(method, path, body, headers, label) {
  for (let attempt = 0; ; attempt++) {
    let res = null, error;
    try {
      res = await fetch(path, {
        method,
        headers: Object.assign({ Authorization: "Bearer " + token }, headers || {}),
        body,
        cache: "no-store",
      });
    } catch (err) {
      error = err.message || String(err);
    }
    if (res) {
      const text = await res.text();
      let data = null;
      try { data = text ? JSON.parse(text) : null; } catch (_) { data = { error: text }; }
      if (res.ok) return data;
      error = (data && data.error) || "HTTP " + res.status;
      const transient = res.status >= 500 && res.status !== 507 || res.status === 408 || res.status === 429;
      if (!transient) throw new HttpError(res.status, label + ": " + error);
    }
    if (attempt >= RETRIES) throw new HttpError(0, label + ": gave up after " + (attempt + 1) + " attempts: " + error);
    const wait = Math.min(10000, 250 * 2 ** attempt) * (0.5 + Math.random() / 2);
    self.postMessage({ type: "retry", what: label, attempt: attempt + 1, wait: Math.round(wait), error });
    await sleep(wait);
  }
}

async function hashSlice(blob) {
  return new Sha256().update(await blob.arrayBuffer()).hex();
}

// The file's sha256 and each chunk's, reading one chunk at a time.
async function hashFile(file, chunkSize) {
  const whole = new Sha256();
  const chunks = [];
  for (let off = 0; off < file.size || (off === 0 && chunks.length === 0); off += chunkSize) {
    const bytes = new Uint8Array(await file.slice(off, off + chunkSize).arrayBuffer());
    whole.update(bytes);
    chunks.push(new Sha256().update(bytes).hex());
    self.postMessage({ type: "hashing", done: Math.min(file.size, off + chunkSize), total: file.size });
    if (file.size === 0) break;
  }
  return { sha256: whole.hex(), chunks };
}

async function run(m) {
  const file = m.file;
  let id = m.resumeId || null, info = null, hashes = null, hashedWith = 0;
  if (id) {
    try {
      info = await call("GET", "/api/v1/uploads/" + id, undefined, {}, "resume");
    } catch (err) {
      // Expired or unknown there (404), or left by an earlier build that cannot resume
      // it (409): start again. Kept, it would be refused at every attempt.
      if (err.status !== 404 && err.status !== 409) throw err;
      id = null;
    }
  }
  if (!id) {
    const h = await hashFile(file, m.chunkSize);
    hashes = h.chunks;
    hashedWith = m.chunkSize;
    const created = await call("POST", "/api/v1/uploads", JSON.stringify({
      size: file.size, sha256: h.sha256, name: file.name, chunk_size: m.chunkSize,
      task: { kind: m.kind, payload: m.payload },
    }), { "Content-Type": "application/json" }, "create").catch((err) => {
      if (err.status === 404) {
        throw new HttpError(404, "this process takes no uploads (artex serve keeps no files): " +
          "open the dashboard on a worker's port (artex up, or artex worker --api)");
      }
      throw err;
    });
    id = created.id;
    self.postMessage({ type: "created", id, sha256: h.sha256 });
    info = await call("GET", "/api/v1/uploads/" + id, undefined, {}, "status");
  }
  if (info.task) return { id, task: info.task };
  const chunkSize = info.chunk_size;
  const missing = info.missing.slice();
  const total = info.chunks;
  let sent = total - missing.length, last = null;
  self.postMessage({ type: "progress", sent, total, bytes: Math.min(file.size, sent * chunkSize), size: file.size });
  const next = async () => {
    for (let n = missing.shift(); n !== undefined; n = missing.shift()) {
      const blob = file.slice(n * chunkSize, Math.min(file.size, (n + 1) * chunkSize));
      let sha = hashes && hashedWith === chunkSize ? hashes[n] : await hashSlice(blob);
      for (let mismatch = 0; ; mismatch++) {
        try {
          last = await call("PUT", "/api/v1/uploads/" + id + "/chunks/" + n, blob, { "Chunk-Sha256": sha }, "chunk " + n);
          break;
        } catch (err) {
          // 422: the bytes read did not hash as declared (a file changed under us?): read
          // and hash the chunk again, once.
          if (err.status !== 422 || mismatch > 0) throw err;
          sha = await hashSlice(blob);
        }
      }
      sent++;
      self.postMessage({ type: "progress", sent, total, bytes: Math.min(file.size, sent * chunkSize), size: file.size });
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(10, m.parallel)) }, next));
  if (last && last.task) return { id, task: last.task };
  const now = await call("GET", "/api/v1/uploads/" + id, undefined, {}, "status");
  if (now.task) return { id, task: now.task };
  const done = await call("POST", "/api/v1/uploads/" + id + "/complete", undefined, {}, "complete");
  return { id, task: done.task };
}
