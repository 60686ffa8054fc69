"""myriad's Python client: the public surface. docs/sdk.md says what each
part does (and its "Python specifics" how it is spelt here);
docs/protocol.md what travels on the wire.

- ``Client``: the real-time client (asyncio, WebSocket).
- ``myriad.api``: ``ApiClient`` and ``AsyncApiClient``, a backend's calls to
  the admin listener's HTTP API."""

from ._errors import MyriadError, PresenceFullError, ServerError, TimeoutError, UnauthorizedError
from ._protocol import Member, Position, PresenceEvent, PresencePage, PresenceStats, Publication
from .client import (
    Client,
    ClientCause,
    ClientState,
    Counters,
    HistoryResult,
    PublishResult,
    RetryEvent,
    StateEvent,
)
from .presence import MemberList
from .subscription import (
    Discontinuity,
    Subscription,
    SubscriptionCause,
    SubscriptionState,
    SubscriptionStateEvent,
)

__all__ = [
    "Client",
    "ClientCause",
    "ClientState",
    "Counters",
    "Discontinuity",
    "HistoryResult",
    "Member",
    "MemberList",
    "MyriadError",
    "Position",
    "PresenceEvent",
    "PresenceFullError",
    "PresencePage",
    "PresenceStats",
    "Publication",
    "PublishResult",
    "RetryEvent",
    "ServerError",
    "StateEvent",
    "Subscription",
    "SubscriptionCause",
    "SubscriptionState",
    "SubscriptionStateEvent",
    "TimeoutError",
    "UnauthorizedError",
]
