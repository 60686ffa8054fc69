/**
 * examples/chat in headless Chromium against the real node: two pages,
 * each driven through its own form by a script this test appends to the
 * page. Ann joins and says hello; then Bob joins, finds Ann's message in
 * the room's history, and answers; Ann sees the answer live. Each page
 * posts the text of its message list back to this test's HTTP server.
 * Needs the built bundle; skipped, saying so, without Chromium (CHROMIUM,
 * default `chromium` on PATH).
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { startNode } from "../integration/harness.js";
import { BUNDLE, openChromium, skip } from "./chromium.js";
const PAGE = "../../examples/chat/index.html";

// Plays one user: joins through the form, waits for the room, says
// `say` once `expect` is on the page (or at once), reports the list when
// `until` is on it.
const driver = `<script>
(async () => {
  const q = new URLSearchParams(location.search);
  const report = (r) => fetch("/report?who=" + q.get("name"), { method: "POST", body: JSON.stringify(r) });
  const text = () => [...document.querySelectorAll("#log p")].map((p) => p.textContent);
  const wait = async (ok) => { const end = Date.now() + 10000; while (!ok()) { if (Date.now() > end) throw new Error("timed out on the page: " + JSON.stringify(text())); await new Promise((r) => setTimeout(r, 20)); } };
  try {
    const join = document.getElementById("join");
    join.elements.name.value = q.get("name");
    join.elements.room.value = "lobby";
    join.requestSubmit();
    await wait(() => document.body.dataset.room === "subscribed");
    if (q.get("expect")) await wait(() => text().some((t) => t.includes(q.get("expect"))));
    const say = document.getElementById("say");
    say.elements.text.value = q.get("say");
    say.requestSubmit();
    await wait(() => text().some((t) => t.includes(q.get("until"))));
    report({ lines: text(), state: document.getElementById("state").textContent });
  } catch (e) {
    report({ failed: String(e && e.stack || e) });
  }
})();
</script>`;

test("two chat pages (examples/chat) exchange messages, the second seeing the first's in history", { skip }, async () => {
  assert.ok(existsSync(BUNDLE), `${BUNDLE} is missing: build first (node scripts/build.mjs)`);
  const node = await startNode();
  const browsers: Array<{ close(): void }> = [];
  const reports = new Map<string, (r: Record<string, unknown>) => void>();
  const reported = (who: string) => new Promise<Record<string, unknown>>((resolve) => reports.set(who, resolve));
  const server = createServer((req, res) => {
    const url = new URL(req.url!, "http://x");
    if (url.pathname === "/myriad.min.js") {
      res.setHeader("content-type", "text/javascript");
      return res.end(readFileSync(BUNDLE));
    }
    if (url.pathname === "/report") {
      let body = "";
      req.on("data", (chunk) => (body += chunk));
      req.on("end", () => {
        res.end("ok");
        reports.get(url.searchParams.get("who")!)?.(JSON.parse(body));
      });
      return;
    }
    res.setHeader("content-type", "text/html");
    res.end(readFileSync(PAGE, "utf8").replace("</html>", `${driver}</html>`));
  });
  const open = (port: number, query: Record<string, string>) => {
    browsers.push(openChromium(`http://127.0.0.1:${port}/?${new URLSearchParams({ ws: node.url, ...query })}`));
  };
  const within = <T>(p: Promise<T>, what: string) =>
    Promise.race([p, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`no report from ${what} within 30 s`)), 30_000).unref())]);
  try {
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    const ann = reported("ann");
    const bob = reported("bob");
    open(port, { name: "ann", say: "hello from ann", until: "hello from bob" });
    // Bob comes once Ann's message is in the room's history.
    const deadline = Date.now() + 30_000;
    for (;;) {
      const r = await fetch(`http://${node.admin}/api/history?subject=lobby`).then((r) => r.json() as Promise<{ publications?: unknown[] }>);
      if ((r.publications?.length ?? 0) > 0) break;
      assert.ok(Date.now() < deadline, "Ann's message never reached the room's history");
      await new Promise((r) => setTimeout(r, 50));
    }
    open(port, { name: "bob", expect: "hello from ann", say: "hello from bob", until: "hello from bob" });
    const [a, b] = await Promise.all([within(ann, "ann"), within(bob, "bob")]);
    assert.equal(a.failed, undefined, String(a.failed));
    assert.equal(b.failed, undefined, String(b.failed));
    assert.deepEqual(a.lines, ["joined lobby: 0 earlier message(s)", "#1 ann: hello from ann", "#2 bob: hello from bob"]);
    assert.deepEqual(b.lines, ["joined lobby: 1 earlier message(s)", "#1 ann: hello from ann", "#2 bob: hello from bob"]);
    assert.equal(a.state, "connected");
    assert.equal(b.state, "connected");
  } finally {
    for (const b of browsers) b.close();
    server.closeAllConnections();
    server.close();
    await node.kill();
  }
});
