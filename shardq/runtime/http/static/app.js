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
  return [el("h1", {}, "Queues"), facts, table(headers, rows, "queues")];
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

async function queueView(name, state, page) {
  const offset = page * PAGE;
  const { jobs } = await api(`/queues/${q(name)}/jobs/list?state=${state}&limit=${PAGE + 1}&offset=${offset}`);
  const { counts } = await api(`/queues/${q(name)}/counts`);
  const tabs = el("div", { class: "tabs" }, STATES.map((s) =>
    el("a", { href: `#/queue/${q(name)}/${s}/0`, class: s === state ? "active" : "" }, `${s} (${counts[s] ?? 0})`)));
  const rows = jobs.slice(0, PAGE).map((job) => el("tr", { "data-job": job.id },
    el("td", {}, el("a", { href: `#/job/${q(job.id)}` }, job.id)),
    el("td", {}, job.name), num(job.priority), num(job.attempts), el("td", {}, when(job.createdAt))));
  const pager = el("div", { class: "pager" },
    page > 0 ? el("a", { href: `#/queue/${q(name)}/${state}/${page - 1}` }, "← newer") : "",
    el("span", { class: "muted" }, `page ${page + 1}`),
    jobs.length > PAGE ? el("a", { href: `#/queue/${q(name)}/${state}/${page + 1}` }, "older →") : "");
  return [
    el("h1", {}, "Queue ", name),
    el("div", { class: "actions" }, el("a", { href: `#/dlq/${q(name)}` }, "Dead-letter queue")),
    tabs,
    table(["Id", "Name", { label: "Priority", num: true }, { label: "Attempts", num: true }, "Created"], rows, "jobs"),
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
    job.failedReason ? el("p", { class: "error", "data-testid": "job-error" }, job.failedReason) : "",
    el("div", { class: "grid" },
      el("section", { "data-testid": "job-data" }, el("h2", {}, "Data"), json(job.data)),
      el("section", { "data-testid": "job-result" }, el("h2", {}, "Result"), json(job.returnvalue ?? null))),
    el("h2", {}, "Timeline"), table(["State", "At", { label: "Attempt", num: true }], timeline, "timeline"),
    el("h2", {}, "Logs"), table(["At", "Level", "Message"], logRows, "logs"),
    job.stacktrace ? [el("h2", {}, "Stack"), json(job.stacktrace)] : "",
  ];
}

async function dlqView(name) {
  const { entries } = await api(`/queues/${q(name)}/dlq?limit=100`);
  const rows = entries.map((entry) => el("tr", { "data-job": entry.job.id },
    el("td", {}, el("a", { href: `#/job/${q(entry.job.id)}` }, entry.job.id)),
    el("td", {}, entry.reason), el("td", {}, entry.error ?? ""), el("td", {}, when(entry.enteredAt)),
    el("td", {}, button("Retry", () => post(`/queues/${q(name)}/dlq/retry`, { jobId: entry.job.id }), { "data-action": "retry" }))));
  return [
    el("h1", {}, "Dead-letter queue of ", el("a", { href: `#/queue/${q(name)}/waiting/0` }, name)),
    el("div", { class: "actions" },
      button("Retry all", () => post(`/queues/${q(name)}/dlq/retry`), { "data-action": "retry-all" }),
      button("Purge", async () => {
        if (confirm(`Delete every DLQ entry of ${name}?`)) await post(`/queues/${q(name)}/dlq/purge`);
      }, { class: "danger", "data-action": "purge" })),
    table(["Job", "Reason", "Error", "Entered", ""], rows, "dlq"),
  ];
}

async function workersView() {
  const { data } = await api("/workers");
  const rows = data.workers.map((w) => el("tr", { "data-worker": w.id },
    el("td", {}, w.name), el("td", {}, w.id), el("td", {}, (w.queues || []).join(", ")),
    el("td", {}, w.status), num(w.concurrency), num(w.activeJobs), num(w.processedJobs),
    num(w.failedJobs), el("td", {}, when(w.lastSeen))));
  return [el("h1", {}, "Workers"),
    table(["Name", "Id", "Queues", "Status", { label: "Concurrency", num: true }, { label: "Active", num: true },
      { label: "Processed", num: true }, { label: "Failed", num: true }, "Last seen"], rows, "workers")];
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

async function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  let content;
  try {
    if (parts[0] === "queue") content = await queueView(parts[1], parts[2] || "waiting", Number(parts[3] || 0));
    else if (parts[0] === "job") content = await jobView(parts[1]);
    else if (parts[0] === "dlq") content = await dlqView(parts[1]);
    else if (parts[0] === "workers") content = await workersView();
    else if (parts[0] === "crons") content = await cronsView();
    else content = await queuesView();
    showError(null);
    view.replaceChildren(...[content].flat(2).filter((n) => n !== ""));
    await refreshHeader();
  } catch (error) {
    showError(error);
  }
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("shardq-token", document.getElementById("token").value);
  document.getElementById("login").hidden = true;
  route();
});
window.addEventListener("hashchange", route);
setInterval(() => { if (!document.hidden) route(); }, 5000);
route();
