/**
 * What the client reads from a token: only its `exp`, to refresh before
 * it (docs/sdk.md, "Tokens"). The node checks the signature; the client
 * never needs to.
 */

/** The `exp` claim (Unix seconds) of a JWT, or undefined when it has none or is no JWT. */
export function tokenExp(token: string): number | undefined {
  const payload = token.split(".")[1];
  if (!payload) return undefined;
  try {
    const base64 = payload.replace(/-/g, "+").replace(/_/g, "/");
    const claims: unknown = JSON.parse(atob(base64 + "=".repeat((4 - (base64.length % 4)) % 4)));
    const exp = (claims as { exp?: unknown } | null)?.exp;
    return typeof exp === "number" && Number.isFinite(exp) ? exp : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Milliseconds from `now` until the refresh of a token expiring at `exp`
 * (seconds): `exp − min(30 s, remaining / 2)`, never negative.
 */
export function refreshDelay(exp: number, now: number): number {
  const remaining = exp * 1000 - now;
  return Math.max(0, remaining - Math.min(30_000, remaining / 2));
}
