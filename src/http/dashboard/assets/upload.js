// The upload page: picks a file and hands it to a Web Worker (upload-worker.js) that
// sends it in chunks as it reads and hashes it, gives the whole file's sha256 at the end
// and resumes an interrupted upload; then follows the task the worker process wrote
// until it ends. Uploads go to the process serving this
// page: a worker (artex up, artex worker --api), which keeps the file where its task runs.
"use strict";
(function () {
  const { h } = A;
  const MiB = 1024 * 1024;
  const resumeKey = (f) => "artex.upload." + [f.name, f.size, f.lastModified].join("|");
  let worker = null;

  const upload = {
    name: "upload",
    async show(main) {
      const form = h("form", { id: "upload-form", class: "filters" },
        h("label", {}, "file", h("input", { type: "file", name: "file", id: "upload-file", required: true })),
        h("label", {}, "kind", h("input", { name: "kind", id: "upload-kind", value: "digest", size: 10, required: true })),
        h("label", {}, "payload (JSON)", h("input", { name: "payload", id: "upload-payload", value: "{}", size: 16 })),
        h("label", {}, "chunk MiB", h("input", { name: "chunk", type: "number", min: 1, max: 64, value: 10, id: "upload-chunk" })),
        h("label", {}, "in flight", h("input", { name: "parallel", type: "number", min: 1, max: 10, value: 4 })),
        h("button", { type: "submit", class: "primary", id: "upload-start" }, "Upload"));
      form.addEventListener("submit", (e) => { e.preventDefault(); start(form).catch((err) => say(err.message, true)); });
      A.add(main, h("h1", {}, "Upload a file"),
        h("p", { class: "muted" }, "The file goes to this worker in chunks as it is read, each acknowledged once on disk, and is checked whole (its sha256) at the end; an interrupted upload resumes where it stopped (pick the same file again). Then a task of the kind given runs on it here."),
        form,
        h("p", {}, "read and hashed"), h("div", { class: "bar" }, h("div", { id: "hash-bar" })),
        h("p", {}, "sent (acknowledged)"), h("div", { class: "bar" }, h("div", { id: "send-bar" })),
        h("p", { id: "upload-state", class: "muted" }, "No upload yet."),
        h("p", {}, "task: ", h("span", { id: "upload-task" }, "-"), " ", h("span", { id: "upload-task-status" })));
    },
    leave() { if (worker) { worker.terminate(); worker = null; } },
    onEvent(ev) { if (ev.task_id === upload.task) follow(); },
  };
  A.pages.upload = upload;

  function say(text, bad) {
    const el = document.getElementById("upload-state");
    if (el) { el.textContent = text; el.className = bad ? "error" : "muted"; }
  }
  const bar = (id, part) => { const el = document.getElementById(id); if (el) el.style.width = (100 * part).toFixed(1) + "%"; };

  async function start(form) {
    const file = form.querySelector("#upload-file").files[0];
    if (!file) throw new Error("pick a file first");
    let payload;
    try { payload = JSON.parse(form.querySelector("#upload-payload").value || "{}"); } catch (e) { throw new Error("payload: not JSON: " + e.message); }
    const canWrite = A.caller && A.caller.by !== "public" && A.caller.scope !== "read";
    if (!canWrite && !(await A.askToken("uploads need a token of the write scope"))) throw new Error("no write token");
    const data = new FormData(form);
    const key = resumeKey(file);
    const saved = JSON.parse(localStorage.getItem(key) || "null");
    if (worker) worker.terminate();
    worker = new Worker(document.body.dataset.uploadWorker);
    upload.task = null;
    A.replace(document.getElementById("upload-task"), "-");
    A.replace(document.getElementById("upload-task-status"));
    const button = document.getElementById("upload-start");
    button.disabled = true;
    say(saved ? "resuming upload " + saved.id + "…" : "starting…");
    worker.onmessage = (e) => {
      const m = e.data;
      // Read and hashed runs ahead of sent by a few chunks: the text follows what is sent.
      if (m.type === "hashing") bar("hash-bar", m.total ? m.done / m.total : 1);
      else if (m.type === "created") { localStorage.setItem(key, JSON.stringify({ id: m.id })); say("upload " + m.id + " created"); }
      else if (m.type === "progress") {
        bar("send-bar", m.size ? m.bytes / m.size : 1);
        say("sent " + m.sent + " of " + m.total + " chunks (" + (m.bytes / MiB).toFixed(1) + " of " + (m.size / MiB).toFixed(1) + " MiB)");
      } else if (m.type === "completing") say("every chunk sent; the worker checks the whole file (sha256 " + m.sha256.slice(0, 12) + "…)");
      else if (m.type === "retry") say(m.what + ": " + m.error + "; retry " + m.attempt + " in " + m.wait + " ms", true);
      else if (m.type === "done") {
        localStorage.removeItem(key);
        button.disabled = false;
        bar("send-bar", 1);
        say("upload " + m.id + " complete");
        upload.task = m.task;
        A.replace(document.getElementById("upload-task"), A.taskLink(m.task));
        follow();
      } else if (m.type === "error") {
        button.disabled = false;
        if (m.status === 401) sessionStorage.removeItem("artex.write");
        // The upload cannot become this file (it changed): the next try starts anew.
        if (m.forget) localStorage.removeItem(key);
        say(m.message + (m.forget ? "" : m.status === 401 ? " (the write token was refused: upload again to give another)" : " (upload again to resume)"), true);
      }
    };
    worker.postMessage({
      type: "start", file, kind: String(data.get("kind")), payload,
      chunkSize: Math.round(Number(data.get("chunk")) * MiB), parallel: Number(data.get("parallel")),
      token: A.token(), resumeId: saved && saved.id, sha256Url: document.body.dataset.sha256,
    });
  }

  // The task's status, read again at each of its events until it ends.
  const follow = A.throttle(async () => {
    const id = upload.task;
    if (!id) return;
    try {
      const { task } = await A.api("GET", "/api/v1/tasks/" + id);
      const el = document.getElementById("upload-task-status");
      if (el && upload.task === id) A.replace(el, A.status(task.status), task.result ? " " + JSON.stringify(task.result) : "", task.error ? " " + task.error : "");
    } catch (e) { say("task " + id + ": " + e.message, true); }
  }, 250);
})();
