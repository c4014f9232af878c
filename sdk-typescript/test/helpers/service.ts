/**
 * A real `agentauth serve` for the tests: a fresh SQLite database in a temporary folder, an admin
 * key and an approver key made with the command line, the server on a free loopback port, ready
 * once `GET /healthz` answers 200 (polled, with a deadline), stopped by its PID (SIGTERM, then
 * SIGKILL after a deadline).
 *
 * The Python comes from AGENTAUTH_PYTHON, else ../.venv/bin/python beside this package.
 */

import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

import { PACKAGE_ROOT } from './cases.js';
import { freePort } from './standin.js';

const REPO_ROOT = resolve(PACKAGE_ROOT, '..');
export const PYTHON = process.env['AGENTAUTH_PYTHON'] ?? resolve(REPO_ROOT, '.venv', 'bin', 'python');
const COMMAND_TIMEOUT_MS = 120_000;
const READY_TIMEOUT_MS = 60_000;
const STOP_TIMEOUT_MS = 25_000;

export interface RealService {
  baseUrl: string;
  adminKey: string;
  approverKey: string;
  /** an HTTP call of the API with `key` (admin by default): the status and the JSON body */
  api(method: string, path: string, body?: unknown, key?: string): Promise<{ status: number; body: any }>;
  stop(): Promise<void>;
}

function run(args: string[]): Promise<string> {
  return new Promise((resolvePromise, reject) => {
    execFile(PYTHON, ['-m', 'controller', ...args], { cwd: REPO_ROOT, timeout: COMMAND_TIMEOUT_MS }, (error, stdout, stderr) => {
      if (error) {
        reject(new Error(`${args.slice(0, 2).join(' ')} failed: ${error.message}\n${stderr}`));
      } else {
        resolvePromise(stdout);
      }
    });
  });
}

async function createKey(db: string, name: string, scopes: string): Promise<string> {
  const out = await run(['keys', 'create', '--name', name, '--scopes', scopes, '--db', db]);
  const key = out.trim().split('\n').pop()?.trim() ?? '';
  if (!/^svc_[0-9a-f]{32}$/.test(key)) {
    throw new Error(`keys create printed no key`);
  }
  return key;
}

function exited(child: ChildProcess): Promise<void> {
  return new Promise((resolvePromise) => {
    if (child.exitCode !== null || child.signalCode !== null) {
      resolvePromise();
    } else {
      child.once('exit', () => resolvePromise());
    }
  });
}

function within(promise: Promise<void>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<boolean>((resolvePromise) => {
    timer = setTimeout(() => resolvePromise(false), ms);
  });
  return Promise.race([promise.then(() => true), deadline]).finally(() => clearTimeout(timer));
}

export async function startService(): Promise<RealService> {
  const folder = mkdtempSync(join(tmpdir(), 'agentauth-guard-'));
  const db = `sqlite:///${join(folder, 'a.db')}`;
  let child: ChildProcess | undefined;
  const stop = async (): Promise<void> => {
    if (child?.pid !== undefined && child.exitCode === null && child.signalCode === null) {
      const gone = exited(child);
      child.kill('SIGTERM');
      if (!(await within(gone, STOP_TIMEOUT_MS))) {
        try {
          process.kill(-child.pid, 'SIGKILL'); // the server and its worker processes
        } catch {
          child.kill('SIGKILL');
        }
        await within(gone, STOP_TIMEOUT_MS);
      }
    }
    rmSync(folder, { recursive: true, force: true });
  };
  try {
    await run(['db', 'upgrade', '--db', db]);
    const adminKey = await createKey(db, 'admin', 'admin');
    const approverKey = await createKey(db, 'approver', 'approver');
    const port = await freePort();
    const baseUrl = `http://127.0.0.1:${port}`;
    child = spawn(
      PYTHON,
      ['-m', 'controller', 'serve', '--host', '127.0.0.1', '--port', String(port), '--db', db, '--workers', '1', '--threads', '4'],
      { cwd: REPO_ROOT, detached: true, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let log = '';
    child.stderr?.on('data', (chunk: Buffer) => {
      log = (log + chunk.toString('utf8')).slice(-8000);
    });
    const started = child;
    const deadline = Date.now() + READY_TIMEOUT_MS;
    for (;;) {
      if (started.exitCode !== null || started.signalCode !== null) {
        throw new Error(`agentauth serve exited (${started.exitCode ?? started.signalCode}):\n${log}`);
      }
      try {
        const answer = await fetch(`${baseUrl}/healthz`, { signal: AbortSignal.timeout(2000) });
        await answer.arrayBuffer();
        if (answer.status === 200) {
          break;
        }
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) {
        throw new Error(`agentauth serve did not answer /healthz within ${READY_TIMEOUT_MS} ms:\n${log}`);
      }
      await new Promise((resolvePromise) => setTimeout(resolvePromise, 100)); // the polling interval
    }
    const api: RealService['api'] = async (method, path, body, key = adminKey) => {
      const answer = await fetch(baseUrl + path, {
        method,
        headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
        signal: AbortSignal.timeout(30_000),
      });
      const text = await answer.text();
      return { status: answer.status, body: text === '' ? undefined : JSON.parse(text) };
    };
    return { baseUrl, adminKey, approverKey, api, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}
