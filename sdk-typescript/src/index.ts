/**
 * agentauth-guard: authorization for the tools of AI agents, from the agentauth service.
 *
 * ```ts
 * const client = new AuthzClient({ baseUrl: 'http://127.0.0.1:8080', apiKey: process.env.KEY! });
 * new Guard({ client, agentId: process.env.AGENT_ID! }).protect(mcpServer);
 * ```
 */

export {
  APPROVAL_ID,
  MAX_ANSWER_BYTES,
  MAX_REASON_CHARS,
  MAX_WARNINGS,
  type Approval,
  type Decision,
  type Outcome,
  type PolicyWarning,
} from './answers.js';
export {
  AuthzClient,
  DEFAULT_TIMEOUT_MS,
  type AuthorizeRequest,
  type Authorizer,
  type AuthzClientOptions,
} from './client.js';
export { DENIED_PREFIX, deniedResult, type DeniedResult } from './denial.js';
export {
  AuthzError,
  BadRequestError,
  ForbiddenError,
  RateLimitError,
  ServiceUnavailableError,
  UnauthorizedError,
  type AuthzErrorOptions,
} from './errors.js';
export {
  FIRST_POLL_MS,
  Guard,
  MAX_POLL_MS,
  type CheckOptions,
  type GuardOptions,
  type OnError,
  type OnWarning,
  type ToolOptions,
} from './guard.js';
export { protect, SESSION_HEADER } from './mcp.js';
