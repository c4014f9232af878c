/**
 * The Guard on its own: its options, `check`, the wrapper of plain handlers, and waiting for an
 * approval (the polling schedule on a fake clock; the waits against a stand-in service on a
 * loopback socket, whose approval is pending, approved, denied, gone or unreadable).
 */

import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';

import { AuthzClient, type Authorizer, type Decision, Guard } from '../src/index.js';
import { clock, FIRST_POLL_MS, MAX_POLL_MS, Waiting } from '../src/guard.js';
import { freePort, type Received, standIn, type StandIn } from './helpers/standin.js';

const KEY = `svc_${'c'.repeat(32)}`;
const AGENT = '0193a1a2-0000-7000-8000-000000000004';
const APPROVAL = '0193a1a2-0000-7000-8000-00000000000d';
const ALLOWED = JSON.stringify({ allowed: true, outcome: 'allowed', reason: 'allowed by policy', auditId: 'a1' });
const ESCALATED = JSON.stringify({
  allowed: false,
  outcome: 'escalated',
  reason: "approval required by policy 'p' rule 2 (require_approval): parameter 'amount' must be at most 1000",
  auditId: 'a2',
  approvalId: APPROVAL,
  approvalExpiresAt: '2030-01-01T00:00:00.123456Z',
});
const APPROVAL_IS = (status: string): string => JSON.stringify({ id: APPROVAL, status });

const open: StandIn[] = [];
after(async () => {
  for (const service of open) {
    await service.close();
  }
});

/**
 * A service whose answers to POST /v1/authorize and GET /v1/approvals/<id> are taken in turn
 * from the two lists (the last one repeats).
 */
async function scripted(authorize: string[], approvals: Array<{ status: number; body: string }> = []): Promise<StandIn> {
  let posts = 0;
  let gets = 0;
  const service = await standIn((request: Received) => {
    if (request.method === 'GET') {
      const answer = approvals[Math.min(gets, approvals.length - 1)] ?? { status: 500, body: '' };
      gets += 1;
      return answer;
    }
    const body = authorize[Math.min(posts, authorize.length - 1)] ?? ALLOWED;
    posts += 1;
    return { status: 200, body };
  });
  open.push(service);
  return service;
}

function guardOf(service: StandIn, options: Partial<ConstructorParameters<typeof Guard>[0]> = {}): Guard {
  const client = new AuthzClient({ baseUrl: service.baseUrl, apiKey: KEY, timeoutMs: 10_000 });
  return new Guard({ client, agentId: AGENT, ...options });
}

const methods = (service: StandIn): string[] => service.received.map((r) => `${r.method} ${r.path}`);

describe('options', () => {
  test('are checked when the guard is made', () => {
    const client = new AuthzClient({ baseUrl: 'http://127.0.0.1:1', apiKey: KEY });
    assert.throws(() => new Guard({ client, agentId: AGENT, onError: 'open' as 'allow' }), RangeError);
    assert.throws(() => new Guard({ client, agentId: '' }), TypeError);
    assert.throws(() => new Guard({ client: {} as Authorizer, agentId: AGENT }), TypeError);
    for (const waitForApprovalMs of [0, -5, Number.NaN, Number.POSITIVE_INFINITY, '10' as unknown as number]) {
      assert.throws(() => new Guard({ client, agentId: AGENT, waitForApprovalMs }), RangeError);
    }
    assert.throws(() => new Guard({ client, agentId: AGENT, sessionId: '' }), RangeError);
    const guard = new Guard({ client, agentId: AGENT });
    assert.equal(guard.onError, 'deny', 'deny is the default');
    assert.equal(guard.waitForApprovalMs, undefined);
  });
});

describe('check', () => {
  test('an unreachable service denies, or allows with onError allow, saying why', async () => {
    const port = await freePort();
    const client = new AuthzClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: KEY });
    const denied = await new Guard({ client, agentId: AGENT }).check('t', {});
    assert.equal(denied.allowed, false);
    assert.equal(denied.outcome, 'denied');
    assert.match(denied.reason, /^authorization service unreachable: cannot reach /);
    assert.equal(denied.error?.code, 'UNAVAILABLE');
    assert.equal(denied.auditId, null);
    const allowed = await new Guard({ client, agentId: AGENT, onError: 'allow' }).check('t', {});
    assert.equal(allowed.allowed, true);
    assert.equal(allowed.outcome, 'allowed');
    assert.match(allowed.reason, /; allowed because onError is 'allow'$/);
  });

  test('a session of the call, else of the guard, goes with the check; a bad one denies', async () => {
    const service = await scripted([ALLOWED]);
    const guard = guardOf(service, { sessionId: 'run-1' });
    await guard.check('t', {});
    await guard.check('t', {}, { sessionId: 'chat-2' });
    const sessions = service.received.map((r) => (JSON.parse(r.body) as { session_id?: string }).session_id);
    assert.deepEqual(sessions, ['run-1', 'chat-2']);
    const bad = await guard.check('t', {}, { sessionId: 'x'.repeat(300) });
    assert.equal(bad.allowed, false);
    assert.match(bad.reason, /^the call cannot be checked \(CHECK_FAILED\): the check failed: RangeError: sessionId/);
    assert.equal(service.received.length, 2);
  });

  test('parameters without a JSON form deny, whatever onError says', async () => {
    const service = await scripted([ALLOWED]);
    const decision = await guardOf(service, { onError: 'allow' }).check('t', { amount: Number.NaN });
    assert.equal(decision.allowed, false);
    assert.equal(
      decision.reason,
      'the call cannot be checked (INVALID_PARAMETERS): the parameters cannot be sent: parameters.amount is not a finite number',
    );
    assert.equal(service.received.length, 0);
  });

  test('never rejects, whatever the client does', async () => {
    const throwing: Authorizer = {
      authorize: () => Promise.reject('not even an Error'),
      approval: () => Promise.reject(new Error('no')),
    };
    for (const onError of ['deny', 'allow'] as const) {
      const decision = await new Guard({ client: throwing, agentId: AGENT, onError }).check('t', {});
      assert.equal(decision.allowed, false, 'a bug never fails open');
      assert.equal(decision.reason, 'the call cannot be checked (CHECK_FAILED): the check failed: not even an Error');
    }
  });
});

describe("a warn policy's warnings", () => {
  const WARNED = JSON.stringify({
    allowed: true,
    outcome: 'allowed',
    reason: 'allowed by policy',
    auditId: 'a9',
    warnings: [{ policyId: 'p-warn', result: 'denied', reason: "tool 'payments.refund' is denied" }],
  });

  test('go to console.warn by default, naming the policy and the reason; the call is allowed', async () => {
    const service = await scripted([WARNED]);
    const said: unknown[][] = [];
    const original = console.warn;
    console.warn = (...args: unknown[]) => {
      said.push(args);
    };
    try {
      const decision = await guardOf(service).check('payments.refund', { amount: 5 });
      assert.equal(decision.allowed, true, 'the real decision is followed');
      assert.deepEqual(decision.warnings, [
        { policyId: 'p-warn', result: 'denied', reason: "tool 'payments.refund' is denied" },
      ]);
    } finally {
      console.warn = original;
    }
    assert.equal(said.length, 1);
    const line = String(said[0]?.[0]);
    assert.ok(line.includes('p-warn') && line.includes("tool 'payments.refund' is denied"), line);
    assert.ok(line.includes('payments.refund'), line);
  });

  test('an onWarning that throws changes nothing of the decision', async () => {
    const service = await scripted([WARNED]);
    const onWarning = (): void => {
      throw new Error('the handler fails');
    };
    const decision = await guardOf(service, { onWarning }).check('payments.refund', {});
    assert.equal(decision.allowed, true);
    assert.throws(() => guardOf(service, { onWarning: 'log' as unknown as () => void }), TypeError);
  });
});

describe('guard.tool', () => {
  test('runs the handler only on an allow, with its arguments and this', async () => {
    const service = await scripted([ALLOWED, JSON.stringify({ allowed: false, outcome: 'denied', reason: 'no refunds today' })]);
    const guard = guardOf(service);
    const book = {
      total: 0,
      refund: guard.tool('payments.refund', async function (this: { total: number }, params: { amount: number }) {
        this.total += params.amount;
        return `refunded ${params.amount}`;
      }),
    };
    assert.equal(await book.refund({ amount: 40 }), 'refunded 40');
    assert.deepEqual(await book.refund({ amount: 50 }), {
      content: [{ type: 'text', text: 'Authorization denied: no refunds today' }],
      isError: true,
    });
    assert.equal(book.total, 40);
    assert.deepEqual(
      service.received.map((r) => JSON.parse(r.body) as unknown),
      [
        { agent_id: AGENT, tool_name: 'payments.refund', parameters: { amount: 40 } },
        { agent_id: AGENT, tool_name: 'payments.refund', parameters: { amount: 50 } },
      ],
    );
  });

  test('parameters from the arguments as the guard is told; none is an empty object', async () => {
    const service = await scripted([ALLOWED]);
    const guard = guardOf(service);
    const send = guard.tool('mail.send', (to: string, subject: string) => `sent ${subject} to ${to}`, {
      parameters: (to, subject) => ({ to, subject }),
    });
    assert.equal(await send('ana@example.org', 'hello'), 'sent hello to ana@example.org');
    const ping = guard.tool('ping', () => 'pong');
    assert.equal(await ping(), 'pong');
    assert.deepEqual(
      service.received.map((r) => (JSON.parse(r.body) as { parameters: unknown }).parameters),
      [{ to: 'ana@example.org', subject: 'hello' }, {}],
    );
  });

  test('arguments that are no parameters object deny without asking', async () => {
    const service = await scripted([ALLOWED]);
    const guard = guardOf(service, { onError: 'allow' });
    let ran = false;
    const handler = guard.tool('t', (_value: unknown) => {
      ran = true;
    });
    const result = await handler('a string');
    assert.deepEqual(result, {
      content: [
        {
          type: 'text',
          text:
            'Authorization denied: the call cannot be checked (INVALID_PARAMETERS): the parameters cannot be sent: ' +
            'parameters must be an object of parameter names to values',
        },
      ],
      isError: true,
    });
    const broken = guard.tool('t', (_value: unknown) => (ran = true), {
      parameters: () => {
        throw new Error('cannot say');
      },
    });
    const failed = await broken({});
    assert.equal(
      typeof failed === 'object' && failed.content[0].text,
      'Authorization denied: the call cannot be checked (CHECK_FAILED): the check failed: Error: cannot say',
    );
    assert.equal(ran, false);
    assert.equal(service.received.length, 0);
  });

  test("a decision's allowed counts only when it is true", async () => {
    const odd: Authorizer = {
      authorize: async () => ({ allowed: 1, outcome: 'allowed', reason: 'maybe' }) as unknown as Decision,
      approval: () => Promise.reject(new Error('no')),
    };
    let ran = false;
    const handler = new Guard({ client: odd, agentId: AGENT }).tool('t', () => {
      ran = true;
    });
    const result = await handler();
    assert.equal(ran, false);
    assert.equal(typeof result === 'object' && result?.isError, true);
  });

  test('an error of the handler itself is the caller’s', async () => {
    const service = await scripted([ALLOWED]);
    const handler = guardOf(service).tool('t', () => {
      throw new SyntaxError('the handler failed');
    });
    await assert.rejects(handler(), SyntaxError);
  });
});

describe('waiting for an approval', () => {
  test('polls after 0.5 s, then twice as long each time, at most 5 s apart, never past the wait', () => {
    const real = clock.now;
    let now = 1000;
    clock.now = () => now;
    try {
      const waiting = new Waiting(30_000);
      const pauses: number[] = [];
      for (let pause = waiting.nextPause(); pause !== undefined; pause = waiting.nextPause()) {
        pauses.push(pause);
        now += pause;
      }
      assert.deepEqual(pauses, [500, 1000, 2000, 4000, 5000, 5000, 5000, 5000, 2500]);
      assert.equal(FIRST_POLL_MS, 500);
      assert.equal(MAX_POLL_MS, 5000);
    } finally {
      clock.now = real;
    }
  });

  test('without a wait, an escalation denies at once, naming the approval and its expiry', async () => {
    const service = await scripted([ESCALATED]);
    const decision = await guardOf(service).check('payments.refund', { amount: 5000 });
    assert.equal(decision.allowed, false);
    assert.equal(decision.outcome, 'escalated');
    assert.equal(
      decision.reason,
      `approval required: approval ${APPROVAL} is pending until 2030-01-01T00:00:00Z; ` +
        "approval required by policy 'p' rule 2 (require_approval): parameter 'amount' must be at most 1000",
    );
    assert.deepEqual(methods(service), ['POST /v1/authorize']);
  });

  test('an escalation without an approval id is denied without waiting', async () => {
    const service = await scripted([JSON.stringify({ allowed: false, outcome: 'escalated' })]);
    const decision = await guardOf(service, { waitForApprovalMs: 60_000 }).check('t', {});
    assert.equal(decision.reason, 'approval required; approval required');
    assert.deepEqual(methods(service), ['POST /v1/authorize']);
  });

  test('approved: the guard asks again and the handler runs once, on the service’s allow', async () => {
    const service = await scripted([ESCALATED, ALLOWED], [{ status: 200, body: APPROVAL_IS('approved') }]);
    let runs = 0;
    const refund = guardOf(service, { waitForApprovalMs: 60_000 }).tool('payments.refund', (_params: { amount: number }) => {
      runs += 1;
      return 'refunded';
    });
    assert.equal(await refund({ amount: 5000 }), 'refunded');
    assert.equal(runs, 1);
    assert.deepEqual(methods(service), ['POST /v1/authorize', `GET /v1/approvals/${APPROVAL}`, 'POST /v1/authorize']);
  });

  test('denied by the approver: the service’s denial, and the handler does not run', async () => {
    const denied = JSON.stringify({ allowed: false, outcome: 'denied', reason: `denied by approval ${APPROVAL}`, approvalId: APPROVAL });
    const service = await scripted([ESCALATED, denied], [{ status: 200, body: APPROVAL_IS('denied') }]);
    const decision = await guardOf(service, { waitForApprovalMs: 60_000 }).check('payments.refund', { amount: 5000 });
    assert.deepEqual([decision.allowed, decision.outcome, decision.reason], [false, 'denied', `denied by approval ${APPROVAL}`]);
  });

  test('errors while polling do not end the wait; a vanished approval means asking again', async () => {
    const service = await scripted(
      [ESCALATED, ALLOWED],
      [
        { status: 503, body: '' },
        { status: 429, body: '' },
        { status: 404, body: '{"error": {"code": "APPROVAL_NOT_FOUND", "message": "gone"}}' },
      ],
    );
    const decision = await guardOf(service, { waitForApprovalMs: 120_000 }).check('payments.refund', { amount: 5000 });
    assert.equal(decision.allowed, true);
    assert.deepEqual(methods(service), [
      'POST /v1/authorize',
      ...Array(3).fill(`GET /v1/approvals/${APPROVAL}`),
      'POST /v1/authorize',
    ]);
  });

  test('an approval the key may not read ends the wait, saying so', async () => {
    const service = await scripted(
      [ESCALATED],
      [{ status: 401, body: '{"error": {"code": "UNAUTHORIZED", "message": "invalid or revoked API key"}}' }],
    );
    const decision = await guardOf(service, { waitForApprovalMs: 60_000 }).check('payments.refund', { amount: 5000 });
    assert.equal(decision.allowed, false);
    assert.match(
      decision.reason,
      /^approval required: approval \S+ is pending until 2030-01-01T00:00:00Z \(the approval cannot be read \(UNAUTHORIZED\): invalid or revoked API key\); approval required by policy/,
    );
    assert.equal(methods(service).length, 2);
  });

  test('a wait that runs out denies, saying how long it waited', async () => {
    const service = await scripted([ESCALATED], [{ status: 200, body: APPROVAL_IS('pending') }]);
    const decision = await guardOf(service, { waitForApprovalMs: 600 }).check('payments.refund', { amount: 5000 });
    assert.equal(decision.allowed, false);
    assert.equal(decision.outcome, 'escalated');
    assert.match(decision.reason, /^approval required: approval \S+ is pending until 2030-01-01T00:00:00Z; not decided within the 0\.6 s waited; approval required by policy/);
    // (how many looks fit in the wait is the schedule's business, tested above on a fake clock)
    assert.ok(methods(service).some((m) => m === `GET /v1/approvals/${APPROVAL}`), 'the guard looked at the approval');
    assert.equal(methods(service).filter((m) => m.startsWith('POST')).length, 1, 'no second question');
  });

  test('an aborted signal ends the wait', async () => {
    const service = await scripted([ESCALATED], [{ status: 200, body: APPROVAL_IS('pending') }]);
    const stop = new AbortController();
    stop.abort();
    const decision = await guardOf(service, { waitForApprovalMs: 60_000 }).check('payments.refund', { amount: 1 }, { signal: stop.signal });
    assert.match(decision.reason, /\(the wait was cancelled\); approval required by policy/);
    assert.deepEqual(methods(service), ['POST /v1/authorize']);
  });
});
