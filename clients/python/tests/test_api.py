"""The server API client: every call against the real node (both keys, the
follow graph, history pages, stats) and its documented error codes, each
raised as its own exception; the retry rules against a mock transport,
since a 503 of unknown outcome cannot be made on demand by a memory-engine
node."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator, Dict, List, Tuple

import httpx
import pytest
from harness import Node, start_node

from myriad import Position
from myriad.api import (
    ApiClient,
    ApiForbiddenError,
    ApiUnauthorizedError,
    AsyncApiClient,
    BodyTooLargeError,
    CongestedError,
    FollowingLimitError,
    InvalidSubjectError,
    InvalidUserError,
    NotSettledError,
    OverCapacityError,
    PublishFailedError,
    ReservedSubjectError,
    SelfFollowError,
    UnknownUserError,
)

ADMIN = "admin-key-0123456789"
PUBLISH = "publish-key-0123456789"


@pytest.fixture
async def keyed() -> AsyncIterator[Node]:
    n = await start_node(
        ["--admin-key", ADMIN, "--publish-key", PUBLISH, "--max-http-body", "4096", "--max-following", "2"]
    )
    yield n
    await n.kill()


async def test_every_call_with_the_keys(keyed: Node) -> None:
    async with AsyncApiClient(keyed.api, key=PUBLISH) as backend, AsyncApiClient(keyed.api, key=ADMIN) as admin:
        one = await backend.publish("news", {"n": 0})
        assert one.offset == 1 and one.epoch is not None and one.delivered == 0
        batch = await backend.publish_batch([("news", i) for i in range(1, 25)])
        assert [r.offset for r in batch.results] == list(range(2, 26))
        page = await backend.history("news", limit=5)
        assert [p.offset for p in page.publications] == [21, 22, 23, 24, 25] and page.offset == 25
        everything = [p.offset async for p in backend.history_pages("news", Position(one.epoch, 0), limit=10)]
        assert everything == list(range(1, 26))
        assert await admin.add_users([1, 2, 3]) == 3
        assert await admin.follow([(1, 2), (3, 2)]) == 2
        assert await admin.follow([(1, 2)]) == 0  # idempotent
        first = await admin.followers(2, limit=1)
        assert (first.users, first.next) == ([1], 1)
        rest = await admin.followers(2, after=first.next)
        assert (rest.users, rest.next) == ([3], None)
        assert (await admin.following(1)).users == [2]
        assert await admin.unfollow([(3, 2)]) == 1
        assert (await backend.publish_as(2, "hi")).offset == 1
        assert isinstance(await admin.stats(), dict)


async def test_documented_error_codes_raise_their_own_exceptions(keyed: Node) -> None:
    async with AsyncApiClient(keyed.api) as anonymous, AsyncApiClient(keyed.api, key=PUBLISH) as backend:
        with pytest.raises(ApiUnauthorizedError) as e401:
            await anonymous.publish("news", 1)
        assert (e401.value.status, e401.value.code) == (401, "unauthorized")
        with pytest.raises(ApiForbiddenError) as e403:
            await backend.stats()
        assert (e403.value.status, e403.value.code) == (403, "forbidden")
        with pytest.raises(InvalidSubjectError) as e400:
            await backend.publish("no spaces", 1)
        assert e400.value.status == 400
        with pytest.raises(ReservedSubjectError):
            await backend.publish("@7", 1)
        with pytest.raises(UnknownUserError) as e404:
            await backend.publish_as(424242, 1)
        assert e404.value.status == 404
        with pytest.raises(BodyTooLargeError) as e413:
            await backend.publish("news", "x" * 8192)
        assert e413.value.status == 413
    with ApiClient(keyed.api, key=ADMIN) as admin:  # the synchronous client
        with pytest.raises(InvalidUserError):
            admin.follow([(-1, 2)])
        with pytest.raises(SelfFollowError):
            admin.follow([(3, 3)])
        with pytest.raises(FollowingLimitError) as e422:
            admin.follow([(1, 2), (1, 3), (1, 4)])
        assert e422.value.status == 422
        with pytest.raises(UnknownUserError):
            admin.following(1)  # a refused batch changes nothing: user 1 is still unknown
        assert admin.publish("news", 1).offset == 1


Reply = Tuple[int, Dict[str, Any]]


def scripted(replies: List[Reply]) -> Tuple[httpx.MockTransport, List[Dict[str, Any]]]:
    """A transport answering each request with the next reply; records the bodies."""
    seen: List[Dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content or b"null") or {})
        status, body = replies[min(len(seen) - 1, len(replies) - 1)]
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handle), seen


def failed(code: str, published: int, unknown: int, not_published: int) -> Reply:
    return 503, {"error": {"code": code, "message": code, "published": published, "unknown": unknown, "not_published": not_published}}


OK: Reply = (200, {"delivered": 1, "epoch": "0123456789abcdef", "offset": 1})


def test_a_publish_of_unknown_outcome_is_not_sent_again_unless_asked() -> None:
    transport, seen = scripted([failed("publish_failed", 0, 1, 0), OK])
    with ApiClient("http://node", transport=transport, retry_delay=0) as c:
        with pytest.raises(PublishFailedError) as raised:
            c.publish("a", 1)
        assert (raised.value.published, raised.value.unknown, raised.value.not_published) == (0, 1, 0)
    assert len(seen) == 1
    transport, seen = scripted([failed("publish_failed", 0, 1, 0), OK])
    with ApiClient("http://node", transport=transport, retry_delay=0) as c:
        assert c.publish("a", 1, retry_unknown=True).offset == 1
    assert len(seen) == 2


def test_a_batch_published_in_part_is_not_sent_again() -> None:
    transport, seen = scripted([failed("publish_failed", 1, 0, 1), OK])
    with ApiClient("http://node", transport=transport, retry_delay=0) as c:
        with pytest.raises(PublishFailedError):
            c.publish_batch([("a", 1), ("a", 2)], retry_unknown=True)
    assert len(seen) == 1


async def test_what_is_safe_is_sent_again() -> None:
    for first in (failed("publish_failed", 0, 0, 1), failed("congested", 0, 0, 1), (503, {"error": {"code": "over_capacity", "message": "full"}})):
        transport, seen = scripted([first, OK])
        with ApiClient("http://node", transport=transport, retry_delay=0) as c:
            assert c.publish("a", 1).offset == 1
        assert len(seen) == 2
    transport, seen = scripted([(503, {"error": {"code": "not_settled", "message": "later"}}), (200, {"added": 1})])
    async with AsyncApiClient("http://node", transport=transport, retry_delay=0) as ac:
        assert await ac.follow([(1, 2)]) == 1
    assert len(seen) == 2
    transport, seen = scripted([(503, {"error": {"code": "not_settled", "message": "later"}})])
    with ApiClient("http://node", transport=transport, retries=2, retry_delay=0) as c:
        with pytest.raises(NotSettledError):
            c.follow([(1, 2)])
    assert len(seen) == 3, "the first try and two retries"
    transport, seen = scripted([failed("congested", 0, 0, 1)])
    with ApiClient("http://node", transport=transport, retries=0) as c:
        with pytest.raises(CongestedError):
            c.publish("a", 1)
    transport, seen = scripted([(503, {"error": {"code": "over_capacity", "message": "full"}})])
    with ApiClient("http://node", transport=transport, retries=1, retry_delay=0) as c:
        with pytest.raises(OverCapacityError):
            c.stats()
    assert len(seen) == 2
