/**
 * Every tool of an MCP server behind the guard, in one call: `guard.protect(server)`.
 *
 * For servers of the official TypeScript SDK (`@modelcontextprotocol/sdk` 1.x): an `McpServer`,
 * or a low-level `Server`. The guard wraps the server's `tools/call` request handler, the one
 * entry every tool call goes through, whatever registered the tool (`registerTool`, `tool`,
 * `registerToolTask`) and whenever (tools added after `protect` are guarded too: the handler
 * the SDK installs with the first tool is wrapped as it is installed). Each call is checked with
 * the tool's name and the arguments exactly as the MCP client sent them, before the SDK
 * validates or converts anything. A denied call answers `isError: true` with the text
 * `Authorization denied: <reason>` (also for tools that declare a structured output: the
 * denial is not run through the tool's output schema) and never reaches the tool; an allowed
 * call goes to the SDK's own handler unchanged.
 *
 * A guard made with a `sessionId` names every call with it. Without one, each call names the MCP
 * session its transport negotiated (streamable HTTP's `mcp-session-id`), so per-session rate
 * limits and budgets count per MCP session; calls without (stdio, in memory) name none. A client
 * may open as many sessions as it likes: per-agent limits bound what one client may do in all.
 *
 * A call the service escalates to a human is denied the same way (approval required, the
 * approval's id and expiry, the service's reason); a guard made with `waitForApprovalMs` first
 * waits for the approval, then asks again, and the tool runs only if that answer allows. The MCP
 * request stays open while the guard waits (a cancelled request ends the wait): keep the wait
 * below the MCP client's request time-out.
 *
 * The SDK is not imported: it is an optional peer dependency, and the server given is the SDK's.
 */

import { deniedResult } from './denial.js';
import type { Guard } from './guard.js';

const TOOLS_CALL = 'tools/call';
/** The header in which streamable HTTP carries the MCP session's id. */
export const SESSION_HEADER = 'mcp-session-id';
const SESSION_ID = /^[\x20-\x7e]{1,255}$/;
/** Marks a guarded handler, and a handler table already protected (a second protect would check twice). */
const GUARDED = Symbol.for('agentauth-guard.guarded');

interface RequestLike {
  method?: unknown;
  params?: { name?: unknown; arguments?: unknown; [key: string]: unknown };
}

interface ExtraLike {
  sessionId?: unknown;
  signal?: AbortSignal;
  requestInfo?: { headers?: Record<string, unknown> };
}

type RequestHandler = (request: RequestLike, extra: ExtraLike) => unknown;
type HandlerTable = Map<string, RequestHandler> & { [GUARDED]?: Guard };

/**
 * The MCP session id of a call: the transport's, or the `mcp-session-id` header of the HTTP
 * request it came in (undefined without one, or for an id the service could not take).
 */
export function transportSession(extra: ExtraLike | undefined): string | undefined {
  const header = extra?.requestInfo?.headers?.[SESSION_HEADER];
  for (const value of [extra?.sessionId, Array.isArray(header) ? header[0] : header]) {
    if (typeof value === 'string' && SESSION_ID.test(value)) {
      return value;
    }
  }
  return undefined;
}

/** The request-handler table of a low-level `Server` (an `McpServer` has one in `.server`). */
function handlerTable(server: object): HandlerTable {
  const record = server as Record<string, unknown>;
  const candidates: unknown[] = [];
  if (typeof record['registerTool'] === 'function' && typeof record['server'] === 'object') {
    candidates.push(record['server']); // an McpServer
  }
  candidates.push(server); // a low-level Server
  for (const candidate of candidates) {
    const lowlevel = candidate as Record<string, unknown> | null;
    if (
      lowlevel !== null &&
      typeof lowlevel['setRequestHandler'] === 'function' &&
      typeof lowlevel['getClientCapabilities'] === 'function' &&
      lowlevel['_requestHandlers'] instanceof Map
    ) {
      return lowlevel['_requestHandlers'] as HandlerTable;
    }
  }
  const kind = (server as { constructor?: { name?: string } }).constructor?.name ?? typeof server;
  throw new TypeError(
    `protect() takes an McpServer or a low-level Server of @modelcontextprotocol/sdk 1.x, not ${kind}`,
  );
}

/** Guards every tool of `server`; returns `server`. */
export function protect<S extends object>(server: S, guard: Guard): S {
  if (typeof server !== 'object' || server === null) {
    throw new TypeError('protect() takes an McpServer or a low-level Server');
  }
  const handlers = handlerTable(server);
  if (handlers[GUARDED] !== undefined) {
    throw new Error('this server is already protected by a guard');
  }

  const wrap = (handler: RequestHandler): RequestHandler => {
    if ((handler as { [GUARDED]?: true })[GUARDED] === true) {
      return handler;
    }
    const guarded = async (request: RequestLike, extra: ExtraLike): Promise<unknown> => {
      const params = request?.params;
      const name = params?.name;
      const args = params?.arguments;
      const malformed =
        typeof name !== 'string' ||
        !(args === undefined || args === null || (typeof args === 'object' && !Array.isArray(args)));
      if (malformed) {
        return handler(request, extra); // the SDK refuses it: no tool runs
      }
      // the guard's own session, set by whoever runs the server, is never undone by a client
      const session = guard.sessionId === undefined ? transportSession(extra) : undefined;
      const decision = await guard.check(name, (args ?? {}) as Record<string, unknown>, {
        ...(session === undefined ? {} : { sessionId: session }),
        ...(extra?.signal === undefined ? {} : { signal: extra.signal }),
      });
      if (decision.allowed !== true) {
        return deniedResult(decision.reason);
      }
      return handler(request, extra); // the SDK's own: validation, conversion, output
    };
    Object.defineProperty(guarded, GUARDED, { value: true });
    return guarded;
  };

  // the handler of tools/call as it is now (an McpServer installs it with its first tool) ...
  const set = handlers.set;
  const current = handlers.get(TOOLS_CALL);
  if (current !== undefined) {
    set.call(handlers, TOOLS_CALL, wrap(current));
  }
  // ... and whenever it is installed or replaced later
  Object.defineProperty(handlers, 'set', {
    value(this: HandlerTable, method: string, handler: RequestHandler): HandlerTable {
      const value = method === TOOLS_CALL && typeof handler === 'function' ? wrap(handler) : handler;
      set.call(this, method, value);
      return this;
    },
    configurable: true,
    writable: true,
  });
  Object.defineProperty(handlers, GUARDED, { value: guard });
  return server;
}
