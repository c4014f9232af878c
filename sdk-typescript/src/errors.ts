/**
 * The errors the client throws, translated once from HTTP and `fetch` where they enter.
 *
 * ```
 * AuthzError                   code, statusCode, message
 * ├── UnauthorizedError        401 (UNAUTHORIZED, API_KEY_EXPIRED): a wrong or expired key
 * ├── ForbiddenError           403: the key's scope does not permit the call
 * ├── BadRequestError          other 4xx (400 VALIDATION_ERROR, 404 APPROVAL_NOT_FOUND, ...)
 * ├── RateLimitError           429: the key's per-minute budget is spent; retryAfterMs
 * └── ServiceUnavailableError  no usable answer: network error, time-out, 5xx, unreadable body
 * ```
 *
 * A denied (or escalated) decision is not an error: `authorize` returns it. Messages never carry
 * the API key. The guard decides what each error means for a tool call.
 */

const INSPECT = Symbol.for('nodejs.util.inspect.custom');

export interface AuthzErrorOptions {
  /** the service's error code, or the client's own (UNAVAILABLE, BAD_RESPONSE, ...) */
  code: string;
  /** the HTTP status; undefined when there was no answer (or the call was refused before sending) */
  statusCode?: number | undefined;
}

/** Base of every client error. */
export class AuthzError extends Error {
  readonly code: string;
  readonly statusCode: number | undefined;

  constructor(message: string, options: AuthzErrorOptions) {
    super(message);
    this.name = new.target.name;
    this.code = options.code;
    this.statusCode = options.statusCode;
  }

  override toString(): string {
    return `${this.name} [${this.code}${this.statusCode === undefined ? '' : ` ${this.statusCode}`}]: ${this.message}`;
  }

  toJSON(): Record<string, unknown> {
    return { name: this.name, code: this.code, statusCode: this.statusCode ?? null, message: this.message };
  }

  /** util.inspect: the stack and what toJSON shows (subclasses inherit it), nothing else. */
  [INSPECT](): string {
    return `${this.stack ?? this.toString()}\n  ${JSON.stringify(this.toJSON())}`;
  }
}

/** 401: the API key is missing, malformed, unknown, revoked or expired. */
export class UnauthorizedError extends AuthzError {}

/** 403: the key is valid but its scope does not permit the call. */
export class ForbiddenError extends AuthzError {}

/** A 4xx other than 401, 403 and 429 (and a redirect or another 2xx): the request was refused as written. */
export class BadRequestError extends AuthzError {}

/** 429: the key sent more requests this minute than the service allows. */
export class RateLimitError extends AuthzError {
  /** from the `Retry-After` header (seconds, or an HTTP date), in milliseconds from now; undefined when absent or unreadable */
  readonly retryAfterMs: number | undefined;

  constructor(message: string, options: AuthzErrorOptions & { retryAfterMs?: number | undefined }) {
    super(message, options);
    this.retryAfterMs = options.retryAfterMs;
  }

  override toJSON(): Record<string, unknown> {
    return { ...super.toJSON(), retryAfterMs: this.retryAfterMs ?? null };
  }
}

/**
 * No usable answer: the service could not be reached, did not answer in time, failed (5xx, 408),
 * or answered something that is not a decision.
 */
export class ServiceUnavailableError extends AuthzError {}
