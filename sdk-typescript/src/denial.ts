/** The text and the MCP-shaped result of a denial, shared by the guard and `protect`. */

export const DENIED_PREFIX = 'Authorization denied: ';

/** What a guarded handler returns instead of running: an MCP-shaped error result. */
export interface DeniedResult {
  content: [{ type: 'text'; text: string }];
  isError: true;
  [key: string]: unknown;
}

/** `{ content: [{ type: 'text', text: 'Authorization denied: <reason>' }], isError: true }` */
export function deniedResult(reason: string): DeniedResult {
  return { content: [{ type: 'text', text: DENIED_PREFIX + reason }], isError: true };
}
