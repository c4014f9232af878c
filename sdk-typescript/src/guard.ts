/**
 * The guard: authorization in front of a tool handler, in one line.
 *
 * `new Guard({ client, agentId })` asks the service before every call ({@link Guard.check}),
 * wraps plain handlers ({@link Guard.tool}) and whole MCP servers ({@link Guard.protect}). What it
 * does when the service gives no usable answer is the one setting, `onError`:
 *
 * - a network error, a time-out, a 5xx or an unreadable answer: denied with `onError: 'deny'`
 *   (the default), allowed with `onError: 'allow'`;
 * - a 401, 403 or other 4xx (a wrong or expired key, a malformed request), a redirect and a 429:
 *   always denied, whatever `onError` says. A wrong key never fails open.
 *
 * A handler runs only when the decision allows it: the service said `allowed: true` (a real
 * boolean, in a well-formed decision), or the service was unreachable and `onError: 'allow'`.
 *
 * A call the service escalates to a human (`outcome === 'escalated'`) is denied, with a reason
 * that says approval is required and names the approval and its expiry. With
 * `waitForApprovalMs` the guard waits instead: it polls the approval (after 0.5 s, then twice as
 * long each time, at most 5 s apart, never past the wait) until it is no longer pending, then
 * asks the service again, so the decision (and its audit entry) is the service's: the handler
 * runs only if that answer allows. Errors while polling do not end the wait (`onError` applies to
 * the authorize calls only); a wait that runs out denies as an escalation does, saying so.
 *
 * The behaviour is the Python SDK's `agentauth.guard`, case for case
 * (`conformance/guard-cases.yaml` is played by the tests of both).
 */

import { type Approval, type Decision, type PolicyWarning, cut, formatInstant, makeDecision } from './answers.js';
import { type Authorizer, checkSessionId } from './client.js';
import { type DeniedResult, deniedResult } from './denial.js';
import { AuthzError, BadRequestError, RateLimitError, ServiceUnavailableError } from './errors.js';
import { protect } from './mcp.js';

export type OnError = 'deny' | 'allow';

/** Waiting for an approval: the first look after this many milliseconds, then twice as long each time ... */
export const FIRST_POLL_MS = 500;
/** ... never more than this many apart (and never past the wait). */
export const MAX_POLL_MS = 5000;
/** A message of an error raised before any request is cut to this many characters in a denial. */
const MAX_MESSAGE_CHARS = 500;
const INSPECT = Symbol.for('nodejs.util.inspect.custom');

export interface GuardOptions {
  /** an {@link AuthzClient} (or anything with its `authorize` and `approval`) */
  client: Authorizer;
  /** the agent whose calls are checked */
  agentId: string;
  /** what an unusable answer means: `'deny'` (the default) or `'allow'`; see the module */
  onError?: OnError;
  /** milliseconds to wait for a human to decide an escalated call (default: do not wait, deny at once) */
  waitForApprovalMs?: number;
  /** the conversation or run every call belongs to, unless a call names its own */
  sessionId?: string;
  /**
   * called with each warning of a `warn` policy (a policy being tried that would have decided the
   * call otherwise; the call still follows the real decision). Default: `console.warn`, naming
   * the policy and the reason. An exception it throws is ignored.
   */
  onWarning?: OnWarning;
}

/** What a guard does with a warn policy's warning: see {@link GuardOptions.onWarning}. */
export type OnWarning = (warning: PolicyWarning, call: { toolName: string; decision: Decision }) => void;

/** The default {@link OnWarning}: one line on `console.warn`. */
function warnOnConsole(warning: PolicyWarning, call: { toolName: string; decision: Decision }): void {
  console.warn(
    `agentauth: warn policy ${warning.policyId} would have ${warning.result} the call to ${call.toolName} ` +
      `(the call was ${call.decision.outcome}): ${warning.reason}`,
  );
}

export interface CheckOptions {
  /** this call's session (else the guard's) */
  sessionId?: string;
  /** ends a wait for an approval early (the call is then denied as an undecided escalation) */
  signal?: AbortSignal;
}

export interface ToolOptions<A extends unknown[]> {
  /** the parameters the service sees for a call (default: the handler's first argument, an object) */
  parameters?: (...args: A) => Record<string, unknown>;
}

/** Authorization for one agent's tools. */
export class Guard {
  readonly client: Authorizer;
  readonly agentId: string;
  readonly onError: OnError;
  readonly waitForApprovalMs: number | undefined;
  readonly sessionId: string | undefined;
  readonly onWarning: OnWarning;

  constructor(options: GuardOptions) {
    if (typeof options !== 'object' || options === null) {
      throw new TypeError('Guard takes { client, agentId, onError?, waitForApprovalMs?, sessionId? }');
    }
    const { client, agentId, onError = 'deny', waitForApprovalMs } = options;
    if (onError !== 'deny' && onError !== 'allow') {
      throw new RangeError("onError must be 'deny' or 'allow'");
    }
    if (
      waitForApprovalMs !== undefined &&
      (typeof waitForApprovalMs !== 'number' || !Number.isFinite(waitForApprovalMs) || waitForApprovalMs <= 0)
    ) {
      throw new RangeError('waitForApprovalMs must be undefined or a positive, finite number of milliseconds');
    }
    if (
      typeof client !== 'object' ||
      client === null ||
      typeof client.authorize !== 'function' ||
      typeof client.approval !== 'function'
    ) {
      throw new TypeError('client must be an AuthzClient');
    }
    if (typeof agentId !== 'string' || agentId === '') {
      throw new TypeError("agentId must be the agent's id, a non-empty string");
    }
    this.client = client;
    this.agentId = agentId;
    this.onError = onError;
    this.waitForApprovalMs = waitForApprovalMs;
    this.sessionId = checkSessionId(options.sessionId);
    if (options.onWarning !== undefined && typeof options.onWarning !== 'function') {
      throw new TypeError('onWarning must be a function');
    }
    this.onWarning = options.onWarning ?? warnOnConsole;
  }

  // ------------------------------------------------------------------ checking one call

  /**
   * The decision for one call. Never rejects: the service's failures become decisions as
   * `onError` says, anything else denies. An escalated call is waited for when
   * `waitForApprovalMs` says so; an escalated decision returned has the guard's reason (approval
   * required, which approval, until when).
   */
  async check(toolName: string, parameters?: Record<string, unknown>, options: CheckOptions = {}): Promise<Decision> {
    const session = options.sessionId ?? this.sessionId;
    let decision = await this.#ask(toolName, parameters, session);
    if (this.waitForApprovalMs === undefined || !awaitable(decision)) {
      return explained(decision);
    }
    const waiting = new Waiting(this.waitForApprovalMs);
    while (decision.approvalId !== null && awaitable(decision)) {
      let state: State = PENDING;
      while (state === PENDING) {
        const pause = waiting.nextPause();
        if (pause === undefined) {
          return explained(decision, { waitedMs: waiting.ms });
        }
        if (!(await sleep(pause, options.signal))) {
          return explained(decision, { note: 'the wait was cancelled' });
        }
        let found: Approval | unknown;
        try {
          found = await this.client.approval(decision.approvalId);
        } catch (error) {
          found = error; // polling goes on until the wait is over
        }
        state = stateOf(found);
      }
      if (typeof state === 'object') {
        return explained(decision, { note: state.lost });
      }
      decision = await this.#ask(toolName, parameters, session);
    }
    return explained(decision);
  }

  async #ask(toolName: string, parameters: unknown, sessionId: string | undefined): Promise<Decision> {
    try {
      const request = { agentId: this.agentId, toolName, parameters: parameters as Record<string, unknown> };
      const decision = await this.client.authorize(sessionId === undefined ? request : { ...request, sessionId });
      for (const warning of decision.warnings ?? []) {
        try {
          this.onWarning(warning, { toolName, decision });
        } catch {
          // a warning is advice: its handler failing changes nothing of the decision
        }
      }
      return decision;
    } catch (error) {
      return this.#withoutAnswer(error); // a guard answers; it never lets a call through
    }
  }

  /**
   * The decision when the service gave none: `onError` for an unusable answer, a denial for
   * everything else (a refused key, a bad request, a redirect, a rate limit, a bug).
   */
  #withoutAnswer(failure: unknown): Decision {
    let error: AuthzError;
    if (failure instanceof AuthzError) {
      error = failure;
    } else if (failure instanceof TypeError) {
      error = refused('INVALID_PARAMETERS', `the parameters cannot be sent: ${failure.message}`);
    } else {
      const text = failure instanceof Error ? `${failure.name}: ${failure.message}` : String(failure);
      error = refused('CHECK_FAILED', `the check failed: ${text}`);
    }
    if (error instanceof ServiceUnavailableError) {
      const reason = `authorization service unreachable: ${error.message}`;
      if (this.onError === 'allow') {
        return makeDecision({
          allowed: true,
          outcome: 'allowed',
          reason: `${reason}; allowed because onError is 'allow'`,
          error,
        });
      }
      return makeDecision({ allowed: false, outcome: 'denied', reason, error });
    }
    if (error instanceof RateLimitError) {
      const seconds = error.retryAfterMs === undefined ? null : Math.ceil(error.retryAfterMs / 1000);
      const wait = seconds === null ? 'retry later' : `retry in ${seconds} s`;
      return makeDecision({
        allowed: false,
        outcome: 'denied',
        reason: `the authorization service is rate limiting this key; ${wait}`,
        retryAfterSeconds: seconds,
        error,
      });
    }
    const reason =
      error.statusCode === undefined // refused here, before any request
        ? `the call cannot be checked (${error.code}): ${error.message}`
        : `the authorization service refused the check (${error.code}): ${error.message}`;
    return makeDecision({ allowed: false, outcome: 'denied', reason, error });
  }

  // ------------------------------------------------------------------ wrapping handlers

  /**
   * A plain handler behind the guard: the returned function asks the service first and calls
   * `handler` only on an allow; a denied call resolves to {@link deniedResult} instead. The
   * parameters sent are the handler's first argument (an object of parameter names to values),
   * or what `options.parameters` makes of the arguments.
   */
  tool<A extends unknown[], R>(
    toolName: string,
    handler: (...args: A) => R,
    options: ToolOptions<A> = {},
  ): (...args: A) => Promise<Awaited<R> | DeniedResult> {
    if (typeof toolName !== 'string' || toolName === '') {
      throw new TypeError('toolName must be a non-empty string');
    }
    if (typeof handler !== 'function') {
      throw new TypeError('handler must be a function');
    }
    const guard = this;
    const parametersOf = options.parameters;
    return async function guarded(this: unknown, ...args: A): Promise<Awaited<R> | DeniedResult> {
      let decision: Decision;
      let parameters: unknown;
      try {
        parameters = parametersOf === undefined ? (args[0] ?? {}) : parametersOf(...args);
      } catch (error) {
        parameters = error;
      }
      if (parameters instanceof Error) {
        decision = explained(guard.#withoutAnswer(parameters));
      } else {
        decision = await guard.check(toolName, parameters as Record<string, unknown>);
      }
      if (decision.allowed !== true) {
        return deniedResult(decision.reason);
      }
      return await handler.apply(this, args);
    };
  }

  /**
   * Guards every tool of an MCP server of the official SDK (an `McpServer`, or a low-level
   * `Server`) by its name, whenever the tool is registered: returns the server.
   */
  protect<S extends object>(server: S): S {
    return protect(server, this);
  }

  toString(): string {
    return `Guard(${String(this.client)}, agentId=${this.agentId}, onError=${this.onError})`;
  }

  toJSON(): Record<string, unknown> {
    return {
      client: String(this.client),
      agentId: this.agentId,
      onError: this.onError,
      waitForApprovalMs: this.waitForApprovalMs ?? null,
      sessionId: this.sessionId ?? null,
    };
  }

  [INSPECT](): string {
    return `Guard ${JSON.stringify(this.toJSON())}`;
  }
}

function refused(code: string, message: string): BadRequestError {
  return new BadRequestError(cut(message, MAX_MESSAGE_CHARS), { code });
}

// ------------------------------------------------------------------ waiting for an approval

/** The clock of waits (monotonic milliseconds); tests may replace it. */
export const clock = { now: (): number => performance.now() };

/** One wait's clock: when it ends, and the pause before each look at the approval. */
export class Waiting {
  readonly ms: number;
  #deadline: number;
  #delay = FIRST_POLL_MS;

  constructor(ms: number) {
    this.ms = ms;
    this.#deadline = clock.now() + ms;
  }

  /** Milliseconds to sleep before the next look; undefined once the wait is over. */
  nextPause(): number | undefined {
    const remaining = this.#deadline - clock.now();
    if (remaining <= 0) {
      return undefined;
    }
    const pause = Math.min(this.#delay, remaining);
    this.#delay = Math.min(this.#delay * 2, MAX_POLL_MS);
    return pause;
  }
}

/** Sleeps `ms`; false when `signal` ended the sleep (or had already). */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<boolean> {
  if (signal?.aborted) {
    return Promise.resolve(false);
  }
  return new Promise((resolve) => {
    const done = (slept: boolean): void => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      resolve(slept);
    };
    const onAbort = (): void => done(false);
    const timer = setTimeout(() => done(true), ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

const PENDING = 'pending'; // look again
const DECIDED = 'decided'; // ask the service again
type State = typeof PENDING | typeof DECIDED | { lost: string };

/**
 * What a look at the approval means for the wait. Not pending any more (or gone: the service
 * will say why): ask again. An unusable answer, a rate limit or an error of any other kind: look
 * again later. A refusal (401, 403, another 4xx): stop waiting.
 */
function stateOf(found: unknown): State {
  if (found instanceof AuthzError) {
    if (found instanceof BadRequestError && found.statusCode === 404) {
      return DECIDED;
    }
    if (!(found instanceof ServiceUnavailableError || found instanceof RateLimitError)) {
      return { lost: `the approval cannot be read (${found.code}): ${found.message}` };
    }
    return PENDING;
  }
  if (isApproval(found)) {
    return found.pending ? PENDING : DECIDED;
  }
  return PENDING;
}

function isApproval(value: unknown): value is Approval {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as Approval).status === 'string' &&
    typeof (value as Approval).pending === 'boolean'
  );
}

/** An escalation from the service that names its approval: one a guard can wait for. */
function awaitable(decision: Decision): decision is Decision & { approvalId: string } {
  return decision.outcome === 'escalated' && decision.approvalId !== null && decision.error === null;
}

/** Seconds as Python's `{:g}` writes them. */
function seconds(ms: number): string {
  return String(Number((ms / 1000).toPrecision(6)));
}

/**
 * The decision a guard returns: an escalation has a reason saying that approval is required,
 * which approval, until when, how long the guard waited, and the service's reason.
 */
function explained(decision: Decision, extra: { waitedMs?: number; note?: string } = {}): Decision {
  if (decision.outcome !== 'escalated' || decision.allowed) {
    return decision;
  }
  let text = 'approval required';
  if (decision.approvalId !== null) {
    text += `: approval ${decision.approvalId} is pending`;
    if (decision.approvalExpiresAt !== null) {
      text += ` until ${formatInstant(decision.approvalExpiresAt)}`;
    }
  }
  if (extra.waitedMs !== undefined) {
    text += `; not decided within the ${seconds(extra.waitedMs)} s waited`;
  }
  if (extra.note !== undefined) {
    text += ` (${extra.note})`;
  }
  return makeDecision({ ...decision, reason: `${text}; ${decision.reason}` });
}
