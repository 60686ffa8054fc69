"""``MemberList``: a presence subject's members held exact on one
subscription, by docs/protocol.md's "snapshot then diffs, with no gap"
recipe. It owns the list and the paging; it sends nothing but ``presence``
commands and never subscribes or unsubscribes by itself. It needs
``join``/``leave`` events: a namespace with ``join_leave = true``, over
WebSocket."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from ._emitter import Emitter
from ._errors import MyriadError
from ._protocol import Member, PresenceEvent, PresencePage

if TYPE_CHECKING:
    from .client import Client
    from .subscription import Subscription, SubscriptionStateEvent


class MemberList(Emitter):
    """Follows ``sub`` from now: each time it is ``subscribed``, starts from
    an empty list, applies every join and leave as it arrives, and reads the
    snapshot page by page (``limit`` members a page). Events: ``change``
    (the list changed), ``synced`` (the snapshot since the last
    ``subscribed`` is fully applied), ``error`` (a page could not be read;
    the list waits for the next ``subscribed``), each with no payload but
    ``error``'s ``MyriadError``."""

    def __init__(self, client: "Client", sub: "Subscription", limit: Optional[int] = None) -> None:
        super().__init__()
        self.members: Dict[str, Member] = {}
        # Whether the snapshot since the last `subscribed` is fully applied.
        self.synced = False
        self.sub = sub
        self._client = client
        self._limit = limit
        # Bumped per state change (and by stop()): pages of an older round are dropped.
        self._round = 0
        self._unlisten: List[Callable[[], None]] = [
            sub.on("join", self._joined),
            sub.on("leave", self._left),
            sub.on("state", self._state),
        ]
        if sub.state == "subscribed":
            self._restart()

    def stop(self) -> None:
        """Stops following the subscription (which stays as it is)."""
        self._round += 1
        for off in self._unlisten:
            off()

    def _joined(self, e: PresenceEvent) -> None:
        self.members[e.member.conn] = e.member
        self._emit("change", None)

    def _left(self, e: PresenceEvent) -> None:
        self.members.pop(e.member.conn, None)
        self._emit("change", None)

    def _state(self, e: "SubscriptionStateEvent") -> None:
        self._round += 1
        self.synced = False
        if e.state == "subscribed":
            self._restart()

    def _restart(self) -> None:
        """A new connection (its own member id changed): start empty, then
        read the pages, each applied as its answer is read; each replaces
        the ids it covers: after the cursor sent, up to its last member (to
        the end on the last page)."""
        round_ = self._round
        self.members.clear()
        self._emit("change", None)

        def read(cursor: Optional[str]) -> None:
            def apply(page: Optional[PresencePage], error: Optional[MyriadError]) -> None:
                if round_ != self._round:
                    return
                if page is None:
                    self._emit("error", error)
                    return
                last = page.members[-1].conn if page.next is not None and page.members else None
                for id_ in [i for i in self.members if (cursor is None or i > cursor) and (last is None or i <= last)]:
                    del self.members[id_]
                for m in page.members:
                    self.members[m.conn] = m
                self._emit("change", None)
                if page.next is not None:
                    read(page.next)
                    return
                self.synced = True
                self._emit("synced", None)

            self._client._presence_page(self.sub.subject, cursor, self._limit, apply)

        read(None)

    def on(self, name: str, listener: Callable[[Any], Any]) -> Callable[[], None]:
        """Adds ``listener`` for ``change``, ``synced`` or ``error``; returns a function that removes it."""
        return self._add(name, listener)
