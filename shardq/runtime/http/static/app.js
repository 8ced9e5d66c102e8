// The shardq dashboard: plain JavaScript over the REST routes of this same server. No build
// step and nothing fetched from elsewhere, so it works offline. Every value from the server is
// put on the page as text (textContent), never as HTML.
"use strict";

const PAGE = 20;
const STATES = ["waiting", "prioritized", "delayed", "active", "completed", "failed"];
const view = document.getElementById("view");
let lastTotals = null;

// -- talking to the server

function token() { return sessionStorage.getItem("shardq-token"); }

async function api(path, options = {}) {
  const headers = { "Content-Type": "application/json" };
  if (token()) headers.Authorization = "Bearer " + token();
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    document.getElementById("login").hidden = false;
    throw new Error("this server needs a token");
  }
  const body = await response.json();
  if (!body.ok && response.status !== 503) throw new Error(body.error || response.statusText);
  return body;
}

async function getJson(path) {
  const headers = token() ? { Authorization: "Bearer " + token() } : {};
  const response = await fetch(path, { headers });
  if (response.status === 401) {
    document.getElementById("login").hidden = false;
    throw new Error("this server needs a token");
  }
  if (!response.ok) throw new Error((await response.json()).error || response.statusText);
  return response.json();
}

const post = (path, body = {}) => api(path, { method: "POST", body: JSON.stringify(body) });
const del = (path) => api(path, { method: "DELETE" });
const q = (name) => encodeURIComponent(name);

// -- building the page

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "onclick") node.addEventListener("click", value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  }
  return node;
}

function table(headers, rows, testid) {
  return el("table", { "data-testid": testid },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { class: h.num ? "num" : "" }, h.label ?? h)))),
    el("tbody", {}, rows.length ? rows : [el("tr", {}, el("td", { colspan: headers.length, class: "muted" }, "Nothing here."))]));
}

const num = (value) => el("td", { class: "num" }, value ?? 0);
const when = (ms) => (ms ? new Date(ms).toLocaleString() : "—");
const json = (value) => el("pre", {}, JSON.stringify(value, null, 2));

function button(label, action, attrs = {}) {
  return el("button", { ...attrs, onclick: async () => {
    try { await action(); await route(); } catch (e) { showError(e); }
  } }, label);
}

function showError(error) {
  const node = document.getElementById("error");
  node.textContent = error ? String(error.message || error) : "";
  node.hidden = !error;
}

// -- views

const rate = (value, kind) => el("td", { class: "num", "data-rate": kind },
  value === null || value === undefined ? "—" : value.toFixed(1));
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

async function queuesView() {
  const summary = await getJson("/queues/summary");  // a bare list, as bunqueue answers it
  const overview = await api("/dashboard");
  const rows = summary.map(({ name, paused: isPaused, counts: c, throughput: t = {} }) => {
    return el("tr", { "data-queue": name },
      el("td", {}, el("a", { href: `#/queue/${q(name)}/waiting/0` }, name), isPaused ? el("span", { class: "muted" }, " (paused)") : ""),
      ...STATES.map((s) => num(c[s])),
      rate(t.pushPerSec, "push"), rate(t.completePerSec, "complete"),
      el("td", {},
        isPaused ? button("Resume", () => post(`/queues/${q(name)}/resume`), { "data-action": "resume" })
          : button("Pause", () => post(`/queues/${q(name)}/pause`), { "data-action": "pause" }),
        " ", el("a", { href: `#/dlq/${q(name)}` }, "DLQ")));
  });
  const headers = ["Queue", ...STATES.map((s) => ({ label: s, num: true })),
    { label: "pushed/s", num: true }, { label: "completed/s", num: true }, ""];
  const facts = el("p", { class: "muted", "data-testid": "overview" },
    el("a", { href: "#/workers", "data-testid": "workers-count" }, plural(overview.workers.total, "worker")), " · ",
    el("a", { href: "#/crons", "data-testid": "crons-count" }, plural(overview.crons.total, "cron schedule")),
    " · rates over the last 10 s");
  const history = await api("/dashboard/history?minutes=60");
  return [el("h1", {}, "Queues"), historyCharts(history, "charts-total"), facts, table(headers, rows, "queues")];
}

async function cronsView() {
  const { crons } = await api("/dashboard");
  const rows = crons.list.map((c) => el("tr", { "data-cron": c.name },
    el("td", {}, c.name), el("td", {}, el("a", { href: `#/queue/${q(c.queue)}/waiting/0` }, c.queue)),
    el("td", {}, c.schedule ?? `every ${c.repeatEvery} ms`), el("td", {}, when(c.nextRun)), num(c.executions)));
  return [el("h1", {}, "Cron schedules"),
    table(["Name", "Queue", "Schedule", "Next run", { label: "Executions", num: true }], rows, "crons"),
    crons.truncated ? el("p", { class: "muted" }, `first ${crons.list.length} of ${crons.total}`) : ""];
}

// -- the cluster: the nodes on this node's database and the partitions each holds

async function clusterView() {
  const cluster = await api("/cluster");
  const rows = cluster.nodes.map((n) => el("tr", { "data-node": n.id },
    el("td", {}, n.id), el("td", {}, n.address), el("td", { "data-col": "alive" }, n.alive ? "alive" : "dead"),
    num(n.partitions)));
  return [el("h1", {}, "Cluster"),
    el("p", { class: "muted", "data-testid": "cluster-summary" },
      `${cluster.partitions} partitions · ${cluster.forwards ?? 0} commands forwarded by this node`),
    table(["Node", "Address", "State", { label: "Partitions", num: true }], rows, "cluster")];
}

// -- errors: the failed list's columns and the job page's stack

// The error's type: a traceback's last line ("ValueError: ...", Python) or first line
// ("TypeError: ...", JavaScript) names it; else the reason itself may start with it.
function errorType(job) {
  const stack = job.stacktrace || [];
  for (const line of [stack[stack.length - 1], stack[0], job.failedReason]) {
    const found = /^([A-Za-z_$][\w.$]*)(?::\s|$)/.exec(line || "");
    if (found && /[A-Z]/.test(found[1][0]) && found[1] !== line) return found[1];
    if (found && /(Error|Exception|Timeout|Interrupt|Exit)$/.test(found[1])) return found[1];
  }
  return "Error";
}

function errorMessage(job) {
  const reason = job.failedReason || "";
  const type = errorType(job);
  return reason.startsWith(type + ": ") ? reason.slice(type.length + 2) : reason;
}

// -- acting on jobs: one at a time, or a selection of a queue's list

const ACTIONS = {
  retry: { label: "Retry", states: ["failed", "completed"],
    run: (job) => job.state === "failed"
      ? post(`/queues/${q(job.queue)}/dlq/retry`, { jobId: job.id }).then(counted)
      : post(`/queues/${q(job.queue)}/retry-completed`, { id: job.id }).then(counted) },
  promote: { label: "Promote", states: ["delayed"], run: (job) => post(`/jobs/${q(job.id)}/promote`) },
  // A running job fails at once (never retried) and its worker is told to stop.
  cancel: { label: "Cancel", states: ["active"],
    run: (job) => post(`/jobs/${q(job.id)}/cancel`, { reason: "cancelled from the dashboard" }) },
  remove: { label: "Remove", states: ["waiting", "prioritized", "delayed", "failed"],
    run: (job) => job.state === "failed"
      ? del(`/queues/${q(job.queue)}/dlq/${q(job.id)}`).then(removed) : del(`/jobs/${q(job.id)}`) },
};

function removed(reply) {
  if (reply.data && reply.data.removed === false) throw new Error("the job is no longer there");
  return reply;
}

function counted(reply) {
  if (reply.count === 0) throw new Error("the job is no longer there");
  return reply;
}

const selected = new Map();  // job id -> {id, queue, state}, for the list on screen
let selectedFor = "";
let bulkStatus = null;  // {at, text}: what the last action on a selection did

async function runOn(action, jobs) {
  if ((action === "remove" || action === "cancel") &&
      !confirm(`${ACTIONS[action].label} ${plural(jobs.length, "job")}?`)) return;
  const failures = [];
  for (const job of jobs) {
    try { await ACTIONS[action].run(job); } catch (e) { failures.push(`${job.id}: ${e.message}`); }
  }
  selected.clear();
  if (failures.length && jobs.length === 1) throw new Error(failures[0]);
  const done = jobs.length - failures.length;
  bulkStatus = { at: Date.now(), text: `${ACTIONS[action].label}: ${done} of ${jobs.length} done` +
    (failures.length ? ` (${failures.join("; ")})` : "") };
}

function bulkBar(state) {
  const count = selected.size;
  // Shown through the next refreshes for a while, so a refresh cannot swallow it.
  const status = bulkStatus && Date.now() - bulkStatus.at < 15000 ? bulkStatus.text : "";
  return el("div", { class: "actions", "data-testid": "bulk" },
    el("span", { class: "muted", "data-testid": "selected-count" }, `${count} selected`),
    Object.entries(ACTIONS).map(([name, action]) => {
      const attrs = { "data-action": `bulk-${name}` };
      if (!count || !action.states.includes(state)) attrs.disabled = "";
      return button(action.label, () => runOn(name, [...selected.values()]), attrs);
    }),
    status ? el("span", { "data-testid": "bulk-status" }, status) : "");
}

function checkbox(job) {
  const box = el("input", { type: "checkbox", "data-select": job.id, "aria-label": `select ${job.id}` });
  box.checked = selected.has(job.id);
  box.addEventListener("change", () => {
    if (box.checked) selected.set(job.id, { id: job.id, queue: job.queue, state: job.state });
    else selected.delete(job.id);
    route();
  });
  return el("td", {}, box);
}

function selectAll(jobs) {
  const box = el("input", { type: "checkbox", "data-select": "all", "aria-label": "select all" });
  box.checked = jobs.length > 0 && jobs.every((job) => selected.has(job.id));
  box.addEventListener("change", () => {
    for (const job of jobs) {
      if (box.checked) selected.set(job.id, { id: job.id, queue: job.queue, state: job.state });
      else selected.delete(job.id);
    }
    route();
  });
  return box;
}

function jobRow(job, state) {
  const cells = [checkbox(job), el("td", {}, el("a", { href: `#/job/${q(job.id)}` }, job.id)), el("td", {}, job.name)];
  if (state === "failed") {
    cells.push(el("td", { "data-col": "error-type" }, el("code", {}, errorType(job))),
      el("td", { "data-col": "error" }, errorMessage(job)));
  } else {
    cells.push(num(job.priority));
  }
  cells.push(num(job.attempts), el("td", {}, when(job.createdAt)));
  return el("tr", { "data-job": job.id }, cells);
}

async function queueView(name, state, page) {
  const offset = page * PAGE;
  const key = `${name}/${state}/${page}`;
  if (key !== selectedFor) { selected.clear(); selectedFor = key; bulkStatus = null; }
  const { jobs } = await api(`/queues/${q(name)}/jobs/list?state=${state}&limit=${PAGE + 1}&offset=${offset}`);
  const { counts } = await api(`/queues/${q(name)}/counts`);
  const history = await api(`/dashboard/history?minutes=60&queue=${q(name)}`);
  const shown = jobs.slice(0, PAGE);
  const tabs = el("div", { class: "tabs" }, STATES.map((s) =>
    el("a", { href: `#/queue/${q(name)}/${s}/0`, class: s === state ? "active" : "" }, `${s} (${counts[s] ?? 0})`)));
  const headers = [{ label: selectAll(shown) }, "Id", "Name",
    ...(state === "failed" ? ["Error type", "Error"] : [{ label: "Priority", num: true }]),
    { label: "Attempts", num: true }, "Created"];
  const pager = el("div", { class: "pager" },
    page > 0 ? el("a", { href: `#/queue/${q(name)}/${state}/${page - 1}` }, "← newer") : "",
    el("span", { class: "muted" }, `page ${page + 1}`),
    jobs.length > PAGE ? el("a", { href: `#/queue/${q(name)}/${state}/${page + 1}` }, "older →") : "");
  return [
    el("h1", {}, "Queue ", name),
    historyCharts(history, "charts-queue"),
    el("div", { class: "actions" }, el("a", { href: `#/dlq/${q(name)}` }, "Dead-letter queue")),
    tabs,
    bulkBar(state),
    table(headers, shown.map((job) => jobRow(job, state)), "jobs"),
    pager,
  ];
}

async function jobView(id) {
  const { job } = await api(`/jobs/${q(id)}`);
  const { data: logs } = await api(`/jobs/${q(id)}/logs`);
  const timeline = (job.timeline || []).map((t) => el("tr", {},
    el("td", {}, t.state), el("td", {}, when(t.timestamp)), num(t.attempt)));
  const logRows = logs.logs.map((line) => el("tr", {},
    el("td", {}, when(line.timestamp)), el("td", {}, line.level), el("td", {}, line.message)));
  return [
    el("h1", {}, "Job ", job.id),
    el("p", {}, "Queue ", el("a", { href: `#/queue/${q(job.queue)}/waiting/0` }, job.queue),
      " · state ", el("strong", { "data-testid": "job-state" }, job.state),
      ` · attempts ${job.attempts}/${job.maxAttempts} · progress ${job.progress ?? 0}`),
    job.failedReason ? el("p", { class: "error" }, el("code", { "data-testid": "job-error-type" }, errorType(job)), " ",
      el("span", { "data-testid": "job-error" }, job.failedReason)) : "",
    el("div", { class: "actions", "data-testid": "job-actions" }, Object.entries(ACTIONS)
      .filter(([, action]) => action.states.includes(job.state))
      .map(([name, action]) => button(action.label, () => runOn(name, [job]), { "data-action": name }))),
    el("div", { class: "grid" },
      el("section", { "data-testid": "job-data" }, el("h2", {}, "Data"), json(job.data)),
      el("section", { "data-testid": "job-result" }, el("h2", {}, "Result"), json(job.returnvalue ?? null))),
    el("h2", {}, "Timeline"), table(["State", "At", { label: "Attempt", num: true }], timeline, "timeline"),
    el("h2", {}, "Logs"), table(["At", "Level", "Message"], logRows, "logs"),
    job.stacktrace && job.stacktrace.length
      ? [el("h2", {}, "Stack"), el("pre", { class: "stack", "data-testid": "job-stack" }, job.stacktrace.join("\n"))] : "",
  ];
}

async function dlqView(name) {
  const { entries } = await api(`/queues/${q(name)}/dlq?limit=100`);
  const rows = entries.map((entry) => el("tr", { "data-job": entry.job.id },
    el("td", {}, el("a", { href: `#/job/${q(entry.job.id)}` }, entry.job.id)),
    el("td", {}, entry.reason),
    el("td", { "data-col": "error-type" }, el("code", {}, errorType({ ...entry.job, failedReason: entry.error }))),
    el("td", {}, entry.error ?? ""), el("td", {}, when(entry.enteredAt)),
    el("td", {}, button("Retry", () => post(`/queues/${q(name)}/dlq/retry`, { jobId: entry.job.id }), { "data-action": "retry" }))));
  return [
    el("h1", {}, "Dead-letter queue of ", el("a", { href: `#/queue/${q(name)}/waiting/0` }, name)),
    el("div", { class: "actions" },
      button("Retry all", () => post(`/queues/${q(name)}/dlq/retry`), { "data-action": "retry-all" }),
      button("Purge", async () => {
        if (confirm(`Delete every DLQ entry of ${name}?`)) await post(`/queues/${q(name)}/dlq/purge`);
      }, { class: "danger", "data-action": "purge" })),
    table(["Job", "Reason", "Error type", "Error", "Entered", ""], rows, "dlq"),
  ];
}

// A worker's name is often its id (the SDK's default: host:pid:random); then the page names
// it by what it serves and where it runs, and keeps the id for the detail page.
function workerLabel(w) {
  if (w.name && w.name !== w.id) return w.name;
  const queues = (w.queues || []).join(", ") || "no queue";
  return `${queues} worker`;
}

const host = (w) => `${w.hostname || "unknown"}${w.pid ? ` · pid ${w.pid}` : ""}`;

async function workersView() {
  const { data } = await api("/workers");
  const rows = data.workers.map((w) => el("tr", { "data-worker": w.id },
    el("td", {}, el("a", { href: `#/worker/${q(w.id)}`, "data-col": "worker" }, workerLabel(w))),
    el("td", { "data-col": "host" }, host(w)), el("td", {}, (w.queues || []).join(", ")),
    el("td", {}, w.status), num(w.concurrency), num(w.activeJobs), num(w.processedJobs),
    num(w.failedJobs), el("td", {}, when(w.lastSeen))));
  return [el("h1", {}, "Workers"),
    table(["Worker", "Host", "Queues", "Status", { label: "Concurrency", num: true }, { label: "Active", num: true },
      { label: "Processed", num: true }, { label: "Failed", num: true }, "Last seen"], rows, "workers")];
}

async function workerView(id) {
  const { data } = await api("/workers");
  const w = data.workers.find((worker) => worker.id === id);
  if (!w) return [el("h1", {}, "Worker"), el("p", { class: "muted" }, `No worker ${id} is registered now.`)];
  const facts = [["Id", w.id], ["Name", w.name], ["Host", host(w)], ["Status", w.status],
    ["Queues", (w.queues || []).join(", ")], ["Concurrency", w.concurrency], ["Active jobs", w.activeJobs],
    ["Processed", w.processedJobs], ["Failed", w.failedJobs], ["Registered", when(w.registeredAt)],
    ["Last seen", when(w.lastSeen)]];
  return [el("h1", { "data-testid": "worker-title" }, workerLabel(w)),
    el("table", { "data-testid": "worker" }, el("tbody", {}, facts.map(([k, v]) =>
      el("tr", {}, el("th", {}, k), el("td", {}, v ?? "—"))))),
    el("h2", {}, "Queues"),
    el("p", {}, (w.queues || []).map((name) => [el("a", { href: `#/queue/${q(name)}/active/0` }, name), " "]))];
}

// -- search: a job id, a custom id or part of a job name

const MATCHED = { id: "job id", customId: "custom id", name: "name" };

async function searchView(text) {
  const found = await api(`/dashboard/search?q=${encodeURIComponent(text)}`);
  const rows = found.jobs.map((job) => el("tr", { "data-job": job.id },
    el("td", {}, el("a", { href: `#/job/${q(job.id)}` }, job.id)), el("td", {}, job.name),
    el("td", {}, el("a", { href: `#/queue/${q(job.queue)}/${job.state === "waiting-children" ? "waiting" : job.state}/0` }, job.queue)),
    el("td", {}, job.state), el("td", { "data-col": "match" }, MATCHED[job.match] ?? job.match), el("td", {}, when(job.createdAt))));
  const notes = [found.truncated ? "more jobs match than shown" : "",
    found.queuesOmitted ? `${found.queuesOmitted} queues not searched by name` : ""].filter(Boolean);
  return [el("h1", {}, "Jobs matching ", el("code", {}, text)),
    table(["Id", "Name", "Queue", "State", "Matched by", "Created"], rows, "search-results"),
    notes.length ? el("p", { class: "muted" }, notes.join(" · ")) : ""];
}

// -- the header: health and throughput, refreshed with the view

async function refreshHeader() {
  const health = await api("/health");
  const pill = document.getElementById("health");
  pill.textContent = `${health.status} · v${health.version} · up ${health.uptime}s`;
  pill.className = "pill " + health.status;
  const { metrics } = await api("/metrics");
  const now = Date.now();
  if (lastTotals) {
    const seconds = (now - lastTotals.at) / 1000;
    const rate = (key) => Math.max(0, (metrics[key] - lastTotals[key]) / seconds).toFixed(1);
    document.getElementById("throughput").textContent =
      `pushed ${rate("totalPushed")}/s · completed ${rate("totalCompleted")}/s`;
  }
  lastTotals = { ...metrics, at: now };
}

// Each route() is numbered: only the newest one draws. A view's fetches can answer after the
// user moved on (a click on another view, a search): the older view's answer is then dropped,
// its error too, and never drawn over the view asked for since.
let routes = 0;
let drawn = 0;

async function route() {
  const mine = ++routes;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  let content;
  try {
    if (parts[0] === "queue") content = await queueView(parts[1], parts[2] || "waiting", Number(parts[3] || 0));
    else if (parts[0] === "job") content = await jobView(parts[1]);
    else if (parts[0] === "dlq") content = await dlqView(parts[1]);
    else if (parts[0] === "workers") content = await workersView();
    else if (parts[0] === "worker") content = await workerView(parts[1]);
    else if (parts[0] === "search") content = await searchView(parts.slice(1).join("/"));
    else if (parts[0] === "crons") content = await cronsView();
    else if (parts[0] === "cluster") content = await clusterView();
    else content = await queuesView();
    if (mine !== routes) return;  // stale: a newer route() draws its own view
    showError(null);
    view.replaceChildren(...[content].flat(2).filter((n) => n !== ""));
    await refreshHeader();
  } catch (error) {
    if (mine === routes) showError(error);
  } finally {
    if (mine === routes) drawn = mine;
  }
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("shardq-token", document.getElementById("token").value);
  document.getElementById("login").hidden = true;
  route();
});
document.getElementById("search").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = document.getElementById("search-text").value.trim();
  if (!text) return;
  const target = `#/search/${encodeURIComponent(text)}`;
  if (location.hash === target) route();  // the same search again: look again
  else location.hash = target;
});
window.addEventListener("hashchange", route);
// The refresh waits for the last route() to finish: on a server slower than the period, a
// refresh started every time would make each one stale before it could draw.
setInterval(() => { if (!document.hidden && drawn === routes) route(); }, 5000);
route();
