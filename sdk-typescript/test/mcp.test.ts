/**
 * `guard.protect(server)` on a real McpServer (and a low-level Server) of the official SDK,
 * called by the SDK's own Client over its in-memory transport; the service is a stand-in on a
 * loopback socket that allows the tools it is told to and records every check.
 */

import assert from 'node:assert/strict';
import { afterEach, describe, test } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { CallToolRequestSchema, CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';

import { AuthzClient, type Decision, Guard } from '../src/index.js';
import { callTool, connect, type Connected } from './helpers/mcp.js';
import { type Received, standIn, type StandIn } from './helpers/standin.js';

const KEY = `svc_${'a'.repeat(32)}`;
const AGENT = '0193a1a2-0000-7000-8000-000000000002';
const APPROVAL = '0193a1a2-0000-7000-8000-00000000000b';

const allow = (reason = 'allowed by policy'): string =>
  JSON.stringify({ allowed: true, outcome: 'allowed', reason, auditId: 'a1', latencyMs: 1 });
const deny = (reason: string): string =>
  JSON.stringify({ allowed: false, outcome: 'denied', reason, auditId: 'a2', latencyMs: 1 });

interface Check {
  agent_id: string;
  tool_name: string;
  parameters: Record<string, unknown>;
  session_id?: string;
}

/** A service that allows the tools in `allowed` and denies the others, recording each check. */
async function policyService(allowed: string[]): Promise<StandIn & { checks(): Check[] }> {
  const service = await standIn((request: Received) => {
    const check = JSON.parse(request.body) as Check;
    return allowed.includes(check.tool_name)
      ? { status: 200, body: allow() }
      : { status: 200, body: deny(`tool ${check.tool_name} is denied`) };
  });
  return { ...service, checks: () => service.received.map((r) => JSON.parse(r.body) as Check) };
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) {
    await cleanup();
  }
});

async function serve(allowed: string[]): Promise<{ service: StandIn & { checks(): Check[] }; guard: Guard }> {
  const service = await policyService(allowed);
  cleanups.push(() => service.close());
  const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: KEY, timeoutMs: 10_000 });
  return { service, guard: new Guard({ client, agentId: AGENT }) };
}

async function connected(server: McpServer | Server): Promise<Connected> {
  const connection = await connect(server);
  cleanups.push(() => connection.close());
  return connection;
}

const text = (value: string) => ({ content: [{ type: 'text' as const, text: value }] });

describe('protect(McpServer)', () => {
  test('guards every tool by name, registered before or after protect, with registerTool or tool', async () => {
    const { service, guard } = await serve(['calendar.create', 'echo', 'late.allowed']);
    const mcp = new McpServer({ name: 'calendar', version: '1.0.0' });
    const ran: string[] = [];
    mcp.registerTool('calendar.create', { inputSchema: { title: z.string() } }, async ({ title }) => {
      ran.push('calendar.create');
      return text(`created ${title}`);
    });
    mcp.tool('shell', { cmd: z.string() }, async () => {
      ran.push('shell');
      return text('ran');
    });
    assert.equal(guard.protect(mcp), mcp);
    mcp.tool('echo', 'says it back', { words: z.string() }, async ({ words }) => {
      ran.push('echo');
      return text(words);
    });
    mcp.registerTool('shell.exec', { inputSchema: { cmd: z.string() } }, async () => {
      ran.push('shell.exec');
      return text('ran');
    });
    const { client } = await connected(mcp);
    // and one registered once the server is connected
    mcp.registerTool('late.allowed', {}, async () => {
      ran.push('late.allowed');
      return text('late');
    });

    assert.deepEqual(await callTool(client, 'calendar.create', { title: 'standup' }), {
      isError: false,
      text: 'created standup',
      structured: undefined,
    });
    const shell = await callTool(client, 'shell', { cmd: 'rm -rf /' });
    assert.deepEqual([shell.isError, shell.text], [true, 'Authorization denied: tool shell is denied']);
    assert.equal((await callTool(client, 'echo', { words: 'hi' })).text, 'hi');
    const exec = await callTool(client, 'shell.exec', { cmd: 'ls' });
    assert.deepEqual([exec.isError, exec.text], [true, 'Authorization denied: tool shell.exec is denied']);
    assert.equal((await callTool(client, 'late.allowed', {})).text, 'late');

    assert.deepEqual(ran, ['calendar.create', 'echo', 'late.allowed']);
    assert.deepEqual(
      service.checks().map((c) => [c.agent_id, c.tool_name, c.parameters]),
      [
        [AGENT, 'calendar.create', { title: 'standup' }],
        [AGENT, 'shell', { cmd: 'rm -rf /' }],
        [AGENT, 'echo', { words: 'hi' }],
        [AGENT, 'shell.exec', { cmd: 'ls' }],
        [AGENT, 'late.allowed', {}],
      ],
    );
    for (const received of service.received) {
      assert.equal(received.method, 'POST');
      assert.equal(received.path, '/v1/authorize');
      assert.equal(received.headers.authorization, `Bearer ${KEY}`);
    }
  });

  test('a server protected before it has any tool guards the tools added later', async () => {
    const { service, guard } = await serve(['ok']);
    const mcp = guard.protect(new McpServer({ name: 'empty', version: '1.0.0' }));
    const ran: string[] = [];
    mcp.registerTool('ok', {}, async () => {
      ran.push('ok');
      return text('ok');
    });
    mcp.registerTool('nope', {}, async () => {
      ran.push('nope');
      return text('nope');
    });
    const { client } = await connected(mcp);
    assert.equal((await callTool(client, 'ok', {})).isError, false);
    assert.equal((await callTool(client, 'nope', {})).text, 'Authorization denied: tool nope is denied');
    assert.deepEqual(ran, ['ok']);
    assert.equal(service.checks().length, 2);
  });

  test('a server declaring the tools capability up front is guarded too', async () => {
    const { guard } = await serve([]);
    const mcp = new McpServer({ name: 'declared', version: '1.0.0' }, { capabilities: { tools: {} } });
    guard.protect(mcp);
    let ran = false;
    mcp.registerTool('anything', {}, async () => {
      ran = true;
      return text('ran');
    });
    const { client } = await connected(mcp);
    assert.equal((await callTool(client, 'anything', {})).isError, true);
    assert.equal(ran, false);
  });

  test('the service sees the arguments as the client sent them, before the SDK applies defaults', async () => {
    const { service, guard } = await serve(['calendar.create']);
    const mcp = new McpServer({ name: 'calendar', version: '1.0.0' });
    const got: unknown[] = [];
    mcp.registerTool(
      'calendar.create',
      { inputSchema: { title: z.string(), minutes: z.number().default(30) } },
      async (args) => {
        got.push(args);
        return text('created');
      },
    );
    guard.protect(mcp);
    const { client } = await connected(mcp);
    await callTool(client, 'calendar.create', { title: 'standup' });
    assert.deepEqual(service.checks()[0]?.parameters, { title: 'standup' });
    assert.deepEqual(got, [{ title: 'standup', minutes: 30 }]);
  });

  test('a denial of a tool with an output schema is the denial, not an output validation error', async () => {
    const { guard } = await serve([]);
    const mcp = new McpServer({ name: 'structured', version: '1.0.0' });
    let ran = false;
    mcp.registerTool(
      'weather',
      { inputSchema: { city: z.string() }, outputSchema: { celsius: z.number() } },
      async () => {
        ran = true;
        return { content: [{ type: 'text', text: '20' }], structuredContent: { celsius: 20 } };
      },
    );
    guard.protect(mcp);
    const { client } = await connected(mcp);
    const result = await client.callTool({ name: 'weather', arguments: { city: 'Oslo' } });
    assert.equal(result.isError, true);
    assert.deepEqual(result.content, [{ type: 'text', text: 'Authorization denied: tool weather is denied' }]);
    assert.equal(ran, false);
  });

  test('malformed calls reach no tool and no check: the SDK refuses them', async () => {
    const { service, guard } = await serve(['t']);
    const mcp = new McpServer({ name: 'm', version: '1.0.0' });
    let ran = 0;
    mcp.registerTool('t', {}, async () => {
      ran += 1;
      return text('ran');
    });
    guard.protect(mcp);
    const { client } = await connected(mcp);
    for (const params of [
      { name: 't', arguments: [1] },
      { name: 5, arguments: {} },
    ]) {
      await assert.rejects(client.request({ method: 'tools/call', params } as never, CallToolResultSchema));
    }
    assert.equal(ran, 0);
    assert.equal(service.checks().length, 0);
  });

  test("the guard's session goes with each call when the transport has none", async () => {
    const service = await policyService(['t']);
    cleanups.push(() => service.close());
    const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: KEY });
    const guard = new Guard({ client, agentId: AGENT, sessionId: 'chat-2291' });
    const mcp = guard.protect(new McpServer({ name: 's', version: '1.0.0' }));
    mcp.registerTool('t', {}, async () => text('ok'));
    const connection = await connected(mcp);
    await callTool(connection.client, 't', {});
    assert.equal(service.checks()[0]?.session_id, 'chat-2291');
  });

  test('protect refuses a second guard, and what is not a server of the SDK', async () => {
    const { guard } = await serve([]);
    const mcp = new McpServer({ name: 'twice', version: '1.0.0' });
    guard.protect(mcp);
    assert.throws(() => guard.protect(mcp), /already protected/);
    assert.throws(() => guard.protect(mcp.server), /already protected/);
    assert.throws(() => guard.protect({}), TypeError);
    assert.throws(() => guard.protect(new Client({ name: 'c', version: '1' })), TypeError);
    assert.throws(() => guard.protect(null as unknown as object), TypeError);
  });

  test('a cancelled MCP request ends the wait for an approval', async () => {
    let looked!: () => void;
    const firstLook = new Promise<void>((resolve) => {
      looked = resolve;
    });
    const service = await standIn((request) => {
      if (request.method === 'GET') {
        looked();
        return { status: 200, body: JSON.stringify({ id: APPROVAL, status: 'pending' }) };
      }
      return {
        status: 200,
        body: JSON.stringify({
          allowed: false,
          outcome: 'escalated',
          reason: 'needs a person',
          approvalId: APPROVAL,
          approvalExpiresAt: '2030-01-01T00:00:00Z',
        }),
      };
    });
    cleanups.push(() => service.close());
    const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: KEY });
    const guard = new Guard({ client, agentId: AGENT, waitForApprovalMs: 600_000 });
    const decided: Decision[] = [];
    let finished!: () => void;
    const done = new Promise<void>((resolve) => {
      finished = resolve;
    });
    const check = guard.check.bind(guard);
    guard.check = async (...args) => {
      const decision = await check(...args);
      decided.push(decision);
      finished();
      return decision;
    };
    const mcp = guard.protect(new McpServer({ name: 'wait', version: '1.0.0' }));
    let ran = false;
    mcp.registerTool('payments.refund', { inputSchema: { amount: z.number() } }, async () => {
      ran = true;
      return text('refunded');
    });
    const connection = await connected(mcp);
    const cancel = new AbortController();
    const call = connection.client.callTool({ name: 'payments.refund', arguments: { amount: 5000 } }, undefined, {
      signal: cancel.signal,
    });
    await firstLook;
    cancel.abort();
    await assert.rejects(call);
    await done;
    assert.equal(ran, false);
    assert.equal(decided[0]?.allowed, false);
    assert.match(decided[0]?.reason ?? '', /^approval required: approval .* \(the wait was cancelled\); needs a person$/);
  });
});

describe('protect(low-level Server)', () => {
  test('guards the tools/call handler registered before protect, and one set after it', async () => {
    const { service, guard } = await serve(['allowed.tool']);
    const server = new Server({ name: 'low', version: '1.0.0' }, { capabilities: { tools: {} } });
    const ran: string[] = [];
    server.setRequestHandler(CallToolRequestSchema, async (request) => {
      ran.push(`first:${request.params.name}`);
      return text('first');
    });
    guard.protect(server);
    const { client } = await connected(server);
    assert.equal((await callTool(client, 'allowed.tool', {})).text, 'first');
    assert.equal((await callTool(client, 'other.tool', { x: 1 })).text, 'Authorization denied: tool other.tool is denied');
    server.setRequestHandler(CallToolRequestSchema, async (request) => {
      ran.push(`second:${request.params.name}`);
      return text('second');
    });
    assert.equal((await callTool(client, 'allowed.tool', {})).text, 'second');
    assert.equal((await callTool(client, 'other.tool', {})).isError, true);
    assert.deepEqual(ran, ['first:allowed.tool', 'second:allowed.tool']);
    assert.deepEqual(
      service.checks().map((c) => c.tool_name),
      ['allowed.tool', 'other.tool', 'allowed.tool', 'other.tool'],
    );
  });
});

describe('protect: the session a call names', () => {
  test("the transport's session without a guard session; the guard's own whatever the client sends", async () => {
    for (const guardSession of [undefined, 'run-1']) {
      const service = await policyService(['echo']);
      cleanups.push(() => service.close());
      const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: KEY, timeoutMs: 10_000 });
      const guard = new Guard({ client, agentId: AGENT, ...(guardSession ? { sessionId: guardSession } : {}) });
      const mcp = new McpServer({ name: 'echo', version: '1.0.0' });
      mcp.registerTool('echo', { inputSchema: { words: z.string() } }, async ({ words }) => text(words));
      guard.protect(mcp);
      // the handler every call goes through, as a transport hands it a call of MCP session s-1
      const handlers = (mcp.server as unknown as { _requestHandlers: Map<string, Function> })._requestHandlers;
      const handle = handlers.get('tools/call');
      assert.ok(handle);
      const request = { method: 'tools/call', params: { name: 'echo', arguments: { words: 'hi' } } };
      const extra = { sessionId: 's-1', signal: new AbortController().signal, requestId: 1,
        sendNotification: async () => {}, sendRequest: async () => ({}) };
      await handle(request, extra);
      assert.deepEqual(service.checks().map((c) => c.session_id), [guardSession ?? 's-1']);
    }
  });
});
