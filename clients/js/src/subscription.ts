/**
 * One subject the application holds: its state, its position, and the
 * dedupe that keeps duplicates and reordering away from the application
 * (docs/sdk.md, "Subscription states", "Recovery and dedupe"). It owns
 * no socket: the client sends its commands and hands it what the node
 * says about its subject.
 */

import { Emitter } from "./emitter.js";
import { MyriadError, TimeoutError } from "./errors.js";
import { judge, type Position, type PresenceEvent, type Publication } from "./protocol.js";

export type SubscriptionState = "unsubscribed" | "subscribing" | "subscribed";

/** Why a subscription changed state. */
export type SubscriptionCause =
  | { type: "call"; method: "subscribe" | "unsubscribe" }
  | { type: "subscribed"; recovered?: boolean }
  | { type: "error"; error: MyriadError }
  // the client's own cause, when it left `connected` or closed
  | { type: "client"; cause: unknown };

/** A hole in what the application received, announced before the publication after it. */
export interface Discontinuity {
  subject: string;
  cause: "not_recovered" | "stream_broke" | "gap" | "epoch_changed";
  /** The position before the hole, or null when there was none. */
  previous: Position | null;
  /** Where delivery continues from: every publication after it follows. */
  position: Position;
  /** Offsets skipped when the epoch stayed the same; null when unknown. */
  missed: number | null;
}

export interface SubscriptionEvents {
  state: { state: SubscriptionState; previous: SubscriptionState; cause: SubscriptionCause };
  publication: Publication;
  discontinuity: Discontinuity;
  /** A member joined the subject (a namespace with `join_leave`, over WebSocket only). */
  join: PresenceEvent;
  /** A member left the subject. */
  leave: PresenceEvent;
}

/** @internal What a subscription needs from its client. */
export interface SubscriptionHost {
  /** @internal */ attach(sub: Subscription): void;
  /** @internal */ detach(sub: Subscription): Promise<void>;
  /** @internal */ duplicate(): void;
}

export class Subscription extends Emitter<SubscriptionEvents> {
  state: SubscriptionState = "unsubscribed";
  /**
   * Where the subscription is (`epoch` null: nowhere yet): the last
   * publication handed over, or the last `subscribed` answer's position.
   * Two fields of this object rather than an object of their own: a
   * publication only bumps `offset`, with no allocation and one pointer
   * hop less on the client's hot path.
   */
  private epoch: string | null = null;
  private offset = 0;
  private waiters: Array<(error?: MyriadError) => void> = [];
  /** Why it last went to `unsubscribed`, for `ready()`. */
  private ended?: MyriadError;

  /**
   * @internal Made by `Client.subscribe`, or by the client for a feed the
   * node subscribed the connection to by itself (`server`).
   */
  constructor(
    readonly subject: string,
    private host: SubscriptionHost,
    since?: Position,
    /** The node made this subscription (a feed of the token's user): the node, not the client, makes it again after a reconnect. */
    readonly server = false,
  ) {
    super();
    if (since) this.moveTo(since);
  }

  /** The last publication handed over, or the last `subscribed` answer's position; a copy. */
  get position(): Position | null {
    return this.epoch === null ? null : { epoch: this.epoch, offset: this.offset };
  }

  private moveTo(position: Position): void {
    this.epoch = position.epoch;
    this.offset = position.offset;
  }

  /** Subscribes again after `unsubscribe()` (or a refusal), resuming from `position`. */
  subscribe(): void {
    if (this.state !== "unsubscribed") return;
    this.setState("subscribing", { type: "call", method: "subscribe" });
    this.host.attach(this);
  }

  /**
   * Drops the subscription; resolves when the node confirmed, when the
   * connection ended first, or at once when not connected. Never rejects.
   */
  unsubscribe(): Promise<void> {
    if (this.state === "unsubscribed") return Promise.resolve();
    this.setState("unsubscribed", { type: "call", method: "unsubscribe" });
    return this.host.detach(this);
  }

  /**
   * Resolves when the subscription is `subscribed`; rejects with
   * `TimeoutError` after `timeout` ms, or with the refusal when it goes to
   * `unsubscribed` first.
   */
  ready(timeout = 10_000): Promise<void> {
    if (this.state === "subscribed") return Promise.resolve();
    if (this.state === "unsubscribed") return Promise.reject(this.ended ?? new MyriadError("unsubscribed", `${this.subject} is not subscribed`));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new TimeoutError(`subscribe to ${this.subject}`)), timeout);
      this.waiters.push((error) => {
        clearTimeout(timer);
        error ? reject(error) : resolve();
      });
    });
  }

  /** @internal */
  setState(state: SubscriptionState, cause: SubscriptionCause): void {
    const previous = this.state;
    if (previous === state) return;
    this.state = state;
    this.emit("state", { state, previous, cause });
    if (state === "subscribed") for (const w of this.waiters.splice(0)) w();
    if (state === "unsubscribed") {
      const error = cause.type === "error" ? cause.error : new MyriadError("unsubscribed", `${this.subject} was unsubscribed`);
      this.ended = error;
      for (const w of this.waiters.splice(0)) w(error);
    }
  }

  /** @internal The node's `subscribed` for this subject; `asked` when it answers a subscribe of ours. */
  subscribed(position: Position, recovered: boolean | undefined, asked: boolean): void {
    const at = { epoch: position.epoch, offset: position.offset };
    if (this.state === "subscribing") {
      const was = this.position;
      // A feed the node made again after a reconnect comes without
      // recovery: a position other than the one held means a hole.
      const moved = this.server && was && (was.epoch !== at.epoch || was.offset !== at.offset);
      if (recovered === false || moved) this.hole("not_recovered", at);
      else if (recovered !== true) this.moveTo(at);
      this.setState("subscribed", { type: "subscribed", recovered });
    } else if (this.state === "subscribed" && !asked && recovered === false) {
      this.hole("stream_broke", at);
    }
  }

  /** @internal A publication of this subject; false when the subscription does not take it. */
  deliver(p: Publication): boolean {
    if (this.state !== "subscribed") return false;
    if (p.epoch === this.epoch && p.offset === this.offset + 1) {
      this.offset = p.offset; // the common case, without judge()'s verdict
    } else {
      const verdict = judge(this.position, p.epoch, p.offset);
      if (verdict === "duplicate") {
        this.host.duplicate();
        return true;
      }
      if (verdict !== "deliver") this.hole(verdict, { epoch: p.epoch, offset: p.offset - 1 });
      this.moveTo(p);
    }
    this.emit("publication", { subject: p.subject, epoch: p.epoch, offset: p.offset, data: p.data });
    return true;
  }

  /** @internal A `join` or `leave` of this subject; taken only while subscribed. */
  presenceEvent(kind: "join" | "leave", e: PresenceEvent): void {
    if (this.state === "subscribed") this.emit(kind, { subject: e.subject, member: e.member });
  }

  private hole(cause: Discontinuity["cause"], position: Position): void {
    const previous = this.position;
    const missed = previous && previous.epoch === position.epoch ? position.offset - previous.offset : null;
    this.moveTo(position);
    this.emit("discontinuity", { subject: this.subject, cause, previous, position, missed });
  }
}
