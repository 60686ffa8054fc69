"""The pure parts: back-off (seeded and fixed), the parser, the token's
``exp``, and the dedupe of a subscription (docs/sdk.md, "Recovery and
dedupe"), with no socket."""

from __future__ import annotations

import random
import time
from typing import Any, List

from harness import hs256

from myriad import Client, Discontinuity, Position, Publication
from myriad._backoff import backoff
from myriad._protocol import may_reconnect, parse_server_message
from myriad._token import refresh_delay, token_exp
from myriad.subscription import Subscription, SubscriptionCause


def test_backoff_grows_to_the_cap_with_full_jitter() -> None:
    # docs/sdk.md: ten failures with random() at 0.999.
    pauses = [backoff(n, 0.5, 20.0, lambda: 0.999) for n in range(1, 11)]
    assert pauses == [0.499, 0.999, 1.998, 3.996, 7.992, 15.984, 19.98, 19.98, 19.98, 19.98]
    assert [backoff(n, 0.5, 20.0, lambda: 0.5) for n in (1, 2, 3)] == [0.25, 0.5, 1.0]
    assert backoff(10_000, 0.5, 20.0, lambda: 0.999) == 19.98  # no overflow


def test_backoff_seeded_stays_in_its_window_and_repeats() -> None:
    a, b = random.Random(7), random.Random(7)
    first = [backoff(n, 0.5, 20.0, a.random) for n in range(1, 50)]
    assert first == [backoff(n, 0.5, 20.0, b.random) for n in range(1, 50)]
    for n, pause in enumerate(first, start=1):
        assert 0 <= pause < min(20.0, 0.5 * 2 ** (n - 1))
    assert len(set(first)) > 40  # jitter, not a fixed ladder


def test_close_codes() -> None:
    for code in (1000, 1001, 1006, 4001, 4002, 4003, 4499):
        assert may_reconnect(code)
    for code in (1002, 1003, 1007, 1009, 4500, 4501, 4599, 4999):
        assert not may_reconnect(code)


def test_parser_tells_malformed_from_unknown() -> None:
    assert parse_server_message("{") == (None, None)
    assert parse_server_message("[1]") == (None, None)
    assert parse_server_message('{"x":1}') == (None, None)
    assert parse_server_message('{"op":"msg"}') == (None, "msg")
    assert parse_server_message('{"op":"nope"}') == (None, "nope")
    assert parse_server_message('{"op":"ok","id":-1}') == (None, "ok")
    assert parse_server_message('{"op":"subscribed","subject":"a","epoch":"e","offset":true}') == (None, "subscribed")
    # A msg's own checks (spelt out in the parser for speed): each field's type, the offset's range.
    for bad in (
        '"subject":1,"epoch":"e","offset":1,"data":0',
        '"subject":"a","epoch":2,"offset":1,"data":0',
        '"subject":"a","epoch":"e","offset":true,"data":0',
        '"subject":"a","epoch":"e","offset":1.5,"data":0',
        '"subject":"a","epoch":"e","offset":-1,"data":0',
        '"subject":"a","epoch":"e","offset":9007199254740992,"data":0',
        '"subject":"a","epoch":"e","offset":1',
    ):
        assert parse_server_message('{"op":"msg",' + bad + "}") == (None, "msg"), bad
    m, op = parse_server_message('{"op":"msg","subject":"a","epoch":"e","offset":1,"data":null,"new":1}')
    assert op == "msg" and m is not None and m["data"] is None


def test_token_exp_and_refresh_delay() -> None:
    exp = int(time.time()) + 60
    assert token_exp(hs256("k" * 32, {"sub": "1", "exp": exp})) == exp
    assert token_exp("not a jwt") is None
    assert token_exp("a.!!!.c") is None
    assert token_exp(hs256("k" * 32, {"sub": "1"})) is None
    assert refresh_delay(1060, 1000) == 30.0  # exp − 30 s
    assert refresh_delay(1010, 1000) == 5.0  # exp − remaining / 2
    assert refresh_delay(900, 1000) == 0.0


def held(client: Client, subject: str, at: Position) -> Subscription:
    sub = Subscription(subject, client, at)
    sub.state = "subscribed"
    return sub


def test_publications_are_handed_over_once_each_in_order() -> None:
    # docs/sdk.md: at position 10, offsets 9, 10, 11, 12, 12, 11, 13, 16, 15, 17, then 1 of a new epoch.
    client = Client("ws://127.0.0.1:1/ws")
    sub = held(client, "s", Position("e1", 10))
    seen: List[Any] = []
    sub.on("publication", lambda p: seen.append(p.offset))
    sub.on("discontinuity", lambda d: seen.append(d))
    for offset in (9, 10, 11, 12, 12, 11, 13, 16, 15, 17):
        sub._deliver(Publication("s", "e1", offset, None))
    sub._deliver(Publication("s", "e2", 1, None))
    assert seen == [
        11,
        12,
        13,
        Discontinuity("s", "gap", Position("e1", 13), Position("e1", 15), 2),
        16,
        17,
        Discontinuity("s", "epoch_changed", Position("e1", 17), Position("e2", 0), None),
        1,
    ]
    assert client.counters.duplicates == 5


def test_recovered_false_then_a_stream_that_broke() -> None:
    client = Client("ws://127.0.0.1:1/ws")
    sub = held(client, "s", Position("e1", 4))
    sub.state = "subscribing"
    holes: List[Discontinuity] = []
    sub.on("discontinuity", holes.append)
    sub._subscribed(Position("e2", 8), False, True)
    state: str = sub.state
    assert state == "subscribed"
    sub._subscribed(Position("e2", 20), False, False)
    assert holes == [
        Discontinuity("s", "not_recovered", Position("e1", 4), Position("e2", 8), None),
        Discontinuity("s", "stream_broke", Position("e2", 8), Position("e2", 20), 12),
    ]


def test_recovered_true_keeps_the_position_for_the_replay() -> None:
    client = Client("ws://127.0.0.1:1/ws")
    sub = held(client, "s", Position("e1", 2))
    sub.state = "subscribing"
    sub._subscribed(Position("e1", 6), True, True)
    assert sub.position == Position("e1", 2)
    sub._set_state("unsubscribed", SubscriptionCause("call", method="unsubscribe"))
