/**
 * Presence against the real node (MYRIAD_BIN), docs/protocol.md
 * "Presence": a member seen by a second client over WebSocket and over
 * `POST /cmd` (the HTTP stream transport), and by the API client; join
 * and leave events in order; the cap's refusal as `PresenceFullError`;
 * and `MemberList` holding the exact list, in pages of one, while members
 * come and go and across a cut connection.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { ApiClient } from "../../src/api.js";
import { Client } from "../../src/client.js";
import { PresenceFullError } from "../../src/errors.js";
import { MemberList } from "../../src/presence.js";
import type { PresenceEvent } from "../../src/protocol.js";
import { Proxy, startNode, until, WS, type Node } from "./harness.js";

const ADMIN = "admin-key-0123456789";
let n: Node;
let dir: string;
const clients: Client[] = [];

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "myriad-presence-"));
  const config = join(dir, "myriad.toml");
  writeFileSync(
    config,
    '[[namespace]]\nprefix = "room."\npresence = true\npresence_max_members = 2\n' + '[[namespace]]\nprefix = "live."\npresence = true\njoin_leave = true\n',
  );
  n = await startNode(["--admin-key", ADMIN, "--config", config]);
});
after(async () => {
  for (const c of clients) c.close();
  await n.kill();
  rmSync(dir, { recursive: true, force: true });
});

function client(url = n.url, transports?: Array<"websocket" | "http_stream">): Client {
  // `ws` offers permessage-deflate, as browsers do: join/leave come compressed connections' way too.
  const c = new Client(url, { WebSocket: WS, transports, minReconnectDelay: 20, maxReconnectDelay: 100 });
  clients.push(c);
  c.connect();
  return c;
}

test("a member is seen by a second client over WebSocket, POST /cmd and the API", async () => {
  const a = client();
  await a.subscribe("room.seen").ready();
  const b = client();
  const page = await b.presence("room.seen");
  assert.equal(page.members.length, 1);
  assert.equal(page.members[0]!.user, null);
  assert.equal(page.next, null);
  assert.deepEqual(await b.presenceStats("room.seen"), { subject: "room.seen", connections: 1, users: 0 });
  const http = client(n.url, ["http_stream"]);
  assert.deepEqual((await http.presence("room.seen")).members, page.members);
  assert.equal((await http.presenceStats("room.seen")).connections, 1);
  const api = new ApiClient(`http://${n.admin}`, { key: ADMIN });
  assert.deepEqual((await api.presence("room.seen")).members, page.members);
  assert.deepEqual(await api.presenceStats("room.seen"), { subject: "room.seen", connections: 1, users: 0 });
  await a.getSubscription("room.seen")!.unsubscribe();
  assert.equal((await b.presenceStats("room.seen")).connections, 0);
});

test("the cap refuses a subscribe with PresenceFullError, and lets it in once a member leaves", async () => {
  const members = [client(), client()];
  for (const c of members) await c.subscribe("room.full").ready();
  const third = client();
  const sub = third.subscribe("room.full");
  const error = await sub.ready().then(
    () => assert.fail("subscribed over the cap"),
    (e: unknown) => e,
  );
  assert.ok(error instanceof PresenceFullError, String(error));
  assert.equal(error.code, "presence_full");
  assert.equal(error.subject, "room.full");
  assert.equal(sub.state, "unsubscribed");
  assert.equal((await third.presenceStats("room.full")).connections, 2);
  await members[0]!.getSubscription("room.full")!.unsubscribe();
  sub.subscribe();
  await sub.ready();
  assert.equal((await third.presenceStats("room.full")).connections, 2);
});

test("join and leave come in the order the node made them", async () => {
  const watcher = client();
  const sub = watcher.subscribe("live.order");
  const seen: string[] = [];
  const note = (kind: string) => (e: PresenceEvent) => seen.push(`${kind} ${e.member.conn}`);
  sub.on("join", note("join"));
  sub.on("leave", note("leave"));
  await sub.ready();
  const others = [client(), client(), client()];
  const ids: string[] = [];
  for (const c of others) {
    await c.subscribe("live.order").ready();
    await until("its join", () => seen.length === ids.length + 1);
    ids.push(seen.at(-1)!.slice("join ".length));
  }
  await others[1]!.getSubscription("live.order")!.unsubscribe();
  others[2]!.close();
  await until("two leaves", () => seen.length === 5);
  assert.deepEqual(seen, [...ids.map((id) => `join ${id}`), `leave ${ids[1]}`, `leave ${ids[2]}`]);
});

test("MemberList holds the exact list, page by page, while members churn and across a cut connection", async () => {
  const proxy = new Proxy(n.ws);
  const url = await proxy.listen();
  const watcher = client(url);
  const sub = watcher.subscribe("live.list");
  const list = new MemberList(watcher, sub, 1);
  let syncs = 0;
  list.on("synced", () => syncs++);
  const api = new ApiClient(`http://${n.admin}`, { key: ADMIN });
  const held = () => [...list.members.keys()].sort();
  /** The node's list, read page by page over the API, once the list agrees with it (events may still be on their way). */
  const agreed = async (): Promise<string[]> => {
    const deadline = Date.now() + 10_000;
    for (;;) {
      const ids: string[] = [];
      for (let cursor: string | undefined; ; ) {
        const page = await api.presence("live.list", { cursor, limit: 2 });
        ids.push(...page.members.map((m) => m.conn));
        if (page.next === null) break;
        cursor = page.next;
      }
      ids.sort();
      if (list.synced && JSON.stringify(held()) === JSON.stringify(ids)) return ids;
      if (Date.now() > deadline) assert.deepEqual(held(), ids, "the list never agreed with the node");
      await new Promise((r) => setTimeout(r, 20));
    }
  };
  // Members come and go while the snapshot is being paged, one member a page.
  const members = Array.from({ length: 6 }, () => client());
  await Promise.all(members.map((c) => c.subscribe("live.list").ready()));
  await members[0]!.getSubscription("live.list")!.unsubscribe();
  const first = await agreed();
  assert.equal(first.length, 6); // five members and the watcher
  // Cut: while the watcher reconnects, one member leaves and another joins.
  proxy.cut();
  members[1]!.close();
  await client().subscribe("live.list").ready();
  await until("a second snapshot", () => syncs >= 2);
  const second = await agreed();
  assert.equal(second.length, 6);
  // The watcher's old id and the closed member's are gone; the new member's and the watcher's new one came.
  assert.equal(first.filter((id) => !second.includes(id)).length, 2);
  assert.equal(second.filter((id) => !first.includes(id)).length, 2);
  list.stop();
  await proxy.close();
});
