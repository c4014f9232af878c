// agentauth dashboard: the audit page's chart of decisions over time, by result, drawn as SVG
// elements (no library, no inline style: the colours are classes of app.css). It draws what
// GET /v1/audit-logs/stats?group_by=result answers; app.js fetches it and calls decisionsChart
// (and this file uses app.js's h() for the legend: both are loaded before anything runs).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const MINUTE_MS = 60e3;
const HOUR_MS = 3600e3;
const DAY_MS = 86400e3;
const GRAINS = { minute: MINUTE_MS, hour: HOUR_MS, day: DAY_MS };
// the results of core/store/audit.py, in the order their bars stack (any other one after them:
// the policy page's would-be chart adds "unchanged" and "error")
const RESULT_ORDER = ["allowed", "denied", "escalated", "unchanged", "error"];
// the drawing's margins and height, in pixels; its width is its box's when drawn (the SVG then
// scales with the box when the window changes)
const CHART = { height: 240, left: 48, right: 12, top: 12, bottom: 34 };

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) el.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) {
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }
  return el;
}

// The bucket that keeps a range readable: minutes under 3 hours, hours up to 3 days, else days.
function bucketFor(from, to) {
  const span = to - from;
  if (span <= 3 * HOUR_MS) return "minute";
  if (span <= 3 * DAY_MS) return "hour";
  return "day";
}

// "2026-11-21 09:00" (UTC); a day bucket without its time
function utcText(ms, bucket) {
  const text = new Date(ms).toISOString().replace("T", " ").slice(0, 16);
  return bucket === "day" ? text.slice(0, 10) : text;
}

// the start of every bucket from the one holding `from` to the one holding `to`: the API
// leaves empty buckets out, the chart draws them as nothing
function bucketStarts(from, to, bucket) {
  const size = GRAINS[bucket];
  const starts = [];
  for (let t = Math.floor(from / size) * size; t <= to; t += size) starts.push(t);
  return starts;
}

// a round step for about `parts` gridlines up to `max`: 1, 2 or 5 times a power of ten
function niceStep(max, parts) {
  const rough = Math.max(1, max / parts);
  const power = 10 ** Math.floor(Math.log10(rough));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough);
  return Math.max(1, step);
}

// The chart of `items` ({start, key, count}, grouped by result) over [from, to] (ms since the
// epoch) in buckets of `bucket`, `width` pixels wide: its title, an <svg role=img> of stacked
// bars (one <g class=series> per result present, a bar per bucket and result with a count, its
// title saying what it counts) and a legend; no svg when there is nothing to draw. `what` names
// what is counted in the title ("Decisions", or a policy's "Would-be decisions"), and `id` the
// title's element (two charts on one page must differ).
function decisionsChart(items, from, to, bucket, width, what = "Decisions", id = "chart-title") {
  const starts = bucketStarts(from, to, bucket);
  const counts = tally(items, starts);
  const results = Object.keys(counts);
  const totals = Object.fromEntries(results.map((r) => [r, counts[r].reduce((a, b) => a + b, 0)]));
  const span = `${utcText(from, "minute")} to ${utcText(to, "minute")} UTC`;
  const summary = results.length
    ? results.map((r) => `${totals[r]} ${r}`).join(", ") : "no decisions";
  const title = `${what} per ${bucket} by result, ${span}: ${summary}`;
  if (!results.length) return { title, node: null, legend: null };
  const stacks = starts.map((_, i) => results.reduce((sum, r) => sum + counts[r][i], 0));
  const step = niceStep(Math.max(...stacks), 4);
  const top = Math.ceil(Math.max(...stacks) / step) * step;
  const { height, left, right, top: pad, bottom } = CHART;
  const plot = { left, right: width - right, bottom: height - bottom,
    slot: (width - left - right) / starts.length };
  plot.y = (n) => plot.bottom - (n / top) * (plot.bottom - pad);
  const node = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-labelledby": id,
    class: "chart", "data-bucket": bucket },
  svg("title", { id }, title),
  countAxis(plot, top, step), timeAxis(plot, starts, bucket),
  svg("text", { class: "chart-label", x: plot.right, y: height - 2, "text-anchor": "end" }, `per ${bucket}, UTC`),
  stackedBars(plot, starts, counts, bucket));
  const legend = h("ul", { class: "legend" }, results.map((r) =>
    h("li", { "data-result": r }, h("span", { class: `swatch result-${r}` }), `${r}: ${totals[r]}`)));
  return { title, node, legend };
}

// each result's count in each bucket of `starts` (0 where the API left a bucket out), the
// results in the order their bars stack
function tally(items, starts) {
  const index = new Map(starts.map((t, i) => [t, i]));
  const results = [...new Set(items.map((item) => item.key))].sort((a, b) =>
    (RESULT_ORDER.indexOf(a) + 1 || 99) - (RESULT_ORDER.indexOf(b) + 1 || 99) || a.localeCompare(b));
  const counts = Object.fromEntries(results.map((r) => [r, new Array(starts.length).fill(0)]));
  for (const item of items) {
    const i = index.get(Date.parse(item.start));
    if (i !== undefined) counts[item.key][i] += item.count;
  }
  return counts;
}

// the counts up the left side, a gridline at each step
function countAxis(plot, top, step) {
  const out = [];
  for (let n = 0; n <= top; n += step) {
    out.push(svg("line", { class: "chart-grid", x1: plot.left, x2: plot.right, y1: plot.y(n), y2: plot.y(n) }),
      svg("text", { class: "chart-label", x: plot.left - 6, y: plot.y(n) + 4, "text-anchor": "end" }, n));
  }
  return out;
}

// bucket starts along the bottom, about one every 100 pixels: a day as "11-21"; a time as
// "09:00", with its day ("11-21 09:00") when the day is not the previous label's
function timeAxis(plot, starts, bucket) {
  const out = [];
  const every = Math.max(1, Math.ceil(starts.length / Math.max(2, Math.floor((plot.right - plot.left) / 100))));
  let day = "";
  for (let i = 0; i < starts.length; i += every) {
    const x = plot.left + plot.slot * i + plot.slot / 2;
    const text = utcText(starts[i], "minute");  // "2026-11-21 09:00"
    const label = bucket === "day" ? text.slice(5, 10)
      : text.slice(0, 10) === day ? text.slice(11) : text.slice(5);
    day = text.slice(0, 10);
    out.push(svg("line", { class: "chart-tick", x1: x, x2: x, y1: plot.bottom, y2: plot.bottom + 4 }),
      svg("text", { class: "chart-label", x, y: plot.bottom + 18, "text-anchor": "middle" }, label));
  }
  return out;
}

// one <g class=series> per result, a bar per bucket it has a count in, stacked on the results
// before it
function stackedBars(plot, starts, counts, bucket) {
  const gap = plot.slot > 4 ? plot.slot * 0.15 : 0;
  const below = new Array(starts.length).fill(0);
  return Object.entries(counts).map(([result, row]) => svg("g", { class: `series result-${result}`,
    "data-result": result }, starts.flatMap((start, i) => {
    const n = row[i];
    if (!n) return [];
    const bar = svg("rect", { class: "chart-bar", x: plot.left + plot.slot * i + gap / 2,
      y: plot.y(below[i] + n), width: Math.max(plot.slot - gap, 0.5),
      height: plot.y(below[i]) - plot.y(below[i] + n),
      "data-start": new Date(start).toISOString(), "data-count": n },
    svg("title", {}, `${utcText(start, bucket)} UTC: ${n} ${result}`));
    below[i] += n;
    return [bar];
  })));
}
