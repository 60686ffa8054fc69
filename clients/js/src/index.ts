/**
 * myriad's TypeScript client: the public surface. docs/sdk.md says what
 * each part does; docs/protocol.md what travels on the wire.
 */

export { Client } from "./client.js";
export type {
  ClientCause,
  ClientEvents,
  ClientOptions,
  ClientState,
  Counters,
  HistoryResult,
  PresencePage,
  PresenceStats,
  PublishResult,
  WebSocketConstructor,
  WebSocketLike,
} from "./client.js";
export type { EventSourceConstructor, EventSourceLike, FetchLike, Transport } from "./http.js";
export { Subscription } from "./subscription.js";
export type { Discontinuity, SubscriptionCause, SubscriptionEvents, SubscriptionState } from "./subscription.js";
export { MemberList } from "./presence.js";
export type { MemberListEvents, PresenceSource } from "./presence.js";
export type { Member, Position, PresenceEvent, Publication } from "./protocol.js";
export { MyriadError, PresenceFullError, ServerError, TimeoutError, UnauthorizedError } from "./errors.js";
