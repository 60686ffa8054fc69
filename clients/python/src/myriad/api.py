"""The server API client: a backend's side of myriad, over HTTP on the admin
listener (docs/protocol.md, "HTTP publish API"): publish, batch publish,
``publish_as``, history with paging, the follow graph's calls and stats,
synchronous (``ApiClient``) and asynchronous (``AsyncApiClient``) on httpx.

Both share one description of each call (``_Call``: the request, whether it
is safe to send again, how to read the answer); the two classes only carry
it. Every documented error code has its own exception, a subclass of
``ApiError`` carrying ``code``, ``status`` and the error body.

Retries (``retries``, 2 by default) only where the docs say a call is safe
to repeat: reads, the graph's idempotent batches (and ``not_settled``,
``store_failed``), anything answered ``over_capacity`` (refused before it
was read), a connection that could not be opened, and a publish answered
503 with nothing published and nothing of unknown outcome. Never a publish
of unknown outcome (503 with ``unknown`` > 0, a timeout while waiting for
the answer) unless ``retry_unknown=True``: it may be published twice."""

from __future__ import annotations

import asyncio
import random as _random
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, AsyncIterator, List, Optional, Sequence, Tuple, Type, Union

import httpx

from ._backoff import backoff
from ._errors import MyriadError
from ._protocol import Position, Publication
from ._protocol import PresencePage, PresenceStats, presence_page, presence_stats
from .client import HistoryResult, _history_result


class ApiError(MyriadError):
    """An error answer of the admin API; ``code`` is the node's stable code."""

    def __init__(self, code: str, message: str, status: int, body: Dict[str, Any]) -> None:
        super().__init__(code, message)
        self.status = status
        self.body = body


class ApiUnauthorizedError(ApiError):
    """401 ``unauthorized``: no key, or one that is neither key."""


class ApiForbiddenError(ApiError):
    """403 ``forbidden``: the publish key on an endpoint that needs the admin key."""


class InvalidJsonError(ApiError):
    """400 ``invalid_json``."""


class MissingFieldError(ApiError):
    """400 ``missing_field``."""


class InvalidSubjectError(ApiError):
    """400 ``invalid_subject``."""


class InvalidQueryError(ApiError):
    """400 ``invalid_query``."""


class InvalidPositionError(ApiError):
    """400 ``invalid_position``."""


class ReservedSubjectError(ApiError):
    """400 ``reserved_subject``: ``/api/publish`` to a feed subject."""


class InvalidUserError(ApiError):
    """400 ``invalid_user``."""


class SelfFollowError(ApiError):
    """400 ``self_follow``."""


class UnknownUserError(ApiError):
    """404 ``unknown_user``."""


class NotFoundError(ApiError):
    """404 ``not_found``: no endpoint at this path."""


class MethodNotAllowedError(ApiError):
    """405 ``method_not_allowed``."""


class BodyTimeoutError(ApiError):
    """408 ``body_timeout``."""


class BodyTooLargeError(ApiError):
    """413 ``body_too_large``: the body passes ``max_http_body``."""


class FollowingLimitError(ApiError):
    """422 ``following_limit``."""


class OverCapacityError(ApiError):
    """503 ``over_capacity``: refused before the request was read (safe to repeat)."""


class UnavailableError(ApiError):
    """503 ``unavailable``: a history read the engine refused."""


class StoreFailedError(ApiError):
    """503 ``store_failed``: nothing was applied."""


class NotSettledError(ApiError):
    """503 ``not_settled``: stored, not yet applied everywhere; sending again is safe."""


class TooManyStatusStreamsError(ApiError):
    """503 ``too_many_status_streams``."""


class _PublishError(ApiError):
    """What became of each item of a publish that failed part-way."""

    def __init__(self, code: str, message: str, status: int, body: Dict[str, Any]) -> None:
        super().__init__(code, message, status, body)
        self.published = int(body.get("published") or 0)
        self.unknown = int(body.get("unknown") or 0)
        self.not_published = int(body.get("not_published") or 0)


class PublishFailedError(_PublishError):
    """503 ``publish_failed``: ``published``, ``unknown``, ``not_published`` say what became of each item."""


class CongestedError(_PublishError):
    """503 ``congested``: the node did not catch up in time (``unknown`` is always 0)."""


ERRORS: Dict[str, Type[ApiError]] = {
    "unauthorized": ApiUnauthorizedError,
    "forbidden": ApiForbiddenError,
    "invalid_json": InvalidJsonError,
    "missing_field": MissingFieldError,
    "invalid_subject": InvalidSubjectError,
    "invalid_query": InvalidQueryError,
    "invalid_position": InvalidPositionError,
    "reserved_subject": ReservedSubjectError,
    "invalid_user": InvalidUserError,
    "self_follow": SelfFollowError,
    "unknown_user": UnknownUserError,
    "not_found": NotFoundError,
    "method_not_allowed": MethodNotAllowedError,
    "body_timeout": BodyTimeoutError,
    "body_too_large": BodyTooLargeError,
    "following_limit": FollowingLimitError,
    "over_capacity": OverCapacityError,
    "unavailable": UnavailableError,
    "store_failed": StoreFailedError,
    "not_settled": NotSettledError,
    "too_many_status_streams": TooManyStatusStreamsError,
    "publish_failed": PublishFailedError,
    "congested": CongestedError,
}


@dataclass(frozen=True)
class PublishOutcome:
    """``delivered``: subscribers on this node; ``epoch``/``offset`` None when dropped."""

    delivered: int
    epoch: Optional[str]
    offset: Optional[int]


@dataclass(frozen=True)
class BatchOutcome:
    delivered: int
    results: List[PublishOutcome]


@dataclass(frozen=True)
class PublishAsOutcome:
    reached: int
    epoch: Optional[str]
    offset: Optional[int]


@dataclass(frozen=True)
class UsersPage:
    """One page of ``followers`` or ``following``; ``next`` is the ``after`` of the next page."""

    user: int
    users: List[int]
    next: Optional[int]


Edge = Tuple[int, int]


def _error(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
        error = body.get("error") if isinstance(body, dict) else None
    except ValueError:
        error = None
    if not isinstance(error, dict):
        error = {"code": f"http_{response.status_code}", "message": response.text[:200]}
    code = str(error.get("code", f"http_{response.status_code}"))
    return ERRORS.get(code, ApiError)(code, str(error.get("message", code)), response.status_code, error)


# Whether a call may be sent again after this error (None: a connection that never opened).
Safe = Callable[[Optional[ApiError]], bool]


def _always(_: Optional[ApiError]) -> bool:
    return True


def _publish_safe(retry_unknown: bool) -> Safe:
    def safe(error: Optional[ApiError]) -> bool:
        if error is None or isinstance(error, OverCapacityError):
            return True
        if isinstance(error, _PublishError):
            return error.published == 0 and (error.unknown == 0 or retry_unknown)
        return False

    return safe


def _graph_safe(error: Optional[ApiError]) -> bool:
    return error is None or isinstance(error, (OverCapacityError, StoreFailedError, NotSettledError))


def _read_safe(error: Optional[ApiError]) -> bool:
    return error is None or isinstance(error, (OverCapacityError, UnavailableError))


@dataclass(frozen=True)
class _Call:
    """One request of the API: what to send, when it may be sent again, how to read the answer."""

    method: str
    path: str
    read: Callable[[Any], Any]
    safe: Safe
    json: Any = None
    params: Optional[Dict[str, Any]] = None
    # A timeout while waiting for the answer leaves the outcome unknown.
    idempotent: bool = False


def _outcome(m: Dict[str, Any]) -> PublishOutcome:
    return PublishOutcome(int(m.get("delivered") or 0), m.get("epoch"), m.get("offset"))


def _calls_publish(subject: str, data: Any, retry_unknown: bool) -> _Call:
    return _Call("POST", "/api/publish", _outcome, _publish_safe(retry_unknown), json={"subject": subject, "data": data}, idempotent=retry_unknown)


def _calls_batch(messages: Sequence[Tuple[str, Any]], retry_unknown: bool) -> _Call:
    body = {"messages": [{"subject": s, "data": d} for s, d in messages]}
    return _Call(
        "POST",
        "/api/publish",
        lambda m: BatchOutcome(int(m.get("delivered") or 0), [_outcome(r) for r in m.get("results", [])]),
        _publish_safe(retry_unknown),
        json=body,
        idempotent=retry_unknown,
    )


def _calls_publish_as(user: int, data: Any, retry_unknown: bool) -> _Call:
    return _Call(
        "POST",
        "/api/publish_as",
        lambda m: PublishAsOutcome(int(m.get("reached") or 0), m.get("epoch"), m.get("offset")),
        _publish_safe(retry_unknown),
        json={"user": user, "data": data},
        idempotent=retry_unknown,
    )


def _calls_presence(subject: str, cursor: Optional[str], limit: Optional[int]) -> _Call:
    params: Dict[str, Any] = {"subject": subject}
    if cursor is not None:
        params["cursor"] = cursor
    if limit is not None:
        params["limit"] = limit
    return _Call("GET", "/api/presence", lambda m: presence_page(subject, m), _read_safe, params=params, idempotent=True)


def _calls_presence_stats(subject: str) -> _Call:
    params: Dict[str, Any] = {"subject": subject}
    return _Call("GET", "/api/presence_stats", lambda m: presence_stats(subject, m), _read_safe, params=params, idempotent=True)


def _calls_history(subject: str, limit: Optional[int], since: Optional[Position]) -> _Call:
    params: Dict[str, Any] = {"subject": subject}
    if limit is not None:
        params["limit"] = limit
    if since is not None:
        params["epoch"] = since.epoch
        params["offset"] = since.offset
    return _Call("GET", "/api/history", _history_result, _read_safe, params=params, idempotent=True)


def _calls_edges(path: str, edges: Sequence[Edge], field: str) -> _Call:
    return _Call("POST", path, lambda m: int(m[field]), _graph_safe, json={"edges": [list(e) for e in edges]}, idempotent=True)


def _calls_users(users: Sequence[int]) -> _Call:
    return _Call("POST", "/api/users", lambda m: int(m["added"]), _graph_safe, json={"users": list(users)}, idempotent=True)


def _calls_page(which: str, user: int, after: Optional[int], limit: Optional[int]) -> _Call:
    params: Dict[str, Any] = {"user": user}
    if after is not None:
        params["after"] = after
    if limit is not None:
        params["limit"] = limit
    return _Call(
        "GET",
        f"/api/{which}",
        lambda m: UsersPage(int(m["user"]), [int(u) for u in m[which]], m.get("next")),
        _read_safe,
        params=params,
        idempotent=True,
    )


def _calls_stats() -> _Call:
    return _Call("GET", "/stats", lambda m: m, _read_safe, idempotent=True)


def _may_retry(call: _Call, error: Union[ApiError, httpx.TransportError]) -> bool:
    if isinstance(error, ApiError):
        return call.safe(error)
    if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout)):
        return call.safe(None)  # the request never left
    return call.idempotent  # sent, no answer: the outcome is unknown


def _headers(key: Optional[str]) -> Dict[str, str]:
    return {"X-Api-Key": key} if key else {}


class _Base:
    def __init__(self, retries: int, retry_delay: float, random: Callable[[], float]) -> None:
        self._retries = retries
        self._retry_delay = retry_delay
        self._random = random

    def _pause(self, attempt: int) -> float:
        return backoff(attempt, self._retry_delay, self._retry_delay * 16, self._random)


class ApiClient(_Base):
    """The synchronous API client. ``base_url`` is the admin listener
    (``http://127.0.0.1:8081``); ``key`` the publish key or the admin key,
    sent as ``X-Api-Key``."""

    def __init__(
        self,
        base_url: str,
        *,
        key: Optional[str] = None,
        timeout: float = 10.0,
        retries: int = 2,
        retry_delay: float = 0.1,
        random: Callable[[], float] = _random.random,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        super().__init__(retries, retry_delay, random)
        self._http = httpx.Client(base_url=base_url, headers=_headers(key), timeout=timeout, transport=transport)

    def __enter__(self) -> "ApiClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _do(self, call: _Call) -> Any:
        attempt = 0
        while True:
            try:
                response = self._http.request(call.method, call.path, json=call.json, params=call.params)
                if response.status_code == 200:
                    return call.read(response.json())
                error: Union[ApiError, httpx.TransportError] = _error(response)
            except httpx.TransportError as e:
                error = e
            attempt += 1
            if attempt > self._retries or not _may_retry(call, error):
                raise error
            time.sleep(self._pause(attempt))

    def publish(self, subject: str, data: Any, *, retry_unknown: bool = False) -> PublishOutcome:
        out: PublishOutcome = self._do(_calls_publish(subject, data, retry_unknown))
        return out

    def publish_batch(self, messages: Sequence[Tuple[str, Any]], *, retry_unknown: bool = False) -> BatchOutcome:
        """``messages`` as (subject, data) pairs, published in order; validated whole first."""
        out: BatchOutcome = self._do(_calls_batch(messages, retry_unknown))
        return out

    def publish_as(self, user: int, data: Any, *, retry_unknown: bool = False) -> PublishAsOutcome:
        out: PublishAsOutcome = self._do(_calls_publish_as(user, data, retry_unknown))
        return out

    def history(self, subject: str, *, limit: Optional[int] = None, since: Optional[Position] = None) -> HistoryResult:
        out: HistoryResult = self._do(_calls_history(subject, limit, since))
        return out

    def presence(self, subject: str, *, cursor: Optional[str] = None, limit: Optional[int] = None) -> PresencePage:
        """One page of ``subject``'s presence members, those after ``cursor`` (the previous page's ``next``)."""
        out: PresencePage = self._do(_calls_presence(subject, cursor, limit))
        return out

    def presence_stats(self, subject: str) -> PresenceStats:
        """``subject``'s presence counts: connections and distinct users, exact."""
        out: PresenceStats = self._do(_calls_presence_stats(subject))
        return out

    def history_pages(self, subject: str, since: Position, *, limit: Optional[int] = None) -> Iterator[Publication]:
        """Every publication after ``since`` still in history, page by page
        (each page from the last one received). Raises ``MyriadError``
        ``not_recovered`` when history no longer reaches back to ``since``."""
        while True:
            page = self.history(subject, limit=limit, since=since)
            if page.recovered is False:
                raise MyriadError("not_recovered", f"history of {subject} no longer reaches back to {since}")
            yield from page.publications
            if not page.publications or page.publications[-1].offset >= page.offset:
                return
            last = page.publications[-1]
            since = Position(last.epoch, last.offset)

    def follow(self, edges: Sequence[Edge]) -> int:
        out: int = self._do(_calls_edges("/api/follow", edges, "added"))
        return out

    def unfollow(self, edges: Sequence[Edge]) -> int:
        out: int = self._do(_calls_edges("/api/unfollow", edges, "removed"))
        return out

    def add_users(self, users: Sequence[int]) -> int:
        out: int = self._do(_calls_users(users))
        return out

    def followers(self, user: int, *, after: Optional[int] = None, limit: Optional[int] = None) -> UsersPage:
        out: UsersPage = self._do(_calls_page("followers", user, after, limit))
        return out

    def following(self, user: int, *, after: Optional[int] = None, limit: Optional[int] = None) -> UsersPage:
        out: UsersPage = self._do(_calls_page("following", user, after, limit))
        return out

    def stats(self) -> Dict[str, Any]:
        out: Dict[str, Any] = self._do(_calls_stats())
        return out


class AsyncApiClient(_Base):
    """The asynchronous API client; the same calls as ``ApiClient``, awaited."""

    def __init__(
        self,
        base_url: str,
        *,
        key: Optional[str] = None,
        timeout: float = 10.0,
        retries: int = 2,
        retry_delay: float = 0.1,
        random: Callable[[], float] = _random.random,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        super().__init__(retries, retry_delay, random)
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(key), timeout=timeout, transport=transport)

    async def __aenter__(self) -> "AsyncApiClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _do(self, call: _Call) -> Any:
        attempt = 0
        while True:
            try:
                response = await self._http.request(call.method, call.path, json=call.json, params=call.params)
                if response.status_code == 200:
                    return call.read(response.json())
                error: Union[ApiError, httpx.TransportError] = _error(response)
            except httpx.TransportError as e:
                error = e
            attempt += 1
            if attempt > self._retries or not _may_retry(call, error):
                raise error
            await asyncio.sleep(self._pause(attempt))

    async def publish(self, subject: str, data: Any, *, retry_unknown: bool = False) -> PublishOutcome:
        out: PublishOutcome = await self._do(_calls_publish(subject, data, retry_unknown))
        return out

    async def publish_batch(self, messages: Sequence[Tuple[str, Any]], *, retry_unknown: bool = False) -> BatchOutcome:
        out: BatchOutcome = await self._do(_calls_batch(messages, retry_unknown))
        return out

    async def publish_as(self, user: int, data: Any, *, retry_unknown: bool = False) -> PublishAsOutcome:
        out: PublishAsOutcome = await self._do(_calls_publish_as(user, data, retry_unknown))
        return out

    async def history(self, subject: str, *, limit: Optional[int] = None, since: Optional[Position] = None) -> HistoryResult:
        out: HistoryResult = await self._do(_calls_history(subject, limit, since))
        return out

    async def presence(self, subject: str, *, cursor: Optional[str] = None, limit: Optional[int] = None) -> PresencePage:
        out: PresencePage = await self._do(_calls_presence(subject, cursor, limit))
        return out

    async def presence_stats(self, subject: str) -> PresenceStats:
        out: PresenceStats = await self._do(_calls_presence_stats(subject))
        return out

    async def history_pages(self, subject: str, since: Position, *, limit: Optional[int] = None) -> AsyncIterator[Publication]:
        while True:
            page = await self.history(subject, limit=limit, since=since)
            if page.recovered is False:
                raise MyriadError("not_recovered", f"history of {subject} no longer reaches back to {since}")
            for p in page.publications:
                yield p
            if not page.publications or page.publications[-1].offset >= page.offset:
                return
            last = page.publications[-1]
            since = Position(last.epoch, last.offset)

    async def follow(self, edges: Sequence[Edge]) -> int:
        out: int = await self._do(_calls_edges("/api/follow", edges, "added"))
        return out

    async def unfollow(self, edges: Sequence[Edge]) -> int:
        out: int = await self._do(_calls_edges("/api/unfollow", edges, "removed"))
        return out

    async def add_users(self, users: Sequence[int]) -> int:
        out: int = await self._do(_calls_users(users))
        return out

    async def followers(self, user: int, *, after: Optional[int] = None, limit: Optional[int] = None) -> UsersPage:
        out: UsersPage = await self._do(_calls_page("followers", user, after, limit))
        return out

    async def following(self, user: int, *, after: Optional[int] = None, limit: Optional[int] = None) -> UsersPage:
        out: UsersPage = await self._do(_calls_page("following", user, after, limit))
        return out

    async def stats(self) -> Dict[str, Any]:
        out: Dict[str, Any] = await self._do(_calls_stats())
        return out
