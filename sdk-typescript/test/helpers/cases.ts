/**
 * The shared case table of every guard (`../conformance/guard-cases.yaml`, beside the Python
 * SDK's tests that play the same table): loading it, playing a case's service on a real loopback
 * socket, and judging what a guard did with it.
 */

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { parse } from 'yaml';

import { freePort, standIn, type StandIn } from './standin.js';

const here = dirname(fileURLToPath(import.meta.url));
/** the package folder: dist/test/helpers is three levels below it */
export const PACKAGE_ROOT = resolve(here, '..', '..', '..');
export const TABLE = resolve(PACKAGE_ROOT, '..', 'conformance', 'guard-cases.yaml');
export const DENIED_PREFIX = 'Authorization denied: ';
/** the guard's client deadline for a case whose service holds its answer (the others: 10 s) */
export const HOLD_TIMEOUT_MS = 300;

export interface Case {
  name: string;
  service: {
    status?: number;
    headers?: Record<string, string>;
    body?: string;
    body_times?: number;
    hold?: boolean;
    closed?: boolean;
  };
  runs: { deny: boolean; allow: boolean };
  denial?: { is?: string; has?: string[] };
  /** the warn policies' warnings the guard surfaces (through onWarning), each once */
  warned?: Array<{ policyId: string; result: string; reason: string }>;
}

/** The guard's warnings: exactly the case's `warned`, in order. */
export function judgeWarnings(c: Case, seen: Array<{ policyId: string; result: string; reason: string }>): void {
  assert.deepEqual(
    seen.map((w) => ({ policyId: w.policyId, result: w.result, reason: w.reason })),
    c.warned ?? [],
    `${c.name}: the warnings surfaced`,
  );
}

export function loadCases(): Case[] {
  const table = parse(readFileSync(TABLE, 'utf8')) as { version: number; cases: Case[] };
  assert.equal(table.version, 1);
  assert.ok(table.cases.length > 0);
  return table.cases;
}

/** The client time-out to give the guard: only a held answer must outlast it. */
export function timeoutFor(c: Case): number {
  return c.service.hold ? HOLD_TIMEOUT_MS : 10_000;
}

/** The case's service on a loopback port (for `closed`: a port nothing listens on). */
export async function caseService(c: Case): Promise<StandIn> {
  if (c.service.closed) {
    const port = await freePort();
    return { baseUrl: `http://127.0.0.1:${port}`, received: [], close: async () => undefined };
  }
  // the table's text is sent as bytes one for one (latin-1), so "\xFF" is the byte 0xFF
  const body = Buffer.from((c.service.body ?? '').repeat(c.service.body_times ?? 1), 'latin1');
  return standIn({
    status: c.service.status ?? 200,
    body,
    ...(c.service.headers === undefined ? {} : { headers: c.service.headers }),
    ...(c.service.hold ? { hold: true } : {}),
  });
}

/**
 * What the guard did: the tool ran (and then there is no denial), or it did not and the model
 * got `denial`, the case's text.
 */
export function judge(c: Case, onError: 'deny' | 'allow', ran: boolean, denial: string | undefined, key: string): void {
  assert.equal(ran, c.runs[onError], `${c.name}: the tool ran: ${ran} (${denial ?? 'no denial'})`);
  if (ran) {
    assert.equal(denial, undefined);
    return;
  }
  assert.ok(denial !== undefined, `${c.name}: no denial text`);
  assert.ok(denial.startsWith(DENIED_PREFIX), denial);
  assert.ok(!denial.includes(key), `${c.name}: the key is in the denial`);
  assert.ok(denial.length < 2000, `${c.name}: ${denial.length} characters`);
  if (c.denial?.is !== undefined) {
    assert.equal(denial, c.denial.is);
  }
  for (const part of c.denial?.has ?? []) {
    assert.ok(denial.includes(part), `${c.name}: ${JSON.stringify(part)} not in ${JSON.stringify(denial)}`);
  }
}
