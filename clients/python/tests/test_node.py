"""The client against the real node (MYRIAD_BIN): a round trip, a
connection cut again and again while publishing goes on, a node restart, a
refused token, a token refreshed past its ``exp``, feeds, failover. Every
wait is bounded; every assertion is on counts and order, not on time."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Awaitable, Callable, List

import pytest
from harness import Node, Proxy, hs256, start_node, until

from myriad import Client, Discontinuity, MyriadError, Position, StateEvent, UnauthorizedError
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


async def test_cut_every_few_hundred_publications_each_once_in_order(cleanup: List[Callable[[], Awaitable[None]]]) -> None:
    total = 4000
    n = await node(cleanup, "--history-size", "10000", "--max-outbound-bytes", "16777216")
    proxy = Proxy(n.ws)
    cleanup.append(proxy.close)
    c = client(cleanup, await proxy.listen())
    c.connect()
    sub = c.subscribe("firehose")
    offsets: List[int] = []
    holes: List[Discontinuity] = []
    # Cut once per connection, 250 publications after the last cut: what the
    # client had already read from a cut socket may still come in.
    state = {"cuts": 0, "next": 250, "connection": 0}
    loop = asyncio.get_running_loop()

    def on_publication(p: Any) -> None:
        offsets.append(p.offset)
        if (
            len(offsets) >= state["next"]
            and len(offsets) < total
            and c.state == "connected"
            and state["connection"] != proxy.accepted
        ):
            state["cuts"] += 1
            state["next"] = len(offsets) + 250
            state["connection"] = proxy.accepted
            loop.call_soon(proxy.cut)

    sub.on("discontinuity", holes.append)
    sub.on("publication", on_publication)
    await sub.ready()
    publisher = api(cleanup, n)
    # Batches of 50 without waiting for the subscriber, but at most 1000
    # ahead of it, so that the replay after a cut always fits.
    for sent in range(0, total, 50):
        await until("the subscriber to keep up", lambda: len(offsets) + 1000 >= sent, 30)
        await publisher.publish_batch([("firehose", sent + i) for i in range(50)])
    await until(f"{total} publications", lambda: len(offsets) >= total, 30)
    assert offsets == list(range(1, total + 1)), "every offset once, in order"
    assert holes == []
    assert state["cuts"] >= 5, f"{state['cuts']} cuts"
    assert proxy.accepted >= state["cuts"]
    assert c.counters.bad_messages + c.counters.unexpected_publications == 0


async def test_a_node_restart_fires_one_discontinuity(cleanup: List[Callable[[], Awaitable[None]]]) -> None:
    first = await start_node()
    cleanup.append(first.kill)
    proxy = Proxy(first.ws)
    cleanup.append(proxy.close)
    c = client(cleanup, await proxy.listen())
    c.connect()
    sub = c.subscribe("restart")
    got: List[Position] = []
    holes: List[Discontinuity] = []
    sub.on("publication", lambda p: got.append(Position(p.epoch, p.offset)))
    sub.on("discontinuity", holes.append)
    await sub.ready()
    batch = await api(cleanup, first).publish_batch([("restart", d) for d in (1, 2, 3)])
    last = batch.results[-1]
    await until("three publications", lambda: len(got) == 3)
    await first.kill()
    second = await node(cleanup)
    proxy.target = second.ws
    await until("the resubscribe on the new node", lambda: len(holes) == 1 and sub.state == "subscribed")
    nxt = await api(cleanup, second).publish("restart", 4)
    await until("the publication on the new node", lambda: len(got) == 4)
    assert len(holes) == 1
    hole = holes[0]
    assert hole.cause == "not_recovered"
    assert hole.previous == Position(str(last.epoch), 3)
    assert hole.position.epoch != last.epoch
    assert nxt.offset is not None and hole.position == Position(str(nxt.epoch), nxt.offset - 1)
    assert got[-1] == Position(str(nxt.epoch), nxt.offset)


async def test_a_refused_token_is_terminal(cleanup: List[Callable[[], Awaitable[None]]]) -> None:
    n = await node(cleanup, "--token-hmac-secret", "s" * 32)
    proxy = Proxy(n.ws)
    cleanup.append(proxy.close)
    calls = 0

    async def get_token() -> str:
        nonlocal calls
        calls += 1
        return hs256("not the node's secret, long enough", {"sub": "7", "exp": int(time.time()) + 60})

    c = client(cleanup, await proxy.listen(), get_token=get_token)
    states: List[StateEvent] = []
    c.on("state", states.append)
    c.connect()
    await until("closed", lambda: c.state == "closed")
    cause = states[-1].cause
    assert cause.type == "token"
    assert isinstance(cause.error, UnauthorizedError) and cause.error.code == "invalid_token"
    await asyncio.sleep(1.5)
    assert calls == 1
    assert proxy.accepted == 1, "no retry loop"


async def test_a_token_refreshed_on_the_open_connection_outlives_its_first_exp(
    cleanup: List[Callable[[], Awaitable[None]]],
) -> None:
    secret = "r" * 32
    n = await node(cleanup, "--token-hmac-secret", secret)
    calls = 0

    async def get_token() -> str:
        nonlocal calls
        calls += 1
        return hs256(secret, {"sub": "7", "exp": int(time.time()) + 3, "subscribe": ["*"], "publish": ["*"]})

    c = client(cleanup, n.url, get_token=get_token)
    states: List[str] = []
    errors: List[MyriadError] = []
    c.on("state", lambda s: states.append(s.state))
    c.on("error", errors.append)
    c.connect()
    sub = c.subscribe("refresh")
    await sub.ready()
    await asyncio.sleep(5)
    assert states == ["connecting", "connected"], "never dropped: the node did not close with 4501"
    assert calls >= 3, f"{calls} tokens"
    assert (await c.publish("refresh", "still here")).reached == 1
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


async def test_failover_to_the_next_url(cleanup: List[Callable[[], Awaitable[None]]]) -> None:
    a = await start_node()
    cleanup.append(a.kill)
    b = await node(cleanup)
    c = client(cleanup, [a.url, b.url])
    urls: List[str] = []
    c.on("state", lambda s: urls.append(str(s.cause.url)) if s.cause.type == "open" else None)
    c.connect()
    sub = c.subscribe("failover")
    got: List[Any] = []
    holes: List[Discontinuity] = []
    sub.on("publication", lambda p: got.append(p.data))
    sub.on("discontinuity", holes.append)
    await sub.ready()
    await api(cleanup, a).publish("failover", "on a")
    await until("the publication on a", lambda: len(got) == 1)
    await a.kill()
    await until("resubscribed on b", lambda: len(holes) == 1 and sub.state == "subscribed")
    await api(cleanup, b).publish("failover", "on b")
    await until("the publication on b", lambda: len(got) == 2)
    assert urls == [a.url, b.url]
    assert got == ["on a", "on b"]
    assert holes[0].cause == "not_recovered"
