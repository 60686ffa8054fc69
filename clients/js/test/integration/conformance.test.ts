/**
 * The TypeScript runner of the shared scenario suite (clients/conformance):
 * each `scenarios/*.json` run against the real node (MYRIAD_BIN) as the
 * suite's README says, with the steps and expectations spelt there. The
 * Python runner (clients/python/tests/test_conformance.py) reads the same
 * files; a scenario this runner cannot run goes in `SKIPPED` with its reason
 * and in docs/sdk.md's Status table.
 */

import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { ApiClient } from "../../src/api.js";
import { Client, type ClientEvents, type ClientOptions } from "../../src/client.js";
import { PresenceFullError, type MyriadError } from "../../src/errors.js";
import { MemberList } from "../../src/presence.js";
import type { Position, PresenceEvent, Publication } from "../../src/protocol.js";
import type { Discontinuity, Subscription } from "../../src/subscription.js";
import { hs256, Proxy, publish, startNode, startRedis, until, WS, type Node, type Redis } from "./harness.js";

// From build/test/integration/ (where the compiled runner lives) to clients/conformance/scenarios.
const SCENARIOS = fileURLToPath(new URL("../../../../conformance/scenarios/", import.meta.url));

/** Scenario name → why this SDK skips it: its known gaps (none today). */
const SKIPPED: Record<string, string> = {};

/** The counters of `counters_zero`, in this SDK's spelling. */
const COUNTERS = { bad_messages: "badMessages", unexpected_publications: "unexpectedPublications" } as const;

type Bounds = { min?: number; max?: number };
/** The steps of clients/conformance/README.md, as the JSON spells them. */
type Step =
  | { do: "connect" }
  | { do: "subscribe"; subject: string }
  | { do: "ready"; subject: string; timeout?: number }
  | { do: "cut_every"; proxy: string; subject: string; publications: number; total: number }
  | { do: "publish"; node: string; subject: string; count: number; batch?: number; ahead?: number; interval?: number }
  | { do: "client_publish"; subject: string }
  | { do: "client_send"; subject: string }
  | { do: "publish_as"; node: string; user: number; subject: string }
  | { do: "follow"; node: string; edges: Array<[number, number]> }
  | { do: "history"; subject: string; limit?: number; since_delivered?: number; data: unknown[]; recovered?: boolean }
  | { do: "await_subscribed"; subject: string; timeout?: number }
  | { do: "await_delivered"; subject: string; count: number; timeout?: number }
  | { do: "await_state"; state: string; timeout?: number }
  | { do: "await_resubscribed"; subject: string; discontinuities: number; timeout?: number }
  | { do: "kill"; node: string }
  | { do: "start"; node: string }
  | { do: "retarget"; proxy: string; node: string }
  | { do: "sleep"; seconds: number }
  | { do: "cut"; proxy: string }
  | { do: "track_members"; subject: string; limit?: number }
  | { do: "member"; name: string; node: string; subject: string; join_seen?: boolean; refused?: string; timeout?: number }
  | { do: "unmember"; name: string; leave_seen?: boolean; timeout?: number }
  | { do: "await_members"; node: string; subject: string; count: number; timeout?: number }
  | { do: "await_resynced"; subject: string; timeout?: number }
  | { do: "presence_stats"; subject: string; connections: number; users: number };
interface Scenario {
  name: string;
  redis?: boolean;
  backend?: { status: number; answer: unknown };
  nodes: Record<string, { args: string[]; start?: boolean; config?: string }>;
  proxies: Record<string, string>;
  client: {
    urls: string[];
    min_reconnect_delay: number;
    max_reconnect_delay: number;
    get_token?: { secret: string; claims: Record<string, unknown>; ttl: number };
  };
  steps: Step[];
  expect: {
    delivered?: Record<string, "all">;
    offsets_from_one?: string[];
    discontinuities?: Record<string, Array<{ cause: string; after: number; new_epoch: boolean }>>;
    cuts?: Bounds;
    states?: string[];
    final_state?: string;
    terminal?: { type: string; code: string };
    get_token_calls?: Bounds;
    proxy_accepted?: Record<string, Bounds>;
    backend_calls?: Bounds;
    opened?: string[];
    server_held?: string[];
    errors?: number;
    counters_zero?: Array<keyof typeof COUNTERS>;
    presence_events?: Record<string, string[]>;
  };
}

type Event = { publication: Publication } | { discontinuity: Discontinuity };

/** One scenario's world: what was started, what the client did, what was published. */
class Run {
  redis: Redis | null = null;
  /** The scenario's backend: its proxy URL and the calls it answered. */
  backend: { url: string; calls: number } | null = null;
  nodes = new Map<string, Node>();
  proxies = new Map<string, Proxy>();
  /** The name a URL was given by the scenario, to report `open` causes by name. */
  names = new Map<string, string>();
  /** Per subject: publications and discontinuities in the order they came. */
  events = new Map<string, Event[]>();
  published = new Map<string, number>();
  states: Array<ClientEvents["state"]> = [];
  errors: MyriadError[] = [];
  opened: string[] = [];
  getTokenCalls = 0;
  cuts = 0;
  client: Client | null = null;
  cleanup: Array<() => Promise<void> | void> = [];
  /** Per subject: the client's join and leave events, in the order they came. */
  presence = new Map<string, Array<{ kind: string; conn: string }>>();
  /** The second clients of `member` steps, by name, with their member id once a join named it. */
  peers = new Map<string, { client: Client; conn?: string }>();
  lists = new Map<string, MemberList>();
  /** Snapshots MemberList finished per subject, and how many there were at the last `cut`. */
  syncs = new Map<string, number>();
  syncsAtCut = new Map<string, number>();

  constructor(readonly scenario: Scenario) {}

  get c(): Client {
    assert.ok(this.client);
    return this.client;
  }

  delivered(subject: string): Publication[] {
    return (this.events.get(subject) ?? []).flatMap((e) => ("publication" in e ? [e.publication] : []));
  }

  holes(subject: string): Discontinuity[] {
    return (this.events.get(subject) ?? []).flatMap((e) => ("discontinuity" in e ? [e.discontinuity] : []));
  }

  subscription(subject: string): Subscription {
    const sub = this.c.getSubscription(subject);
    assert.ok(sub, `${subject} is not subscribed`);
    return sub;
  }

  async startNode(name: string): Promise<void> {
    const redisUrl = this.redis?.url ?? "${redis}";
    const spec = this.scenario.nodes[name]!;
    const backendUrl = this.backend?.url ?? "${backend}";
    const args = spec.args.map((a) => a.replaceAll("${redis}", redisUrl).replaceAll("${backend}", backendUrl));
    if (spec.config !== undefined) {
      const dir = mkdtempSync(join(tmpdir(), "myriad-scenario-"));
      this.cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
      writeFileSync(join(dir, "myriad.toml"), spec.config);
      args.push("--config", join(dir, "myriad.toml"));
    }
    const node = await startNode(args);
    this.cleanup.push(() => node.kill());
    this.nodes.set(name, node);
    this.names.set(node.url, name);
  }

  url(name: string): string {
    const node = this.nodes.get(name);
    if (node) return node.url;
    const url = [...this.names].find(([, n]) => n === name)?.[0];
    assert.ok(url, `no node or proxy named ${name}`);
    return url;
  }

  makeClient(): Client {
    const spec = this.scenario.client;
    const options: ClientOptions = {
      WebSocket: WS,
      minReconnectDelay: spec.min_reconnect_delay * 1000,
      maxReconnectDelay: spec.max_reconnect_delay * 1000,
    };
    const token = spec.get_token;
    if (token) {
      options.getToken = async () => {
        this.getTokenCalls++;
        return hs256(token.secret, { ...token.claims, exp: Math.floor(Date.now() / 1000) + token.ttl });
      };
    }
    const c = new Client(
      spec.urls.map((name) => this.url(name)),
      options,
    );
    this.cleanup.push(() => c.close());
    c.on("state", (s) => {
      this.states.push(s);
      if (s.cause.type === "open") this.opened.push(this.names.get(s.cause.url) ?? s.cause.url);
    });
    c.on("error", (e) => this.errors.push(e));
    c.on("subscription", (sub) => this.record(sub));
    return c;
  }

  /** Records the subject's publications and discontinuities, in the order they come. */
  record(sub: Subscription): void {
    const events = this.events.get(sub.subject) ?? [];
    this.events.set(sub.subject, events);
    sub.on("publication", (publication) => events.push({ publication }));
    sub.on("discontinuity", (discontinuity) => events.push({ discontinuity }));
    const presence = this.presence.get(sub.subject) ?? [];
    this.presence.set(sub.subject, presence);
    const note = (kind: string) => (e: PresenceEvent) => presence.push({ kind, conn: e.member.conn });
    sub.on("join", note("join"));
    sub.on("leave", note("leave"));
  }

  /** The presence steps of the README: second clients, MemberList, and the node's own list. */
  async presenceStep(step: Extract<Step, { do: "member" | "unmember" | "track_members" | "await_members" | "await_resynced" | "presence_stats" }>, timeout: number): Promise<void> {
    switch (step.do) {
      case "track_members": {
        const list = new MemberList(this.c, this.subscription(step.subject), step.limit);
        list.on("synced", () => this.syncs.set(step.subject, (this.syncs.get(step.subject) ?? 0) + 1));
        list.on("error", (e) => this.errors.push(e));
        this.cleanup.push(() => list.stop());
        this.lists.set(step.subject, list);
        return;
      }
      case "member": {
        const peer = new Client(this.nodes.get(step.node)!.url, { WebSocket: WS });
        this.cleanup.push(() => peer.close());
        const entry: { client: Client; conn?: string } = { client: peer };
        this.peers.set(step.name, entry);
        const seen = this.presence.get(step.subject) ?? [];
        const before = seen.length;
        peer.connect();
        const sub = peer.subscribe(step.subject);
        if (step.refused) {
          const error = await sub.ready(timeout).then(() => assert.fail(`${step.name} subscribed over the cap`), (e: unknown) => e);
          assert.ok(error instanceof PresenceFullError, String(error));
          assert.equal(error.code, step.refused);
          assert.equal(error.subject, step.subject);
          return;
        }
        await sub.ready(timeout);
        if (step.join_seen) {
          await until(`the join of ${step.name}`, () => seen.length > before, timeout);
          assert.equal(seen[before]!.kind, "join");
          entry.conn = seen[before]!.conn;
        }
        return;
      }
      case "unmember": {
        const peer = this.peers.get(step.name)!;
        const seen = [...this.presence.values()].find((events) => events.some((e) => e.conn === peer.conn));
        const before = seen?.length ?? 0;
        peer.client.close();
        if (step.leave_seen) {
          assert.ok(seen && peer.conn, `${step.name}'s join was not seen`);
          await until(`the leave of ${step.name}`, () => seen.length > before, timeout);
          assert.deepEqual(seen[before], { kind: "leave", conn: peer.conn });
        }
        return;
      }
      case "await_members": {
        const list = this.lists.get(step.subject)!;
        const api = new ApiClient(`http://${this.nodes.get(step.node)!.admin}`);
        let node: string[] = [];
        const deadline = Date.now() + timeout;
        for (;;) {
          node = [];
          for (let cursor: string | undefined; ; ) {
            const page = await api.presence(step.subject, { cursor, limit: 2 });
            node.push(...page.members.map((m) => m.conn));
            if (page.next === null) break;
            cursor = page.next;
          }
          node.sort();
          const held = [...list.members.keys()].sort();
          if (list.synced && node.length === step.count && JSON.stringify(held) === JSON.stringify(node)) return;
          if (Date.now() > deadline) assert.fail(`${step.subject}: the list ${JSON.stringify(held)} never matched the node's ${JSON.stringify(node)} of ${step.count}`);
          await new Promise((r) => setTimeout(r, 10));
        }
      }
      case "await_resynced": {
        const at = this.syncsAtCut.get(step.subject) ?? 0;
        return until(`a new snapshot of ${step.subject}`, () => (this.syncs.get(step.subject) ?? 0) > at, timeout);
      }
      case "presence_stats": {
        const stats = await this.c.presenceStats(step.subject);
        assert.deepEqual([stats.connections, stats.users], [step.connections, step.users], step.subject);
        return;
      }
    }
  }

  /** The data of the subject's next publication: 0, 1, 2, … in publishing order. */
  nextData(subject: string): number {
    const data = this.published.get(subject) ?? 0;
    this.published.set(subject, data + 1);
    return data;
  }

  /** POST `body` to the admin API of `node`; the answer's JSON, or an error naming the status. */
  async admin(node: string, path: string, body: unknown): Promise<Record<string, unknown>> {
    const response = await fetch(`http://${this.nodes.get(node)!.admin}${path}`, { method: "POST", body: JSON.stringify(body) });
    const answer = (await response.json()) as Record<string, unknown>;
    assert.equal(response.status, 200, `${path}: ${JSON.stringify(answer)}`);
    return answer;
  }

  async history(step: Extract<Step, { do: "history" }>): Promise<void> {
    const options: { limit?: number; since?: Position } = {};
    if (step.limit !== undefined) options.limit = step.limit;
    if (step.since_delivered !== undefined) {
      const p = this.delivered(step.subject)[step.since_delivered - 1]!;
      options.since = { epoch: p.epoch, offset: p.offset };
    }
    const result = await this.c.history(step.subject, options);
    assert.deepEqual(
      result.publications.map((p) => p.data),
      step.data,
    );
    if (step.recovered !== undefined) assert.equal(result.recovered, step.recovered);
  }

  async publish(step: Extract<Step, { do: "publish" }>): Promise<void> {
    const { subject, count, ahead, interval } = step;
    const node = this.nodes.get(step.node)!;
    const batch = step.batch ?? 1;
    for (let start = 0; start < count; start += batch) {
      if (ahead !== undefined) {
        await until(
          "the subscriber to keep up",
          () => (this.published.get(subject) ?? 0) - this.delivered(subject).length <= ahead,
          30_000,
        );
      }
      if (start > 0 && interval) await new Promise((r) => setTimeout(r, interval * 1000));
      const first = this.published.get(subject) ?? 0;
      const size = Math.min(batch, count - start);
      await publish(
        node,
        Array.from({ length: size }, (_, i) => ({ subject, data: first + i })),
      );
      this.published.set(subject, first + size);
    }
  }

  cutEvery(step: Extract<Step, { do: "cut_every" }>): void {
    const proxy = this.proxies.get(step.proxy)!;
    const subject = step.subject;
    // Cut once per connection: what the client had read from a cut socket may still come in.
    let next = this.delivered(subject).length + step.publications;
    let connection = -1;
    this.subscription(subject).on("publication", () => {
      const n = this.delivered(subject).length;
      if (n >= next && n < step.total && this.c.state === "connected" && connection !== proxy.accepted) {
        this.cuts++;
        next = n + step.publications;
        connection = proxy.accepted;
        setImmediate(() => proxy.cut());
      }
    });
  }

  async step(step: Step): Promise<void> {
    const timeout = ("timeout" in step ? (step.timeout ?? 10) : 10) * 1000;
    switch (step.do) {
      case "connect":
        return this.c.connect();
      case "subscribe":
        return this.record(this.c.subscribe(step.subject));
      case "ready":
        return this.subscription(step.subject).ready(timeout);
      case "cut_every":
        return this.cutEvery(step);
      case "publish":
        return this.publish(step);
      case "client_publish": {
        const result = await this.c.publish(step.subject, this.nextData(step.subject));
        assert.ok((result.reached ?? 0) >= 1, JSON.stringify(result));
        return;
      }
      case "client_send": {
        const result = await this.c.send(this.nextData(step.subject));
        assert.ok((result.reached ?? 0) >= 1, JSON.stringify(result));
        return;
      }
      case "publish_as": {
        const answer = await this.admin(step.node, "/api/publish_as", { user: step.user, data: this.nextData(step.subject) });
        assert.ok(Number(answer.reached) >= 1, JSON.stringify(answer));
        return;
      }
      case "follow": {
        const answer = await this.admin(step.node, "/api/follow", { edges: step.edges });
        assert.equal(answer.added, step.edges.length);
        return;
      }
      case "history":
        return this.history(step);
      case "await_subscribed":
        return until(`${step.subject} subscribed`, () => this.c.getSubscription(step.subject)?.state === "subscribed", timeout);
      case "await_delivered":
        return until(`${step.count} publications of ${step.subject}`, () => this.delivered(step.subject).length >= step.count, timeout);
      case "await_state":
        return until(`state ${step.state}`, () => this.c.state === step.state, timeout);
      case "await_resubscribed": {
        const held = this.subscription(step.subject);
        return until(
          `${step.subject} resubscribed after ${step.discontinuities} discontinuities`,
          () => this.holes(step.subject).length === step.discontinuities && held.state === "subscribed",
          timeout,
        );
      }
      case "kill":
        return this.nodes.get(step.node)!.kill();
      case "start":
        return this.startNode(step.node);
      case "retarget":
        this.proxies.get(step.proxy)!.target = this.nodes.get(step.node)!.ws;
        return;
      case "sleep":
        await new Promise((r) => setTimeout(r, step.seconds * 1000));
        return;
      case "cut":
        for (const [subject, n] of this.syncs) this.syncsAtCut.set(subject, n);
        this.proxies.get(step.proxy)!.cut();
        return;
      case "track_members":
      case "member":
      case "unmember":
      case "await_members":
      case "await_resynced":
      case "presence_stats":
        return this.presenceStep(step, timeout);
      default:
        assert.fail(`unknown step ${(step as { do: string }).do}`);
    }
  }

  check(): void {
    const expect = this.scenario.expect;
    for (const [subject, events] of this.events) checkContinuity(subject, events);
    for (const [subject, what] of Object.entries(expect.delivered ?? {})) {
      assert.equal(what, "all");
      const want = Array.from({ length: this.published.get(subject) ?? 0 }, (_, i) => i);
      assert.deepEqual(
        this.delivered(subject).map((p) => p.data),
        want,
        `${subject}: every publication once, in order`,
      );
    }
    for (const subject of expect.offsets_from_one ?? []) {
      const offsets = this.delivered(subject).map((p) => p.offset);
      assert.deepEqual(
        offsets,
        offsets.map((_, i) => i + 1),
        `${subject}: offsets 1 to n`,
      );
    }
    for (const [subject, want] of Object.entries(expect.discontinuities ?? {})) {
      const got: Array<{ cause: string; after: number; new_epoch: boolean }> = [];
      let delivered = 0;
      for (const e of this.events.get(subject) ?? []) {
        if ("publication" in e) delivered++;
        else {
          const d = e.discontinuity;
          got.push({ cause: d.cause, after: delivered, new_epoch: d.previous !== null && d.position.epoch !== d.previous.epoch });
        }
      }
      assert.deepEqual(got, want, `${subject}: discontinuities`);
    }
    if (expect.cuts) {
      within("cuts", this.cuts, expect.cuts);
      for (const p of this.proxies.values()) assert.ok(p.accepted >= this.cuts, "a connection for each cut");
    }
    if (expect.states) assert.deepEqual(this.states.map((s) => s.state), expect.states);
    if (expect.final_state) assert.equal(this.c.state, expect.final_state);
    if (expect.terminal) {
      const cause = this.states.at(-1)?.cause;
      assert.ok(cause && cause.type === "token", JSON.stringify(cause));
      assert.equal(cause.error.name, expect.terminal.type);
      assert.equal(cause.error.code, expect.terminal.code);
    }
    if (expect.get_token_calls) within("getToken calls", this.getTokenCalls, expect.get_token_calls);
    for (const [name, bounds] of Object.entries(expect.proxy_accepted ?? {})) {
      within(`connections through ${name}`, this.proxies.get(name)!.accepted, bounds);
    }
    if (expect.backend_calls) within("backend calls", this.backend?.calls ?? 0, expect.backend_calls);
    for (const subject of expect.server_held ?? []) {
      assert.equal(this.c.getSubscription(subject)?.server, true, `${subject} held as a feed the node made`);
    }
    if (expect.opened) assert.deepEqual(this.opened, expect.opened);
    if (expect.errors !== undefined) assert.equal(this.errors.length, expect.errors, this.errors.map((e) => e.code).join(", "));
    for (const counter of expect.counters_zero ?? []) assert.equal(this.c.counters[COUNTERS[counter]], 0, counter);
    for (const [subject, want] of Object.entries(expect.presence_events ?? {})) {
      const names = new Map([...this.peers].map(([name, p]) => [p.conn, name]));
      const got = (this.presence.get(subject) ?? []).slice(0, want.length).map((e) => `${e.kind} ${names.get(e.conn) ?? e.conn}`);
      assert.deepEqual(got, want, `${subject}: the first joins and leaves`);
    }
  }
}

function within(what: string, value: number, bounds: Bounds): void {
  assert.ok(value >= (bounds.min ?? value), `${what}: ${value} < ${bounds.min}`);
  assert.ok(value <= (bounds.max ?? value), `${what}: ${value} > ${bounds.max}`);
}

/** The delivery promise: each publication follows the last position at the next offset. */
function checkContinuity(subject: string, events: Event[]): void {
  let last: Position | null = null;
  for (const e of events) {
    if ("discontinuity" in e) {
      const d = e.discontinuity;
      if (last) assert.deepEqual(d.previous, last, `${subject}: a discontinuity not from the last delivered position`);
      last = { epoch: d.position.epoch, offset: d.position.offset };
    } else {
      const p = e.publication;
      if (last) assert.deepEqual({ epoch: p.epoch, offset: p.offset }, { epoch: last.epoch, offset: last.offset + 1 }, `${subject}: out of order`);
      last = { epoch: p.epoch, offset: p.offset };
    }
  }
}

/** The scenario's backend: a real HTTP server on loopback answering every call the same. */
async function startBackend(run: Run, spec: { status: number; answer: unknown }): Promise<{ url: string; calls: number }> {
  const backend = { url: "", calls: 0 };
  const body = JSON.stringify(spec.answer);
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      backend.calls++;
      res.writeHead(spec.status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
      res.end(body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  run.cleanup.push(() => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()); }));
  backend.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/proxy`;
  return backend;
}

async function runScenario(scenario: Scenario): Promise<void> {
  const run = new Run(scenario);
  try {
    if (scenario.redis) {
      const redis = await startRedis();
      run.redis = redis;
      run.cleanup.push(() => redis.kill());
    }
    if (scenario.backend) run.backend = await startBackend(run, scenario.backend);
    for (const [name, spec] of Object.entries(scenario.nodes)) {
      if (spec.start ?? true) await run.startNode(name);
    }
    for (const [name, target] of Object.entries(scenario.proxies)) {
      const proxy = new Proxy(run.nodes.get(target)!.ws);
      run.cleanup.push(() => proxy.close());
      run.proxies.set(name, proxy);
      run.names.set(await proxy.listen(), name);
    }
    run.client = run.makeClient();
    for (const step of scenario.steps) await run.step(step);
    run.check();
  } finally {
    for (const f of run.cleanup.reverse()) await f();
  }
}

const files = readdirSync(SCENARIOS)
  .filter((f) => f.endsWith(".json"))
  .sort();
assert.ok(files.length > 0, `no scenarios in ${SCENARIOS}`);
for (const file of files) {
  const scenario = JSON.parse(readFileSync(SCENARIOS + file, "utf8")) as Scenario;
  assert.equal(`${scenario.name}.json`, file);
  const why = SKIPPED[scenario.name];
  test(scenario.name, why ? { skip: `known gap (docs/sdk.md, Status): ${why}` } : {}, () => runScenario(scenario));
}
