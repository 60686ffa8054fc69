/**
 * The client against the real node (MYRIAD_BIN): a round trip with
 * history, and the feeds of a token's user. The cut connection, the node
 * restart, the tokens and failover are the shared scenarios
 * (clients/conformance, run by conformance.test.ts). Every wait is
 * bounded; every assertion is on counts and order, not on time.
 */

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { Client } from "../../src/client.js";
import type { MyriadError } from "../../src/errors.js";
import { hs256, publish, startNode, until, WS, type Node } from "./harness.js";

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
