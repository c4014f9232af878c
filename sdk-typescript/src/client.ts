/**
 * The HTTP client of `POST /v1/authorize` and `GET /v1/approvals/<id>`, on Node's built-in
 * `fetch` with one deadline per call (an `AbortSignal`): connecting, sending, the headers and
 * the body all within `timeoutMs`. Answers are read up to 64 KiB; redirects are not followed; the
 * API key is held in a private field and never appears in a message, `toString`, `util.inspect`
 * or JSON form.
 */

import {
  APPROVAL_ID,
  type Approval,
  type Decision,
  MAX_ANSWER_BYTES,
  readAnswer,
  readApproval,
  type HeaderLookup,
} from './answers.js';
import { ServiceUnavailableError } from './errors.js';
import { jsonString, parametersJson } from './params.js';

/** Milliseconds a whole call may take by default: an authorization check sits in front of every tool call. */
export const DEFAULT_TIMEOUT_MS = 5000;
export const AUTHORIZE_PATH = '/v1/authorize';
export const APPROVALS_PATH = '/v1/approvals/';
/** A session id the service takes: 1 to 255 printable ASCII characters. */
export const SESSION_ID = /^[\x20-\x7e]{1,255}$/;
const KEY = /^[\x21-\x7e]+$/; // printable ASCII without spaces: what a header can carry
const INSPECT = Symbol.for('nodejs.util.inspect.custom');

export interface AuthzClientOptions {
  /** the service's base URL, `http://` or `https://` */
  baseUrl: string;
  /** an API key of the workspace (`svc_` and 32 hex characters) */
  apiKey: string;
  /** milliseconds a whole call may take: connecting, sending and reading the answer (default 5000) */
  timeoutMs?: number;
  /** the `fetch` to send with (default: the global one); for tests and instrumentation */
  fetch?: typeof globalThis.fetch;
}

export interface AuthorizeRequest {
  agentId: string;
  toolName: string;
  /** the call's parameters by name (default: none) */
  parameters?: Record<string, unknown>;
  /** the conversation or run the call belongs to: 1 to 255 printable ASCII characters */
  sessionId?: string;
}

/** What a guard needs of a client. */
export interface Authorizer {
  authorize(request: AuthorizeRequest): Promise<Decision>;
  approval(approvalId: string): Promise<Approval>;
}

interface Received {
  status: number;
  headers: HeaderLookup;
  content: Uint8Array;
  whole: boolean;
}

/**
 * `new AuthzClient({ baseUrl, apiKey }).authorize({ agentId, toolName, parameters })`.
 * A denial (or an escalation: `outcome === 'escalated'`) is a Decision, not an error; errors are
 * thrown as `errors.ts` says.
 */
export class AuthzClient implements Authorizer {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly #headers: Readonly<Record<string, string>>;
  readonly #fetch: typeof globalThis.fetch;

  constructor(options: AuthzClientOptions) {
    if (typeof options !== 'object' || options === null) {
      throw new TypeError('AuthzClient takes { baseUrl, apiKey, timeoutMs? }');
    }
    const { baseUrl, apiKey, timeoutMs = DEFAULT_TIMEOUT_MS } = options;
    if (typeof baseUrl !== 'string' || !/^https?:\/\//.test(baseUrl)) {
      throw new TypeError('baseUrl must be an http:// or https:// URL');
    }
    let url: URL;
    try {
      url = new URL(baseUrl);
    } catch {
      throw new TypeError('baseUrl must be an http:// or https:// URL');
    }
    if (url.username !== '' || url.password !== '') {
      throw new TypeError('baseUrl must not hold credentials: the API key is the one credential sent');
    }
    if (url.search !== '' || url.hash !== '') {
      throw new TypeError('baseUrl must not have a query or a fragment');
    }
    // the key itself is never echoed, here or anywhere else
    if (typeof apiKey !== 'string' || !KEY.test(apiKey)) {
      throw new TypeError('apiKey must be a non-empty string of printable ASCII without spaces');
    }
    if (typeof timeoutMs !== 'number' || !Number.isFinite(timeoutMs) || timeoutMs <= 0) {
      throw new RangeError('timeoutMs must be a positive, finite number of milliseconds');
    }
    const send = options.fetch ?? globalThis.fetch;
    if (typeof send !== 'function') {
      throw new TypeError('this runtime has no fetch: Node 20 or later is needed');
    }
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.timeoutMs = timeoutMs;
    this.#fetch = send;
    this.#headers = Object.freeze({
      Authorization: `Bearer ${apiKey}`,
      'Content-Type': 'application/json',
      Accept: 'application/json',
      'User-Agent': 'agentauth-typescript',
    });
  }

  /**
   * May `agentId` call `toolName` with `parameters`? Resolves to the service's Decision, or
   * rejects with an {@link AuthzError}; a TypeError (or RangeError for a session id the service
   * would refuse) before any request for arguments that cannot be sent.
   */
  async authorize(request: AuthorizeRequest): Promise<Decision> {
    const body = requestBody(request);
    const got = await this.#exchange('POST', AUTHORIZE_PATH, body);
    return readAnswer(got.status, got.headers, got.content, got.whole);
  }

  /**
   * The approval `approvalId` as the service has it now (any key of the workspace may read it).
   * An unknown id rejects with a BadRequestError (`APPROVAL_NOT_FOUND`, 404); an id that cannot
   * be one with a RangeError before any request.
   */
  async approval(approvalId: string): Promise<Approval> {
    if (typeof approvalId !== 'string') {
      throw new TypeError("approvalId must be a string (the approval's id)");
    }
    if (!APPROVAL_ID.test(approvalId)) {
      throw new RangeError("approvalId must be an approval's id: letters, digits, '-' and '_'");
    }
    const got = await this.#exchange('GET', APPROVALS_PATH + approvalId, undefined);
    return readApproval(got.status, got.headers, got.content, got.whole, approvalId);
  }

  async #exchange(method: string, path: string, body: string | undefined): Promise<Received> {
    const deadline = new AbortController();
    let late = false;
    const timer = setTimeout(() => {
      late = true;
      deadline.abort();
    }, this.timeoutMs);
    try {
      let response: Response;
      try {
        response = await this.#fetch(this.baseUrl + path, {
          method,
          headers: this.#headers,
          body,
          redirect: 'manual',
          signal: deadline.signal,
        });
      } catch (error) {
        // a new error, made here: nothing of the request (nor the key) behind it
        throw late
          ? new ServiceUnavailableError(`no answer from ${this.baseUrl} within ${this.timeoutMs} ms`, {
              code: 'UNAVAILABLE',
            })
          : new ServiceUnavailableError(`cannot reach ${this.baseUrl} (${failureName(error)})`, {
              code: 'UNAVAILABLE',
            });
      }
      const { content, whole } = await readCapped(response);
      if (!whole) {
        deadline.abort(); // stop the rest of the answer: the connection is dropped
      }
      return { status: response.status, headers: response.headers, content, whole };
    } finally {
      clearTimeout(timer);
    }
  }

  toString(): string {
    return `AuthzClient(${this.baseUrl})`;
  }

  toJSON(): Record<string, unknown> {
    return { baseUrl: this.baseUrl, timeoutMs: this.timeoutMs };
  }

  [INSPECT](): string {
    return `AuthzClient { baseUrl: ${jsonString(this.baseUrl)}, timeoutMs: ${this.timeoutMs} }`;
  }
}

/**
 * The body of an answer as it arrives, read up to just past the size cap or until the deadline
 * ends the call (then it is not `whole`; the status still counts).
 */
async function readCapped(response: Response): Promise<{ content: Uint8Array; whole: boolean }> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  let whole = true;
  const reader = response.body?.getReader();
  if (reader !== undefined) {
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) {
          break;
        }
        chunks.push(value);
        size += value.byteLength;
        if (size > MAX_ANSWER_BYTES) {
          whole = false;
          break;
        }
      }
    } catch {
      whole = false; // the deadline, or the connection dropped mid-body
    }
    if (!whole) {
      reader.cancel().catch(() => undefined);
    }
  }
  const content = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    content.set(chunk, at);
    at += chunk.byteLength;
  }
  return { content, whole };
}

/**
 * A name for why a request failed: the system's code (ECONNREFUSED, ENOTFOUND, ...) or a short
 * plain phrase of fetch's own (bad port), never anything of the request.
 */
function failureName(error: unknown): string {
  let phrase: string | undefined;
  let current: unknown = error;
  for (let depth = 0; depth < 4 && typeof current === 'object' && current !== null; depth += 1) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === 'string' && /^[A-Z][A-Z0-9_]{1,40}$/.test(code)) {
      return code;
    }
    const message = (current as { message?: unknown }).message;
    if (depth > 0 && typeof message === 'string' && /^[a-z][a-z ]{0,39}$/.test(message)) {
      phrase = message;
    }
    current = (current as { cause?: unknown }).cause;
  }
  const name = error instanceof Error ? error.name : undefined;
  return phrase ?? (typeof name === 'string' && /^[A-Za-z]{1,40}$/.test(name) ? name : 'network error');
}

/** `sessionId` when it is undefined or a session id the service takes; else RangeError (TypeError for what is not a string). */
export function checkSessionId(sessionId: unknown): string | undefined {
  if (sessionId === undefined || sessionId === null) {
    return undefined;
  }
  if (typeof sessionId !== 'string') {
    throw new TypeError('sessionId must be a string');
  }
  if (!SESSION_ID.test(sessionId)) {
    throw new RangeError('sessionId must be 1 to 255 printable ASCII characters');
  }
  return sessionId;
}

function requestBody(request: AuthorizeRequest): string {
  if (typeof request !== 'object' || request === null) {
    throw new TypeError('authorize takes { agentId, toolName, parameters?, sessionId? }');
  }
  const { agentId, toolName, parameters = {} } = request;
  if (typeof agentId !== 'string') {
    throw new TypeError("agentId must be a string (the agent's id)");
  }
  if (typeof toolName !== 'string') {
    throw new TypeError('toolName must be a string');
  }
  const params = parametersJson(parameters ?? {});
  const sessionId = checkSessionId(request.sessionId);
  const session = sessionId === undefined ? '' : `,"session_id":${jsonString(sessionId)}`;
  return `{"agent_id":${jsonString(agentId)},"tool_name":${jsonString(toolName)},"parameters":${params}${session}}`;
}
