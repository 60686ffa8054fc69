/**
 * The server API client (`myriad-client/api`) against the real node
 * (MYRIAD_BIN) with both keys: every call (publish, batch, publishAs,
 * history and its pages, the follow graph, stats), and each error code the
 * node produces for these calls raised as its own class with its status.
 * (`invalid_position`, an epoch without an offset, cannot be sent through
 * the typed calls, which always send both.)
 * Over real sockets too: a port where nothing listens (retried: the
 * request never left) and a server that never answers (a publish of
 * unknown outcome is not sent again; a read is). The rules for the 503s,
 * which the node cannot make on demand, are in test/unit/api.test.ts.
 */

import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";
import {
  ApiClient,
  ApiError,
  ApiForbiddenError,
  ApiUnauthorizedError,
  BodyTooLargeError,
  FollowingLimitError,
  InvalidQueryError,
  InvalidSubjectError,
  InvalidUserError,
  ReservedSubjectError,
  SelfFollowError,
  UnknownUserError,
} from "../../src/api.js";
import { MyriadError } from "../../src/errors.js";
import { startNode, type Node } from "./harness.js";

const ADMIN = "admin-key-0123456789";
const PUBLISH = "publish-key-0123456789";

let n: Node;
let api: string;
before(async () => {
  n = await startNode(["--admin-key", ADMIN, "--publish-key", PUBLISH, "--max-http-body", "4096", "--max-following", "2"]);
  api = `http://${n.admin}`;
});
after(() => n.kill());

test("every call, with the publish key and the admin key", async () => {
  const backend = new ApiClient(api, { key: PUBLISH });
  const admin = new ApiClient(api, { key: ADMIN });
  const one = await backend.publish("news", { n: 0 });
  assert.equal(one.offset, 1);
  assert.equal(one.delivered, 0);
  assert.equal(typeof one.epoch, "string");
  const batch = await backend.publishBatch(Array.from({ length: 24 }, (_, i) => ["news", i + 1] as [string, unknown]));
  assert.deepEqual(
    batch.results.map((r) => r.offset),
    Array.from({ length: 24 }, (_, i) => i + 2),
  );
  const page = await backend.history("news", { limit: 5 });
  assert.deepEqual(
    page.publications.map((p) => p.offset),
    [21, 22, 23, 24, 25],
  );
  assert.equal(page.offset, 25);
  const everything: number[] = [];
  for await (const p of backend.historyPages("news", { epoch: one.epoch!, offset: 0 }, { limit: 10 })) everything.push(p.offset);
  assert.deepEqual(
    everything,
    Array.from({ length: 25 }, (_, i) => i + 1),
    "three pages, each from the last one received",
  );
  assert.equal(await admin.addUsers([1, 2, 3]), 3);
  assert.equal(await admin.follow([[1, 2], [3, 2]]), 2);
  assert.equal(await admin.follow([[1, 2]]), 0, "idempotent");
  const first = await admin.followers(2, { limit: 1 });
  assert.deepEqual([first.users, first.next], [[1], 1]);
  const rest = await admin.followers(2, { after: first.next! });
  assert.deepEqual([rest.users, rest.next], [[3], null]);
  assert.deepEqual((await admin.following(1)).users, [2]);
  assert.equal(await admin.unfollow([[3, 2]]), 1);
  assert.equal((await backend.publishAs(2, "hi")).offset, 1);
  assert.equal(typeof (await admin.stats()).connections, "number");
});

test("history pages: a position history no longer reaches is not_recovered", async () => {
  const backend = new ApiClient(api, { key: PUBLISH });
  const { epoch } = await backend.publish("gone", 1);
  const pages = backend.historyPages("gone", { epoch: epoch!.replace(/.$/, (c) => (c === "0" ? "1" : "0")), offset: 0 });
  await assert.rejects(pages.next(), (e: unknown) => e instanceof MyriadError && e.code === "not_recovered");
});

/** `call` refused with `status`, `code` and the class `type`, an `ApiError` carrying the body. */
async function refused(call: Promise<unknown>, status: number, code: string, type: new (...args: any[]) => ApiError): Promise<void> {
  await assert.rejects(call, (e: unknown) => {
    assert.ok(e instanceof type, `${String(e)} is a ${type.name}`);
    assert.ok(e instanceof ApiError && e instanceof MyriadError);
    assert.equal(e.status, status);
    assert.equal(e.code, code);
    assert.equal(e.body.code, code);
    return true;
  });
}

test("each error code the node gives these calls is its own class, with its status", async () => {
  const anonymous = new ApiClient(api);
  const backend = new ApiClient(api, { key: PUBLISH });
  const admin = new ApiClient(api, { key: ADMIN });
  await refused(anonymous.publish("news", 1), 401, "unauthorized", ApiUnauthorizedError);
  await refused(new ApiClient(api, { key: "neither-key-0123456789" }).history("news"), 401, "unauthorized", ApiUnauthorizedError);
  await refused(backend.stats(), 403, "forbidden", ApiForbiddenError);
  await refused(backend.follow([[1, 2]]), 403, "forbidden", ApiForbiddenError);
  await refused(backend.publish("no spaces", 1), 400, "invalid_subject", InvalidSubjectError);
  await refused(backend.publishBatch([["ok", 1], ["not ok", 2]]), 400, "invalid_subject", InvalidSubjectError);
  await refused(backend.publish("@7", 1), 400, "reserved_subject", ReservedSubjectError);
  await refused(backend.history("news", { limit: -1 }), 400, "invalid_query", InvalidQueryError);
  await refused(backend.history("news", { since: { epoch: "NOT-AN-EPOCH", offset: 0 } }), 400, "invalid_query", InvalidQueryError);
  await refused(backend.publishAs(424_242, 1), 404, "unknown_user", UnknownUserError);
  await refused(backend.publish("news", "x".repeat(8192)), 413, "body_too_large", BodyTooLargeError);
  await refused(admin.follow([[-1, 2]]), 400, "invalid_user", InvalidUserError);
  await refused(admin.follow([[3, 3]]), 400, "self_follow", SelfFollowError);
  await refused(admin.follow([[10, 11], [10, 12], [10, 13]]), 422, "following_limit", FollowingLimitError);
  await refused(admin.following(10), 404, "unknown_user", UnknownUserError); // the refused batch changed nothing
  assert.equal((await backend.publish("after", 1)).offset, 1, "the node still answers");
});

/** A fetch that counts the requests it is given. */
function counting() {
  const counted = { calls: 0, fetch: (url: string, init?: unknown) => (counted.calls++, fetch(url, init as RequestInit)) };
  return counted;
}

test("a port where nothing listens: tried again, as the request never left", async () => {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  const c = counting();
  await assert.rejects(new ApiClient(`http://127.0.0.1:${port}`, { fetch: c.fetch, retries: 2, retryDelay: 1 }).publish("a", 1), (e: unknown) => e instanceof MyriadError && e.code === "connection_failed");
  assert.equal(c.calls, 3, "the first try and two retries");
});

test("a server that never answers: a publish is not sent again, a read is", async () => {
  const sockets: net.Socket[] = [];
  const server = net.createServer((s) => void sockets.push(s)); // reads, never answers
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  try {
    const c = counting();
    const silent = new ApiClient(`http://127.0.0.1:${port}`, { fetch: c.fetch, timeout: 200, retries: 2, retryDelay: 1 });
    await assert.rejects(silent.publish("a", 1), (e: unknown) => e instanceof MyriadError && e.code === "timeout");
    assert.equal(c.calls, 1, "its outcome is unknown");
    await assert.rejects(silent.history("a"), (e: unknown) => e instanceof MyriadError && e.code === "timeout");
    assert.equal(c.calls, 4, "a read: the first try and two retries");
  } finally {
    for (const s of sockets) s.destroy();
    await new Promise((resolve) => server.close(resolve));
  }
});
