// The weald observer page: plain JavaScript, no build step, nothing loaded from elsewhere.
// Everything it shows comes from the daemon's own JSON-RPC methods (POST /api/call) and its
// event stream (GET /api/stream, server-sent events). Made for 100,000 sessions: the server
// sends pages and summaries, the long lists draw only the rows on screen, and what the
// stream says changed is fetched again only for the rows shown, at most a few times a second.
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const token = params.get("token") || sessionStorage.getItem("weald-observer-token") || "";
  sessionStorage.setItem("weald-observer-token", token);
  const auth = { Authorization: "Bearer " + token };

  const $ = (id) => document.getElementById(id);
  const state = {
    stream: null,        // this page's stream id (for /api/watch)
    daemon: null,
    views: {},           // name -> result of the view's method (tree, permissions, questions, mcp, faults)
    viewErrors: {},
    events: [],          // the last MAX_EVENTS events of the stream, oldest first
    running: new Map(),  // call id -> {tool, agent, started}
    restarts: new Map(), // node path -> restarts last drawn
    flashUntil: new Map(),
    selected: null,      // the path shown in the detail drawer
    faultsEnabled: false,
    faultKinds: {},
    lastActive: null,    // the agent with the latest turn activity
    convAgent: null,
    watching: null,
    tasksProject: null,
    tab: "agents",
  };
  const MAX_EVENTS = 2000;
  const BLOCK = 50;      // sessions fetched per request

  // -- small helpers ------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (key === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  async function call(method, params) {
    const response = await fetch("/api/call", {
      method: "POST",
      headers: { ...auth, "Content-Type": "application/json" },
      body: JSON.stringify({ method, params: params || {} }),
    });
    if (!response.ok) throw new Error(await response.text());
    const outcome = await response.json();
    if (outcome.error) throw new Error(outcome.error.message);
    return outcome.result;
  }

  function agentOf(path) {
    const parts = (path || "").split("/");
    return parts[1] === "sessions" ? parts[2] || "" : "";
  }

  function short(value, limit) {
    const text = typeof value === "string" ? value : JSON.stringify(value);
    return text.length > limit ? text.slice(0, limit) + "…" : text;
  }

  function seconds(s) {
    return s < 60 ? s.toFixed(1) + " s" : Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  }

  const pad = (n, w) => String(n).padStart(w, "0");
  function clock(epoch) {  // HH:MM:SS.mmm, local time
    const d = new Date(epoch * 1000);
    return `${pad(d.getHours(), 2)}:${pad(d.getMinutes(), 2)}:${pad(d.getSeconds(), 2)}.${pad(d.getMilliseconds(), 3)}`;
  }

  function count(n) { return n === null || n === undefined ? "–" : Math.round(n).toLocaleString("en"); }
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (n >= 100 || i === 0 ? Math.round(n) : n.toFixed(1)) + " " + units[i];
  }
  function rate(n) { return n === null || n === undefined ? "–" : n >= 100 ? Math.round(n).toLocaleString("en") : n.toFixed(n >= 10 ? 1 : 2); }
  function ms(n) { return n === null || n === undefined ? "–" : n.toFixed(n >= 10 ? 0 : 2) + " ms"; }
  function pct(n) { return n === null || n === undefined ? "–" : n.toFixed(n >= 10 ? 0 : 1) + "%"; }
  function basename(path) { return (path || "").replace(/\/+$/, "").split("/").pop() || path || ""; }

  // Long text is folded: its first line shows, the rest opens on a click.
  function folded(text, cls) {
    const lines = text.split("\n");
    if (text.length <= 600 && lines.length <= 12) return el("pre", { class: cls, text });
    const head = lines[0].slice(0, 120);
    return el("details", {}, el("summary", { text: `${head} … (${lines.length} lines, ${text.length} chars)` }),
      el("pre", { class: cls, text }));
  }

  function later(fn, delay) {  // one call of fn at most every `delay` ms, the last asked for
    let timer = null;
    return () => { if (!timer) timer = setTimeout(() => { timer = null; fn(); }, delay); };
  }

  // At once, then at most once every `gap` ms while it keeps being asked (typing): the first
  // keystroke is answered without waiting, the last one always is.
  function promptly(fn, gap) {
    let last = -Infinity, timer = null;
    return () => {
      const now = performance.now();
      if (timer) return;
      if (now - last >= gap) { last = now; fn(); return; }
      timer = setTimeout(() => { timer = null; last = performance.now(); fn(); }, gap - (now - last));
    };
  }

  // -- a virtual list: only the rows on screen (and a few around) are in the document -------------

  class VList {
    constructor(box, rowHeight, render) {
      this.box = box;
      this.spacer = box.querySelector(".vspacer");
      this.rowHeight = rowHeight;
      this.render = render;   // (index, node) -> fills the row node
      this.count = 0;
      this.nodes = new Map();  // index -> row node
      this.pending = false;
      box.addEventListener("scroll", () => this.schedule(), { passive: true });
      new ResizeObserver(() => this.schedule()).observe(box);
    }
    setCount(n) {
      if (n !== this.count) {
        this.count = n;
        this.spacer.style.height = n * this.rowHeight + "px";
      }
      this.schedule();
    }
    schedule() {
      if (this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.draw(); });
    }
    range() {
      const top = this.box.scrollTop;
      const first = Math.max(0, Math.floor(top / this.rowHeight) - 4);
      const last = Math.min(this.count, Math.ceil((top + this.box.clientHeight) / this.rowHeight) + 4);
      return [first, last];
    }
    draw() {
      if (this.box.offsetParent === null) return;  // hidden: drawn when shown
      const [first, last] = this.range();
      for (const [index, node] of this.nodes) {
        if (index < first || index >= last) { node.remove(); this.nodes.delete(index); }
      }
      for (let i = first; i < last; i++) {
        let node = this.nodes.get(i);
        if (!node) {
          node = el("div", { class: "vrow" });
          node.style.top = i * this.rowHeight + "px";
          this.nodes.set(i, node);
          this.box.append(node);
        }
        this.render(i, node);
      }
    }
    redraw() {  // every row again (the rows' meaning changed: a new query)
      for (const node of this.nodes.values()) { node.remove(); node._key = undefined; }
      this.nodes.clear();
      this.box.scrollTop = 0;
      this.schedule();
    }
  }

  // Fills `node` with `build()` only when `key` differs from what it shows: an unchanged row is left as it is.
  function fill(node, key, build) {
    if (node._key === key) return;
    node._key = key;
    build();
  }

  // -- the stream -----------------------------------------------------------------------------

  async function stream() {
    let delay = 1000;
    for (;;) {
      try {
        const response = await fetch("/api/stream", { headers: auth, cache: "no-store" });
        if (!response.ok) throw new Error(await response.text());
        setLive(true);
        delay = 1000;
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true });
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            let name = "message";
            const data = [];
            for (const line of block.split("\n")) {
              if (line.startsWith("event: ")) name = line.slice(7);
              else if (line.startsWith("data: ")) data.push(line.slice(6));
            }
            if (data.length) dispatch(name, JSON.parse(data.join("\n")));
          }
        }
      } catch (error) {
        $("daemon-info").textContent = "disconnected: " + short(String(error.message || error), 160);
      }
      setLive(false);
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 10000);
    }
  }

  function setLive(on) {
    const live = $("live");
    live.className = "live " + (on ? "on" : "off");
    live.textContent = on ? "live" : "offline";
  }

  function dispatch(name, data) {
    if (name === "hello") onHello(data);
    else if (name === "view") onView(data.name, data.outcome);
    else if (name === "events") onEvents(data.events, data.dropped, data.skipped);
    else if (name === "sessions") sessions.changed(data.changed, data.membership);
    else if (name === "metrics") onMetrics(data);
  }

  function onHello(data) {
    state.stream = data.stream;
    state.daemon = data.daemon;
    state.faultsEnabled = data.faults_enabled;
    state.faultKinds = data.fault_kinds || {};
    state.events = [];
    state.running.clear();
    state.watching = null;
    $("faults-off").hidden = state.faultsEnabled;
    $("faults-on").hidden = !state.faultsEnabled;
    if (data.metrics) setMetrics(data.metrics);
    onEvents(data.events || [], 0, 0);
    drawDaemon();
    drawFaultForm();
    sessions.reset();
    if (state.convAgent) watch(state.convAgent);
  }

  function drawDaemon() {
    const d = state.daemon;
    if (!d) return;
    const awake = latest("sessions_awake"), asleep = latest("sessions_asleep");
    const counts = sessions.counts;
    const up = counts ? counts.awake : awake, down = counts ? counts.asleep : asleep;
    // The sampler's live figure; daemon.status's (as of the page's start) until the first sample.
    const store = latest("store_bytes") ?? d.store_bytes ?? d.store_size;
    const node = d.node ? ` · node ${d.node.node_id} epoch ${d.node.epoch}` + (d.node.lease_lost ? " (lease lost)" : "") : "";
    $("daemon-info").textContent = `pid ${d.pid} · weald ${d.version} · ${count(up)} awake · ${count(down)} asleep · ` +
      `RSS ${bytes(latest("rss_bytes"))} · store ${bytes(store)}` +
      (d.history && d.history.over_warn_bytes ? ` (past [store] warn_bytes, ${bytes(d.history.warn_bytes)})` : "") +
      node + (d.faults_enabled ? " · fault injection on" : "");
  }

  function onView(name, outcome) {
    if (outcome.error) {
      state.viewErrors[name] = outcome.error.message;
    } else {
      delete state.viewErrors[name];
      state.views[name] = outcome.result;
    }
    if (name === "tree") drawTree();
    else if (name === "permissions" || name === "questions") drawPrompts();
    else if (name === "mcp") drawMcp();
    else if (name === "faults") drawFaults();
  }

  const TURN_TOPICS = new Set(["agent.turn_start", "agent.message_end", "agent.turn_end", "agent.prompt_queued"]);

  function onEvents(events, dropped, skipped) {
    if (dropped || skipped) {
      const note = $("dropped");
      note.hidden = false;
      note.textContent = `${(dropped || 0) + (skipped || 0)} events not shown (this page fell behind)`;
    }
    let reloadConversation = false;
    let reloadTasks = false;
    const active = state.lastActive;
    for (const event of events) {
      state.events.push(event);
      const data = event.data || {};
      const topic = event.topic;
      if (topic === "tool.started") {
        state.running.set(data.call_id, { tool: data.tool, agent: data.agent, started: event.time });
      } else if (topic === "tool.finished" || topic === "tool.failed") {
        state.running.delete(data.call_id);
        if (data.tool === "tasks" && state.tasksProject) reloadTasks = true;
      } else if (topic === "supervisor.child_crashed" || topic === "supervisor.child_restarted" || topic === "fault.injected") {
        flash(data.path || event.source);
      } else if (topic === "agent.turn_end" || topic === "agent.aborted") {
        for (const [id, run] of state.running) if (run.agent === event.source) state.running.delete(id);
      }
      if (TURN_TOPICS.has(topic) && /^\/sessions\/[^/]+\/agent$/.test(event.source)) state.lastActive = agentOf(event.source);
      if (state.convAgent && agentOf(event.source) === state.convAgent && liveConversation(event)) reloadConversation = true;
    }
    if (state.events.length > MAX_EVENTS) state.events.splice(0, state.events.length - MAX_EVENTS);
    if (events.length) liveEvents(events);
    if (state.lastActive !== active && state.tab === "faults") drawFaultForm(true);  // its default follows
    if (reloadConversation) scheduleConversation();
    if (reloadTasks) scheduleTasks();
  }

  // -- the tree: the daemon's own part; /sessions is the list below it -------------------------

  function flash(path) {
    if (!path) return;
    state.flashUntil.set(path, Date.now() + 1500);
    const session = agentOf(path);
    if (session) state.flashUntil.set("/sessions/" + session, Date.now() + 1500);
    for (const node of document.querySelectorAll(`.node[data-path="${CSS.escape(path)}"]`)) {
      node.classList.add("flash");
      setTimeout(() => node.classList.remove("flash"), 1500);
    }
    if (session) {
      sessionList.schedule();
      setTimeout(() => sessionList.schedule(), 1600);  // and again without the flash
    }
  }

  function flashing(path) { return (state.flashUntil.get(path) || 0) > Date.now(); }

  function nodeCard(node, extra) {
    const name = node.path === "/" ? "/" : node.path.slice(node.path.lastIndexOf("/") + 1);
    const status = String(node.status || "").replace(/[^a-z_-]/gi, "-");
    const classes = ["node", "st-" + status];
    if (flashing(node.path)) classes.push("flash");
    if (state.selected === node.path) classes.push("selected");
    return el("span", {
      class: classes.join(" "), dataset: { path: node.path, restarts: String(node.restarts ?? 0) },
      title: node.path, onclick: (e) => { e.stopPropagation(); openDetail(node); },
    },
    el("span", { class: "name", text: name }),
    el("span", { class: "kind", text: node.kind }),
    el("span", { class: "badge status", text: node.status }),
    node.restarts ? el("span", { class: "badge restarts", text: `restarts ${node.restarts}` }) : null,
    node.escalations ? el("span", { class: "badge escalations", text: `gave up ${node.escalations}×` }) : null,
    node.mailbox ? el("span", { class: "badge mailbox", text: `mailbox ${node.mailbox}` }) : null,
    node.faults ? el("span", { class: "badge faults", text: `faults ${node.faults}` }) : null,
    node.mcp && node.mcp.status !== "running"
      ? el("span", { class: "badge escalations", text: `mcp ${node.mcp.status}` + (node.mcp.retry_in ? `, retry in ${Math.round(node.mcp.retry_in)} s` : "") })
      : null,
    ...(extra || []));
  }

  function noteRestarts(node, now) {
    const before = state.restarts.get(node.path);
    if (before !== undefined && node.restarts > before) state.flashUntil.set(node.path, now + 1500);
    state.restarts.set(node.path, node.restarts);
  }

  function drawTree() {
    const root = state.views.tree;
    const box = $("tree");
    if (!root) { box.textContent = state.viewErrors.tree || ""; return; }
    let nodes = 0;
    const now = Date.now();
    const build = (node) => {
      nodes += 1;
      noteRestarts(node, now);
      const extra = [];
      if (node.path === "/sessions") {
        // The counts of the latest page (the tree is not redrawn for what the sessions do).
        const c = sessions.counts || { active: node.children_hidden || 0, asleep: node.children_asleep || 0, awake: (node.children_hidden || 0) - (node.children_asleep || 0) };
        extra.push(el("span", { class: "badge", id: "sessions-counts", text: `${count(c.active)} sessions · ${count(c.awake)} awake · ${count(c.asleep)} asleep` }));
      }
      const item = el("li", {}, el("span", { class: "toggle" }), nodeCard(node, extra));
      const kids = node.children || [];
      if (kids.length) item.append(el("ul", {}, ...kids.map(build)));
      return item;
    };
    box.replaceChildren(el("ul", {}, build(root)));
    $("tree-count").textContent = `${nodes} actors of the daemon itself`;
    if (state.selected) refreshDetailNote();
  }

  function findNode(path) {
    const stack = state.views.tree ? [state.views.tree] : [];
    for (const nodes of sessionList.expanded.values()) stack.push(...nodes);
    while (stack.length) {
      const node = stack.pop();
      if (node.path === path) return node;
      stack.push(...(node.children || []));
    }
    return null;
  }

  // -- the sessions: pages of sessions.page, shared by the tree's list and the agents grid -------

  const sessions = {
    query: { search: "", state: "active", project: "", model: "", sort: "state", order: null },
    version: 0,
    total: 0,
    counts: null,
    blocks: new Map(),   // block number -> {rows, stale}
    loading: new Map(),  // block number -> the version it was asked for
    lists: [],           // the virtual lists showing the sessions
    projects: [],
    models: [],
    params() {
      const q = this.query;
      const p = { state: q.state, sort: q.sort };
      if (q.search) p.search = q.search;
      if (q.project) p.project = q.project;
      if (q.model) p.model = q.model;
      if (q.order) p.order = q.order;
      return p;
    },
    reset() {  // a new query (or a new stream): everything again, drawn once its first rows are here
      this.version += 1;
      this.blocks.clear();
      this.loading.clear();
      this.fresh = true;
      this.load(0);
    },
    row(offset) {  // the row at `offset` of the query, or undefined (then its block is asked for)
      const block = Math.floor(offset / BLOCK);
      const held = this.blocks.get(block);
      if (!held || held.stale) this.load(block);
      return held ? held.rows[offset - block * BLOCK] : undefined;
    },
    async load(block) {
      const version = this.version;
      if (this.loading.get(block) === version) return;
      this.loading.set(block, version);
      try {
        const result = await call("sessions.page", { ...this.params(), offset: block * BLOCK, limit: BLOCK });
        if (version !== this.version) return;
        this.blocks.set(block, { rows: result.rows, stale: false });
        if (this.fresh) {  // the lists show the old query's rows until now: one frame, no placeholders
          this.fresh = false;
          for (const list of this.lists) list.redraw();
        }
        this.total = result.total;
        const before = JSON.stringify(this.counts);
        this.counts = result.counts;
        if (JSON.stringify(this.counts) !== before) drawTree();
        this.setChoices(result.projects, result.models);
        for (const list of this.lists) list.refresh();
        drawDaemon();
        if (!state.lastActive) {
          const first = result.rows.find((r) => r.awake) || result.rows[0];
          if (first) state.lastActive = first.agent_id;
        }
      } catch (error) {
        $("s-count").textContent = String(error.message || error);
      } finally {
        if (this.loading.get(block) === version) this.loading.delete(block);
      }
    },
    visibleBlocks() {
      const blocks = new Set();
      for (const list of this.lists) for (const b of list.blocks()) blocks.add(b);
      return blocks;
    },
    changed(ids, membership) {  // the stream's `sessions`: fetch again what is shown and changed
      const shown = this.visibleBlocks();
      if (membership || ids === null) {
        for (const [block, held] of this.blocks) {
          if (shown.has(block)) held.stale = true; else this.blocks.delete(block);
        }
      } else {
        const changed = new Set(ids);
        for (const block of shown) {
          const held = this.blocks.get(block);
          if (held && held.rows.some((r) => changed.has(r.agent_id))) held.stale = true;
        }
      }
      for (const block of shown) if (!this.blocks.has(block) || this.blocks.get(block).stale) this.load(block);
    },
    setChoices(projects, models) {
      const pick = (select, items, key, label) => {
        const values = items.map((i) => i[key]);
        const joined = values.join("\n");
        if (select.dataset.values === joined) return;
        select.dataset.values = joined;
        const current = select.value;
        select.replaceChildren(el("option", { value: "", text: label }),
          ...items.map((i) => el("option", { value: i[key], text: `${key === "working_dir" ? basename(i[key]) : i[key]} (${count(i.sessions)})`, title: i[key] })));
        select.value = values.includes(current) ? current : "";
      };
      this.projects = projects;
      this.models = models;
      pick($("s-project"), projects, "working_dir", "every project");
      pick($("s-model"), models, "model", "every model");
      drawTaskProjects();
    },
  };

  function setQuery(change) {
    Object.assign(sessions.query, change);
    sessionList.expanded.clear();
    sessionList.offsets.clear();
    sessions.reset();
  }
  $("s-search").addEventListener("input", promptly(() => setQuery({ search: $("s-search").value.trim() }), 100));
  for (const [id, key] of [["s-state", "state"], ["s-project", "project"], ["s-model", "model"], ["s-sort", "sort"]]) {
    $(id).addEventListener("change", () => setQuery({ [key]: $(id).value }));
  }
  $("s-order").addEventListener("click", () => {
    const q = sessions.query;
    const natural = q.sort === "state" || q.sort === "started" ? "desc" : "asc";
    setQuery({ order: (q.order || natural) === "desc" ? "asc" : "desc" });
  });

  // The tree's list: each session a row; an expanded one is followed by its subtree's rows.
  const sessionList = new VList($("session-list"), 24, (index, node) => renderSessionRow(index, node));
  sessionList.expanded = new Map();  // agent id -> the flat rows of its subtree (below the session)
  sessionList.offsets = new Map();   // agent id -> its offset in the query, when it was expanded
  sessionList.refresh = function () {
    let extra = 0;
    for (const rows of this.expanded.values()) extra += rows.length;
    this.setCount(sessions.total + extra);
    this.schedule();
    const q = sessions.query;
    const shown = sessions.total ? `${count(sessions.total)} session${sessions.total === 1 ? "" : "s"}` : "no sessions";
    $("s-count").textContent = shown + (q.search || q.project || q.model || q.state !== "active" ? " match" : "");
  };
  sessionList.blocks = function () {
    const [first, last] = this.range();
    const out = new Set();
    for (let i = first; i < last; i++) {
      const at = this.locate(i);
      if (at) out.add(Math.floor(at.offset / BLOCK));
    }
    return out;
  };
  // Flat index -> {offset, sub}: the session at `offset` of the query, and its subtree's row `sub` (-1: the session).
  sessionList.locate = function (index) {
    const marks = [...this.offsets.entries()].filter(([id]) => this.expanded.has(id)).sort((a, b) => a[1] - b[1]);
    let shift = 0;
    for (const [id, offset] of marks) {
      const rows = this.expanded.get(id);
      if (index <= offset + shift) return { offset: index - shift, sub: -1 };
      if (index <= offset + shift + rows.length) return { offset, sub: index - offset - shift - 1, id };
      shift += rows.length;
    }
    return index - shift < sessions.total ? { offset: index - shift, sub: -1 } : null;
  };
  sessions.lists.push(sessionList);

  function renderSessionRow(index, node) {
    const at = sessionList.locate(index);
    if (!at) { node.replaceChildren(); return; }
    if (at.sub >= 0) {
      const sub = sessionList.expanded.get(at.id)[at.sub];
      fill(node, "sub:" + JSON.stringify(sub) + flashing(sub.path) + (state.selected === sub.path), () => {
        node.className = "vrow sub";
        node.style.setProperty("--depth", String(sub.depth));
        node.replaceChildren(el("span", { class: "toggle" }), nodeCard(sub));
      });
      return;
    }
    const row = sessions.row(at.offset);
    if (!row) {
      fill(node, "loading", () => { node.className = "vrow placeholder"; node.replaceChildren(el("span", { class: "toggle" }), "…"); });
      return;
    }
    if (sessionList.expanded.has(row.agent_id)) sessionList.offsets.set(row.agent_id, at.offset);
    const path = "/sessions/" + row.agent_id;
    const open = sessionList.expanded.has(row.agent_id);
    const key = JSON.stringify([row, open, flashing(path), state.selected === path]);
    fill(node, key, () => {
      node.className = "vrow";
      node.dataset.agent = row.agent_id;
      const session = { path, kind: "session", status: row.state, restarts: row.restarts || 0 };
      noteRestarts(session, Date.now());
      node.replaceChildren(
        el("span", { class: "toggle", text: open ? "▾" : "▸", title: "its actors", onclick: () => toggleSession(row.agent_id, at.offset) }),
        nodeCard(session, [el("span", { class: "kind", text: basename(row.working_dir), title: row.working_dir || "" })]));
    });
  }

  async function toggleSession(agentId, offset) {
    if (sessionList.expanded.has(agentId)) {
      sessionList.expanded.delete(agentId);
      sessionList.offsets.delete(agentId);
    } else {
      try {
        const tree = await call("tree", { path: "/sessions/" + agentId });
        const rows = [];
        const walk = (node, depth) => { for (const child of node.children || []) { rows.push({ ...child, children: undefined, depth }); walk(child, depth + 1); } };
        walk(tree, 1);
        sessionList.expanded.set(agentId, rows);
        sessionList.offsets.set(agentId, offset);
      } catch (error) {
        $("s-count").textContent = String(error.message || error);
      }
    }
    for (const n of sessionList.nodes.values()) n._key = undefined;
    sessionList.refresh();
  }

  // -- agents: the same sessions, as a grid with their live figures ---------------------------------

  function usageText(usage) {
    if (!usage) return "";
    return `${count(usage.input_tokens || 0)} / ${count(usage.output_tokens || 0)}`;
  }

  // The context's fill: an estimate of the next request's size against the input budget.
  // Until a model reported its usage the estimate counts characters: marked as such.
  function contextCell(row) {
    const ctx = row.context;
    if (!ctx || typeof ctx !== "object" || !ctx.input_budget) return el("span", { class: "c-context" });
    const p = Math.round((100 * ctx.tokens) / ctx.input_budget);
    const estimated = !ctx.calibrated;
    const text = `${estimated ? "~" : ""}${p}% (${count(ctx.tokens)}/${count(ctx.input_budget)})` + (ctx.compactions ? ` · ${ctx.compactions} compacted` : "");
    return el("span", {
      class: "c-context" + (estimated ? " estimate" : ""), text,
      title: estimated ? "an estimate from the text's length: the model has not reported its usage yet" : "from the model's reported usage",
    });
  }

  function waitingOn(agentId) {
    const waiting = [];
    for (const p of state.views.permissions || []) if (p.agent_id === agentId) waiting.push("permission");
    for (const q of state.views.questions || []) if (q.agent_id === agentId) waiting.push("question");
    return waiting.join(", ");
  }

  function runningText(path) {
    const now = Date.now() / 1000;
    const items = [];
    for (const run of state.running.values()) if (run.agent === path) items.push(`${run.tool} ${seconds(Math.max(0, now - run.started))}`);
    return items.join(", ");
  }

  const agentGrid = new VList($("agents"), 26, (index, node) => {
    const row = sessions.row(index);
    if (!row) { fill(node, "loading", () => { node.className = "vrow agents-grid placeholder"; node.replaceChildren(el("span", { text: "…" })); }); return; }
    const running = runningText(row.path);
    const waiting = waitingOn(row.agent_id);
    fill(node, JSON.stringify([row, running, waiting]), () => {
      node.className = "vrow agents-grid";
      node.dataset.agent = row.agent_id;
      node.onclick = () => showConversation(row.agent_id);
      const stateName = row.state || row.status || "";
      node.replaceChildren(
        el("span", { class: "mono c-agent", text: row.agent_id, title: row.agent_id }),
        el("span", { class: "c-state state-" + stateName, text: stateName }),
        el("span", { class: "c-step", text: row.step ? String(row.step) : "" }),
        el("span", { class: "c-tokens", text: usageText(row.usage) }),
        contextCell(row),
        el("span", { class: "c-restarts", text: row.restarts === undefined ? "" : String(row.restarts) }),
        el("span", { class: "c-running", dataset: { path: row.path }, text: running, title: running }),
        el("span", { class: "c-waiting", text: waiting }),
        el("span", { class: "c-project", text: basename(row.working_dir), title: row.working_dir || "" }),
        el("span", {}, row.turn_id ? el("button", { text: "abort", onclick: (e) => { e.stopPropagation(); act("abort", row.agent_id); } }) : null));
    });
  });
  agentGrid.refresh = function () { this.setCount(sessions.total); };
  agentGrid.blocks = function () {
    const [first, last] = this.range();
    const out = new Set();
    if (this.box.offsetParent === null) return out;
    for (let b = Math.floor(first / BLOCK); b * BLOCK < last; b++) out.add(b);
    return out;
  };
  sessions.lists.push(agentGrid);
  for (const head of document.querySelectorAll("#agents-head span[data-sort]")) {
    head.addEventListener("click", () => {
      const sort = head.dataset.sort === "state" ? "state" : head.dataset.sort;
      $("s-sort").value = sort;
      const q = sessions.query;
      setQuery(q.sort === sort ? { order: (q.order || (sort === "state" ? "desc" : "asc")) === "desc" ? "asc" : "desc" } : { sort, order: null });
    });
  }
  // Elapsed times tick on the rows shown; nothing is fetched.
  setInterval(() => { if (state.running.size) agentGrid.schedule(); }, 1000);

  // -- processes: every awake actor, sorted by the server, a page at a time ----------------------

  const processes = { sort: "mailbox", order: null, offset: 0, limit: 50, total: 0, timer: null };

  async function loadProcesses() {
    const p = { sort: processes.sort, offset: processes.offset, limit: processes.limit };
    if (processes.order) p.order = processes.order;
    const search = $("p-search").value.trim();
    const prefix = $("p-prefix").value.trim();
    if (search) p.search = search;
    if (prefix) p.prefix = prefix;
    try {
      const result = await call("actors.list", p);
      processes.total = result.total;
      drawProcesses(result.rows);
    } catch (error) {
      $("p-count").textContent = String(error.message || error);
    }
  }

  function drawProcesses(rows) {
    const tbody = $("processes").querySelector("tbody");
    const existing = new Map([...tbody.children].map((tr) => [tr.dataset.path, tr]));
    const ordered = rows.map((row) => {
      let tr = existing.get(row.path);
      if (!tr) tr = el("tr", { class: "clickable", dataset: { path: row.path }, onclick: () => openDetail({ path: row.path, kind: row.kind, status: row.status, restarts: row.restarts, mailbox: row.mailbox }) });
      fill(tr, JSON.stringify(row), () => {
        tr.classList.toggle("growing", !!row.growing);
        tr.title = row.growing ? "its mailbox keeps growing: it handles messages slower than they come" : "";
        tr.replaceChildren(
          el("td", { class: "mono", text: row.path }), el("td", { text: row.kind }), el("td", { text: row.status }),
          el("td", { class: "num mailbox", text: count(row.mailbox) }), el("td", { class: "num handled", text: count(row.handled) }),
          el("td", { class: "num restarts", text: row.supervised === false ? "–" : count(row.restarts) }),
          el("td", { class: "num memory", text: row.memory === null || row.memory === undefined ? "" : (row.memory_partial ? "≥" : "~") + bytes(row.memory),
            title: row.memory_partial ? "it holds more than the estimate looked at: at least this much" : "an estimate of what it holds" }));
      });
      return tr;
    });
    tbody.replaceChildren(...ordered);
    const last = Math.min(processes.offset + processes.limit, processes.total);
    $("p-count").textContent = processes.total ? `${count(processes.offset + 1)}–${count(last)} of ${count(processes.total)} actors running` : "no actor matches";
    for (const th of document.querySelectorAll("#processes th[data-sort]")) th.classList.toggle("sorted", th.dataset.sort === processes.sort);
  }

  for (const th of document.querySelectorAll("#processes th[data-sort]")) {
    th.addEventListener("click", () => {
      const numeric = ["mailbox", "handled", "restarts", "memory"].includes(th.dataset.sort);
      if (processes.sort === th.dataset.sort) processes.order = (processes.order || (numeric ? "desc" : "asc")) === "desc" ? "asc" : "desc";
      else { processes.sort = th.dataset.sort; processes.order = null; }
      processes.offset = 0;
      loadProcesses();
    });
  }
  $("p-prev").addEventListener("click", () => { processes.offset = Math.max(0, processes.offset - processes.limit); loadProcesses(); });
  $("p-next").addEventListener("click", () => { if (processes.offset + processes.limit < processes.total) { processes.offset += processes.limit; loadProcesses(); } });
  for (const id of ["p-search", "p-prefix"]) $(id).addEventListener("input", promptly(() => { processes.offset = 0; loadProcesses(); }, 100));

  // -- the system view: the sampler's series as charts ----------------------------------------------

  const CHARTS = [
    { title: "memory (RSS)", series: ["rss_bytes"], fmt: bytes },
    { title: "CPU", series: ["cpu_percent"], fmt: pct },
    { title: "loop lag", series: ["loop_lag_ms"], fmt: ms },
    { title: "turns/s", series: ["turns_per_s"], fmt: rate },
    { title: "model calls/s", series: ["model_calls_per_s"], fmt: rate },
    { title: "tokens/s in · out", series: ["tokens_in_per_s", "tokens_out_per_s"], fmt: rate },
    { title: "tool calls/s", series: ["tool_calls_per_s"], fmt: rate },
    { title: "restarts/s", series: ["restarts_per_s"], fmt: rate },
    { title: "store commits/s", series: ["commits_per_s"], fmt: rate },
    { title: "commit latency", series: ["commit_ms"], fmt: ms },
    { title: "store on disk", series: ["store_bytes"], fmt: bytes },
    { title: "connections", series: ["connections"], fmt: count },
    { title: "sessions awake · asleep", series: ["sessions_awake", "sessions_asleep"], fmt: count },
  ];
  const CARDS = [
    ["RSS", "rss_bytes", bytes], ["CPU", "cpu_percent", pct], ["loop lag", "loop_lag_ms", ms],
    ["awake", "sessions_awake", count], ["asleep", "sessions_asleep", count], ["turns/s", "turns_per_s", rate],
    ["tokens/s out", "tokens_out_per_s", rate], ["store", "store_bytes", bytes], ["connections", "connections", count],
  ];
  const COLORS = ["#2f7d4a", "#2b6cb0"];
  const metrics = { t: [], values: {}, help: {}, points: 600, interval: 1 };

  function setMetrics(series) {
    metrics.t = series.t.slice();
    metrics.values = {};
    for (const [name, values] of Object.entries(series.values)) metrics.values[name] = values.slice();
    metrics.points = series.points;
    metrics.interval = series.interval;
    for (const s of series.series || []) metrics.help[s.name] = s.help;
    buildCharts();
    if (state.tab === "system") drawSystem();
  }

  function onMetrics(data) {
    metrics.t.push(...data.t);
    for (const [name, values] of Object.entries(data.values)) (metrics.values[name] ||= []).push(...values);
    const extra = metrics.t.length - metrics.points;
    if (extra > 0) {
      metrics.t.splice(0, extra);
      for (const values of Object.values(metrics.values)) values.splice(0, extra);
    }
    drawDaemon();
    if (state.tab === "system") drawSystem();
  }

  function latest(name) {
    const values = metrics.values[name];
    if (!values) return null;
    for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
    return null;
  }

  function buildCharts() {
    const box = $("charts");
    if (box.children.length) return;
    box.replaceChildren(...CHARTS.map((chart, i) => el("div", { class: "chart", dataset: { chart: chart.series[0] } },
      el("div", { class: "title" },
        ...chart.series.map((name, k) => el("span", { class: `series-${k}`, text: (k ? "· " : "") + (chart.series.length > 1 ? name.replace(/_per_s$|^sessions_|^tokens_/g, "") : chart.title), title: metrics.help[name] || name })),
        el("span", { class: "now", id: `now-${i}` })),
      el("canvas", { id: `chart-${i}`, height: 80 }))));
    $("sys-cards").replaceChildren(...CARDS.map(([label, name]) => el("div", { class: "card", dataset: { metric: name } },
      el("div", { class: "label", text: label }), el("div", { class: "value" }))));
  }

  function drawSystem() {
    for (const card of $("sys-cards").children) {
      const [, name, fmt] = CARDS.find(([, n]) => n === card.dataset.metric);
      card.lastChild.textContent = fmt(latest(name));
    }
    CHARTS.forEach((chart, i) => {
      const canvas = $(`chart-${i}`);
      if (canvas) drawChart(canvas, chart, $(`now-${i}`));
    });
  }

  // One chart: each series scaled to its own maximum over the window (two series: two scales), the newest on the right.
  function drawChart(canvas, chart, now) {
    const dpr = window.devicePixelRatio || 1;
    const width = Math.max(100, canvas.clientWidth), height = 80;
    if (canvas.width !== Math.round(width * dpr)) { canvas.width = Math.round(width * dpr); canvas.height = Math.round(height * dpr); }
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, width, height);
    g.strokeStyle = "#eef1ec";
    g.lineWidth = 1;
    for (const y of [0.25, 0.5, 0.75]) { g.beginPath(); g.moveTo(0, Math.round(height * y) + 0.5); g.lineTo(width, Math.round(height * y) + 0.5); g.stroke(); }
    const t = metrics.t;
    const end = t.length ? t[t.length - 1] : 0;
    // The window: what the rings hold, in whole minutes (a young daemon's first minutes fill the width).
    const held = t.length ? end - t[0] : 0;
    const minutes = Math.min(Math.max(1, Math.ceil(held / 60)), Math.round((metrics.points * metrics.interval) / 60));
    const span = minutes * 60;
    const x = (time) => width - ((end - time) / span) * width;
    const labels = [];
    let points = 0;
    chart.series.forEach((name, k) => {
      const values = metrics.values[name] || [];
      let top = 0;
      for (const v of values) if (v !== null && v > top) top = v;
      const scale = top > 0 ? (height - 14) / (top * 1.1) : 0;
      g.strokeStyle = COLORS[k];
      g.lineWidth = 1.5;
      g.beginPath();
      let pen = false;
      for (let i = 0; i < values.length; i++) {
        const v = values[i];
        if (v === null) { pen = false; continue; }
        const px = x(t[i]), py = height - 2 - v * scale;
        if (pen) g.lineTo(px, py); else g.moveTo(px, py);
        pen = true;
        points += 1;
      }
      g.stroke();
      g.fillStyle = COLORS[k];
      g.font = "10px system-ui, sans-serif";
      g.fillText("max " + chart.fmt(top), 4 + k * (width / 2), 10);
      labels.push(chart.fmt(latest(name)));
    });
    g.fillStyle = "#6b756f";
    g.fillText(`${minutes} min`, width - 36, height - 3);
    canvas.dataset.points = String(points);
    canvas.dataset.last = String(latest(chart.series[0]) ?? "");
    now.textContent = labels.join(" · ");
  }
  window.addEventListener("resize", later(() => { if (state.tab === "system") drawSystem(); }, 100));

  // -- the detail drawer: an actor's snapshot, an agent's debug_state, and the operator's actions --

  async function openDetail(node) {
    state.selected = node.path;
    state.selectedNode = node;
    $("detail").hidden = false;
    $("detail-title").textContent = `${node.path} (${node.kind})`;
    drawTree();
    for (const n of sessionList.nodes.values()) n._key = undefined;
    sessionList.schedule();
    drawActions(node);
    await loadDetail();
  }

  function asleepStatus(status) { return status === "hibernated" || status === "dormant"; }

  function refreshDetailNote() {
    const node = findNode(state.selected) || state.selectedNode;
    $("detail-note").textContent = node
      ? `status ${node.status} · restarts ${node.restarts ?? 0}` + (node.mailbox !== undefined ? ` · mailbox ${node.mailbox}` : "") + (node.faults ? ` · faults fired ${node.faults}` : "")
      : "";
  }

  async function loadDetail() {
    const path = state.selected;
    if (!path) return;
    const node = state.selectedNode || {};
    refreshDetailNote();
    const body = $("detail-body");
    body.classList.remove("error-text");
    const agentId = agentOf(path);
    const config = $("detail-config");
    config.hidden = true;
    try {
      let result;
      if (path === "/sessions") {
        // Its snapshot would list every session (100,000): its counts, and the list below the tree, say it.
        const tree = findNode(path) || node;
        result = { path, kind: tree.kind, status: tree.status, restarts: tree.restarts, sessions: tree.children_hidden, asleep: tree.children_asleep,
          note: "the sessions are the list below the tree: search, filter and sort it there" };
      } else if (asleepStatus(node.status)) {
        // Asking an asleep actor anything would wake it: what the list knows is shown instead.
        result = { path, status: node.status, note: "asleep: nothing of it runs. Wake it to ask it (its state is in the store)." };
        const row = agentId ? await sessionRow(agentId) : null;
        if (row) result.session = row;
      } else if (agentId && (path === `/sessions/${agentId}/agent` || path === `/sessions/${agentId}`)) {
        result = await call("debug_state", { agent_id: agentId, events: 10, messages: 5 });
        const files = result.config_files || (result.config && result.config.files);
        if (Array.isArray(files) && files.length) {
          $("detail-config-files").replaceChildren(...files.map((f) => el("li", { class: "mono",
            text: typeof f === "string" ? f : `${f.path}` + (f.layer ? ` (${f.layer})` : ""), title: f.digest ? `digest ${f.digest}` : undefined })));
          config.hidden = false;
        }
      } else {
        result = await call("actor.snapshot", { path });
      }
      if (state.selected === path) body.textContent = JSON.stringify(result, null, 2);
    } catch (error) {
      if (state.selected === path) {
        body.classList.add("error-text");
        body.textContent = String(error.message || error);
      }
    }
  }

  async function sessionRow(agentId) {
    const result = await call("sessions.page", { search: agentId, state: "active", limit: 20 });
    return result.rows.find((r) => r.agent_id === agentId) || null;
  }

  function drawActions(node) {
    const path = node.path;
    const agentId = agentOf(path);
    const topLevel = agentId && (path === `/sessions/${agentId}` || path === `/sessions/${agentId}/agent`);
    const asleep = asleepStatus(node.status);
    const buttons = [];
    if (topLevel) {
      buttons.push(el("button", { text: "send a prompt…", dataset: { action: "send" }, onclick: () => act("send", agentId) }));
      if (!asleep) buttons.push(el("button", { text: "abort turn", dataset: { action: "abort" }, onclick: () => act("abort", agentId) }));
      buttons.push(asleep
        ? el("button", { text: "wake", dataset: { action: "wake" }, onclick: () => act("wake", agentId) })
        : el("button", { text: "hibernate", dataset: { action: "hibernate" }, onclick: () => act("hibernate", agentId) }));
    }
    if (!asleep && (path.startsWith("/sessions/") || path.startsWith("/mcp/"))) {
      buttons.push(el("button", { class: "danger", text: "restart", dataset: { action: "restart" }, onclick: () => act("restart", path) }));
    }
    if (state.faultsEnabled && !asleep && path.startsWith("/sessions/")) {
      buttons.push(el("button", { class: "danger", text: "crash it", dataset: { action: "crash" }, onclick: () => act("crash", path) }));
    }
    if (topLevel) buttons.push(el("button", { class: "danger", text: "stop session", dataset: { action: "stop" }, onclick: () => act("stop", agentId) }));
    $("detail-actions").replaceChildren(...buttons);
  }

  $("detail-close").addEventListener("click", () => {
    state.selected = null;
    state.selectedNode = null;
    $("detail").hidden = true;
    drawTree();
    for (const n of sessionList.nodes.values()) n._key = undefined;
    sessionList.schedule();
  });
  $("detail-refresh").addEventListener("click", loadDetail);

  // Each action says what it will do and waits for a confirmation; then it goes through the JSON-RPC method.
  const ACTIONS = {
    send: (id) => ({ title: `Send a prompt to ${id}`, text: "It is queued as agent.prompt would queue it (waking the session if it sleeps); the answer appears in its conversation.", input: "the prompt",
      run: (text) => call("agent.send", { agent_id: id, text }), done: () => `sent to ${id}` }),
    abort: (id) => ({ title: `Abort ${id}'s turn`, text: "Its running turn stops now; tool calls still running are cancelled and answered [aborted]; prompts waiting for it are dropped. Its history is kept.",
      run: () => call("agent.abort", { agent_id: id }), done: (r) => r.aborted ? `aborted ${id}'s turn` : `${id} had no turn to abort` }),
    hibernate: (id) => ({ title: `Hibernate ${id}`, text: "If it is idle, its actors stop and a stub holds its place; its next message wakes it from the store. A busy session stays awake.",
      run: () => call("agent.hibernate", { agent_id: id }), done: (r) => r.hibernated ? `${id} is asleep` : `${id} stays awake: ${r.reason}` }),
    wake: (id) => ({ title: `Wake ${id}`, text: "Its actors start now, its agent restored from the store, as its next message would do.",
      run: () => call("agent.wake", { agent_id: id }), done: (r) => r.woken ? `${id} is awake` : `${id} was awake` }),
    stop: (id) => ({ title: `Stop session ${id}`, text: "The session stops for good: a running turn is aborted, it is not restored when the daemon starts again, and its saved tool outputs are removed. Its history stays in the store.",
      run: () => call("agent.stop", { agent_id: id }), done: (r) => r.stopped ? `${id} stopped` : `${id} was not running` }),
    restart: (path) => ({ title: `Restart ${path}`, text: "It is killed and its supervisor restarts it, as a crash would be (a supervised restart: its restarts go up by one). An agent comes back from its stored history; a turn it was running is reported interrupted.",
      run: () => call("actor.restart", { path }), done: (r) => `${path} restarted (restarts ${r.restarts})` }),
    crash: (path) => ({ title: `Arm a crash of ${path}`, text: "A fault is armed: the next message it is told (not a call through its proxy) raises InjectedFault, it crashes, and its supervisor restarts it.",
      run: () => call("fault.inject", { fault: { target: "actor", kind: "crash", path, message: "[!Pc]*", count: 1 } }), done: (r) => `armed ${r.id}: ${path} crashes on the next message it is told` }),
  };

  async function act(name, target) {
    const action = ACTIONS[name](target);
    const answer = await confirmAction(action.title, action.text, action.input);
    if (answer === null) return;
    const note = $("detail-note");
    let said;
    try {
      said = action.done(await action.run(answer));
      note.classList.remove("error-text");
    } catch (error) {
      said = `${name} failed: ${error.message || error}`;
      note.classList.add("error-text");
    }
    if (["wake", "hibernate", "stop", "send", "restart"].includes(name)) sessions.changed(null, true);
    const node = state.selectedNode;
    if (node && ["wake", "hibernate", "stop", "send"].includes(name) && agentOf(node.path) === target) {
      // Its state changed: what the drawer offers changes with it.
      const row = await sessionRow(target).catch(() => null);
      node.status = row ? row.state : "stopped";
      drawActions(node);
    }
    if (!$("detail").hidden && state.selected) await loadDetail();
    note.textContent = said;
  }

  // A modal confirmation: resolves with "" (or the text typed) on confirm, null on cancel.
  function confirmAction(title, text, input) {
    const box = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    const field = $("confirm-input");
    field.hidden = !input;
    field.value = "";
    field.placeholder = input || "";
    box.hidden = false;
    (input ? field : $("confirm-ok")).focus();
    return new Promise((resolve) => {
      const finish = (value) => {
        box.hidden = true;
        $("confirm-ok").onclick = $("confirm-cancel").onclick = null;
        resolve(value);
      };
      $("confirm-ok").onclick = () => { if (input && !field.value.trim()) { field.focus(); return; } finish(input ? field.value : ""); };
      $("confirm-cancel").onclick = () => finish(null);
    });
  }
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && !$("confirm").hidden) $("confirm-cancel").click(); });

  // -- permission requests and questions, answered from here ------------------------------

  function drawPrompts() {
    const box = $("prompts");
    const items = [];
    for (const request of state.views.permissions || []) {
      const what = request.subject || JSON.stringify(request.arguments || {});
      const answer = (decision) => async () => {
        try { await call("permission.respond", { request_id: request.request_id, decision }); } catch (error) { alert(error.message); }
      };
      items.push(el("div", { class: "prompt permission", dataset: { request: request.request_id } },
        el("div", {}, el("strong", { text: request.tool }), ` wants to run (agent ${request.agent_id})`),
        el("div", { class: "what", text: short(what, 2000) }),
        request.reason ? el("div", { class: "muted", text: "asked because: " + request.reason }) : null,
        el("div", { class: "actions" },
          el("button", { class: "allow", text: "allow", onclick: answer("allow") }),
          el("button", { class: "allow", text: "always allow", onclick: answer("allow_always") }),
          el("button", { class: "deny", text: "deny", onclick: answer("deny") }))));
    }
    for (const question of state.views.questions || []) {
      const input = el("input", { size: 30, placeholder: "your answer" });
      const send = (text) => async () => {
        try { await call("ask_user.respond", { question_id: question.question_id, answer: text === undefined ? input.value : text }); } catch (error) { alert(error.message); }
      };
      items.push(el("div", { class: "prompt question", dataset: { question: question.question_id } },
        el("div", {}, el("strong", { text: "question" }), ` from agent ${question.agent_id}`),
        el("div", { class: "what", text: question.question }),
        el("div", { class: "actions" },
          ...(question.choices || []).map((choice) => el("button", { text: choice, onclick: send(choice) })),
          input, el("button", { text: "answer", onclick: send(undefined) }))));
    }
    box.replaceChildren(...items);
    agentGrid.schedule();
  }

  // -- the conversation ----------------------------------------------------------------------------

  async function watch(agentId) {
    if (!state.stream || state.watching === agentId) return;
    state.watching = agentId;
    try {
      await fetch("/api/watch", { method: "POST", headers: { ...auth, "Content-Type": "application/json" }, body: JSON.stringify({ stream: state.stream, agent_id: agentId }) });
    } catch (error) { /* the next hello watches again */ }
  }

  function showConversation(agentId) {
    state.convAgent = agentId;
    $("conv-agent").value = agentId;
    selectTab("conversation");
  }
  $("conv-agent").addEventListener("change", (e) => { state.convAgent = e.target.value.trim() || null; loadConversation(); });

  const scheduleConversation = later(() => loadConversation(), 250);

  async function loadConversation() {
    const agentId = state.convAgent;
    const box = $("conversation");
    if (!agentId) { box.replaceChildren(el("div", { class: "muted", text: "no agent has been active yet" })); return; }
    watch(agentId);
    const datalist = $("conv-agents");
    const awake = [];
    for (const block of sessions.blocks.values()) for (const r of block.rows) if (r.awake && awake.length < 50) awake.push(r.agent_id);
    datalist.replaceChildren(...awake.map((id) => el("option", { value: id })));
    try {
      const result = await call("agent.history", { agent_id: agentId, limit: 200 });
      if (state.convAgent !== agentId) return;
      const stick = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
      box.replaceChildren(...result.messages.map(drawMessage));
      if (stick || !box.dataset.agent || box.dataset.agent !== agentId) box.scrollTop = box.scrollHeight;  // the panel stays where it is
      box.dataset.agent = agentId;
      const row = findRow(agentId);
      $("conv-state").textContent = row ? `${row.state || row.status} · restarts ${row.restarts ?? 0}` : "";
    } catch (error) {
      box.replaceChildren(el("div", { class: "error-text", text: error.message }));
    }
  }

  function findRow(agentId) {
    for (const block of sessions.blocks.values()) for (const r of block.rows) if (r.agent_id === agentId) return r;
    return null;
  }

  function drawMessage(message) {
    const classes = ["msg", message.role];
    if (message.is_error) classes.push("error");
    const role = message.role === "tool" ? `tool result: ${message.name || ""}${message.is_error ? " (error)" : ""}` : message.role;
    const usage = message.usage;
    const head = el("div", { class: "role" }, el("span", { text: role }),
      message.time ? el("span", { class: "time", text: clock(message.time), title: new Date(message.time * 1000).toISOString() }) : null,
      usage ? el("span", { class: "tokens", text: `in ${count((usage.input_tokens || 0) + (usage.cache_read_tokens || 0) + (usage.cache_write_tokens || 0))} · out ${count(usage.output_tokens || 0)} tokens`, title: "this step's model call" }) : null);
    const node = el("div", { class: classes.join(" "), dataset: { seq: String(message.seq) } }, head);
    if (message.content) node.append(folded(message.content, ""));
    for (const tc of message.tool_calls || []) {
      const args = JSON.stringify(tc.arguments ?? tc.raw_arguments ?? {}, null, 1);
      node.append(el("div", { class: "call" }, `▶ ${tc.name} `, folded(args, "mono")));
    }
    return node;
  }

  // Live: text deltas are drawn as they come; anything that ends a message reloads the history.
  function liveConversation(event) {
    const box = $("conversation");
    const data = event.data || {};
    if (event.source !== `/sessions/${state.convAgent}/agent`) {
      return event.topic === "tool.finished" || event.topic === "tool.failed";
    }
    if (event.topic === "agent.message_start" || event.topic === "agent.message_delta") {
      let live = box.querySelector(".msg.live pre.live-text");
      if (!live) {
        box.append(el("div", { class: "msg assistant live" }, el("div", { class: "role" }, el("span", { text: "assistant (streaming)" }), el("span", { class: "time", text: clock(event.time) })), el("pre", { class: "live-text" })));
        live = box.querySelector(".msg.live pre.live-text");
      }
      if (event.topic === "agent.message_delta") {
        const stick = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
        live.textContent += data.text;
        if (stick) box.scrollTop = box.scrollHeight;
      }
    } else if (["agent.message_end", "agent.turn_start", "agent.turn_end", "agent.aborted", "agent.recovered"].includes(event.topic)) {
      return true;
    }
    return false;
  }

  $("conv-send").addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = $("conv-text").value.trim();
    if (!state.convAgent || !text) return;
    const ok = await confirmAction(`Send this prompt to ${state.convAgent}`, short(text, 400));
    if (ok === null) return;
    try {
      await call("agent.send", { agent_id: state.convAgent, text });
      $("conv-text").value = "";
      $("conv-state").textContent = "sent";
    } catch (error) { $("conv-state").textContent = "not sent: " + error.message; }
  });

  // -- events: the stream as it comes, or the daemon's whole history searched ----------------------

  const QUIET = new Set(["agent.message_delta", "tool.output"]);
  const events = { rows: [], searched: false, key: "" };
  const eventList = new VList($("events"), 20, (index, node) => {
    const event = events.rows[events.rows.length - 1 - index];  // newest first
    if (!event) { node.replaceChildren(); return; }
    fill(node, String(event.seq), () => {
      node.dataset.topic = event.topic;
      node.replaceChildren(
        el("span", { class: "muted", text: clock(event.time) }), el("span", { class: "topic", text: event.topic, title: event.topic }),
        el("span", { class: "src", text: event.source, title: event.source }),
        el("span", { class: "data", text: short(event.data, 300), title: short(JSON.stringify(event.data, null, 1), 4000) }));
    });
  });

  function eventFilter() {
    const topic = $("ev-topic").value.trim();
    const path = $("ev-path").value.trim();
    const quiet = $("ev-quiet").checked;
    const glob = topic ? new RegExp("^" + topic.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".") + "$") : null;
    return { topic, path, quiet, test: (e) => (!glob || glob.test(e.topic)) && (!path || e.source.startsWith(path)) && (quiet || !QUIET.has(e.topic)) };
  }

  // A filter runs on the server over every event the daemon holds ([server] event_history).
  async function searchEvents() {
    const f = eventFilter();
    const key = JSON.stringify([f.topic, f.path, f.quiet]);
    events.key = key;
    if (!f.topic && !f.path) {
      events.searched = false;
      events.rows = state.events.filter(f.test);
      drawEvents(`${count(events.rows.length)} of the stream`);
      return;
    }
    const p = { limit: 2000 };
    if (f.topic) p.topic = f.topic;
    if (f.path) p.source = f.path;
    if (!f.quiet) p.exclude = [...QUIET];
    try {
      const result = await call("events.query", p);
      if (events.key !== key) return;
      events.searched = true;
      events.rows = result.events;
      drawEvents(`${count(result.events.length)} found in the ${count(result.held)} events held (${count(result.published)} published)`);
    } catch (error) {
      $("ev-count").textContent = String(error.message || error);
    }
  }

  function liveEvents(fresh) {
    if ($("ev-pause").checked) return;
    const f = eventFilter();
    let added = 0;
    for (const event of fresh) if (f.test(event)) { events.rows.push(event); added += 1; }
    if (!added) return;
    if (events.rows.length > MAX_EVENTS * 2) events.rows.splice(0, events.rows.length - MAX_EVENTS * 2);
    if (state.tab === "events") drawEvents();
  }

  function drawEvents(note) {
    if (note) $("ev-count").textContent = note;
    eventList.setCount(events.rows.length);
    eventList.schedule();
  }

  for (const id of ["ev-topic", "ev-path"]) $(id).addEventListener("input", promptly(searchEvents, 100));
  $("ev-quiet").addEventListener("change", searchEvents);
  $("ev-pause").addEventListener("change", () => { if (!$("ev-pause").checked) searchEvents(); });

  // -- tasks, as a dependency graph --------------------------------------------------------------

  function drawTaskProjects() {
    const select = $("tasks-project");
    const projects = sessions.projects.map((p) => p.working_dir);
    if (state.tasksProject && !projects.includes(state.tasksProject)) projects.unshift(state.tasksProject);
    const joined = projects.join("\n");
    if (select.dataset.values === joined) return;
    select.dataset.values = joined;
    select.replaceChildren(el("option", { value: "", text: "(choose)" }), ...projects.map((p) => el("option", { value: p, text: p })));
    select.value = state.tasksProject || "";
  }

  $("tasks-project").addEventListener("change", (e) => { state.tasksProject = e.target.value || null; loadTasks(); });
  const scheduleTasks = later(() => loadTasks(), 300);

  async function loadTasks() {
    if (!state.tasksProject && state.lastActive) {
      // The project of the agent last active.
      const row = findRow(state.lastActive) || await sessionRow(state.lastActive).catch(() => null);
      if (row && row.working_dir) { state.tasksProject = row.working_dir; drawTaskProjects(); $("tasks-project").value = row.working_dir; }
    }
    const project = state.tasksProject;
    const box = $("tasks-graph");
    if (!project) { box.replaceChildren(el("div", { class: "muted", text: "no agent has been active yet: choose a project" })); return; }
    try {
      const result = await call("tasks.list", { working_dir: project });
      if (state.tasksProject === project) drawTaskGraph(result.tasks);
    } catch (error) {
      box.replaceChildren(el("div", { class: "error-text", text: error.message }));
    }
  }

  function drawTaskGraph(tasks) {
    const box = $("tasks-graph");
    $("tasks-info").textContent = `${tasks.length} task${tasks.length === 1 ? "" : "s"}; arrows go from a task to the tasks it blocks`;
    if (!tasks.length) { box.replaceChildren(el("div", { class: "muted", text: "no tasks in this project" })); return; }
    const byId = new Map(tasks.map((t) => [t.id, t]));
    const level = new Map();
    const depth = (task, seen) => {
      if (level.has(task.id)) return level.get(task.id);
      if (seen.has(task.id)) return 0;  // a cycle cannot be stored; be safe anyway
      seen.add(task.id);
      let d = 0;
      for (const blocker of task.blocked_by || []) if (byId.has(blocker)) d = Math.max(d, depth(byId.get(blocker), seen) + 1);
      level.set(task.id, d);
      return d;
    };
    for (const task of tasks) depth(task, new Set());
    const columns = [];
    for (const task of tasks) (columns[level.get(task.id)] ||= []).push(task);
    const W = 190, H = 44, GX = 60, GY = 14;
    const pos = new Map();
    columns.forEach((column, x) => column.forEach((task, y) => pos.set(task.id, { x: 10 + x * (W + GX), y: 10 + y * (H + GY) })));
    const width = 20 + columns.length * (W + GX);
    const height = 20 + Math.max(...columns.map((c) => c.length)) * (H + GY);
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    const defs = document.createElementNS(NS, "defs");
    const marker = document.createElementNS(NS, "marker");
    for (const [k, v] of Object.entries({ id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto" })) marker.setAttribute(k, v);
    const tip = document.createElementNS(NS, "path");
    tip.setAttribute("d", "M 0 0 L 10 5 L 0 10 z");
    tip.setAttribute("fill", "#8a8f8c");
    marker.append(tip);
    defs.append(marker);
    svg.append(defs);
    for (const task of tasks) {
      for (const blocker of task.blocked_by || []) {
        const a = pos.get(blocker), b = pos.get(task.id);
        if (!a || !b) continue;
        const path = document.createElementNS(NS, "path");
        const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
        path.setAttribute("d", `M ${x1} ${y1} C ${x1 + GX / 2} ${y1}, ${x2 - GX / 2} ${y2}, ${x2} ${y2}`);
        path.setAttribute("class", "edge");
        path.setAttribute("marker-end", "url(#arrow)");
        svg.append(path);
      }
    }
    for (const task of tasks) {
      const p = pos.get(task.id);
      const g = document.createElementNS(NS, "g");
      g.setAttribute("class", "task " + task.status);
      g.setAttribute("data-task", task.id);
      const rect = document.createElementNS(NS, "rect");
      for (const [k, v] of Object.entries({ x: p.x, y: p.y, width: W, height: H, rx: 4 })) rect.setAttribute(k, v);
      const title = document.createElementNS(NS, "text");
      title.setAttribute("x", p.x + 6);
      title.setAttribute("y", p.y + 16);
      title.textContent = `#${task.id} ${short(task.title, 26)}`;
      const status = document.createElementNS(NS, "text");
      status.setAttribute("x", p.x + 6);
      status.setAttribute("y", p.y + 33);
      status.setAttribute("fill", "#6b756f");
      status.textContent = task.status + (task.parent_id ? ` · part of #${task.parent_id}` : "");
      const tooltip = document.createElementNS(NS, "title");
      tooltip.textContent = `${task.title}\n${task.notes || ""}`;
      g.append(rect, title, status, tooltip);
      svg.append(g);
    }
    box.replaceChildren(svg);
  }

  // -- MCP servers -------------------------------------------------------------------------------

  function drawMcp() {
    const servers = state.views.mcp || [];
    const box = $("mcp");
    if (state.viewErrors.mcp) { box.replaceChildren(el("div", { class: "error-text", text: state.viewErrors.mcp })); return; }
    if (!servers.length) { box.replaceChildren(el("div", { class: "muted", text: "no MCP servers configured" })); return; }
    // Whatever fields the daemon reports, one column each: the known ones first, in this order.
    const known = ["server", "status", "transport", "tools", "restarts", "attempt", "failed_starts", "last_error", "retry_at", "recent_logs"];
    const keys = [...new Set([...known.filter((k) => servers.some((s) => k in s)), ...servers.flatMap((s) => Object.keys(s))])]
      .filter((k) => k !== "retry_in");
    const cell = (k, v) => {
      if (v === null || v === undefined) return "";
      if (k === "retry_at" && typeof v === "number") return `${clock(v)} (in ${Math.max(0, Math.round(v - Date.now() / 1000))} s)`;
      if (k === "recent_logs" && Array.isArray(v)) return v.map((log) => `${log.level}: ${short(log.data, 80)}`).join("\n");
      return typeof v === "object" ? JSON.stringify(v) : String(v);
    };
    const table = el("table", { class: "grid-table" },
      el("thead", {}, el("tr", {}, ...keys.map((k) => el("th", { text: k === "retry_at" ? "next retry" : k.replace(/_/g, " ") })))),
      el("tbody", {}, ...servers.map((s) => el("tr", { dataset: { server: s.server || "" } },
        ...keys.map((k) => el("td", { class: k === "last_error" || k === "recent_logs" ? "mono" : undefined, text: cell(k, s[k]) }))))));
    box.replaceChildren(table);
  }

  // -- faults ----------------------------------------------------------------------------------------

  function drawFaults() {
    const result = state.views.faults;
    const tbody = $("faults").querySelector("tbody");
    if (!result) { tbody.replaceChildren(); return; }
    tbody.replaceChildren(...result.faults.map((f) => {
      const where = f.spec.path || f.spec.tool || f.spec.server || f.spec.model || "*";
      return el("tr", { dataset: { fault: f.id } }, el("td", { class: "mono", text: f.id }), el("td", { text: f.target }),
        el("td", { text: f.kind }), el("td", { class: "mono", text: where }), el("td", { class: "fires", text: String(f.fires) }),
        el("td", { text: String(f.matches) + (f.exhausted ? " (spent)" : "") }),
        el("td", {}, el("button", { text: "clear", onclick: () => clearFault(f.id) })));
    }));
  }

  async function clearFault(id) {
    try { await call("fault.clear", id ? { id } : {}); } catch (error) { $("fault-result").textContent = error.message; }
  }
  $("fault-clear-all").addEventListener("click", () => clearFault(null));

  const WHERE = { actor: ["path", "path"], tool: ["tool", "tool"], mcp: ["server", "server"], provider: ["model", "model"] };
  // What each fault does, said before it is armed.
  function explainFault(target, kind, where, message, seconds, prompt) {
    const at = where || "*";
    const times = Number($("fault-count").value) > 1 ? `${$("fault-count").value} times` : "once";
    if (target === "actor") {
      const next = message === "[!Pc]*" ? "the next message it is told (not a call through its proxy, which a crash only fails)" : `the next message matching ${message}`;
      const agent = /^\/sessions\/[^/*]+\/agent$/.test(at);
      const visible = agent && prompt ? ` Then the agent is sent a prompt: its turn's first streamed message is that message.` : "";
      if (kind === "crash") return `${at} crashes on ${next}, ${times}: its supervisor restarts it (restarts +1, the node flashes)` + (agent ? ", the agent comes back from its stored history and the turn is reported interrupted." : ".") + visible;
      if (kind === "delay") return `${next.replace(/^the next/, "Each")} of ${at} waits ${seconds} s before it is handled (${times}); what comes after queues behind it: its mailbox grows.` + visible;
      if (kind === "fatal_signal") return `At ${next} of ${at}, the whole daemon process is killed by a fatal signal (SIGSEGV), as a crash in C code would: every session stops, this page goes offline, and the next start reports how the run ended.`;
      return `${next.replace(/^the next/, "The next")} of ${at} is thrown away (${times}); an ask dropped is never answered, so its caller waits for its own timeout.` + visible;
    }
    if (target === "tool") {
      return { hang: `The next call of ${at} never ends until its timeout (tools.timeouts) cancels it: the model gets a timeout error.`,
        crash: `The next call of ${at} fails with an error result for the model; the agent carries on.`,
        kill_subprocess: `The next call of ${at} has its subprocess killed mid-run: the model gets the error.`,
        delay: `The next call of ${at} starts ${seconds} s late.` }[kind] || "";
    }
    if (target === "mcp") {
      return { kill_server: `The MCP server ${at} is killed at its next request: its connection is restarted with backoff.`,
        hang: `The next request to the MCP server ${at} never answers until its call_timeout.` }[kind] || "";
    }
    return { http_error: `The next model call to ${at} gets an HTTP error: the provider retries it.`,
      timeout: `The next model call to ${at} times out: the provider retries it.`,
      malformed_stream: `The next model call to ${at} streams an answer that cannot be parsed: the turn fails with the error.` }[kind] || "";
  }

  function drawFaultForm(keepWhere) {
    const target = $("fault-target").value;
    const kinds = state.faultKinds[target] || [];
    const kindSelect = $("fault-kind");
    if (kindSelect.dataset.target !== target) {
      kindSelect.dataset.target = target;
      kindSelect.replaceChildren(...kinds.map((k) => el("option", { value: k, text: k })));
    }
    const kind = kindSelect.value;
    $("fault-where-name").textContent = WHERE[target][0];
    if (!keepWhere || !state.faultWhereTouched) {
      const agent = state.lastActive;
      $("fault-where").value = target === "actor" ? (agent ? `/sessions/${agent}/agent` : "/sessions/*/agent") : "*";
    }
    $("fault-message-label").hidden = target !== "actor";
    $("fault-seconds-label").hidden = kind !== "delay";
    const where = $("fault-where").value.trim();
    $("fault-prompt-label").hidden = !(target === "actor" && /^\/sessions\/[^/*]+\/agent$/.test(where));
    $("fault-explain").textContent = explainFault(target, kind, where, $("fault-message").value.trim() || "*", $("fault-seconds").value, $("fault-prompt").checked);
  }
  $("fault-target").addEventListener("change", () => { state.faultWhereTouched = false; drawFaultForm(false); });
  $("fault-where").addEventListener("input", () => { state.faultWhereTouched = true; });
  for (const id of ["fault-kind", "fault-where", "fault-message", "fault-seconds", "fault-count", "fault-prompt"]) {
    $(id).addEventListener(id === "fault-kind" || id === "fault-prompt" ? "change" : "input", () => drawFaultForm(true));
  }

  $("fault-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    let fault;
    const raw = $("fault-json").value.trim();
    let prompt = null;
    try {
      if (raw) fault = JSON.parse(raw);
      else {
        const target = $("fault-target").value;
        fault = { target, kind: $("fault-kind").value };
        const where = $("fault-where").value.trim();
        if (where) fault[WHERE[target][1]] = where;
        if (target === "actor" && $("fault-message").value.trim()) fault.message = $("fault-message").value.trim();
        if (fault.kind === "delay") fault.seconds = Number($("fault-seconds").value);
        if ($("fault-count").value) fault.count = Number($("fault-count").value);
        if (!$("fault-prompt-label").hidden && $("fault-prompt").checked) prompt = agentOf(where);
      }
      const result = await call("fault.inject", { fault });
      let text = `armed ${result.id}`;
      if (prompt) {
        await call("agent.send", { agent_id: prompt, text: "Carry on (the observer's fault form sent this prompt to start a turn)." });
        text += `; prompted ${prompt}`;
      }
      $("fault-result").textContent = text;
      $("fault-result").className = "muted";
    } catch (error) {
      $("fault-result").textContent = error.message;
      $("fault-result").className = "error-text";
    }
  });

  // -- tabs ---------------------------------------------------------------------------------------------

  function selectTab(name) {
    state.tab = name;
    for (const button of document.querySelectorAll("#tabs button")) button.classList.toggle("active", button.dataset.tab === name);
    for (const tab of document.querySelectorAll(".tab")) tab.hidden = tab.id !== "tab-" + name;
    clearInterval(processes.timer);
    processes.timer = null;
    if (name === "agents") agentGrid.refresh();
    if (name === "events") searchEvents();
    if (name === "tasks") loadTasks();
    if (name === "system") { buildCharts(); drawSystem(); }
    if (name === "processes") { loadProcesses(); processes.timer = setInterval(loadProcesses, 1000); }
    if (name === "faults") drawFaultForm(true);
    if (name === "conversation") {
      if (!state.convAgent) { state.convAgent = state.lastActive; $("conv-agent").value = state.convAgent || ""; }
      loadConversation();
    }
  }
  for (const button of document.querySelectorAll("#tabs button")) button.addEventListener("click", () => selectTab(button.dataset.tab));

  if (!token) {
    $("daemon-info").textContent = "no token: open this page with `weald observe`";
  } else {
    stream();
  }
})();
