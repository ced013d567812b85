// Flows (a list, and one flow's DAG drawn as SVG with each node's status, live, and its
// waits with a form to signal them) and
// workers (grouped by address: a hot upgrade shows as a new generation, another pid and
// binary on the same socket, replacing the one before).
"use strict";
(function () {
  const { h, svg } = A;

  // ---- flows ------------------------------------------------------------------------
  const flows = {
    name: "flows",
    async show(main, id) {
      if (id) return flow.show(main, id);
      const form = h("form", { class: "filters" }, h("label", {}, "flow id", h("input", { name: "id", size: 36, required: true })),
        h("button", { type: "submit" }, "Show"));
      form.addEventListener("submit", (e) => { e.preventDefault(); location.hash = "#/flows/" + new FormData(form).get("id").trim(); });
      A.add(main, h("h1", {}, "Flows"), form, h("div", { id: "flows" }, h("p", { class: "muted" }, "Loading…")));
      await flows.reload();
    },
    async reload() {
      if (A.arg) return flow.reload();
      const box = document.getElementById("flows");
      if (!box) return;
      const res = await A.api("GET", "/api/v1/flows?limit=100");
      A.replace(box, res.flows.length
        ? h("div", { class: "table" }, h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "flow"), h("th", {}, "name"), h("th", {}, "created"))),
          h("tbody", {}, res.flows.map((f) => h("tr", { "data-flow": f.id },
            h("td", {}, h("a", { href: "#/flows/" + f.id, class: "mono" }, A.short(f.id))), h("td", {}, f.name), h("td", {}, A.time(f.created_at)))))))
        : h("p", { class: "muted" }, "No flows yet (artex flow submit, or POST /api/v1/flows)."));
    },
    onEvent(ev) { if (A.arg ? ev.flow_id === flow.id : ev.flow_id && !ev.from) listReload(); },
  };
  const listReload = A.throttle(() => flows.reload().catch(() => {}), 1000);
  A.pages.flows = flows;

  const NODE_W = 150, NODE_H = 44, GAP_X = 50, GAP_Y = 18, PAD = 12;
  const flow = {
    async show(main, id) {
      flow.id = id;
      A.add(main, h("h1", {}, "Flow ", h("span", { class: "mono" }, id)), h("div", { id: "flow" }, h("p", { class: "muted" }, "Loading…")));
      await flow.reload();
    },
    async reload() {
      const box = document.getElementById("flow");
      if (!box) return;
      const id = flow.id;
      const f = await A.api("GET", "/api/v1/flows/" + encodeURIComponent(id));
      if (flow.id !== id) return;
      const counts = Object.entries(f.counts || {}).map(([s, n]) => [A.status(s), " " + n + " "]);
      A.replace(box,
        h("p", {}, h("strong", {}, f.name), " ", h("span", { id: "flow-state", "data-state": f.state }, f.state), " · ", counts),
        h("div", { class: "actions" }, ["pause", "resume", "cancel"].map((c) => A.controlButton("flow", f.id, c, () => flow.reload()))),
        h("p", { id: "flash" }),
        drawDag(f.tasks),
        h("h2", {}, "Tasks"),
        h("div", { class: "table" }, h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "name"), h("th", {}, "kind"), h("th", {}, "status"), h("th", {}, "after"), h("th", { class: "hide-sm" }, "error"))),
          h("tbody", {}, f.tasks.map((t) => h("tr", { "data-node": t.name },
            h("td", {}, h("a", { href: "#/tasks/" + t.id }, t.name)), h("td", {}, t.kind), h("td", {}, A.status(t.status)),
            h("td", {}, t.depends_on.join(", ") || "-"), h("td", { class: "hide-sm error" }, t.error || "")))))),
        waitsSection(f));
    },
  };

  // A flow's waits (issue 37): what each waits for, when it was reached and is due, its
  // signal; an open signal wait gets a form that sends it (with an optional JSON payload).
  function waitText(w) {
    const s = w.spec || {};
    if (s.signal) {
      const t = s.timeout ? " (timeout " + s.timeout + ", then " + (s.on_timeout === "succeed" ? "succeeds" : "fails") + ")" : "";
      return "signal '" + s.signal + "'" + t;
    }
    return s.until ? "until " + s.until : "for " + s.for;
  }
  function waitsSection(f) {
    const waits = f.tasks.filter((t) => t.wait);
    if (!waits.length) return null;
    const open = (t) => t.status === "blocked" || t.status === "paused";
    return [h("h2", {}, "Waits"),
      h("div", { class: "table" }, h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "name"), h("th", {}, "waits for"), h("th", {}, "status"), h("th", {}, "reached"), h("th", {}, "due"), h("th", {}, "signal"))),
        h("tbody", {}, waits.map((t) => h("tr", { "data-wait": t.name },
          h("td", {}, h("a", { href: "#/tasks/" + t.id }, t.name)), h("td", {}, waitText(t.wait)), h("td", {}, A.status(t.status)),
          h("td", {}, t.wait.reached_at ? A.time(t.wait.reached_at) : "not yet"), h("td", {}, t.wait.due_at ? A.time(t.wait.due_at) : "-"),
          h("td", {}, t.wait.signal_received_at ? A.time(t.wait.signal_received_at) + " from " + t.wait.signal_from
            : t.wait.spec.signal && open(t) ? signalForm(f.id, t.wait.spec.signal) : "-"))))))];
  }
  function signalForm(flowId, name) {
    const payload = h("input", { name: "payload", size: 18, placeholder: "payload (JSON, optional)" });
    const form = h("form", { class: "signal", "data-signal": name }, payload, h("button", { type: "submit" }, "send '" + name + "'"));
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      let body = {};
      if (payload.value.trim()) {
        try { body = { payload: JSON.parse(payload.value) }; } catch (err) { return A.flash("payload: not valid JSON: " + err.message, true); }
      }
      try {
        const r = await A.api("POST", "/api/v1/flows/" + flowId + "/signals/" + encodeURIComponent(name), body);
        A.flash("signal '" + name + "': " + (r.outcome === "completed" ? "wait completed" : "kept until the wait is reached"));
      } catch (err) {
        A.flash("signal refused: " + err.message, true);
      }
      flow.reload().catch(() => {});
    });
    return form;
  }
  A.pages.flow = flow;

  // Layers by longest path from a root; nodes in submission order within a layer.
  function drawDag(tasks) {
    const byName = new Map(tasks.map((t) => [t.name, t]));
    const layer = new Map();
    const depth = (t, seen) => {
      if (layer.has(t.name)) return layer.get(t.name);
      if (seen.has(t.name)) return 0; // a cycle cannot be submitted; be safe anyway
      seen.add(t.name);
      const d = t.depends_on.reduce((m, u) => (byName.has(u) ? Math.max(m, depth(byName.get(u), seen) + 1) : m), 0);
      layer.set(t.name, d);
      return d;
    };
    tasks.forEach((t) => depth(t, new Set()));
    const rows = [], pos = new Map();
    for (const t of tasks) {
      const l = layer.get(t.name);
      rows[l] = (rows[l] || 0) + 1;
      pos.set(t.name, { x: PAD + l * (NODE_W + GAP_X), y: PAD + (rows[l] - 1) * (NODE_H + GAP_Y) });
    }
    const width = PAD * 2 + Math.max(1, rows.length) * (NODE_W + GAP_X) - GAP_X;
    const height = PAD * 2 + Math.max(1, ...rows.filter(Boolean)) * (NODE_H + GAP_Y) - GAP_Y;
    const edges = [];
    for (const t of tasks) for (const u of t.depends_on) {
      const a = pos.get(u), b = pos.get(t.name);
      if (!a || !b) continue;
      const x1 = a.x + NODE_W, y1 = a.y + NODE_H / 2, x2 = b.x - 4, y2 = b.y + NODE_H / 2, mx = (x1 + x2) / 2;
      edges.push(svg("path", { class: "edge", "data-from": u, "data-to": t.name, d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}` }));
    }
    const nodes = tasks.map((t) => {
      const p = pos.get(t.name);
      const label = t.name.length > 20 ? t.name.slice(0, 19) + "…" : t.name;
      return svg("a", { href: "#/tasks/" + t.id },
        svg("g", { class: "node s-" + t.status, "data-node": t.name, "data-status": t.status, transform: `translate(${p.x},${p.y})` },
          svg("title", {}, t.name + " (" + t.kind + "): " + t.status),
          svg("rect", { width: NODE_W, height: NODE_H, rx: 6 }),
          svg("text", { x: 8, y: 18 }, label),
          svg("text", { x: 8, y: 35, class: "st" }, t.status)));
    });
    return svg("svg", { class: "dag", id: "dag", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": "the flow's graph" },
      svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
        svg("path", { d: "M0,0 L10,5 L0,10 z" }))),
      edges, nodes);
  }

  // ---- workers ----------------------------------------------------------------------
  let workersTimer = null;
  const workers = {
    name: "workers",
    async show(main) {
      A.add(main, h("h1", {}, "Workers"),
        h("p", { class: "muted" }, "Grouped by address: after a hot upgrade the new process (another pid, another binary) serves the same socket and replaces the one before."),
        h("div", { id: "workers" }, h("p", { class: "muted" }, "Loading…")));
      await workers.reload();
      clearInterval(workersTimer);
      // The roster is not in the task feed: it is read again every two seconds.
      workersTimer = setInterval(() => workers.reload().catch(() => {}), 2000);
    },
    leave() { clearInterval(workersTimer); },
    async reload() {
      const box = document.getElementById("workers");
      if (!box) return;
      const { workers: list } = await A.api("GET", "/api/v1/workers");
      const groups = new Map();
      for (const w of list) {
        const key = w.host + " " + (w.http_addr || w.id);
        if (!groups.has(key)) groups.set(key, []);
        groups.get(key).push(w);
      }
      const blocks = [...groups.entries()].map(([key, ws]) => {
        ws.sort((a, b) => new Date(b.started_at) - new Date(a.started_at));
        return h("section", { class: "card", "data-address": ws[0].http_addr || "" },
          h("h2", {}, ws[0].http_addr || ws[0].host, " ", h("span", { class: "muted" }, ws[0].host)),
          ws.map((w, i) => h("div", { class: "gen" + (i === 0 ? " current" : ""), "data-worker": w.id, "data-pid": w.pid, "data-generation": i === 0 ? "current" : "replaced" },
            h("div", {}, A.status(w.state), " pid ", h("strong", {}, w.pid), " · version ", h("strong", {}, w.version),
              i > 0 ? h("span", { class: "muted" }, " · replaced by pid " + ws[i - 1].pid) : null),
            h("div", { class: "muted" }, "sha256 ", h("span", { class: "mono", title: w.binary_sha256 || "" }, (w.binary_sha256 || "-").slice(0, 16)),
              " · held " + w.held + "/" + w.capacity + (w.slots != null ? " · " + w.slots + " slots" : "") + " · last seen " + A.ago(w.last_seen) + " · kinds " + w.kinds.join(", ")),
            h("div", { class: w.wake_ups && w.wake_ups.startsWith("unreachable") ? "error" : "muted", "data-wake-ups": w.wake_ups || "" },
              "wake-ups: " + (w.wake_ups || "-"),
              w.wake_ups && w.wake_ups.startsWith("unreachable") ? " (planners cannot push to " + (w.wake_addr || "-") + "; see --wake-addr)" : ""),
            h("div", { class: "muted mono" }, w.id))));
      });
      A.replace(box, ...(blocks.length ? blocks : [h("p", { class: "muted" }, "No worker has registered.")]));
    },
  };
  A.pages.workers = workers;
})();
