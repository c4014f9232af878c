/**
 * Reading the service's answers: the {@link Decision} in a 200 of `POST /v1/authorize`, the
 * {@link Approval} in a 200 of `GET /v1/approvals/<id>`, or the error another status means.
 * The contract with the service lives here (the same as the Python SDK's `agentauth.answers`);
 * how the request is sent and the answer received is the client's.
 */

import {
  type AuthzError,
  BadRequestError,
  ForbiddenError,
  RateLimitError,
  ServiceUnavailableError,
  UnauthorizedError,
} from './errors.js';

/** An answer longer than this is not a decision (a decision is a few hundred bytes). */
export const MAX_ANSWER_BYTES = 64 * 1024;
/** A reason longer than this (in characters) is cut: it ends up in denial texts and logs. */
export const MAX_REASON_CHARS = 1000;
/**
 * What an approval id may look like (the service's are UUIDs): it goes into a URL path and into
 * denial texts, so nothing else is taken from an answer or sent.
 */
export const APPROVAL_ID = /^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$/;
/** What an approval's status may look like (pending, approved, denied, expired, used). */
const STATUS = /^[a-z_]{1,32}$/;

export type Outcome = 'allowed' | 'denied' | 'escalated';
/** The most warnings taken from one answer (the service sends at most one). */
export const MAX_WARNINGS = 8;

/**
 * A `warn` policy's would-be decision that differs from the real one (the service's decisions
 * §10): the policy, what it would have decided and why. A guard surfaces it (`onWarning`) and
 * follows the real decision.
 */
export interface PolicyWarning {
  readonly policyId: string;
  readonly result: Outcome;
  readonly reason: string;
}

/**
 * What the service decided for one call, or what a guard decided in its place when the service
 * gave no usable answer (then `error` says why and `auditId` is null). `allowed` is true only for
 * a real `true` from the service, or a guard's `onError: 'allow'`.
 *
 * `outcome` is `'escalated'` when the call waits for a human: `allowed` is false, `approvalId`
 * names the approval and `approvalExpiresAt` says until when. `approvalId` also names the
 * approval an allow used or a denial was caused by; null when no approval is involved.
 */
export interface Decision {
  readonly allowed: boolean;
  readonly outcome: Outcome;
  readonly reason: string;
  readonly policyId: string | null;
  readonly ruleIndex: number | null;
  readonly auditId: string | null;
  readonly latencyMs: number | null;
  /** when a rate limit or budget denied: seconds until a retry may succeed */
  readonly retryAfterSeconds: number | null;
  readonly approvalId: string | null;
  readonly approvalExpiresAt: Date | null;
  /** the session the call named, as the service recorded it (null when it named none) */
  readonly sessionId: string | null;
  /** what warn policies would have decided otherwise; never the decision */
  readonly warnings: readonly PolicyWarning[];
  /** the error a guard decided on instead of the service (null: the service decided) */
  readonly error: AuthzError | null;
}

/**
 * What `GET /v1/approvals/<id>` says of one approval. `status` is the service's: `pending`,
 * `approved`, `denied`, `expired` or `used`. The other fields are null when the answer lacks
 * them or has them malformed; `comment` is cut like a reason.
 */
export interface Approval {
  readonly id: string;
  readonly status: string;
  /** still waiting for a human: neither decided nor expired nor used */
  readonly pending: boolean;
  readonly agentId: string | null;
  readonly toolName: string | null;
  readonly expiresAt: Date | null;
  readonly decidedAt: Date | null;
  readonly comment: string | null;
}

/** The headers of an answer, as `fetch` gives them. */
export interface HeaderLookup {
  get(name: string): string | null;
}

/** A decision with every field given, frozen. */
export function makeDecision(
  fields: Pick<Decision, 'allowed' | 'outcome' | 'reason'> & Partial<Decision>,
): Decision {
  return Object.freeze({
    allowed: fields.allowed,
    outcome: fields.outcome,
    reason: fields.reason,
    policyId: fields.policyId ?? null,
    ruleIndex: fields.ruleIndex ?? null,
    auditId: fields.auditId ?? null,
    latencyMs: fields.latencyMs ?? null,
    retryAfterSeconds: fields.retryAfterSeconds ?? null,
    approvalId: fields.approvalId ?? null,
    approvalExpiresAt: fields.approvalExpiresAt ?? null,
    sessionId: fields.sessionId ?? null,
    warnings: Object.freeze([...(fields.warnings ?? [])]),
    error: fields.error ?? null,
  });
}

/**
 * The decision in an answer, or the error its status means (thrown). A body cut off (`whole`
 * false: too long or too slow) still has its status counted; a 200's cut-off body is no decision.
 */
export function readAnswer(status: number, headers: HeaderLookup, content: Uint8Array, whole: boolean): Decision {
  if (status !== 200) {
    throw statusError(status, headers, content, 'the authorization endpoint');
  }
  if (!whole) {
    throw unreadable(`was cut off (over ${MAX_ANSWER_BYTES} bytes, or too slow)`);
  }
  return decision(content);
}

/**
 * The approval in an answer of `GET /v1/approvals/<approvalId>`, or the error its status means
 * (an unknown id: {@link BadRequestError} `APPROVAL_NOT_FOUND`, 404). A 200 counts only with a
 * `status` string; everything else in it is optional.
 */
export function readApproval(
  status: number,
  headers: HeaderLookup,
  content: Uint8Array,
  whole: boolean,
  approvalId: string,
): Approval {
  if (status !== 200) {
    throw statusError(status, headers, content, 'the approvals endpoint');
  }
  if (!whole) {
    throw unreadable(`was cut off (over ${MAX_ANSWER_BYTES} bytes, or too slow)`);
  }
  const body = parseJson(content);
  if (!isObject(body)) {
    throw unreadable('is not a JSON object');
  }
  const state = body['status'];
  if (typeof state !== 'string' || !STATUS.test(state)) {
    throw unreadable("has no approval 'status'");
  }
  return Object.freeze({
    id: approvalId,
    status: state,
    pending: state === 'pending',
    agentId: loose(body, 'agentId', 'string'),
    toolName: loose(body, 'toolName', 'string'),
    expiresAt: looseInstant(body, 'expiresAt'),
    decidedAt: looseInstant(body, 'decidedAt'),
    comment: reasonOf(body['comment']),
  });
}

/** The error an answer other than 200 means. */
function statusError(status: number, headers: HeaderLookup, content: Uint8Array, endpoint: string): AuthzError {
  const [code, message] = errorBody(content);
  if (status >= 500 || status === 408) {
    return new ServiceUnavailableError(`HTTP ${status} from the service: ${message || 'no message'}`, {
      code: code ?? 'UNAVAILABLE',
      statusCode: status,
    });
  }
  const text = message || `HTTP ${status}`;
  if (status === 401) {
    return new UnauthorizedError(text, { code: code ?? 'UNAUTHORIZED', statusCode: status });
  }
  if (status === 403) {
    return new ForbiddenError(text, { code: code ?? 'INSUFFICIENT_SCOPE', statusCode: status });
  }
  if (status === 429) {
    return new RateLimitError(text, {
      code: code ?? 'RATE_LIMITED',
      statusCode: status,
      retryAfterMs: retryAfterMs(headers.get('Retry-After')),
    });
  }
  if (status < 400) {
    // another 2xx, or a redirect: baseUrl points somewhere else
    return new BadRequestError(`HTTP ${status} is not an answer of ${endpoint}: check baseUrl`, {
      code: 'UNEXPECTED_STATUS',
      statusCode: status,
    });
  }
  return new BadRequestError(text, { code: code ?? 'BAD_REQUEST', statusCode: status });
}

/**
 * A 200's body as a Decision. `allowed: false` is a denial whatever else is wrong with the body;
 * `allowed: true` counts only in a well-formed decision; anything else is an unusable answer.
 */
function decision(content: Uint8Array): Decision {
  const body = parseJson(content);
  if (!isObject(body)) {
    throw unreadable('is not a JSON object');
  }
  const allowed = body['allowed'];
  if (typeof allowed !== 'boolean') {
    // only a real boolean counts: not "true", not 1
    throw unreadable("has no boolean 'allowed'");
  }
  if (!allowed) {
    const escalated = body['outcome'] === 'escalated';
    return makeDecision({
      allowed: false,
      outcome: escalated ? 'escalated' : 'denied',
      reason:
        reasonOf(body['reason']) || (escalated ? 'approval required' : 'denied by the authorization service'),
      policyId: loose(body, 'policyId', 'string'),
      ruleIndex: loose(body, 'ruleIndex', 'integer'),
      auditId: loose(body, 'auditId', 'string'),
      latencyMs: loose(body, 'latencyMs', 'number'),
      retryAfterSeconds: loose(body, 'retryAfterSeconds', 'integer'),
      approvalId: looseApprovalId(body),
      approvalExpiresAt: looseInstant(body, 'approvalExpiresAt'),
      sessionId: loose(body, 'sessionId', 'string'),
      warnings: warningsOf(body),
    });
  }
  const outcome = body['outcome'];
  const reason = reasonOf(body['reason']);
  if (outcome !== 'allowed' || reason === null) {
    throw unreadable("allows without outcome 'allowed' and a reason");
  }
  return makeDecision({
    allowed: true,
    outcome,
    reason,
    policyId: optional(body, 'policyId', 'string'),
    ruleIndex: optional(body, 'ruleIndex', 'integer'),
    auditId: optional(body, 'auditId', 'string'),
    latencyMs: optional(body, 'latencyMs', 'number'),
    retryAfterSeconds: optional(body, 'retryAfterSeconds', 'integer'),
    approvalId: approvalIdOf(body),
    approvalExpiresAt: instant(body, 'approvalExpiresAt'),
    sessionId: optional(body, 'sessionId', 'string'),
    warnings: warningsOf(body),
  });
}

/**
 * The answer's well-formed warnings; a malformed one (or list) is left out, and never changes the
 * decision: a warning is advice about a policy not enforced yet.
 */
function warningsOf(body: JsonObject): PolicyWarning[] {
  const found = body['warnings'];
  if (!Array.isArray(found)) {
    return [];
  }
  const warnings: PolicyWarning[] = [];
  for (const item of found.slice(0, MAX_WARNINGS)) {
    if (!isObject(item)) {
      continue;
    }
    const policyId = item['policyId'];
    const result = item['result'];
    const reason = reasonOf(item['reason']);
    if (
      typeof policyId === 'string' &&
      APPROVAL_ID.test(policyId) && // an id's shape: it goes into log lines
      (result === 'allowed' || result === 'denied' || result === 'escalated') &&
      reason !== null
    ) {
      warnings.push(Object.freeze({ policyId, result, reason }));
    }
  }
  return warnings;
}

type JsonObject = Record<string, unknown>;

function isObject(value: unknown): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

const UTF8 = new TextDecoder('utf-8', { fatal: true });

/** The body as JSON, or undefined when it is not JSON (nor UTF-8, nor parseable at all). */
function parseJson(content: Uint8Array): unknown {
  try {
    return JSON.parse(UTF8.decode(content)) as unknown;
  } catch {
    return undefined;
  }
}

/** At most `limit` characters (code points) of `value`. */
export function cut(value: string, limit: number): string {
  if (value.length <= limit) {
    return value; // fewer code units than the limit: fewer code points too
  }
  const points = Array.from(value);
  return points.length <= limit ? value : points.slice(0, limit).join('');
}

function reasonOf(value: unknown): string | null {
  if (typeof value !== 'string') {
    return null;
  }
  const short = cut(value, MAX_REASON_CHARS);
  return short === value ? value : `${short}…`;
}

type Kind = 'string' | 'integer' | 'number';
type KindType<K extends Kind> = K extends 'string' ? string : number;

function optional<K extends Kind>(body: JsonObject, name: string, kind: K): KindType<K> | null {
  const value = body[name];
  if (value === undefined || value === null) {
    return null;
  }
  const fits =
    kind === 'string'
      ? typeof value === 'string'
      : kind === 'integer'
        ? typeof value === 'number' && Number.isInteger(value)
        : typeof value === 'number';
  if (!fits) {
    throw unreadable(`has a '${name}' of the wrong type`);
  }
  return value as KindType<K>;
}

/** A denial's optional field, or null when it is malformed. */
function loose<K extends Kind>(body: JsonObject, name: string, kind: K): KindType<K> | null {
  try {
    return optional(body, name, kind);
  } catch {
    return null;
  }
}

function approvalIdOf(body: JsonObject): string | null {
  const value = optional(body, 'approvalId', 'string');
  if (value !== null && !APPROVAL_ID.test(value)) {
    throw unreadable("has a malformed 'approvalId'");
  }
  return value;
}

function looseApprovalId(body: JsonObject): string | null {
  try {
    return approvalIdOf(body);
  } catch {
    return null;
  }
}

// an ISO 8601 date, or date-time in the extended format, with an optional offset (none: UTC)
const ISO =
  /^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2})(?::(\d{2})(?::(\d{2})(?:[.,](\d+))?)?)?(Z|[+-]\d{2}(?::?\d{2})?)?)?$/;

/** An ISO 8601 date or date-time as a Date, or null when it is not one. */
export function parseInstant(value: string): Date | null {
  if (value.length < 10 || value.length > 64) {
    return null;
  }
  const match = ISO.exec(value.toUpperCase());
  if (match === null) {
    return null;
  }
  const [, y, mo, d, h = '0', mi = '0', s = '0', fraction = '', zone = 'Z'] = match;
  const parts = [y, mo, d, h, mi, s].map(Number) as [number, number, number, number, number, number];
  const [year, month, day, hour, minute, second] = parts;
  const millis = Math.floor(Number(`0.${fraction || '0'}`) * 1000);
  const at = new Date(0);
  at.setUTCFullYear(year, month - 1, day);
  at.setUTCHours(hour, minute, second, millis);
  // the fields must be what they say: no 31 February, no hour 25
  if (
    at.getUTCFullYear() !== year ||
    at.getUTCMonth() !== month - 1 ||
    at.getUTCDate() !== day ||
    at.getUTCHours() !== hour ||
    at.getUTCMinutes() !== minute ||
    at.getUTCSeconds() !== second
  ) {
    return null;
  }
  let offsetMinutes = 0;
  if (zone !== 'Z') {
    const digits = zone.slice(1).replace(':', '');
    const hours = Number(digits.slice(0, 2));
    const minutes = Number(digits.slice(2, 4) || '0');
    if (hours > 23 || minutes > 59) {
      return null;
    }
    offsetMinutes = (zone.startsWith('-') ? -1 : 1) * (hours * 60 + minutes);
  }
  return new Date(at.getTime() - offsetMinutes * 60_000);
}

function instant(body: JsonObject, name: string): Date | null {
  const value = optional(body, name, 'string');
  if (value === null) {
    return null;
  }
  const moment = parseInstant(value);
  if (moment === null) {
    throw unreadable(`has a '${name}' that is not an ISO 8601 date-time`);
  }
  return moment;
}

function looseInstant(body: JsonObject, name: string): Date | null {
  try {
    return instant(body, name);
  } catch {
    return null;
  }
}

/** A moment as ISO 8601 UTC to the second: `2030-01-01T00:00:00Z`. */
export function formatInstant(moment: Date): string {
  return moment.toISOString().replace(/\.\d{3}Z$/, 'Z');
}

function unreadable(what: string): ServiceUnavailableError {
  return new ServiceUnavailableError(`the service's answer ${what}`, { code: 'BAD_RESPONSE', statusCode: 200 });
}

/** `{"error": {"code", "message"}}` when the body is one, else [undefined, undefined]. */
function errorBody(content: Uint8Array): [string | undefined, string | undefined] {
  const body = parseJson(content);
  const error = isObject(body) ? body['error'] : undefined;
  if (!isObject(error)) {
    return [undefined, undefined];
  }
  const code = error['code'];
  const message = error['message'];
  return [
    typeof code === 'string' ? cut(code, 100) : undefined,
    typeof message === 'string' ? cut(message, 500) : undefined,
  ];
}

// what Python's float() takes (the service's Retry-After is an integer number of seconds)
const SECONDS = /^\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*$/;
// an HTTP date (RFC 9110 IMF-fixdate, or RFC 2822 as the Python client takes it)
const HTTP_DATE =
  /^\s*(?:[A-Za-z]{3},\s*)?\d{1,2}\s+[A-Za-z]{3}\s+\d{2,4}\s+\d{1,2}:\d{2}(?::\d{2})?\s*(?:GMT|UTC|UT|Z|[+-]\d{4})?\s*$/;

/** `Retry-After` (seconds, or an HTTP date) as milliseconds from now; undefined when unreadable. */
export function retryAfterMs(value: string | null | undefined, now: number = Date.now()): number | undefined {
  if (value === null || value === undefined) {
    return undefined;
  }
  let seconds: number;
  if (SECONDS.test(value)) {
    seconds = Number(value.trim());
  } else if (HTTP_DATE.test(value)) {
    const when = Date.parse(/(?:GMT|UTC|UT|Z|[+-]\d{4})\s*$/.test(value) ? value : `${value.trim()} GMT`);
    seconds = (when - now) / 1000;
  } else {
    return undefined;
  }
  if (!Number.isFinite(seconds)) {
    return undefined;
  }
  return Math.max(0, Math.ceil(seconds * 1000));
}
