/**
 * The pause before a reconnect attempt (docs/sdk.md, "Reconnect:
 * back-off"): exponential with full jitter, so that clients cut off
 * together do not come back together.
 */

/**
 * The pause in milliseconds before attempt `attempt` (1 is the first of
 * an outage): uniform in [0, min(max, min × 2^(attempt − 1))). The
 * exponent is capped so that a long outage cannot overflow.
 */
export function backoff(attempt: number, min: number, max: number, random: () => number): number {
  const ceiling = Math.min(max, min * 2 ** Math.min(Math.max(attempt - 1, 0), 30));
  return Math.floor(random() * ceiling);
}
