"""The client against a scriptable fake node (a ``websockets`` server in the
test): states and causes, reconnects and their pauses, close codes, tokens,
commands, the watchdog, bad input (docs/sdk.md, "Scenarios every SDK
passes"). Pauses are scaled down (``min_reconnect_delay`` 50 ms) and
``random()`` fixed at 0.5, so pause n is 25 × 2^(n−1) ms; assertions are on
the pauses the client chose and on what it sent, not on wall-clock time."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Dict, List, Optional

import pytest
from harness import FakeConnection, FakeNode, hs256, until

from myriad import Client, ClientCause, MemberList, MyriadError, Publication, RetryEvent, ServerError, StateEvent, UnauthorizedError
from myriad import TimeoutError as MyriadTimeout


@pytest.fixture
async def fake() -> AsyncIterator[FakeNode]:
    node = await FakeNode().start()
    yield node
    await node.stop()


def make(urls: Any, **options: Any) -> Client:
    options.setdefault("min_reconnect_delay", 0.05)
    options.setdefault("max_reconnect_delay", 2.0)
    options.setdefault("random", lambda: 0.5)
    return Client(urls, **options)


def record(client: Client) -> List[StateEvent]:
    states: List[StateEvent] = []
    client.on("state", states.append)
    return states


async def test_connect_open_disconnect_close(fake: FakeNode) -> None:
    c = make(fake.url)
    states = record(c)
    c.connect()
    conn = await fake.accept()
    await until("connected", lambda: c.state == "connected")
    c.disconnect()
    await asyncio.wait_for(conn.closed.wait(), 5)
    assert conn.ws.protocol.close_code == 1000
    c.close()
    assert [(s.state, s.cause.type) for s in states] == [
        ("connecting", "call"),
        ("connected", "open"),
        ("disconnected", "call"),
        ("closed", "call"),
    ]
    assert states[1].cause.url == fake.url
    with pytest.raises(MyriadError) as raised:
        c.connect()
    assert raised.value.code == "client_closed"


async def test_a_lost_connection_reconnects_round_robin_after_the_pauses() -> None:
    nodes = [await FakeNode().start() for _ in range(3)]
    try:
        for n in nodes:
            n.refuse = 1
        c = make([n.url for n in nodes])
        retries: List[RetryEvent] = []
        c.on("retry", retries.append)
        c.connect()
        (await nodes[0].accept())
        await until("connected", lambda: c.state == "connected")
        assert [n.refused for n in nodes] == [1, 1, 1]
        (await _last(nodes[0])).drop()
        await nodes[1].accept()
        await until("connected again", lambda: c.state == "connected")
        assert [r.delay for r in retries] == [0.025, 0.05, 0.1, 0.025]
        assert [r.url for r in retries] == [nodes[1].url, nodes[2].url, nodes[0].url, nodes[1].url]
        assert all(r.cause == ClientCause("close", code=1006, reason=r.cause.reason) for r in retries)
        c.close()
    finally:
        for n in nodes:
            await n.stop()


async def _last(node: FakeNode) -> FakeConnection:
    return node.all[-1]


@pytest.mark.parametrize("code", [1002, 1003, 1007, 1009, 4500, 4599])
async def test_a_do_not_reconnect_unchanged_code_stops(fake: FakeNode, code: int) -> None:
    c = make(fake.url)
    states = record(c)
    c.connect()
    conn = await fake.accept()
    await until("connected", lambda: c.state == "connected")
    await conn.close(code, "no")
    await until("disconnected", lambda: c.state == "disconnected")
    assert states[-1].cause == ClientCause("close", code=code, reason="no")
    await asyncio.sleep(0.2)
    assert len(fake.all) == 1, "no other socket"
    c.close()


async def test_4501_without_then_with_get_token(fake: FakeNode) -> None:
    token = hs256("k" * 32, {"sub": "1", "exp": int(time.time()) + 600})
    c = make(fake.url, token=token)
    c.connect()
    conn = await fake.accept()
    assert await conn.recv() == {"op": "connect", "token": token, "id": 1}
    await conn.send({"op": "ok", "id": 1})
    await until("connected", lambda: c.state == "connected")
    await conn.close(4501, "token_expired")
    await until("disconnected", lambda: c.state == "disconnected")
    c.close()

    fresh = hs256("k" * 32, {"sub": "1", "exp": int(time.time()) + 601})
    calls = 0

    async def get_token() -> str:
        nonlocal calls
        calls += 1
        return fresh

    c = make(fake.url, token=token, get_token=get_token)
    c.connect()
    conn = await fake.accept()
    first = await conn.recv()
    await conn.send({"op": "ok", "id": first["id"]})
    await until("connected", lambda: c.state == "connected")
    await conn.close(4501, "token_expired")
    conn = await fake.accept()
    again = await conn.recv()
    assert again["op"] == "connect" and again["token"] == fresh
    assert "token" not in conn.path
    assert calls == 1
    c.close()


async def test_a_fresh_token_refused_is_terminal(fake: FakeNode) -> None:
    calls = 0

    async def get_token() -> str:
        nonlocal calls
        calls += 1
        return "fresh"

    c = make(fake.url, get_token=get_token)
    states = record(c)
    c.connect()
    sub = c.subscribe("s")
    pending = c.publish("s", 1)
    conn = await fake.accept()
    frame = await conn.recv()
    await conn.send({"op": "error", "id": frame["id"], "code": "invalid_token", "message": "token_signature"})
    await until("closed", lambda: c.state == "closed")
    cause = states[-1].cause
    assert cause.type == "token" and isinstance(cause.error, UnauthorizedError)
    assert cause.error.code == "invalid_token"
    with pytest.raises(MyriadError) as raised:
        await pending
    assert raised.value.code == "client_closed"
    assert sub.state == "unsubscribed"
    await asyncio.wait_for(conn.closed.wait(), 5)
    assert conn.received.empty(), "no subscribe sent"
    assert calls == 1 and len(fake.all) == 1


@pytest.mark.parametrize("code", ["proxy_refused", "forbidden", "proxy_unavailable", "proxy_busy"])
async def test_a_connect_the_backend_proxy_refuses_is_terminal_and_one_it_could_not_judge_retried(
    fake: FakeNode, code: str
) -> None:
    c = make(fake.url, get_token=_returns("t"))
    states = record(c)
    c.connect()
    conn = await fake.accept()
    frame = await conn.recv()
    await conn.send({"op": "error", "id": frame["id"], "code": code, "message": "backend says"})
    if code in ("proxy_refused", "forbidden"):
        await until("closed", lambda: c.state == "closed")
        cause = states[-1].cause
        assert isinstance(cause.error, UnauthorizedError)
        assert (cause.error.code, cause.error.message) == (code, "backend says")
        assert len(fake.all) == 1
    else:
        retried = await fake.accept()
        assert (await retried.recv())["op"] == "connect"
        assert c.state == "connecting"
    c.close()


async def test_a_cached_token_refused_is_fetched_again_on_the_same_socket(fake: FakeNode) -> None:
    c = make(fake.url, token="cached", get_token=_returns("fresh"))
    c.connect()
    conn = await fake.accept()
    first = await conn.recv()
    assert first["token"] == "cached"
    await conn.send({"op": "error", "id": first["id"], "code": "invalid_token", "message": "expired"})
    second = await conn.recv()
    assert second["op"] == "connect" and second["token"] == "fresh"
    await conn.send({"op": "ok", "id": second["id"]})
    await until("connected", lambda: c.state == "connected")
    c.close()


def _returns(token: str) -> Any:
    async def get_token() -> str:
        return token

    return get_token


async def test_get_token_saying_no_is_terminal_and_another_failure_retries(fake: FakeNode) -> None:
    async def no() -> str:
        raise UnauthorizedError("banned")

    c = make(fake.url, get_token=no)
    c.connect()
    await until("closed", lambda: c.state == "closed")
    assert fake.all == []

    failures = 0

    async def flaky() -> str:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise RuntimeError("backend down")
        return "tok"

    c = make(fake.url, get_token=flaky)
    retries: List[RetryEvent] = []
    c.on("retry", retries.append)
    c.connect()
    conn = await fake.accept()
    frame = await conn.recv()
    await conn.send({"op": "ok", "id": frame["id"]})
    await until("connected", lambda: c.state == "connected")
    assert len(retries) == 1 and retries[0].cause.type == "token"
    assert retries[0].cause.error is not None and retries[0].cause.error.code == "token_failed"
    c.close()


async def test_the_token_is_refreshed_and_one_get_token_is_shared(fake: FakeNode) -> None:
    # A token with 2 s left: refreshed at 1 s; the node closes with 4501
    # while that getToken is pending: one call serves both; on the new
    # connection, a refresh command.
    release = asyncio.Event()
    calls = 0

    async def get_token() -> str:
        nonlocal calls
        calls += 1
        if calls > 1:
            await release.wait()
        return hs256("k" * 32, {"sub": "1", "exp": time.time() + (2 if calls <= 2 else 60)})

    c = make(fake.url, get_token=get_token)
    c.connect()
    conn = await fake.accept()
    frame = await conn.recv()
    await conn.send({"op": "ok", "id": frame["id"]})
    await until("connected", lambda: c.state == "connected")
    await until("the refresh's get_token", lambda: calls == 2, 5)
    await conn.close(4501, "token_expired")
    await until("connecting", lambda: c.state == "connecting")
    await asyncio.sleep(0.2)
    release.set()
    conn = await fake.accept()
    frame = await conn.recv()
    assert frame["op"] == "connect"
    assert calls == 2, "one call shared by the refresh and the reconnect"
    await conn.send({"op": "ok", "id": frame["id"]})
    await until("connected", lambda: c.state == "connected")
    refresh = await conn.recv()  # later, a refresh on the open connection
    assert refresh["op"] == "refresh" and refresh["token"] != frame["token"]
    assert calls == 3
    c.close()


async def test_a_refused_refresh_is_reported_and_the_connection_stays(fake: FakeNode) -> None:
    tokens = iter([time.time() + 1.0, time.time() + 60])

    async def get_token() -> str:
        return hs256("k" * 32, {"sub": "1", "exp": next(tokens)})

    c = make(fake.url, get_token=get_token)
    errors: List[MyriadError] = []
    c.on("error", errors.append)
    c.connect()
    conn = await fake.accept()
    frame = await conn.recv()
    await conn.send({"op": "ok", "id": frame["id"]})
    refresh = await conn.recv()
    assert refresh["op"] == "refresh"
    await conn.send({"op": "error", "id": refresh["id"], "code": "forbidden", "message": "grants"})
    await until("the error event", lambda: len(errors) == 1)
    assert errors[0].code == "refresh_failed"
    assert c.state == "connected"
    c.close()


async def test_commands_buffer_settle_by_id_time_out_and_are_lost(fake: FakeNode) -> None:
    c = make(fake.url, timeout=1.0)
    c.connect()
    a, b, h = c.publish("a", 1), c.send("two"), c.history("a", limit=5)
    conn = await fake.accept()
    sent = [await conn.recv() for _ in range(3)]
    assert [f["op"] for f in sent] == ["publish", "send", "history"]
    assert [f["id"] for f in sent] == [1, 2, 3]
    await conn.send({"op": "history", "id": 3, "subject": "a", "epoch": "e", "offset": 0, "publications": []})
    await conn.send({"op": "ok", "id": 2, "epoch": "e", "offset": 1, "reached": 1})
    assert (await h).publications == []
    assert (await b).offset == 1
    with pytest.raises(MyriadTimeout):
        await a
    await conn.send({"op": "ok", "id": 1, "reached": 0})  # late: dropped silently
    lost = c.publish("a", 3)
    await conn.recv()
    conn.drop()
    with pytest.raises(MyriadError) as raised:
        await lost
    assert raised.value.code == "connection_lost"
    conn2 = await fake.accept()
    await asyncio.sleep(0.1)
    assert conn2.received.empty(), "nothing sent twice"
    assert c.counters.bad_messages == 0
    c.close()
    with pytest.raises(MyriadError) as closed:
        await c.publish("a", 4)
    assert closed.value.code == "client_closed"
    d = make(fake.url)
    with pytest.raises(MyriadError) as not_connected:
        await d.publish("a", 4)
    assert not_connected.value.code == "not_connected"


async def test_the_watchdog_pings_then_gives_up(fake: FakeNode) -> None:
    c = make(fake.url, heartbeat_interval=0.3, heartbeat_timeout=0.3)
    states = record(c)
    c.connect()
    conn = await fake.accept()
    ping = await conn.recv()
    assert ping["op"] == "ping"
    await until("the heartbeat cause", lambda: any(s.cause.type == "heartbeat" for s in states), 5)
    assert states[-1].state == "connecting"
    c.close()


async def test_the_watchdog_stays_quiet_while_the_node_talks(fake: FakeNode) -> None:
    # The watchdog reads when the node was last heard from when its timer
    # fires: messages every 0.1 s for 1 s (over three intervals) bring no
    # ping (pongs without id: bad input, counted, but life all the same); a pong after the ping keeps the connection, and the next ping
    # comes an interval after that pong.
    c = make(fake.url, heartbeat_interval=0.3, heartbeat_timeout=0.3)
    states = record(c)
    c.connect()
    conn = await fake.accept()
    await until("connected", lambda: c.state == "connected")
    for _ in range(10):
        await conn.send({"op": "pong"})
        await asyncio.sleep(0.1)
        assert conn.received.empty(), "no ping while the node talks"
    ping = await conn.recv(1)
    assert ping["op"] == "ping"
    await asyncio.sleep(0.15)
    await conn.send({"op": "pong", "id": ping["id"]})
    second = await conn.recv(1)
    assert second["op"] == "ping" and second["id"] != ping["id"]
    assert [s.state for s in states] == ["connecting", "connected"], "never lost"
    c.close()


async def test_bad_input_is_counted_and_reported(fake: FakeNode) -> None:
    c = make(fake.url)
    errors: List[MyriadError] = []
    c.on("error", errors.append)
    c.connect()
    sub = c.subscribe("s")
    got: List[Any] = []
    sub.on("publication", lambda p: got.append(p.offset))
    conn = await fake.accept()
    frame = await conn.recv()
    await conn.send({"op": "subscribed", "id": frame["id"], "subject": "s", "epoch": "e", "offset": 0})
    for bad in ("{not json", "[1,2]", '{"no":"op"}', '{"op":"msg"}', '{"op":"surprise"}'):
        await conn.send(bad)
    await conn.send({"op": "msg", "subject": "other", "epoch": "e", "offset": 1, "data": 1})
    await conn.send({"op": "msg", "subject": "s", "epoch": "e", "offset": 1, "data": 1})
    await until("the later publication", lambda: got == [1])
    assert (c.counters.bad_messages, c.counters.unknown_ops, c.counters.unexpected_publications) == (4, 1, 1)
    assert [e.code for e in errors] == ["bad_message"] * 4 + ["unknown_op", "unexpected_publication"]
    c.close()


async def test_unsubscribe_drops_late_publications_and_never_raises(fake: FakeNode) -> None:
    c = make(fake.url)
    errors: List[MyriadError] = []
    c.on("error", errors.append)
    c.connect()
    sub = c.subscribe("s")
    conn = await fake.accept()
    frame = await conn.recv()
    await conn.send({"op": "subscribed", "id": frame["id"], "subject": "s", "epoch": "e", "offset": 0})
    await sub.ready()
    leaving = sub.unsubscribe()
    unsub = await conn.recv()
    assert unsub == {"op": "unsubscribe", "subject": "s", "id": unsub["id"]}
    await conn.send({"op": "msg", "subject": "s", "epoch": "e", "offset": 1, "data": 1})
    await conn.send({"op": "ok", "id": unsub["id"]})
    await leaving
    await conn.send({"op": "msg", "subject": "s", "epoch": "e", "offset": 2, "data": 2})
    await until("the unexpected one", lambda: len(errors) == 1)
    assert c.counters.unexpected_publications == 1

    other = c.subscribe("t")
    frame = await conn.recv()
    await conn.send({"op": "subscribed", "id": frame["id"], "subject": "t", "epoch": "e", "offset": 0})
    await other.ready()
    leaving = other.unsubscribe()
    await conn.recv()
    conn.drop()
    await leaving  # resolves: the connection ended first
    conn2 = await fake.accept()
    await asyncio.sleep(0.1)
    assert conn2.received.empty(), "not subscribed again"
    c.close()


async def test_a_callback_that_raises_is_isolated(fake: FakeNode) -> None:
    c = make(fake.url)
    c.connect()
    sub = c.subscribe("s")
    got: List[int] = []

    errors: List[MyriadError] = []

    def boom(p: Publication) -> None:
        got.append(p.offset)
        if p.offset == 1:
            raise ValueError("application bug")

    def worse(e: MyriadError) -> None:
        errors.append(e)
        raise ValueError("error handler bug")

    sub.on("publication", boom)
    c.on("error", worse)
    conn = await fake.accept()
    frame = await conn.recv()
    await conn.send({"op": "subscribed", "id": frame["id"], "subject": "s", "epoch": "e", "offset": 0})
    await conn.send({"op": "msg", "subject": "s", "epoch": "e", "offset": 1, "data": 1})
    await conn.send({"op": "msg", "subject": "s", "epoch": "e", "offset": 2, "data": 2})
    await until("both publications", lambda: got == [1, 2])
    assert [(e.code, e.message) for e in errors] == [("callback_threw", "application bug")]
    assert c.counters.callback_errors == 2, "the publication listener and the error listener"
    assert c.state == "connected"
    c.close()


async def test_a_slow_coroutine_listener_runs_as_a_task_and_does_not_stall_the_read_loop(fake: FakeNode) -> None:
    c = make(fake.url)
    c.connect()
    sub = c.subscribe("s")
    started: List[int] = []
    release = asyncio.Event()

    async def slow(p: Publication) -> None:
        started.append(p.offset)
        await release.wait()
        raise ValueError("late failure")

    sub.on("publication", slow)
    conn = await fake.accept()
    frame = await conn.recv()
    await conn.send({"op": "subscribed", "id": frame["id"], "subject": "s", "epoch": "e", "offset": 0})
    for offset in (1, 2, 3):
        await conn.send({"op": "msg", "subject": "s", "epoch": "e", "offset": offset, "data": offset})
    await until("three tasks started while none finished", lambda: started == [1, 2, 3])
    release.set()
    await until("their failures counted", lambda: c.counters.callback_errors == 3)
    c.close()


async def test_a_subscribe_refused_for_good_and_one_refused_once(fake: FakeNode) -> None:
    c = make(fake.url)
    c.connect()
    conn = await fake.accept()
    await until("connected", lambda: c.state == "connected")
    denied, later = c.subscribe("denied"), c.subscribe("later")
    first, second = await conn.recv(), await conn.recv()
    await conn.send({"op": "error", "id": first["id"], "code": "forbidden", "message": "no"})
    await conn.send({"op": "error", "id": second["id"], "code": "unavailable", "message": "busy"})
    with pytest.raises(ServerError) as raised:
        await denied.ready()
    assert raised.value.code == "forbidden" and denied.state == "unsubscribed"
    again = await conn.recv()
    assert again["subject"] == "later" and again["id"] != second["id"]
    await conn.send({"op": "subscribed", "id": again["id"], "subject": "later", "epoch": "e", "offset": 0})
    await later.ready()
    c.close()


@pytest.mark.parametrize("code", ["proxy_unavailable", "proxy_busy", "too_many_held", "proxy_refused"])
async def test_the_backend_proxys_refusal_of_a_subscribe_is_final_and_its_passing_ones_retried(
    fake: FakeNode, code: str
) -> None:
    c = make(fake.url)
    c.connect()
    conn = await fake.accept()
    await until("connected", lambda: c.state == "connected")
    sub = c.subscribe("s")
    first = await conn.recv()
    await conn.send({"op": "error", "id": first["id"], "code": code, "message": "backend"})
    if code == "proxy_refused":
        with pytest.raises(ServerError) as raised:
            await sub.ready()
        assert raised.value.code == code and sub.state == "unsubscribed"
    else:
        again = await conn.recv()
        assert again["subject"] == "s" and again["id"] != first["id"]
        await conn.send({"op": "subscribed", "id": again["id"], "subject": "s", "epoch": "e", "offset": 0})
        await sub.ready()
    c.close()


async def test_after_a_blip_the_replay_is_delivered_once(fake: FakeNode) -> None:
    c = make(fake.url)
    c.connect()
    sub = c.subscribe("s")
    got: List[int] = []
    holes: List[Any] = []
    sub.on("publication", lambda p: got.append(p.offset))
    sub.on("discontinuity", holes.append)
    conn = await fake.accept()
    frame = await conn.recv()
    await conn.send({"op": "subscribed", "id": frame["id"], "subject": "s", "epoch": "E1", "offset": 0})
    for offset in (1, 2):
        await conn.send({"op": "msg", "subject": "s", "epoch": "E1", "offset": offset, "data": offset})
    await until("two", lambda: got == [1, 2])
    conn.drop()
    conn = await fake.accept()
    frame = await conn.recv()
    assert frame["since"] == {"epoch": "E1", "offset": 2}
    await conn.send({"op": "subscribed", "id": frame["id"], "subject": "s", "epoch": "E1", "offset": 6, "recovered": True})
    for offset in (2, 3, 4, 5, 6):
        await conn.send({"op": "msg", "subject": "s", "epoch": "E1", "offset": offset, "data": offset})
    await until("six", lambda: got == [1, 2, 3, 4, 5, 6])
    assert holes == [] and c.counters.duplicates == 1
    c.close()


async def test_a_feed_the_node_subscribes(fake: FakeNode) -> None:
    c = make(fake.url)
    feeds: List[Any] = []
    holes: List[Any] = []

    def on_feed(sub: Any) -> None:
        feeds.append(sub)
        sub.on("discontinuity", holes.append)

    c.on("subscription", on_feed)
    c.connect()
    conn = await fake.accept()
    await until("connected", lambda: c.state == "connected")
    await conn.send({"op": "subscribed", "subject": "@7", "epoch": "E", "offset": 3})
    await until("the feed", lambda: len(feeds) == 1)
    conn.drop()
    conn = await fake.accept()
    await until("connected", lambda: c.state == "connected")
    await conn.send({"op": "subscribed", "subject": "@7", "epoch": "E", "offset": 3})
    await until("subscribed again", lambda: feeds[0].state == "subscribed")
    assert holes == []
    conn.drop()
    conn = await fake.accept()
    await until("connected", lambda: c.state == "connected")
    await conn.send({"op": "subscribed", "subject": "@7", "epoch": "E", "offset": 7})
    await until("the hole", lambda: len(holes) == 1)
    assert holes[0].cause == "not_recovered" and holes[0].missed == 4
    assert len(feeds) == 1
    assert conn.received.empty(), "no subscribe sent by the client"
    c.close()


async def test_an_attempt_not_connected_within_timeout_is_abandoned(fake: FakeNode) -> None:
    c = make(fake.url, token="never answered", timeout=0.3)
    retries: List[RetryEvent] = []
    c.on("retry", retries.append)
    c.connect()
    conn = await fake.accept()
    assert (await conn.recv())["op"] == "connect"
    await until("the timeout", lambda: len(retries) == 1, 5)
    assert retries[0].cause == ClientCause("timeout")
    await asyncio.wait_for(conn.closed.wait(), 5)
    await fake.accept()  # the next attempt
    c.close()


async def test_member_list_keeps_a_join_read_just_after_a_page_without_it(fake: FakeNode) -> None:
    c = make(fake.url)
    c.connect()
    conn = await fake.accept()
    sub = c.subscribe("live.1")
    members = MemberList(c, sub, limit=2)
    f = await conn.recv()
    assert f["op"] == "subscribe"
    await conn.send({"op": "subscribed", "id": f["id"], "subject": "live.1", "epoch": "00000000000000e1", "offset": 0})
    first = await conn.recv()
    assert first["op"] == "presence" and "cursor" not in first and first["limit"] == 2
    m = [{"conn": x, "user": None} for x in ("a", "c", "d")]
    await conn.send({"op": "presence", "id": first["id"], "subject": "live.1", "members": m[:2], "next": "c"})
    second = await conn.recv()
    assert second["cursor"] == "c"
    # Page two does not hold e, whose join, in its range, comes right after it.
    await conn.send({"op": "presence", "id": second["id"], "subject": "live.1", "members": m[2:], "next": None})
    await conn.send({"op": "join", "subject": "live.1", "member": {"conn": "e", "user": "7"}})
    await until("synced with the join", lambda: members.synced and "e" in members.members)
    await conn.send({"op": "leave", "subject": "live.1", "member": {"conn": "a", "user": None}})
    await until("the leave applied", lambda: "a" not in members.members)
    assert sorted(members.members) == ["c", "d", "e"] and members.members["e"].user == "7"
    members.stop()
    await c.aclose()
