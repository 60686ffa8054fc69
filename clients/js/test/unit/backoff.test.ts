import assert from "node:assert/strict";
import { test } from "node:test";
import { backoff } from "../../src/backoff.js";
import { seeded } from "../fake.js";

const ceiling = (n: number) => Math.min(20_000, 500 * 2 ** (n - 1));

test("each pause is uniform below min(max, min × 2^(n−1)): full jitter", () => {
  const random = seeded(42);
  for (let n = 1; n <= 12; n++) {
    for (let i = 0; i < 200; i++) {
      const d = backoff(n, 500, 20_000, random);
      assert.ok(d >= 0 && d < ceiling(n), `attempt ${n}: ${d}`);
    }
  }
});

test("the extremes of random() give 0 and just under the ceiling", () => {
  assert.equal(backoff(1, 500, 20_000, () => 0), 0);
  assert.equal(backoff(1, 500, 20_000, () => 0.999999), 499);
  assert.equal(backoff(3, 500, 20_000, () => 0.5), 1000);
  assert.equal(backoff(7, 500, 20_000, () => 0.5), 10_000, "2^6 × 500 passes the cap of 20 s");
});

test("a long outage neither overflows nor passes the cap", () => {
  for (const n of [31, 64, 1000, 1e9]) {
    const d = backoff(n, 500, 20_000, () => 0.999999);
    assert.ok(Number.isFinite(d) && d < 20_000, `attempt ${n}: ${d}`);
  }
});

test("a seeded generator gives the same pauses, whose mean is half the ceiling", () => {
  const a = seeded(7);
  const b = seeded(7);
  const first = Array.from({ length: 50 }, (_, i) => backoff((i % 8) + 1, 500, 20_000, a));
  const second = Array.from({ length: 50 }, (_, i) => backoff((i % 8) + 1, 500, 20_000, b));
  assert.deepEqual(first, second);
  const random = seeded(1);
  let sum = 0;
  for (let i = 0; i < 10_000; i++) sum += backoff(5, 500, 20_000, random);
  const mean = sum / 10_000;
  assert.ok(mean > 3_800 && mean < 4_200, `mean ${mean}, expected about 4000`);
});
