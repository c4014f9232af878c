// agentauth dashboard: a client of the public /v1 API, nothing more.
// The API key lives in this tab's sessionStorage only and travels as the Bearer header; it is
// never put in a URL, a cookie or localStorage. Every value from the API is inserted as text
// (no innerHTML), so a name or a parameter can never become markup.
"use strict";

const KEY_STORE = "agentauth.key";
const SCOPE_STORE = "agentauth.scope";
const KEY_FORMAT = /^svc_[0-9a-f]{32}$/;
const DAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const PAGE = 50;

// ------------------------------------------------------------------------- small DOM helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const $ = (id) => document.getElementById(id);

// Each navigation (and sign-in or sign-out) starts a new generation. A page remembers the one
// it was started in and renders only if it is still current: an answer that arrives after the
// person moved on (or signed out) never paints over what they are looking at now.
let generation = 0;

function show(token, ...nodes) {
  if (token === generation) $("main").replaceChildren(...nodes);
}

function when(text) {
  if (!text) return "—";
  const moment = new Date(text);
  return isNaN(moment) ? text : moment.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

// how far a moment is from now, in the largest whole unit: "in 59 min", "3 h ago"
function relative(text) {
  const moment = new Date(text);
  if (!text || isNaN(moment)) return "";
  const ms = moment.getTime() - Date.now();
  const s = Math.floor(Math.abs(ms) / 1000);
  const span = s < 60 ? `${s} s` : s < 3600 ? `${Math.floor(s / 60)} min`
    : s < 86400 ? `${Math.floor(s / 3600)} h` : `${Math.floor(s / 86400)} d`;
  return ms >= 0 ? `in ${span}` : `${span} ago`;
}

// a moment as the page shows the ones a person acts on: how far away, then exactly when
function timeCell(text) {
  return [h("span", {}, relative(text)), h("div", { class: "muted small" }, when(text))];
}

function badge(text, kind) {
  return h("span", { class: `badge ${kind || text}` }, text);
}

// a count with its noun, singular for exactly one: "1 parameter", "0 parameters", "2 rows".
// Every count the page shows in words goes through here.
function counted(n, singular, plural = `${singular}s`) {
  return `${n} ${Number(n) === 1 ? singular : plural}`;
}

// A table wider than its panel (on a phone, most are) scrolls sideways in a box of its own, so
// the page itself never does. Overlay scrollbars (phones, many laptops) show nothing until the
// box is touched, so a shadow on either edge says there is more that way: the box is marked
// more-left / more-right whenever it is scrolled or it or its table changes size (a row's
// details opening, a phone turning).
function scroller(table) {
  const box = h("div", { class: "scroll" }, table);
  const mark = () => {
    const hidden = box.scrollWidth - box.clientWidth;
    box.classList.toggle("more-left", box.scrollLeft > 1);
    box.classList.toggle("more-right", box.scrollLeft < hidden - 1);
  };
  box.addEventListener("scroll", mark, { passive: true });
  const watch = new ResizeObserver(mark);
  watch.observe(box);
  watch.observe(table);
  return box;
}

// ------------------------------------------------------------------------------- messages

function say(text, kind) {
  const box = $("message");
  box.textContent = text;
  box.className = `message ${kind || "error"}`;
  box.hidden = false;
}

function clearMessage() {
  $("message").hidden = true;
}

function describe(error) {
  if (error instanceof ApiError) {
    const code = error.code ? ` ${error.code}` : "";
    const details = (error.details || [])
      .map((d) => (d.field ? `${d.field}: ${d.message}` : d.message))
      .join("; ");
    const why = details && !error.message.includes(details) ? ` (${details})` : "";
    return `The service answered ${error.status}${code}: ${error.message}${why}`;
  }
  return `Could not reach the service: ${error.message || error}`;
}

function fail(error) {
  if (error instanceof ApiError && error.status === 401) {
    signOut(`Signed out: ${error.message}`);
    return;
  }
  say(describe(error));
}

// ------------------------------------------------------------------------------------- API

class ApiError extends Error {
  constructor(status, body, text) {
    const error = (body && body.error) || {};
    super(error.message || text || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || "";
    this.details = error.details || [];
  }
}

function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== "" && value !== null && value !== undefined) search.set(name, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

async function call(method, path, { params, body, key } = {}) {
  const headers = { Authorization: `Bearer ${key || sessionStorage.getItem(KEY_STORE)}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path + query(params), {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
    referrerPolicy: "no-referrer",
  });
  return response;
}

// a response's JSON body, or null when it has none (or is not JSON)
async function jsonOf(response) {
  const text = await response.text();
  try {
    return { text, body: text ? JSON.parse(text) : null };
  } catch (_) {
    return { text, body: null };
  }
}

async function refusal(response) {
  const { text, body } = await jsonOf(response);
  return new ApiError(response.status, body, text.slice(0, 200));
}

async function api(method, path, options) {
  const response = await call(method, path, options);
  if (!response.ok) throw await refusal(response);
  if (response.status === 204) return null;
  return (await jsonOf(response)).body;
}

const MAX_PAGE = 200; // the largest page the agent, policy and key lists serve

// every item of a list, page by page (a workspace may hold more than one page of anything)
async function everything(path, params) {
  const items = [];
  for (let offset = 0; ; offset += MAX_PAGE) {
    const page = await api("GET", path, { params: { ...params, limit: MAX_PAGE, offset } });
    items.push(...page.data);
    if (page.data.length === 0 || items.length >= page.pagination.total) return items;
  }
}

// --------------------------------------------------------------------------------- signing in

function isAdmin() {
  return sessionStorage.getItem(SCOPE_STORE) === "admin";
}

function signOut(why) {
  sessionStorage.removeItem(KEY_STORE);
  sessionStorage.removeItem(SCOPE_STORE);
  route();
  if (why) say(why);
}

function mayDecide() {
  return isAdmin() || sessionStorage.getItem(SCOPE_STORE) === "approver";
}

// what the key may do, read from the service: GET /v1/whoami answers the caller's own key
async function probeScope(key) {
  const me = await api("GET", "/v1/whoami", { key });
  const scopes = Array.isArray(me.scopes) ? me.scopes : [];
  if (scopes.includes("admin")) return "admin";
  if (scopes.includes("approver")) return "approver";
  return "read-only";
}

function signInPage() {
  const token = generation;
  // a text field masked by the style sheet, not a password field: a browser's password manager
  // offers to save what is typed in a password field, and an API key must not be kept there
  const input = h("input", {
    id: "key-input", type: "text", class: "masked mono", autocomplete: "off",
    autocapitalize: "off", spellcheck: "false", placeholder: "svc_…", "aria-label": "API key",
    required: true,
  });
  const submit = async (event) => {
    event.preventDefault();
    clearMessage();
    const key = input.value.trim();
    if (!KEY_FORMAT.test(key)) {
      say("That is not an API key: keys are svc_ followed by 32 hex characters.");
      return;
    }
    try {
      await api("GET", "/v1/agents", { params: { limit: 1 }, key });
      // the key's scopes tell the page which controls to offer
      const scope = await probeScope(key);
      sessionStorage.setItem(KEY_STORE, key);
      sessionStorage.setItem(SCOPE_STORE, scope);
      input.value = "";
      if (!location.hash || location.hash === "#/") location.hash = "#/agents";
      else route();
    } catch (error) {
      say(error instanceof ApiError && error.status === 401
        ? `This key was refused: ${error.message}` : describe(error));
    }
  };
  // an input without a name is never part of a form submission, so the key cannot reach a URL
  show(token, h("form", { class: "panel narrow", id: "sign-in", onsubmit: submit },
    h("h1", {}, "Sign in"),
    h("p", {}, "Paste an API key. It stays in this browser tab and is forgotten when the tab closes."),
    h("label", { for: "key-input" }, "API key"), input,
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Sign in"))));
  input.focus();
}

// ------------------------------------------------------------------------- confirmation

function confirmAction(text, label) {
  const dialog = $("confirm");
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = label;
  return new Promise((resolve) => {
    const done = (answer) => () => {
      $("confirm-ok").onclick = null;
      $("confirm-cancel").onclick = null;
      dialog.onclose = null;
      if (dialog.open) dialog.close();
      resolve(answer);
    };
    $("confirm-ok").onclick = done(true);
    $("confirm-cancel").onclick = done(false);
    dialog.onclose = done(false);
    dialog.showModal();
  });
}

// ------------------------------------------------------------------------- rules, readably

function toolsText(rule) {
  const tools = rule.tools || ["*"];
  return tools.length === 1 && tools[0] === "*" ? "all tools" : tools.join(", ");
}

function ranges(values, render) {
  const sorted = [...new Set(values)].sort((a, b) => a - b);
  const out = [];
  for (let i = 0; i < sorted.length; i++) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
    out.push(render(sorted[i], sorted[j]));
    i = j;
  }
  return out.join(", ");
}

const pad = (n) => String(n).padStart(2, "0");

function constraintTexts(name, constraint) {
  const out = [];
  if (constraint.min !== undefined) out.push(`deny if ${name} < ${constraint.min}`);
  if (constraint.max !== undefined) out.push(`deny if ${name} > ${constraint.max}`);
  if (constraint.enum !== undefined) out.push(`deny if ${name} not in {${constraint.enum.join(", ")}}`);
  if (constraint.regex !== undefined) out.push(`deny if ${name} does not match /${constraint.regex}/`);
  return out;
}

// the same constraint, as the condition that makes a call need a person's approval
function breachText(name, constraint) {
  const out = [];
  if (constraint.min !== undefined) out.push(`${name} is below ${constraint.min}`);
  if (constraint.max !== undefined) out.push(`${name} is above ${constraint.max}`);
  if (constraint.enum !== undefined) out.push(`${name} is not in {${constraint.enum.join(", ")}}`);
  if (constraint.regex !== undefined) out.push(`${name} does not match /${constraint.regex}/`);
  return out;
}

// seconds as the largest whole unit: "1 h", "90 min", "7 d", "45 s"
function duration(seconds) {
  const units = [[86400, "d"], [3600, "h"], [60, "min"]];
  for (const [size, unit] of units) if (seconds % size === 0) return `${seconds / size} ${unit}`;
  return `${seconds} s`;
}

function approvalText(rule) {
  const all = !rule.tools || (rule.tools.length === 1 && rule.tools[0] === "*");
  const lasts = rule.approval && rule.approval.ttlSeconds !== undefined
    ? ` (approval lasts ${duration(rule.approval.ttlSeconds)})` : "";
  const breaches = Object.entries(rule.parameters || {}).flatMap(([n, c]) => breachText(n, c));
  if (!breaches.length) {
    return `needs a person's approval for every call${all ? "" : ` of ${toolsText(rule)}`}${lasts}`;
  }
  return `needs a person's approval for ${all ? "any tool" : toolsText(rule)} when ${breaches.join(" or ")}${lasts}`;
}

function perText(rule) {
  return rule.per === "session" ? " per session" : "";
}

function ruleText(rule) {
  const on = rule.tools && !(rule.tools.length === 1 && rule.tools[0] === "*")
    ? ` (on ${toolsText(rule)})` : "";
  switch (rule.type) {
    case "tool_allowlist":
      return `allow ${toolsText(rule)}`;
    case "tool_denylist":
      return `deny ${toolsText(rule)}`;
    case "parameter_constraint": {
      const parts = Object.entries(rule.parameters || {}).flatMap(([n, c]) => constraintTexts(n, c));
      return parts.join("; ") + on;
    }
    case "rate_limit":
      return `max ${counted(rule.rateLimit.maxCalls, "call")} / ${rule.rateLimit.windowSeconds} s${perText(rule)}${on}`;
    case "budget":
      return `spend at most ${rule.budget.max} of ${rule.budget.parameter} / ${rule.budget.windowSeconds} s${perText(rule)}${on}`;
    case "time_based": {
      const w = rule.timeWindow;
      const days = w.allowedDays ? ranges(w.allowedDays, (a, b) =>
        a === b ? DAYS[a] : `${DAYS[a]}-${DAYS[b]}`) : "every day";
      const hours = w.allowedHours ? ranges(w.allowedHours, (a, b) => `${pad(a)}-${pad(b + 1)}`)
        : "all day";
      return `${days} ${hours} ${w.timezone || "UTC"}${on}`;
    }
    case "require_approval":
      return approvalText(rule);
    default:
      return JSON.stringify(rule);
  }
}

function byEvaluationOrder(a, b) {
  return (b.priority - a.priority) || a.createdAt.localeCompare(b.createdAt) || a.id.localeCompare(b.id);
}

// ------------------------------------------------------------------------------ pages

function pager(page, go) {
  const { offset, count, total, limit } = page.pagination;
  const first = total ? offset + 1 : 0;
  return h("div", { class: "pager" },
    h("button", { type: "button", class: "secondary", disabled: offset === 0,
      onclick: () => go(Math.max(0, offset - limit)) }, "← Newer"),
    h("span", { class: "count" }, `${first}–${offset + count} of ${total}`),
    h("button", { type: "button", class: "secondary", disabled: offset + count >= total,
      onclick: () => go(offset + limit) }, "Older →"));
}

async function agentsPage(args) {
  const token = generation;
  const offset = Number(args.get("offset") || 0);
  const page = await api("GET", "/v1/agents", { params: { limit: PAGE, offset } });
  const rows = page.data.map((agent) => h("tr", { "data-agent": agent.name },
    h("td", {}, h("a", { href: `#/agents/${agent.id}` }, agent.name)),
    h("td", {}, badge(agent.status)),
    h("td", { class: "muted" }, agent.description || ""),
    h("td", { class: "nowrap" }, when(agent.updatedAt)),
    isAdmin() ? h("td", { class: "actions" }, statusButtons(agent, () => agentsPage(args))) : null));
  show(token, h("section", { class: "panel" },
    h("h1", {}, "Agents"),
    page.data.length ? scroller(h("table", { id: "agents" },
      h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", {}, "Status"),
        h("th", {}, "Description"), h("th", {}, "Updated"), isAdmin() ? h("th", {}, "") : null)),
      h("tbody", {}, rows)))
      : h("p", { class: "muted" }, "No agents in this workspace yet."),
    pager(page, (o) => { location.hash = `#/agents?offset=${o}`; })));
}

function statusButtons(agent, after) {
  const change = (status, verb, consequence) => async () => {
    const ok = await confirmAction(`${verb} agent “${agent.name}”? ${consequence}`, verb);
    if (!ok) return;
    try {
      await api("PATCH", `/v1/agents/${agent.id}`, { body: { status } });
      say(`Agent “${agent.name}” is now ${status}.`, "ok");
      await after();
    } catch (error) {
      fail(error);
    }
  };
  const out = [];
  if (agent.status === "active") {
    out.push(h("button", { type: "button", class: "warn", onclick: change("suspended", "Suspend",
      "Every authorize call for it will be denied until it is reactivated.") }, "Suspend"));
  } else {
    out.push(h("button", { type: "button", class: "secondary", onclick: change("active",
      "Reactivate", "Its policies will decide its calls again.") }, "Reactivate"));
  }
  if (agent.status !== "revoked") {
    out.push(h("button", { type: "button", class: "danger", onclick: change("revoked", "Revoke",
      "Every authorize call for it will be denied.") }, "Revoke"));
  }
  return out;
}

async function agentPage(id) {
  const token = generation;
  const agent = await api("GET", `/v1/agents/${encodeURIComponent(id)}`);
  const ordered = (await everything("/v1/policies", { agent_id: id })).sort(byEvaluationOrder);
  // disabled policies are listed where their priority puts them, but skipped; so are warn and
  // shadow ones, which decide no call (only the would-be decision beside it)
  let step = 0;
  const policyRows = ordered.map((policy) => h("tr", { class: policy.enabled ? "" : "disabled",
    "data-mode": policy.mode },
    h("td", {}, policy.enabled && policy.mode === "enforce" ? String(++step) : "—"),
    h("td", {}, h("a", { href: `#/policies/${policy.id}` }, policy.name),
      h("div", { class: "muted mono small" }, policy.id)),
    h("td", {}, String(policy.priority)),
    h("td", {}, policy.enabled ? badge("enabled", "active") : badge("disabled", "suspended")),
    h("td", {}, modeBadge(policy.mode)),
    h("td", {}, h("ol", { class: "rules" }, policy.rules.map((rule) => h("li", {}, ruleText(rule))))),
    h("td", {}, policy.managedBy ? h("span", { title: policy.managedBy }, "git") : "API")));
  const sections = [h("section", { class: "panel" },
    h("p", {}, h("a", { href: "#/agents" }, "← Agents")),
    h("h1", {}, agent.name, " ", badge(agent.status)),
    h("p", { class: "muted" }, agent.description || "No description."),
    h("dl", { class: "facts" },
      h("dt", {}, "ID"), h("dd", { class: "mono" }, agent.id),
      h("dt", {}, "Created"), h("dd", {}, when(agent.createdAt)),
      h("dt", {}, "Updated"), h("dd", {}, when(agent.updatedAt))),
    isAdmin() ? h("div", { class: "actions" }, statusButtons(agent, () => agentPage(id))) : null),
  h("section", { class: "panel" },
    h("h2", {}, "Policies, in evaluation order"),
    ordered.length ? scroller(h("table", { id: "policies" },
      h("thead", {}, h("tr", {}, h("th", {}, "#"), h("th", {}, "Policy"), h("th", {}, "Priority"),
        h("th", {}, "State"), h("th", {}, "Mode"), h("th", {}, "Rules"), h("th", {}, "Managed by"))),
      h("tbody", {}, policyRows)))
      : h("p", { class: "muted" }, "No policies: every call of this agent is denied (default deny)."))];
  const usage = h("section", { class: "panel", id: "usage" }, h("h2", {}, "Limits in use"));
  const decisions = h("section", { class: "panel" }, h("h2", {}, "Latest decisions"));
  sections.push(usage, decisions);
  show(token, ...sections);
  await usagePanel(usage, id, ordered);
  const latest = await api("GET", "/v1/audit-logs", { params: { agent_id: id, limit: 10 } });
  decisions.append(latest.data.length ? entriesTable(latest.data, { [agent.id]: agent.name })
    : h("p", { class: "muted" }, "No decisions yet."),
  h("p", {}, h("a", { href: `#/audit?agent_id=${agent.id}` }, "All decisions of this agent →")));
}

// each rate limit and budget of the agent's enabled policies: its current window as a bar of
// what is used against the limit; per-session rules for the session asked about in the form
async function usagePanel(panel, id, policies, sessionId = "") {
  const usage = await api("GET", `/v1/agents/${encodeURIComponent(id)}/usage`,
    { params: sessionId ? { session_id: sessionId } : {} });
  const names = Object.fromEntries(policies.map((p) => [p.id, p.name]));
  const form = h("form", { class: "filters", id: "usage-session", onsubmit: (event) => {
    event.preventDefault();
    const chosen = new FormData(form).get("session_id") || "";
    panel.replaceChildren(h("h2", {}, "Limits in use"));
    usagePanel(panel, id, policies, chosen).catch(fail);
  } },
  h("label", {}, h("span", {}, "Session"), h("input", { name: "session_id", value: sessionId,
    placeholder: "for per-session limits" })),
  h("div", { class: "actions" }, h("button", { type: "submit", class: "secondary" }, "Show")));
  if (!usage.data.length) {
    panel.append(h("p", { class: "muted" }, "No rate limits or budgets."));
    return;
  }
  const rows = usage.data.map((item) => {
    const what = item.type === "budget" ? `budget of ${item.limit} ${item.parameter}`
      : `${counted(item.limit, "call")}`;
    const per = item.per === "session" ? " per session" : "";
    const shown = item.used === null ? "ask with a session"
      : `${item.used} of ${item.limit} used, ${item.remaining} left`;
    return h("tr", { "data-rule": `${item.policyId}:${item.ruleIndex}` },
      h("td", {}, names[item.policyId] || item.policyId, item.mode && item.mode !== "enforce"
        ? [" ", modeBadge(item.mode)] : null, h("div", { class: "muted small" }, `rule ${item.ruleIndex}`)),
      h("td", {}, `${what} / ${item.windowSeconds} s${per}`,
        h("div", { class: "muted small" }, `window from ${when(item.windowStart)}`)),
      h("td", { class: "usage" }, h("meter", { min: "0", max: String(item.limit),
        high: String(item.limit * 0.9), optimum: "0", value: String(item.used ?? 0), title: shown }),
      h("div", { class: "small" }, shown)));
  });
  panel.append(form, scroller(h("table", { id: "limits" },
    h("thead", {}, h("tr", {}, h("th", {}, "Policy"), h("th", {}, "Limit"), h("th", {}, "Current window"))),
    h("tbody", {}, rows))));
}

// decisions §10: what each mode does, in words
const MODE_WORDS = {
  enforce: "Decides calls.",
  warn: "Tried beside the enforced policies: calls are decided without it, and the caller is " +
    "warned when it would have decided otherwise.",
  shadow: "Tried beside the enforced policies, silently: calls are decided without it, and " +
    "what it would have done is only recorded.",
};
const MODE_KINDS = { enforce: "active", warn: "pending", shadow: "plain" };

function modeBadge(mode) {
  return h("span", { title: MODE_WORDS[mode] || "" }, badge(mode, MODE_KINDS[mode] || "plain"));
}

// One policy: what it is, and what it would have done on live traffic over the last 7 days
// (GET /v1/policies/:id/shadow-report), with a chart of its would-be results day by day
async function policyPage(id) {
  const token = generation;
  const policy = await api("GET", `/v1/policies/${encodeURIComponent(id)}`);
  const [agent, report] = await Promise.all([
    api("GET", `/v1/agents/${encodeURIComponent(policy.agentId)}`),
    api("GET", `/v1/policies/${encodeURIComponent(id)}/shadow-report`)]);
  const chart = h("figure", { class: "chart-box", id: "would-be-chart", "aria-busy": "true" });
  show(token, h("section", { class: "panel" },
    h("p", {}, h("a", { href: `#/agents/${agent.id}` }, `← ${agent.name}`)),
    h("h1", {}, policy.name, " ", modeBadge(policy.mode)),
    h("p", { class: "muted" }, MODE_WORDS[policy.mode] || ""),
    h("dl", { class: "facts" },
      h("dt", {}, "ID"), h("dd", { class: "mono" }, policy.id),
      h("dt", {}, "Agent"), h("dd", {}, h("a", { href: `#/agents/${agent.id}` }, agent.name)),
      h("dt", {}, "Priority"), h("dd", {}, String(policy.priority)),
      h("dt", {}, "State"), h("dd", {}, policy.enabled ? "enabled" : "disabled"),
      h("dt", {}, "Managed by"), h("dd", {}, policy.managedBy ? "git" : "API")),
    h("ol", { class: "rules" }, policy.rules.map((rule) => h("li", {}, ruleText(rule))))),
  reportPanel(report, agent), h("section", { class: "panel" },
    h("h2", {}, "Would-be results, day by day"), chart));
  await drawWouldBe(chart, id, token);
}

// the report's counts, by tool, and the newest calls it would have changed
function reportPanel(report, agent) {
  const facts = [["Calls with a would-be decision", report.calls],
    ["Changed by this policy", report.changed], ["… would deny", report.wouldDeny],
    ["… would escalate", report.wouldEscalate], ["… would allow", report.wouldAllow],
    ["Would-be decisions that failed", report.errors]];
  return h("section", { class: "panel", id: "report" },
    h("h2", {}, "What it would have done"),
    h("p", { class: "muted small" }, `From ${when(report.from)} to ${when(report.to)}: the calls of `,
      agent.name, " decided beside its enforced policies as if this one enforced too."),
    h("dl", { class: "facts" }, facts.flatMap(([name, n]) =>
      [h("dt", {}, name), h("dd", { class: "num", "data-count": name }, String(n))])),
    report.byTool.length ? scroller(h("table", { id: "report-tools" },
      h("thead", {}, h("tr", {}, h("th", {}, "Tool"), h("th", { class: "num" }, "Calls"),
        h("th", { class: "num" }, "Changed"))),
      h("tbody", {}, report.byTool.map((row) => h("tr", {},
        h("td", { class: "mono" }, row.toolName), h("td", { class: "num" }, String(row.calls)),
        h("td", { class: "num" }, String(row.changed)))))))
      : h("p", { class: "muted" }, "No calls with a would-be decision in this range."),
    report.samples.length ? h("details", { id: "report-samples" },
      h("summary", {}, counted(report.samples.length, "call it changed", "calls it changed"),
        ", newest first"),
      h("ul", { class: "mono small" }, report.samples.map((sample) => h("li", {}, sample)))) : null);
}

// seven reports of a day each: the would-be results of the calls this policy changed, and the
// calls it left as they were, stacked by day
async function drawWouldBe(box, id, token) {
  const today = Math.floor(Date.now() / DAY_MS) * DAY_MS;
  const days = Array.from({ length: 7 }, (_, i) => today - (6 - i) * DAY_MS);
  let reports;
  try {
    reports = await Promise.all(days.map((start) => api("GET",
      `/v1/policies/${encodeURIComponent(id)}/shadow-report`, { params: {
        from: new Date(start).toISOString(),
        // the day's last microsecond: to is inclusive
        to: `${new Date(start + DAY_MS - 1000).toISOString().slice(0, 19)}.999999Z` } })));
  } catch (error) {
    if (token !== generation) return;
    if (error instanceof ApiError && error.status === 401) return fail(error);
    box.replaceChildren(h("p", { class: "notice bad" }, `No chart: ${describe(error)}`));
    box.removeAttribute("aria-busy");
    return;
  }
  if (token !== generation) return;
  const items = reports.flatMap((r, i) => {
    const start = new Date(days[i]).toISOString();
    return [["denied", r.wouldDeny], ["escalated", r.wouldEscalate], ["allowed", r.wouldAllow],
      ["error", r.errors], ["unchanged", r.calls - r.changed - r.errors]]
      .filter(([, n]) => n > 0).map(([key, count]) => ({ start, key, count }));
  });
  const width = Math.max(300, Math.round(box.clientWidth));
  const drawn = decisionsChart(items, days[0], today + DAY_MS - 1, "day", width,
    "Would-be decisions", "would-be-title");
  box.replaceChildren(...[h("figcaption", { class: "muted small" }, drawn.title),
    drawn.node || h("p", { class: "muted", id: "would-be-empty" }, "No would-be decisions in these 7 days."),
    drawn.legend].filter(Boolean));
  box.removeAttribute("aria-busy");
}

const RESULT_KINDS = { allowed: "active", denied: "revoked", escalated: "pending" };
const ACTION_WORDS = { "approval.approve": "approval approved", "approval.deny": "approval denied" };

// what an entry did, beyond its result: an approval decided by a person, or the approval an
// escalated call waits for (or that allowed or denied it), linked to that approval
function entryNotes(entry) {
  const notes = [];
  if (entry.action && entry.action !== "authorize") {
    notes.push(h("div", { class: "small" }, badge(ACTION_WORDS[entry.action] || entry.action, "plain")));
  }
  if (entry.approvalId) {
    notes.push(h("div", { class: "small nowrap" }, h("a", { href: `#/approvals/${entry.approvalId}`,
      title: entry.approvalId }, `approval ${entry.approvalId.slice(0, 8)}…`)));
  }
  const would = entry.wouldBe;
  if (would && would.result === "error") {
    notes.push(h("div", { class: "small would-be" }, badge("would-be failed", "plain")));
  } else if (would && would.result !== entry.result) {
    const by = would.policyId ? h("a", { href: `#/policies/${would.policyId}` }, "a policy tried")
      : "the default deny";
    notes.push(h("div", { class: "small would-be", title: would.reason },
      badge(`would be ${would.result}`, RESULT_KINDS[would.result] || "revoked"), " by ", by));
  }
  if (entry.sessionId) {
    notes.push(h("div", { class: "small nowrap session" }, h("a", {
      href: `#/audit${query({ session_id: entry.sessionId })}`, title: entry.sessionId },
    `session ${entry.sessionId.length > 16 ? `${entry.sessionId.slice(0, 16)}…` : entry.sessionId}`)));
  }
  return notes;
}

// an entry's place in its workspace's chain: seq (1, 2, 3, ... in commit order; an erased
// entry leaves a gap in the list), and in its details the hash that chains it to all before it
function entriesTable(entries, names) {
  return scroller(h("table", { id: "entries" },
    h("thead", {}, h("tr", {}, h("th", { class: "num", title: "sequence number (seq)" }, "#"),
      h("th", {}, "Time"), h("th", {}, "Agent"), h("th", {}, "Tool"), h("th", {}, "Result"),
      h("th", {}, "Reason"), h("th", {}, "ms"), h("th", {}, "Parameters"))),
    h("tbody", {}, entries.map((entry) => h("tr", { "data-seq": entry.seq },
      h("td", { class: "num seq" }, entry.seq === null || entry.seq === undefined ? "—" : String(entry.seq)),
      h("td", { class: "nowrap" }, when(entry.timestamp)),
      h("td", {}, h("a", { href: `#/agents/${entry.agentId}` }, names[entry.agentId] || entry.agentId)),
      h("td", { class: "mono" }, entry.toolName),
      h("td", {}, badge(entry.result, RESULT_KINDS[entry.result] || "revoked"), entryNotes(entry)),
      h("td", {}, entry.reason),
      h("td", { class: "num" }, entry.latencyMs === null ? "" : Number(entry.latencyMs).toFixed(1)),
      h("td", {}, h("details", {}, h("summary", {}, counted(Object.keys(entry.parameters || {}).length, "parameter")),
        h("pre", {}, JSON.stringify(entry.parameters, null, 2)),
        entry.hash ? h("div", { class: "small muted chain" }, `hash of #${entry.seq}`,
          h("div", { class: "mono hash" }, entry.hash)) : null)))))));
}

const AUDIT_FILTERS = ["agent_id", "session_id", "action", "tool_name", "result", "from", "to", "limit"];
// the filters the stats endpoint takes: the chart counts what the list lists, but for `action`
const STATS_FILTERS = ["agent_id", "session_id", "tool_name", "result", "from", "to"];

// datetime-local gives "2026-11-21T09:30" (or with seconds); the API wants an instant
const instant = (text) => (!text ? "" : /T\d\d:\d\d$/.test(text) ? `${text}:00Z` : `${text}Z`);

// Every key may read the audit log, filter it, walk it and export it. The page walks by cursor
// (decisions §9): "Older" follows the page's nextCursor, which the URL keeps with `seen` (how
// many entries the walk showed before this page, for the count), so back, forward and reload
// show the same page; a cursor is bound to the filters, so applying filters starts a new walk.
async function auditPage(args) {
  const token = generation;
  const filters = Object.fromEntries(AUDIT_FILTERS.map((name) => [name, args.get(name) || ""]));
  const matching = { ...filters, from: instant(filters.from), to: instant(filters.to), limit: "" };
  const limit = filters.limit || "50";
  const cursor = args.get("cursor") || "";
  const seen = cursor ? Math.max(0, Number(args.get("seen")) || 0) : 0;
  const [agents, listing] = await Promise.all([everything("/v1/agents", {}),
    walkFrom(filters, { ...matching, limit }, cursor, seen)]);
  const { page } = listing;
  const names = Object.fromEntries(agents.map((a) => [a.id, a.name]));
  const goTo = (next, count) => {
    location.hash = `#/audit${query(next ? { ...filters, cursor: next, seen: count } : filters)}`;
  };
  const chart = h("figure", { id: "decisions-chart", class: "chart-box", "aria-busy": "true" });
  const kept = h("section", { class: "panel", id: "retention", "aria-busy": "true" },
    h("h2", {}, "Keeping the log"));
  show(token, h("section", { class: "panel" }, h("h1", {}, "Audit log"), auditFilters(filters, agents, matching),
    h("p", { id: "export-notice", class: "notice", hidden: true }),
    chart,
    page.data.length ? entriesTable(page.data, names) : h("p", { class: "muted" }, "No entries match."),
    cursorPager(page, listing, goTo)),
  kept, verifyPanel());
  if (listing.refused) say(`${describe(listing.refused)}. Showing the newest entries instead.`);
  await Promise.all([drawChart(chart, matching, token), retentionPanel(kept, token)]);
}

// The page of the walk at `cursor` (the first page without one). A cursor the service refuses
// (altered, or made for other filters) is said, and the walk starts again from the newest.
async function walkFrom(filters, params, cursor, seen) {
  if (!cursor) return { page: await api("GET", "/v1/audit-logs", { params }), seen: 0, first: true };
  try {
    const page = await api("GET", "/v1/audit-logs", { params: { ...params, cursor } });
    return { page, seen, first: false };
  } catch (error) {
    const cursorRefused = error instanceof ApiError && error.status === 400
      && error.details.some((d) => d.field === "cursor");
    if (!cursorRefused) throw error;
    history.replaceState(null, "", `#/audit${query(filters)}`);
    const page = await api("GET", "/v1/audit-logs", { params });
    return { page, seen: 0, first: true, refused: error };
  }
}

function auditFilters(filters, agents, matching) {
  const field = (label, control) => h("label", {}, h("span", {}, label), control);
  const form = h("form", { id: "audit-filters", class: "filters", onsubmit: (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const chosen = {};
    for (const name of AUDIT_FILTERS) if (data.get(name)) chosen[name] = data.get(name);
    location.hash = `#/audit${query(chosen)}`;
  } },
  field("Agent", h("select", { name: "agent_id" }, h("option", { value: "" }, "any"),
    agents.map((a) => h("option", { value: a.id, selected: a.id === filters.agent_id }, a.name)))),
  field("Session", h("input", { name: "session_id", value: filters.session_id, placeholder: "exact id" })),
  field("Action", h("input", { name: "action", value: filters.action, placeholder: "authorize" })),
  field("Tool", h("input", { name: "tool_name", value: filters.tool_name, placeholder: "exact name" })),
  field("Result", h("select", { name: "result" }, ["", "allowed", "denied", "escalated"].map((r) =>
    h("option", { value: r, selected: r === filters.result }, r || "any")))),
  field("From (UTC)", h("input", { name: "from", type: "datetime-local", value: filters.from })),
  field("To (UTC)", h("input", { name: "to", type: "datetime-local", value: filters.to })),
  field("Per page", h("select", { name: "limit" }, perPage(filters.limit || "50").map((n) =>
    h("option", { value: n, selected: n === (filters.limit || "50") }, n)))),
  h("div", { class: "actions" },
    h("button", { type: "submit" }, "Apply filters"),
    h("button", { type: "button", class: "secondary", onclick: () => { location.hash = "#/audit"; } }, "Clear"),
    h("button", { type: "button", class: "secondary", id: "export", onclick: () => exportCsv(matching) },
      "Export CSV")));
  return form;
}

// the page sizes offered, and the one a link asked for (kept when filters are applied)
function perPage(current) {
  const sizes = ["25", "50", "100", "500", "1000"];
  return sizes.includes(current) ? sizes : [current, ...sizes].sort((a, b) => a - b);
}

// "Newest" back to the walk's first page, the place in the walk and the total matching now,
// "Older" on to the page after this one (the browser's Back returns to the one before)
function cursorPager(page, { seen, first }, goTo) {
  const { count, total, nextCursor } = page.pagination;
  return h("div", { class: "pager" },
    h("button", { type: "button", class: "secondary", disabled: first,
      onclick: () => goTo(null) }, "\u21e4 Newest"),
    h("span", { class: "count" }, `${count ? seen + 1 : 0}\u2013${seen + count} of ${total}`),
    h("button", { type: "button", class: "secondary", disabled: !nextCursor,
      onclick: () => goTo(nextCursor, seen + count) }, "Older \u2192"));
}

// The chart of decisions over time by result, for the page's filters (but `action`, which the
// stats do not take) over From to To, or the last 24 hours when they are not given.
async function drawChart(box, matching, token) {
  const to = matching.to ? Date.parse(matching.to) : Date.now();
  const from = matching.from ? Date.parse(matching.from) : to - DAY_MS;
  const bucket = bucketFor(from, to);
  const params = Object.fromEntries(STATS_FILTERS.map((name) => [name, matching[name]]));
  const range = { from: new Date(from).toISOString(), to: new Date(to).toISOString() };
  let stats;
  try {
    stats = await api("GET", "/v1/audit-logs/stats", { params: { ...params, ...range, bucket,
      group_by: "result" } });
  } catch (error) {
    if (token !== generation) return;
    if (error instanceof ApiError && error.status === 401) return fail(error);
    box.replaceChildren(h("p", { class: "notice bad", id: "chart-error" }, `No chart: ${describe(error)}`));
    box.removeAttribute("aria-busy");
    return;
  }
  if (token !== generation) return;
  const width = Math.max(300, Math.round(box.clientWidth));
  const drawn = decisionsChart(stats.data, from, to, bucket, width);
  const parts = [h("figcaption", { class: "muted small" }, drawn.title),
    drawn.node || h("p", { class: "muted", id: "chart-empty" }, "No decisions in this range."),
    drawn.legend,
    matching.action ? h("p", { class: "muted small" },
      "The chart counts every action: it cannot be narrowed by Action.") : null];
  box.replaceChildren(...parts.filter(Boolean));
  box.removeAttribute("aria-busy");
}

// What the log keeps: its entries, the oldest one kept, and the last prune with its archive
// (`agentauth audit prune`, or the retention of `agentauth serve`)
async function retentionPanel(panel, token) {
  let kept;
  try {
    kept = await api("GET", "/v1/audit-logs/retention");
  } catch (error) {
    if (token !== generation) return;
    if (error instanceof ApiError && error.status === 401) return fail(error);
    panel.append(h("p", { class: "notice bad", id: "retention-error" }, describe(error)));
    panel.removeAttribute("aria-busy");
    return;
  }
  if (token !== generation) return;
  const row = (label, id, ...value) => [h("dt", {}, label), h("dd", { id }, ...value)];
  const { oldest, lastPrune: last } = kept;
  panel.append(h("dl", { class: "facts" },
    row("Entries kept", "retention-kept", counted(kept.kept, "entry", "entries"),
      h("span", { class: "muted" }, ` of ${kept.size} in the chain`)),
    row("Oldest kept", "retention-oldest", oldest ? `#${oldest.seq}, ${when(oldest.timestamp)}` : "none"),
    row("Pruned", "retention-pruned", kept.prunedThrough
      ? `#1 to #${kept.prunedThrough}, archived` : "never: the database holds the log from #1"),
    last ? row("Last prune", "retention-last", `${when(last.at)} (${relative(last.at)}): `
      + `entries #${last.first} to #${last.last}`) : null,
    last ? row("Its archive", "retention-archive", h("span", { class: "mono" }, last.archive)) : null),
  h("p", { class: "muted small" }, "A prune archives the oldest entries with a signed checkpoint, " +
    "verifies the archive, and only then removes them: keep the archives, ",
  h("code", {}, "agentauth audit verify --export ARCHIVE"), " checks them offline."));
  panel.removeAttribute("aria-busy");
}

async function exportCsv(params) {
  const notice = $("export-notice");
  notice.hidden = true;
  try {
    const { limit, offset, ...filters } = params;
    const response = await call("GET", "/v1/audit-logs/export", { params: filters });
    if (!response.ok) throw await refusal(response);
    const disposition = response.headers.get("Content-Disposition") || "";
    const name = (disposition.match(/filename="([^"]+)"/) || [])[1] || "audit-log.csv";
    const blob = await response.blob();
    const link = h("a", { href: URL.createObjectURL(blob), download: name });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 60000);
    if (response.headers.get("X-Svc-Export-Truncated") === "true") {
      const cap = response.headers.get("X-Svc-Export-Limit") || "5000";
      notice.textContent = `The export was cut at ${counted(cap, "row")} (the newest). Narrow From and To and export again for the rest.`;
      notice.className = "notice warn";  // the file is not all that was asked for
    } else {
      notice.textContent = `Downloaded ${name}.`;
      notice.className = "notice ok";
    }
    notice.hidden = false;
  } catch (error) {
    fail(error);
  }
}

// --------------------------------------------------------------------- verifying the log

// The audit log is a hash chain (each entry's hash covers every entry before it), and the
// service signs checkpoints of it: its size and the hash of its newest entry. The panel fetches
// the current one and says what it signs; the person keeps it away from the database, and
// `agentauth audit verify --checkpoint FILE` later checks the log against it.

// a text answer of the API (the checkpoint and the public key are text/plain)
async function textOf(path) {
  const response = await call("GET", path);
  if (!response.ok) throw await refusal(response);
  return response.text();
}

// standard base64, padded, to bytes; an Error for anything else
function fromBase64(text) {
  if (text.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(text)) {
    throw new Error(`“${text.slice(0, 24)}” is not base64`);
  }
  return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
}

const hexOf = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

// A checkpoint is a C2SP signed note: the text "agentauth/<workspace id>\n<size>\n<base64 of the
// head hash>\n", an empty line, then signature lines "— <key name> <base64 of the 4-byte key
// ID and the 64-byte Ed25519 signature of the text>". An Error says what is wrong with it.
function parseCheckpoint(note) {
  const split = note.lastIndexOf("\n\n");
  if (split < 0) throw new Error("no empty line between its text and its signatures");
  const text = note.slice(0, split + 1);
  const lines = text.slice(0, -1).split("\n");
  if (lines.length !== 3) throw new Error(`its text has ${counted(lines.length, "line")}, not 3`);
  const [origin, size, head] = lines;
  if (!/^(0|[1-9][0-9]*)$/.test(size)) throw new Error(`its size “${size}” is not a number`);
  const headBytes = fromBase64(head);
  if (headBytes.length !== 32) throw new Error("its head is not a 32-byte hash");
  const signatures = note.slice(split + 2).split("\n").filter(Boolean).map((line) => {
    const match = /^\u2014 (\S+) (\S+)$/.exec(line);
    if (!match) throw new Error(`“${line.slice(0, 40)}” is not a signature line`);
    const raw = fromBase64(match[2]);
    if (raw.length < 5) throw new Error("a signature line is too short");
    return { name: match[1], keyId: hexOf(raw.slice(0, 4)), signature: raw.slice(4) };
  });
  if (!signatures.length) throw new Error("it has no signature");
  return { note, text, origin, size: Number(size), head: hexOf(headBytes), signatures };
}

// the C2SP verifier key the public-key endpoint answers: "<name>+<8 hex key ID>+<base64 of 0x01
// and the 32-byte Ed25519 key>"
function parsePublicKey(answer) {
  const text = answer.trim();
  const match = /^([^+\s]+)\+([0-9a-f]{8})\+(\S+)$/.exec(text);
  if (!match) throw new Error("the public key is not <name>+<key ID>+<key>");
  const raw = fromBase64(match[3]);
  if (raw.length !== 33 || raw[0] !== 1) throw new Error("the public key is not an Ed25519 key");
  return { text, name: match[1], keyId: match[2], key: raw.slice(1) };
}

// Whether the checkpoint's signature by `key` verifies, checked in this browser with WebCrypto:
// { valid: true }, { valid: false, why } or, where the browser cannot tell (no Ed25519, or
// no WebCrypto on a page not served over HTTPS), { valid: null, why }.
async function checkSignature(checkpoint, key) {
  const by = `${key.name}+${key.keyId}`;
  const signature = checkpoint.signatures.find((s) => s.name === key.name && s.keyId === key.keyId);
  if (!signature) {
    const others = checkpoint.signatures.map((s) => `${s.name}+${s.keyId}`).join(", ");
    return { valid: false, why: `it has no signature by the service's key ${by} (only by ${others})` };
  }
  const subtle = window.crypto && window.crypto.subtle;
  if (!subtle) {
    return { valid: null, why: "this browser offers no cryptography to a page not served over HTTPS" };
  }
  const bytes = new TextEncoder();
  try {
    // the key's ID is the first 4 bytes of SHA-256(name, newline, 0x01, key)
    const named = [...bytes.encode(`${key.name}\n`), 1, ...key.key];
    const digest = new Uint8Array(await subtle.digest("SHA-256", new Uint8Array(named)));
    if (hexOf(digest.slice(0, 4)) !== key.keyId) {
      return { valid: false, why: `the public key's ID ${key.keyId} is not the one its name and bytes give` };
    }
    const imported = await subtle.importKey("raw", key.key, { name: "Ed25519" }, false, ["verify"]);
    const valid = await subtle.verify({ name: "Ed25519" }, imported, signature.signature,
      bytes.encode(checkpoint.text));
    return valid ? { valid } : { valid, why: `the signature by ${by} is not one of this text` };
  } catch (error) {
    return { valid: null, why: `this browser cannot check Ed25519 signatures (${error.name || error})` };
  }
}

function verifyPanel() {
  const token = generation;
  const result = h("div", { id: "checkpoint", hidden: true });
  const button = h("button", { type: "button", id: "fetch-checkpoint", onclick: async () => {
    clearMessage();
    result.hidden = true;
    result.replaceChildren();
    button.disabled = true;
    try {
      const [note, keyText] = await Promise.all([textOf("/v1/audit-logs/checkpoint"),
        textOf("/v1/audit-logs/public-key")]);
      if (token !== generation) return;
      let checkpoint;
      let key;
      try {
        checkpoint = parseCheckpoint(note);
        key = parsePublicKey(keyText);
      } catch (error) {
        result.replaceChildren(
          h("p", { class: "notice bad", id: "checkpoint-signature" },
            `The service answered something that is not a signed checkpoint: ${error.message}.`),
          h("pre", { class: "note" }, note), h("pre", { class: "note" }, keyText));
        result.hidden = false;
        return;
      }
      const verdict = await checkSignature(checkpoint, key);
      if (token !== generation) return;
      result.replaceChildren(...checkpointFacts(checkpoint, key, verdict));
      result.hidden = false;
    } catch (error) {
      if (token !== generation) return;
      if (error instanceof ApiError && error.status === 401) {
        fail(error);  // signs out, and says why
        return;
      }
      // said here, beside the button, not only at the top of a long page
      result.replaceChildren(h("p", { class: "notice bad", id: "checkpoint-error", role: "alert" },
        `No checkpoint: ${describe(error)}`));
      result.hidden = false;
    } finally {
      button.disabled = false;
    }
  } }, "Fetch checkpoint");
  return h("section", { class: "panel", id: "verify" },
    h("h2", {}, "Verify the log"),
    h("p", {}, "Each entry has a number (#) and a hash that covers it and every entry before " +
      "it. A checkpoint is the service's signed statement of the log's size and of that hash " +
      "for its newest entry. Save checkpoints somewhere away from the database (another host, " +
      "a ticket, a mail): later, ",
    h("code", {}, "agentauth audit verify --checkpoint FILE"),
    " checks the log against them, and catches any entry changed, removed, inserted or moved " +
      "since."),
    h("div", { class: "actions" }, button), result);
}

function checkpointFacts(checkpoint, key, verdict) {
  const { size, head } = checkpoint;
  const workspace = checkpoint.origin.startsWith("agentauth/")
    ? checkpoint.origin.slice("agentauth/".length) : null;
  const signer = checkpoint.signatures.find((s) => s.name === key.name && s.keyId === key.keyId)
    || checkpoint.signatures[0];
  const verdicts = {
    true: ["ok", `Signature valid: checked in this browser with the service's public key ${key.keyId}. ` +
      "It shows who signed this checkpoint, not that the log is intact: that takes a " +
      "checkpoint kept elsewhere, checked later."],
    false: ["bad", `Signature does NOT verify: ${verdict.why}. Do not rely on this checkpoint; ` +
      "check the log with agentauth audit verify."],
    null: ["warn", `Signature not checked here: ${verdict.why}. agentauth audit verify checks it.`],
  };
  const [kind, words] = verdicts[verdict.valid];
  const name = `agentauth-checkpoint-${size}.txt`;
  const noteBox = h("pre", { id: "checkpoint-note", class: "note" }, checkpoint.note);
  const row = (label, id, ...value) => [h("dt", {}, label), h("dd", { id }, ...value)];
  return [
    h("p", { class: `notice ${kind}`, id: "checkpoint-signature" }, words),
    h("dl", { class: "facts" },
      row("Log", "checkpoint-log", workspace === null ? checkpoint.origin
        : ["the audit log of workspace ", h("span", { class: "mono" }, workspace)]),
      row("Size", "checkpoint-size", size === 0 ? "0 entries (an empty log)"
        : size === 1 ? "1 entry: #1" : `${counted(size, "entry", "entries")}: #1 to #${size}`),
      row("Head hash", "checkpoint-head", h("span", { class: "mono hash" }, head),
        h("div", { class: "muted small" }, size === 0 ? "no entry yet: 32 zero bytes"
          : `the hash of entry #${size}, which covers every entry before it`)),
      row("Signed by", "checkpoint-key-id", h("span", { class: "mono" }, signer.keyId),
        h("div", { class: "muted small" }, `key “${signer.name}”`)),
      row("Public key", "checkpoint-public-key", h("span", { class: "mono small hash" }, key.text))),
    h("h3", {}, "The checkpoint, as signed"),
    noteBox,
    h("div", { class: "actions" },
      copyButton("copy-checkpoint", checkpoint.note, noteBox, "checkpoint", "secondary"),
      h("button", { type: "button", class: "secondary", id: "download-checkpoint", onclick: () => {
        const link = h("a", { href: URL.createObjectURL(new Blob([checkpoint.note],
          { type: "text/plain" })), download: name });
        document.body.append(link);
        link.click();
        link.remove();
        setTimeout(() => URL.revokeObjectURL(link.href), 60000);
      } }, "Download")),
    h("p", {}, "Keep it away from the database host (append each new one to the same file), " +
      "and check the log against it later:"),
    h("pre", { class: "note", id: "verify-command" },
      `agentauth audit verify --db "$DATABASE_URL" --workspace NAME --checkpoint ${name}`),
  ];
}

// A Copy button for `text`: it says Copied only when it did. Without the clipboard API (a page
// not served over HTTPS) it selects `box`, the text on the page, and copies the selection;
// when that fails too it asks the person to copy it themselves.
function copyButton(id, text, box, what, kind) {
  const button = h("button", { type: "button", id, class: kind, onclick: async () => {
    let copied = false;
    try {
      await navigator.clipboard.writeText(text);
      copied = true;
    } catch (_) {
      if (box.select) box.select();
      else window.getSelection().selectAllChildren(box);
      try {
        copied = document.execCommand("copy") === true;  // answers whether it did
      } catch (_) {
        copied = false;
      }
    }
    button.textContent = copied ? "Copied" : "Copy failed";
    if (!copied) say(`Copying failed: select the ${what} in the box and copy it yourself (Ctrl+C, or ⌘C on a Mac).`);
  } }, "Copy");
  return button;
}

// Listing keys is admin-only in this service: the page asks whatever the key, and shows a
// refusal in words, without the form. `shown` is the box of a key just created, kept as it is
// above the refreshed list (its Copy button, and what that button says, stay the same).
async function keysPage(args, shown) {
  const token = generation;
  const created = shown || h("div", { id: "new-key", class: "panel notice warn", hidden: true });
  let keys;
  try {
    keys = await everything("/v1/api-keys", {});
  } catch (error) {
    if (!(error instanceof ApiError && error.status === 403)) throw error;
    show(token, h("section", { class: "panel" }, h("h1", {}, "API keys"), created,
      h("p", { id: "keys-refused" }, describe(error)),
      h("p", { class: "muted" }, "Managing API keys needs an admin key: this one may not list, create or revoke them.")));
    return;
  }
  const form = h("form", { id: "create-key", class: "filters", onsubmit: async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const scopes = data.getAll("scopes");
    const expiry = data.get("expires");
    const body = { name: String(data.get("name") || "").trim(), scopes };
    if (expiry) body.expiresAt = `${expiry}T23:59:59Z`;
    let key;
    try {
      key = await api("POST", "/v1/api-keys", { body });
    } catch (error) {
      fail(error);
      return;
    }
    // the key is shown at once: the list is refreshed after, and its failure cannot hide it
    showNewKey(created, key);
    form.reset();
    try {
      await keysPage(args, created);
    } catch (error) {
      say(`Key “${key.name}” was created, but the list could not be refreshed. ${describe(error)}`);
    }
  } },
  h("label", {}, h("span", {}, "Name"), h("input", { name: "name", required: true, maxlength: 255 })),
  h("fieldset", {}, h("legend", {}, "Scopes"),
    h("label", { class: "inline" }, h("input", { type: "checkbox", name: "scopes", value: "read-only", checked: true }), " read-only"),
    h("label", { class: "inline" }, h("input", { type: "checkbox", name: "scopes", value: "approver" }), " approver"),
    h("label", { class: "inline" }, h("input", { type: "checkbox", name: "scopes", value: "admin" }), " admin")),
  h("label", {}, h("span", {}, "Expires (end of day, UTC; optional)"), h("input", { name: "expires", type: "date" })),
  h("div", { class: "actions" }, h("button", { type: "submit" }, "Create key")));
  const rows = keys.map((key) => h("tr", { "data-key": key.name },
    h("td", {}, key.name), h("td", { class: "mono" }, `${key.prefix}…`),
    h("td", {}, key.scopes.join(", ")), h("td", { class: "nowrap" }, key.expiresAt ? when(key.expiresAt) : "never"),
    h("td", { class: "nowrap" }, when(key.createdAt)),
    h("td", { class: "actions" }, h("button", { type: "button", class: "danger", onclick: async () => {
      const ok = await confirmAction(`Revoke key “${key.name}” (${key.prefix}…)? Every request made with it will be refused from now on.`, "Revoke");
      if (!ok) return;
      try {
        await api("DELETE", `/v1/api-keys/${key.id}`);
        say(`Key “${key.name}” revoked.`, "ok");
        await keysPage(args);  // a key that revoked itself is signed out here, by its 401
      } catch (error) {
        fail(error);
      }
    } }, "Revoke"))));
  show(token, h("section", { class: "panel" }, h("h1", {}, "API keys"), created,
    scroller(h("table", { id: "keys" },
      h("thead", {}, h("tr", {}, h("th", {}, "Name"), h("th", {}, "Prefix"), h("th", {}, "Scopes"),
        h("th", {}, "Expires"), h("th", {}, "Created"), h("th", {}, ""))),
      h("tbody", {}, rows)))),
  h("section", { class: "panel" }, h("h2", {}, "Create a key"), form));
}

function showNewKey(box, key) {
  const value = h("input", { id: "new-key-value", class: "mono", readonly: true, value: key.key });
  const copy = copyButton("copy-key", key.key, value, "key");
  box.replaceChildren(
    h("h2", {}, `Key “${key.name}” created`),
    h("p", { class: "warning" }, "Copy this key now: it is shown only this once and cannot be recovered. Store it like a password."),
    h("div", { class: "copy" }, value, copy));
  box.hidden = false;
}

// ------------------------------------------------------------------------------ approvals

const APPROVAL_STATUSES = ["pending", "approved", "denied", "expired", "used"];
const APPROVAL_FILTERS = ["status", "agent_id", "tool_name"];

// The service's refusals of a decision, in words a person can act on (its answer follows them)
const DECISION_REFUSALS = {
  SELF_APPROVAL_FORBIDDEN: "This key may not decide this approval: it made the call that asked " +
    "for it (or an identical call), and nobody approves their own request. Another person must " +
    "decide it, signed in with an admin or approver key of their own.",
  APPROVAL_NOT_PENDING: "This approval no longer waits for a decision: it was decided, used or " +
    "has expired meanwhile. The page now shows where it stands.",
  INSUFFICIENT_SCOPE: "This key may not decide approvals: that needs a key with the admin or " +
    "approver scope.",
  APPROVAL_NOT_FOUND: "This approval no longer exists (its agent may have been deleted).",
};

// the number of pending approvals, beside Approvals in the navigation: highlighted when some
// wait, muted when none do, a dash until it is known (always there, so that the navigation,
// two lines on a phone, never moves the page when the answer arrives). An answer older than
// the latest request is dropped.
let counting = 0;

function pendingCount(text, title, waiting) {
  const box = $("pending-count");
  box.textContent = text;
  box.title = title;
  box.classList.toggle("none", !waiting);
}

async function refreshPending() {
  const mine = ++counting;
  if (!sessionStorage.getItem(KEY_STORE)) {
    pendingCount("–", "", false);  // the next key may see another workspace
    return;
  }
  try {
    const page = await api("GET", "/v1/approvals", { params: { status: "pending", limit: 1 } });
    if (mine !== counting) return;
    const n = page.pagination.total;
    pendingCount(String(n), `${counted(n, "approval")} waiting for a decision`, n > 0);
  } catch (_) {
    // the page's own requests say what failed
    if (mine === counting) pendingCount("–", "the pending approvals could not be counted", false);
  }
}

// the approval's name for a person: the tool and the agent that called it
function callOf(approval, ctx) {
  return `the call of ${approval.toolName} by agent “${ctx.names[approval.agentId] || approval.agentId}”`;
}

function policyCell(approval, ctx) {
  const policy = ctx.policies[approval.policyId];
  if (!policy) {
    return [h("span", { class: "muted" }, "a policy since deleted"),
      h("div", { class: "muted mono small" }, approval.policyId)];
  }
  const rule = policy.rules[approval.ruleIndex];
  return [h("a", { href: `#/agents/${approval.agentId}`, title: policy.id }, policy.name),
    h("div", { class: "muted small", title: `rule index ${approval.ruleIndex}` },
      rule ? ruleText(rule) : `rule index ${approval.ruleIndex} (the policy has changed since)`)];
}

// who decided and when, their comment, and when the approval was used
function decisionText(approval) {
  const out = [];
  if (approval.decidedAt) {
    const by = approval.decidedBy ? approval.decidedBy.name : "a key since revoked";
    // a denied approval stays denied; a decided one that reads otherwise (approved, used, or
    // expired unused) was approved
    const verb = approval.status === "denied" ? "denied" : "approved";
    out.push(h("div", { class: "muted small" }, `${verb} by ${by}, ${when(approval.decidedAt)}`));
  }
  if (approval.comment) out.push(h("div", { class: "small comment" }, `“${approval.comment}”`));
  if (approval.usedAt) out.push(h("div", { class: "muted small" }, `used ${when(approval.usedAt)}`));
  return out;
}

function decideControls(approval, ctx) {
  const comment = h("input", { name: "comment", maxlength: 2000, placeholder: "Comment (optional)",
    "aria-label": "Comment", autocomplete: "off" });
  const decide = (verb, path, consequence, done) => async () => {
    const ok = await confirmAction(`${verb} ${callOf(approval, ctx)}? ${consequence}`, verb);
    if (!ok) return;
    const text = comment.value.trim();
    try {
      await api("POST", `/v1/approvals/${approval.id}/${path}`, { body: text ? { comment: text } : {} });
    } catch (error) {
      await refuseDecision(error, ctx);
      return;
    }
    say(done, "ok");
    refreshPending();
    try {
      await ctx.after();
    } catch (error) {
      fail(error);
    }
  };
  const until = when(approval.expiresAt);
  return h("div", { class: "decide" }, comment,
    h("div", { class: "actions" },
      h("button", { type: "button", class: "approve", onclick: decide("Approve", "approve",
        `Its next identical call will be allowed, once, until ${until}.`,
        `Approved: the next identical call of ${approval.toolName} by “${ctx.names[approval.agentId] || approval.agentId}” will be allowed once.`) },
      "Approve"),
      h("button", { type: "button", class: "danger", onclick: decide("Deny", "deny",
        `Identical calls will be denied until ${until}.`,
        `Denied: identical calls of ${approval.toolName} by “${ctx.names[approval.agentId] || approval.agentId}” will be denied until ${until}.`) },
      "Deny")));
}

async function refuseDecision(error, ctx) {
  if (!(error instanceof ApiError && DECISION_REFUSALS[error.code])) {
    fail(error);
    return;
  }
  say(`${DECISION_REFUSALS[error.code]} ${describe(error)}`);
  if (error.code === "APPROVAL_NOT_PENDING") {
    refreshPending();
    try {
      await ctx.after();  // show what became of it
    } catch (later) {
      fail(later);
    }
  }
}

function approvalsTable(id, approvals, ctx) {
  const deciding = mayDecide() && approvals.some((a) => a.status === "pending");
  return scroller(h("table", { id, class: "approvals" },
    h("thead", {}, h("tr", {}, h("th", {}, "Status"), h("th", {}, "Agent"), h("th", {}, "Tool"),
      h("th", {}, "Parameters"), h("th", {}, "Policy"), h("th", {}, "Expires"),
      deciding ? h("th", {}, "Decision") : null)),
    h("tbody", {}, approvals.map((approval) => h("tr", { "data-approval": approval.id },
      h("td", { class: "status" }, badge(approval.status),
        h("div", { class: "small" }, h("a", { href: `#/approvals/${approval.id}`, title: when(approval.createdAt) },
          `requested ${relative(approval.createdAt)}`)),
        decisionText(approval)),
      h("td", {}, h("a", { href: `#/agents/${approval.agentId}` }, ctx.names[approval.agentId] || approval.agentId)),
      h("td", { class: "mono" }, approval.toolName),
      h("td", {}, h("pre", { class: "parameters" }, JSON.stringify(approval.parameters, null, 2))),
      h("td", { class: "policy" }, policyCell(approval, ctx)),
      h("td", { class: "nowrap expires" }, timeCell(approval.expiresAt)),
      deciding ? h("td", {}, approval.status === "pending" ? decideControls(approval, ctx) : null)
        : null)))));
}

function readOnlyNote() {
  return mayDecide() ? null : h("p", { id: "approvals-read-only", class: "muted" },
    "Deciding needs a key with the admin or approver scope: this one may read approvals only.");
}

// Pending approvals first, all of them; then the rest of the workspace's approvals, newest
// first, a page at a time. A status filter shows the approvals of that status only.
async function approvalsPage(args) {
  const token = generation;
  const filters = Object.fromEntries(APPROVAL_FILTERS.map((name) => [name, args.get(name) || ""]));
  const offset = Number(args.get("offset") || 0);
  const [agents, policies, page, waiting] = await Promise.all([
    everything("/v1/agents", {}),
    everything("/v1/policies", {}),
    api("GET", "/v1/approvals", { params: { ...filters, limit: PAGE, offset } }),
    filters.status ? null : everything("/v1/approvals", { ...filters, status: "pending" }),
  ]);
  const ctx = {
    names: Object.fromEntries(agents.map((a) => [a.id, a.name])),
    policies: Object.fromEntries(policies.map((p) => [p.id, p])),
    after: () => approvalsPage(args),
  };
  const field = (label, control) => h("label", {}, h("span", {}, label), control);
  const form = h("form", { id: "approval-filters", class: "filters", onsubmit: (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const chosen = {};
    for (const name of APPROVAL_FILTERS) if (data.get(name)) chosen[name] = data.get(name);
    location.hash = `#/approvals${query(chosen)}`;
  } },
  field("Status", h("select", { name: "status" },
    h("option", { value: "" }, "pending first"),
    APPROVAL_STATUSES.map((s) => h("option", { value: s, selected: s === filters.status }, s)))),
  field("Agent", h("select", { name: "agent_id" }, h("option", { value: "" }, "any"),
    agents.map((a) => h("option", { value: a.id, selected: a.id === filters.agent_id }, a.name)))),
  field("Tool", h("input", { name: "tool_name", value: filters.tool_name, placeholder: "exact name" })),
  h("div", { class: "actions" },
    h("button", { type: "submit" }, "Apply filters"),
    h("button", { type: "button", class: "secondary", onclick: () => { location.hash = "#/approvals"; } }, "Clear")));
  const go = (o) => { location.hash = `#/approvals${query({ ...filters, offset: o })}`; };
  const head = h("section", { class: "panel" }, h("h1", {}, "Approvals"), readOnlyNote(), form);
  if (filters.status) {
    show(token, head, h("section", { class: "panel" },
      h("h2", {}, counted(page.pagination.total, `${filters.status} approval`)),
      page.data.length ? approvalsTable("approvals", page.data, ctx)
        : h("p", { class: "muted" }, "No approvals match."),
      pager(page, go)));
    return;
  }
  const shown = new Set(waiting.map((a) => a.id));
  const rest = page.data.filter((a) => a.status !== "pending" && !shown.has(a.id));
  show(token, head,
    h("section", { class: "panel" },
      h("h2", {}, `Waiting for a decision: ${counted(waiting.length, "approval")}`),
      waiting.length ? approvalsTable("pending-approvals", waiting, ctx)
        : h("p", { class: "muted" }, "Nothing waits for a decision.")),
    h("section", { class: "panel" },
      h("h2", {}, "Decided, used and expired"),
      h("p", { class: "muted small" }, "Newest first. The pager counts every approval, the pending ones above included."),
      rest.length ? approvalsTable("approvals", rest, ctx)
        : h("p", { class: "muted" }, "None on this page."),
      pager(page, go)));
}

// an answer of 404 as nothing, for what may have been deleted since
async function unlessGone(promise) {
  try {
    return await promise;
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) return null;
    throw error;
  }
}

async function approvalPage(id) {
  const token = generation;
  const approval = await api("GET", `/v1/approvals/${encodeURIComponent(id)}`);
  const [agent, policy] = await Promise.all([
    unlessGone(api("GET", `/v1/agents/${approval.agentId}`)),
    unlessGone(api("GET", `/v1/policies/${approval.policyId}`)),
  ]);
  const ctx = {
    names: agent ? { [agent.id]: agent.name } : {},
    policies: policy ? { [policy.id]: policy } : {},
    after: () => approvalPage(id),
  };
  const row = (label, ...value) => [h("dt", {}, label), h("dd", {}, ...value)];
  show(token, h("section", { class: "panel", id: "approval", "data-approval": approval.id },
    h("p", {}, h("a", { href: "#/approvals" }, "← Approvals")),
    h("h1", {}, `Approval of ${approval.toolName} `, badge(approval.status)),
    readOnlyNote(),
    h("dl", { class: "facts" },
      row("Agent", h("a", { href: `#/agents/${approval.agentId}` }, ctx.names[approval.agentId] || approval.agentId)),
      row("Tool", h("span", { class: "mono" }, approval.toolName)),
      row("Parameters", h("pre", { class: "parameters" }, JSON.stringify(approval.parameters, null, 2))),
      row("Policy", policyCell(approval, ctx)),
      row("Requested", timeCell(approval.createdAt)),
      row("Expires", timeCell(approval.expiresAt)),
      row("Decision", approval.decidedAt ? decisionText(approval) : "none yet"),
      row("Requested by key", h("span", { class: "mono small" }, approval.requestedByKeyId || "—")),
      row("Parameters digest", h("span", { class: "mono small" }, approval.parametersDigest)),
      row("ID", h("span", { class: "mono small" }, approval.id))),
    mayDecide() && approval.status === "pending" ? decideControls(approval, ctx) : null));
}

async function syncPage() {
  const token = generation;
  const status = await api("GET", "/v1/sync-status");
  const row = (label, value, id) => [h("dt", {}, label), h("dd", { id }, value)];
  const result = status.result ? badge(status.result, status.result === "failed" ? "revoked" : "active")
    : "never synced";
  show(token, h("section", { class: "panel" }, h("h1", {}, "Policy repository sync"),
    status.result === null
      ? h("p", { class: "muted" }, "No repository has been applied to this workspace yet (agentauth apply or serve --repo).")
      : null,
    h("dl", { class: "facts", id: "sync" },
      row("Source", status.source || "—"),
      row("Last attempt", result),
      row("Attempted revision", status.lastAttemptedRevision || "—", "attempted-revision"),
      row("Attempted at", when(status.lastAttemptedAt)),
      row("Applied revision (in force)", status.lastAppliedRevision || "—", "applied-revision"),
      row("Applied at", when(status.lastAppliedAt)),
      row("Error", status.error || "none", "sync-error"),
      row("Changes", status.changes ? Object.entries(status.changes).map(([k, v]) => `${k}: ${v}`).join(", ") : "—"))));
}

// ---------------------------------------------------------------------------------- routing

const PAGES = { agents: agentsPage, approvals: approvalsPage, audit: auditPage, keys: keysPage,
  sync: syncPage };

async function route() {
  const mine = ++generation;
  const key = sessionStorage.getItem(KEY_STORE);
  $("nav").hidden = !key;
  $("who").hidden = !key;
  refreshPending();  // on every page change, and on signing in or out
  if (!key) {
    signInPage();
    return;
  }
  const scope = sessionStorage.getItem(SCOPE_STORE);
  $("who-key").textContent = `${key.slice(0, 10)}…`;
  $("who-scope").textContent = scope;
  $("who-scope").className = `badge ${{ admin: "active", approver: "approver" }[scope] || "suspended"}`;
  const [path, search] = (location.hash.slice(1) || "/agents").split("?");
  const parts = path.split("/").filter(Boolean);
  const args = new URLSearchParams(search || "");
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("current", link.dataset.page === parts[0]);
  }
  try {
    if (parts[0] === "agents" && parts[1]) await agentPage(parts[1]);
    else if (parts[0] === "policies" && parts[1]) await policyPage(parts[1]);
    else if (parts[0] === "approvals" && parts[1]) await approvalPage(parts[1]);
    else await (PAGES[parts[0]] || agentsPage)(args);
  } catch (error) {
    if (mine === generation) fail(error);  // a page left behind has nobody to tell
  }
}

window.addEventListener("hashchange", () => { clearMessage(); route(); });
document.addEventListener("DOMContentLoaded", () => {
  $("sign-out").addEventListener("click", () => signOut());
  route();
});
