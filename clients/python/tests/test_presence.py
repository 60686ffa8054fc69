"""Presence against the real node (MYRIAD_BIN), docs/protocol.md
"Presence": a member seen by a second client and by the API client; join
and leave events in order; the cap's refusal as ``PresenceFullError``; and
``MemberList`` holding the exact list, in pages of one, while members come
and go and across a cut connection."""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import AsyncIterator, List, Optional

import pytest
from harness import Node, Proxy, start_node, until

from myriad import Client, MemberList, PresenceFullError
from myriad.api import ApiClient, AsyncApiClient

ADMIN = "admin-key-0123456789"
CONFIG = (
    '[[namespace]]\nprefix = "room."\npresence = true\npresence_max_members = 2\n'
    '[[namespace]]\nprefix = "live."\npresence = true\njoin_leave = true\n'
)


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    with tempfile.TemporaryDirectory(prefix="myriad-presence-") as d:
        config = os.path.join(d, "myriad.toml")
        with open(config, "w") as f:
            f.write(CONFIG)
        n = await start_node(["--admin-key", ADMIN, "--config", config])
        yield n
        await n.kill()


class Clients:
    """Every client a test made, closed at its end."""

    def __init__(self) -> None:
        self.all: List[Client] = []

    def make(self, url: str) -> Client:
        c = Client(url, min_reconnect_delay=0.02, max_reconnect_delay=0.1)
        self.all.append(c)
        c.connect()
        return c


@pytest.fixture
async def clients() -> AsyncIterator[Clients]:
    cs = Clients()
    yield cs
    for c in cs.all:
        await c.aclose()


async def test_a_member_is_seen_by_a_second_client_and_the_api(node: Node, clients: Clients) -> None:
    a = clients.make(node.url)
    await a.subscribe("room.seen").ready()
    b = clients.make(node.url)
    page = await b.presence("room.seen")
    assert len(page.members) == 1 and page.members[0].user is None and page.next is None
    stats = await b.presence_stats("room.seen")
    assert (stats.connections, stats.users) == (1, 0)
    async with AsyncApiClient(node.api, key=ADMIN) as api:
        assert (await api.presence("room.seen")).members == page.members
        assert (await api.presence_stats("room.seen")).connections == 1
    # The blocking client, from a thread: the node answers while the loop waits.
    with ApiClient(node.api, key=ADMIN) as blocking:
        assert (await asyncio.to_thread(blocking.presence, "room.seen", limit=1)).members == page.members
        assert (await asyncio.to_thread(blocking.presence_stats, "room.seen")).users == 0
    sub = a.get_subscription("room.seen")
    assert sub is not None
    await sub.unsubscribe()
    assert (await b.presence_stats("room.seen")).connections == 0


async def test_the_cap_refuses_with_presence_full_then_lets_in(node: Node, clients: Clients) -> None:
    members = [clients.make(node.url), clients.make(node.url)]
    for c in members:
        await c.subscribe("room.full").ready()
    third = clients.make(node.url)
    sub = third.subscribe("room.full")
    with pytest.raises(PresenceFullError) as refused:
        await sub.ready()
    assert refused.value.code == "presence_full" and refused.value.subject == "room.full"
    assert sub.state == "unsubscribed"
    assert (await third.presence_stats("room.full")).connections == 2
    first = members[0].get_subscription("room.full")
    assert first is not None
    await first.unsubscribe()
    sub.subscribe()
    await sub.ready()
    assert (await third.presence_stats("room.full")).connections == 2


async def test_join_and_leave_in_the_order_the_node_made_them(node: Node, clients: Clients) -> None:
    watcher = clients.make(node.url)
    sub = watcher.subscribe("live.order")
    seen: List[str] = []
    sub.on("join", lambda e: seen.append(f"join {e.member.conn}"))
    sub.on("leave", lambda e: seen.append(f"leave {e.member.conn}"))
    await sub.ready()
    others = [clients.make(node.url) for _ in range(3)]
    ids: List[str] = []
    for c in others:
        await c.subscribe("live.order").ready()
        await until("its join", lambda: len(seen) == len(ids) + 1)
        ids.append(seen[-1][len("join ") :])
    left = others[1].get_subscription("live.order")
    assert left is not None
    await left.unsubscribe()
    await others[2].aclose()
    await until("two leaves", lambda: len(seen) == 5)
    assert seen == [f"join {i}" for i in ids] + [f"leave {ids[1]}", f"leave {ids[2]}"]


async def test_member_list_stays_exact_across_churn_and_a_cut(node: Node, clients: Clients) -> None:
    proxy = Proxy(node.ws)
    url = await proxy.listen()
    watcher = clients.make(url)
    sub = watcher.subscribe("live.list")
    members_list = MemberList(watcher, sub, limit=1)
    syncs = [0]
    members_list.on("synced", lambda _: syncs.__setitem__(0, syncs[0] + 1))

    async with AsyncApiClient(node.api, key=ADMIN) as api:

        async def agreed() -> List[str]:
            """The node's list, read page by page, once the list agrees with it (events may be on their way)."""
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                ids: List[str] = []
                cursor: Optional[str] = None
                while True:
                    page = await api.presence("live.list", cursor=cursor, limit=2)
                    ids += [m.conn for m in page.members]
                    if page.next is None:
                        break
                    cursor = page.next
                ids.sort()
                if members_list.synced and sorted(members_list.members) == ids:
                    return ids
                assert asyncio.get_running_loop().time() < deadline, (sorted(members_list.members), ids)
                await asyncio.sleep(0.02)

        others = [clients.make(node.url) for _ in range(6)]
        await asyncio.gather(*(c.subscribe("live.list").ready() for c in others))
        gone = others[0].get_subscription("live.list")
        assert gone is not None
        await gone.unsubscribe()
        first = await agreed()
        assert len(first) == 6  # five members and the watcher
        proxy.cut()
        await others[1].aclose()
        await clients.make(node.url).subscribe("live.list").ready()
        await until("a second snapshot", lambda: syncs[0] >= 2)
        second = await agreed()
        assert len(second) == 6
        # The watcher's old id and the closed member's went; the newcomer's and the watcher's new one came.
        assert len([i for i in first if i not in second]) == 2
        assert len([i for i in second if i not in first]) == 2
    members_list.stop()
    await proxy.close()

