// The upload page's Web Worker: creates the upload, then reads the file once, a chunk at
// a time in order, each chunk feeding the whole file's SHA-256 and hashed on its own; a
// chunk the worker process lacks goes out (`fetch`, a few in flight, each retried with
// backoff) as soon as it is hashed, and the whole file's sha256 is given with `complete`
// at the end: the first byte goes out at once, not after a hashing pass over the file.
// Resuming asks the worker process what is missing (GET /api/v1/uploads/{id}) and sends
// only that (every chunk is still read, for the whole file's sha256).
"use strict";
let token = "";
// Set once the outcome is told: chunks still in flight after a failure say no more.
let over = false;
const post = (m) => { if (!over) self.postMessage(m); };

self.onmessage = (e) => {
  const m = e.data;
  if (m.type !== "start") return;
  importScripts(m.sha256Url);
  token = m.token || "";
  run(m).then(
    (r) => { post(Object.assign({ type: "done" }, r)); over = true; },
    (err) => {
      post({ type: "error", message: err.message || String(err), status: err.status || 0, forget: !!err.forget });
      over = true;
    },
  );
};

const RETRIES = 8;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class HttpError extends Error {
  constructor(status, message, field) { super(message); this.status = status; this.field = field || null; }
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
      if (!transient) throw new HttpError(res.status, label + ": " + error, data && data.field);
    }
    if (attempt >= RETRIES) throw new HttpError(0, label + ": gave up after " + (attempt + 1) + " attempts: " + error);
    const wait = Math.min(10000, 250 * 2 ** attempt) * (0.5 + Math.random() / 2);
    post({ type: "retry", what: label, attempt: attempt + 1, wait: Math.round(wait), error });
    await sleep(wait);
  }
}

// The upload to send `file` to: the remembered one if the worker process can resume
// it, else a new one (its sha256 left for `complete`). `{id, chunk_size, chunks,
// missing, task, sha256}`.
async function open(m) {
  const file = m.file;
  if (m.resumeId) {
    try {
      const info = await call("GET", "/api/v1/uploads/" + m.resumeId, undefined, {}, "resume");
      return Object.assign({ id: m.resumeId }, info);
    } catch (err) {
      // Expired or unknown there (404), or left by an earlier build that cannot resume
      // it (409): start again. Kept, it would be refused at every attempt.
      if (err.status !== 404 && err.status !== 409) throw err;
    }
  }
  const created = await call("POST", "/api/v1/uploads", JSON.stringify({
    size: file.size, name: file.name, chunk_size: m.chunkSize,
    task: { kind: m.kind, payload: m.payload },
  }), { "Content-Type": "application/json" }, "create").catch((err) => {
    if (err.status === 404) {
      throw new HttpError(404, "this process takes no uploads (artex serve keeps no files): " +
        "open the dashboard on a worker's port (artex up, or artex worker --api)");
    }
    throw err;
  });
  post({ type: "created", id: created.id });
  return {
    id: created.id, chunk_size: created.chunk_size, chunks: created.chunks,
    missing: Array.from({ length: created.chunks }, (_, n) => n), task: null, sha256: null,
  };
}

// The upload is no use any more (its chunks are not this file's): the page forgets it.
function changed(id, why) {
  const err = new HttpError(422, "the file changed since upload " + id + " started (" + why +
    "); that upload is forgotten: upload the file again to send it anew");
  err.forget = true;
  return err;
}

async function run(m) {
  const file = m.file;
  const up = await open(m);
  const id = up.id;
  if (up.task) return { id, task: up.task };
  const chunkSize = up.chunk_size, total = up.chunks;
  if (!(chunkSize > 0)) throw new Error("upload " + id + ": the worker answered a chunk size of " + chunkSize);
  const lengthOf = (n) => Math.min(chunkSize, file.size - n * chunkSize);
  const missing = new Set(up.missing);
  let sent = total - missing.size;
  let bytes = file.size;
  for (const n of missing) bytes -= lengthOf(n);
  const progress = () => post({ type: "progress", sent, total, bytes, size: file.size });
  progress();

  // One reader, in order; at most `parallel` chunks in flight and one more read ahead
  // (the reader waits for a free slot): memory stays a few chunks whatever the size.
  const parallel = Math.max(1, Math.min(10, m.parallel || 1));
  let inFlight = 0, failure = null, task = null, settled = () => {};
  const send = async (n, body, sha) => {
    const answer = await call("PUT", "/api/v1/uploads/" + id + "/chunks/" + n, body, { "Chunk-Sha256": sha }, "chunk " + n);
    // An upload whose sha256 was declared when it started (by an older page) writes its
    // task with its last chunk.
    if (answer && answer.task) task = answer.task;
    sent++;
    bytes += body.length;
    progress();
  };
  const oneSettled = () => new Promise((r) => { settled = r; });
  const whole = new Sha256();
  for (let n = 0; n < total; n++) {
    if (failure) throw failure;
    const off = n * chunkSize;
    const chunk = new Uint8Array(await file.slice(off, off + lengthOf(n)).arrayBuffer());
    if (chunk.length !== lengthOf(n)) throw changed(id, "chunk " + n + " read " + chunk.length + " bytes, not " + lengthOf(n));
    whole.update(chunk);
    post({ type: "hashing", done: off + chunk.length, total: file.size });
    if (!missing.has(n)) continue;
    // The bytes sent are the bytes hashed: a 422 for this chunk is no file change.
    const sha = new Sha256().update(chunk).hex();
    while (inFlight >= parallel && !failure) await oneSettled();
    if (failure) throw failure;
    inFlight++;
    send(n, chunk, sha).catch((err) => { failure = failure || err; }).finally(() => { inFlight--; settled(); });
  }
  while (inFlight > 0 && !failure) await oneSettled();
  if (failure) throw failure;
  post({ type: "hashing", done: file.size, total: file.size });
  if (task) return { id, task };

  const sha256 = whole.hex();
  if (up.sha256 && up.sha256 !== sha256) throw changed(id, "it was declared of sha256 " + up.sha256 + ", the file's is now " + sha256);
  post({ type: "completing", id, sha256 });
  try {
    const done = await call("POST", "/api/v1/uploads/" + id + "/complete", JSON.stringify({ sha256 }),
      { "Content-Type": "application/json" }, "complete");
    return { id, task: done.task };
  } catch (err) {
    // No field: what arrived does not make the file read now, and the worker discarded
    // it. With a field: the sha256 differs from the one declared at the start.
    if (err.status === 422 && !err.field) throw changed(id, "the worker found that the chunks it holds do not make a file of sha256 " + sha256 + ", and discarded them");
    if (err.status === 422) throw changed(id, err.message);
    // Completed by an earlier attempt whose answer was lost: its task is the one.
    if (err.status !== 409) throw err;
    const now = await call("GET", "/api/v1/uploads/" + id, undefined, {}, "status");
    if (now.task) return { id, task: now.task };
    throw err;
  }
}
