/**
 * The real node for the integration tests: `myriad serve` from MYRIAD_BIN
 * (default the repository's release build, target/release/myriad, from
 * clients/js where the tests run) on ephemeral loopback ports, learnt from its
 * first stdout line (`{"event":"listening","ws":…,"admin":…}`), as
 * crates/myriad/tests/common/mod.rs does; a `redis-server` on a free
 * loopback port (clients/conformance's harness contract); the HTTP publish API; a TCP
 * proxy on loopback that can cut every connection through it or point at
 * another node; an HTTP proxy that refuses WebSocket upgrades and cuts
 * streams; and HS256 tokens.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { createHmac } from "node:crypto";
import http from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import WebSocket from "ws";
import type { WebSocketConstructor } from "../../src/client.js";

export const BIN = process.env.MYRIAD_BIN ?? "../../target/release/myriad";

/** Node 20 has no global WebSocket: the client is given `ws`'s. */
export const WS = WebSocket as unknown as WebSocketConstructor;


export interface Node {
  ws: string;
  admin: string;
  url: string;
  kill(): Promise<void>;
}

export async function startNode(extra: string[] = []): Promise<Node> {
  const dir = mkdtempSync(join(tmpdir(), "myriad-sdk-"));
  const child: ChildProcess = spawn(
    BIN,
    ["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", dir, ...extra],
    { env: { ...process.env, MYRIAD_LOG: "warn" }, stdio: ["ignore", "pipe", "inherit"] },
  );
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const line = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no ready line from myriad within 10 s")), 10_000);
    child.once("exit", (code) => reject(new Error(`myriad exited with ${code}`)));
    createInterface({ input: child.stdout! }).once("line", (l) => {
      clearTimeout(timer);
      resolve(l);
    });
  });
  const ready = JSON.parse(line) as { event: string; ws: string; admin: string };
  if (ready.event !== "listening") throw new Error(`unexpected ready line ${line}`);
  return {
    ws: ready.ws,
    admin: ready.admin,
    url: `ws://${ready.ws}/ws`,
    async kill() {
      child.kill("SIGKILL");
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export interface Redis {
  url: string;
  kill(): Promise<void>;
}

/** Whether a Redis on `port` answers PING within `ms`. */
async function redisAnswers(port: number, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const answer = await new Promise<string>((resolve) => {
      const socket = net.connect(port, "127.0.0.1", () => socket.write("PING\r\n"));
      socket.setTimeout(1000, () => socket.destroy());
      socket.once("data", (d) => {
        resolve(d.toString());
        socket.destroy();
      });
      socket.once("error", () => resolve(""));
      socket.once("close", () => resolve(""));
    });
    if (answer === "+PONG\r\n") return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return false;
}

/** A port free now: bound on 0, read, closed (Redis cannot listen on port 0). */
async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A `redis-server` on 127.0.0.1 with no persistence, on a free port (up to 5 tried). */
export async function startRedis(): Promise<Redis> {
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort();
    const dir = mkdtempSync(join(tmpdir(), "myriad-sdk-redis-"));
    const child = spawn(
      "redis-server",
      ["--bind", "127.0.0.1", "--port", String(port), "--save", "", "--appendonly", "no", "--dir", dir],
      { stdio: "ignore" },
    );
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    const redis: Redis = {
      url: `redis://127.0.0.1:${port}`,
      async kill() {
        if (child.exitCode === null && child.signalCode === null) {
          child.kill("SIGKILL");
          await exited;
        }
        rmSync(dir, { recursive: true, force: true });
      },
    };
    if (await redisAnswers(port, 5000)) return redis;
    await redis.kill();
  }
  throw new Error("redis-server did not start on any of 5 ports");
}

/** POST /api/publish with `messages` in one batch; returns the results. */
export async function publish(node: Node, messages: Array<{ subject: string; data: unknown }>) {
  const response = await fetch(`http://${node.admin}/api/publish`, {
    method: "POST",
    body: JSON.stringify({ messages }),
  });
  const body = (await response.json()) as { results: Array<{ epoch: string; offset: number }> };
  if (response.status !== 200) throw new Error(`publish: ${response.status} ${JSON.stringify(body)}`);
  return body.results;
}

/**
 * An HTTP proxy on 127.0.0.1:0 towards a node's client listener, as one
 * that breaks WebSocket would be: refuses every upgrade (403) unless
 * `passUpgrades`; passes plain requests; ends a stream's response
 * (`/stream`, `/sse`) after `cutEvery` lines; `cut()` cuts every
 * connection through it. `local` answers some requests itself (a test
 * page, say: the page and the node then share an origin).
 */
export class HttpProxy {
  upgradesRefused = 0;
  cuts = 0;
  private sockets = new Set<net.Socket>();
  private server = http.createServer((req, res) => {
    if (this.local?.(req, res)) return;
    const [host, port] = this.target.split(":");
    const up = http.request({ host, port: Number(port), method: req.method, path: req.url, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode!, r.headers);
      const streaming = /^\/(stream|sse)\?/.test(req.url ?? "");
      let lines = 0;
      r.on("data", (chunk: Buffer) => {
        if (res.writableEnded) return; // cut: what the node still had in flight
        res.write(chunk);
        if (!streaming) return;
        lines += chunk.toString().split("\n").length - 1;
        if (lines >= this.cutEvery) {
          this.cuts++;
          r.destroy();
          // end, not destroy: destroy drops what is written but not yet
          // flushed, and a replay that came in one chunk past the cut
          // would then be lost on every reopen, the stream never moving on.
          res.end();
        }
      });
      r.on("end", () => res.end());
      r.on("error", () => res.destroy());
    });
    up.on("error", () => res.destroy());
    req.pipe(up);
    res.on("close", () => up.destroy());
  });

  constructor(
    private target: string,
    /** Lines a stream carries before the cut; Infinity stops cutting. */
    public cutEvery: number,
    /** Answers `req` itself when it returns true. */
    private local?: (req: http.IncomingMessage, res: http.ServerResponse) => boolean,
  ) {
    this.server.on("connection", (s: net.Socket) => {
      this.sockets.add(s);
      s.on("close", () => this.sockets.delete(s));
    });
    this.server.on("upgrade", (req, socket: net.Socket, head: Buffer) => {
      if (this.passUpgrades) return this.tunnel(req, socket, head);
      this.upgradesRefused++;
      socket.end("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    });
  }

  /** While true, upgrades go through to the node (as bytes, both ways). */
  passUpgrades = false;

  private tunnel(req: http.IncomingMessage, socket: net.Socket, head: Buffer): void {
    const [host, port] = this.target.split(":");
    const up = net.connect(Number(port), host!);
    let text = `${req.method} ${req.url} HTTP/1.1\r\n`;
    for (let i = 0; i < req.rawHeaders.length; i += 2) text += `${req.rawHeaders[i]}: ${req.rawHeaders[i + 1]}\r\n`;
    up.write(text + "\r\n");
    up.write(head);
    for (const s of [socket, up]) {
      this.sockets.add(s);
      s.on("error", () => {});
      s.on("close", () => (socket.destroy(), up.destroy()));
    }
    socket.pipe(up);
    up.pipe(socket);
  }

  /** Cuts every connection through the proxy. */
  cut(): void {
    for (const s of this.sockets) s.destroy();
  }

  async listen(): Promise<string> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    const { port } = this.server.address() as net.AddressInfo;
    return `ws://127.0.0.1:${port}/ws`;
  }

  close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

/** A TCP proxy on 127.0.0.1:0 towards `target` ("host:port"). */
export class Proxy {
  private server = net.createServer((client) => this.pipe(client));
  private pairs = new Set<net.Socket>();
  /** Connections accepted so far. */
  accepted = 0;

  constructor(public target: string) {}

  async listen(): Promise<string> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    const { port } = this.server.address() as net.AddressInfo;
    return `ws://127.0.0.1:${port}/ws`;
  }

  private pipe(client: net.Socket): void {
    this.accepted++;
    const [host, port] = this.target.split(":");
    const upstream = net.connect(Number(port), host!);
    for (const s of [client, upstream]) {
      this.pairs.add(s);
      s.on("error", () => {});
      s.on("close", () => {
        this.pairs.delete(s);
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream);
    upstream.pipe(client);
  }

  /**
   * Cuts every connection through the proxy at once (no close frame).
   * `destroy()`, not `resetAndDestroy()`: with sockets reset that way,
   * Node 20 sometimes spins forever in its exit cleanup.
   */
  cut(): void {
    for (const s of this.pairs) s.destroy();
  }

  close(): Promise<void> {
    this.cut();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

/** An HS256 JWT with `claims`, signed with `secret`. */
export function hs256(secret: string, claims: Record<string, unknown>): string {
  const part = (o: unknown) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const body = `${part({ alg: "HS256", typ: "JWT" })}.${part(claims)}`;
  return `${body}.${createHmac("sha256", secret).update(body).digest("base64url")}`;
}

/** Resolves when `done()` holds (checked every 10 ms); rejects after `ms` naming `what`. */
export async function until(what: string, done: () => boolean, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
