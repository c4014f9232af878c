/**
 * Stand-ins for the service on a real loopback socket: the client and the guard are exercised
 * through their real HTTP stack (Node's fetch), never mocked. Each is closed by the test that
 * made it (its held requests released, its connections dropped).
 */

import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface Received {
  method: string;
  path: string;
  headers: IncomingMessage['headers'];
  body: string;
}

export interface StandIn {
  baseUrl: string;
  received: Received[];
  close(): Promise<void>;
}

export type Answer = {
  status: number;
  headers?: Record<string, string>;
  body?: string | Buffer;
  /** answer only once the stand-in is closed (so any client deadline passes first) */
  hold?: boolean;
  /** send the body a byte every `trickleMs` until the stand-in is closed */
  trickleMs?: number;
};

/** A stand-in that answers each request as `answer` says (a function: by the request). */
export async function standIn(answer: Answer | ((request: Received) => Answer)): Promise<StandIn> {
  let release!: () => void;
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  let closed = false;
  const received: Received[] = [];
  const server = createServer((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (chunk: Buffer) => parts.push(chunk));
    req.on('end', () => {
      const request: Received = {
        method: req.method ?? '',
        path: req.url ?? '',
        headers: req.headers,
        body: Buffer.concat(parts).toString('utf8'),
      };
      received.push(request);
      const plan = typeof answer === 'function' ? answer(request) : answer;
      void respond(res, plan, released, () => closed);
    });
  });
  const baseUrl = await listen(server);
  return {
    baseUrl,
    received,
    async close() {
      closed = true;
      release();
      await stop(server);
    },
  };
}

async function respond(
  res: ServerResponse,
  plan: Answer,
  released: Promise<void>,
  isClosed: () => boolean,
): Promise<void> {
  if (plan.hold) {
    await released;
  }
  const body = typeof plan.body === 'string' ? Buffer.from(plan.body, 'latin1') : (plan.body ?? Buffer.alloc(0));
  try {
    res.writeHead(plan.status, {
      'Content-Type': 'application/json',
      'Content-Length': String(body.length),
      ...plan.headers,
    });
    if (plan.trickleMs === undefined) {
      res.end(body);
      return;
    }
    for (const byte of body) {
      if (isClosed() || res.destroyed) {
        return;
      }
      res.write(Buffer.from([byte]));
      await Promise.race([released, new Promise((resolve) => setTimeout(resolve, plan.trickleMs))]);
    }
    res.end();
  } catch {
    // the client gave up: nothing to answer
  }
}

/** A stand-in that streams `total` bytes of a 200 answer, counting what the socket took. */
export async function hugeAnswer(total: number): Promise<StandIn & { sent(): number; finished: Promise<void> }> {
  let sent = 0;
  let finish!: () => void;
  const finished = new Promise<void>((resolve) => {
    finish = resolve;
  });
  const received: Received[] = [];
  const chunk = Buffer.alloc(64 * 1024, 0x20); // spaces: valid JSON whitespace, never a decision
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      received.push({ method: req.method ?? '', path: req.url ?? '', headers: req.headers, body: '' });
      res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': String(total) });
      let gone = false;
      res.on('close', () => {
        gone = true;
        finish();
      });
      void (async () => {
        while (!gone && sent < total) {
          const piece = chunk.subarray(0, Math.min(chunk.length, total - sent));
          const more = res.write(piece);
          sent += piece.length;
          if (!more) {
            await new Promise<void>((resolve) => {
              const done = (): void => {
                res.off('drain', done);
                res.off('close', done);
                resolve();
              };
              res.on('drain', done);
              res.on('close', done);
            });
          }
        }
        if (!gone) {
          res.end();
        }
      })();
    });
  });
  const baseUrl = await listen(server);
  return {
    baseUrl,
    received,
    sent: () => sent,
    finished,
    async close() {
      await stop(server);
    },
  };
}

export function listen(server: Server): Promise<string> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as AddressInfo;
      resolve(`http://127.0.0.1:${port}`);
    });
  });
}

export function stop(server: Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}

/** A loopback port nothing listens on (it was free a moment ago). */
export async function freePort(): Promise<number> {
  const server = createServer();
  const url = await listen(server);
  await stop(server);
  return Number(new URL(url).port);
}
