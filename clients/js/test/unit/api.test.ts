/**
 * The server API client's retry rules (docs/sdk.md, "The HTTP API for
 * backends") against a scripted fetch: what is safe to send again is sent
 * again, a publish of unknown outcome is not unless asked, a connection
 * that never opened is retried, one that broke after sending is retried
 * only for an idempotent call. A 503 of unknown outcome cannot be made on
 * demand by a memory-engine node, hence the script.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { ApiClient, CongestedError, NotSettledError, OverCapacityError, PublishFailedError } from "../../src/api.js";
import { MyriadError } from "../../src/errors.js";

type Reply = [number, unknown] | Error;

/** A fetch answering each request with the next reply (the last one again when they run out); records the requests. */
function scripted(replies: Reply[]) {
  const seen: Array<{ url: string; method: string; headers: Record<string, string>; body: unknown }> = [];
  const fetch = async (url: string, init: { method: string; headers: Record<string, string>; body?: string }) => {
    seen.push({ url, method: init.method, headers: init.headers, body: init.body === undefined ? undefined : JSON.parse(init.body) });
    const reply = replies[Math.min(seen.length - 1, replies.length - 1)]!;
    if (reply instanceof Error) throw reply;
    return { status: reply[0], text: async () => JSON.stringify(reply[1]) };
  };
  return { fetch, seen };
}

const failed = (code: string, published: number, unknown: number, notPublished: number): Reply => [
  503,
  { error: { code, message: code, published, unknown, not_published: notPublished } },
];
const OK: Reply = [200, { delivered: 1, epoch: "0123456789abcdef", offset: 1 }];
const fast = { retryDelay: 0 };

/** A fetch failure as Node's fetch reports one: a TypeError whose cause has the socket's code. */
const networkError = (code: string) => Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error(code), { code }) });

test("a publish of unknown outcome is not sent again unless asked", async () => {
  let s = scripted([failed("publish_failed", 0, 1, 0), OK]);
  await assert.rejects(new ApiClient("http://node", { ...fast, fetch: s.fetch }).publish("a", 1), (e: unknown) => {
    assert.ok(e instanceof PublishFailedError);
    assert.deepEqual([e.published, e.unknown, e.notPublished, e.status], [0, 1, 0, 503]);
    return true;
  });
  assert.equal(s.seen.length, 1);
  s = scripted([failed("publish_failed", 0, 1, 0), OK]);
  assert.equal((await new ApiClient("http://node", { ...fast, fetch: s.fetch }).publish("a", 1, { retryUnknown: true })).offset, 1);
  assert.equal(s.seen.length, 2);
});

test("a batch published in part is never sent again", async () => {
  const s = scripted([failed("publish_failed", 1, 0, 1), OK]);
  await assert.rejects(new ApiClient("http://node", { ...fast, fetch: s.fetch }).publishBatch([["a", 1], ["a", 2]], { retryUnknown: true }), PublishFailedError);
  assert.equal(s.seen.length, 1);
});

test("what is safe is sent again, up to `retries` times", async () => {
  for (const first of [failed("publish_failed", 0, 0, 1), failed("congested", 0, 0, 1), [503, { error: { code: "over_capacity", message: "full" } }] as Reply]) {
    const s = scripted([first, OK]);
    assert.equal((await new ApiClient("http://node", { ...fast, fetch: s.fetch }).publish("a", 1)).offset, 1);
    assert.equal(s.seen.length, 2);
  }
  let s = scripted([[503, { error: { code: "not_settled", message: "later" } }], [200, { added: 1 }]]);
  assert.equal(await new ApiClient("http://node", { ...fast, fetch: s.fetch }).follow([[1, 2]]), 1);
  assert.deepEqual(s.seen[1]?.body, { edges: [[1, 2]] }, "the same batch");
  s = scripted([[503, { error: { code: "not_settled", message: "later" } }]]);
  await assert.rejects(new ApiClient("http://node", { ...fast, retries: 2, fetch: s.fetch }).follow([[1, 2]]), NotSettledError);
  assert.equal(s.seen.length, 3, "the first try and two retries");
  s = scripted([failed("congested", 0, 0, 1)]);
  await assert.rejects(new ApiClient("http://node", { retries: 0, fetch: s.fetch }).publish("a", 1), CongestedError);
  assert.equal(s.seen.length, 1);
  s = scripted([[503, { error: { code: "over_capacity", message: "full" } }]]);
  await assert.rejects(new ApiClient("http://node", { ...fast, retries: 1, fetch: s.fetch }).stats(), OverCapacityError);
  assert.equal(s.seen.length, 2);
});

test("a connection that never opened is tried again; one that broke after sending only for what may be repeated", async () => {
  let s = scripted([networkError("ECONNREFUSED"), OK]);
  assert.equal((await new ApiClient("http://node", { ...fast, fetch: s.fetch }).publish("a", 1)).offset, 1);
  assert.equal(s.seen.length, 2);
  s = scripted([networkError("ECONNRESET"), OK]);
  await assert.rejects(new ApiClient("http://node", { ...fast, fetch: s.fetch }).publish("a", 1), (e: unknown) => e instanceof MyriadError && e.code === "connection_failed");
  assert.equal(s.seen.length, 1, "the publish may have been carried out");
  s = scripted([networkError("ECONNRESET"), [200, { added: 2 }]]);
  assert.equal(await new ApiClient("http://node", { ...fast, fetch: s.fetch }).addUsers([1, 2]), 2);
  assert.equal(s.seen.length, 2, "adding users again is harmless");
  s = scripted([Object.assign(new Error("timed out"), { name: "TimeoutError" }), OK]);
  await assert.rejects(new ApiClient("http://node", { ...fast, fetch: s.fetch }).publish("a", 1), (e: unknown) => e instanceof MyriadError && e.code === "timeout");
  assert.equal(s.seen.length, 1);
});

test("requests carry the key and the query; an answer that is not the API's own is http_STATUS", async () => {
  const s = scripted([[200, { op: "history", subject: "a b", epoch: "e", offset: 3, publications: [] }], [502, "<html>bad gateway</html>"]]);
  const c = new ApiClient("http://node:8081/", { key: "k", retries: 0, fetch: s.fetch });
  await c.history("a b", { limit: 2, since: { epoch: "e", offset: 1 } });
  assert.equal(s.seen[0]?.url, "http://node:8081/api/history?subject=a+b&limit=2&epoch=e&offset=1");
  assert.equal(s.seen[0]?.headers["X-Api-Key"], "k");
  await assert.rejects(c.history("a"), (e: unknown) => e instanceof MyriadError && e.code === "http_502");
});

test("fetch is called as a plain function: a browser's throws when its `this` is not the window", async () => {
  const s = scripted([OK]);
  const strict = function (this: unknown, url: string, init: { method: string; headers: Record<string, string>; body?: string }) {
    assert.equal(this, undefined, "called with a `this`");
    return s.fetch(url, init);
  };
  assert.equal((await new ApiClient("http://node", { fetch: strict }).publish("a", 1)).offset, 1);
});
