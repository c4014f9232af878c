/**
 * AuthzClient on real loopback sockets: the request it sends, every field of a decision, the
 * error class for each fault (closed port, slow answer past the deadline, 5xx, 401, 403, 429,
 * other 4xx, redirects, garbage, a 100 MB answer), and the key kept out of every text.
 */

import assert from 'node:assert/strict';
import { inspect } from 'node:util';
import { after, describe, test } from 'node:test';

import {
  type Approval,
  AuthzClient,
  AuthzError,
  BadRequestError,
  type Decision,
  ForbiddenError,
  Guard,
  MAX_ANSWER_BYTES,
  RateLimitError,
  ServiceUnavailableError,
  UnauthorizedError,
} from '../src/index.js';
import { parseInstant, retryAfterMs } from '../src/answers.js';
import { freePort, hugeAnswer, standIn, type StandIn } from './helpers/standin.js';

const KEY = `svc_${'5e'.repeat(16)}`;
const AGENT = '0193a1a2-0000-7000-8000-000000000003';
const APPROVAL = '0193a1a2-0000-7000-8000-00000000000c';

const open: StandIn[] = [];
after(async () => {
  for (const service of open) {
    await service.close();
  }
});

async function service(...args: Parameters<typeof standIn>): Promise<StandIn> {
  const made = await standIn(...args);
  open.push(made);
  return made;
}

function clientOf(baseUrl: string, timeoutMs = 10_000): AuthzClient {
  return new AuthzClient({ baseUrl, apiKey: KEY, timeoutMs });
}

/** Every text form of a value: none may hold the key. */
function assertNoKey(value: unknown, what: string): void {
  const forms = [String(value), inspect(value, { depth: 10, showHidden: true }), JSON.stringify(value) ?? ''];
  if (value instanceof Error) {
    forms.push(value.message, value.stack ?? '');
  }
  for (const form of forms) {
    assert.ok(!form.includes(KEY), `${what}: the key is in ${form}`);
    assert.ok(!form.includes(KEY.slice(4)), `${what}: the key's hex is in ${form}`);
  }
}

async function failure(promise: Promise<unknown>): Promise<AuthzError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof AuthzError, `not an AuthzError: ${String(error)}`);
    assertNoKey(error, error.name);
    return error;
  }
  assert.fail('the call did not fail');
}

const ALLOWED = {
  allowed: true,
  outcome: 'allowed',
  reason: "allowed by policy 'p' rule 0 (tool_allowlist)",
  policyId: 'pol-1',
  ruleIndex: 0,
  auditId: 'aud-1',
  latencyMs: 2.35,
  approvalId: null,
  sessionId: 'chat-1',
};

describe('the request', () => {
  test('is a POST of agent_id, tool_name, parameters and session_id with the bearer key', async () => {
    const s = await service({ status: 200, body: JSON.stringify(ALLOWED) });
    const client = clientOf(`${s.baseUrl}/`); // a trailing slash is dropped
    await client.authorize({ agentId: AGENT, toolName: 'calendar.create', parameters: { title: 'standup' }, sessionId: 'chat-1' });
    await client.authorize({ agentId: AGENT, toolName: 'calendar.list' });
    const [first, second] = s.received;
    assert.equal(first?.method, 'POST');
    assert.equal(first?.path, '/v1/authorize');
    assert.equal(first?.headers.authorization, `Bearer ${KEY}`);
    assert.equal(first?.headers['content-type'], 'application/json');
    assert.equal(first?.headers.accept, 'application/json');
    assert.deepEqual(JSON.parse(first?.body ?? ''), {
      agent_id: AGENT,
      tool_name: 'calendar.create',
      parameters: { title: 'standup' },
      session_id: 'chat-1',
    });
    assert.deepEqual(JSON.parse(second?.body ?? ''), { agent_id: AGENT, tool_name: 'calendar.list', parameters: {} });
  });

  test('parameters are sent as JSON values: dates as ISO text, big integers exactly', async () => {
    const s = await service({ status: 200, body: JSON.stringify(ALLOWED) });
    await clientOf(s.baseUrl).authorize({
      agentId: AGENT,
      toolName: 't',
      parameters: {
        when: new Date(Date.UTC(2030, 0, 2, 3, 4, 5)),
        big: 12345678901234567890123n,
        nested: { list: [1, 'two', null, true], skipped: undefined },
        url: new URL('https://example.org/a'),
      },
    });
    assert.equal(
      s.received[0]?.body,
      '{"agent_id":"0193a1a2-0000-7000-8000-000000000003","tool_name":"t","parameters":' +
        '{"when":"2030-01-02T03:04:05.000Z","big":12345678901234567890123,"nested":{"list":[1,"two",null,true]},' +
        '"url":"https://example.org/a"}}',
    );
  });

  test('parameters without a JSON form are refused before sending', async () => {
    const s = await service({ status: 200, body: JSON.stringify(ALLOWED) });
    const client = clientOf(s.baseUrl);
    const cyclic: Record<string, unknown> = {};
    cyclic['self'] = cyclic;
    let deep: Record<string, unknown> = {};
    for (let i = 0; i < 70; i += 1) {
      deep = { deeper: deep };
    }
    class Money {
      constructor(readonly cents: number) {}
    }
    const bad: unknown[] = [
      { amount: Number.NaN },
      { amount: Number.POSITIVE_INFINITY },
      { f: () => 1 },
      { s: Symbol('x') },
      { m: new Map([['a', 1]]) },
      { money: new Money(5) },
      { list: [1, undefined] },
      cyclic,
      deep,
      [1, 2],
      'text',
    ];
    for (const parameters of bad) {
      await assert.rejects(
        client.authorize({ agentId: AGENT, toolName: 't', parameters: parameters as Record<string, unknown> }),
        TypeError,
      );
    }
    await assert.rejects(client.authorize({ agentId: 5 as unknown as string, toolName: 't' }), TypeError);
    await assert.rejects(client.authorize({ agentId: AGENT, toolName: undefined as unknown as string }), TypeError);
    assert.equal(s.received.length, 0);
  });

  test('a session id the service would refuse is refused before sending', async () => {
    const s = await service({ status: 200, body: JSON.stringify(ALLOWED) });
    const client = clientOf(s.baseUrl);
    for (const sessionId of ['', 'x'.repeat(256), 'tab\there', 'naïve']) {
      await assert.rejects(client.authorize({ agentId: AGENT, toolName: 't', sessionId }), RangeError);
    }
    assert.equal(s.received.length, 0);
  });

  test('bad options are refused at once, never echoing the key', () => {
    for (const apiKey of ['', 'svc_ with space', 'svc_\n123', 'clé-ünicode', 42 as unknown as string]) {
      assert.throws(
        () => new AuthzClient({ baseUrl: 'http://127.0.0.1:1', apiKey }),
        (error: Error) => error instanceof TypeError && (typeof apiKey !== 'string' || apiKey === '' || !error.message.includes(apiKey)),
      );
    }
    for (const baseUrl of ['127.0.0.1:8080', 'ftp://127.0.0.1', 'http://', '', 'http://user:pw@127.0.0.1', 'http://127.0.0.1/?a=1']) {
      assert.throws(() => new AuthzClient({ baseUrl, apiKey: KEY }), TypeError);
    }
    for (const timeoutMs of [0, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
      assert.throws(() => new AuthzClient({ baseUrl: 'http://127.0.0.1:1', apiKey: KEY, timeoutMs }), RangeError);
    }
  });
});

describe('decisions', () => {
  test('an allow carries every field the service answers', async () => {
    const s = await service({ status: 200, body: JSON.stringify({ ...ALLOWED, retryAfterSeconds: null }) });
    const decision = await clientOf(s.baseUrl).authorize({ agentId: AGENT, toolName: 'calendar.create' });
    assert.deepEqual(decision, {
      allowed: true,
      outcome: 'allowed',
      reason: "allowed by policy 'p' rule 0 (tool_allowlist)",
      policyId: 'pol-1',
      ruleIndex: 0,
      auditId: 'aud-1',
      latencyMs: 2.35,
      retryAfterSeconds: null,
      approvalId: null,
      approvalExpiresAt: null,
      sessionId: 'chat-1',
      warnings: [],
      error: null,
    } satisfies Decision);
    assert.ok(Object.isFrozen(decision));
  });

  test("a warn policy's warnings are read, and a malformed one left out", async () => {
    const warnings = [
      { policyId: 'pol-2', result: 'denied', reason: "tool 'calendar.create' is denied" },
      { policyId: 'pol-3', result: 'maybe', reason: 'x' },
      'deny',
    ];
    const s = await service({ status: 200, body: JSON.stringify({ ...ALLOWED, warnings }) });
    const decision = await clientOf(s.baseUrl).authorize({ agentId: AGENT, toolName: 'calendar.create' });
    assert.equal(decision.allowed, true);
    assert.deepEqual(decision.warnings, [warnings[0]]);
    assert.ok(Object.isFrozen(decision.warnings));
  });

  test('an escalation names its approval and when it expires', async () => {
    const s = await service({
      status: 200,
      body: JSON.stringify({
        allowed: false,
        outcome: 'escalated',
        reason: 'approval required by policy',
        policyId: 'pol-1',
        ruleIndex: 2,
        auditId: 'aud-2',
        latencyMs: 6,
        approvalId: APPROVAL,
        approvalExpiresAt: '2026-11-26T08:36:03.013128Z',
      }),
    });
    const decision = await clientOf(s.baseUrl).authorize({ agentId: AGENT, toolName: 'payments.refund' });
    assert.equal(decision.allowed, false);
    assert.equal(decision.outcome, 'escalated');
    assert.equal(decision.approvalId, APPROVAL);
    assert.equal(decision.approvalExpiresAt?.toISOString(), '2026-11-26T08:36:03.013Z');
    assert.equal(decision.ruleIndex, 2);
  });

  test('a denial counts whatever else is wrong with its body; an allow only when well formed', async () => {
    const denied = await service({
      status: 200,
      body: '{"allowed": false, "outcome": 7, "ruleIndex": 1.5, "approvalId": "../x", "approvalExpiresAt": "soon", "reason": ["x"]}',
    });
    const decision = await clientOf(denied.baseUrl).authorize({ agentId: AGENT, toolName: 't' });
    assert.deepEqual(
      [decision.allowed, decision.outcome, decision.reason, decision.ruleIndex, decision.approvalId, decision.approvalExpiresAt],
      [false, 'denied', 'denied by the authorization service', null, null, null],
    );
    for (const body of [
      { ...ALLOWED, ruleIndex: '0' },
      { ...ALLOWED, approvalId: 'not an id' },
      { ...ALLOWED, approvalExpiresAt: '2030-02-30T00:00:00Z' },
      { ...ALLOWED, reason: 5 },
      { ...ALLOWED, outcome: 'escalated' },
      { ...ALLOWED, allowed: 1 },
      [ALLOWED],
    ]) {
      const s = await service({ status: 200, body: JSON.stringify(body) });
      const error = await failure(clientOf(s.baseUrl).authorize({ agentId: AGENT, toolName: 't' }));
      assert.ok(error instanceof ServiceUnavailableError);
      assert.deepEqual([error.code, error.statusCode], ['BAD_RESPONSE', 200]);
    }
  });

  test('a long reason is cut to 1,000 characters', async () => {
    const body = Buffer.from(JSON.stringify({ allowed: false, reason: 'é'.repeat(5000) }), 'utf8');
    const s = await service({ status: 200, body });
    const decision = await clientOf(s.baseUrl).authorize({ agentId: AGENT, toolName: 't' });
    assert.equal(decision.reason, `${'é'.repeat(1000)}…`);
  });
});

describe('faults on real sockets', () => {
  test('a closed port: ServiceUnavailableError', async () => {
    const port = await freePort();
    const error = await failure(clientOf(`http://127.0.0.1:${port}`).authorize({ agentId: AGENT, toolName: 't' }));
    assert.ok(error instanceof ServiceUnavailableError);
    assert.equal(error.code, 'UNAVAILABLE');
    assert.equal(error.statusCode, undefined);
    assert.match(error.message, /^cannot reach http:\/\/127\.0\.0\.1:\d+ \(ECONNREFUSED\)$/);
  });

  test('no answer before the deadline: ServiceUnavailableError', async () => {
    const s = await service({ status: 200, body: JSON.stringify(ALLOWED), hold: true });
    const error = await failure(clientOf(s.baseUrl, 200).authorize({ agentId: AGENT, toolName: 't' }));
    assert.ok(error instanceof ServiceUnavailableError);
    assert.equal(error.code, 'UNAVAILABLE');
    assert.match(error.message, /within 200 ms/);
  });

  test('a body that trickles past the deadline is cut off; its status still counts', async () => {
    const slow = await service({ status: 200, body: JSON.stringify(ALLOWED), trickleMs: 50 });
    const late = await failure(clientOf(slow.baseUrl, 300).authorize({ agentId: AGENT, toolName: 't' }));
    assert.ok(late instanceof ServiceUnavailableError);
    assert.deepEqual([late.code, late.statusCode], ['BAD_RESPONSE', 200]);
    const refused = await service({
      status: 401,
      body: '{"error": {"code": "UNAUTHORIZED", "message": "invalid or revoked API key"}}',
      trickleMs: 50,
    });
    const error = await failure(clientOf(refused.baseUrl, 300).authorize({ agentId: AGENT, toolName: 't' }));
    assert.ok(error instanceof UnauthorizedError, 'a 401 never becomes an outage');
    assert.equal(error.message, 'HTTP 401');
  });

  test('500 and 503 and 408: ServiceUnavailableError with the status', async () => {
    for (const status of [500, 502, 503, 408]) {
      const s = await service({ status, body: '{"error": {"code": "INTERNAL_ERROR", "message": "boom"}}' });
      const error = await failure(clientOf(s.baseUrl).authorize({ agentId: AGENT, toolName: 't' }));
      assert.ok(error instanceof ServiceUnavailableError);
      assert.deepEqual([error.code, error.statusCode, error.message], ['INTERNAL_ERROR', status, `HTTP ${status} from the service: boom`]);
    }
  });

  test('401, 403 and other 4xx: their own classes with the service code and message', async () => {
    const cases: Array<[number, string, new (...args: never[]) => AuthzError]> = [
      [401, 'UNAUTHORIZED', UnauthorizedError],
      [401, 'API_KEY_EXPIRED', UnauthorizedError],
      [403, 'INSUFFICIENT_SCOPE', ForbiddenError],
      [400, 'VALIDATION_ERROR', BadRequestError],
      [404, 'NOT_FOUND', BadRequestError],
      [413, 'PAYLOAD_TOO_LARGE', BadRequestError],
    ];
    for (const [status, code, kind] of cases) {
      const s = await service({ status, body: JSON.stringify({ error: { code, message: `says ${code}` } }) });
      const error = await failure(clientOf(s.baseUrl).authorize({ agentId: AGENT, toolName: 't' }));
      assert.ok(error instanceof kind, `${status} ${code}: ${error.name}`);
      assert.deepEqual([error.code, error.statusCode, error.message], [code, status, `says ${code}`]);
    }
    const bare = await service({ status: 403, body: 'no' });
    const error = await failure(clientOf(bare.baseUrl).authorize({ agentId: AGENT, toolName: 't' }));
    assert.deepEqual([error.name, error.code, error.message], ['ForbiddenError', 'INSUFFICIENT_SCOPE', 'HTTP 403']);
  });

  test('429: RateLimitError with retryAfterMs from Retry-After, seconds or an HTTP date', async () => {
    const inTwoMinutes = new Date(Date.now() + 120_000).toUTCString();
    const cases: Array<[Record<string, string>, (ms: number | undefined) => boolean]> = [
      [{ 'Retry-After': '7' }, (ms) => ms === 7000],
      [{ 'Retry-After': '0.25' }, (ms) => ms === 250],
      [{ 'Retry-After': inTwoMinutes }, (ms) => ms !== undefined && ms > 60_000 && ms <= 120_000],
      [{ 'Retry-After': 'Thu, 01 Jan 1970 00:00:00 GMT' }, (ms) => ms === 0],
      [{ 'Retry-After': 'soon' }, (ms) => ms === undefined],
      [{}, (ms) => ms === undefined],
    ];
    for (const [headers, fits] of cases) {
      const s = await service({ status: 429, headers, body: '{"error": {"code": "RATE_LIMITED", "message": "slow down"}}' });
      const error = await failure(clientOf(s.baseUrl).authorize({ agentId: AGENT, toolName: 't' }));
      assert.ok(error instanceof RateLimitError);
      assert.ok(fits(error.retryAfterMs), `${JSON.stringify(headers)}: ${error.retryAfterMs}`);
      assert.deepEqual([error.code, error.statusCode, error.message], ['RATE_LIMITED', 429, 'slow down']);
    }
  });

  test('a redirect is not followed', async () => {
    const target = await service({ status: 200, body: JSON.stringify(ALLOWED) });
    for (const status of [301, 302, 307, 308]) {
      const s = await service({ status, headers: { Location: `${target.baseUrl}/v1/authorize` }, body: '' });
      const error = await failure(clientOf(s.baseUrl).authorize({ agentId: AGENT, toolName: 't' }));
      assert.ok(error instanceof BadRequestError);
      assert.deepEqual([error.code, error.statusCode], ['UNEXPECTED_STATUS', status]);
    }
    assert.equal(target.received.length, 0, 'the key never went to the redirect target');
  });

  test('garbage and another 2xx: ServiceUnavailableError and BadRequestError', async () => {
    for (const body of ['\u0000\u00ffnot json at all', '', 'null', '"allowed"', '{"allowed": tru']) {
      const s = await service({ status: 200, body });
      const error = await failure(clientOf(s.baseUrl).authorize({ agentId: AGENT, toolName: 't' }));
      assert.ok(error instanceof ServiceUnavailableError);
      assert.equal(error.code, 'BAD_RESPONSE');
    }
    const created = await service({ status: 201, body: JSON.stringify(ALLOWED) });
    const error = await failure(clientOf(created.baseUrl).authorize({ agentId: AGENT, toolName: 't' }));
    assert.deepEqual([error.name, error.code], ['BadRequestError', 'UNEXPECTED_STATUS']);
  });

  test('a 100 MB answer is not read past 64 KiB: the client hangs up', async () => {
    const total = 100 * 1024 * 1024;
    const s = await hugeAnswer(total);
    open.push(s);
    const error = await failure(clientOf(s.baseUrl, 60_000).authorize({ agentId: AGENT, toolName: 't' }));
    assert.ok(error instanceof ServiceUnavailableError);
    assert.equal(error.code, 'BAD_RESPONSE');
    assert.match(error.message, /cut off \(over 65536 bytes/);
    await s.finished; // the connection closed: by the client, since the server had more to send
    assert.ok(s.sent() < total, `the server sent all ${s.sent()} bytes`);
    assert.ok(s.sent() < total / 4, `${s.sent()} bytes went out before the client hung up`);
    assert.equal(MAX_ANSWER_BYTES, 65536);
  });

  test('an answer of exactly 64 KiB is read', async () => {
    const body = JSON.stringify(ALLOWED);
    const padded = body + ' '.repeat(MAX_ANSWER_BYTES - body.length);
    const s = await service({ status: 200, body: padded });
    const decision = await clientOf(s.baseUrl).authorize({ agentId: AGENT, toolName: 't' });
    assert.equal(decision.allowed, true);
  });
});

describe('approvals', () => {
  test('approval() reads one approval', async () => {
    const s = await service({
      status: 200,
      body: JSON.stringify({
        id: APPROVAL,
        status: 'approved',
        agentId: AGENT,
        toolName: 'payments.refund',
        expiresAt: '2030-01-01T00:00:00Z',
        decidedAt: '2029-12-31T23:00:00+01:00',
        comment: 'fine',
      }),
    });
    const approval = await clientOf(s.baseUrl).approval(APPROVAL);
    assert.deepEqual(approval, {
      id: APPROVAL,
      status: 'approved',
      pending: false,
      agentId: AGENT,
      toolName: 'payments.refund',
      expiresAt: new Date('2030-01-01T00:00:00Z'),
      decidedAt: new Date('2029-12-31T22:00:00Z'),
      comment: 'fine',
    } satisfies Approval);
    assert.equal(s.received[0]?.method, 'GET');
    assert.equal(s.received[0]?.path, `/v1/approvals/${APPROVAL}`);
  });

  test('an unknown approval is a BadRequestError 404; a malformed id is refused before sending', async () => {
    const s = await service({ status: 404, body: '{"error": {"code": "APPROVAL_NOT_FOUND", "message": "no such approval"}}' });
    const client = clientOf(s.baseUrl);
    const error = await failure(client.approval(APPROVAL));
    assert.deepEqual([error.name, error.code, error.statusCode], ['BadRequestError', 'APPROVAL_NOT_FOUND', 404]);
    for (const id of ['', '../admin', 'a/b', 'x'.repeat(200), '-lead']) {
      await assert.rejects(client.approval(id), RangeError);
    }
    assert.equal(s.received.length, 1);
  });

  test('an approval answer without a status is unusable', async () => {
    const s = await service({ status: 200, body: '{"id": "x"}' });
    const error = await failure(clientOf(s.baseUrl).approval(APPROVAL));
    assert.deepEqual([error.name, error.code], ['ServiceUnavailableError', 'BAD_RESPONSE']);
  });
});

describe('the key is never shown', () => {
  test('not by the client, the guard, the errors, the decisions or the denials', async () => {
    const client = clientOf('http://127.0.0.1:1');
    assertNoKey(client, 'client');
    assert.equal(String(client), 'AuthzClient(http://127.0.0.1:1)');
    assert.deepEqual(JSON.parse(JSON.stringify(client)), { baseUrl: 'http://127.0.0.1:1', timeoutMs: 10_000 });
    assert.deepEqual(Object.keys(client).sort(), ['baseUrl', 'timeoutMs']);
    const guard = new Guard({ client, agentId: AGENT });
    assertNoKey(guard, 'guard');
    const faults = [
      await service({ status: 401, body: `{"error": {"code": "UNAUTHORIZED", "message": "invalid API key"}}` }),
      await service({ status: 500, body: 'oops' }),
      await service({ status: 429, headers: { 'Retry-After': '3' }, body: '' }),
      await service({ status: 200, body: 'garbage' }),
      await service({ status: 302, headers: { Location: 'http://127.0.0.1:1/' }, body: '' }),
    ];
    for (const fault of faults) {
      const faulty = clientOf(fault.baseUrl);
      await failure(faulty.authorize({ agentId: AGENT, toolName: 't' }));
      for (const onError of ['deny', 'allow'] as const) {
        const decision = await new Guard({ client: faulty, agentId: AGENT, onError }).check('t', {});
        assertNoKey(decision, 'decision');
        assertNoKey(decision.error, 'decision.error');
        assertNoKey(decision.reason, 'reason');
      }
    }
    const unreachable = await new Guard({ client, agentId: AGENT }).check('t', {});
    assertNoKey(unreachable, 'unreachable');
  });

  test('a key of a header-breaking shape is refused without being echoed', () => {
    const bad = `${KEY}\r\nX-Injected: 1`;
    assert.throws(
      () => new AuthzClient({ baseUrl: 'http://127.0.0.1:1', apiKey: bad }),
      (error: Error) => !error.message.includes(KEY) && !inspect(error).includes(KEY),
    );
  });
});

describe('the contract helpers', () => {
  test('Retry-After: seconds or an HTTP date, never negative', () => {
    const now = Date.UTC(2030, 0, 1, 0, 0, 0);
    assert.equal(retryAfterMs('7', now), 7000);
    assert.equal(retryAfterMs(' 1.5 ', now), 1500);
    assert.equal(retryAfterMs('-3', now), 0);
    assert.equal(retryAfterMs('Tue, 01 Jan 2030 00:00:30 GMT', now), 30_000);
    assert.equal(retryAfterMs('01 Jan 2030 00:01:00 +0000', now), 60_000);
    assert.equal(retryAfterMs('Mon, 31 Dec 2029 23:00:00 GMT', now), 0);
    for (const value of ['', 'soon', 'inf', 'nan', '0x10', '7 s', null, undefined]) {
      assert.equal(retryAfterMs(value, now), undefined, String(value));
    }
  });

  test('ISO 8601 instants, with an offset or without (UTC)', () => {
    const at = (value: string): string | undefined => parseInstant(value)?.toISOString();
    assert.equal(at('2030-01-01T00:00:00Z'), '2030-01-01T00:00:00.000Z');
    assert.equal(at('2030-01-01T00:00:00.123456Z'), '2030-01-01T00:00:00.123Z');
    assert.equal(at('2030-01-01t01:00:00+01:00'), '2030-01-01T00:00:00.000Z');
    assert.equal(at('2030-01-01T00:00:00-0230'), '2030-01-01T02:30:00.000Z');
    assert.equal(at('2030-01-01 12:30'), '2030-01-01T12:30:00.000Z');
    assert.equal(at('2030-01-01'), '2030-01-01T00:00:00.000Z');
    for (const bad of ['2030-02-30T00:00:00Z', '2030-01-01T25:00:00Z', 'soon', '2030-1-1', '2030-01-01T00:00:00+24:00', '']) {
      assert.equal(parseInstant(bad), null, bad);
    }
  });
});
