// The weald observer page: plain JavaScript, no build step, nothing loaded from elsewhere.
// Everything it shows comes from the daemon's own JSON-RPC methods (POST /api/call) and its
// event stream (GET /api/stream, server-sent events): nothing here polls.
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const token = params.get("token") || sessionStorage.getItem("weald-observer-token") || "";
  sessionStorage.setItem("weald-observer-token", token);
  const auth = { Authorization: "Bearer " + token };

  const $ = (id) => document.getElementById(id);
  const state = {
    daemon: null,
    views: {},           // name -> result of the view's method (tree, agents, permissions...)
    viewErrors: {},
    events: [],          // the last MAX_EVENTS events, oldest first
    running: new Map(),  // call id -> {tool, agent, started, arguments}
    restarts: new Map(), // node path -> restarts last drawn
    flashUntil: new Map(),
    collapsed: new Set(),
    selected: null,      // the node shown in the detail drawer
    faultsEnabled: false,
    convAgent: null,
    tasksProject: null,
  };
  const MAX_EVENTS = 2000;
  const SHOWN_EVENTS = 400;

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

  function globToRegExp(glob) {
    const escaped = glob.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
    return new RegExp("^" + escaped + "$");
  }

  // Long text is folded: its first line shows, the rest opens on a click.
  function folded(text, cls) {
    const lines = text.split("\n");
    if (text.length <= 600 && lines.length <= 12) return el("pre", { class: cls, text });
    const head = lines[0].slice(0, 120);
    return el("details", {}, el("summary", { text: `${head} … (${lines.length} lines, ${text.length} chars)` }),
      el("pre", { class: cls, text }));
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
    else if (name === "events") onEvents(data.events, data.dropped);
  }

  function onHello(data) {
    state.daemon = data.daemon;
    state.faultsEnabled = data.faults_enabled;
    state.events = [];
    state.running.clear();
    $("faults-off").hidden = state.faultsEnabled;
    $("faults-on").hidden = !state.faultsEnabled;
    drawDaemon();
    onEvents(data.events || [], 0);
  }

  function drawDaemon() {
    const d = state.daemon;
    if (!d) return;
    const agents = state.views.agents ? state.views.agents.length : d.agents;
    $("daemon-info").textContent = `pid ${d.pid} · weald ${d.version} · ${agents} agent${agents === 1 ? "" : "s"} · ` +
      `store ${d.store}` + (d.faults_enabled ? " · fault injection on" : "");
  }

  function onView(name, outcome) {
    if (outcome.error) {
      state.viewErrors[name] = outcome.error.message;
    } else {
      delete state.viewErrors[name];
      state.views[name] = outcome.result;
    }
    if (name === "tree") drawTree();
    else if (name === "agents") { drawAgents(); drawDaemon(); drawAgentChoices(); }
    else if (name === "permissions" || name === "questions") drawPrompts();
    else if (name === "mcp") drawMcp();
    else if (name === "faults") drawFaults();
  }

  function onEvents(events, dropped) {
    if (dropped) {
      const note = $("dropped");
      note.hidden = false;
      note.textContent = `${dropped} events dropped (this page fell behind)`;
    }
    let reloadConversation = false;
    let reloadTasks = false;
    const tasksAgents = projectAgents(state.tasksProject);
    for (const event of events) {
      state.events.push(event);
      const data = event.data || {};
      const topic = event.topic;
      if (topic === "tool.started") {
        state.running.set(data.call_id, { tool: data.tool, agent: data.agent, started: event.time, arguments: data.arguments });
      } else if (topic === "tool.finished" || topic === "tool.failed") {
        state.running.delete(data.call_id);
        if (data.tool === "tasks" && tasksAgents.has(agentOf(event.source))) reloadTasks = true;
      } else if (topic === "supervisor.child_crashed" || topic === "supervisor.child_restarted" || topic === "fault.injected") {
        flash(data.path || event.source);
      } else if (topic === "agent.turn_end" || topic === "agent.aborted") {
        for (const [id, run] of state.running) if (run.agent === event.source) state.running.delete(id);
      }
      if (state.convAgent && agentOf(event.source) === state.convAgent) {
        if (liveConversation(event)) reloadConversation = true;
      }
    }
    if (state.events.length > MAX_EVENTS) state.events.splice(0, state.events.length - MAX_EVENTS);
    if (!$("ev-pause").checked) drawEvents();
    if (reloadConversation) scheduleConversation();
    if (reloadTasks) loadTasks();
    drawRunning();
  }

  // -- the tree -------------------------------------------------------------------------------

  function flash(path) {
    if (!path) return;
    state.flashUntil.set(path, Date.now() + 1500);
    const node = document.querySelector(`.node[data-path="${CSS.escape(path)}"]`);
    if (node) {
      node.classList.add("flash");
      setTimeout(() => node.classList.remove("flash"), 1500);
    }
  }

  function drawTree() {
    const root = state.views.tree;
    const box = $("tree");
    if (!root) {
      box.textContent = state.viewErrors.tree || "";
      return;
    }
    let count = 0;
    const now = Date.now();
    const build = (node) => {
      count += 1;
      const before = state.restarts.get(node.path);
      if (before !== undefined && node.restarts > before) state.flashUntil.set(node.path, now + 1500);
      state.restarts.set(node.path, node.restarts);
      const name = node.path === "/" ? "/" : node.path.slice(node.path.lastIndexOf("/") + 1);
      const status = String(node.status || "").replace(/[^a-z_-]/gi, "-");
      const classes = ["node", "st-" + status];
      if ((state.flashUntil.get(node.path) || 0) > now) classes.push("flash");
      if (state.selected === node.path) classes.push("selected");
      const kids = node.children || [];
      const collapsed = state.collapsed.has(node.path);
      const toggle = kids.length
        ? el("span", { class: "toggle", text: collapsed ? "▸" : "▾", onclick: (e) => {
            e.stopPropagation();
            if (collapsed) state.collapsed.delete(node.path); else state.collapsed.add(node.path);
            drawTree();
          } })
        : el("span", { class: "toggle" });
      const card = el("span", {
        class: classes.join(" "), dataset: { path: node.path, restarts: String(node.restarts) },
        title: node.path, onclick: () => openDetail(node),
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
      node.children_hidden ? el("span", { class: "badge", text: `+${node.children_hidden}` }) : null);
      const item = el("li", {}, toggle, card);
      if (kids.length && !collapsed) item.append(el("ul", {}, ...kids.map(build)));
      return item;
    };
    const tree = el("ul", {}, build(root));
    box.replaceChildren(tree);
    $("tree-count").textContent = `${count} actors`;
    if (state.selected) refreshDetailNote();
  }

  function findNode(path) {
    const stack = state.views.tree ? [state.views.tree] : [];
    while (stack.length) {
      const node = stack.pop();
      if (node.path === path) return node;
      stack.push(...(node.children || []));
    }
    return null;
  }

  // -- the detail drawer: snapshot() or debug_state ------------------------------------------

  async function openDetail(node) {
    state.selected = node.path;
    $("detail").hidden = false;
    $("detail-title").textContent = `${node.path} (${node.kind})`;
    $("detail-crash").hidden = !state.faultsEnabled;
    $("detail-crash").dataset.path = node.path;
    drawTree();
    await loadDetail();
  }

  function refreshDetailNote() {
    const node = findNode(state.selected);
    $("detail-note").textContent = node
      ? `status ${node.status} · restarts ${node.restarts} · mailbox ${node.mailbox}` + (node.faults ? ` · faults fired ${node.faults}` : "")
      : "this actor is gone";
  }

  async function loadDetail() {
    const path = state.selected;
    if (!path) return;
    refreshDetailNote();
    const body = $("detail-body");
    body.classList.remove("error-text");
    const node = findNode(path);
    const agentId = agentOf(path);
    try {
      let result;
      if (node && node.kind === "Agent" && path === `/sessions/${agentId}/agent`) {
        result = await call("debug_state", { agent_id: agentId, events: 10, messages: 5 });
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

  $("detail-close").addEventListener("click", () => {
    state.selected = null;
    $("detail").hidden = true;
    drawTree();
  });
  $("detail-refresh").addEventListener("click", loadDetail);
  $("detail-crash").addEventListener("click", async () => {
    const path = $("detail-crash").dataset.path;
    try {
      // "[!Pc]*": the next message it is told; not a proxy call (ProxyCall, "call:<method>"), which an
      // injected crash only fails (docs/faults.md), such as this page's own snapshots.
      const fault = { target: "actor", kind: "crash", path, message: "[!Pc]*", count: 1 };
      const result = await call("fault.inject", { fault });
      $("detail-note").textContent = `armed ${result.id}: ${path} crashes on the next message it is told`;
    } catch (error) {
      $("detail-note").textContent = "inject failed: " + error.message;
    }
  });

  // -- agents ----------------------------------------------------------------------------------

  function usageText(usage) {
    if (!usage) return "";
    return `${usage.input_tokens || 0} / ${usage.output_tokens || 0}`;
  }

  // agent.list's `context` (ContextStats): the next request's estimated size against the input budget.
  function contextText(agent) {
    const ctx = agent.context;
    if (!ctx || typeof ctx !== "object" || !ctx.input_budget) return "";
    const pct = Math.round((100 * ctx.tokens) / ctx.input_budget);
    return `${pct}% (${ctx.tokens}/${ctx.input_budget})` + (ctx.compactions ? ` · ${ctx.compactions} compacted` : "");
  }

  function drawAgents() {
    const tbody = $("agents").querySelector("tbody");
    const agents = state.views.agents || [];
    const rows = agents.map((agent) => {
      const stateName = agent.state || agent.status || "";
      const waiting = [];
      for (const p of state.views.permissions || []) if (p.agent_id === agent.agent_id) waiting.push("permission");
      for (const q of state.views.questions || []) if (q.agent_id === agent.agent_id) waiting.push("question");
      const row = el("tr", { class: "clickable", dataset: { agent: agent.agent_id }, onclick: () => showConversation(agent.agent_id) },
        el("td", { class: "mono", text: agent.agent_id }),
        el("td", { class: "state-" + stateName, text: stateName }),
        el("td", { text: agent.step ? String(agent.step) : "" }),
        el("td", { class: "tokens", text: usageText(agent.usage) }),
        el("td", { class: "context", text: contextText(agent) }),
        el("td", { class: "restarts", text: agent.restarts === undefined ? "" : String(agent.restarts) }),
        el("td", { class: "running", dataset: { path: agent.path } }),
        el("td", { text: waiting.join(", ") }),
        el("td", {}, agent.turn_id ? el("button", { text: "abort", onclick: async (e) => {
          e.stopPropagation();
          try { await call("agent.abort", { agent_id: agent.agent_id }); } catch (error) { alert(error.message); }
        } }) : null));
      return row;
    });
    tbody.replaceChildren(...rows);
    if (state.viewErrors.agents) tbody.append(el("tr", {}, el("td", { colspan: 9, class: "error-text", text: state.viewErrors.agents })));
    drawRunning();
  }

  function drawRunning() {
    const now = Date.now() / 1000;
    for (const cell of document.querySelectorAll("#agents td.running")) {
      const items = [];
      for (const run of state.running.values()) {
        if (run.agent === cell.dataset.path) {
          items.push(el("span", { class: "tool-running mono", text: `${run.tool} ${seconds(Math.max(0, now - run.started))}` }));
        }
      }
      cell.replaceChildren(...items);
    }
  }
  setInterval(() => { if (state.running.size) drawRunning(); }, 500);  // elapsed times tick; nothing is fetched

  // -- permission requests and questions, answered from here ------------------------------

  function drawPrompts() {
    const box = $("prompts");
    const items = [];
    for (const request of state.views.permissions || []) {
      const what = request.subject || JSON.stringify(request.arguments || {});
      const answer = (decision) => async () => {
        try {
          await call("permission.respond", { request_id: request.request_id, decision });
        } catch (error) { alert(error.message); }
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
        try {
          await call("ask_user.respond", { question_id: question.question_id, answer: text === undefined ? input.value : text });
        } catch (error) { alert(error.message); }
      };
      items.push(el("div", { class: "prompt question", dataset: { question: question.question_id } },
        el("div", {}, el("strong", { text: "question" }), ` from agent ${question.agent_id}`),
        el("div", { class: "what", text: question.question }),
        el("div", { class: "actions" },
          ...(question.choices || []).map((choice) => el("button", { text: choice, onclick: send(choice) })),
          input, el("button", { text: "answer", onclick: send(undefined) }))));
    }
    box.replaceChildren(...items);
    drawAgents();
  }

  // -- the conversation -----------------------------------------------------------------------

  function drawAgentChoices() {
    const agents = state.views.agents || [];
    const select = $("conv-agent");
    const ids = agents.map((a) => a.agent_id);
    if (select.dataset.ids !== ids.join(",")) {
      select.dataset.ids = ids.join(",");
      select.replaceChildren(el("option", { value: "", text: "(choose)" }), ...ids.map((id) => el("option", { value: id, text: id })));
      select.value = state.convAgent || "";
    }
    const projects = [...new Set(agents.map((a) => a.working_dir))];
    const projectSelect = $("tasks-project");
    if (projectSelect.dataset.ids !== projects.join("\n")) {
      projectSelect.dataset.ids = projects.join("\n");
      projectSelect.replaceChildren(el("option", { value: "", text: "(choose)" }), ...projects.map((p) => el("option", { value: p, text: p })));
      projectSelect.value = state.tasksProject || "";
    }
    const agent = agents.find((a) => a.agent_id === state.convAgent);
    $("conv-state").textContent = agent ? `${agent.state || agent.status} · restarts ${agent.restarts ?? ""}` : "";
  }

  function showConversation(agentId) {
    state.convAgent = agentId;
    $("conv-agent").value = agentId;
    selectTab("conversation");
    loadConversation();
  }
  $("conv-agent").addEventListener("change", (e) => { state.convAgent = e.target.value || null; loadConversation(); });

  let conversationTimer = null;
  function scheduleConversation() {
    if (conversationTimer) return;
    conversationTimer = setTimeout(() => { conversationTimer = null; loadConversation(); }, 250);
  }

  async function loadConversation() {
    const agentId = state.convAgent;
    const box = $("conversation");
    if (!agentId) { box.replaceChildren(); return; }
    try {
      const result = await call("agent.history", { agent_id: agentId, limit: 200 });
      if (state.convAgent !== agentId) return;
      box.replaceChildren(...result.messages.map(drawMessage));
      box.lastElementChild && box.lastElementChild.scrollIntoView({ block: "nearest" });
    } catch (error) {
      box.replaceChildren(el("div", { class: "error-text", text: error.message }));
    }
  }

  function drawMessage(message) {
    const classes = ["msg", message.role];
    if (message.is_error) classes.push("error");
    const role = message.role === "tool" ? `tool result: ${message.name || ""}${message.is_error ? " (error)" : ""}` : message.role;
    const node = el("div", { class: classes.join(" ") }, el("div", { class: "role", text: role }));
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
    if (!event.source.endsWith("/agent") || event.source !== `/sessions/${state.convAgent}/agent`) {
      return event.topic === "tool.finished" || event.topic === "tool.failed";
    }
    if (event.topic === "agent.message_start") {
      box.append(el("div", { class: "msg assistant live" }, el("div", { class: "role", text: "assistant (streaming)" }), el("pre", { class: "live-text" })));
    } else if (event.topic === "agent.message_delta") {
      let live = box.querySelector(".msg.live pre.live-text");
      if (!live) {
        box.append(el("div", { class: "msg assistant live" }, el("div", { class: "role", text: "assistant (streaming)" }), el("pre", { class: "live-text" })));
        live = box.querySelector(".msg.live pre.live-text");
      }
      live.textContent += data.text;
      live.scrollIntoView({ block: "nearest" });
    } else if (["agent.message_end", "agent.turn_start", "agent.turn_end", "agent.aborted", "agent.recovered"].includes(event.topic)) {
      return true;
    }
    return false;
  }

  // -- events -------------------------------------------------------------------------------------

  for (const id of ["ev-topic", "ev-path"]) $(id).addEventListener("input", drawEvents);
  $("ev-pause").addEventListener("change", drawEvents);

  function drawEvents() {
    const topic = $("ev-topic").value.trim();
    const path = $("ev-path").value.trim();
    const topicRe = topic ? globToRegExp(topic) : null;
    const shown = [];
    for (let i = state.events.length - 1; i >= 0 && shown.length < SHOWN_EVENTS; i--) {
      const event = state.events[i];
      if (topicRe && !topicRe.test(event.topic)) continue;
      if (path && !event.source.startsWith(path)) continue;
      shown.push(event);
    }
    const rows = shown.map((event) => {
      const time = new Date(event.time * 1000).toLocaleTimeString();
      const data = el("span", { class: "data", text: JSON.stringify(event.data) });
      data.addEventListener("click", () => data.classList.toggle("open"));
      return el("div", { class: "ev", dataset: { topic: event.topic } },
        el("span", { class: "muted", text: time }), el("span", { class: "topic", text: event.topic }),
        el("span", { class: "src", text: event.source, title: event.source }), data);
    });
    $("events").replaceChildren(...rows);
    $("ev-count").textContent = `${shown.length} shown of ${state.events.length}`;
  }

  // -- tasks, as a dependency graph --------------------------------------------------------------

  function projectAgents(project) {
    return new Set((state.views.agents || []).filter((a) => a.working_dir === project).map((a) => a.agent_id));
  }

  $("tasks-project").addEventListener("change", (e) => { state.tasksProject = e.target.value || null; loadTasks(); });

  async function loadTasks() {
    const project = state.tasksProject;
    const box = $("tasks-graph");
    if (!project) { box.replaceChildren(); return; }
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
      if (k === "retry_at" && typeof v === "number") return `${new Date(v * 1000).toLocaleTimeString()} (in ${Math.max(0, Math.round(v - Date.now() / 1000))} s)`;
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

  $("fault-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    let fault;
    const raw = $("fault-json").value.trim();
    try {
      if (raw) fault = JSON.parse(raw);
      else {
        fault = { target: $("fault-target").value, kind: $("fault-kind").value.trim() };
        if ($("fault-path").value.trim()) fault.path = $("fault-path").value.trim();
        if ($("fault-message").value.trim() && fault.target === "actor") fault.message = $("fault-message").value.trim();
        if ($("fault-count").value) fault.count = Number($("fault-count").value);
      }
      const result = await call("fault.inject", { fault });
      $("fault-result").textContent = `armed ${result.id}`;
      $("fault-result").className = "muted";
    } catch (error) {
      $("fault-result").textContent = error.message;
      $("fault-result").className = "error-text";
    }
  });

  // -- tabs ---------------------------------------------------------------------------------------------

  function selectTab(name) {
    for (const button of document.querySelectorAll("#tabs button")) button.classList.toggle("active", button.dataset.tab === name);
    for (const tab of document.querySelectorAll(".tab")) tab.hidden = tab.id !== "tab-" + name;
    if (name === "events") drawEvents();
    if (name === "tasks") loadTasks();
  }
  for (const button of document.querySelectorAll("#tabs button")) button.addEventListener("click", () => selectTab(button.dataset.tab));

  if (!token) {
    $("daemon-info").textContent = "no token: open this page with `weald observe`";
  } else {
    stream();
  }
})();
