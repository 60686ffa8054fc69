/**
 * The client against the fake node, under mock timers: its states and
 * their causes, reconnecting, failover, recovery and dedupe, tokens,
 * commands, the heartbeat watchdog and bad input (docs/sdk.md).
 */

import assert from "node:assert/strict";
import { afterEach, beforeEach, mock, test } from "node:test";
import { Client, type ClientOptions } from "../../src/client.js";
import { MyriadError, ServerError, TimeoutError, UnauthorizedError } from "../../src/errors.js";
import { MemberList } from "../../src/presence.js";
import type { Discontinuity } from "../../src/subscription.js";
import { FakeServer, type FakeSocket, type Frame, fakeToken, fakeWindow, flush } from "../fake.js";

const E1 = "00000000000000e1";
const E2 = "00000000000000e2";

beforeEach(() => mock.timers.enable({ apis: ["setTimeout", "Date"], now: 1_700_000_000_000 }));
afterEach(() => mock.timers.reset());

/**
 * A client on a fake node; random() is 0.5, so the n-th pause is 250 ×
 * 2^(n−1) ms. WebSocket only, unless `options` says otherwise: these tests
 * are about one transport's states (the fallback has its own).
 */
function setup(options: ClientOptions = {}, urls: string[] = ["ws://a/ws"]) {
  const server = new FakeServer();
  const client = new Client(urls, { WebSocket: server.WebSocket, random: () => 0.5, transports: ["websocket"], ...options });
  const states: string[] = [];
  const causes: unknown[] = [];
  const errors: MyriadError[] = [];
  client.on("state", (s) => {
    states.push(s.state);
    causes.push(s.cause);
  });
  client.on("error", (e) => errors.push(e));
  return { server, client, states, causes, errors };
}

/** Answers like the node: `subscribed` at `offset` (recovered when asked with `since`), `ok`, `pong`. */
function answering(offset = 0, epoch = E1, recovered = true) {
  return (socket: FakeSocket, f: Frame) => {
    if (f.op === "subscribe") {
      const since = f.since !== undefined ? { recovered } : {};
      socket.push({ op: "subscribed", id: f.id, subject: f.subject, epoch, offset, ...since });
    } else if (f.op === "ping") socket.push({ op: "pong", id: f.id });
    else if (f.op === "connect" || f.op === "refresh" || f.op === "unsubscribe") socket.push({ op: "ok", id: f.id });
  };
}

const msg = (subject: string, offset: number, epoch = E1) => ({ op: "msg", subject, epoch, offset, data: { n: offset } });

test("connect goes connecting then connected, each change with its cause", () => {
  const { server, client, states, causes } = setup();
  assert.equal(client.state, "disconnected");
  client.connect();
  assert.equal(client.state, "connecting");
  assert.equal(server.sockets.length, 1, "the first attempt goes at once");
  server.last.open();
  assert.deepEqual(states, ["connecting", "connected"]);
  assert.deepEqual(causes, [
    { type: "call", method: "connect" },
    { type: "open", url: "ws://a/ws" },
  ]);
  client.disconnect();
  assert.equal(server.last.closedWith, 1000);
  assert.deepEqual(causes.at(-1), { type: "call", method: "disconnect" });
  client.close();
  assert.deepEqual(states, ["connecting", "connected", "disconnected", "closed"]);
  assert.throws(() => client.connect(), (e: MyriadError) => e.code === "client_closed");
});

test("a lost connection reconnects with back-off, round robin over the URLs, and the count resets on success", () => {
  const { server, client, states } = setup({}, ["ws://a/ws", "ws://b/ws", "ws://c/ws"]);
  const retries: Array<{ attempt: number; delay: number; url: string }> = [];
  client.on("retry", ({ attempt, delay, url }) => retries.push({ attempt, delay, url }));
  client.connect();
  server.last.open();
  server.last.end(1006);
  assert.equal(client.state, "connecting");
  server.last.end(1006); // ignored: that socket is gone
  mock.timers.tick(249);
  assert.equal(server.sockets.length, 1);
  mock.timers.tick(1);
  assert.equal(server.last.url, "ws://b/ws", "the next node, not the dead one");
  server.last.end(1006);
  mock.timers.tick(500);
  assert.equal(server.last.url, "ws://c/ws");
  server.last.end(1001, "going_away");
  mock.timers.tick(1000);
  assert.equal(server.last.url, "ws://a/ws");
  server.last.open();
  server.last.end(4001, "slow_consumer");
  assert.deepEqual(retries, [
    { attempt: 1, delay: 250, url: "ws://b/ws" },
    { attempt: 2, delay: 500, url: "ws://c/ws" },
    { attempt: 3, delay: 1000, url: "ws://a/ws" },
    { attempt: 1, delay: 250, url: "ws://b/ws" },
  ]);
  assert.deepEqual(states, ["connecting", "connected", "connecting", "connected", "connecting"]);
});

test("the pause grows to the cap of 20 s and stays there", () => {
  const { server, client } = setup({ random: () => 0.999 });
  const delays: number[] = [];
  client.on("retry", ({ delay }) => delays.push(delay));
  client.connect();
  for (let i = 0; i < 10; i++) {
    server.last.end(1006);
    mock.timers.tick(20_000);
  }
  assert.deepEqual(delays, [499, 999, 1998, 3996, 7992, 15984, 19980, 19980, 19980, 19980]);
});

test("a do-not-reconnect-unchanged code goes to disconnected and stays there", () => {
  for (const code of [1002, 1003, 1007, 1009, 4500, 4599]) {
    const { server, client, causes } = setup();
    client.connect();
    server.last.open();
    server.last.end(code, "why");
    assert.equal(client.state, "disconnected", `${code}`);
    assert.deepEqual(causes.at(-1), { type: "close", code, reason: "why" });
    mock.timers.tick(60_000);
    assert.equal(server.sockets.length, 1, `${code}: no retry`);
  }
});

test("4501 without getToken stops; with getToken the client reconnects with a new token", async () => {
  {
    const { server, client } = setup({ token: fakeToken({ exp: 1_700_000_100 }) });
    server.onCommand = answering();
    client.connect();
    server.last.open();
    assert.equal(client.state, "connected");
    server.last.end(4501, "token_expired");
    assert.equal(client.state, "disconnected");
    client.setToken("t2");
    client.connect();
    server.last.open();
    assert.deepEqual(server.last.ops("connect")[0]?.token, "t2");
  }
  const tokens = ["first", "second"];
  let calls = 0;
  const { server, client, states } = setup({ getToken: async () => tokens[calls++]! });
  server.onCommand = answering();
  client.connect();
  await flush();
  server.last.open();
  assert.equal(server.last.url, "ws://a/ws", "the token is not in the URL");
  assert.equal(server.last.sent[0]?.op, "connect", "the token goes first, in connect");
  assert.equal(server.last.sent[0]?.token, "first");
  server.last.end(4501, "token_expired");
  assert.equal(client.state, "connecting");
  mock.timers.tick(250);
  await flush();
  server.last.open();
  assert.equal(server.last.sent[0]?.token, "second");
  assert.equal(calls, 2);
  assert.deepEqual(states, ["connecting", "connected", "connecting", "connected"]);
});

test("a fresh token refused is terminal: closed with UnauthorizedError, no retry loop", async () => {
  let calls = 0;
  const { server, client, causes } = setup({
    getToken: async () => {
      calls++;
      return "bad";
    },
  });
  server.onCommand = (socket, f) =>
    f.op === "connect" && socket.push({ op: "error", id: f.id, code: "invalid_token", message: "token_signature" });
  const sub = client.subscribe("a");
  client.connect();
  const published = client.publish("a", 1);
  await flush();
  server.last.open();
  assert.equal(client.state, "closed");
  const cause = causes.at(-1) as { type: string; error: MyriadError };
  assert.equal(cause.type, "token");
  assert.ok(cause.error instanceof UnauthorizedError);
  assert.equal(cause.error.code, "invalid_token");
  assert.equal(sub.state, "unsubscribed");
  await assert.rejects(published, (e: MyriadError) => e.code === "client_closed");
  mock.timers.tick(120_000);
  await flush();
  assert.equal(server.sockets.length, 1);
  assert.equal(calls, 1);
  assert.equal(server.last.ops("subscribe").length, 0, "nothing ran without the user");
});

test("a connect the backend proxy refuses is terminal; one it could not judge is retried", async () => {
  for (const code of ["proxy_refused", "forbidden", "proxy_unavailable", "proxy_busy"]) {
    const { server, client, causes } = setup({ getToken: async () => "t" });
    server.onCommand = (socket, f) => f.op === "connect" && socket.push({ op: "error", id: f.id, code, message: "backend says" });
    client.connect();
    await flush();
    server.last.open();
    await flush();
    mock.timers.tick(120_000);
    await flush();
    if (code === "proxy_refused" || code === "forbidden") {
      assert.equal(client.state, "closed", code);
      const cause = causes.at(-1) as { type: string; error: MyriadError };
      assert.ok(cause.error instanceof UnauthorizedError, code);
      assert.equal(cause.error.code, code);
      assert.equal(cause.error.message, "backend says");
      assert.equal(server.sockets.length, 1, code);
    } else {
      assert.equal(client.state, "connecting", code);
      assert.ok(server.sockets.length >= 2, `${code}: tried again`);
    }
    client.close();
  }
});

test("a cached token refused gets one fresh token on the same socket", async () => {
  let calls = 0;
  const { server, client } = setup({ token: "stale", getToken: async () => `fresh${++calls}` });
  server.onCommand = (socket, f) => {
    if (f.op !== "connect") return;
    if (f.token === "stale") socket.push({ op: "error", id: f.id, code: "invalid_token", message: "token_expired" });
    else socket.push({ op: "ok", id: f.id });
  };
  client.connect();
  server.last.open();
  await flush();
  assert.equal(client.state, "connected");
  assert.deepEqual(
    server.last.ops("connect").map((f) => f.token),
    ["stale", "fresh1"],
  );
});

test("getToken saying no is terminal; any other failure is retried", async () => {
  {
    const { server, client, causes } = setup({ getToken: () => Promise.reject(new UnauthorizedError("banned")) });
    client.connect();
    await flush();
    assert.equal(client.state, "closed");
    assert.equal((causes.at(-1) as { error: MyriadError }).error.code, "unauthorized");
    assert.equal(server.sockets.length, 0);
  }
  let calls = 0;
  const { server, client } = setup({
    getToken: async () => {
      if (++calls === 1) throw new Error("backend down");
      return "t";
    },
  });
  server.onCommand = answering();
  client.connect();
  await flush();
  assert.equal(client.state, "connecting");
  mock.timers.tick(250);
  await flush();
  server.last.open();
  assert.equal(client.state, "connected");
});

test("the token is refreshed on the open connection before exp, one getToken in flight", async () => {
  const now = Date.now() / 1000;
  let release: (token: string) => void = () => {};
  let calls = 0;
  const { server, client } = setup({
    token: fakeToken({ exp: now + 60 }),
    getToken: () => {
      calls++;
      return new Promise<string>((resolve) => (release = resolve));
    },
  });
  server.onCommand = answering();
  client.connect();
  server.last.open();
  mock.timers.tick(29_999);
  await flush();
  assert.equal(calls, 0);
  mock.timers.tick(1);
  await flush();
  assert.equal(calls, 1, "refresh at exp − 30 s");
  // The node closes with 4501 while the refresh's getToken is pending:
  // the reconnect shares that call.
  server.last.end(4501);
  mock.timers.tick(250);
  await flush();
  assert.equal(calls, 1, "never two in flight");
  release(fakeToken({ exp: now + 120 }));
  await flush();
  server.last.open();
  assert.equal(client.state, "connected");
  assert.equal(calls, 1);
  // And on the new connection the refresh is a refresh command.
  mock.timers.tick(90_000);
  await flush();
  assert.equal(calls, 2);
  release(fakeToken({ exp: now + 600 }));
  await flush();
  await flush();
  assert.equal(server.last.ops("refresh").length, 1);
  assert.equal(client.state, "connected");
});

test("a refused refresh is reported and the connection stays", async () => {
  const now = Date.now() / 1000;
  const { server, client, errors } = setup({ token: fakeToken({ exp: now + 10 }), getToken: async () => "t" });
  server.onCommand = (socket, f) => {
    if (f.op === "refresh") socket.push({ op: "error", id: f.id, code: "forbidden", message: "grants" });
    else answering()(socket, f);
  };
  client.connect();
  server.last.open();
  mock.timers.tick(5_000);
  await flush();
  await flush();
  assert.equal(errors.length, 1);
  assert.equal(errors[0]?.code, "refresh_failed");
  assert.equal(client.state, "connected");
});

test("publications are handed over once each and in order; holes are announced first", () => {
  const { server, client } = setup();
  server.onCommand = answering(10);
  const sub = client.subscribe("a");
  const got: number[] = [];
  const holes: Discontinuity[] = [];
  sub.on("publication", (p) => got.push(p.offset));
  sub.on("discontinuity", (d) => {
    holes.push(d);
    got.push(-1);
  });
  client.connect();
  server.last.open();
  assert.equal(sub.state, "subscribed");
  assert.deepEqual(sub.position, { epoch: E1, offset: 10 });
  for (const o of [9, 10, 11, 12, 12, 11, 13, 16, 15, 17]) server.last.push(msg("a", o));
  assert.deepEqual(got, [11, 12, 13, -1, 16, 17]);
  assert.equal(client.counters.duplicates, 5);
  assert.deepEqual(holes, [
    { subject: "a", cause: "gap", previous: { epoch: E1, offset: 13 }, position: { epoch: E1, offset: 15 }, missed: 2 },
  ]);
  server.last.push(msg("a", 1, E2));
  assert.equal(holes.at(-1)?.cause, "epoch_changed");
  assert.deepEqual(holes.at(-1)?.position, { epoch: E2, offset: 0 });
  assert.equal(holes.at(-1)?.missed, null);
  assert.deepEqual(got.slice(-2), [-1, 1]);
});

test("after a blip the subscription resumes with since; the replay's duplicates are dropped", () => {
  const { server, client } = setup();
  server.onCommand = answering(0);
  const sub = client.subscribe("a");
  const got: number[] = [];
  const states: string[] = [];
  sub.on("publication", (p) => got.push(p.offset));
  sub.on("state", (s) => states.push(s.state));
  let holes = 0;
  sub.on("discontinuity", () => holes++);
  client.connect();
  server.last.open();
  server.last.push(msg("a", 1));
  server.last.push(msg("a", 2));
  server.last.end(1006);
  assert.equal(sub.state, "subscribing");
  server.onCommand = answering(5);
  mock.timers.tick(250);
  server.last.open();
  assert.deepEqual(server.last.ops("subscribe")[0]?.since, { epoch: E1, offset: 2 });
  assert.deepEqual(sub.position, { epoch: E1, offset: 2 }, "recovered: true keeps the position until the replay");
  for (const o of [2, 3, 4, 5, 6]) server.last.push(msg("a", o));
  assert.deepEqual(got, [1, 2, 3, 4, 5, 6]);
  assert.equal(holes, 0);
  assert.deepEqual(states, ["subscribed", "subscribing", "subscribed"]);
});

test("recovered: false and a stream that broke each fire one discontinuity with the new position", () => {
  const { server, client } = setup();
  server.onCommand = answering(3);
  const sub = client.subscribe("a", { since: { epoch: E1, offset: 1 } });
  const holes: Discontinuity[] = [];
  sub.on("discontinuity", (d) => holes.push(d));
  const got: number[] = [];
  sub.on("publication", (p) => got.push(p.offset));
  client.connect();
  server.last.open();
  assert.equal(server.last.ops("subscribe")[0]?.since !== undefined, true, "the application's since is used");
  server.last.push(msg("a", 2));
  server.last.end(1006);
  server.onCommand = answering(7, E2, false);
  mock.timers.tick(250);
  server.last.open();
  assert.deepEqual(holes, [
    { subject: "a", cause: "not_recovered", previous: { epoch: E1, offset: 2 }, position: { epoch: E2, offset: 7 }, missed: null },
  ]);
  server.last.push(msg("a", 8, E2));
  server.last.push({ op: "subscribed", subject: "a", epoch: E2, offset: 20, recovered: false });
  server.last.push(msg("a", 21, E2));
  assert.equal(holes.length, 2);
  assert.deepEqual(holes[1], {
    subject: "a",
    cause: "stream_broke",
    previous: { epoch: E2, offset: 8 },
    position: { epoch: E2, offset: 20 },
    missed: 12,
  });
  assert.deepEqual(got, [2, 8, 21]);
});

test("commands buffer while connecting, match answers by id in any order, and time out", async () => {
  const { server, client } = setup({ timeout: 5_000 });
  await assert.rejects(client.publish("a", 1), (e: MyriadError) => e.code === "not_connected");
  client.connect();
  const first = client.publish("a", 1);
  const second = client.history("a", { limit: 2 });
  const third = client.publish("b", 3);
  assert.equal(server.last.sent.length, 0);
  server.last.open();
  const [p1, h, p3] = server.last.sent;
  assert.deepEqual([p1?.op, h?.op, p3?.op], ["publish", "history", "publish"]);
  server.last.push({ op: "error", id: p3?.id, code: "forbidden", message: "no grant" });
  server.last.push({ op: "history", id: h?.id, subject: "a", epoch: E1, offset: 4, publications: [] });
  server.last.push({ op: "ok", id: p1?.id, epoch: E1, offset: 5, reached: 2 });
  assert.deepEqual(await first, { epoch: E1, offset: 5, reached: 2 });
  assert.equal((await second).offset, 4);
  await assert.rejects(third, (e: unknown) => e instanceof ServerError && e.code === "forbidden");
  const slow = client.publish("a", 2);
  mock.timers.tick(5_000);
  await assert.rejects(slow, (e: unknown) => e instanceof TimeoutError && e.code === "timeout");
  const lost = client.publish("a", 3);
  server.last.end(1006);
  await assert.rejects(lost, (e: MyriadError) => e.code === "connection_lost");
  assert.equal(server.sockets[0]?.ops("publish").length, 4, "each sent once");
  mock.timers.tick(250);
  server.last.open();
  assert.equal(server.last.ops("publish").length, 0, "never sent twice");
});

test("the watchdog pings after silence and drops a silent node", () => {
  const { server, client, causes } = setup();
  client.connect();
  server.last.open();
  mock.timers.tick(19_999);
  server.last.push({ op: "pong", id: 999_999 }); // any message is life (this one is also bad input)
  mock.timers.tick(19_999);
  assert.equal(server.last.ops("ping").length, 0);
  mock.timers.tick(1);
  assert.equal(server.last.ops("ping").length, 1);
  mock.timers.tick(9_999);
  assert.equal(client.state, "connected");
  mock.timers.tick(1);
  assert.equal(client.state, "connecting");
  assert.deepEqual(causes.at(-1), { type: "heartbeat" });
  assert.equal(server.sockets[0]?.closedWith, 1000);
});

test("a node that answers the ping stays; the next ping comes an interval after the last message", () => {
  const { server, client } = setup();
  client.connect();
  server.last.open();
  mock.timers.tick(20_000);
  assert.equal(server.last.ops("ping").length, 1);
  mock.timers.tick(9_000);
  server.last.push({ op: "pong", id: server.last.ops("ping")[0]!.id });
  mock.timers.tick(1_000); // the ping's 10 s are up: the pong was life
  assert.equal(client.state, "connected");
  server.last.push(msg("nobody", 1)); // more life (and bad input), 10 s after the ping
  mock.timers.tick(19_999);
  assert.equal(server.last.ops("ping").length, 1, "no ping within 20 s of the last message");
  mock.timers.tick(1);
  assert.equal(server.last.ops("ping").length, 2);
  mock.timers.tick(10_000);
  assert.equal(client.state, "connecting", "the second ping unanswered");
});

test("a listener added or removed by a listener takes effect from the next event", () => {
  const { server, client } = setup();
  const seen: string[] = [];
  const late = () => seen.push("late");
  let removeSecond = () => {};
  client.on("error", () => {
    seen.push("first");
    removeSecond();
    client.on("error", late);
  });
  removeSecond = client.on("error", () => seen.push("second"));
  client.connect();
  server.last.open();
  server.last.push({ op: "teleport" });
  assert.deepEqual(seen, ["first", "second"], "the list of the event in progress");
  server.last.push({ op: "teleport" });
  assert.deepEqual(seen, ["first", "second", "first", "late"]);
});

test("an attempt that does not open within the timeout is abandoned", () => {
  const { server, client, causes } = setup({ timeout: 3_000 });
  const retries: unknown[] = [];
  client.on("retry", ({ cause }) => retries.push(cause));
  client.connect();
  mock.timers.tick(3_000);
  assert.deepEqual(retries, [{ type: "timeout" }]);
  assert.equal(server.sockets[0]?.closedWith, 1000);
  assert.deepEqual(causes, [{ type: "call", method: "connect" }]);
});

test("bad input is counted and reported, never thrown, and the client goes on", () => {
  const { server, client, errors } = setup();
  server.onCommand = answering(0);
  const sub = client.subscribe("a");
  const got: number[] = [];
  sub.on("publication", (p) => got.push(p.offset));
  client.connect();
  server.last.open();
  for (const bad of ["not json", "[1]", '{"no":"op"}', '{"op":"msg","subject":"a"}']) server.last.push(bad);
  server.last.push({ op: "teleport" });
  server.last.push(msg("elsewhere", 1));
  server.last.push(msg("a", 1));
  assert.deepEqual(client.counters, { badMessages: 4, unknownOps: 1, unexpectedPublications: 1, duplicates: 0, callbackErrors: 0 });
  assert.deepEqual(
    errors.map((e) => e.code),
    ["bad_message", "bad_message", "bad_message", "bad_message", "unknown_op", "unexpected_publication"],
  );
  assert.deepEqual(got, [1]);
  assert.equal(client.state, "connected");
});

test("publications still arriving for a subject being unsubscribed are dropped silently", async () => {
  const { server, client, errors } = setup();
  server.onCommand = (socket, f) => (f.op === "unsubscribe" ? undefined : answering(0)(socket, f));
  const sub = client.subscribe("a");
  client.connect();
  server.last.open();
  const done = sub.unsubscribe();
  server.last.push(msg("a", 1));
  const f = server.last.ops("unsubscribe")[0];
  server.last.push({ op: "ok", id: f?.id });
  await done;
  assert.equal(errors.length, 0);
  server.last.push(msg("a", 2));
  assert.equal(client.counters.unexpectedPublications, 1, "after the ok it is unexpected again");
});

test("a callback that throws is reported and does not stop delivery; nor does a throwing error listener", () => {
  const { server, client, errors } = setup();
  server.onCommand = answering(0);
  client.on("error", () => {
    throw new Error("the error listener throws too");
  });
  const sub = client.subscribe("a");
  const got: number[] = [];
  sub.on("publication", (p) => {
    got.push(p.offset);
    if (p.offset === 1) throw new Error("application bug");
  });
  client.connect();
  server.last.open();
  server.last.push(msg("a", 1));
  server.last.push(msg("a", 2));
  assert.deepEqual(got, [1, 2]);
  assert.equal(errors[0]?.code, "callback_threw");
  assert.equal(errors[0]?.message, "application bug");
  assert.equal(client.counters.callbackErrors, 2, "the publication callback and the error listener");
});

test("a subscribe refused for good unsubscribes; a passing refusal is retried", async () => {
  const { server, client } = setup();
  let unavailable = 1;
  server.onCommand = (socket, f) => {
    if (f.op !== "subscribe") return;
    if (f.subject === "secret") socket.push({ op: "error", id: f.id, code: "forbidden", message: "no" });
    else if (unavailable-- > 0) socket.push({ op: "error", id: f.id, code: "unavailable", message: "redis" });
    else answering(0)(socket, f);
  };
  client.connect();
  const secret = client.subscribe("secret");
  const causes: unknown[] = [];
  secret.on("state", (s) => causes.push(s.cause));
  const open = client.subscribe("open");
  server.last.open();
  assert.equal(secret.state, "unsubscribed");
  assert.equal((causes[0] as { error: MyriadError }).error.code, "forbidden");
  await assert.rejects(secret.ready(), (e: MyriadError) => e.code === "forbidden");
  assert.equal(open.state, "subscribing");
  const ready = open.ready();
  mock.timers.tick(250);
  assert.equal(open.state, "subscribed");
  await ready;
  assert.equal(server.last.ops("subscribe").filter((f) => f.subject === "open").length, 2);
  assert.throws(() => client.subscribe("open"), (e: MyriadError) => e.code === "already_subscribed");
});

test("the backend proxy's refusal of a subscribe unsubscribes; its passing refusals are retried", async () => {
  for (const code of ["proxy_unavailable", "proxy_busy", "too_many_held", "proxy_refused"]) {
    const { server, client } = setup();
    let refused = 1;
    server.onCommand = (socket, f) => {
      if (f.op !== "subscribe") return;
      if (refused-- > 0) socket.push({ op: "error", id: f.id, code, message: "backend" });
      else answering(0)(socket, f);
    };
    client.connect();
    const sub = client.subscribe("a");
    server.last.open();
    mock.timers.tick(250);
    await flush();
    const sent = server.last.ops("subscribe").length;
    if (code === "proxy_refused") {
      assert.equal(sub.state, "unsubscribed", code);
      assert.equal(sent, 1, code);
    } else {
      assert.equal(sub.state, "subscribed", code);
      assert.equal(sent, 2, code);
    }
    client.close();
  }
});

test("an old subscription object cannot take back a subject held by a new one, nor subscribe on a closed client", () => {
  const { server, client } = setup();
  server.onCommand = answering(0);
  client.connect();
  server.last.open();
  const old = client.subscribe("a");
  void old.unsubscribe();
  const fresh = client.subscribe("a");
  old.subscribe();
  assert.equal(old.state, "unsubscribed");
  assert.equal(client.getSubscription("a"), fresh);
  client.close();
  fresh.subscribe();
  assert.equal(fresh.state, "unsubscribed");
  assert.throws(() => client.subscribe("b"), (e: MyriadError) => e.code === "client_closed");
});

test("a listener added while an event is emitted hears the next one only", () => {
  const { server, client } = setup();
  server.onCommand = answering(0);
  const sub = client.subscribe("a");
  const heard: string[] = [];
  sub.on("publication", (p) => {
    heard.push(`first ${p.offset}`);
    sub.on("publication", (q) => heard.push(`added ${q.offset}`));
  });
  client.connect();
  server.last.open();
  server.last.push(msg("a", 1));
  server.last.push(msg("a", 2));
  assert.deepEqual(heard, ["first 1", "first 2", "added 2"]);
});

test("offline closes the socket and waits for online, which reconnects at once", () => {
  const window = fakeWindow();
  const { server, client, causes } = setup({ window });
  client.connect();
  server.last.open();
  window.fire("offline");
  assert.equal(client.state, "connecting");
  assert.deepEqual(causes.at(-1), { type: "close", code: 1006, reason: "offline" });
  assert.equal(server.sockets[0]?.closedWith, 1000);
  mock.timers.tick(120_000);
  assert.equal(server.sockets.length, 1, "no attempt while offline");
  window.fire("online");
  assert.equal(server.sockets.length, 2, "at once");
  server.last.open();
  assert.equal(client.state, "connected");
  client.close();
  window.fire("offline");
  window.fire("online");
  assert.equal(server.sockets.length, 2, "the listeners left with the client");
});

test("an attempt due while the page is hidden waits for it to show; a visible page cuts the pause", () => {
  const window = fakeWindow();
  const { server, client } = setup({ window, random: () => 0.999 });
  client.connect();
  server.last.open();
  window.document.visibilityState = "hidden";
  window.fire("visibilitychange");
  assert.equal(client.state, "connected", "an open connection is kept while hidden");
  server.last.end(1006);
  mock.timers.tick(60_000);
  assert.equal(server.sockets.length, 1, "no attempt while hidden");
  window.document.visibilityState = "visible";
  window.fire("visibilitychange");
  assert.equal(server.sockets.length, 2, "at once when the page shows");
  server.last.end(1006);
  window.fire("visibilitychange");
  assert.equal(server.sockets.length, 3, "a visible page does not wait out a pause");
});

test("a browser that starts offline makes its first attempt on online", () => {
  const window = fakeWindow();
  window.navigator.onLine = false;
  const { server, client } = setup({ window });
  client.connect();
  assert.equal(server.sockets.length, 0);
  window.fire("online");
  assert.equal(server.sockets.length, 1);
});

test("a feed the node subscribes the connection to is held, announced, and made again by the node after a reconnect", () => {
  const { server, client, errors } = setup();
  server.onCommand = answering(0);
  const feeds: string[] = [];
  const got: string[] = [];
  const holes: Discontinuity[] = [];
  client.on("subscription", (sub) => {
    feeds.push(`${sub.subject} ${sub.server} ${sub.state}`);
    sub.on("publication", (p) => got.push(`${p.subject} ${p.offset}`));
    sub.on("discontinuity", (d) => holes.push(d));
  });
  client.connect();
  server.last.open();
  server.last.push({ op: "subscribed", subject: "@7", epoch: E1, offset: 4 });
  server.last.push(msg("@7", 5));
  assert.deepEqual(feeds, ["@7 true subscribing"]);
  assert.equal(client.getSubscription("@7")?.state, "subscribed");
  assert.deepEqual(got, ["@7 5"]);
  server.last.end(1006);
  mock.timers.tick(250);
  server.last.open();
  assert.equal(server.last.ops("subscribe").length, 0, "the node makes it again, not the client");
  server.last.push({ op: "subscribed", subject: "@7", epoch: E1, offset: 5 });
  assert.deepEqual(holes, [], "nothing was missed");
  server.last.end(1006);
  mock.timers.tick(250);
  server.last.open();
  server.last.push({ op: "subscribed", subject: "@7", epoch: E1, offset: 9 });
  server.last.push(msg("@7", 10));
  assert.deepEqual(holes, [
    { subject: "@7", cause: "not_recovered", previous: { epoch: E1, offset: 5 }, position: { epoch: E1, offset: 9 }, missed: 4 },
  ]);
  assert.deepEqual(got, ["@7 5", "@7 10"]);
  assert.deepEqual(feeds.length, 1, "announced once");
  assert.deepEqual(errors, []);
});

test("unsubscribe never rejects, even when the connection ends before its ok; options given as undefined keep their defaults", async () => {
  const { server, client } = setup({ timeout: undefined });
  server.onCommand = (socket, f) => (f.op === "subscribe" ? answering(0)(socket, f) : undefined);
  const sub = client.subscribe("a");
  client.connect();
  server.last.open();
  const done = sub.unsubscribe();
  server.last.end(1006);
  await done;
  assert.equal(sub.state, "unsubscribed");
  mock.timers.tick(250);
  server.last.open();
  assert.equal(server.last.ops("subscribe").length, 0, "not subscribed again");
  const slow = client.publish("a", 1);
  mock.timers.tick(9_999);
  assert.equal(client.state, "connected");
  mock.timers.tick(1);
  await assert.rejects(slow, (e: MyriadError) => e.code === "timeout", "the default timeout, 10 s");
});

test("two attempts that never open move to the next transport; commands are posted, subjects streamed", async () => {
  const asked: Array<{ url: string; method: string; body?: string }> = [];
  const fetch = (url: string, init: { method?: string; body?: string } = {}) => {
    asked.push({ url, method: init.method ?? "GET", body: init.body });
    return new Promise(() => {}); // never answers: only what is asked matters here
  };
  const { server, client } = setup({ transports: ["websocket", "http_stream"], fetch });
  client.connect();
  server.last.end(1006);
  mock.timers.tick(250);
  server.last.end(1006);
  mock.timers.tick(500);
  assert.equal(server.sockets.length, 2, "no third WebSocket");
  mock.timers.tick(1);
  assert.equal(client.state, "connected");
  client.subscribe("news", { since: { epoch: E1, offset: 4 } });
  void client.publish("news", 1).catch(() => {});
  mock.timers.tick(1);
  assert.deepEqual(
    asked.map((a) => [a.method, a.url]),
    [
      ["POST", "http://a/cmd"],
      ["GET", `http://a/stream?subject=news&since=${E1}%3A4`],
    ],
  );
  assert.deepEqual({ ...JSON.parse(asked[0]!.body!), id: 0 }, { op: "publish", subject: "news", data: 1, id: 0 });
  client.close();
});

test("the transport that got through is remembered for the page's session, and a new client starts from it", () => {
  const stored = new Map<string, string>();
  const g = globalThis as { sessionStorage?: unknown };
  g.sessionStorage = { getItem: (k: string) => stored.get(k) ?? null, setItem: (k: string, v: string) => void stored.set(k, v) };
  try {
    const first = setup({ transports: ["websocket", "http_stream"] });
    first.client.connect();
    first.server.last.open();
    assert.equal(stored.get("myriad.transport"), "websocket");
    first.client.close();
    stored.set("myriad.transport", "http_stream");
    const asked: string[] = [];
    const fetch = (url: string) => (asked.push(url), new Promise(() => {}));
    const second = setup({ transports: ["websocket", "http_stream"], fetch });
    second.client.connect();
    mock.timers.tick(1);
    assert.equal(second.server.sockets.length, 0, "no WebSocket tried");
    assert.equal(second.client.state, "connected");
    second.client.subscribe("news");
    mock.timers.tick(1);
    assert.deepEqual(asked, ["http://a/stream?subject=news"]);
    second.client.close();
  } finally {
    delete g.sessionStorage;
  }
});

test("MemberList: a join read just after a page that does not hold it stays; pages replace only the ids they cover; a reconnect starts empty", async () => {
  const { server, client } = setup();
  const answer = answering();
  const m = (conn: string) => ({ conn, user: null });
  const join = (conn: string) => ({ op: "join", subject: "live.1", member: m(conn) });
  server.onCommand = (socket, f) => {
    if (f.op !== "presence") return answer(socket, f);
    // Page one holds a and c; the join of e, in page two's range, is read
    // in the same turn as page two's answer, which does not hold it (as
    // when both come in one chunk).
    if (f.cursor === undefined) socket.push({ op: "presence", id: f.id, subject: "live.1", members: [m("a"), m("c")], next: "c" });
    else {
      socket.push({ op: "presence", id: f.id, subject: "live.1", members: [m("d")], next: null });
      socket.push(join("e"));
    }
  };
  client.connect();
  const sub = client.subscribe("live.1");
  const list = new MemberList(client, sub, 2);
  let synced = 0;
  list.on("synced", () => synced++);
  server.last.open();
  await flush();
  assert.equal(synced, 1);
  assert.deepEqual([...list.members.keys()].sort(), ["a", "c", "d", "e"]);
  server.last.push({ op: "leave", subject: "live.1", member: m("a") });
  assert.deepEqual([...list.members.keys()].sort(), ["c", "d", "e"]);
  // A lost connection: the list starts again from empty on the next `subscribed`.
  server.last.end(1006);
  mock.timers.tick(250);
  server.last.open();
  await flush();
  assert.equal(synced, 2);
  assert.deepEqual([...list.members.keys()].sort(), ["a", "c", "d", "e"]);
  list.stop();
});
