/**
 * One behaviour, every guard: each case of `conformance/guard-cases.yaml` (the table the Python
 * guard's tests play too), with `onError` 'deny' and 'allow', through a plain handler wrapped by
 * `guard.tool` and through a real McpServer protected by `guard.protect`, called by the SDK's own
 * Client over its in-memory transport. The service is a stand-in on a real loopback socket.
 */

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';

import { AuthzClient, Guard, type OnError, type PolicyWarning } from '../src/index.js';
import { caseService, judge, judgeWarnings, loadCases, timeoutFor } from './helpers/cases.js';
import { callTool, connect } from './helpers/mcp.js';

const KEY = `svc_${'7'.repeat(32)}`;
const AGENT = '0193a1a2-0000-7000-8000-000000000001';
const CASES = loadCases();
const ON_ERROR: OnError[] = ['deny', 'allow'];

describe('the shared case table through guard.tool', () => {
  for (const c of CASES) {
    for (const onError of ON_ERROR) {
      test(`${c.name} (onError ${onError})`, async () => {
        const service = await caseService(c);
        try {
          const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: KEY, timeoutMs: timeoutFor(c) });
          const warned: PolicyWarning[] = [];
          const guard = new Guard({ client, agentId: AGENT, onError, onWarning: (w) => warned.push(w) });
          const ran: unknown[] = [];
          const refund = guard.tool('payments.refund', (params: { amount: number; currency: string }) => {
            ran.push(params);
            return `refunded ${params.amount} ${params.currency}`;
          });
          const result = await refund({ amount: 5000, currency: 'EUR' });
          const denial = typeof result === 'string' ? undefined : result.content[0].text;
          if (typeof result !== 'string') {
            assert.equal(result.isError, true);
          } else {
            assert.equal(result, 'refunded 5000 EUR');
          }
          judge(c, onError, ran.length === 1, denial, KEY);
          judgeWarnings(c, warned);
          if (!c.service.closed) {
            assert.equal(service.received.length, 1, 'one request per call');
          }
        } finally {
          await service.close();
        }
      });
    }
  }
});

describe('the shared case table through guard.protect(McpServer)', () => {
  for (const c of CASES) {
    for (const onError of ON_ERROR) {
      test(`${c.name} (onError ${onError})`, async () => {
        const service = await caseService(c);
        const mcp = new McpServer({ name: 'cases', version: '1.0.0' });
        const ran: string[] = [];
        // one tool registered before protect (registerTool), one after (tool): both guarded
        mcp.registerTool(
          'payments.refund',
          { inputSchema: { amount: z.number(), currency: z.string() } },
          async ({ amount, currency }) => {
            ran.push('payments.refund');
            return { content: [{ type: 'text', text: `refunded ${amount} ${currency}` }] };
          },
        );
        const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: KEY, timeoutMs: timeoutFor(c) });
        const warned: PolicyWarning[] = [];
        new Guard({ client, agentId: AGENT, onError, onWarning: (w) => warned.push(w) }).protect(mcp);
        mcp.tool('calendar.create', { title: z.string() }, async ({ title }) => {
          ran.push('calendar.create');
          return { content: [{ type: 'text', text: `created ${title}` }] };
        });
        const mcpClient = await connect(mcp);
        try {
          const calls: Array<[string, Record<string, unknown>]> = [
            ['payments.refund', { amount: 5000, currency: 'EUR' }],
            ['calendar.create', { title: 'standup' }],
          ];
          for (const [name, args] of calls) {
            const before = ran.length;
            const outcome = await callTool(mcpClient.client, name, args);
            const didRun = ran.length === before + 1;
            if (didRun) {
              assert.equal(outcome.isError, false, outcome.text);
            } else {
              assert.equal(outcome.isError, true);
            }
            judge(c, onError, didRun, didRun ? undefined : outcome.text, KEY);
          }
          // two calls, each answered the same: the case's warnings twice, in order
          judgeWarnings({ ...c, warned: [...(c.warned ?? []), ...(c.warned ?? [])] }, warned);
          if (!c.service.closed) {
            const names = service.received.map((r) => (JSON.parse(r.body) as { tool_name: string }).tool_name);
            assert.deepEqual(names, ['payments.refund', 'calendar.create'], 'each call checked once, by its name');
          }
        } finally {
          await mcpClient.close();
          await service.close();
        }
      });
    }
  }
});
