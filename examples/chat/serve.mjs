// Serves the chat page and the SDK's browser bundle on loopback, with
// Node's standard library only:
//
//   node examples/chat/serve.mjs [PORT]     (default 8000)
//
// The bundle is clients/js/dist/myriad.min.js: build it first
// (`cd clients/js && npm ci && npm run build`).

import { readFile } from "node:fs/promises";
import { createServer } from "node:http";
import { fileURLToPath } from "node:url";

const files = {
  "/": ["index.html", "text/html; charset=utf-8"],
  "/myriad.min.js": ["../../clients/js/dist/myriad.min.js", "text/javascript"],
};
const port = Number(process.argv[2] ?? 8000);

const server = createServer(async (req, res) => {
  const file = files[new URL(req.url, "http://x").pathname];
  if (!file) return res.writeHead(404).end("not found\n");
  try {
    const body = await readFile(fileURLToPath(new URL(file[0], import.meta.url)));
    res.writeHead(200, { "content-type": file[1] }).end(body);
  } catch (e) {
    res.writeHead(500).end(`${file[0]}: ${e.code} (build the SDK: cd clients/js && npm ci && npm run build)\n`);
  }
});
server.listen(port, "127.0.0.1", () =>
  console.log(`chat on http://127.0.0.1:${server.address().port}/ (myriad serve on ws://127.0.0.1:8080/ws)`));
