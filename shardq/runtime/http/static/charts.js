// Line charts as inline SVG, drawn here: no chart library and nothing fetched from elsewhere.
// A chart is one <figure>: its <svg> has one <path data-series=KEY> per series, with the
// series' newest value in data-last and, for counts, its sum over the window in data-total,
// so a reader (or a test) can check what was drawn against what happened.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const CHART = { width: 560, height: 170, left: 46, right: 10, top: 10, bottom: 22 };

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children) node.append(child);
  return node;
}

// The smallest 1, 2 or 5 times a power of ten at or above `value`: round axis labels.
function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((m) => m * power).find((m) => m >= value);
}

function shortNumber(value) {
  if (value === null || value === undefined) return "—";
  if (value >= 1000) return `${(value / 1000).toFixed(value >= 10000 ? 0 : 1)}k`;
  return value >= 10 || Number.isInteger(value) ? String(Math.round(value)) : value.toFixed(2);
}

const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });

// The path of one series: a gap (null) lifts the pen, so a minute without timings is no zero.
function seriesPath(values, x, y) {
  let d = "";
  let pen = false;
  values.forEach((value, i) => {
    if (value === null || value === undefined) { pen = false; return; }
    d += `${pen ? "L" : "M"}${x(i).toFixed(1)},${y(value).toFixed(1)} `;
    pen = true;
  });
  return d.trim();
}

function axes(max, points, x, y) {
  const { width, height, left, right, bottom } = CHART;
  const parts = [];
  for (const fraction of [0, 0.5, 1]) {
    const value = max * fraction;
    parts.push(svg("line", { x1: left, x2: width - right, y1: y(value), y2: y(value), class: "grid" }));
    parts.push(svg("text", { x: left - 6, y: y(value) + 4, class: "tick", "text-anchor": "end" },
      shortNumber(value)));
  }
  if (points.length) {
    const base = height - bottom + 15;
    parts.push(svg("text", { x: x(0), y: base, class: "tick" }, clock(points[0].at)));
    const middle = Math.floor((points.length - 1) / 2);
    if (middle > 0) {
      parts.push(svg("text", { x: x(middle), y: base, class: "tick", "text-anchor": "middle" },
        clock(points[middle].at)));
    }
    parts.push(svg("text", { x: x(points.length - 1), y: base, class: "tick", "text-anchor": "end" },
      "now"));
  }
  return parts;
}

// One transparent band per minute whose tooltip reads that minute's values.
function hoverBands(spec, columns, x) {
  const { height, top, bottom } = CHART;
  const step = spec.points.length > 1 ? x(1) - x(0) : 10;
  return spec.points.map((point, i) => {
    const values = spec.series.map((s, k) => `${s.label} ${shortNumber(columns[k][i])}`);
    return svg("rect", { x: x(i) - step / 2, y: top, width: step, height: height - top - bottom, class: "band" },
      svg("title", {}, `${clock(point.at)}: ${values.join(" · ")}`));
  });
}

// spec: {title, testid, unit, points, series: [{key, label, color, value(point), count?(point)}]}
function lineChart(spec) {
  const { width, height, left, right, top, bottom } = CHART;
  const n = spec.points.length;
  const columns = spec.series.map((s) => spec.points.map((p) => s.value(p)));
  const highest = Math.max(0, ...columns.flat().filter((v) => v !== null && v !== undefined));
  const max = niceMax(highest);
  const x = (i) => left + (i * (width - left - right)) / Math.max(1, n - 1);
  const y = (v) => top + (height - top - bottom) * (1 - v / max);
  const drawing = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": spec.title },
    ...axes(max, spec.points, x, y));
  const legend = el("div", { class: "legend" });
  spec.series.forEach((s, k) => {
    const values = columns[k];
    const last = [...values].reverse().find((v) => v !== null && v !== undefined) ?? null;
    const attrs = { d: seriesPath(values, x, y), stroke: s.color, class: "series",
      "data-series": s.key, "data-last": last ?? "", "data-max": max };
    if (s.count) attrs["data-total"] = spec.points.reduce((sum, p) => sum + s.count(p), 0);
    drawing.append(svg("path", attrs));
    const lastIndex = values.lastIndexOf(last);
    if (last !== null) drawing.append(svg("circle", { cx: x(lastIndex), cy: y(last), r: 2.5, fill: s.color }));
    legend.append(el("span", { class: "key", "data-legend": s.key },
      el("i", { style: `background:${s.color}` }), `${s.label} ${shortNumber(last)}`));
  });
  drawing.append(...hoverBands(spec, columns, x));
  return el("figure", { class: "chart", "data-testid": spec.testid },
    el("figcaption", {}, spec.title, el("span", { class: "muted" }, ` (${spec.unit})`)), drawing, legend);
}

// The two charts of a history answer (/dashboard/history): throughput and job times.
function historyCharts(history, testid) {
  const points = history.points;
  const throughput = lineChart({
    title: "Throughput", unit: "jobs/s", testid: "chart-throughput", points,
    series: [
      { key: "pushed", label: "pushed", color: "#2f5fd0", value: (p) => p.pushPerSec, count: (p) => p.pushed },
      { key: "completed", label: "completed", color: "#1e7b34", value: (p) => p.completePerSec, count: (p) => p.completed },
      { key: "failed", label: "failed", color: "#b3261e", value: (p) => p.failPerSec, count: (p) => p.failed },
    ],
  });
  const times = lineChart({
    title: "Job times", unit: "ms", testid: "chart-times", points,
    series: [
      { key: "wait-p50", label: "wait p50", color: "#8aa6e8", value: (p) => p.waitMs.p50 },
      { key: "wait-p99", label: "wait p99", color: "#2f5fd0", value: (p) => p.waitMs.p99 },
      { key: "run-p50", label: "run p50", color: "#e0a860", value: (p) => p.runMs.p50 },
      { key: "run-p99", label: "run p99", color: "#b86b00", value: (p) => p.runMs.p99 },
    ],
  });
  const scope = history.queue ? `queue ${history.queue}` : `${history.queues} queue${history.queues === 1 ? "" : "s"}`;
  const omitted = history.omitted ? ` (${history.omitted} more left out)` : "";
  return el("section", { class: "charts", "data-testid": testid },
    el("p", { class: "muted" }, `Last ${history.minutes} minutes, per minute · ${scope}${omitted}`),
    el("div", { class: "chart-row" }, throughput, times));
}
