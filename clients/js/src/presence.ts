/**
 * `MemberList`: a presence subject's members held exact on one
 * subscription, by docs/protocol.md's "snapshot then diffs, with no gap"
 * recipe. It owns the list and the paging; it sends nothing but
 * `presence` commands and never subscribes or unsubscribes by itself.
 * It needs `join`/`leave` events: a namespace with `join_leave = true`,
 * over WebSocket (other transports get no events, so there it holds a
 * snapshot that is exact only when taken).
 */

import { Emitter } from "./emitter.js";
import type { MyriadError } from "./errors.js";
import type { Member } from "./protocol.js";
import type { PresencePage } from "./client.js";
import type { Subscription } from "./subscription.js";

export interface MemberListEvents {
  /** The list changed: a join, a leave, or a page of the snapshot applied. */
  change: { members: ReadonlyMap<string, Member> };
  /** Every page of the snapshot since the last `subscribed` is applied: the list is complete. */
  synced: { members: ReadonlyMap<string, Member> };
  /** A page could not be read; the list waits for the next `subscribed` to start again. */
  error: MyriadError;
}

/** What the list needs of the client: one page of presence, handed over as its answer is read (`Client.presencePage`). */
export interface PresenceSource {
  presencePage(subject: string, options: { cursor?: string; limit?: number }, done: (page?: PresencePage, error?: MyriadError) => void): void;
}

export class MemberList extends Emitter<MemberListEvents> {
  /** The members by id. */
  readonly members = new Map<string, Member>();
  /** Whether the snapshot since the last `subscribed` is fully applied. */
  synced = false;
  /** Bumped per `subscribed` (and by `stop()`): pages of an older round are dropped. */
  private round = 0;
  private readonly unlisten: Array<() => void>;

  /** Follows `sub` from now: each time it is `subscribed`, starts from an empty list. */
  constructor(
    private readonly client: PresenceSource,
    readonly sub: Subscription,
    private readonly limit?: number,
  ) {
    super();
    const apply = (join: boolean) => (e: { member: Member }) => {
      join ? this.members.set(e.member.conn, e.member) : this.members.delete(e.member.conn);
      this.changed();
    };
    this.unlisten = [
      sub.on("join", apply(true)),
      sub.on("leave", apply(false)),
      sub.on("state", (e) => {
        this.round++;
        this.synced = false;
        if (e.state === "subscribed") this.restart();
      }),
    ];
    if (sub.state === "subscribed") this.restart();
  }

  /** Stops following the subscription (which stays as it is). */
  stop(): void {
    this.round++;
    for (const off of this.unlisten) off();
  }

  /**
   * A new connection (its own member id changed): the list starts empty,
   * events apply from now, and the snapshot is read page by page, each
   * page replacing the ids it covers (after the cursor sent, up to its
   * last member; to the end on the last page).
   */
  private restart(): void {
    const round = this.round;
    this.members.clear();
    this.changed();
    const read = (cursor?: string): void =>
      this.client.presencePage(this.sub.subject, { cursor, limit: this.limit }, (page, error) => {
        if (round !== this.round) return;
        if (!page) return void this.emit("error", error!);
        const last = page.next === null ? undefined : page.members.at(-1)?.conn;
        for (const id of [...this.members.keys()]) {
          if ((cursor === undefined || id > cursor) && (last === undefined || id <= last)) this.members.delete(id);
        }
        for (const m of page.members) this.members.set(m.conn, m);
        this.changed();
        if (page.next !== null) return read(page.next);
        this.synced = true;
        this.emit("synced", { members: this.members });
      });
    read();
  }

  private changed(): void {
    this.emit("change", { members: this.members });
  }
}
