// Builds dist/: ESM and CommonJS (one file each), type declarations, and
// one minified browser bundle (an IIFE defining `Myriad`). Fails, printing
// the size, when the bundle minified and gzipped passes the budget
// (docs/sdk.md: the whole client at most 8 KB).

import { execFileSync } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { build } from "esbuild";

const BUDGET = 8192;
const common = { entryPoints: ["src/index.ts"], bundle: true, target: "es2020", logLevel: "warning" };

rmSync("dist", { recursive: true, force: true });
await build({ ...common, format: "esm", outfile: "dist/esm/index.js" });
await build({ ...common, format: "cjs", outfile: "dist/cjs/index.cjs" });
await build({ ...common, format: "iife", globalName: "Myriad", minify: true, outfile: "dist/myriad.min.js" });
execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "tsconfig.json"], { stdio: "inherit" });

const minified = readFileSync("dist/myriad.min.js");
const gzipped = gzipSync(minified, { level: 9 }).length;
const verdict = gzipped <= BUDGET ? "within" : "OVER";
console.log(`dist/myriad.min.js: ${minified.length} bytes minified, ${gzipped} bytes min+gzip (${verdict} the budget of ${BUDGET})`);
if (gzipped > BUDGET) process.exit(1);
