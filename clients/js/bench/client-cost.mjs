// Client cost in Node (issue 28): the CPU one client spends per message
// received, the SDK (dist/esm, its `publication` event) against a bare
// `ws` client that only parses each message's JSON. CLIENT_COST_NODE_ARGS
// adds Node flags to the client processes (`--cpu-prof`, say). Each client holds
// SUBJECTS subscriptions on one connection to a fresh `myriad serve` on
// loopback; this script then publishes MESSAGES messages round-robin over
// those subjects through the HTTP API as fast as the node takes them
// (batches of 500, two requests in flight). A saturating stream: by
// default (`--mode backlog`) each client stops reading while the node
// publishes and queues everything for it, then reads the whole backlog as
// fast as it can, so the client, not the publisher, sets the pace
// (`--mode live` reads while publishing instead, at the publisher's
// pace). Each client process reads its own process.cpuUsage() from the
// moment it may read to the last message it receives. Runs alternate (ws, sdk,
// then sdk, ws, …), each on a fresh node; the medians are printed.
//
//   cd clients/js && npm ci && npm run build
//   node bench/client-cost.mjs [--bin ../../target/release/myriad] [--runs 3]
//        [--subjects 10000] [--messages 200000] [--mode backlog|live]
//        [--kinds ws,sdk]   (ws-event: a bare client reading through
//                            ws's onmessage, as the SDK does; ws-route: a
//                            bare client that also looks each subject up
//                            in a map and keeps its offset; sdk@DIR:
//                            the SDK built into DIR instead of ../dist,
//                            to set an older build against this one)
//
// The node's max_outbound_bytes is raised to 512 MiB so a client that
// falls behind is not closed as a slow consumer: the stream stays whole
// and the client simply works through its backlog.

import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

const { values: opt } = parseArgs({
  options: {
    bin: { type: "string", default: "../../target/release/myriad" },
    runs: { type: "string", default: "3" },
    kinds: { type: "string", default: "ws,sdk" },
    subjects: { type: "string", default: "10000" },
    messages: { type: "string", default: "200000" },
    mode: { type: "string", default: "backlog" },
    client: { type: "string" }, // internal: run as one client (one of the kinds)
    url: { type: "string" },
  },
});
const SUBJECTS = Number(opt.subjects);
const MESSAGES = Number(opt.messages);
const subject = (i) => `s${i}`;

if (opt.client) await client(opt.client, opt.url);
else await drive();

// ---- one client process ---------------------------------------------------

async function client(kind, url) {
  const { default: WebSocket } = await import("ws");
  // Every socket this process opens, to pause its reading (backlog mode).
  const sockets = [];
  class Socket extends WebSocket {
    constructor(...args) {
      super(...args);
      sockets.push(this);
    }
  }
  let received = 0;
  let start;
  let done;
  const finished = new Promise((resolve) => (done = resolve));
  const onMessage = () => {
    if (++received === MESSAGES) done(process.cpuUsage(start));
  };
  if (kind === "ws" || kind === "ws-event" || kind === "ws-route") {
    const ws = new Socket(url);
    let subscribed = 0;
    await new Promise((resolve, reject) => {
      ws.on("error", reject);
      ws.on("open", () => {
        // 1,000 subjects a command keeps each under max_message_size.
        for (let from = 0; from < SUBJECTS; from += 1000) {
          const subjects = Array.from({ length: Math.min(1000, SUBJECTS - from) }, (_, i) => subject(from + i));
          ws.send(JSON.stringify({ op: "subscribe", subjects, id: from + 1 }));
        }
      });
      // "ws-route": also finds each message's subject in a map and keeps
      // its offset there, the least per-subject work any client that
      // tells subjects apart does.
      const offsets = new Map();
      const route = (m) => {
        const held = offsets.get(m.subject);
        if (held !== undefined && m.offset > held.offset) {
          held.offset = m.offset;
          onMessage();
        }
      };
      const take = (text) => {
        const m = JSON.parse(text);
        if (m.op === "msg") kind === "ws-route" ? route(m) : onMessage();
        else if (m.op === "subscribed" && offsets.set(m.subject, { offset: m.offset }) && ++subscribed === SUBJECTS) resolve();
        else if (m.op === "error") reject(new Error(JSON.stringify(m)));
      };
      // "ws": ws's own events; "ws-event": the WebSocket API's onmessage,
      // the path the SDK reads through (ws builds a MessageEvent per message).
      if (kind !== "ws-event") ws.on("message", (raw) => take(raw.toString()));
      else ws.onmessage = (event) => take(event.data);
      ws.on("close", (code) => {
        console.error(`ws client: closed ${code}`);
        process.exit(1);
      });
    });
  } else {
    const at = kind.indexOf("@");
    const dist = at < 0 ? new URL("../dist/", import.meta.url) : pathToFileURL(`${kind.slice(at + 1)}/`);
    const { Client } = await import(new URL("esm/index.js", dist).href);
    const c = new Client(url, { WebSocket: Socket });
    c.on("error", (e) => console.error(`sdk client: ${e.code} ${e.message}`));
    c.on("state", ({ state, cause }) => state === "disconnected" && console.error(`sdk client: disconnected ${JSON.stringify(cause)}`));
    const subs = Array.from({ length: SUBJECTS }, (_, i) => c.subscribe(subject(i)));
    for (const s of subs) s.on("publication", onMessage);
    c.connect();
    await Promise.all(subs.map((s) => s.ready(60_000)));
  }
  // Ready. In backlog mode the client stops reading until "go", which
  // comes once everything is published: the node holds the stream and the
  // client then takes it as fast as it can. In live mode "go" comes just
  // before the first publish.
  if (opt.mode === "backlog") for (const s of sockets) s.pause();
  console.log("ready");
  await new Promise((resolve) => createInterface({ input: process.stdin }).once("line", resolve));
  start = process.cpuUsage();
  if (opt.mode === "backlog") for (const s of sockets) s.resume();
  const t0 = performance.now();
  const cpu = await finished;
  console.log(JSON.stringify({ kind, received, cpuUs: cpu.user + cpu.system, userUs: cpu.user, systemUs: cpu.system, wallMs: performance.now() - t0 }));
  process.exit(0);
}

// ---- the driver -----------------------------------------------------------

async function startNode() {
  const dir = mkdtempSync(join(tmpdir(), "myriad-client-cost-"));
  const child = spawn(
    opt.bin,
    ["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", dir,
      "--max-subscriptions", String(SUBJECTS), "--max-outbound-bytes", String(512 << 20)],
    { env: { ...process.env, MYRIAD_LOG: "error" }, stdio: ["ignore", "pipe", "inherit"] },
  );
  const line = await new Promise((resolve, reject) => {
    child.once("exit", (code) => reject(new Error(`myriad exited with ${code}`)));
    createInterface({ input: child.stdout }).once("line", resolve);
  });
  const ready = JSON.parse(line);
  return { child, dir, ws: `ws://${ready.ws}/ws`, admin: ready.admin };
}

async function publishAll(admin) {
  const BATCH = 500;
  let next = 0;
  const worker = async () => {
    while (next < MESSAGES) {
      const from = next;
      next = Math.min(MESSAGES, next + BATCH);
      const messages = [];
      for (let i = from; i < next; i++) messages.push({ subject: subject(i % SUBJECTS), data: { n: i, text: "a chat-sized message of some sixty bytes, give or take" } });
      const r = await fetch(`http://${admin}/api/publish`, { method: "POST", body: JSON.stringify({ messages }) });
      if (r.status !== 200) throw new Error(`publish: ${r.status} ${await r.text()}`);
      await r.arrayBuffer();
    }
  };
  await Promise.all([worker(), worker()]);
}

async function once(kind) {
  const node = await startNode();
  try {
    const child = spawn(process.execPath, [...(process.env.CLIENT_COST_NODE_ARGS ?? "").split(" ").filter(Boolean), new URL(import.meta.url).pathname, "--client", kind, "--url", node.ws,
      "--subjects", String(SUBJECTS), "--messages", String(MESSAGES), "--mode", opt.mode], { stdio: ["pipe", "pipe", "inherit"] });
    const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
    const first = await lines.next();
    if (first.value !== "ready") throw new Error(`${kind} client: ${first.value}`);
    const t0 = performance.now();
    if (opt.mode === "live") child.stdin.write("go\n");
    await publishAll(node.admin);
    const publishMs = performance.now() - t0;
    if (opt.mode === "backlog") {
      // The last batch's fan-out settles into the paused socket's queue.
      await new Promise((r) => setTimeout(r, 1000));
      child.stdin.write("go\n");
    }
    const timeout = setTimeout(() => child.kill("SIGKILL"), 120_000);
    const result = JSON.parse((await lines.next()).value);
    clearTimeout(timeout);
    return { ...result, publishMs };
  } finally {
    node.child.kill("SIGKILL");
    rmSync(node.dir, { recursive: true, force: true });
  }
}

async function drive() {
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const kinds = opt.kinds.split(",");
  const per = Object.fromEntries(kinds.map((k) => [k, []]));
  for (let run = 0; run < Number(opt.runs); run++) {
    for (const kind of run % 2 === 0 ? kinds : [...kinds].reverse()) {
      const r = await once(kind);
      const usPerMsg = r.cpuUs / r.received;
      per[kind].push(usPerMsg);
      console.log(`run ${run + 1} ${kind}: ${r.received} messages, ${(r.cpuUs / 1000).toFixed(0)} ms CPU (user ${(r.userUs / 1000).toFixed(0)}, system ${(r.systemUs / 1000).toFixed(0)}), ${usPerMsg.toFixed(2)} µs/message; received over ${(r.wallMs / 1000).toFixed(2)} s (${Math.round(r.received / (r.wallMs / 1000))}/s), published in ${(r.publishMs / 1000).toFixed(2)} s`);
    }
  }
  const shown = kinds.map((k) => `${k} ${median(per[k]).toFixed(2)} µs [${per[k].map((x) => x.toFixed(2)).join(", ")}]`);
  console.log(`${opt.mode}: median CPU per message: ${shown.join(", ")}`);
  if (per.ws) {
    for (const k of kinds.filter((k) => k.startsWith("sdk"))) console.log(`${k}/ws ${(median(per[k]) / median(per.ws)).toFixed(2)}× (target ≤ 1.3×)`);
  }
}
