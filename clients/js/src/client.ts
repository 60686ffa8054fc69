/**
 * The client: one logical connection to a myriad node (or to one of the
 * nodes of a cluster), kept up across failures, with the subscriptions,
 * tokens and commands that ride on it. docs/sdk.md is its contract; each
 * rule there is implemented here once. It knows the WebSocket only
 * through the constructor it is given (the global one by default), so it
 * runs in browsers and in Node alike.
 */

import { backoff } from "./backoff.js";
import { Emitter } from "./emitter.js";
import { MyriadError, serverError, TimeoutError, UnauthorizedError } from "./errors.js";
import { CREDENTIALS_REFUSED, KNOWN_OPS, mayReconnect, parseServerMessage, SUBSCRIBE_AGAIN, TOKEN_EXPIRED, type Member, type Position, type ServerMessage } from "./protocol.js";
import { HttpLink, type EventSourceConstructor, type FetchLike, type Transport } from "./http.js";
import { Subscription } from "./subscription.js";
import { refreshDelay, tokenExp } from "./token.js";

/** What the client needs of a WebSocket: the browser's API, or `ws` in Node. */
export interface WebSocketLike {
  onopen: ((event: any) => void) | null;
  onmessage: ((event: any) => void) | null;
  onclose: ((event: any) => void) | null;
  onerror: ((event: any) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}
export type WebSocketConstructor = new (url: string) => WebSocketLike;

/** The parts of a browser's `window` the client listens to (docs/sdk.md, "Browsers"). */
export interface WindowLike {
  addEventListener(type: string, listener: () => void): void;
  removeEventListener(type: string, listener: () => void): void;
  document?: { visibilityState?: string };
  navigator?: { onLine?: boolean };
}

export interface ClientOptions {
  /** A fixed token, used first. */
  token?: string;
  /** Fetches a token; rejects with `UnauthorizedError` when this user may not connect. */
  getToken?: () => Promise<string>;
  /** Milliseconds for each command and each connection attempt (10 s). */
  timeout?: number;
  /** Back-off base in milliseconds (500). */
  minReconnectDelay?: number;
  /** Back-off cap in milliseconds (20 s). */
  maxReconnectDelay?: number;
  /** Milliseconds of silence before the client pings (20 s). */
  heartbeatInterval?: number;
  /** Milliseconds to hear anything after that ping (10 s). */
  heartbeatTimeout?: number;
  /** The WebSocket constructor (default: the global one). */
  WebSocket?: WebSocketConstructor;
  /** Uniform in [0, 1), for the back-off's jitter (default `Math.random`). */
  random?: () => number;
  /** The page's window, for `online`/`offline` and visibility (default: the global one, when there is one). */
  window?: WindowLike;
  /** Transports in the order tried (docs/sdk.md, "Transports and fallback"). */
  transports?: Transport[];
  /** For the HTTP transports (default: the global ones). */
  fetch?: FetchLike;
  EventSource?: EventSourceConstructor;
}

export type ClientState = "disconnected" | "connecting" | "connected" | "closed";

/** Why the client changed state (docs/sdk.md, "Client states"). */
export type ClientCause =
  | { type: "call"; method: "connect" | "disconnect" | "close" }
  | { type: "open"; url: string }
  | { type: "close"; code: number; reason: string }
  | { type: "heartbeat" }
  | { type: "timeout" }
  | { type: "token"; error: MyriadError };

export interface ClientEvents {
  state: { state: ClientState; previous: ClientState; cause: ClientCause };
  /** An attempt failed (or a connection was lost) and the next one is scheduled. */
  retry: { attempt: number; delay: number; url: string; cause: ClientCause };
  /** The node subscribed the connection to a feed by itself (docs/sdk.md, "Feeds"); attach listeners here. */
  subscription: Subscription;
  error: MyriadError;
}

/** The client's counts of what it dropped (docs/sdk.md, "Bad input"). */
export interface Counters {
  badMessages: number;
  unknownOps: number;
  unexpectedPublications: number;
  duplicates: number;
  callbackErrors: number;
}

export interface PublishResult {
  epoch?: string;
  offset?: number;
  reached: number;
}

export interface HistoryResult extends Position {
  subject: string;
  recovered?: boolean;
  publications: Array<{ subject: string; epoch: string; offset: number; data: unknown }>;
}

/** One page of a presence subject's members, in member-id order (docs/protocol.md, "Presence"). */
export interface PresencePage {
  subject: string;
  members: Member[];
  /** The cursor of the next page; null on the last. */
  next: string | null;
}

/** A presence subject's exact counts. */
export interface PresenceStats {
  subject: string;
  connections: number;
  users: number;
}

/** A command sent or buffered, waiting for its answer. */
interface Pending {
  frame: Record<string, unknown> & { id: number };
  settle: (message: ServerMessage | undefined, error?: MyriadError) => void;
  timer?: ReturnType<typeof setTimeout>;
}

export class Client extends Emitter<ClientEvents> {
  state: ClientState = "disconnected";
  readonly counters: Counters = { badMessages: 0, unknownOps: 0, unexpectedPublications: 0, duplicates: 0, callbackErrors: 0 };

  private readonly urls: string[];
  private readonly o: Required<Omit<ClientOptions, "token" | "getToken" | "window" | "EventSource">> & Pick<ClientOptions, "getToken" | "EventSource">;
  /** Index in `o.transports` of the transport in use, and the attempts in a row on it that failed before getting through (-1: the current one got through). */
  private transport = 0;
  private unopened = 0;
  private opened = false;
  private readonly window?: WindowLike;
  /** The window said `offline`: no attempt until `online`. */
  private offline = false;
  /** An attempt is due (or waits for `online` or a visible page) and no socket is in progress. */
  private waiting = false;
  private ws?: WebSocketLike;
  /** Bumped per socket: events of an older socket are ignored. */
  private generation = 0;
  /** Index in `urls` of the last attempt. */
  private urlIndex = -1;
  /** Failed attempts of the current outage. */
  private attempt = 0;
  private nextId = 1;
  /** Reconnect pause, or the connect timeout of an attempt in progress. */
  private timer?: ReturnType<typeof setTimeout>;
  /** The watchdog's one timer (docs/sdk.md, "Heartbeat"). */
  private heartbeat?: ReturnType<typeof setTimeout>;
  /**
   * `Date.now()` when the node was last heard from. Stamped per message
   * and read only when the watchdog's timer fires: re-arming a timer per
   * message cost more than the rest of the SDK's work on it.
   */
  private heard = 0;
  private refreshTimer?: ReturnType<typeof setTimeout>;
  /** Commands sent on the current socket, by id. */
  private pending = new Map<number, Pending>();
  /** Commands issued while connecting, in order. */
  private buffer: Pending[] = [];
  private subs = new Map<string, Subscription>();
  /** Subjects unsubscribed whose `ok` has not come: their late publications are dropped silently. */
  private leaving = new Set<string>();
  private token?: string;
  /** The token was fetched for the current attempt (a refusal of it is final). */
  private tokenFresh = false;
  /** The one `getToken()` call in flight, shared. */
  private tokenCall?: Promise<string>;

  constructor(urls: string | string[], options: ClientOptions = {}) {
    super();
    this.urls = typeof urls === "string" ? [urls] : [...urls];
    if (this.urls.length === 0) throw new MyriadError("no_url", "give at least one URL");
    this.token = options.token;
    this.o = {
      timeout: 10_000,
      minReconnectDelay: 500,
      maxReconnectDelay: 20_000,
      heartbeatInterval: 20_000,
      heartbeatTimeout: 10_000,
      WebSocket: (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket!,
      random: Math.random,
      transports: ["websocket", "http_stream", "sse"],
      fetch: (globalThis as { fetch?: FetchLike }).fetch!,
      EventSource: (globalThis as { EventSource?: EventSourceConstructor }).EventSource,
      // An option given as undefined keeps its default.
      ...Object.fromEntries(Object.entries(options).filter(([, value]) => value !== undefined)),
    };
    this.caught = (error) => this.report("callback_threw", error);
    const global = globalThis as { addEventListener?: unknown; sessionStorage?: Storage };
    // What worked before, for this page's session.
    const kept = this.o.transports.indexOf(tryOr(() => global.sessionStorage?.getItem(STORED)) as Transport);
    if (kept > 0) this.transport = kept;
    this.window = options.window ?? (typeof global.addEventListener === "function" ? (globalThis as unknown as WindowLike) : undefined);
  }

  // ---- application calls

  /** Starts connecting (the first attempt at once). */
  connect(): void {
    if (this.state === "closed") throw new MyriadError("client_closed", "the client is closed");
    if (this.state !== "disconnected") return;
    if (!this.o.WebSocket) throw new MyriadError("no_websocket", "no WebSocket constructor: pass options.WebSocket");
    this.attempt = 0;
    this.offline = this.window?.navigator?.onLine === false;
    for (const [type, listener] of this.browserEvents) this.window?.addEventListener(type, listener);
    this.setState("connecting", { type: "call", method: "connect" });
    this.attemptNow();
  }

  /** Closes the connection and stops reconnecting; subscriptions are kept for the next `connect()`. */
  disconnect(): void {
    if (this.state === "disconnected" || this.state === "closed") return;
    this.stop("disconnected", { type: "call", method: "disconnect" }, new MyriadError("not_connected", "disconnected"));
  }

  /** Closes for good: every subscription is dropped, every command rejected. */
  close(): void {
    if (this.state !== "closed") this.stop("closed", { type: "call", method: "close" }, new MyriadError("client_closed", "the client is closed"));
  }

  /** Replaces the token used by the next connection (after a 4501 without `getToken`, say). */
  setToken(token: string): void {
    this.token = token;
  }

  /** Subscribes to `subject`, resuming after `since` when given. */
  subscribe(subject: string, options: { since?: Position } = {}): Subscription {
    if (this.state === "closed") throw new MyriadError("client_closed", "the client is closed");
    if (this.subs.has(subject)) throw new MyriadError("already_subscribed", `${subject} is already held`);
    const sub = new Subscription(subject, this, options.since);
    sub.caught = this.caught;
    sub.subscribe();
    return sub;
  }

  getSubscription(subject: string): Subscription | undefined {
    return this.subs.get(subject);
  }

  publish(subject: string, data: unknown): Promise<PublishResult> {
    return this.command({ op: "publish", subject, data }).then(publishResult);
  }

  /** Publishes `data` to the connection's user's feed (a connection with a token). */
  send(data: unknown): Promise<PublishResult> {
    return this.command({ op: "send", data }).then(publishResult);
  }

  history(subject: string, options: { limit?: number; since?: Position } = {}): Promise<HistoryResult> {
    return this.command({ op: "history", subject, ...options }) as unknown as Promise<HistoryResult>;
  }

  /**
   * One page of `subject`'s members: at most `limit`, those after `cursor`
   * (the previous page's `next`). Over every transport; for a member list
   * kept exact by join/leave events, see `MemberList`.
   */
  presence(subject: string, options: { cursor?: string; limit?: number } = {}): Promise<PresencePage> {
    return this.command({ op: "presence", subject, ...options }).then((m) => pageOf(subject, m));
  }

  /**
   * @internal `presence` for `MemberList`: `done` is called as the answer
   * is read, before any later message of the connection. A promise's
   * continuation would run only after every message read with it, so a
   * join read just after the page would be applied before it.
   */
  presencePage(subject: string, options: { cursor?: string; limit?: number }, done: (page?: PresencePage, error?: MyriadError) => void): void {
    this.command({ op: "presence", subject, ...options }, (m, error) => done(m && pageOf(subject, m), error)).catch(() => {});
  }

  presenceStats(subject: string): Promise<PresenceStats> {
    return this.command({ op: "presence_stats", subject }).then((m) => ({ subject, connections: Number(m.connections), users: Number(m.users) }));
  }

  // ---- the subscriptions' side (SubscriptionHost)

  /** @internal */
  attach(sub: Subscription): void {
    const held = this.subs.get(sub.subject);
    if (this.state === "closed" || (held && held !== sub)) {
      const error = this.state === "closed" ? new MyriadError("client_closed", "the client is closed") : new MyriadError("already_subscribed", `${sub.subject} is already held`);
      return sub.setState("unsubscribed", { type: "error", error });
    }
    this.subs.set(sub.subject, sub);
    if (this.state === "connected") this.sendSubscribe(sub, 0);
  }

  /** @internal */
  detach(sub: Subscription): Promise<void> {
    this.subs.delete(sub.subject);
    if (this.state !== "connected") return Promise.resolve();
    const subject = sub.subject;
    this.leaving.add(subject);
    // Never rejects: whatever ends the wait (the ok, a lost connection, the
    // timeout), the client no longer holds the subject.
    const done = () => void this.leaving.delete(subject);
    return this.command({ op: "unsubscribe", subject }).then(done, done);
  }

  /** @internal */
  duplicate(): void {
    this.counters.duplicates++;
  }

  // ---- connection

  private setState(state: ClientState, cause: ClientCause): void {
    const previous = this.state;
    if (previous === state) return;
    this.state = state;
    this.emit("state", { state, previous, cause });
  }

  /** One attempt: a token if one is needed, a socket, `connect` if there is a token. */
  private async open(): Promise<void> {
    const generation = ++this.generation;
    this.urlIndex = (this.urlIndex + 1) % this.urls.length;
    const url = this.urls[this.urlIndex]!;
    this.timer = setTimeout(() => this.lost(generation, { type: "timeout" }), this.o.timeout);
    this.tokenFresh = false;
    if (this.o.getToken && (!this.token || expiresSoon(this.token))) {
      try {
        this.token = await this.fetchToken();
        this.tokenFresh = true;
      } catch (error) {
        if (generation === this.generation) this.tokenFailed(generation, error);
        return;
      }
      if (generation !== this.generation) return;
    }
    let ws: WebSocketLike;
    const kind = this.o.transports[this.transport]!;
    this.opened = false;
    if (this.unopened < 0) this.unopened = 0;
    try {
      ws = kind === "websocket" ? new this.o.WebSocket(url) : new HttpLink(url, kind, this.o.fetch, this.o.EventSource);
    } catch (error) {
      this.lost(generation, { type: "close", code: 1006, reason: String(error) });
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      this.opened = kind === "websocket";
      this.gotThrough();
      this.token ? this.authenticate(generation, url) : this.established(generation, url);
    };
    ws.onmessage = (event: { data: unknown }) => generation === this.generation && this.receive(event.data);
    ws.onclose = (event: { code?: number; reason?: string }) =>
      this.lost(generation, { type: "close", code: event.code ?? 1006, reason: event.reason ?? "" });
    ws.onerror = () => {}; // a close follows
  }

  /** Sends `connect` with the token; `connected` on its `ok`. */
  private authenticate(generation: number, url: string): void {
    if (generation !== this.generation) return;
    const frame = { op: "connect", token: this.token, id: this.nextId++ };
    this.pending.set(frame.id, {
      frame,
      settle: (_message, error) => {
        if (generation !== this.generation) return;
        if (!error) return this.established(generation, url);
        // A refusal of these credentials is final for them; any other
        // answer (proxy_unavailable, proxy_busy, rate_limited…) is an
        // attempt that failed: back off and try again.
        if (!CREDENTIALS_REFUSED.has(error.code)) return this.lost(generation, { type: "token", error });
        if (!this.tokenFresh && this.o.getToken) {
          this.token = undefined;
          this.fetchToken().then(
            (token) => {
              if (generation !== this.generation) return;
              this.token = token;
              this.tokenFresh = true;
              this.authenticate(generation, url);
            },
            (e) => generation === this.generation && this.tokenFailed(generation, e),
          );
        } else {
          this.token = undefined;
          this.stop("closed", { type: "token", error: new UnauthorizedError(error.message, error.code) }, new MyriadError("client_closed", "the token was refused"));
        }
      },
    });
    this.transmit(frame);
  }

  private tokenFailed(generation: number, error: unknown): void {
    if (error instanceof UnauthorizedError) {
      this.stop("closed", { type: "token", error }, new MyriadError("client_closed", "this user may not connect"));
    } else {
      this.lost(generation, { type: "token", error: asError("token_failed", error) });
    }
  }

  private fetchToken(): Promise<string> {
    return (this.tokenCall ??= Promise.resolve()
      .then(() => this.o.getToken!())
      .then(
        (token) => {
          this.tokenCall = undefined;
          if (typeof token !== "string" || !token) throw new MyriadError("token_failed", "getToken gave no token");
          return token;
        },
        (error) => {
          this.tokenCall = undefined;
          throw error;
        },
      ));
  }

  private established(generation: number, url: string): void {
    if (generation !== this.generation || this.state !== "connecting") return;
    clearTimeout(this.timer);
    this.attempt = 0;
    this.setState("connected", { type: "open", url });
    this.watch();
    this.scheduleRefresh();
    for (const sub of this.subs.values()) if (sub.state === "subscribing" && !sub.server) this.sendSubscribe(sub, 0);
    for (const p of this.buffer.splice(0)) this.sendPending(p);
  }

  /**
   * The current socket is gone (or must go) for `cause`: reconnect, or stop
   * when the close code says not to reconnect unchanged.
   */
  private lost(generation: number, cause: ClientCause): void {
    if (generation !== this.generation || (this.state !== "connecting" && this.state !== "connected")) return;
    if (!this.gotThrough() && ++this.unopened >= 2 && this.transport + 1 < this.o.transports.length) {
      // Two attempts in a row that never got through: the next transport.
      this.transport++;
      this.unopened = 0;
    }
    this.drop(new MyriadError("connection_lost", "the connection was lost before the answer"), cause);
    if (cause.type === "close" && cause.code === TOKEN_EXPIRED) {
      this.token = undefined;
      if (!this.o.getToken) return this.halt(cause);
    } else if (cause.type === "close" && !mayReconnect(cause.code)) {
      return this.halt(cause);
    }
    this.setState("connecting", cause);
    const delay = backoff(++this.attempt, this.o.minReconnectDelay, this.o.maxReconnectDelay, this.o.random);
    this.emit("retry", { attempt: this.attempt, delay, url: this.urls[(this.urlIndex + 1) % this.urls.length]!, cause });
    this.waiting = true;
    this.timer = setTimeout(() => this.attemptNow(), delay);
  }

  /** Opens a socket now, unless the browser is offline or the page hidden: then when that ends. */
  private attemptNow(): void {
    this.waiting = this.offline || this.window?.document?.visibilityState === "hidden";
    if (!this.waiting) void this.open();
  }

  /** The window's events, as [type, listener]; added on `connect()`, removed on stopping. */
  private readonly browserEvents: Array<[string, () => void]> = [
    [
      "offline",
      () => {
        this.offline = true;
        if (!this.waiting) this.lost(this.generation, { type: "close", code: 1006, reason: "offline" });
      },
    ],
    [
      "online",
      () => {
        this.offline = false;
        this.attempt = 0;
        this.resume();
      },
    ],
    ["visibilitychange", () => this.window?.document?.visibilityState !== "hidden" && this.resume()],
  ];

  /** A due or pending attempt goes at once. */
  private resume(): void {
    if (this.state !== "connecting" || !this.waiting) return;
    clearTimeout(this.timer);
    this.attemptNow();
  }

  /** To `disconnected` for a close that says not to reconnect unchanged. */
  private halt(cause: ClientCause): void {
    this.stop("disconnected", cause, new MyriadError("not_connected", "disconnected"));
  }

  /** Ends the socket and every timer; subscriptions go back to `subscribing`. */
  private drop(error: MyriadError, cause: ClientCause): void {
    this.generation++;
    for (const t of [this.timer, this.heartbeat, this.refreshTimer]) clearTimeout(t);
    const ws = this.ws;
    this.ws = undefined;
    if (ws) {
      ws.onopen = ws.onmessage = ws.onclose = null;
      try {
        ws.close(1000);
      } catch {
        // closing a socket that never opened may throw; it is gone either way
      }
    }
    const pending = [...this.pending.values()];
    this.pending.clear();
    this.leaving.clear();
    for (const p of pending) p.settle(undefined, error);
    for (const sub of this.subs.values()) if (sub.state === "subscribed") sub.setState("subscribing", { type: "client", cause });
  }

  /** To `disconnected` or `closed`: no socket, no attempt, buffered commands rejected. */
  private stop(state: "disconnected" | "closed", cause: ClientCause, error: MyriadError): void {
    this.drop(error, cause);
    this.waiting = false;
    for (const [type, listener] of this.browserEvents) this.window?.removeEventListener(type, listener);
    for (const p of this.buffer.splice(0)) p.settle(undefined, error);
    this.setState(state, cause);
    if (state === "closed") {
      for (const sub of [...this.subs.values()]) sub.setState("unsubscribed", { type: "client", cause });
      this.subs.clear();
    }
  }

  /**
   * The heartbeat watchdog: one timer, due when `heartbeatInterval` has
   * passed since `heard`; when it fires early (the node spoke meanwhile)
   * it waits out the rest, else it pings and gives up after
   * `heartbeatTimeout` more of silence.
   */
  private watch(): void {
    const generation = this.generation;
    this.heard = Date.now();
    const check = (): void => {
      const silent = Date.now() - this.heard;
      if (silent < this.o.heartbeatInterval) {
        this.heartbeat = setTimeout(check, this.o.heartbeatInterval - silent);
        return;
      }
      const id = this.nextId++;
      this.pending.set(id, { frame: { op: "ping", id }, settle: () => {} });
      this.transmit({ op: "ping", id });
      const pinged = Date.now();
      this.heartbeat = setTimeout(() => (this.heard >= pinged ? check() : this.lost(generation, { type: "heartbeat" })), this.o.heartbeatTimeout);
    };
    this.heartbeat = setTimeout(check, this.o.heartbeatInterval);
  }

  private scheduleRefresh(): void {
    const exp = this.token && this.o.getToken ? tokenExp(this.token) : undefined;
    if (exp === undefined) return;
    const generation = this.generation;
    this.refreshTimer = setTimeout(
      () => {
        this.fetchToken()
          .then((token) => {
            if (generation !== this.generation) return;
            return this.command({ op: "refresh", token }).then(() => {
              if (generation !== this.generation) return;
              this.token = token;
              this.scheduleRefresh();
            });
          })
          .catch((error) => {
            if (error instanceof UnauthorizedError) return this.tokenFailed(generation, error);
            if (generation === this.generation) this.report("refresh_failed", error);
          });
      },
      Math.min(refreshDelay(exp, Date.now()), 2 ** 31 - 1),
    );
  }

  // ---- commands

  /** Sends `frame` with an id, buffered while connecting; settles on its answer or its timeout. */
  private command(frame: Record<string, unknown>, then?: (message?: Record<string, unknown>, error?: MyriadError) => void): Promise<Record<string, unknown>> {
    if (this.state === "closed") return Promise.reject(new MyriadError("client_closed", "the client is closed"));
    if (this.state === "disconnected") return Promise.reject(new MyriadError("not_connected", "call connect() first"));
    return new Promise((resolve, reject) => {
      const p: Pending = {
        frame: { ...frame, id: this.nextId++ },
        settle: (message, error) => {
          clearTimeout(p.timer);
          this.buffer = this.buffer.filter((b) => b !== p);
          then?.(message as Record<string, unknown> | undefined, error);
          error ? reject(error) : resolve(message as Record<string, unknown>);
        },
      };
      p.timer = setTimeout(() => {
        this.pending.delete(p.frame.id);
        p.settle(undefined, new TimeoutError(String(frame.op)));
      }, this.o.timeout);
      if (this.state === "connected") this.sendPending(p);
      else this.buffer.push(p);
    });
  }

  private sendPending(p: Pending): void {
    this.pending.set(p.frame.id, p);
    this.transmit(p.frame);
  }

  /** A subscribe for `sub`, resuming from its position; retried on a passing refusal or no answer. */
  private sendSubscribe(sub: Subscription, tries: number): void {
    const generation = this.generation;
    const frame = { op: "subscribe", subject: sub.subject, id: this.nextId++, ...(sub.position ? { since: sub.position } : {}) };
    const retry = () => {
      if (generation !== this.generation || this.subs.get(sub.subject) !== sub || sub.state !== "subscribing") return;
      const delay = backoff(tries + 1, this.o.minReconnectDelay, this.o.maxReconnectDelay, this.o.random);
      setTimeout(() => generation === this.generation && sub.state === "subscribing" && this.sendSubscribe(sub, tries + 1), delay);
    };
    const p: Pending = {
      frame,
      settle: (_message, error) => {
        clearTimeout(p.timer);
        if (!error || generation !== this.generation) return;
        if (SUBSCRIBE_AGAIN.has(error.code)) return retry();
        if (this.subs.get(sub.subject) === sub) this.subs.delete(sub.subject);
        sub.setState("unsubscribed", { type: "error", error });
      },
    };
    p.timer = setTimeout(() => {
      if (this.pending.delete(frame.id)) p.settle(undefined, new TimeoutError("subscribe"));
    }, this.o.timeout);
    this.sendPending(p);
  }

  private transmit(frame: Record<string, unknown>): void {
    try {
      this.ws?.send(JSON.stringify(frame));
    } catch {
      // the socket is closing; its close event follows
    }
  }

  // ---- what the node says

  /** Whether the current attempt got through; the first time it has, the transport is remembered. */
  private gotThrough(): boolean {
    if (this.unopened < 0) return true;
    if (!this.opened && !(this.ws as HttpLink | undefined)?.heard) return false;
    this.unopened = -1; // until the next attempt
    tryOr(() => (globalThis as { sessionStorage?: Storage }).sessionStorage?.setItem(STORED, this.o.transports[this.transport]!));
    return true;
  }

  private receive(text: unknown): void {
    this.heard = Date.now();
    this.gotThrough();
    const message = parseServerMessage(text);
    if (typeof message !== "object") {
      if (message !== undefined && !KNOWN_OPS.includes(message)) {
        this.counters.unknownOps++;
        return this.report("unknown_op", `unknown op ${JSON.stringify(message)}`);
      }
      this.counters.badMessages++;
      return this.report("bad_message", `malformed message from the node: ${String(text).slice(0, 100)}`);
    }
    switch (message.op) {
      case "msg": {
        const sub = this.subs.get(message.subject);
        if (sub?.deliver(message)) return;
        if (this.leaving.has(message.subject)) return;
        this.counters.unexpectedPublications++;
        return this.report("unexpected_publication", `a publication for ${message.subject}, which the client does not hold`);
      }
      case "join":
      case "leave":
        // Events of a subject no longer held (or being left) are dropped.
        return void this.subs.get(message.subject)?.presenceEvent(message.op, message);
      case "subscribed": {
        const sub = this.subs.get(message.subject);
        const p = message.id !== undefined ? this.pending.get(message.id) : undefined;
        if (p && p.frame.op === "subscribe" && p.frame.subject === message.subject) {
          this.pending.delete(message.id!);
          p.settle(message);
        }
        if (sub) return sub.subscribed(message, message.recovered, p !== undefined);
        if (this.leaving.has(message.subject)) return;
        if (message.id === undefined) return this.feed(message.subject, message);
        this.counters.unexpectedPublications++;
        return this.report("unexpected_publication", `subscribed to ${message.subject}, which the client did not ask for`);
      }
      default: {
        const p = message.id !== undefined ? this.pending.get(message.id) : undefined;
        if (p) {
          this.pending.delete(message.id!);
          if (message.op === "error") p.settle(undefined, serverError(message));
          else p.settle(message);
        } else if (message.op === "error") {
          this.emit("error", serverError(message));
        } else if (message.id === undefined || message.id >= this.nextId) {
          this.counters.badMessages++;
          this.report("bad_message", `an answer to no command: ${String(text).slice(0, 100)}`);
        } // else: the late answer to a command that timed out
      }
    }
  }

  /** A subscription the node made by itself: held like any, announced with `subscription`. */
  private feed(subject: string, position: Position): void {
    const sub = new Subscription(subject, this, undefined, true);
    sub.caught = this.caught;
    sub.state = "subscribing";
    this.subs.set(subject, sub);
    this.emit("subscription", sub);
    sub.subscribed(position, undefined, false);
  }

  /** The `error` event; a listener of it that throws is counted and dropped. */
  private report(code: string, detail: unknown): void {
    if (code === "callback_threw") this.counters.callbackErrors++;
    const error = asError(code, detail);
    const caught = this.caught;
    this.caught = () => void this.counters.callbackErrors++;
    try {
      this.emit("error", error);
    } finally {
      this.caught = caught;
    }
  }
}

/** `detail` as an error of `code`, the original kept as its `cause`. */
function asError(code: string, detail: unknown): MyriadError {
  if (detail instanceof MyriadError && detail.code === code) return detail;
  const error = new MyriadError(code, detail instanceof Error ? detail.message : String(detail));
  if (detail instanceof Error) (error as { cause?: unknown }).cause = detail;
  return error;
}

function pageOf(subject: string, m: Record<string, unknown>): PresencePage {
  return { subject, members: (m.members as Member[]) ?? [], next: (m.next as string | null) ?? null };
}

function publishResult(m: Record<string, unknown>): PublishResult {
  return { epoch: m.epoch as string | undefined, offset: m.offset as number | undefined, reached: (m.reached as number) ?? 0 };
}

const STORED = "myriad.transport";

function tryOr<T>(f: () => T): T | undefined {
  try {
    return f();
  } catch {
    return undefined; // sessionStorage may be denied
  }
}

/** Whether a token runs out within a second (or has run out). */
function expiresSoon(token: string): boolean {
  const exp = tokenExp(token);
  return exp !== undefined && exp * 1000 - Date.now() < 1000;
}
