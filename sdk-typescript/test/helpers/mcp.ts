/** A real MCP client of the SDK talking to a real McpServer over the SDK's in-memory transport. */

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';

export interface Connected {
  client: Client;
  close(): Promise<void>;
}

/** Connects a new SDK Client to `server` (an McpServer or a low-level Server). */
export async function connect(server: { connect(transport: InMemoryTransport): Promise<void>; close(): Promise<void> }): Promise<Connected> {
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  const client = new Client({ name: 'agentauth-guard-tests', version: '1.0.0' });
  await server.connect(serverSide);
  await client.connect(clientSide);
  return {
    client,
    async close() {
      await client.close();
      await server.close();
    },
  };
}

export interface CallOutcome {
  isError: boolean;
  /** the first text content of the result */
  text: string | undefined;
  structured: unknown;
}

export async function callTool(client: Client, name: string, args: Record<string, unknown>): Promise<CallOutcome> {
  const result = await client.callTool({ name, arguments: args });
  const content = (result.content ?? []) as Array<{ type: string; text?: string }>;
  const first = content.find((item) => item.type === 'text');
  return { isError: result.isError === true, text: first?.text, structured: result.structuredContent };
}
