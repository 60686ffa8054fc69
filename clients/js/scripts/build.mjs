// Builds dist/: ESM and CommonJS of the client (one file each) and of the
// server API client (`myriad-client/api`, src/api.ts), type declarations
// for each, and one minified browser bundle of the client (an IIFE
// defining `Myriad`). The API client's files take the error classes from
// the client's (an import of ./index.js), not from a copy of their own, so
// that `instanceof MyriadError` holds for the errors of both.
// Checks that each loads and exports the client, and fails, printing the
// size, when the bundle minified and gzipped passes the budget
// (docs/sdk.md: the whole client at most 8 KB).

import { execFileSync } from "node:child_process";
import { cpSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { runInNewContext } from "node:vm";
import { gzipSync } from "node:zlib";
import { build } from "esbuild";

// MYRIAD_SIZE_BUDGET lowers the budget only to see the build fail.
const BUDGET = Math.min(8192, Number(process.env.MYRIAD_SIZE_BUDGET ?? 8192));
const common = { entryPoints: ["src/index.ts"], bundle: true, target: "es2020", logLevel: "warning" };
/** For the API client: ./errors.js resolves to the client's entry point, `index` (./index.js or ./index.cjs). */
const sharedErrors = (index) => ({
  name: "shared-errors",
  setup(b) {
    b.onResolve({ filter: /^\.\/errors\.js$/ }, () => ({ path: index, external: true }));
  },
});

rmSync("dist", { recursive: true, force: true });
await build({ ...common, format: "esm", outfile: "dist/esm/index.js" });
await build({ ...common, format: "cjs", outfile: "dist/cjs/index.cjs" });
await build({ ...common, entryPoints: ["src/api.ts"], format: "esm", outfile: "dist/esm/api.js", plugins: [sharedErrors("./index.js")] });
await build({ ...common, entryPoints: ["src/api.ts"], format: "cjs", outfile: "dist/cjs/api.cjs", plugins: [sharedErrors("./index.cjs")] });
await build({ ...common, format: "iife", globalName: "Myriad", minify: true, outfile: "dist/myriad.min.js" });
execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "tsconfig.json"], { stdio: "inherit" });
// The same declarations for `require`, under a package.json that makes
// them CommonJS: TypeScript reads .d.ts files by the nearest "type".
cpSync("dist/types", "dist/cjs/types", { recursive: true });
writeFileSync("dist/cjs/package.json", '{ "type": "commonjs" }\n');

// Each output loads and exports the client.
const bundle = {};
runInNewContext(readFileSync("dist/myriad.min.js", "utf8"), bundle);
const esm = await import(new URL("../dist/esm/index.js", import.meta.url).href);
const cjs = createRequire(import.meta.url)("../dist/cjs/index.cjs");
for (const [name, m] of [["bundle", bundle.Myriad], ["esm", esm], ["cjs", cjs]]) {
  if (typeof m?.Client !== "function" || typeof m?.MyriadError !== "function") {
    console.error(`build: the ${name} output does not export Client and MyriadError`);
    process.exit(1);
  }
}
// Each API output loads, exports the API client, and its errors are the client's.
const apiEsm = await import(new URL("../dist/esm/api.js", import.meta.url).href);
const apiCjs = createRequire(import.meta.url)("../dist/cjs/api.cjs");
for (const [name, api, client] of [["esm", apiEsm, esm], ["cjs", apiCjs, cjs]]) {
  if (typeof api?.ApiClient !== "function" || !(new api.ApiError("x", "x", 400, {}) instanceof client.MyriadError)) {
    console.error(`build: the ${name} API output does not export ApiClient, or its errors are not the client's MyriadError`);
    process.exit(1);
  }
}

const minified = readFileSync("dist/myriad.min.js");
const gzipped = gzipSync(minified, { level: 9 }).length;
const verdict = gzipped <= BUDGET ? "within" : "OVER";
console.log(`dist/myriad.min.js: ${minified.length} bytes minified, ${gzipped} bytes min+gzip (${verdict} the budget of ${BUDGET})`);
if (gzipped > BUDGET) process.exit(1);
