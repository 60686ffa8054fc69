/**
 * The server API client for Node backends (the `myriad-client/api` entry
 * point): a backend's side of myriad over HTTP on the admin listener
 * (docs/protocol.md, "HTTP publish API"): publish, batch publish,
 * `publishAs`, history with paging, the follow graph's calls and stats,
 * with the publish key or the admin key. The same surface as the Python
 * SDK's `myriad.api` (docs/sdk.md), in this language's case.
 *
 * Every documented error code has its own class, a subclass of `ApiError`
 * carrying `code`, `status` and the error body. Retries (`retries`, 2 by
 * default) only where the docs say a call is safe to repeat: reads, the
 * graph's idempotent batches (and `not_settled`, `store_failed`), anything
 * answered `over_capacity` (refused before it was read), a connection
 * that could not be opened, and a publish answered 503 with nothing
 * published and nothing of unknown outcome. Never a publish of unknown
 * outcome (503 with `unknown` > 0, a timeout while waiting for the answer)
 * unless `retryUnknown`: it may be published twice.
 *
 * It holds no connection state of its own: each call is one `fetch` (the
 * global one, or the one given).
 */

import { backoff } from "./backoff.js";
import type { HistoryResult, PresencePage, PresenceStats } from "./client.js";
import { MyriadError } from "./errors.js";
import type { Position, Publication } from "./protocol.js";
import type { FetchLike } from "./http.js";

/** An error answer of the admin API; `code` is the node's stable code. */
export class ApiError extends MyriadError {
  constructor(
    code: string,
    message: string,
    readonly status: number,
    readonly body: Record<string, unknown>,
  ) {
    super(code, message);
  }
}

/** 401 `unauthorized`: no key, or one that is neither key. */
export class ApiUnauthorizedError extends ApiError {}
/** 403 `forbidden`: the publish key on an endpoint that needs the admin key. */
export class ApiForbiddenError extends ApiError {}
/** 400 `invalid_json`. */
export class InvalidJsonError extends ApiError {}
/** 400 `missing_field`. */
export class MissingFieldError extends ApiError {}
/** 400 `invalid_subject`. */
export class InvalidSubjectError extends ApiError {}
/** 400 `invalid_query`. */
export class InvalidQueryError extends ApiError {}
/** 400 `invalid_position`. */
export class InvalidPositionError extends ApiError {}
/** 400 `reserved_subject`: `/api/publish` to a feed subject. */
export class ReservedSubjectError extends ApiError {}
/** 400 `invalid_user`. */
export class InvalidUserError extends ApiError {}
/** 400 `self_follow`. */
export class SelfFollowError extends ApiError {}
/** 404 `unknown_user`. */
export class UnknownUserError extends ApiError {}
/** 404 `not_found`: no endpoint at this path. */
export class NotFoundError extends ApiError {}
/** 405 `method_not_allowed`. */
export class MethodNotAllowedError extends ApiError {}
/** 408 `body_timeout`. */
export class BodyTimeoutError extends ApiError {}
/** 413 `body_too_large`: the body passes `max_http_body`. */
export class BodyTooLargeError extends ApiError {}
/** 422 `following_limit`. */
export class FollowingLimitError extends ApiError {}
/** 503 `over_capacity`: refused before the request was read (safe to repeat). */
export class OverCapacityError extends ApiError {}
/** 503 `unavailable`: a history read the engine refused. */
export class UnavailableError extends ApiError {}
/** 503 `store_failed`: nothing was applied. */
export class StoreFailedError extends ApiError {}
/** 503 `not_settled`: stored, not yet applied everywhere; sending again is safe. */
export class NotSettledError extends ApiError {}
/** 503 `too_many_status_streams`. */
export class TooManyStatusStreamsError extends ApiError {}

/** What became of each item of a publish that failed part-way. */
abstract class PublishError extends ApiError {
  readonly published: number;
  readonly unknown: number;
  readonly notPublished: number;
  constructor(code: string, message: string, status: number, body: Record<string, unknown>) {
    super(code, message, status, body);
    this.published = Number(body.published ?? 0);
    this.unknown = Number(body.unknown ?? 0);
    this.notPublished = Number(body.not_published ?? 0);
  }
}
/** 503 `publish_failed`: `published`, `unknown`, `notPublished` say what became of each item. */
export class PublishFailedError extends PublishError {}
/** 503 `congested`: the node did not catch up in time (`unknown` is always 0). */
export class CongestedError extends PublishError {}

type ErrorClass = new (code: string, message: string, status: number, body: Record<string, unknown>) => ApiError;

/** Each documented code's class (docs/protocol.md, "HTTP publish API"). */
export const ERRORS: Record<string, ErrorClass> = {
  unauthorized: ApiUnauthorizedError,
  forbidden: ApiForbiddenError,
  invalid_json: InvalidJsonError,
  missing_field: MissingFieldError,
  invalid_subject: InvalidSubjectError,
  invalid_query: InvalidQueryError,
  invalid_position: InvalidPositionError,
  reserved_subject: ReservedSubjectError,
  invalid_user: InvalidUserError,
  self_follow: SelfFollowError,
  unknown_user: UnknownUserError,
  not_found: NotFoundError,
  method_not_allowed: MethodNotAllowedError,
  body_timeout: BodyTimeoutError,
  body_too_large: BodyTooLargeError,
  following_limit: FollowingLimitError,
  over_capacity: OverCapacityError,
  unavailable: UnavailableError,
  store_failed: StoreFailedError,
  not_settled: NotSettledError,
  too_many_status_streams: TooManyStatusStreamsError,
  publish_failed: PublishFailedError,
  congested: CongestedError,
};

export interface ApiClientOptions {
  /** The publish key or the admin key, sent as `X-Api-Key`. */
  key?: string;
  /** Milliseconds for each request (10 s). */
  timeout?: number;
  /** Retries of a call that is safe to repeat (2). */
  retries?: number;
  /** Back-off base in milliseconds between retries (100; capped at 16×). */
  retryDelay?: number;
  /** Uniform in [0, 1), for the back-off's jitter (default `Math.random`). */
  random?: () => number;
  /** The fetch function (default: the global one). */
  fetch?: FetchLike;
}

/** `delivered`: subscribers on this node; `epoch`/`offset` null when the message was dropped. */
export interface PublishOutcome {
  delivered: number;
  epoch: string | null;
  offset: number | null;
}

export interface BatchOutcome {
  delivered: number;
  results: PublishOutcome[];
}

export interface PublishAsOutcome {
  reached: number;
  epoch: string | null;
  offset: number | null;
}

/** One page of `followers` or `following`; `next` is the `after` of the next page. */
export interface UsersPage {
  user: number;
  users: number[];
  next: number | null;
}

/** [follower, followee]. */
export type Edge = [number, number];

/** Whether a call may be sent again after `error` (undefined: a connection that never opened). */
type Safe = (error: ApiError | undefined) => boolean;

/** One request of the API: what to send, when it may be sent again, how to read the answer. */
interface Call<T> {
  method: "GET" | "POST";
  path: string;
  query?: Record<string, string | number | undefined>;
  body?: unknown;
  safe: Safe;
  /** Sent, no answer (a timeout, a cut): sending again is safe only if true. */
  idempotent: boolean;
  read: (m: Record<string, any>) => T;
}

const readSafe: Safe = (e) => e === undefined || e instanceof OverCapacityError || e instanceof UnavailableError;
const graphSafe: Safe = (e) => e === undefined || e instanceof OverCapacityError || e instanceof StoreFailedError || e instanceof NotSettledError;
const publishSafe =
  (retryUnknown: boolean): Safe =>
  (e) =>
    e === undefined || e instanceof OverCapacityError || (e instanceof PublishError && e.published === 0 && (e.unknown === 0 || retryUnknown));

const outcome = (m: Record<string, any>): PublishOutcome => ({ delivered: m.delivered ?? 0, epoch: m.epoch ?? null, offset: m.offset ?? null });

/**
 * Codes of a `fetch` failure whose request never left (the connection was
 * not opened): safe to send again whatever the call.
 */
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "UND_ERR_CONNECT_TIMEOUT"]);

export class ApiClient {
  private readonly base: string;
  private readonly o: Required<Omit<ApiClientOptions, "key">> & { key?: string };

  /** `baseUrl` is the admin listener (`http://127.0.0.1:8081`). */
  constructor(baseUrl: string, options: ApiClientOptions = {}) {
    this.base = baseUrl.replace(/\/+$/, "");
    this.o = {
      timeout: 10_000,
      retries: 2,
      retryDelay: 100,
      random: Math.random,
      fetch: (globalThis as { fetch?: FetchLike }).fetch!,
      ...Object.fromEntries(Object.entries(options).filter(([, value]) => value !== undefined)),
    };
  }

  publish(subject: string, data: unknown, options: { retryUnknown?: boolean } = {}): Promise<PublishOutcome> {
    const retryUnknown = options.retryUnknown === true;
    return this.call({ method: "POST", path: "/api/publish", body: { subject, data }, safe: publishSafe(retryUnknown), idempotent: retryUnknown, read: outcome });
  }

  /** `messages` as [subject, data] pairs, published in order; validated whole first. */
  publishBatch(messages: Array<[string, unknown]>, options: { retryUnknown?: boolean } = {}): Promise<BatchOutcome> {
    const retryUnknown = options.retryUnknown === true;
    return this.call({
      method: "POST",
      path: "/api/publish",
      body: { messages: messages.map(([subject, data]) => ({ subject, data })) },
      safe: publishSafe(retryUnknown),
      idempotent: retryUnknown,
      read: (m) => ({ delivered: m.delivered ?? 0, results: (m.results ?? []).map(outcome) }),
    });
  }

  /** Publishes to `user`'s feed what a `send` from that user would. */
  publishAs(user: number, data: unknown, options: { retryUnknown?: boolean } = {}): Promise<PublishAsOutcome> {
    const retryUnknown = options.retryUnknown === true;
    return this.call({
      method: "POST",
      path: "/api/publish_as",
      body: { user, data },
      safe: publishSafe(retryUnknown),
      idempotent: retryUnknown,
      read: (m) => ({ reached: m.reached ?? 0, epoch: m.epoch ?? null, offset: m.offset ?? null }),
    });
  }

  history(subject: string, options: { limit?: number; since?: Position } = {}): Promise<HistoryResult> {
    const { limit, since } = options;
    return this.call({
      method: "GET",
      path: "/api/history",
      query: { subject, limit, epoch: since?.epoch, offset: since?.offset },
      safe: readSafe,
      idempotent: true,
      read: (m) => m as HistoryResult,
    });
  }

  /** One page of `subject`'s presence members, those after `cursor` (the previous page's `next`). */
  presence(subject: string, options: { cursor?: string; limit?: number } = {}): Promise<PresencePage> {
    return this.call({
      method: "GET",
      path: "/api/presence",
      query: { subject, limit: options.limit, cursor: options.cursor },
      safe: readSafe,
      idempotent: true,
      read: (m) => ({ subject, members: m.members ?? [], next: m.next ?? null }),
    });
  }

  /** `subject`'s presence counts: connections and distinct users, exact. */
  presenceStats(subject: string): Promise<PresenceStats> {
    return this.call({
      method: "GET",
      path: "/api/presence_stats",
      query: { subject },
      safe: readSafe,
      idempotent: true,
      read: (m) => ({ subject, connections: m.connections, users: m.users }),
    });
  }

  /**
   * Every publication after `since` still in history, page by page (each
   * page from the last one received). Throws `MyriadError`
   * `not_recovered` when history no longer reaches back to `since`.
   */
  async *historyPages(subject: string, since: Position, options: { limit?: number } = {}): AsyncGenerator<Publication> {
    for (;;) {
      const page = await this.history(subject, { limit: options.limit, since });
      if (page.recovered === false) throw new MyriadError("not_recovered", `history of ${subject} no longer reaches back to ${since.epoch}:${since.offset}`);
      yield* page.publications;
      const last = page.publications.at(-1);
      if (!last || last.offset >= page.offset) return;
      since = { epoch: last.epoch, offset: last.offset };
    }
  }

  /** Adds follow edges; resolves with how many were new. */
  follow(edges: Edge[]): Promise<number> {
    return this.graph("/api/follow", { edges }, "added");
  }

  /** Removes follow edges; resolves with how many there were. */
  unfollow(edges: Edge[]): Promise<number> {
    return this.graph("/api/unfollow", { edges }, "removed");
  }

  /** Makes users known to the graph; resolves with how many were new. */
  addUsers(users: number[]): Promise<number> {
    return this.graph("/api/users", { users }, "added");
  }

  followers(user: number, options: { after?: number; limit?: number } = {}): Promise<UsersPage> {
    return this.page("followers", user, options);
  }

  following(user: number, options: { after?: number; limit?: number } = {}): Promise<UsersPage> {
    return this.page("following", user, options);
  }

  /** The node's `/stats` document (the admin key). */
  stats(): Promise<Record<string, unknown>> {
    return this.call({ method: "GET", path: "/stats", safe: readSafe, idempotent: true, read: (m) => m });
  }

  private graph(path: string, body: unknown, field: "added" | "removed"): Promise<number> {
    return this.call({ method: "POST", path, body, safe: graphSafe, idempotent: true, read: (m) => Number(m[field]) });
  }

  private page(which: "followers" | "following", user: number, options: { after?: number; limit?: number }): Promise<UsersPage> {
    return this.call({
      method: "GET",
      path: `/api/${which}`,
      query: { user, after: options.after, limit: options.limit },
      safe: readSafe,
      idempotent: true,
      read: (m) => ({ user: Number(m.user), users: (m[which] as number[]).map(Number), next: m.next ?? null }),
    });
  }

  /** Sends `c`, again after a pause while the error says that is safe and retries remain. */
  private async call<T>(c: Call<T>): Promise<T> {
    let url = this.base + c.path;
    const query = Object.entries(c.query ?? {}).filter(([, v]) => v !== undefined) as Array<[string, string | number]>;
    if (query.length) url += "?" + new URLSearchParams(query.map(([k, v]) => [k, String(v)])).toString();
    const headers: Record<string, string> = {};
    if (this.o.key) headers["X-Api-Key"] = this.o.key;
    if (c.body !== undefined) headers["Content-Type"] = "application/json";
    const body = c.body === undefined ? undefined : JSON.stringify(c.body);
    for (let attempt = 1; ; attempt++) {
      let error: MyriadError;
      let retry: boolean;
      let answer: { status: number; text: string } | undefined;
      try {
        const fetch = this.o.fetch; // a plain call: a browser's fetch wants no other `this`
        const response = await fetch(url, { method: c.method, headers, body, signal: AbortSignal.timeout(this.o.timeout) });
        answer = { status: response.status, text: await response.text() };
      } catch (e) {
        const code = (e as { cause?: { code?: string } }).cause?.code;
        // Never left: as safe as the call is. Sent with no answer: the outcome is unknown.
        retry = code !== undefined && NOT_SENT.has(code) ? c.safe(undefined) : c.idempotent;
        error = new MyriadError(isTimeout(e) ? "timeout" : "connection_failed", `${c.method} ${c.path}: ${(e as Error).message}${code ? ` (${code})` : ""}`);
        (error as { cause?: unknown }).cause = e;
      }
      if (answer?.status === 200) return c.read(JSON.parse(answer.text));
      if (answer) {
        error = apiError(answer.status, answer.text);
        retry = c.safe(error as ApiError);
      }
      if (attempt > this.o.retries || !retry!) throw error!;
      await new Promise((resolve) => setTimeout(resolve, backoff(attempt, this.o.retryDelay, this.o.retryDelay * 16, this.o.random)));
    }
  }
}

/** The error answer `text` with `status` as its class; a body that is not the API's own becomes `http_STATUS`. */
function apiError(status: number, text: string): ApiError {
  let error: Record<string, unknown> | undefined;
  try {
    const parsed = JSON.parse(text) as { error?: unknown };
    if (typeof parsed?.error === "object" && parsed.error !== null) error = parsed.error as Record<string, unknown>;
  } catch {
    // not JSON: a proxy's page, say
  }
  error ??= { code: `http_${status}`, message: text.slice(0, 200) };
  const code = String(error.code ?? `http_${status}`);
  return new (ERRORS[code] ?? ApiError)(code, String(error.message ?? code), status, error);
}

function isTimeout(e: unknown): boolean {
  const name = (e as { name?: string }).name;
  return name === "TimeoutError" || name === "AbortError";
}
