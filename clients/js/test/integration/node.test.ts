/**
 * The client against the real node (MYRIAD_BIN): a round trip, a
 * connection cut again and again while publishing goes on, a node
 * restart, a refused token, and a token refreshed past its `exp`. Every
 * wait is bounded; every assertion is on counts and order, not on time.
 */

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Client } from "../../src/client.js";
import type { MyriadError } from "../../src/errors.js";
import type { Discontinuity } from "../../src/subscription.js";
import { hs256, Proxy, publish, startNode, until, WS, type Node } from "./harness.js";

const cleanup: Array<() => Promise<void> | void> = [];
after(async () => {
  for (const f of cleanup.reverse()) await f();
});

async function node(extra: string[] = []): Promise<Node> {
  const n = await startNode(extra);
  cleanup.push(() => n.kill());
  return n;
}

function client(urls: string | string[], options: ConstructorParameters<typeof Client>[1] = {}): Client {
  const c = new Client(urls, { WebSocket: WS, minReconnectDelay: 50, maxReconnectDelay: 500, ...options });
  cleanup.push(() => c.close());
  return c;
}

test("subscribe, publish over the client and over the HTTP API, receive both", async () => {
  const n = await node();
  const c = client(n.url);
  const errors: MyriadError[] = [];
  c.on("error", (e) => errors.push(e));
  c.connect();
  const sub = c.subscribe("news");
  const got: unknown[] = [];
  sub.on("publication", (p) => got.push(p.data));
  await sub.ready();
  const result = await c.publish("news", { headline: "hi" });
  assert.equal(result.offset, 1);
  assert.equal(result.reached, 1);
  await publish(n, [{ subject: "news", data: "from the API" }]);
  await until("two publications", () => got.length === 2);
  assert.deepEqual(got, [{ headline: "hi" }, "from the API"]);
  assert.deepEqual(sub.position, { epoch: result.epoch, offset: 2 });
  const history = await c.history("news", { limit: 10 });
  assert.equal(history.publications.length, 2);
  const after = await c.history("news", { since: { epoch: result.epoch!, offset: 1 } });
  assert.deepEqual(
    after.publications.map((p) => p.data),
    ["from the API"],
  );
  assert.equal(after.recovered, true);
  assert.deepEqual(errors, []);
});

test("cut every few hundred publications while publishing goes on: each exactly once, in order", async () => {
  const total = 4000;
  const n = await node(["--history-size", "10000", "--max-outbound-bytes", "16777216"]);
  const proxy = new Proxy(n.ws);
  cleanup.push(() => proxy.close());
  const c = client(await proxy.listen());
  c.connect();
  const sub = c.subscribe("firehose");
  const offsets: number[] = [];
  const holes: Discontinuity[] = [];
  // Cut once per connection, 250 publications after the last cut: what
  // the client had already read from a cut socket may still come in (so
  // the last cut may need no new connection).
  let cuts = 0;
  let nextCut = 250;
  let cutConnection = 0;
  sub.on("discontinuity", (d) => holes.push(d));
  sub.on("publication", (p) => {
    offsets.push(p.offset);
    if (offsets.length >= nextCut && offsets.length < total && c.state === "connected" && cutConnection !== proxy.accepted) {
      cuts++;
      nextCut = offsets.length + 250;
      cutConnection = proxy.accepted;
      setImmediate(() => proxy.cut());
    }
  });
  await sub.ready();
  let sent = 0;
  // Publish in batches of 50 without waiting for the subscriber, but at
  // most 1000 ahead of it, so that the replay after a cut always fits.
  for (; sent < total; sent += 50) {
    await until("the subscriber to keep up", () => offsets.length + 1000 >= sent, 30_000);
    await publish(
      n,
      Array.from({ length: 50 }, (_, i) => ({ subject: "firehose", data: sent + i })),
    );
  }
  await until(`${total} publications`, () => offsets.length >= total, 30_000);
  assert.equal(offsets.length, total);
  assert.ok(
    offsets.every((o, i) => o === i + 1),
    "every offset once, in order",
  );
  assert.deepEqual(holes, []);
  assert.ok(cuts >= 5, `${cuts} cuts`);
  assert.ok(proxy.accepted >= cuts, `${proxy.accepted} connections for ${cuts} cuts`);
  assert.equal(c.counters.badMessages + c.counters.unexpectedPublications, 0);
});

test("a node restart fires one discontinuity with the new position, then delivery goes on", async () => {
  let first = await startNode();
  const proxy = new Proxy(first.ws);
  cleanup.push(() => proxy.close());
  const c = client(await proxy.listen());
  c.connect();
  const sub = c.subscribe("restart");
  const got: Array<{ epoch: string; offset: number }> = [];
  const holes: Discontinuity[] = [];
  sub.on("publication", (p) => got.push({ epoch: p.epoch, offset: p.offset }));
  sub.on("discontinuity", (d) => holes.push(d));
  await sub.ready();
  const [, , last] = await publish(first, [1, 2, 3].map((data) => ({ subject: "restart", data })));
  await until("three publications", () => got.length === 3);
  await first.kill();
  const second = await node();
  proxy.target = second.ws;
  await until("the resubscribe on the new node", () => holes.length === 1 && sub.state === "subscribed");
  const [next] = await publish(second, [{ subject: "restart", data: 4 }]);
  await until("the publication on the new node", () => got.length === 4);
  assert.equal(holes.length, 1);
  const hole = holes[0]!;
  assert.equal(hole.cause, "not_recovered");
  assert.deepEqual(hole.previous, { epoch: last!.epoch, offset: 3 });
  assert.notEqual(hole.position.epoch, last!.epoch);
  assert.deepEqual(hole.position, { epoch: next!.epoch, offset: next!.offset - 1 });
  assert.deepEqual(got.at(-1), { epoch: next!.epoch, offset: next!.offset });
  assert.equal(holes.length, 1, "once");
});

test("a refused token is terminal: closed with UnauthorizedError, one getToken, one socket", async () => {
  const secret = "s".repeat(32);
  const n = await node(["--token-hmac-secret", secret]);
  const proxy = new Proxy(n.ws);
  cleanup.push(() => proxy.close());
  let calls = 0;
  const c = client(await proxy.listen(), {
    getToken: async () => {
      calls++;
      return hs256("not the node's secret, long enough", { sub: "7", exp: Math.floor(Date.now() / 1000) + 60 });
    },
  });
  const causes: unknown[] = [];
  c.on("state", (s) => causes.push(s.cause));
  c.connect();
  await until("closed", () => c.state === "closed");
  const cause = causes.at(-1) as { type: string; error: MyriadError };
  assert.equal(cause.type, "token");
  assert.equal(cause.error.name, "UnauthorizedError");
  assert.equal(cause.error.code, "invalid_token");
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(calls, 1);
  assert.equal(proxy.accepted, 1, "no retry loop");
});

test("a token refreshed on the open connection outlives its first exp", async () => {
  const secret = "r".repeat(32);
  const n = await node(["--token-hmac-secret", secret]);
  let calls = 0;
  const c = client(n.url, {
    getToken: async () => {
      calls++;
      return hs256(secret, { sub: "7", exp: Math.floor(Date.now() / 1000) + 3, subscribe: ["*"], publish: ["*"] });
    },
  });
  const states: string[] = [];
  const errors: MyriadError[] = [];
  c.on("state", (s) => states.push(s.state));
  c.on("error", (e) => errors.push(e));
  c.connect();
  const sub = c.subscribe("refresh");
  await sub.ready();
  await new Promise((r) => setTimeout(r, 5000));
  assert.deepEqual(states, ["connecting", "connected"], "never dropped: the node did not close with 4501");
  assert.ok(calls >= 3, `${calls} tokens`);
  const result = await c.publish("refresh", "still here");
  assert.equal(result.reached, 1);
  assert.deepEqual(errors, [], "no refresh failed; the user's own feed is no error");
});

test("the feeds the node makes for a token's user are held and delivered, without errors", async () => {
  const secret = "f".repeat(32);
  const n = await node(["--token-hmac-secret", secret]);
  const follow = await fetch(`http://${n.admin}/api/follow`, { method: "POST", body: JSON.stringify({ edges: [[7, 2]] }) });
  assert.equal(follow.status, 200);
  const c = client(n.url, {
    getToken: async () => hs256(secret, { sub: "7", exp: Math.floor(Date.now() / 1000) + 60, subscribe: ["*"] }),
  });
  const errors: MyriadError[] = [];
  c.on("error", (e) => errors.push(e));
  const got: unknown[] = [];
  c.on("subscription", (sub) => sub.on("publication", (p) => got.push([p.subject, p.data])));
  c.connect();
  await until("the feed of user 2", () => c.getSubscription("@2")?.state === "subscribed");
  assert.equal(c.getSubscription("@7")?.server, true, "the user's own feed too");
  const sent = await fetch(`http://${n.admin}/api/publish_as`, { method: "POST", body: JSON.stringify({ user: 2, data: "hello, followers" }) });
  assert.equal(sent.status, 200);
  await until("the feed publication", () => got.length === 1);
  const own = await c.send("from 7");
  assert.equal(own.reached, 1);
  await until("the user's own send", () => got.length === 2);
  assert.deepEqual(got, [
    ["@2", "hello, followers"],
    ["@7", "from 7"],
  ]);
  assert.deepEqual(errors, []);
});

test("when its node dies the client fails over to the next URL and resubscribes there", async () => {
  const a = await startNode();
  const b = await node();
  const c = client([a.url, b.url]);
  const urls: string[] = [];
  c.on("state", (s) => s.cause.type === "open" && urls.push(s.cause.url));
  c.connect();
  const sub = c.subscribe("failover");
  const got: unknown[] = [];
  const holes: Discontinuity[] = [];
  sub.on("publication", (p) => got.push(p.data));
  sub.on("discontinuity", (d) => holes.push(d));
  await sub.ready();
  await publish(a, [{ subject: "failover", data: "on a" }]);
  await until("the publication on a", () => got.length === 1);
  await a.kill();
  await until("resubscribed on b", () => holes.length === 1 && sub.state === "subscribed");
  await publish(b, [{ subject: "failover", data: "on b" }]);
  await until("the publication on b", () => got.length === 2);
  assert.deepEqual(urls, [a.url, b.url]);
  assert.deepEqual(got, ["on a", "on b"]);
  assert.equal(holes[0]?.cause, "not_recovered", "independent nodes: another epoch");
});
