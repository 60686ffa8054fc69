// Compiles the tests (tsconfig.test.json, into build/) and runs them with
// node:test: `unit`, `integration` (needs MYRIAD_BIN, default the
// repository's release build, ../../target/release/myriad), `browser` (the built bundle in headless Chromium
// against MYRIAD_BIN; skipped without Chromium) or `all` (the three).

import { execFileSync } from "node:child_process";
import { readdirSync, rmSync } from "node:fs";

const which = process.argv[2] ?? "all";
rmSync("build", { recursive: true, force: true });
execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "tsconfig.test.json"], { stdio: "inherit" });
const dirs = which === "all" ? ["unit", "integration", "browser"] : [which];
const files = dirs.flatMap((d) =>
  readdirSync(`build/test/${d}`)
    .filter((f) => f.endsWith(".test.js"))
    .map((f) => `build/test/${d}/${f}`),
);
try {
  execFileSync(process.execPath, ["--enable-source-maps", "--test", "--test-concurrency=1", "--test-timeout=120000", ...files], { stdio: "inherit" });
} catch {
  process.exit(1);
}
