"""One subject the application holds: its state, its position, and the
dedupe that keeps duplicates and reordering away from the application
(docs/sdk.md, "Subscription states", "Recovery and dedupe"). It owns no
socket: the client sends its commands and hands it what the node says about
its subject."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, List, Literal, Optional, overload

from ._emitter import Emitter
from ._errors import MyriadError, TimeoutError
from ._protocol import Position, PresenceEvent, Publication, judge

if TYPE_CHECKING:
    from .client import Client

SubscriptionState = Literal["unsubscribed", "subscribing", "subscribed"]
DiscontinuityCause = Literal["not_recovered", "stream_broke", "gap", "epoch_changed"]


@dataclass(frozen=True)
class SubscriptionCause:
    """Why a subscription changed state: ``call`` (``method``), ``subscribed``
    (``recovered``), ``error`` (``error``), or ``client`` (the client's own
    ``cause``, when it left ``connected`` or closed)."""

    type: Literal["call", "subscribed", "error", "client"]
    method: Optional[str] = None
    recovered: Optional[bool] = None
    error: Optional[MyriadError] = None
    cause: Any = None


@dataclass(frozen=True)
class SubscriptionStateEvent:
    state: SubscriptionState
    previous: SubscriptionState
    cause: SubscriptionCause


@dataclass(frozen=True)
class Discontinuity:
    """A hole in what the application received, announced before the
    publication after it."""

    subject: str
    cause: DiscontinuityCause
    # The position before the hole, or None when there was none.
    previous: Optional[Position]
    # Where delivery continues from: every publication after it follows.
    position: Position
    # Offsets skipped when the epoch stayed the same; None when unknown.
    missed: Optional[int]


class Subscription(Emitter):
    """Events: ``state`` (SubscriptionStateEvent), ``publication``
    (Publication), ``discontinuity`` (Discontinuity)."""

    def __init__(self, subject: str, host: "Client", since: Optional[Position] = None, server: bool = False) -> None:
        """Made by ``Client.subscribe``, or by the client for a feed the node
        subscribed the connection to by itself (``server``): the node, not
        the client, makes that one again after a reconnect."""
        super().__init__()
        self.subject = subject
        self.server = server
        self.state: SubscriptionState = "unsubscribed"
        # The position (``position``): the last publication handed over
        # (``_last``, read as a Position only when asked: making one for
        # every message cost a tenth of the client's CPU a message), or else
        # ``_position``, the last `subscribed` answer's or a hole's.
        self._position: Optional[Position] = since
        self._last: Optional[Publication] = None
        self._host = host
        self._waiters: List[Callable[[Optional[MyriadError]], None]] = []
        # Why it last went to `unsubscribed`, for `ready()`.
        self._ended: Optional[MyriadError] = None

    @property
    def position(self) -> Optional[Position]:
        """The last publication handed over, or the last `subscribed` answer's position."""
        if self._last is not None:
            self._position = Position(self._last.epoch, self._last.offset)
            self._last = None
        return self._position

    @position.setter
    def position(self, value: Optional[Position]) -> None:
        self._position = value
        self._last = None

    @overload
    def on(self, name: Literal["state"], listener: Callable[[SubscriptionStateEvent], Any]) -> Callable[[], None]: ...
    @overload
    def on(self, name: Literal["publication"], listener: Callable[[Publication], Any]) -> Callable[[], None]: ...
    @overload
    def on(self, name: Literal["discontinuity"], listener: Callable[[Discontinuity], Any]) -> Callable[[], None]: ...
    @overload
    def on(self, name: Literal["join", "leave"], listener: Callable[[PresenceEvent], Any]) -> Callable[[], None]: ...
    def on(self, name: str, listener: Callable[[Any], Any]) -> Callable[[], None]:
        """Adds ``listener`` for the event ``name``; returns a function that removes it."""
        return self._add(name, listener)

    def subscribe(self) -> None:
        """Subscribes again after ``unsubscribe()`` (or a refusal), resuming from ``position``."""
        if self.state != "unsubscribed":
            return
        self._set_state("subscribing", SubscriptionCause("call", method="subscribe"))
        self._host._attach(self)

    def unsubscribe(self) -> Awaitable[None]:
        """Drops the subscription; resolves when the node confirmed, when the
        connection ended first, or at once when not connected. Never raises."""
        if self.state == "unsubscribed":
            return _done(None)
        self._set_state("unsubscribed", SubscriptionCause("call", method="unsubscribe"))
        return self._host._detach(self)

    def ready(self, timeout: float = 10.0) -> Awaitable[None]:
        """Resolves when the subscription is ``subscribed``; raises
        ``TimeoutError`` after ``timeout`` seconds, or the refusal when it
        goes to ``unsubscribed`` first."""
        future: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        if self.state == "subscribed":
            future.set_result(None)
            return future
        if self.state == "unsubscribed":
            future.set_exception(self._ended or MyriadError("unsubscribed", f"{self.subject} is not subscribed"))
            return future
        def expire() -> None:
            if not future.done():
                future.set_exception(TimeoutError(f"subscribe to {self.subject}"))

        timer = asyncio.get_running_loop().call_later(timeout, expire)

        def settle(error: Optional[MyriadError]) -> None:
            timer.cancel()
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        self._waiters.append(settle)
        return future

    # ---- the client's side

    def _set_state(self, state: SubscriptionState, cause: SubscriptionCause) -> None:
        previous = self.state
        if previous == state:
            return
        self.state = state
        self._emit("state", SubscriptionStateEvent(state, previous, cause))
        if state == "subscribed":
            waiters, self._waiters = self._waiters, []
            for w in waiters:
                w(None)
        elif state == "unsubscribed":
            error = cause.error if cause.type == "error" and cause.error else MyriadError("unsubscribed", f"{self.subject} was unsubscribed")
            self._ended = error
            waiters, self._waiters = self._waiters, []
            for w in waiters:
                w(error)

    def _subscribed(self, position: Position, recovered: Optional[bool], asked: bool) -> None:
        """The node's ``subscribed`` for this subject; ``asked`` when it
        answers a subscribe of ours."""
        if self.state == "subscribing":
            was = self.position
            # A feed the node made again after a reconnect comes without
            # recovery: a position other than the one held means a hole.
            moved = self.server and was is not None and was != position
            if recovered is False or moved:
                self._hole("not_recovered", position)
            elif recovered is not True:
                self.position = position
            self._set_state("subscribed", SubscriptionCause("subscribed", recovered=recovered))
        elif self.state == "subscribed" and not asked and recovered is False:
            self._hole("stream_broke", position)

    def _deliver(self, p: Publication) -> bool:
        """A publication of this subject; False when the subscription does not take it."""
        if self.state != "subscribed":
            return False
        verdict = judge(self._last or self._position, p.epoch, p.offset)
        if verdict == "duplicate":
            self._host._duplicate()
            return True
        if verdict != "deliver":
            self._hole(verdict, Position(p.epoch, p.offset - 1))
        self._last = p
        self._emit("publication", p)
        return True

    def _presence_event(self, kind: Literal["join", "leave"], event: PresenceEvent) -> None:
        """A ``join`` or ``leave`` of this subject; taken only while subscribed."""
        if self.state == "subscribed":
            self._emit(kind, event)

    def _hole(self, cause: DiscontinuityCause, position: Position) -> None:
        previous = self.position
        missed = position.offset - previous.offset if previous is not None and previous.epoch == position.epoch else None
        self.position = position
        self._emit("discontinuity", Discontinuity(self.subject, cause, previous, position, missed))


def _done(value: None) -> "asyncio.Future[None]":
    future: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future
