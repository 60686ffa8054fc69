/**
 * The HTTP fallback as a WebSocket-shaped link (docs/sdk.md, "Transports
 * and fallback"): the client sends it the protocol v1 commands it would
 * send a WebSocket and hears the same replies. Subjects are received on
 * one stream (`/stream` read with `fetch`, or `/sse` with EventSource),
 * reopened with every subject and a cursor of their positions whenever
 * the subject list changes, so each resumes where it was; `publish`,
 * `send` and `history` are posted to `/cmd` with the token in
 * `Authorization`. The endpoints sit beside the WebSocket path
 * (`…/ws` → `…/stream`, `…/sse`, `…/cmd`).
 */

import type { WebSocketLike } from "./client.js";

export type Transport = "websocket" | "http_stream" | "sse";
type Frame = Record<string, any>;
type Pos = { epoch: string; offset: number };

export interface EventSourceLike {
  onmessage: ((event: { data: string }) => void) | null;
  onerror: ((event: unknown) => void) | null;
  addEventListener(type: string, listener: (event: { data: string }) => void): void;
  close(): void;
}
export type EventSourceConstructor = new (url: string) => EventSourceLike;
export type FetchLike = (url: string, init?: any) => Promise<any>;

export class HttpLink implements WebSocketLike {
  onopen: ((event: any) => void) | null = null;
  onmessage: ((event: any) => void) | null = null;
  onclose: ((event: any) => void) | null = null;
  onerror: ((event: any) => void) | null = null;
  private token?: string;
  /** Subjects in stream order, with the last position seen of each. */
  private subjects = new Map<string, Pos | undefined>();
  /** Subscribes waiting for their subject's `subscribed` line, by subject. */
  private asked = new Map<string, number>();
  private stream?: { close(): void };
  private due = false;
  private open = false;
  private done = false;
  /** The stream has carried something: the transport works here. */
  heard = false;

  constructor(
    private readonly url: string,
    private readonly kind: Transport,
    /** Called as a plain function, never as `this.fetch(…)`: a browser's fetch throws "Illegal invocation" when its `this` is not the window. */
    private readonly fetch: FetchLike,
    private readonly EventSource?: EventSourceConstructor,
  ) {
    // Nothing to open until a subject is asked for: the link is usable now.
    setTimeout(() => !this.done && ((this.open = true), this.onopen?.({})), 0);
  }

  private endpoint(name: string): string {
    const u = new URL(this.url);
    u.protocol = u.protocol === "wss:" ? "https:" : "http:";
    u.pathname = u.pathname.replace(/[^/]*$/, name);
    u.search = "";
    return u.toString();
  }

  private hear(message: Frame): void {
    if (this.done) return;
    if (message.op === "subscribed" || message.op === "msg") {
      if (this.subjects.has(message.subject)) this.subjects.set(message.subject, { epoch: message.epoch, offset: message.offset });
      const id = message.op === "subscribed" ? this.asked.get(message.subject) : undefined;
      if (id !== undefined) {
        this.asked.delete(message.subject);
        message = { ...message, id };
      }
    }
    if (message.op === "close") return this.close(message.code ?? 1006, message.reason ?? "");
    this.onmessage?.({ data: JSON.stringify(message) });
  }

  send(text: string): void {
    const frame: Frame = JSON.parse(text);
    const reply = (m: Frame) => void setTimeout(() => this.hear({ id: frame.id, ...m }), 0);
    switch (frame.op) {
      case "connect":
      case "refresh":
        this.token = frame.token;
        return reply({ op: "ok" });
      case "ping":
        return reply({ op: "pong" });
      case "subscribe":
        for (const s of frame.subjects ?? [frame.subject]) {
          if (!this.subjects.has(s)) this.subjects.set(s, frame.since);
          this.asked.set(s, frame.id);
        }
        return this.reopen();
      case "unsubscribe":
        for (const s of frame.subjects ?? [frame.subject]) this.subjects.delete(s);
        reply({ op: "ok" });
        return this.reopen();
      default:
        this.post(frame);
    }
  }

  private post(frame: Frame): void {
    const headers: Record<string, string> = { "Content-Type": "application/json" };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    const fetch = this.fetch;
    fetch(this.endpoint("cmd"), { method: "POST", headers, body: JSON.stringify(frame) })
      .then((r: any) => r.json())
      .then(
        (m: Frame) => this.hear(m.error ? { op: "error", id: frame.id, ...m.error } : m),
        (e: unknown) => this.hear({ op: "error", id: frame.id, code: "unavailable", message: String(e) }),
      );
  }

  /** Reopens the stream after this turn's subject changes, each from its position. */
  private reopen(): void {
    if (this.due || this.done) return;
    this.due = true;
    setTimeout(() => {
      this.due = false;
      if (this.done) return;
      this.stream?.close();
      this.stream = undefined;
      if (this.subjects.size === 0) return;
      const q = new URLSearchParams();
      for (const s of this.subjects.keys()) q.append("subject", s);
      const cursor = [...this.subjects.values()].map((p) => (p ? `${p.epoch}:${p.offset}` : "")).join(",");
      if (cursor.replace(/,/g, "")) q.append("since", cursor);
      if (this.kind === "sse") {
        if (this.token) q.append("token", this.token);
        const es = new this.EventSource!(`${this.endpoint("sse")}?${q}`);
        const on = (e: { data: string }) => ((this.heard = true), this.hear(JSON.parse(e.data)));
        es.onmessage = on;
        for (const t of ["subscribed", "close"]) es.addEventListener(t, on);
        // EventSource would retry by itself from its own Last-Event-ID; the
        // client reconnects instead, from the positions it holds.
        es.onerror = () => this.close(1006, "stream lost");
        this.stream = es;
      } else this.read(`${this.endpoint("stream")}?${q}`);
    }, 0);
  }

  private read(url: string): void {
    const abort = new AbortController();
    this.stream = { close: () => abort.abort() };
    const headers: Record<string, string> = this.token ? { Authorization: `Bearer ${this.token}` } : {};
    // A stream aborted here was replaced: only a stream lost otherwise ends the link.
    const lost = (reason: string) => abort.signal.aborted || this.close(1006, reason);
    const fetch = this.fetch;
    fetch(url, { headers, signal: abort.signal })
      .then(async (r: any) => {
        if (!r.ok) {
          const body = await r.json().catch(() => ({}));
          return this.refused(r.status, body.error ?? {});
        }
        const reader = r.body.getReader();
        const decoder = new TextDecoder();
        let text = "";
        for (;;) {
          const { done, value } = await reader.read();
          if (done) return lost("stream ended");
          text += decoder.decode(value, { stream: true });
          const lines = text.split("\n");
          text = lines.pop()!;
          for (const line of lines) {
            if (!line.trim()) continue;
            this.heard = true;
            this.hear(JSON.parse(line));
          }
        }
      })
      .catch((e: unknown) => lost(String(e)));
  }

  /** The stream was refused: a token refusal ends the link as the node's close would; otherwise the subscribes waiting are refused. */
  private refused(status: number, error: Frame): void {
    if (status === 401) return this.close(4501, error.message ?? "invalid token");
    if (this.asked.size === 0 || status >= 500 || status === 429) return this.close(1006, `stream refused: ${status}`);
    for (const [s, id] of this.asked) {
      this.subjects.delete(s);
      this.hear({ op: "error", id, code: error.code ?? "unavailable", message: error.message ?? "" });
    }
    this.asked.clear();
    this.reopen();
  }

  close(code = 1000, reason = ""): void {
    if (this.done) return;
    this.done = true;
    this.stream?.close();
    if (this.open) setTimeout(() => this.onclose?.({ code, reason }), 0);
  }
}
