"""The client against the real node (MYRIAD_BIN): a round trip with history,
and the feeds of a token's user. The cut connection, the node restart, the
tokens and failover are the shared scenarios (clients/conformance, run by
test_conformance.py). Every wait is bounded; every assertion is on counts
and order, not on time."""

from __future__ import annotations

import time
from typing import Any, AsyncIterator, Awaitable, Callable, List

import pytest
from harness import Node, hs256, start_node, until

from myriad import Client, MyriadError, Position
from myriad.api import AsyncApiClient


@pytest.fixture
async def cleanup() -> AsyncIterator[List[Callable[[], Awaitable[None]]]]:
    todo: List[Callable[[], Awaitable[None]]] = []
    yield todo
    for f in reversed(todo):
        await f()


async def node(cleanup: List[Callable[[], Awaitable[None]]], *extra: str) -> Node:
    n = await start_node(extra)
    cleanup.append(n.kill)
    return n


def client(cleanup: List[Callable[[], Awaitable[None]]], urls: Any, **options: Any) -> Client:
    c = Client(urls, min_reconnect_delay=0.05, max_reconnect_delay=0.5, **options)

    cleanup.append(c.aclose)
    return c


def api(cleanup: List[Callable[[], Awaitable[None]]], n: Node, **options: Any) -> AsyncApiClient:
    a = AsyncApiClient(n.api, **options)
    cleanup.append(a.aclose)
    return a


async def test_round_trip(cleanup: List[Callable[[], Awaitable[None]]]) -> None:
    n = await node(cleanup)
    c = client(cleanup, n.url)
    errors: List[MyriadError] = []
    c.on("error", errors.append)
    c.connect()
    sub = c.subscribe("news")
    got: List[Any] = []
    sub.on("publication", lambda p: got.append(p.data))
    await sub.ready()
    result = await c.publish("news", {"headline": "hi"})
    assert (result.offset, result.reached) == (1, 1)
    assert result.epoch is not None
    await api(cleanup, n).publish("news", "from the API")
    await until("two publications", lambda: len(got) == 2)
    assert got == [{"headline": "hi"}, "from the API"]
    assert sub.position == Position(result.epoch, 2)
    history = await c.history("news", limit=10)
    assert len(history.publications) == 2
    after = await c.history("news", since=Position(result.epoch, 1))
    assert [p.data for p in after.publications] == ["from the API"]
    assert after.recovered is True
    assert errors == []


async def test_the_feeds_of_a_token_user(cleanup: List[Callable[[], Awaitable[None]]]) -> None:
    secret = "f" * 32
    n = await node(cleanup, "--token-hmac-secret", secret)
    admin = api(cleanup, n)
    assert await admin.follow([(7, 2)]) == 1
    c = client(
        cleanup,
        n.url,
        get_token=lambda: _async(hs256(secret, {"sub": "7", "exp": int(time.time()) + 60, "subscribe": ["*"]})),
    )
    errors: List[MyriadError] = []
    c.on("error", errors.append)
    got: List[Any] = []
    c.on("subscription", lambda sub: sub.on("publication", lambda p: got.append([p.subject, p.data])))
    c.connect()
    await until("the feed of user 2", lambda: (s := c.get_subscription("@2")) is not None and s.state == "subscribed")
    own = c.get_subscription("@7")
    assert own is not None and own.server
    assert (await admin.publish_as(2, "hello, followers")).reached == 1
    await until("the feed publication", lambda: len(got) == 1)
    assert (await c.send("from 7")).reached == 1
    await until("the user's own send", lambda: len(got) == 2)
    assert got == [["@2", "hello, followers"], ["@7", "from 7"]]
    assert errors == []


async def _async(value: str) -> str:
    return value
