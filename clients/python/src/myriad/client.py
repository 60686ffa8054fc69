"""The real-time client: one logical connection to a myriad node (or to one
of the nodes of a cluster), kept up across failures, with the subscriptions,
tokens and commands that ride on it. docs/sdk.md is its contract and
clients/js/src/client.ts its reference; each rule is implemented here once,
under the same names.

It runs on the asyncio loop it was first used on. The read loop never
awaits the application: plain listeners are called in place (keep them
quick), coroutine listeners are started as tasks (see ``_emitter``).
Durations are seconds."""

from __future__ import annotations

import asyncio
import json
import random as _random
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Literal, Optional, Sequence, Set, Union, overload

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from ._backoff import backoff
from ._emitter import Emitter
from ._errors import MyriadError, TimeoutError, UnauthorizedError, server_error
from ._protocol import (
    CREDENTIALS_REFUSED,
    KNOWN_OPS,
    SUBSCRIBE_AGAIN,
    TOKEN_EXPIRED,
    Message,
    Position,
    PresenceEvent,
    PresencePage,
    PresenceStats,
    Publication,
    may_reconnect,
    member,
    parse_server_message,
    presence_page,
    presence_stats,
)
from ._token import refresh_delay, token_exp
from .subscription import Subscription, SubscriptionCause

ClientState = Literal["disconnected", "connecting", "connected", "closed"]


@dataclass(frozen=True)
class ClientCause:
    """Why the client changed state (docs/sdk.md, "Client states"):
    ``call`` (``method``), ``open`` (``url``), ``close`` (``code``,
    ``reason``), ``heartbeat``, ``timeout``, ``token`` (``error``)."""

    type: Literal["call", "open", "close", "heartbeat", "timeout", "token"]
    method: Optional[str] = None
    url: Optional[str] = None
    code: Optional[int] = None
    reason: Optional[str] = None
    error: Optional[MyriadError] = None


@dataclass(frozen=True)
class StateEvent:
    state: ClientState
    previous: ClientState
    cause: ClientCause


@dataclass(frozen=True)
class RetryEvent:
    """An attempt failed (or a connection was lost) and the next one is scheduled."""

    attempt: int
    delay: float
    url: str
    cause: ClientCause


@dataclass
class Counters:
    """The client's counts of what it dropped (docs/sdk.md, "Bad input")."""

    bad_messages: int = 0
    unknown_ops: int = 0
    unexpected_publications: int = 0
    duplicates: int = 0
    callback_errors: int = 0


@dataclass(frozen=True)
class PublishResult:
    reached: int
    # None when the publication was dropped (no history, nobody subscribed).
    epoch: Optional[str] = None
    offset: Optional[int] = None


@dataclass(frozen=True)
class HistoryResult:
    subject: str
    epoch: str
    offset: int
    publications: List[Publication]
    recovered: Optional[bool] = None


Settle = Callable[[Optional[Message], Optional[MyriadError]], None]


class _Pending:
    """A command sent or buffered, waiting for its answer."""

    __slots__ = ("frame", "settle", "timer")

    def __init__(self, frame: Dict[str, Any], settle: Settle) -> None:
        self.frame = frame
        self.settle = settle
        self.timer: Optional[asyncio.TimerHandle] = None


class Client(Emitter):
    """Events: ``state`` (StateEvent), ``retry`` (RetryEvent),
    ``subscription`` (Subscription: a feed the node made; attach listeners
    there), ``error`` (MyriadError)."""

    def __init__(
        self,
        urls: Union[str, Sequence[str]],
        *,
        token: Optional[str] = None,
        get_token: Optional[Callable[[], Awaitable[str]]] = None,
        timeout: float = 10.0,
        min_reconnect_delay: float = 0.5,
        max_reconnect_delay: float = 20.0,
        heartbeat_interval: float = 20.0,
        heartbeat_timeout: float = 10.0,
        random: Callable[[], float] = _random.random,
    ) -> None:
        super().__init__()
        self._urls = [urls] if isinstance(urls, str) else list(urls)
        if not self._urls:
            raise MyriadError("no_url", "give at least one URL")
        self.state: ClientState = "disconnected"
        self.counters = Counters()
        self._token = token
        self._get_token = get_token
        self._timeout = timeout
        self._min_delay = min_reconnect_delay
        self._max_delay = max_reconnect_delay
        self._heartbeat_interval = heartbeat_interval
        self._heartbeat_timeout = heartbeat_timeout
        self._random = random
        self.caught = lambda error: self._report("callback_threw", error)
        self._ws: Optional[ClientConnection] = None
        self._outbox: Optional["asyncio.Queue[str]"] = None
        self._socket_task: Optional["asyncio.Task[None]"] = None
        # Bumped per socket: events of an older socket are ignored.
        self._generation = 0
        # Index in urls of the last attempt.
        self._url_index = -1
        # Failed attempts of the current outage.
        self._attempt = 0
        self._next_id = 1
        # Reconnect pause, or the connect timeout of an attempt in progress.
        self._timer: Optional[asyncio.TimerHandle] = None
        self._heartbeat: Optional[asyncio.TimerHandle] = None
        # When the node was last heard from, on the loop's clock (``_now``):
        # each message only stamps it, and the watchdog's one timer reads it
        # when it fires, instead of a timer re-armed on every message (a
        # third of the client's CPU a message when it was).
        self._heard = 0.0
        self._now: Callable[[], float] = time.monotonic
        self._refresh_timer: Optional[asyncio.TimerHandle] = None
        # Commands sent on the current socket, by id.
        self._pending: Dict[int, _Pending] = {}
        # Commands issued while connecting, in order.
        self._buffer: List[_Pending] = []
        self._subs: Dict[str, Subscription] = {}
        # Subjects unsubscribed whose ok has not come: their late publications are dropped silently.
        self._leaving: Set[str] = set()
        # The token was fetched for the current attempt (a refusal of it is final).
        self._token_fresh = False
        # The one get_token() call in flight, shared.
        self._token_call: Optional["asyncio.Future[str]"] = None
        # The client's own background tasks (a socket closing, a refresh, a
        # second token), held until they finish so none is collected midway.
        self._background: Set["asyncio.Future[Any]"] = set()

    # ---- application calls

    @overload
    def on(self, name: Literal["state"], listener: Callable[[StateEvent], Any]) -> Callable[[], None]: ...
    @overload
    def on(self, name: Literal["retry"], listener: Callable[[RetryEvent], Any]) -> Callable[[], None]: ...
    @overload
    def on(self, name: Literal["subscription"], listener: Callable[[Subscription], Any]) -> Callable[[], None]: ...
    @overload
    def on(self, name: Literal["error"], listener: Callable[[MyriadError], Any]) -> Callable[[], None]: ...
    def on(self, name: str, listener: Callable[[Any], Any]) -> Callable[[], None]:
        """Adds ``listener`` for the event ``name``; returns a function that
        removes it. A plain function is called in place; a coroutine
        function is started as a task (docs/sdk.md, "Python specifics")."""
        return self._add(name, listener)

    def connect(self) -> None:
        """Starts connecting (the first attempt at once). Call it from the running loop."""
        if self.state == "closed":
            raise MyriadError("client_closed", "the client is closed")
        if self.state != "disconnected":
            return
        self._attempt = 0
        self._set_state("connecting", ClientCause("call", method="connect"))
        self._open()

    def disconnect(self) -> None:
        """Closes the connection and stops reconnecting; subscriptions are kept for the next ``connect()``."""
        if self.state in ("disconnected", "closed"):
            return
        self._stop("disconnected", ClientCause("call", method="disconnect"), MyriadError("not_connected", "disconnected"))

    def close(self) -> None:
        """Closes for good: every subscription is dropped, every command rejected."""
        if self.state != "closed":
            self._stop("closed", ClientCause("call", method="close"), MyriadError("client_closed", "the client is closed"))

    async def aclose(self) -> None:
        """``close()``, then waits until its socket is closed and its own tasks are done."""
        self.close()
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def set_token(self, token: str) -> None:
        """Replaces the token used by the next connection (after a 4501 without ``get_token``, say)."""
        self._token = token

    def subscribe(self, subject: str, since: Optional[Position] = None) -> Subscription:
        """Subscribes to ``subject``, resuming after ``since`` when given."""
        if self.state == "closed":
            raise MyriadError("client_closed", "the client is closed")
        if subject in self._subs:
            raise MyriadError("already_subscribed", f"{subject} is already held")
        sub = Subscription(subject, self, since)
        sub.caught = self.caught
        sub.subscribe()
        return sub

    def get_subscription(self, subject: str) -> Optional[Subscription]:
        return self._subs.get(subject)

    def publish(self, subject: str, data: Any) -> "asyncio.Future[PublishResult]":
        return _then(self._command({"op": "publish", "subject": subject, "data": data}), _publish_result)

    def send(self, data: Any) -> "asyncio.Future[PublishResult]":
        """Publishes ``data`` to the connection's user's feed (a connection with a token)."""
        return _then(self._command({"op": "send", "data": data}), _publish_result)

    def history(self, subject: str, limit: Optional[int] = None, since: Optional[Position] = None) -> "asyncio.Future[HistoryResult]":
        frame: Dict[str, Any] = {"op": "history", "subject": subject}
        if limit is not None:
            frame["limit"] = limit
        if since is not None:
            frame["since"] = {"epoch": since.epoch, "offset": since.offset}
        return _then(self._command(frame), _history_result)

    def presence(self, subject: str, cursor: Optional[str] = None, limit: Optional[int] = None) -> "asyncio.Future[PresencePage]":
        """One page of ``subject``'s members: at most ``limit``, those after
        ``cursor`` (the previous page's ``next``). For a member list kept
        exact by join/leave events, see ``MemberList``."""
        frame: Dict[str, Any] = {"op": "presence", "subject": subject}
        if cursor is not None:
            frame["cursor"] = cursor
        if limit is not None:
            frame["limit"] = limit
        return _then(self._command(frame), lambda m: presence_page(subject, m))

    def _presence_page(
        self,
        subject: str,
        cursor: Optional[str],
        limit: Optional[int],
        done: Callable[[Optional[PresencePage], Optional[MyriadError]], None],
    ) -> None:
        """``presence`` for ``MemberList``: ``done`` is called as the answer
        is read, before any later message of the connection. An awaited
        future resumes only after the read loop has gone on, so a join read
        just after the page would be applied before it."""
        frame: Dict[str, Any] = {"op": "presence", "subject": subject}
        if cursor is not None:
            frame["cursor"] = cursor
        if limit is not None:
            frame["limit"] = limit

        def then(m: Optional[Message], error: Optional[MyriadError]) -> None:
            done(presence_page(subject, m) if m is not None and error is None else None, error)

        future = self._command(frame, then)
        # Its outcome went to `done`; retrieved so asyncio does not report it.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def presence_stats(self, subject: str) -> "asyncio.Future[PresenceStats]":
        """``subject``'s presence counts: connections and distinct users, exact."""
        return _then(self._command({"op": "presence_stats", "subject": subject}), lambda m: presence_stats(subject, m))

    # ---- the subscriptions' side

    def _attach(self, sub: Subscription) -> None:
        held = self._subs.get(sub.subject)
        if self.state == "closed" or (held is not None and held is not sub):
            error = MyriadError("client_closed", "the client is closed") if self.state == "closed" else MyriadError("already_subscribed", f"{sub.subject} is already held")
            sub._set_state("unsubscribed", SubscriptionCause("error", error=error))
            return
        self._subs[sub.subject] = sub
        if self.state == "connected":
            self._send_subscribe(sub, 0)

    def _detach(self, sub: Subscription) -> "asyncio.Future[None]":
        if self._subs.get(sub.subject) is sub:
            del self._subs[sub.subject]
        future: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        if self.state != "connected":
            future.set_result(None)
            return future
        subject = sub.subject
        self._leaving.add(subject)

        # Never raises: whatever ends the wait (the ok, a lost connection,
        # the timeout), the client no longer holds the subject.
        def done(_: "asyncio.Future[Message]") -> None:
            if not _.cancelled():
                _.exception()
            self._leaving.discard(subject)
            if not future.done():
                future.set_result(None)

        self._command({"op": "unsubscribe", "subject": subject}).add_done_callback(done)
        return future

    def _duplicate(self) -> None:
        self.counters.duplicates += 1

    # ---- connection

    def _set_state(self, state: ClientState, cause: ClientCause) -> None:
        previous = self.state
        if previous == state:
            return
        self.state = state
        self._emit("state", StateEvent(state, previous, cause))

    def _open(self) -> None:
        """One attempt: a token if one is needed, a socket, ``connect`` if there is a token."""
        self._generation += 1
        generation = self._generation
        self._url_index = (self._url_index + 1) % len(self._urls)
        url = self._urls[self._url_index]
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._timeout, lambda: self._lost(generation, ClientCause("timeout")))
        self._token_fresh = False
        self._outbox = asyncio.Queue()
        self._socket_task = loop.create_task(self._run(generation, url, self._outbox))
        self._background.add(self._socket_task)
        self._socket_task.add_done_callback(self._background.discard)

    async def _run(self, generation: int, url: str, outbox: "asyncio.Queue[str]") -> None:
        """The socket of one attempt: open it, write what is queued, read until it ends."""
        if self._get_token is not None and (not self._token or _expires_soon(self._token)):
            try:
                self._token = await self._fetch_token()
                self._token_fresh = True
            except Exception as error:  # noqa: BLE001 - the application's failure, judged below
                if generation == self._generation:
                    self._token_failed(generation, error)
                return
            if generation != self._generation:
                return
        try:
            ws = await ws_connect(url, open_timeout=None, ping_interval=None, close_timeout=1, max_size=None, compression=None)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - a refused upgrade or a network error alike
            self._lost(generation, ClientCause("close", code=1006, reason=str(error)))
            return
        if generation != self._generation:
            await ws.close(1000)
            return
        self._ws = ws
        writer = asyncio.get_running_loop().create_task(_write(ws, outbox))
        try:
            if self._token:
                self._authenticate(generation, url)
            else:
                self._established(generation, url)
            async for text in ws:
                if generation != self._generation:
                    break
                self._receive(text)
        except websockets.ConnectionClosed:
            pass
        finally:
            writer.cancel()
        code = ws.protocol.close_code
        reason = ws.protocol.close_reason
        self._lost(generation, ClientCause("close", code=code if code is not None else 1006, reason=reason or ""))

    def _authenticate(self, generation: int, url: str) -> None:
        """Sends ``connect`` with the token; ``connected`` on its ``ok``."""
        if generation != self._generation:
            return
        id_ = self._take_id()
        frame: Dict[str, Any] = {"op": "connect", "token": self._token, "id": id_}

        def settle(_message: Optional[Message], error: Optional[MyriadError]) -> None:
            if generation != self._generation:
                return
            if error is None:
                self._established(generation, url)
            elif error.code not in CREDENTIALS_REFUSED:
                # Not a refusal of these credentials (proxy_unavailable,
                # proxy_busy, rate_limited...): back off and try again.
                self._lost(generation, ClientCause("token", error=error))
            elif not self._token_fresh and self._get_token is not None:
                self._token = None
                self._spawn(self._retry_token(generation, url))
            else:
                self._token = None
                self._stop(
                    "closed",
                    ClientCause("token", error=UnauthorizedError(error.message, error.code)),
                    MyriadError("client_closed", "the token was refused"),
                )

        self._pending[id_] = _Pending(frame, settle)
        self._transmit(frame)

    async def _retry_token(self, generation: int, url: str) -> None:
        """A cached token was refused: once more on the same socket with a fresh one."""
        try:
            token = await self._fetch_token()
        except Exception as error:  # noqa: BLE001
            if generation == self._generation:
                self._token_failed(generation, error)
            return
        if generation != self._generation:
            return
        self._token = token
        self._token_fresh = True
        self._authenticate(generation, url)

    def _token_failed(self, generation: int, error: BaseException) -> None:
        if isinstance(error, UnauthorizedError):
            self._stop("closed", ClientCause("token", error=error), MyriadError("client_closed", "this user may not connect"))
        else:
            self._lost(generation, ClientCause("token", error=_as_error("token_failed", error)))

    def _fetch_token(self) -> "asyncio.Future[str]":
        """The one ``get_token()`` call in flight, shared by every caller."""
        if self._token_call is None:
            assert self._get_token is not None
            get_token = self._get_token

            async def call() -> str:
                try:
                    token = await get_token()
                finally:
                    self._token_call = None
                if not isinstance(token, str) or not token:
                    raise MyriadError("token_failed", "get_token gave no token")
                return token

            self._token_call = asyncio.ensure_future(call())
        return asyncio.shield(self._token_call)

    def _established(self, generation: int, url: str) -> None:
        if generation != self._generation or self.state != "connecting":
            return
        _cancel(self._timer)
        self._attempt = 0
        self._set_state("connected", ClientCause("open", url=url))
        self._watch()
        self._schedule_refresh()
        for sub in list(self._subs.values()):
            if sub.state == "subscribing" and not sub.server:
                self._send_subscribe(sub, 0)
        buffered, self._buffer = self._buffer, []
        for p in buffered:
            self._send_pending(p)

    def _lost(self, generation: int, cause: ClientCause) -> None:
        """The current socket is gone (or must go) for ``cause``: reconnect, or
        stop when the close code says not to reconnect unchanged."""
        if generation != self._generation or self.state not in ("connecting", "connected"):
            return
        self._drop(MyriadError("connection_lost", "the connection was lost before the answer"), cause)
        if cause.type == "close" and cause.code == TOKEN_EXPIRED:
            self._token = None
            if self._get_token is None:
                self._halt(cause)
                return
        elif cause.type == "close" and cause.code is not None and not may_reconnect(cause.code):
            self._halt(cause)
            return
        self._set_state("connecting", cause)
        self._attempt += 1
        delay = backoff(self._attempt, self._min_delay, self._max_delay, self._random)
        if self.state != "connecting":
            return  # a state listener stopped the client
        self._emit("retry", RetryEvent(self._attempt, delay, self._urls[(self._url_index + 1) % len(self._urls)], cause))
        if self.state != "connecting":
            return  # a retry listener stopped the client
        self._timer = asyncio.get_running_loop().call_later(delay, self._open)

    def _halt(self, cause: ClientCause) -> None:
        """To ``disconnected`` for a close that says not to reconnect unchanged."""
        self._stop("disconnected", cause, MyriadError("not_connected", "disconnected"))

    def _drop(self, error: MyriadError, cause: ClientCause) -> None:
        """Ends the socket and every timer; subscriptions go back to ``subscribing``."""
        self._generation += 1
        for t in (self._timer, self._heartbeat, self._refresh_timer):
            _cancel(t)
        ws, self._ws = self._ws, None
        task, self._socket_task = self._socket_task, None
        if ws is not None:
            self._spawn(_close(ws))
        elif task is not None and not task.done():
            task.cancel()
        pending = list(self._pending.values())
        self._pending.clear()
        self._leaving.clear()
        for p in pending:
            p.settle(None, error)
        for sub in list(self._subs.values()):
            if sub.state == "subscribed":
                sub._set_state("subscribing", SubscriptionCause("client", cause=cause))

    def _stop(self, state: Literal["disconnected", "closed"], cause: ClientCause, error: MyriadError) -> None:
        """To ``disconnected`` or ``closed``: no socket, no attempt, buffered commands rejected."""
        self._drop(error, cause)
        buffered, self._buffer = self._buffer, []
        for p in buffered:
            p.settle(None, error)
        self._set_state(state, cause)
        if state == "closed":
            subs = list(self._subs.values())
            self._subs.clear()
            for sub in subs:
                sub._set_state("unsubscribed", SubscriptionCause("client", cause=cause))

    def _watch(self) -> None:
        """The heartbeat watchdog, armed on ``connected``: ping after
        ``heartbeat_interval`` of silence, give up after ``heartbeat_timeout``
        more. Its timer fires at the earliest moment the silence could be
        long enough, reads ``_heard`` and sets itself again from it while
        the node is talking."""
        _cancel(self._heartbeat)
        generation = self._generation
        loop = asyncio.get_running_loop()
        self._now = loop.time
        self._heard = loop.time()

        def check() -> None:
            quiet_until = self._heard + self._heartbeat_interval
            if loop.time() < quiet_until:
                self._heartbeat = loop.call_at(quiet_until, check)
                return
            id_ = self._take_id()
            frame: Dict[str, Any] = {"op": "ping", "id": id_}
            self._pending[id_] = _Pending(frame, lambda m, e: None)
            self._transmit(frame)
            pinged = loop.time()

            def give_up() -> None:
                if self._heard >= pinged:
                    check()
                else:
                    self._lost(generation, ClientCause("heartbeat"))

            self._heartbeat = loop.call_at(pinged + self._heartbeat_timeout, give_up)

        self._heartbeat = loop.call_at(self._heard + self._heartbeat_interval, check)

    def _schedule_refresh(self) -> None:
        exp = token_exp(self._token) if self._token and self._get_token is not None else None
        if exp is None:
            return
        generation = self._generation

        async def refresh() -> None:
            try:
                token = await self._fetch_token()
                if generation != self._generation:
                    return
                await self._command({"op": "refresh", "token": token})
                if generation != self._generation:
                    return
                self._token = token
                self._schedule_refresh()
            except Exception as error:  # noqa: BLE001 - reported, not retried (docs/sdk.md, "Tokens")
                if isinstance(error, UnauthorizedError):
                    self._token_failed(generation, error)
                elif generation == self._generation:
                    self._report("refresh_failed", error)

        self._refresh_timer = asyncio.get_running_loop().call_later(
            refresh_delay(exp, time.time()), lambda: self._spawn(refresh())
        )

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- commands

    def _take_id(self) -> int:
        id_ = self._next_id
        self._next_id += 1
        return id_

    def _command(self, frame: Dict[str, Any], then: Optional[Settle] = None) -> "asyncio.Future[Message]":
        """Sends ``frame`` with an id, buffered while connecting; settles on its answer or its timeout."""
        loop = asyncio.get_running_loop()
        future: "asyncio.Future[Message]" = loop.create_future()
        if self.state == "closed":
            future.set_exception(MyriadError("client_closed", "the client is closed"))
            return future
        if self.state == "disconnected":
            future.set_exception(MyriadError("not_connected", "call connect() first"))
            return future

        def settle(message: Optional[Message], error: Optional[MyriadError]) -> None:
            _cancel(p.timer)
            if p in self._buffer:
                self._buffer.remove(p)
            if then is not None and not future.done():
                then(message, error)
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(message or {})

        p = _Pending({**frame, "id": self._take_id()}, settle)

        def expire() -> None:
            self._pending.pop(p.frame["id"], None)
            p.settle(None, TimeoutError(str(frame["op"])))

        p.timer = loop.call_later(self._timeout, expire)
        if self.state == "connected":
            self._send_pending(p)
        else:
            self._buffer.append(p)
        return future

    def _send_pending(self, p: _Pending) -> None:
        self._pending[p.frame["id"]] = p
        self._transmit(p.frame)

    def _send_subscribe(self, sub: Subscription, tries: int) -> None:
        """A subscribe for ``sub``, resuming from its position; retried on a passing refusal or no answer."""
        generation = self._generation
        loop = asyncio.get_running_loop()
        frame: Dict[str, Any] = {"op": "subscribe", "subject": sub.subject, "id": self._take_id()}
        if sub.position is not None:
            frame["since"] = {"epoch": sub.position.epoch, "offset": sub.position.offset}

        def again() -> None:
            if generation == self._generation and sub.state == "subscribing":
                self._send_subscribe(sub, tries + 1)

        def retry() -> None:
            if generation != self._generation or self._subs.get(sub.subject) is not sub or sub.state != "subscribing":
                return
            loop.call_later(backoff(tries + 1, self._min_delay, self._max_delay, self._random), again)

        def settle(_message: Optional[Message], error: Optional[MyriadError]) -> None:
            _cancel(p.timer)
            if error is None or generation != self._generation:
                return
            if error.code in SUBSCRIBE_AGAIN:
                retry()
                return
            if self._subs.get(sub.subject) is sub:
                del self._subs[sub.subject]
            sub._set_state("unsubscribed", SubscriptionCause("error", error=error))

        p = _Pending(frame, settle)

        def expire() -> None:
            if self._pending.pop(frame["id"], None) is not None:
                p.settle(None, TimeoutError("subscribe"))

        p.timer = loop.call_later(self._timeout, expire)
        self._send_pending(p)

    def _transmit(self, frame: Dict[str, Any]) -> None:
        if self._outbox is not None:
            self._outbox.put_nowait(json.dumps(frame, separators=(",", ":")))

    # ---- what the node says

    def _receive(self, text: Any) -> None:
        self._heard = self._now()
        message, op = parse_server_message(text)
        if message is None:
            if op is not None and op not in KNOWN_OPS:
                self.counters.unknown_ops += 1
                self._report("unknown_op", f"unknown op {json.dumps(op)}")
            else:
                self.counters.bad_messages += 1
                self._report("bad_message", f"malformed message from the node: {str(text)[:100]}")
            return
        kind = message["op"]
        id_ = message.get("id")
        if kind == "msg":
            subject = message["subject"]
            sub = self._subs.get(subject)
            if sub is not None and sub._deliver(Publication(subject, message["epoch"], message["offset"], message["data"])):
                return
            if subject in self._leaving:
                return
            self.counters.unexpected_publications += 1
            self._report("unexpected_publication", f"a publication for {subject}, which the client does not hold")
        elif kind == "join" or kind == "leave":
            # Events of a subject no longer held (or being left) are dropped.
            sub = self._subs.get(message["subject"])
            if sub is not None:
                sub._presence_event(kind, PresenceEvent(message["subject"], member(message["member"])))
        elif kind == "subscribed":
            subject = message["subject"]
            sub = self._subs.get(subject)
            p = self._pending.get(id_) if id_ is not None else None
            if p is not None and p.frame["op"] == "subscribe" and p.frame["subject"] == subject:
                self._pending.pop(p.frame["id"], None)
                p.settle(message, None)
            else:
                p = None
            position = Position(message["epoch"], message["offset"])
            if sub is not None:
                sub._subscribed(position, message.get("recovered"), p is not None)
            elif subject in self._leaving:
                return
            elif id_ is None:
                self._feed(subject, position)
            else:
                self.counters.unexpected_publications += 1
                self._report("unexpected_publication", f"subscribed to {subject}, which the client did not ask for")
        else:
            p = self._pending.pop(id_, None) if id_ is not None else None
            if p is not None:
                if kind == "error":
                    p.settle(None, server_error(message))
                else:
                    p.settle(message, None)
            elif kind == "error":
                self._emit("error", server_error(message))
            elif id_ is None or id_ >= self._next_id:
                self.counters.bad_messages += 1
                self._report("bad_message", f"an answer to no command: {str(text)[:100]}")
            # else: the late answer to a command that timed out

    def _feed(self, subject: str, position: Position) -> None:
        """A subscription the node made by itself: held like any, announced with ``subscription``."""
        sub = Subscription(subject, self, None, server=True)
        sub.caught = self.caught
        sub.state = "subscribing"
        self._subs[subject] = sub
        self._emit("subscription", sub)
        sub._subscribed(position, None, False)

    def _report(self, code: str, detail: Any) -> None:
        """The ``error`` event; a listener of it that raises is counted and dropped."""
        if code == "callback_threw":
            self.counters.callback_errors += 1
        error = _as_error(code, detail)
        caught = self.caught

        def count(_: BaseException) -> None:
            self.counters.callback_errors += 1

        self.caught = count
        try:
            self._emit("error", error)
        finally:
            self.caught = caught


async def _write(ws: ClientConnection, outbox: "asyncio.Queue[str]") -> None:
    """Writes the socket's frames in order; ends with the socket."""
    try:
        while True:
            await ws.send(await outbox.get())
    except websockets.ConnectionClosed:
        pass


async def _close(ws: ClientConnection) -> None:
    try:
        await ws.close(1000)
    except Exception:  # noqa: BLE001 - it is gone either way
        pass


def _cancel(handle: Optional[asyncio.TimerHandle]) -> None:
    if handle is not None:
        handle.cancel()


def _as_error(code: str, detail: Any) -> MyriadError:
    """``detail`` as an error of ``code``, the original kept as its ``__cause__``."""
    if isinstance(detail, MyriadError) and detail.code == code:
        return detail
    error = MyriadError(code, str(detail) if not isinstance(detail, BaseException) else (str(detail) or type(detail).__name__))
    if isinstance(detail, BaseException):
        error.__cause__ = detail
    return error


def _then(future: "asyncio.Future[Message]", fn: Callable[[Message], Any]) -> "asyncio.Future[Any]":
    out: "asyncio.Future[Any]" = asyncio.get_running_loop().create_future()

    def done(f: "asyncio.Future[Message]") -> None:
        if out.done():
            return
        error = f.exception()
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(fn(f.result()))

    future.add_done_callback(done)
    return out


def _publish_result(m: Message) -> PublishResult:
    return PublishResult(reached=int(m.get("reached") or 0), epoch=m.get("epoch"), offset=m.get("offset"))


def _history_result(m: Message) -> HistoryResult:
    publications = [Publication(p["subject"], p["epoch"], p["offset"], p.get("data")) for p in m.get("publications", [])]
    return HistoryResult(m["subject"], m["epoch"], m["offset"], publications, m.get("recovered"))


def _expires_soon(token: str) -> bool:
    """Whether a token runs out within a second (or has run out)."""
    exp = token_exp(token)
    return exp is not None and exp - time.time() < 1.0
