/**
 * Headless Chromium for the browser tests: whether there is one
 * (CHROMIUM, default `chromium` on PATH; the tests skip, saying so,
 * without it), and one browser process on one page with a profile of its
 * own, ended with its process group.
 */

import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const CHROMIUM = process.env.CHROMIUM ?? "chromium";

/** `false`, or why the browser tests are skipped. */
export const skip: false | string = spawnSync(CHROMIUM, ["--version"], { stdio: "ignore" }).status === 0 ? false : `no Chromium (${CHROMIUM}) on this machine`;

/** The minified bundle the pages load (built by scripts/build.mjs). */
export const BUNDLE = "dist/myriad.min.js";

/** Opens `url` in a new headless Chromium; `close()` kills it and drops its profile. */
export function openChromium(url: string): { close(): void } {
  const profile = mkdtempSync(join(tmpdir(), "myriad-sdk-chromium-"));
  const browser = spawn(
    CHROMIUM,
    ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions", "--disable-background-networking", `--user-data-dir=${profile}`, url],
    { stdio: "ignore", detached: true },
  );
  return {
    close() {
      try {
        process.kill(-browser.pid!, "SIGKILL");
      } catch {
        // already gone
      }
      rmSync(profile, { recursive: true, force: true });
    },
  };
}
