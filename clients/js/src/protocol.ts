/**
 * The wire: the shapes of docs/protocol.md's server messages as the
 * client reads them, the check that turns untrusted text into one of
 * them (or nothing), and what a close code says about reconnecting.
 * No state lives here.
 */

/** A place in a subject's stream (docs/protocol.md, "Positions"). */
export interface Position {
  epoch: string;
  offset: number;
}

/** A publication handed to the application. `data` is the published JSON. */
export interface Publication extends Position {
  subject: string;
  data: unknown;
}

/** A member of a presence subject (docs/protocol.md, "Presence"): one connection. */
export interface Member {
  /** The member id: one connection, unique in the cluster while it lives. */
  conn: string;
  /** The user the connection acts as; null when anonymous. */
  user: string | null;
  /** The token's `info` claim; absent without one. */
  info?: unknown;
}

/** A `join` or `leave` of a subject's presence, handed to the subscription. */
export interface PresenceEvent {
  subject: string;
  member: Member;
}

export type ServerMessage =
  | ({ op: "msg" } & Publication)
  | ({ op: "join" | "leave" } & PresenceEvent)
  | ({ op: "subscribed"; id?: number; subject: string; recovered?: boolean } & Position)
  | { op: "error"; id?: number; code: string; message: string; subject?: string }
  | { op: "ok" | "pong" | "history" | "presence" | "presence_stats"; id?: number; [field: string]: unknown };

const isPosition = (m: Record<string, unknown>): boolean =>
  typeof m.epoch === "string" && Number.isSafeInteger(m.offset) && (m.offset as number) >= 0;

/**
 * Parses one text message from the node: the message when it is a JSON
 * object with a known `op` and the fields that op needs; else the `op`
 * when the object had a string one (so the caller can tell an unknown op
 * from a malformed message); else undefined. One call per message on the
 * client's hot path: it returns the parsed object itself, allocating
 * nothing more.
 */
export function parseServerMessage(text: unknown): ServerMessage | string | undefined {
  if (typeof text !== "string") return undefined;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return undefined;
  const m = value as Record<string, unknown>;
  const op = m.op;
  if (typeof op !== "string") return undefined;
  if (m.id !== undefined && !Number.isSafeInteger(m.id)) return op;
  let ok: boolean;
  switch (op) {
    case "msg":
      ok = typeof m.subject === "string" && isPosition(m) && "data" in m;
      break;
    case "subscribed":
      ok =
        typeof m.subject === "string" &&
        isPosition(m) &&
        (m.recovered === undefined || typeof m.recovered === "boolean");
      break;
    case "join":
    case "leave": {
      const member = m.member as Record<string, unknown> | null;
      ok = typeof m.subject === "string" && typeof member === "object" && member !== null && typeof member.conn === "string";
      break;
    }
    case "error":
      ok = typeof m.code === "string";
      break;
    case "ok":
    case "pong":
    case "history":
    case "presence":
    case "presence_stats":
      ok = true;
      break;
    default:
      return op;
  }
  return ok ? (m as unknown as ServerMessage) : op;
}

/** The ops the client understands; any other is `unknown_op`. */
export const KNOWN_OPS = ["msg", "subscribed", "error", "ok", "pong", "history", "presence", "presence_stats", "join", "leave"];

/**
 * Whether a close with `code` lets the client reconnect as it is
 * (docs/protocol.md, "Close reasons"): not 1002, 1003, 1007, 1009, nor
 * the 45xx range ("do not reconnect unchanged").
 */
export function mayReconnect(code: number): boolean {
  return !(code === 1002 || code === 1003 || code === 1007 || code === 1009 || (code >= 4500 && code <= 4999));
}

/** 4501 `token_expired`: get a new token before reconnecting. */
export const TOKEN_EXPIRED = 4501;

/**
 * What to do with a publication at (`epoch`, `offset`) for a subscription
 * at `position` (docs/sdk.md, "Recovery and dedupe").
 */
export function judge(position: Position | null, epoch: string, offset: number): "deliver" | "duplicate" | "gap" | "epoch_changed" {
  if (!position) return "deliver";
  if (epoch !== position.epoch) return "epoch_changed";
  if (offset <= position.offset) return "duplicate";
  return offset === position.offset + 1 ? "deliver" : "gap";
}

/**
 * The answers to `connect` that refuse its credentials (docs/sdk.md,
 * "Tokens"): the node's `invalid_token`, the backend proxy's
 * `proxy_refused` or `forbidden`. Final for that token; any other answer
 * is an attempt that failed.
 */
export const CREDENTIALS_REFUSED: ReadonlySet<string> = new Set(["invalid_token", "proxy_refused", "forbidden"]);

/**
 * The refusals of a subscribe that pass (docs/sdk.md, "Subscription
 * states"): sent again after a delay, while connected.
 */
export const SUBSCRIBE_AGAIN: ReadonlySet<string> = new Set(["unavailable", "rate_limited", "timeout", "proxy_unavailable", "proxy_busy", "too_many_held"]);
