/**
 * The core scenarios in a real headless Chromium, with the browser's own
 * WebSocket, fetch and EventSource, against the real node: the page loads
 * the minified bundle from the same origin as the node's endpoints (an
 * HTTP proxy that serves the page and passes the rest to the node), and
 * while the test publishes through the HTTP API, cutting every connection
 * through the proxy between batches:
 * - over WebSocket, every publication arrives once, in order, with no
 *   discontinuity;
 * - with every upgrade refused, the client falls back to HTTP streaming
 *   (fetch), or to SSE (EventSource) when told to skip it, remembers it,
 *   and gets the same; on that transport the page then publishes and
 *   reads history.
 * Counts and order only. Skipped, saying so, without Chromium.
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import type http from "node:http";
import { test } from "node:test";
import { HttpProxy, publish, startNode } from "../integration/harness.js";
import { BUNDLE, openChromium, skip } from "./chromium.js";

const TOTAL = 600;
const BATCH = 100;

// Subscribes to `a`, asks the test to start (`/go`), takes TOTAL
// publications, then publishes and reads history itself; reports.
const page = `<!doctype html><meta charset="utf-8"><script src="/myriad.min.js"></script>
<script>
(async () => {
  const q = new URLSearchParams(location.search);
  const report = (r) => fetch("/report", { method: "POST", body: JSON.stringify(r) });
  const wait = async (ok, what) => { const end = Date.now() + 30000; while (!ok()) { if (Date.now() > end) throw new Error("timed out on the page: " + what); await new Promise((r) => setTimeout(r, 20)); } };
  try {
    const total = Number(q.get("total"));
    const client = new Myriad.Client(location.origin.replace(/^http/, "ws") + "/ws", { transports: q.get("transports").split(","), minReconnectDelay: 20, maxReconnectDelay: 200 });
    const errors = [], holes = [], got = [];
    let lost = 0;
    client.on("error", (e) => errors.push(e.code));
    client.on("state", (s) => s.previous === "connected" && lost++);
    const sub = client.subscribe("a");
    sub.on("publication", (p) => got.push(p.data));
    sub.on("discontinuity", (d) => holes.push(d));
    client.connect();
    await sub.ready(30000);
    await fetch("/go");
    await wait(() => got.length >= total, "got " + got.length + " of " + total);
    const received = got.slice();
    const posted = await client.publish("a", "from the page");
    await wait(() => got.length > total, "the page's own publication");
    const history = await client.history("a", { limit: 2 });
    report({ received, after: got.slice(total), offset: posted.offset, history: history.publications.map((p) => p.data), holes, errors, lost, counters: client.counters, kept: sessionStorage.getItem("myriad.transport") });
  } catch (e) {
    report({ failed: String(e && e.stack || e) });
  }
})();
</script>`;

/** Runs the page with `transports` through a proxy that refuses upgrades unless `websocket`; returns its report and the proxy. */
async function scenario(transports: string[], passUpgrades: boolean) {
  assert.ok(existsSync(BUNDLE), `${BUNDLE} is missing: build first (node scripts/build.mjs)`);
  const node = await startNode(["--history-size", "10000"]);
  let report: (r: Record<string, any>) => void = () => {};
  const reported = new Promise<Record<string, any>>((resolve) => (report = resolve));
  let proxy: HttpProxy | undefined = undefined;
  let publishing: Promise<void> = Promise.resolve();
  // Publishes TOTAL in batches, cutting every connection after each but the last.
  const go = async () => {
    for (let i = 0; i < TOTAL; i += BATCH) {
      await publish(node, Array.from({ length: BATCH }, (_, k) => ({ subject: "a", data: i + k })));
      if (i + BATCH < TOTAL) {
        await new Promise((r) => setTimeout(r, 100));
        proxy!.cut();
      }
    }
  };
  const local = (req: http.IncomingMessage, res: http.ServerResponse): boolean => {
    const path = new URL(req.url!, "http://x").pathname;
    if (path === "/") {
      res.setHeader("content-type", "text/html");
      res.end(page);
    } else if (path === "/myriad.min.js") {
      res.setHeader("content-type", "text/javascript");
      res.end(readFileSync(BUNDLE));
    } else if (path === "/go") {
      publishing = go();
      res.end("ok");
    } else if (path === "/report") {
      let body = "";
      req.on("data", (chunk) => (body += chunk));
      req.on("end", () => {
        res.end("ok");
        report(JSON.parse(body));
      });
    } else return false;
    return true;
  };
  proxy = new HttpProxy(node.ws, Infinity, local);
  proxy.passUpgrades = passUpgrades;
  const base = (await proxy.listen()).replace(/^ws:/, "http:").replace(/\/ws$/, "");
  const browser = openChromium(`${base}/?${new URLSearchParams({ total: String(TOTAL), transports: transports.join(",") })}`);
  try {
    const timeout = new Promise<never>((_, reject) => setTimeout(() => reject(new Error("no report from the page within 60 s")), 60_000).unref());
    const r = await Promise.race([reported, timeout]);
    await publishing;
    return { r, proxy };
  } finally {
    browser.close();
    await proxy.close();
    await node.kill();
  }
}

/** What every scenario must show: each publication once, in order, no hole, and the page's own commands. */
function delivered(r: Record<string, any>): void {
  assert.equal(r.failed, undefined, String(r.failed));
  assert.deepEqual(r.received, Array.from({ length: TOTAL }, (_, i) => i), "every publication once, in order");
  assert.deepEqual(r.holes, []);
  assert.deepEqual(r.errors, []);
  assert.ok(r.lost >= 1, `${r.lost} connections lost: the cuts reached the page`);
  assert.equal(r.offset, TOTAL + 1);
  assert.deepEqual(r.after, ["from the page"]);
  assert.deepEqual(r.history, [TOTAL - 1, "from the page"]);
}

test("Chromium over WebSocket: connections cut while publishing, every publication once and in order", { skip }, async () => {
  const { r, proxy } = await scenario(["websocket", "http_stream", "sse"], true);
  delivered(r);
  assert.equal(proxy.upgradesRefused, 0);
  assert.equal(r.kept, "websocket");
});

for (const transports of [
  ["websocket", "http_stream", "sse"],
  ["websocket", "sse"],
]) {
  test(`Chromium with upgrades refused: falls back to ${transports[1]}, cut while publishing, nothing lost; publish and history posted`, { skip }, async () => {
    const { r, proxy } = await scenario(transports, false);
    delivered(r);
    assert.ok(proxy.upgradesRefused >= 2, `${proxy.upgradesRefused} upgrades refused`);
    assert.equal(r.kept, transports[1], "the transport that worked is remembered");
  });
}
