/**
 * A scriptable fake node for the unit tests: an in-memory WebSocket the
 * client is given as its constructor, and a server side that opens,
 * refuses, answers, delays or cuts each socket as the test says, with
 * the timing under node:test's mock timers. It stages what the real node
 * cannot be made to do on demand (a malformed message, a gap, a stream
 * that broke, a silent node).
 */

import type { WebSocketConstructor, WebSocketLike } from "../src/client.js";

export type Frame = Record<string, unknown> & { op: string; id?: number };

export class FakeSocket implements WebSocketLike {
  onopen: ((event: any) => void) | null = null;
  onmessage: ((event: any) => void) | null = null;
  onclose: ((event: any) => void) | null = null;
  onerror: ((event: any) => void) | null = null;
  /** What the client sent, parsed. */
  readonly sent: Frame[] = [];
  /** The code the client closed with, if it did. */
  closedWith?: number;

  constructor(
    readonly url: string,
    private server: FakeServer,
  ) {}

  send(data: string): void {
    if (this.closedWith !== undefined) throw new Error("send on a closed socket");
    const frame = JSON.parse(data) as Frame;
    this.sent.push(frame);
    this.server.onCommand?.(this, frame);
  }

  close(code?: number): void {
    this.closedWith = code ?? 1005;
  }

  // ---- the server's side

  open(): void {
    this.onopen?.({});
  }

  /** Sends `message` (an object is serialized; a string goes as is). */
  push(message: unknown): void {
    this.onmessage?.({ data: typeof message === "string" ? message : JSON.stringify(message) });
  }

  /** The node closes with `code`; 1006 is a network error (no close frame). */
  end(code = 1006, reason = ""): void {
    if (code === 1006) this.onerror?.({});
    this.onclose?.({ code, reason });
  }

  /** Frames the client sent with this op. */
  ops(op: string): Frame[] {
    return this.sent.filter((f) => f.op === op);
  }
}

export class FakeServer {
  readonly sockets: FakeSocket[] = [];
  /** Called for each command the client sends. */
  onCommand?: (socket: FakeSocket, frame: Frame) => void;
  /** Called for each socket the client opens (the test may `open()` it at once). */
  onSocket?: (socket: FakeSocket) => void;
  readonly WebSocket: WebSocketConstructor;

  constructor() {
    const server = this;
    this.WebSocket = class extends FakeSocket {
      constructor(url: string) {
        super(url, server);
        server.sockets.push(this);
        server.onSocket?.(this);
      }
    };
  }

  get last(): FakeSocket {
    const socket = this.sockets.at(-1);
    if (!socket) throw new Error("no socket yet");
    return socket;
  }
}

/** Lets pending promise callbacks run (not a timer, so not mocked). */
export function flush(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** A deterministic uniform [0, 1) generator (mulberry32), for the jitter. */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** An unsigned JWT-shaped token with these claims (the client reads only `exp`). */
export function fakeToken(claims: Record<string, unknown>): string {
  const part = (o: unknown) => Buffer.from(JSON.stringify(o)).toString("base64url");
  return `${part({ alg: "HS256", typ: "JWT" })}.${part(claims)}.sig`;
}

/** A browser window as far as the client looks at it: online/offline and visibility, fired at will. */
export function fakeWindow() {
  const target = new EventTarget();
  const window = {
    document: { visibilityState: "visible" },
    navigator: { onLine: true },
    addEventListener: (type: string, listener: () => void) => target.addEventListener(type, listener),
    removeEventListener: (type: string, listener: () => void) => target.removeEventListener(type, listener),
    fire: (type: string) => target.dispatchEvent(new Event(type)),
  };
  return window;
}
