// Pages: the overview (counts, sparklines, backlog age), the task list (filters, search
// by id, keyset "more"), a task (its timeline, payload, result, error, controls), the
// cron schedules (next and last slot, pause and resume) and the live feed. Each is { name, show(main, arg, params), onEvent?, reload?, leave? }.
"use strict";
(function () {
  const { h } = A;
  const STATUSES = ["pending", "blocked", "paused", "assigned", "running", "succeeded", "failed", "timeout", "canceled"];
  const ENDED = ["succeeded", "failed", "timeout", "canceled"];

  // A sparkline of `values` (oldest first) as an SVG polyline.
  A.spark = function spark(values, label) {
    const w = 200, hgt = 40;
    const max = Math.max(1, ...values.filter((v) => v !== null));
    const step = values.length > 1 ? w / (values.length - 1) : w;
    const pts = values.map((v, i) => (i * step).toFixed(1) + "," + (hgt - 2 - ((v || 0) / max) * (hgt - 4)).toFixed(1));
    return A.svg("svg", { class: "spark", viewBox: "0 0 " + w + " " + hgt, preserveAspectRatio: "none", role: "img", "aria-label": label },
      A.svg("title", {}, label), A.svg("polyline", { points: pts.join(" ") }));
  };

  // ---- overview ---------------------------------------------------------------------
  let overviewTimer = null;
  const overview = {
    name: "overview",
    async show(main) {
      A.add(main, h("h1", {}, "Overview"), h("div", { id: "overview" }, h("p", { class: "muted" }, "Loading…")));
      await overview.reload();
      clearInterval(overviewTimer);
      // The minute rolls on without events too.
      overviewTimer = setInterval(() => overview.reload(), 15000);
    },
    leave() { clearInterval(overviewTimer); },
    async reload() {
      const box = document.getElementById("overview");
      if (!box) return;
      // A sample of 20,000 recent tasks: plenty for the figures, a fifth of the default cost.
      const [s, declared] = await Promise.all([A.api("GET", "/api/v1/stats?sample=20000"), A.api("GET", "/api/v1/kinds")]);
      const r = s.recent;
      const cards = STATUSES.map((st) => h("div", { class: "card", "data-count": st },
        h("div", { class: "n" }, (s.capped.includes(st) ? "≥ " : "") + s.by_status[st]),
        h("div", { class: "l" }, h("a", { href: "#/tasks?status=" + st }, st))));
      const per = r.per_minute || [];
      const backlog = s.backlog || {};
      const latest = per.length ? per[per.length - 1] : {};
      const kinds = Object.entries(r.by_kind || {});
      A.replace(box,
        h("div", { class: "cards" }, cards),
        h("h2", {}, "Last " + r.window_minutes + " minutes"),
        h("div", { class: "cards" },
          h("div", { class: "card wide", "data-metric": "throughput" },
            h("div", { class: "n" }, r.throughput_per_minute.toFixed(1), h("span", { class: "l" }, " /min")),
            h("div", { class: "l" }, "finished per minute (" + r.finished + (r.sampled ? ", sampled" : "") + ")"),
            A.spark(per.map((m) => m.finished), "tasks finished per minute")),
          h("div", { class: "card wide", "data-metric": "latency" },
            h("div", { class: "n" }, A.ms(r.run_ms.p50), h("span", { class: "l" }, " p50 run")),
            h("div", { class: "l" }, "p95 " + A.ms(r.run_ms.p95) + " · queue p50 " + A.ms(r.queue_ms.p50)),
            A.spark(per.map((m) => m.run_avg_ms), "mean run time per minute")),
          h("div", { class: "card", "data-metric": "backlog" },
            h("div", { class: "n" }, backlog.age_ms === null || backlog.age_ms === undefined ? "-" : A.ms(backlog.age_ms)),
            h("div", { class: "l" }, "backlog age (oldest runnable pending task)")),
          h("div", { class: "card" }, h("div", { class: "n" }, latest.finished || 0), h("div", { class: "l" }, "finished this minute")),
          (declared.paused || []).length
            ? h("div", { class: "card", "data-metric": "paused-kinds", title: declared.paused.map((p) => p.kind + (p.reason ? ": " + p.reason : "")).join("\n") },
              h("div", { class: "n" }, declared.paused.length),
              h("div", { class: "l" }, h("a", { href: "#/kinds" }, "paused kind(s)"), ": " + declared.paused.map((p) => p.kind).join(", ")))
            : null,
          s.replica
            ? h("div", { class: "card", "data-metric": "replica-lag", title: "replayed up to " + (s.replica.replay_lsn || "-") + " of the primary's " + s.replica.primary_lsn },
              h("div", { class: "n" }, A.ms(s.replica.lag_ms)),
              h("div", { class: "l" }, "replica lag (" + (s.replica.lag_bytes === null ? "not a standby" : s.replica.lag_bytes + " WAL bytes behind") + "); lists and counts come from it"))
            : null),
        h("h2", {}, "By kind (finished in the window)"),
        kinds.length
          ? h("div", { class: "table" }, h("table", {},
            h("thead", {}, h("tr", {}, h("th", {}, "kind"), ENDED.map((st) => h("th", { class: "num" }, st)))),
            h("tbody", {}, kinds.map(([k, c]) => h("tr", { "data-kind": k }, h("td", {}, h("a", { href: "#/tasks?kind=" + encodeURIComponent(k) }, k)),
              ENDED.map((st) => h("td", { class: "num" }, c[st] || 0)))))))
          : h("p", { class: "muted" }, "Nothing finished in the window."),
        h("h2", {}, "Kinds and their retry policies"),
        declared.kinds.length
          ? h("div", { class: "table" }, h("table", { id: "kinds" },
            h("thead", {}, h("tr", {}, h("th", {}, "kind"), h("th", {}, "retry"), h("th", { class: "hide-sm" }, "last declared"))),
            h("tbody", {}, declared.kinds.map((k) => h("tr", { "data-kind": k.kind },
              h("td", {}, h("a", { href: "#/tasks?kind=" + encodeURIComponent(k.kind) }, k.kind)),
              h("td", { class: "retry", "data-backoff": k.retry ? k.retry.backoff : "default" }, A.policy(k.retry)),
              h("td", { class: "hide-sm", title: k.last_seen }, A.ago(k.last_seen)))))))
          : h("p", { class: "muted" }, "No worker has declared a kind yet."),
        h("p", { class: "muted" }, "As of " + A.time(s.at) + "."));
    },
  };
  overview.onEvent = A.throttle(() => overview.reload().catch(() => {}), 1000);
  A.pages.overview = overview;

  // ---- tasks ------------------------------------------------------------------------
  const FILTERS = ["status", "kind", "flow", "worker", "tag", "since", "until", "where"];
  const BULK = { retry: "retried", cancel: "canceled", delete: "deleted" };
  const tasks = {
    name: "tasks",
    shown: 0,
    async show(main, arg, params) {
      if (arg) return A.pages.task.show(main, arg, params);
      const form = h("form", { class: "filters", id: "task-filters" },
        h("label", {}, "status", h("select", { name: "status" }, h("option", { value: "" }, "any"),
          STATUSES.map((s) => h("option", { value: s, selected: params.get("status") === s }, s)))),
        h("label", {}, "kind", h("input", { name: "kind", value: params.get("kind") || "", size: 10 })),
        h("label", {}, "flow", h("input", { name: "flow", value: params.get("flow") || "", size: 14, placeholder: "flow id" })),
        h("label", {}, "worker", h("input", { name: "worker", value: params.get("worker") || "", size: 14 })),
        h("label", {}, "tag", h("input", { name: "tag", value: params.get("tag") || "", size: 10 })),
        h("label", {}, "since", h("input", { name: "since", value: params.get("since") || "", size: 20, placeholder: "2026-12-01T08:00:00Z" })),
        h("label", {}, "until", h("input", { name: "until", value: params.get("until") || "", size: 20 })),
        h("label", {}, "payload has", h("input", { name: "where", value: params.get("where") || "", size: 16, placeholder: '{"customer":42}' })),
        h("button", { type: "submit" }, "Filter"),
        h("label", {}, "task id", h("input", { name: "id", id: "task-search", size: 20, placeholder: "go to a task id" })));
      form.addEventListener("submit", (e) => {
        e.preventDefault();
        const data = new FormData(form);
        const id = String(data.get("id") || "").trim();
        if (id) { location.hash = "#/tasks/" + id; return; }
        const q = new URLSearchParams();
        for (const f of FILTERS) if (String(data.get(f) || "").trim()) q.set(f, String(data.get(f)).trim());
        location.hash = "#/tasks" + (q.toString() ? "?" + q : "");
      });
      form.querySelector("select").addEventListener("change", () => form.requestSubmit());
      // Bulk actions on every task the filters match (never on all tasks from here).
      const filtered = FILTERS.some((f) => params.get(f));
      const bulk = filtered
        ? h("div", { class: "actions", id: "bulk" }, h("span", { class: "muted" }, "every matching task: "),
          Object.keys(BULK).map((action) => bulkButton(action)))
        : null;
      A.add(main, h("h1", {}, "Tasks"), form, bulk,
        h("div", { class: "table" }, h("table", { id: "task-table" },
          h("thead", {}, h("tr", {}, h("th", {}, "id"), h("th", {}, "kind"), h("th", {}, "status"),
            h("th", { class: "hide-sm" }, "worker"), h("th", { class: "num hide-sm" }, "retries"),
            h("th", { class: "hide-sm" }, "tags"), h("th", {}, "updated"))),
          h("tbody", { id: "task-rows" }))),
        h("p", {}, h("button", { id: "more", hidden: true }, "more")), h("p", { id: "flash" }));
      document.getElementById("more").addEventListener("click", () => tasks.page(tasks.next, 50, true));
      tasks.params = params;
      await tasks.page(null, 50, false);
    },
    query(after, limit) {
      const q = new URLSearchParams();
      for (const f of FILTERS) if (tasks.params.get(f)) q.set(f, tasks.params.get(f));
      q.set("limit", String(limit));
      if (after) q.set("after", after);
      return "/api/v1/tasks?" + q;
    },
    async page(after, limit, append) {
      const body = document.getElementById("task-rows");
      if (!body) return;
      const res = await A.api("GET", tasks.query(after, limit));
      const rows = res.tasks.map((t) => h("tr", { "data-task": t.id },
        h("td", {}, A.taskLink(t.id)), h("td", {}, t.kind),
        h("td", { class: "st" }, A.status(t.status), " ", A.progress(t.progress, t.progress_message, true)),
        h("td", { class: "hide-sm mono" }, t.worker || "-"), h("td", { class: "num hide-sm" }, t.retries),
        h("td", { class: "hide-sm" }, (t.tags || []).map((g) => h("span", { class: "tag" }, g))),
        h("td", { title: t.updated_at }, A.ago(t.updated_at))));
      if (append) body.append(...rows); else A.replace(body, ...rows);
      if (!body.children.length) body.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No tasks.")));
      tasks.shown = append ? tasks.shown + res.tasks.length : res.tasks.length;
      tasks.next = res.next;
      document.getElementById("more").hidden = !res.next;
    },
    // Live: the rows shown are read again (at most 500), keeping the place in the list.
    reload() { return tasks.page(null, Math.min(500, Math.max(50, tasks.shown)), false); },
  };
  // The filters as a bulk action's `filter` (the API's names; `where` as JSON).
  function bulkFilter() {
    const f = {};
    for (const k of FILTERS) {
      const v = tasks.params.get(k);
      if (v) f[k] = k === "where" ? JSON.parse(v) : v;
    }
    return f;
  }
  // Counts the matches first (a dry run), says how many in the confirmation, then acts.
  function bulkButton(action) {
    const b = h("button", { class: action === "retry" ? "" : "danger", "data-bulk": action, "data-needs": "write" }, action + " all");
    b.addEventListener("click", async () => {
      let filter;
      try { filter = bulkFilter(); } catch (e) { A.flash("payload filter: not JSON (" + e.message + ")", true); return; }
      b.disabled = true;
      try {
        const dry = await A.api("POST", "/api/v1/tasks/bulk", { action, filter, dry_run: true });
        const ok = await A.confirm(action + " " + dry.matched + " task(s)?",
          action + " every task matching the filters: " + dry.matched + " now (those it does not apply to are left as they are).");
        if (!ok) return;
        const r = await A.api("POST", "/api/v1/tasks/bulk", ok.reason ? { action, filter, reason: ok.reason } : { action, filter });
        A.flash(BULK[action] + " " + r.changed + " of " + r.matched + " matching task(s) in " + r.batches + " batch(es)");
        await tasks.reload();
      } catch (e) {
        A.flash(action + " refused: " + e.message, true);
      } finally {
        b.disabled = false;
      }
    });
    return b;
  }
  tasks.onEvent = A.throttle(() => { if (document.getElementById("task-rows")) tasks.reload().catch(() => {}); }, 1000);
  // A running task's progress: its row's bar, in place (no read).
  tasks.onProgress = (ev) => {
    const cell = document.querySelector('#task-rows tr[data-task="' + ev.task_id + '"] td.st');
    if (!cell) return;
    const old = cell.querySelector(".progress");
    const bar = A.progress(ev.progress, ev.message, true);
    if (old) old.replaceWith(bar); else cell.append(" ", bar);
  };
  A.pages.tasks = tasks;

  // ---- one task ---------------------------------------------------------------------
  const task = {
    name: "tasks",
    async show(main, id) {
      task.id = id;
      A.add(main, h("h1", {}, "Task ", h("span", { class: "mono" }, id)), h("div", { id: "task" }, h("p", { class: "muted" }, "Loading…")));
      await task.reload();
    },
    async reload() {
      const box = document.getElementById("task");
      if (!box) return;
      const id = task.id;
      const { task: t, transitions } = await A.api("GET", "/api/v1/tasks/" + encodeURIComponent(id) + "?full=true");
      if (task.id !== id) return;
      const controls = [];
      if (["pending", "blocked"].includes(t.status)) controls.push("pause");
      if (t.status === "paused") controls.push("resume");
      if (!ENDED.includes(t.status)) controls.push("cancel");
      if (ENDED.includes(t.status) && t.status !== "succeeded") controls.push("retry");
      const actions = controls.map((c) => c === "retry" ? retryButton(t.id) : A.controlButton("task", t.id, c, () => task.reload()));
      A.replace(box,
        h("p", {}, h("span", { id: "task-status" }, A.status(t.status)), " ", t.kind),
        h("div", { class: "actions" }, actions), h("p", { id: "flash" }),
        h("dl", { class: "kv" },
          h("dt", {}, "progress"), h("dd", { id: "task-progress" }, A.progress(t.progress, t.progress_message) || "-"),
          h("dt", {}, "worker"), h("dd", { class: "mono", id: "task-worker" }, t.worker || "-"),
          h("dt", {}, "retries"), h("dd", {}, t.retries + " of " + t.max_retries),
          h("dt", {}, "priority"), h("dd", {}, t.priority),
          t.flow_id && [h("dt", {}, "flow"), h("dd", {}, h("a", { href: "#/flows/" + t.flow_id, class: "mono" }, t.flow_id), " ", t.flow_task || "")],
          t.unique_key && [h("dt", {}, "unique key"), h("dd", { class: "mono", id: "task-unique-key" }, t.unique_key)],
          t.tags && t.tags.length ? [h("dt", {}, "tags"), h("dd", { id: "task-tags" }, t.tags.map((g) => h("a", { class: "tag", href: "#/tasks?tag=" + encodeURIComponent(g) }, g)))] : null,
          t.limit_key && [h("dt", {}, "limit key"), h("dd", { class: "mono", id: "task-limit-key" }, t.limit_key)],
          h("dt", {}, "created"), h("dd", {}, A.time(t.created_at)),
          h("dt", {}, "run at"), h("dd", {}, A.time(t.run_at)),
          h("dt", {}, "started"), h("dd", {}, A.time(t.started_at)),
          h("dt", {}, "finished"), h("dd", {}, A.time(t.finished_at))),
        h("h2", {}, "Timeline"),
        h("ol", { class: "timeline", id: "timeline" }, transitions.map((x) => h("li", { "data-to": x.to_status },
          A.status(x.to_status), " ", h("span", { class: "muted" }, A.time(x.at)), " ", x.actor,
          x.worker ? [" on ", h("span", { class: "mono" }, x.worker)] : null,
          x.reason ? h("div", { class: "muted" }, x.reason) : null))),
        h("h2", {}, "Payload"), A.json(t.payload),
        h("h2", {}, "Result"), A.json(t.result),
        t.error ? [h("h2", {}, "Error"), h("pre", { class: "error" }, t.error)] : null,
        t.checkpoint ? [h("h2", {}, "Checkpoint"), A.json(t.checkpoint)] : null);
    },
  };
  function retryButton(id) {
    const b = h("button", { "data-action": "retry", "data-needs": "write" }, "retry");
    b.addEventListener("click", async () => {
      const ok = await A.confirm("retry task?", "Submit a new task like " + id + ".");
      if (!ok) return;
      try {
        const r = await A.api("POST", "/api/v1/tasks/" + id + "/retry", ok.reason ? { reason: ok.reason } : {});
        location.hash = "#/tasks/" + r.id;
      } catch (e) { A.flash("retry refused: " + e.message, true); }
    });
    return b;
  }
  const taskReload = A.throttle(() => task.reload().catch(() => {}), 250);
  task.onEvent = (ev) => { if (ev.task_id === task.id) taskReload(); };
  task.onProgress = (ev) => {
    const dd = document.getElementById("task-progress");
    if (dd && ev.task_id === task.id) A.replace(dd, A.progress(ev.progress, ev.message));
  };
  A.pages.task = task;
  // #/tasks/ID lands on the tasks page object: forward its events.
  tasks.onEventList = tasks.onEvent;
  tasks.onEvent = (ev) => (A.arg ? task.onEvent(ev) : tasks.onEventList(ev));
  tasks.onProgressList = tasks.onProgress;
  tasks.onProgress = (ev) => (A.arg ? task.onProgress(ev) : tasks.onProgressList(ev));
  const listReload = tasks.reload;
  tasks.reload = () => (A.arg ? task.reload() : listReload());

  // ---- kinds ------------------------------------------------------------------------
  // Makes a kind fair (round-robin across its limit keys) or ends it, keeping its other
  // limits: PUT them with `fair` flipped, or DELETE them when fairness was all there was.
  function fairButton(k, l) {
    const on = !!(l && l.fair);
    const b = h("button", { "data-action": on ? "unfair" : "fair", "data-needs": "write" }, on ? "end" : "make fair");
    b.addEventListener("click", async () => {
      const ok = await A.confirm((on ? "end fairness of " : "make fair: ") + k + "?",
        on ? "Hand its tasks out by priority alone." : "Hand its tasks out round-robin across their limit keys.");
      if (!ok) return;
      const body = { fair: !on };
      if (l && l.concurrency !== null) body.concurrency = l.concurrency;
      if (l && l.key_concurrency !== null) body.key_concurrency = l.key_concurrency;
      if (l && l.rate_per_sec !== null) body.rate = l.rate_per_sec + "/s";
      const path = "/api/v1/kinds/" + encodeURIComponent(k) + "/limits";
      b.disabled = true;
      try {
        if (Object.keys(body).length === 1 && on) await A.api("DELETE", path);
        else await A.api("PUT", path, body);
        A.flash(k + (on ? ": by priority" : ": fair across its keys"));
      } catch (e) {
        A.flash("refused: " + e.message, true);
      } finally {
        b.disabled = false;
        kinds.reload();
      }
    });
    return b;
  }
  // The kinds workers declared and each kind's fleet-wide limits, with what they count;
  // paused kinds, and a button to pause or resume each.
  const kinds = {
    name: "kinds",
    async show(main) {
      A.add(main, h("h1", {}, "Kinds"), h("p", { id: "flash" }), h("div", { id: "kinds-page" }, h("p", { class: "muted" }, "Loading…")));
      await kinds.reload();
    },
    async reload() {
      const box = document.getElementById("kinds-page");
      if (!box) return;
      const { kinds: declared, limits, paused } = await A.api("GET", "/api/v1/kinds");
      const retry = new Map(declared.map((k) => [k.kind, k.retry]));
      const byKind = new Map(limits.map((l) => [l.kind, l]));
      const pauses = new Map((paused || []).map((p) => [p.kind, p]));
      const names = [...new Set([...declared.map((k) => k.kind), ...limits.map((l) => l.kind), ...pauses.keys()])].sort();
      const rate = (r) => r === null ? "-" : r >= 1 ? +r.toFixed(3) + "/s" : r * 60 >= 1 ? +(r * 60).toFixed(3) + "/m" : +(r * 3600).toFixed(3) + "/h";
      A.replace(box, names.length
        ? h("div", { class: "table" }, h("table", { id: "kinds-table" },
          h("thead", {}, h("tr", {}, h("th", {}, "kind"), h("th", { class: "num" }, "held"), h("th", { class: "num" }, "concurrency"),
            h("th", { class: "num" }, "per key"), h("th", { class: "num" }, "rate"), h("th", {}, "across keys"), h("th", {}, "retry"), h("th", { class: "hide-sm" }, "limits set"),
            h("th", {}, "handed out"), h("th", {}, ""))),
          h("tbody", {}, names.map((k) => {
            const l = byKind.get(k);
            const p = pauses.get(k);
            return h("tr", { "data-kind": k, "data-paused": String(!!p) }, h("td", {}, h("a", { href: "#/tasks?kind=" + encodeURIComponent(k) }, k)),
              h("td", { class: "num" }, l ? l.held : "-"), h("td", { class: "num" }, l && l.concurrency !== null ? l.concurrency : "-"),
              h("td", { class: "num" }, l && l.key_concurrency !== null ? l.key_concurrency : "-"), h("td", { class: "num" }, l ? rate(l.rate_per_sec) : "-"),
              h("td", { "data-col": "fair" }, l && l.fair ? "round-robin" : "by priority", " ", fairButton(k, l)),
              h("td", { class: "retry" }, retry.has(k) ? A.policy(retry.get(k)) : "-"),
              h("td", { class: "hide-sm muted" }, l ? A.time(l.updated_at) + " by " + l.updated_by : "no limits"),
              h("td", { "data-col": "paused", title: p ? "since " + p.paused_at + " by " + p.paused_by : "" },
                p ? [A.status("paused"), p.reason ? h("span", { class: "muted" }, " " + p.reason) : null] : "yes"),
              h("td", {}, A.controlButton("kind", encodeURIComponent(k), p ? "resume" : "pause", () => kinds.reload())));
          }))))
        : h("p", { class: "muted" }, "No worker has declared a kind yet."),
        h("p", { class: "muted" }, "Set limits with artex kind limit K --concurrency N --key-concurrency N --rate 100/s [--fair], or PUT /api/v1/kinds/{kind}/limits. A fair kind's tasks are handed out round-robin across their limit keys; priority orders the tasks of a key. A paused kind's tasks stay pending until it is resumed (artex kind pause|resume K)."));
    },
  };
  kinds.onEvent = A.throttle(() => kinds.reload().catch(() => {}), 2000);
  A.pages.kinds = kinds;

  // ---- schedules --------------------------------------------------------------------
  // Slots fire on the planners' clock, not in the task feed: read again every five
  // seconds (a slot is a minute apart at least).
  let schedulesTimer = null;
  const schedules = {
    name: "schedules",
    async show(main) {
      A.add(main, h("h1", {}, "Schedules"),
        h("p", { class: "muted" }, "Each slot of a schedule's cron expression, read in its time zone, submits one task, once, whatever the number of planners."),
        h("p", { id: "flash" }),
        h("div", { class: "table" }, h("table", { id: "schedule-table" },
          h("thead", {}, h("tr", {}, h("th", {}, "name"), h("th", {}, "cron"), h("th", { class: "hide-sm" }, "time zone"),
            h("th", {}, "kind"), h("th", {}, "next slot"), h("th", {}, "last slot"), h("th", { class: "num hide-sm" }, "fired"), h("th", {}, ""))),
          h("tbody", { id: "schedule-rows" }, h("tr", {}, h("td", { colspan: 8, class: "muted" }, "Loading…"))))));
      await schedules.reload();
      clearInterval(schedulesTimer);
      schedulesTimer = setInterval(() => schedules.reload().catch(() => {}), 5000);
    },
    leave() { clearInterval(schedulesTimer); },
    async reload() {
      const body = document.getElementById("schedule-rows");
      if (!body) return;
      const { schedules: list } = await A.api("GET", "/api/v1/schedules");
      const rows = list.map((s) => h("tr", { "data-schedule": s.name, "data-paused": String(s.paused) },
        h("td", { class: "mono" }, s.name),
        h("td", { class: "mono" }, s.cron, " ", h("span", { class: "muted" }, "catch-up " + s.catch_up)),
        h("td", { class: "hide-sm" }, s.timezone),
        h("td", {}, s.kind),
        h("td", { "data-col": "next", title: s.next_slot || "" }, s.paused ? A.status("paused") : A.time(s.next_slot)),
        h("td", { "data-col": "last", title: s.last_slot || "" }, s.last_slot ? [A.time(s.last_slot), " ", s.last_task ? A.taskLink(s.last_task) : null] : "-"),
        h("td", { class: "num hide-sm" }, s.fired),
        h("td", {}, A.controlButton("schedule", encodeURIComponent(s.name), s.paused ? "resume" : "pause", () => schedules.reload()))));
      A.replace(body, ...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No schedules. Add one with artex schedule add NAME --cron '*/5 * * * *' --kind KIND."))]));
    },
  };
  A.pages.schedules = schedules;

  // ---- the feed ---------------------------------------------------------------------
  const feed = {
    name: "feed",
    async show(main) {
      A.add(main, h("h1", {}, "Live feed"), h("p", { class: "muted" }, "Task transitions as they happen (the last 200 since this page opened)."),
        h("ul", { class: "feed", id: "feed" }, A.recent.map(item)));
    },
    onEvent(ev) {
      const list = document.getElementById("feed");
      if (!list) return;
      list.prepend(item(ev));
      while (list.children.length > 200) list.lastChild.remove();
    },
  };
  function item(ev) {
    return h("li", { "data-task": ev.task_id }, h("span", { class: "muted" }, new Date(ev.at).toLocaleTimeString()), " ",
      A.taskLink(ev.task_id), " ", ev.kind, " ", ev.from ? A.status(ev.from) : "new", " → ", A.status(ev.to),
      ev.reason ? h("span", { class: "muted" }, " " + ev.reason) : null);
  }
  A.pages.feed = feed;
})();
