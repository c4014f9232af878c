/**
 * Against a real `agentauth serve` (started here on a free port, with a real SQLite database):
 * the client's decisions and errors, allowed and denied tools through a real McpServer driven
 * by the SDK's own Client over its in-memory transport, an escalation naming its approval, and a
 * guard with `waitForApprovalMs` whose call runs once an approver approves it (or not, when the
 * approver denies it).
 */

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, test } from 'node:test';

import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';

import { AuthzClient, Guard, UnauthorizedError } from '../src/index.js';
import { callTool, connect, type Connected } from './helpers/mcp.js';
import { type RealService, startService } from './helpers/service.js';

let service: RealService;
let agentId: string;
let policyId: string;

before(async () => {
  service = await startService();
  const agent = await service.api('POST', '/v1/agents', { name: 'ts-guard-tests' });
  assert.equal(agent.status, 201, JSON.stringify(agent.body));
  agentId = agent.body.id;
  const policy = await service.api('POST', '/v1/policies', {
    agent_id: agentId,
    name: 'tools',
    rules: [
      { type: 'tool_allowlist', tools: ['calendar.*', 'echo', 'payments.refund'] },
      { type: 'tool_denylist', tools: ['shell'] },
      { type: 'require_approval', tools: ['payments.refund'], parameters: { amount: { max: 1000 } } },
    ],
  });
  assert.equal(policy.status, 201, JSON.stringify(policy.body));
  policyId = policy.body.id;
});

after(async () => {
  await service?.stop();
});

const text = (value: string) => ({ content: [{ type: 'text' as const, text: value }] });
const UUID = '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}';
const ISO_Z = '\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}Z';

/** An McpServer of four tools behind `guard`, and an SDK Client connected to it. */
async function refundsServer(guard: Guard): Promise<{ connection: Connected; ran: string[] }> {
  const ran: string[] = [];
  const mcp = new McpServer({ name: 'shop', version: '1.0.0' });
  mcp.registerTool('echo', { inputSchema: { words: z.string() } }, async ({ words }) => {
    ran.push('echo');
    return text(words);
  });
  mcp.registerTool(
    'payments.refund',
    { inputSchema: { order: z.string(), amount: z.number() } },
    async ({ order, amount }) => {
      ran.push(`refund ${order} ${amount}`);
      return text(`refunded ${amount} on ${order}`);
    },
  );
  guard.protect(mcp);
  mcp.tool('shell', { cmd: z.string() }, async () => {
    ran.push('shell');
    return text('ran');
  });
  mcp.tool('calendar.create', { title: z.string() }, async ({ title }) => {
    ran.push('calendar.create');
    return text(`created ${title}`);
  });
  mcp.tool('files.delete', { path: z.string() }, async () => {
    ran.push('files.delete');
    return text('deleted');
  });
  return { connection: await connect(mcp), ran };
}

describe('the client against the real service', () => {
  test('an allow carries every field; a denial is a decision', async () => {
    const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: service.adminKey });
    const allowed = await client.authorize({
      agentId,
      toolName: 'calendar.create',
      parameters: { title: 'standup' },
      sessionId: 'chat-2291',
    });
    assert.equal(allowed.allowed, true);
    assert.equal(allowed.outcome, 'allowed');
    assert.equal(allowed.reason, "allowed by policy 'tools' rule 0 (tool_allowlist)");
    assert.equal(allowed.policyId, policyId);
    assert.equal(allowed.ruleIndex, 0);
    assert.match(allowed.auditId ?? '', new RegExp(`^${UUID}$`));
    assert.ok(allowed.latencyMs !== null && allowed.latencyMs >= 0);
    assert.equal(allowed.sessionId, 'chat-2291');
    assert.deepEqual([allowed.approvalId, allowed.approvalExpiresAt, allowed.retryAfterSeconds, allowed.error], [null, null, null, null]);

    const denied = await client.authorize({ agentId, toolName: 'shell', parameters: { cmd: 'ls' } });
    assert.deepEqual([denied.allowed, denied.outcome, denied.ruleIndex, denied.sessionId], [false, 'denied', 1, null]);
    const unknown = await client.authorize({ agentId, toolName: 'files.delete' });
    assert.equal(unknown.policyId, null);
    assert.match(unknown.reason, /default deny/);
  });

  test('a wrong key is an UnauthorizedError that never shows it', async () => {
    const wrong = `svc_${'0'.repeat(32)}`;
    const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: wrong });
    await assert.rejects(client.authorize({ agentId, toolName: 'echo' }), (error: Error) => {
      assert.ok(error instanceof UnauthorizedError);
      assert.deepEqual([error.code, error.statusCode], ['UNAUTHORIZED', 401]);
      assert.ok(!`${error.message}${String(error)}${JSON.stringify(error)}`.includes(wrong));
      return true;
    });
    const decision = await new Guard({ client, agentId, onError: 'allow' }).check('echo', { words: 'hi' });
    assert.equal(decision.allowed, false, 'a wrong key never fails open');
    assert.match(decision.reason, /^the authorization service refused the check \(UNAUTHORIZED\)/);
  });

  test('an unknown approval is APPROVAL_NOT_FOUND', async () => {
    const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: service.adminKey });
    await assert.rejects(client.approval(randomUUID()), { name: 'BadRequestError', code: 'APPROVAL_NOT_FOUND', statusCode: 404 });
  });
});

describe('an McpServer behind the guard, against the real service', () => {
  test('allowed tools run; denied ones answer the denial and never run', async () => {
    const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: service.adminKey });
    const { connection, ran } = await refundsServer(new Guard({ client, agentId }));
    try {
      const mcp = connection.client;
      assert.deepEqual(await callTool(mcp, 'echo', { words: 'hello' }), { isError: false, text: 'hello', structured: undefined });
      assert.equal((await callTool(mcp, 'calendar.create', { title: 'standup' })).text, 'created standup');
      assert.equal((await callTool(mcp, 'payments.refund', { order: 'o-1', amount: 40 })).text, 'refunded 40 on o-1');
      const shell = await callTool(mcp, 'shell', { cmd: 'rm -rf /' });
      assert.deepEqual(shell, {
        isError: true,
        text: "Authorization denied: denied by policy 'tools' rule 1 (tool_denylist): tool 'shell' is denied",
        structured: undefined,
      });
      const unlisted = await callTool(mcp, 'files.delete', { path: '/' });
      assert.equal(unlisted.isError, true);
      assert.match(unlisted.text ?? '', /^Authorization denied: default deny/);
      assert.deepEqual(ran, ['echo', 'calendar.create', 'refund o-1 40']);
    } finally {
      await connection.close();
    }
  });

  test('an escalated call is denied, naming the approval and until when it is pending', async () => {
    const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: service.adminKey });
    const { connection, ran } = await refundsServer(new Guard({ client, agentId }));
    try {
      const order = `o-${randomUUID()}`;
      const result = await callTool(connection.client, 'payments.refund', { order, amount: 5000 });
      assert.equal(result.isError, true);
      const pattern = new RegExp(
        `^Authorization denied: approval required: approval (${UUID}) is pending until ${ISO_Z}; ` +
          "approval required by policy 'tools' rule 2 \\(require_approval\\): parameter 'amount' must be at most 1000$",
      );
      const match = pattern.exec(result.text ?? '');
      assert.ok(match, result.text);
      const approval = await client.approval(match[1] ?? '');
      assert.deepEqual([approval.status, approval.pending, approval.agentId, approval.toolName], ['pending', true, agentId, 'payments.refund']);
      assert.deepEqual(ran, []);
    } finally {
      await connection.close();
    }
  });

  for (const verb of ['approve', 'deny'] as const) {
    test(`waitForApprovalMs: the call runs only once an approver approves it (${verb})`, async () => {
      // a person on the other side: once the guard has looked at the approval (so it exists and the
      // guard is waiting), an approver key decides it; the signal is the guard's own request
      const decided: Array<{ status: number; body: any }> = [];
      let decision: Promise<void> | undefined;
      const watching: typeof fetch = (input, init) => {
        const url = new URL(String(input));
        const match = /^\/v1\/approvals\/([^/]+)$/.exec(url.pathname);
        if (init?.method === 'GET' && match && decision === undefined) {
          decision = service
            .api('POST', `/v1/approvals/${match[1]}/${verb}`, { comment: `${verb} by the test` }, service.approverKey)
            .then((answer) => {
              decided.push(answer);
            });
        }
        return fetch(input, init);
      };
      const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: service.adminKey, fetch: watching });
      const guard = new Guard({ client, agentId, waitForApprovalMs: 30_000 });
      const { connection, ran } = await refundsServer(guard);
      try {
        const order = `o-${randomUUID()}`;
        const result = await callTool(connection.client, 'payments.refund', { order, amount: 5000 });
        await decision;
        assert.equal(decided[0]?.status, 200, JSON.stringify(decided[0]?.body));
        if (verb === 'approve') {
          assert.deepEqual(result, { isError: false, text: `refunded 5000 on ${order}`, structured: undefined });
          assert.deepEqual(ran, [`refund ${order} 5000`]);
          // the approval allowed one call: the next identical one asks anew
          const again = await new Guard({ client, agentId }).check('payments.refund', { order, amount: 5000 });
          assert.equal(again.outcome, 'escalated');
          assert.notEqual(again.approvalId, decided[0]?.body.id);
        } else {
          assert.equal(result.isError, true);
          assert.equal(
            result.text,
            `Authorization denied: denied by policy 'tools' rule 2 (require_approval): approval ${decided[0]?.body.id} was denied`,
          );
          assert.deepEqual(ran, []);
        }
      } finally {
        await connection.close();
      }
    });
  }

  test('waitForApprovalMs: nobody decides in time, the call is denied saying how long it waited', async () => {
    const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: service.adminKey });
    const { connection, ran } = await refundsServer(new Guard({ client, agentId, waitForApprovalMs: 700 }));
    try {
      const result = await callTool(connection.client, 'payments.refund', { order: `o-${randomUUID()}`, amount: 5000 });
      assert.equal(result.isError, true);
      assert.match(
        result.text ?? '',
        new RegExp(`^Authorization denied: approval required: approval ${UUID} is pending until ${ISO_Z}; not decided within the 0\\.7 s waited; `),
      );
      assert.deepEqual(ran, []);
    } finally {
      await connection.close();
    }
  });
});
