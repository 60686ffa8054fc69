// Reconnect storm (issue 28): CLIENTS SDK clients (dist/esm) in WORKERS
// Node processes, each given the URLs [A, B] of a two-node cluster over
// one redis-server (all on loopback), connect to node A and subscribe,
// client i to subject room-(i mod SUBJECTS). This script publishes RATE
// messages/s round-robin over the subjects through node B's HTTP API for
// the whole run; after LEAD seconds it kills node A with SIGKILL. Every
// client fails over to B on its own back-off (the SDK's defaults: full
// jitter, base 500 ms) and resubscribes from the last offset it saw, so
// history fills what was published while it was away.
//
// Printed: when each client was connected to B, counted from the kill in
// 100 ms bins (read from the clients' `state` events; one clock, one
// host), split into when the clients learnt of the loss (their `retry`
// events) and how long past the back-off's end the connection to B took;
// and the check that nothing within history was lost: each client
// counts publications whose offset does not follow the one before
// (epoch changes included) and `discontinuity` events, and at the end its
// last offset must be the last one published on its subject.
//
//   cd clients/js && npm ci && npm run build
//   node bench/reconnect-storm.mjs [--bin ../../target/release/myriad]
//        [--clients 5000] [--workers 2] [--subjects 100] [--rate 200]
//        [--lead 3] [--after 10] [--runs 1]
//
// Needs redis-server on PATH. The open-file limit bounds clients per
// worker (about 20,000 on this box).

import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

const { values: opt } = parseArgs({
  options: {
    bin: { type: "string", default: "../../target/release/myriad" },
    clients: { type: "string", default: "5000" },
    workers: { type: "string", default: "2" },
    subjects: { type: "string", default: "100" },
    rate: { type: "string", default: "200" },
    lead: { type: "string", default: "3" },
    after: { type: "string", default: "10" },
    runs: { type: "string", default: "1" },
    worker: { type: "string" }, // internal: run as a worker, "first,count"
    a: { type: "string" },
    b: { type: "string" },
  },
});
const SUBJECTS = Number(opt.subjects);
const subjectOf = (i) => `room-${i % SUBJECTS}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

if (opt.worker) await worker();
else await drive();

// ---- a worker: some of the clients ---------------------------------------

async function worker() {
  const { default: WebSocket } = await import("ws");
  const { Client } = await import("../dist/esm/index.js");
  const [first, count] = opt.worker.split(",").map(Number);
  const out = (m) => process.stdout.write(JSON.stringify(m) + "\n");
  const clients = [];
  for (let i = first; i < first + count; i++) {
    const c = { subject: subjectOf(i), connectsB: [], url: null, last: null, gaps: 0, holes: 0, received: 0, errors: 0, retries: 0, maxAttempt: 0, noticed: [], beyond: [], due: 0 };
    c.client = new Client([opt.a, opt.b], { WebSocket });
    c.client.on("state", ({ state, cause }) => {
      if (state === "connected") {
        c.url = cause.url;
        if (cause.url === opt.b) {
          c.connectsB.push(Date.now());
          if (c.due) c.beyond.push(Date.now() - c.due);
        }
      }
    });
    c.client.on("error", () => c.errors++);
    c.client.on("retry", ({ attempt, delay }) => {
      // When the client learnt of the loss, and when its back-off ends.
      c.noticed.push(Date.now());
      c.due = Date.now() + delay;
      c.retries++;
      c.maxAttempt = Math.max(c.maxAttempt, attempt);
    });
    c.sub = c.client.subscribe(c.subject);
    c.sub.on("publication", (p) => {
      if (c.last && (p.epoch !== c.last.epoch || p.offset !== c.last.offset + 1)) c.gaps++;
      c.last = { epoch: p.epoch, offset: p.offset };
      c.received++;
    });
    c.sub.on("discontinuity", () => c.holes++);
    c.client.connect();
    clients.push(c);
  }
  await Promise.all(clients.map((c) => c.sub.ready(60_000)));
  out({ ready: true, onA: clients.filter((c) => c.url === opt.a).length });
  for await (const line of createInterface({ input: process.stdin })) {
    const { expected } = JSON.parse(line); // subject → {epoch, offset}: the last published
    const behind = clients.filter((c) => {
      const e = expected[c.subject];
      return e && !(c.last && c.last.epoch === e.epoch && c.last.offset === e.offset);
    });
    out({
      connectsB: clients.flatMap((c) => c.connectsB),
      noticed: clients.flatMap((c) => c.noticed),
      beyond: clients.flatMap((c) => c.beyond),
      onB: clients.filter((c) => c.url === opt.b && c.client.state === "connected").length,
      gaps: clients.reduce((n, c) => n + c.gaps, 0),
      holes: clients.reduce((n, c) => n + c.holes, 0),
      duplicates: clients.reduce((n, c) => n + c.client.counters.duplicates, 0),
      errors: clients.reduce((n, c) => n + c.errors, 0),
      retries: clients.reduce((n, c) => n + c.retries, 0),
      maxAttempt: Math.max(...clients.map((c) => c.maxAttempt)),
      received: clients.reduce((n, c) => n + c.received, 0),
      behind: behind.length,
    });
  }
}

// ---- the driver -----------------------------------------------------------

async function freePort() {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, "127.0.0.1", r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

async function startRedis(children) {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), "myriad-storm-redis-"));
  const child = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir], { stdio: "ignore" });
  children.push({ child, dir });
  for (let i = 0; i < 100; i++) {
    const ok = await new Promise((resolve) => {
      const s = net.connect(port, "127.0.0.1", () => s.write("PING\r\n"));
      s.on("data", (d) => (s.destroy(), resolve(d.toString().startsWith("+PONG"))));
      s.on("error", () => resolve(false));
    });
    if (ok) return port;
    await sleep(100);
  }
  throw new Error("redis-server did not start");
}

async function startNode(children, redisPort) {
  const dir = mkdtempSync(join(tmpdir(), "myriad-storm-"));
  const child = spawn(
    opt.bin,
    ["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", dir, "--engine", "redis", "--redis-url", `redis://127.0.0.1:${redisPort}`],
    { env: { ...process.env, MYRIAD_LOG: "error" }, stdio: ["ignore", "pipe", "inherit"] },
  );
  children.push({ child, dir });
  const line = await new Promise((resolve, reject) => {
    child.once("exit", (code) => reject(new Error(`myriad exited with ${code}`)));
    createInterface({ input: child.stdout }).once("line", resolve);
  });
  const ready = JSON.parse(line);
  return { child, ws: `ws://${ready.ws}/ws`, admin: ready.admin };
}

function startWorker(children, first, count, a, b) {
  const child = spawn(process.execPath, [new URL(import.meta.url).pathname, "--worker", `${first},${count}`, "--a", a, "--b", b, "--subjects", String(SUBJECTS)], { stdio: ["pipe", "pipe", "inherit"] });
  children.push({ child });
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  return {
    next: async () => JSON.parse((await lines.next()).value),
    ask: (m) => child.stdin.write(JSON.stringify(m) + "\n"),
  };
}

async function once() {
  const children = [];
  try {
    const redis = await startRedis(children);
    const a = await startNode(children, redis);
    const b = await startNode(children, redis);
    const total = Number(opt.clients);
    const n = Number(opt.workers);
    const workers = [];
    for (let w = 0, first = 0; w < n; w++) {
      const count = Math.floor(total / n) + (w < total % n ? 1 : 0);
      workers.push(startWorker(children, first, count, a.ws, b.ws));
      first += count;
    }
    const t0 = Date.now();
    const ready = await Promise.all(workers.map((w) => w.next()));
    const onA = ready.reduce((s, r) => s + r.onA, 0);
    console.log(`${total} clients subscribed (${onA} on node A) in ${((Date.now() - t0) / 1000).toFixed(1)} s`);

    // Publishing through B, RATE a second in batches every 50 ms, bounded by the run's length.
    const expected = {};
    let published = 0;
    let publishing = true;
    const perTick = Math.max(1, Math.round(Number(opt.rate) / 20));
    const publisher = (async () => {
      let next = 0;
      while (publishing) {
        const tick = Date.now();
        const messages = [];
        for (let i = 0; i < perTick; i++, next++) messages.push({ subject: subjectOf(next), data: { n: next } });
        const r = await fetch(`http://${b.admin}/api/publish`, { method: "POST", body: JSON.stringify({ messages }) });
        const body = await r.json();
        if (r.status !== 200) throw new Error(`publish: ${r.status} ${JSON.stringify(body)}`);
        body.results.forEach((res, i) => res.offset !== undefined && (expected[messages[i].subject] = { epoch: res.epoch, offset: res.offset }));
        published += messages.length;
        await sleep(Math.max(0, 50 - (Date.now() - tick)));
      }
    })();
    await sleep(Number(opt.lead) * 1000);
    const killedAt = Date.now();
    a.child.kill("SIGKILL");
    await sleep(Number(opt.after) * 1000);
    publishing = false;
    await publisher;
    await sleep(2000); // the last publications reach every client
    for (const w of workers) w.ask({ expected });
    const reports = await Promise.all(workers.map((w) => w.next()));
    const sum = (k) => reports.reduce((s, r) => s + r[k], 0);
    const times = reports.flatMap((r) => r.connectsB).map((t) => t - killedAt).sort((x, y) => x - y);
    const bins = new Map();
    for (const t of times) bins.set(Math.floor(t / 100), (bins.get(Math.floor(t / 100)) ?? 0) + 1);
    const q = (p) => times[Math.min(times.length - 1, Math.floor(p * times.length))];
    console.log(`killed A ${opt.lead} s in; published ${published} messages through B (${opt.rate}/s over ${SUBJECTS} subjects)`);
    console.log(`connected to B after the kill: ${times.length} connects of ${total} clients; first ${times[0]} ms, median ${q(0.5)} ms, p99 ${q(0.99)} ms, last ${times[times.length - 1]} ms`);
    console.log("per 100 ms from the kill (bin start ms: connects):");
    const last = Math.max(...bins.keys());
    const row = [];
    for (let i = Math.min(...bins.keys()); i <= last; i++) row.push(`${i * 100}:${bins.get(i) ?? 0}`);
    console.log("  " + row.join(" "));
    const spread = (xs) => {
      xs = [...xs].sort((x, y) => x - y);
      return `median ${xs[Math.floor(xs.length / 2)]} ms, p99 ${xs[Math.min(xs.length - 1, Math.floor(0.99 * xs.length))]} ms`;
    };
    console.log(`loss noticed by the clients (retry events) after the kill: ${spread(reports.flatMap((r) => r.noticed).map((t) => t - killedAt))}; connected to B after the back-off ended: ${spread(reports.flatMap((r) => r.beyond))}`);
    console.log(`on B and connected at the end: ${sum("onB")}; publications received ${sum("received")}; offsets not following (gaps) ${sum("gaps")}; discontinuity events ${sum("holes")}; duplicates dropped ${sum("duplicates")}; error events ${sum("errors")}; back-off waits ${sum("retries")} (highest attempt ${Math.max(...reports.map((r) => r.maxAttempt))}); clients not at their subject's last offset ${sum("behind")}`);
    return { p50: q(0.5), p99: q(0.99), last: times[times.length - 1], lost: sum("gaps") + sum("holes") + sum("behind") };
  } finally {
    for (const { child } of children.reverse()) child.kill("SIGKILL");
    await sleep(200);
    for (const { dir } of children) if (dir) rmSync(dir, { recursive: true, force: true });
  }
}

async function drive() {
  const results = [];
  for (let run = 0; run < Number(opt.runs); run++) {
    console.log(`-- run ${run + 1}`);
    results.push(await once());
  }
  if (results.length > 1) {
    const median = (k) => [...results.map((r) => r[k])].sort((x, y) => x - y)[Math.floor(results.length / 2)];
    console.log(`medians over ${results.length} runs: reconnected median ${median("p50")} ms, p99 ${median("p99")} ms, last ${median("last")} ms; losses in each run: ${results.map((r) => r.lost).join(", ")}`);
  }
}
