/**
 * Fallback against the real node (MYRIAD_BIN) through a loopback HTTP
 * proxy that refuses every WebSocket upgrade (403) but passes plain HTTP,
 * and cuts each stream after a few hundred lines: the client falls back
 * to HTTP streaming (or SSE when told to skip it), receives every
 * publication exactly once and in order across the cuts, and publishes,
 * sends and reads history through POST /cmd. Counts and order only.
 */

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Client } from "../../src/client.js";
import type { EventSourceLike } from "../../src/http.js";
import { hs256, HttpProxy, publish, startNode, until, WS, type Node } from "./harness.js";

const cleanup: Array<() => Promise<void> | void> = [];
after(async () => {
  for (const f of cleanup.reverse()) await f();
});

/** A minimal EventSource over fetch for Node (test-only): events, `id:`, no retry of its own. */
class FetchEventSource implements EventSourceLike {
  onmessage: ((event: { data: string }) => void) | null = null;
  onerror: ((event: unknown) => void) | null = null;
  private listeners = new Map<string, (event: { data: string }) => void>();
  private abort = new AbortController();

  constructor(url: string) {
    fetch(url, { signal: this.abort.signal, headers: { Accept: "text/event-stream" } })
      .then(async (r) => {
        if (!r.ok || !r.body) throw new Error(`status ${r.status}`);
        const reader = r.body.getReader();
        const decoder = new TextDecoder();
        let text = "";
        for (;;) {
          const { done, value } = await reader.read();
          if (done) throw new Error("ended");
          text += decoder.decode(value, { stream: true });
          let end;
          while ((end = text.indexOf("\n\n")) >= 0) {
            const block = text.slice(0, end);
            text = text.slice(end + 2);
            let type = "message";
            const data: string[] = [];
            for (const line of block.split("\n")) {
              if (line.startsWith("event:")) type = line.slice(6).trim();
              else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
            }
            if (data.length === 0) continue;
            const event = { data: data.join("\n") };
            if (type === "message") this.onmessage?.(event);
            else this.listeners.get(type)?.(event);
          }
        }
      })
      .catch((e) => !this.abort.signal.aborted && this.onerror?.(e));
  }

  addEventListener(type: string, listener: (event: { data: string }) => void): void {
    this.listeners.set(type, listener);
  }

  close(): void {
    this.abort.abort();
  }
}

async function setup(): Promise<{ n: Node; proxy: HttpProxy; url: string }> {
  const n = await startNode(["--history-size", "10000"]);
  cleanup.push(() => n.kill());
  const proxy = new HttpProxy(n.ws, 300);
  cleanup.push(() => proxy.close());
  return { n, proxy, url: await proxy.listen() };
}

for (const transports of [
  ["websocket", "http_stream", "sse"],
  ["websocket", "sse"],
] as const) {
  test(`WebSocket refused: falls back to ${transports[1]}, nothing lost or repeated across cuts, commands posted`, async () => {
    const { n, proxy, url } = await setup();
    const c = new Client(url, {
      WebSocket: WS,
      transports: [...transports],
      EventSource: FetchEventSource,
      minReconnectDelay: 20,
      maxReconnectDelay: 200,
    });
    cleanup.push(() => c.close());
    c.connect();
    const a = c.subscribe("a");
    const got: number[] = [];
    const holes: unknown[] = [];
    a.on("publication", (p) => got.push(p.data as number));
    a.on("discontinuity", (d) => holes.push(d));
    await a.ready();
    assert.ok(proxy.upgradesRefused >= 2, `${proxy.upgradesRefused} upgrades refused`);

    // Publishing goes on while the proxy cuts the stream every 300 lines.
    const total = 2000;
    // At most 600 ahead of the subscriber, so the replay after a cut fits.
    for (let i = 0; i < total; i += 100) {
      await until("the subscriber to keep up", () => got.length + 600 >= i, 30_000);
      await publish(
        n,
        Array.from({ length: 100 }, (_, k) => ({ subject: "a", data: i + k })),
      );
    }
    await until(`${total} publications`, () => got.length >= total, 30_000).catch((e) => {
      throw new Error(`${e.message}: got ${got.length}, last ${got.at(-1)}, cuts ${proxy.cuts}, state ${c.state}/${a.state}, ${JSON.stringify(c.counters)}`);
    });
    assert.deepEqual(got, Array.from({ length: total }, (_, i) => i));
    assert.ok(proxy.cuts >= 3, `${proxy.cuts} cuts`);
    assert.deepEqual(holes, []);
    assert.equal(c.counters.duplicates, 0);

    // Commands over POST /cmd, the cuts over: a command whose answer a
    // cut loses is rejected with connection_lost (docs/sdk.md), which
    // would make what follows a race with the proxy. A cut made before
    // this line ends a stream that no longer carries anything new, so a
    // publication received after it came on a stream that stays.
    proxy.cutEvery = Infinity;
    await publish(n, [{ subject: "a", data: "quiet" }]);
    await until("the stream after the cuts", () => got.length === total + 1);
    const result = await c.publish("a", "posted");
    assert.equal(result.offset, total + 2);
    await until("the posted one", () => got.length === total + 2);
    const history = await c.history("a", { limit: 3 });
    assert.deepEqual(
      history.publications.map((p) => p.data),
      [total - 1, "quiet", "posted"],
    );
    // A second subject: the stream reopens with both, `a` from its position.
    const b = c.subscribe("b");
    const gotB: unknown[] = [];
    b.on("publication", (p) => gotB.push(p.data));
    await b.ready();
    await c.publish("a", "after");
    await c.publish("b", "b1");
    await until("both", () => got.length === total + 3 && gotB.length === 1);
    assert.equal(got[total + 2], "after");
    await assert.rejects(c.publish("@1", 1), (e: { code?: string }) => e.code === "reserved_subject");
  });
}

test("with a token: the stream and the posted commands carry it, grants decide, send reaches the feed", async () => {
  const secret = "f".repeat(32);
  const n = await startNode(["--token-hmac-secret", secret]);
  cleanup.push(() => n.kill());
  const proxy = new HttpProxy(n.ws, 1_000_000);
  cleanup.push(() => proxy.close());
  const token = hs256(secret, { sub: "7", exp: Math.floor(Date.now() / 1000) + 60, subscribe: ["chat.*", "@7"], publish: ["chat.room"] });
  const c = new Client(await proxy.listen(), { WebSocket: WS, token, minReconnectDelay: 20, maxReconnectDelay: 200 });
  cleanup.push(() => c.close());
  c.connect();
  const room = c.subscribe("chat.room");
  const feed = c.subscribe("@7");
  const got: unknown[] = [];
  room.on("publication", (p) => got.push(p.data));
  feed.on("publication", (p) => got.push(p.data));
  await Promise.all([room.ready(), feed.ready()]);
  assert.ok(proxy.upgradesRefused >= 2);
  await c.publish("chat.room", "hello");
  await c.send("to my followers");
  await until("both", () => got.length === 2);
  assert.deepEqual(got.sort(), ["hello", "to my followers"]);
  await assert.rejects(c.publish("chat.other", 1), (e: { code?: string }) => e.code === "forbidden");
  // A subject the token does not grant: the stream refuses it, the rest stay.
  const secretRoom = c.subscribe("secret");
  await until("refused", () => secretRoom.state === "unsubscribed");
  await c.publish("chat.room", "still here");
  await until("three", () => got.length === 3);
});

test("a subscription moved from WebSocket to HTTP streaming resumes from its position", async () => {
  const { n, proxy, url } = await setup();
  proxy.passUpgrades = true;
  const c = new Client(url, { WebSocket: WS, minReconnectDelay: 20, maxReconnectDelay: 200 });
  cleanup.push(() => c.close());
  c.connect();
  const a = c.subscribe("a");
  const got: number[] = [];
  const holes: unknown[] = [];
  a.on("publication", (p) => got.push(p.data as number));
  a.on("discontinuity", (d) => holes.push(d));
  await a.ready();
  await publish(n, Array.from({ length: 100 }, (_, i) => ({ subject: "a", data: i })));
  await until("100 over WebSocket", () => got.length === 100);
  assert.equal(proxy.upgradesRefused, 0);
  // From now on the proxy refuses upgrades; what is published meanwhile
  // comes on the stream, replayed from the position the WebSocket reached.
  proxy.passUpgrades = false;
  proxy.cut();
  await publish(n, Array.from({ length: 100 }, (_, i) => ({ subject: "a", data: 100 + i })));
  await until("200 in all", () => got.length === 200);
  assert.ok(proxy.upgradesRefused >= 2);
  assert.deepEqual(got, Array.from({ length: 200 }, (_, i) => i));
  assert.deepEqual(holes, []);
  assert.equal((await c.publish("a", "posted")).offset, 201);
});
