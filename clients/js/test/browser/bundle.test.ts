/**
 * The minified bundle (dist/myriad.min.js, so run after the build) in a
 * real headless Chromium against the real node: the page loads it with a
 * <script> tag, uses the browser's own WebSocket and window, subscribes,
 * publishes, and posts what it saw back to this test's HTTP server.
 * Skipped, saying so, when there is no Chromium (chromium.ts).
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { publish, startNode } from "../integration/harness.js";
import { BUNDLE, openChromium, skip } from "./chromium.js";

const page = (wsUrl: string) => `<!doctype html><meta charset="utf-8"><script src="/myriad.min.js"></script>
<script>
(async () => {
  const report = (r) => fetch("/result", { method: "POST", body: JSON.stringify(r) });
  try {
    const errors = [];
    const states = [];
    const client = new Myriad.Client(${JSON.stringify(wsUrl)}, { minReconnectDelay: 50 });
    client.on("error", (e) => errors.push(e.code));
    client.on("state", (s) => states.push(s.state));
    client.connect();
    const sub = client.subscribe("browser");
    const got = [];
    sub.on("publication", (p) => got.push(p.data));
    await sub.ready();
    const ok = await client.publish("browser", { from: "page" });
    await fetch("/published");
    const deadline = Date.now() + 10000;
    while (got.length < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    report({ got, offset: ok.offset, states, errors, bundle: typeof Myriad.Client });
  } catch (e) {
    report({ failed: String(e && e.stack || e) });
  }
})();
</script>`;

test("the minified bundle subscribes and publishes from a real browser page", { skip }, async () => {
  assert.ok(existsSync(BUNDLE), `${BUNDLE} is missing: build first (node scripts/build.mjs)`);
  const node = await startNode();
  let browser: { close(): void } | undefined;
  let resolveResult: (r: Record<string, unknown>) => void = () => {};
  const result = new Promise<Record<string, unknown>>((resolve) => (resolveResult = resolve));
  const server = createServer((req, res) => {
    if (req.url === "/myriad.min.js") {
      res.setHeader("content-type", "text/javascript");
      return res.end(readFileSync(BUNDLE));
    }
    if (req.url === "/published") {
      // The page's own publish is in; the HTTP API's follows it.
      void publish(node, [{ subject: "browser", data: "from the API" }]).then(() => res.end("ok"));
      return;
    }
    if (req.url === "/result") {
      let body = "";
      req.on("data", (chunk) => (body += chunk));
      req.on("end", () => {
        res.end("ok");
        resolveResult(JSON.parse(body));
      });
      return;
    }
    res.setHeader("content-type", "text/html");
    res.end(page(node.url));
  });
  try {
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    browser = openChromium(`http://127.0.0.1:${port}/`);
    const timeout = new Promise<never>((_, reject) => setTimeout(() => reject(new Error("no result from the page within 30 s")), 30_000).unref());
    const r = await Promise.race([result, timeout]);
    assert.equal(r.failed, undefined, String(r.failed));
    assert.equal(r.bundle, "function");
    assert.deepEqual(r.got, [{ from: "page" }, "from the API"]);
    assert.equal(r.offset, 1);
    assert.deepEqual(r.states, ["connecting", "connected"]);
    assert.deepEqual(r.errors, []);
  } finally {
    browser?.close();
    server.closeAllConnections();
    server.close();
    await node.kill();
  }
});
