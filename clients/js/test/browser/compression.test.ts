/**
 * permessage-deflate (RFC 7692) in a real headless Chromium: the browser's
 * own WebSocket offers it by default, the node agrees, and the SDK,
 * unchanged, receives publications the node sent compressed, intact.
 * The page is the only client of the node, so the node's own counters say
 * what the browser negotiated and got: one agreement, and one compressed
 * frame per publication. Counts and contents only. Skipped, saying so,
 * without Chromium.
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { publish, startNode } from "../integration/harness.js";
import { BUNDLE, openChromium, skip } from "./chromium.js";

const COUNT = 3;

// Subscribes to `z` over WebSocket only, asks the test to publish (`/go`),
// takes COUNT publications and reports their data.
const page = `<!doctype html><meta charset="utf-8"><script src="/myriad.min.js"></script>
<script>
(async () => {
  const q = new URLSearchParams(location.search);
  const report = (r) => fetch("/report", { method: "POST", body: JSON.stringify(r) });
  try {
    const client = new Myriad.Client(q.get("ws"), { transports: ["websocket"] });
    const got = [];
    const sub = client.subscribe("z");
    sub.on("publication", (p) => got.push(p.data));
    client.connect();
    await sub.ready(30000);
    await fetch("/go");
    const end = Date.now() + 30000;
    while (got.length < ${COUNT}) {
      if (Date.now() > end) throw new Error("got " + got.length + " of ${COUNT}");
      await new Promise((r) => setTimeout(r, 20));
    }
    report({ got });
  } catch (e) {
    report({ failed: String(e && e.stack || e) });
  }
})();
</script>`;

/** A message of text well above the node's compression threshold. */
function message(n: number) {
  const line = `Publication ${n}: the meeting moved to room B at three, bring a laptop because the projector is broken again. `;
  return { n, text: line.repeat(6), tags: ["chat", "room-b", `n${n}`] };
}

/** The value of an unlabelled series in the node's /metrics. */
async function metric(admin: string, name: string): Promise<number> {
  const text = await fetch(`http://${admin}/metrics`).then((r) => r.text());
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  assert.ok(line, `${name} missing from /metrics`);
  return Number(line.split(" ")[1]);
}

test("Chromium negotiates permessage-deflate and the SDK reads compressed publications intact", { skip }, async () => {
  assert.ok(existsSync(BUNDLE), `${BUNDLE} is missing: build first (node scripts/build.mjs)`);
  const node = await startNode();
  let browser: { close(): void } | undefined;
  let go: () => void = () => {};
  const asked = new Promise<void>((resolve) => (go = resolve));
  let done: (r: Record<string, unknown>) => void = () => {};
  const reported = new Promise<Record<string, unknown>>((resolve) => (done = resolve));
  const server = createServer((req, res) => {
    const url = new URL(req.url!, "http://x");
    if (url.pathname === "/myriad.min.js") {
      res.setHeader("content-type", "text/javascript");
      return res.end(readFileSync(BUNDLE));
    }
    if (url.pathname === "/go") {
      go();
      return res.end("ok");
    }
    if (url.pathname === "/report") {
      let body = "";
      req.on("data", (chunk) => (body += chunk));
      req.on("end", () => {
        res.end("ok");
        done(JSON.parse(body) as Record<string, unknown>);
      });
      return;
    }
    res.setHeader("content-type", "text/html");
    res.end(page);
  });
  const within = <T>(p: Promise<T>, what: string) =>
    Promise.race([p, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${what} within 30 s`)), 30_000).unref())]);
  try {
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    browser = openChromium(`http://127.0.0.1:${port}/?${new URLSearchParams({ ws: node.url })}`);
    await within(asked, "the page subscribed");
    const sent = Array.from({ length: COUNT }, (_, i) => message(i + 1));
    await publish(node, sent.map((data) => ({ subject: "z", data })));
    const r = await within(reported, "the page's report");
    assert.equal(r.failed, undefined, String(r.failed));
    assert.deepEqual(r.got, sent);
    // Chromium offered, the node agreed, and every publication went to it
    // in the one compressed frame made for it.
    assert.equal(await metric(node.admin, "myriad_compression_negotiated_total"), 1);
    assert.equal(await metric(node.admin, "myriad_compression_frames_total"), COUNT);
    assert.ok((await metric(node.admin, "myriad_compression_bytes_after_total")) < (await metric(node.admin, "myriad_compression_bytes_before_total")));
  } finally {
    browser?.close();
    server.closeAllConnections();
    server.close();
    await node.kill();
  }
});
