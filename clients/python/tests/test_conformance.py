"""The Python runner of the shared scenario suite (clients/conformance): each
``scenarios/*.json`` run against the real node (MYRIAD_BIN) as the suite's
README says, with the steps and expectations spelt there. The TypeScript
runner (clients/js/test/integration/conformance.test.ts) reads the same
files; a scenario this runner cannot run goes in ``SKIPPED`` with its reason
and in docs/sdk.md's Status table."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, Union

import pytest
from harness import Node, Proxy, Redis, hs256, start_node, start_redis, until

from myriad import (
    Client,
    Discontinuity,
    MemberList,
    MyriadError,
    Position,
    PresenceFullError,
    Publication,
    StateEvent,
    Subscription,
)
from myriad.api import AsyncApiClient

SCENARIOS = Path(__file__).resolve().parents[2] / "conformance" / "scenarios"

# Scenario name -> why this SDK skips it: its known gaps (none today).
SKIPPED: Dict[str, str] = {}

Event = Union[Publication, Discontinuity]


class Backend:
    """The scenario's backend: a real HTTP/1.1 server on loopback (connections
    kept alive) answering every call with the same status and JSON body."""

    def __init__(self, status: int, answer: Any) -> None:
        body = json.dumps(answer).encode()
        head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        self._reply = head.encode() + body
        self.calls = 0
        self.url = ""
        self._server: Optional[asyncio.base_events.Server] = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/proxy"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                await reader.readexactly(length)
                self.calls += 1
                writer.write(self._reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()


@dataclass
class Run:
    """One scenario's world: what was started, what the client did, what was published."""

    scenario: Dict[str, Any]
    redis: Optional[Redis] = None
    backend: Optional[Backend] = None
    nodes: Dict[str, Node] = field(default_factory=dict)
    proxies: Dict[str, Proxy] = field(default_factory=dict)
    # The name a URL was given by the scenario, to report `open` causes by name.
    names: Dict[str, str] = field(default_factory=dict)
    # Per subject: publications and discontinuities in the order they came.
    events: Dict[str, List[Event]] = field(default_factory=dict)
    published: Dict[str, int] = field(default_factory=dict)
    states: List[StateEvent] = field(default_factory=list)
    errors: List[MyriadError] = field(default_factory=list)
    opened: List[str] = field(default_factory=list)
    get_token_calls: int = 0
    cuts: int = 0
    client: Optional[Client] = None
    cleanup: List[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # Per subject: the client's join and leave events, as (kind, member id), in the order they came.
    presence: Dict[str, List[Tuple[str, str]]] = field(default_factory=dict)
    # The second clients of `member` steps, by name, and their member ids once a join named them.
    peers: Dict[str, Client] = field(default_factory=dict)
    peer_ids: Dict[str, str] = field(default_factory=dict)
    lists: Dict[str, MemberList] = field(default_factory=dict)
    # Snapshots MemberList finished per subject, and how many there were at the last `cut`.
    syncs: Dict[str, int] = field(default_factory=dict)
    syncs_at_cut: Dict[str, int] = field(default_factory=dict)

    def delivered(self, subject: str) -> List[Publication]:
        return [e for e in self.events.get(subject, []) if isinstance(e, Publication)]

    def holes(self, subject: str) -> List[Discontinuity]:
        return [e for e in self.events.get(subject, []) if isinstance(e, Discontinuity)]

    @property
    def c(self) -> Client:
        assert self.client is not None
        return self.client


def _scenario_files() -> List[Path]:
    files = sorted(SCENARIOS.glob("*.json"))
    assert files, f"no scenarios in {SCENARIOS}"
    return files


async def _start_node(run: Run, name: str) -> None:
    spec = run.scenario["nodes"][name]
    redis_url = run.redis.url if run.redis is not None else "${redis}"
    backend_url = run.backend.url if run.backend is not None else "${backend}"
    args = [arg.replace("${redis}", redis_url).replace("${backend}", backend_url) for arg in spec["args"]]
    if "config" in spec:
        config_dir = tempfile.mkdtemp(prefix="myriad-scenario-")

        async def remove() -> None:
            shutil.rmtree(config_dir, ignore_errors=True)

        run.cleanup.append(remove)
        with open(os.path.join(config_dir, "myriad.toml"), "w") as f:
            f.write(spec["config"])
        args += ["--config", os.path.join(config_dir, "myriad.toml")]
    node = await start_node(args)
    run.cleanup.append(node.kill)
    run.nodes[name] = node
    run.names[node.url] = name


def _url(run: Run, name: str) -> str:
    return run.nodes[name].url if name in run.nodes else next(u for u, n in run.names.items() if n == name)


def _make_client(run: Run) -> Client:
    spec = run.scenario["client"]
    options: Dict[str, Any] = {
        "min_reconnect_delay": spec["min_reconnect_delay"],
        "max_reconnect_delay": spec["max_reconnect_delay"],
    }
    token = spec.get("get_token")
    if token is not None:

        async def get_token() -> str:
            run.get_token_calls += 1
            return hs256(token["secret"], {**token["claims"], "exp": int(time.time()) + token["ttl"]})

        options["get_token"] = get_token
    c = Client([_url(run, name) for name in spec["urls"]], **options)
    run.cleanup.append(c.aclose)
    c.on("state", run.states.append)
    c.on("error", run.errors.append)
    c.on("state", lambda s: run.opened.append(run.names[str(s.cause.url)]) if s.cause.type == "open" else None)
    c.on("subscription", lambda sub: _record(run, sub))
    return c


def _record(run: Run, sub: Subscription) -> None:
    """Records the subject's publications and discontinuities, in the order they come."""
    events = run.events.setdefault(sub.subject, [])
    sub.on("publication", events.append)
    sub.on("discontinuity", events.append)
    presence = run.presence.setdefault(sub.subject, [])
    sub.on("join", lambda e: presence.append(("join", e.member.conn)))
    sub.on("leave", lambda e: presence.append(("leave", e.member.conn)))


def _next_data(run: Run, subject: str) -> int:
    """The data of the subject's next publication: 0, 1, 2, … in publishing order."""
    data = run.published.get(subject, 0)
    run.published[subject] = data + 1
    return data


async def _publish(run: Run, step: Dict[str, Any]) -> None:
    subject = step["subject"]
    node = run.nodes[step["node"]]
    count, batch, ahead = step["count"], step.get("batch", 1), step.get("ahead")
    api = AsyncApiClient(node.api)
    try:
        for start in range(0, count, batch):
            if ahead is not None:
                await until(
                    "the subscriber to keep up",
                    lambda: run.published.get(subject, 0) - len(run.delivered(subject)) <= ahead,
                    30,
                )
            if start and step.get("interval"):
                await asyncio.sleep(step["interval"])
            first = run.published.get(subject, 0)
            size = min(batch, count - start)
            await api.publish_batch([(subject, first + i) for i in range(size)])
            run.published[subject] = first + size
    finally:
        await api.aclose()


def _subscription(run: Run, subject: str) -> Subscription:
    sub = run.c.get_subscription(subject)
    assert sub is not None, f"{subject} is not subscribed"
    return sub


def _cut_every(run: Run, step: Dict[str, Any]) -> None:
    proxy = run.proxies[step["proxy"]]
    subject, every, total = step["subject"], step["publications"], step["total"]
    loop = asyncio.get_running_loop()
    # Cut once per connection: what the client had read from a cut socket may still come in.
    mark = {"next": len(run.delivered(subject)) + every, "connection": -1}

    def on_publication(_: Publication) -> None:
        n = len(run.delivered(subject))
        if n >= mark["next"] and n < total and run.c.state == "connected" and mark["connection"] != proxy.accepted:
            run.cuts += 1
            mark["next"] = n + every
            mark["connection"] = proxy.accepted
            loop.call_soon(proxy.cut)

    _subscription(run, subject).on("publication", on_publication)


async def _step(run: Run, step: Dict[str, Any]) -> None:
    do = step["do"]
    timeout = step.get("timeout", 10.0)
    if do == "connect":
        run.c.connect()
    elif do == "subscribe":
        _record(run, run.c.subscribe(step["subject"]))
    elif do == "ready":
        await asyncio.wait_for(_subscription(run, step["subject"]).ready(), timeout)
    elif do == "cut_every":
        _cut_every(run, step)
    elif do == "publish":
        await _publish(run, step)
    elif do == "client_publish":
        subject = step["subject"]
        result = await run.c.publish(subject, _next_data(run, subject))
        assert result.reached is not None and result.reached >= 1, result
    elif do == "client_send":
        result = await run.c.send(_next_data(run, step["subject"]))
        assert result.reached is not None and result.reached >= 1, result
    elif do == "publish_as":
        async with AsyncApiClient(run.nodes[step["node"]].api) as api:
            outcome = await api.publish_as(step["user"], _next_data(run, step["subject"]))
        assert outcome.reached >= 1, outcome
    elif do == "follow":
        async with AsyncApiClient(run.nodes[step["node"]].api) as api:
            assert await api.follow([(a, b) for a, b in step["edges"]]) == len(step["edges"])
    elif do == "history":
        await _history(run, step)
    elif do == "await_subscribed":
        subject = step["subject"]
        await until(
            f"{subject} subscribed",
            lambda: (held := run.c.get_subscription(subject)) is not None and held.state == "subscribed",
            timeout,
        )
    elif do == "await_delivered":
        subject, count = step["subject"], step["count"]
        await until(f"{count} publications of {subject}", lambda: len(run.delivered(subject)) >= count, timeout)
    elif do == "await_state":
        await until(f"state {step['state']}", lambda: run.c.state == step["state"], timeout)
    elif do == "await_resubscribed":
        subject, holes = step["subject"], step["discontinuities"]
        held = _subscription(run, subject)
        await until(
            f"{subject} resubscribed after {holes} discontinuities",
            lambda: len(run.holes(subject)) == holes and held.state == "subscribed",
            timeout,
        )
    elif do == "kill":
        await run.nodes[step["node"]].kill()
    elif do == "start":
        await _start_node(run, step["node"])
    elif do == "retarget":
        run.proxies[step["proxy"]].target = run.nodes[step["node"]].ws
    elif do == "sleep":
        await asyncio.sleep(step["seconds"])
    elif do == "cut":
        run.syncs_at_cut.update(run.syncs)
        run.proxies[step["proxy"]].cut()
    elif do in ("track_members", "member", "unmember", "await_members", "await_resynced", "presence_stats"):
        await _presence_step(run, step, timeout)
    else:
        raise AssertionError(f"unknown step {do!r}")


async def _presence_step(run: Run, step: Dict[str, Any], timeout: float) -> None:
    """The presence steps of the README: second clients, MemberList, and the node's own list."""
    do = step["do"]
    if do == "track_members":
        subject = step["subject"]
        members = MemberList(run.c, _subscription(run, subject), limit=step.get("limit"))
        members.on("synced", lambda _: run.syncs.__setitem__(subject, run.syncs.get(subject, 0) + 1))
        members.on("error", run.errors.append)

        async def stop() -> None:
            members.stop()

        run.cleanup.append(stop)
        run.lists[subject] = members
    elif do == "member":
        name, subject = step["name"], step["subject"]
        peer = Client(run.nodes[step["node"]].url)
        run.cleanup.append(peer.aclose)
        run.peers[name] = peer
        seen = run.presence.get(subject, [])
        before = len(seen)
        peer.connect()
        sub = peer.subscribe(subject)
        if "refused" in step:
            with pytest.raises(PresenceFullError) as refused:
                await asyncio.wait_for(sub.ready(), timeout)
            assert refused.value.code == step["refused"] and refused.value.subject == subject
            return
        await asyncio.wait_for(sub.ready(), timeout)
        if step.get("join_seen"):
            await until(f"the join of {name}", lambda: len(seen) > before, timeout)
            assert seen[before][0] == "join", seen
            run.peer_ids[name] = seen[before][1]
    elif do == "unmember":
        name = step["name"]
        conn = run.peer_ids.get(name)
        heard = next((events for events in run.presence.values() if any(c == conn for _, c in events)), [])
        before = len(heard)
        await run.peers[name].aclose()
        if step.get("leave_seen"):
            assert conn is not None, f"{name}'s join was not seen"
            await until(f"the leave of {name}", lambda: len(heard) > before, timeout)
            assert heard[before] == ("leave", conn), heard
    elif do == "await_members":
        subject, count = step["subject"], step["count"]
        members = run.lists[subject]
        deadline = asyncio.get_running_loop().time() + timeout
        async with AsyncApiClient(run.nodes[step["node"]].api) as api:
            while True:
                ids: List[str] = []
                cursor: Optional[str] = None
                while True:
                    page = await api.presence(subject, cursor=cursor, limit=2)
                    ids += [m.conn for m in page.members]
                    if page.next is None:
                        break
                    cursor = page.next
                held = sorted(members.members)
                if members.synced and len(ids) == count and held == sorted(ids):
                    return
                assert asyncio.get_running_loop().time() < deadline, f"{subject}: {held} never matched the node's {sorted(ids)} of {count}"
                await asyncio.sleep(0.01)
    elif do == "await_resynced":
        subject = step["subject"]
        at = run.syncs_at_cut.get(subject, 0)
        await until(f"a new snapshot of {subject}", lambda: run.syncs.get(subject, 0) > at, timeout)
    elif do == "presence_stats":
        stats = await run.c.presence_stats(step["subject"])
        assert (stats.connections, stats.users) == (step["connections"], step["users"]), stats


async def _history(run: Run, step: Dict[str, Any]) -> None:
    since = None
    if "since_delivered" in step:
        p = run.delivered(step["subject"])[step["since_delivered"] - 1]
        since = Position(p.epoch, p.offset)
    result = await run.c.history(step["subject"], limit=step.get("limit"), since=since)
    assert [p.data for p in result.publications] == step["data"], result
    if "recovered" in step:
        assert result.recovered is step["recovered"], result


def _within(what: str, value: int, bounds: Dict[str, int]) -> None:
    assert value >= bounds.get("min", value), f"{what}: {value} < {bounds['min']}"
    assert value <= bounds.get("max", value), f"{what}: {value} > {bounds['max']}"


def _check_continuity(subject: str, events: List[Event]) -> None:
    """The delivery promise: each publication follows the last position at the next offset."""
    last: Optional[Position] = None
    for e in events:
        if isinstance(e, Discontinuity):
            if last is not None:
                assert e.previous == last, f"{subject}: {e} does not start at the last delivered {last}"
            last = e.position
        else:
            if last is not None:
                assert (e.epoch, e.offset) == (last.epoch, last.offset + 1), f"{subject}: {e} after {last}"
            last = Position(e.epoch, e.offset)


def _check(run: Run) -> None:
    expect = run.scenario["expect"]
    for subject, events in run.events.items():
        _check_continuity(subject, events)
    for subject, what in expect.get("delivered", {}).items():
        assert what == "all"
        got = [p.data for p in run.delivered(subject)]
        assert got == list(range(run.published.get(subject, 0))), f"{subject}: every publication once, in order"
    for subject in expect.get("offsets_from_one", []):
        offsets = [p.offset for p in run.delivered(subject)]
        assert offsets == list(range(1, len(offsets) + 1)), f"{subject}: offsets 1 to n"
    for subject, wanted in expect.get("discontinuities", {}).items():
        got_holes = []
        delivered = 0
        for e in run.events.get(subject, []):
            if isinstance(e, Discontinuity):
                new_epoch = e.previous is not None and e.position.epoch != e.previous.epoch
                got_holes.append({"cause": e.cause, "after": delivered, "new_epoch": new_epoch})
            else:
                delivered += 1
        assert got_holes == wanted, f"{subject}: discontinuities"
    if "cuts" in expect:
        _within("cuts", run.cuts, expect["cuts"])
        assert all(p.accepted >= run.cuts for p in run.proxies.values()), "a connection for each cut"
    if "states" in expect:
        assert [s.state for s in run.states] == expect["states"]
    if "final_state" in expect:
        assert run.c.state == expect["final_state"]
    if "terminal" in expect:
        cause = run.states[-1].cause
        assert cause.type == "token", cause
        assert type(cause.error).__name__ == expect["terminal"]["type"], cause.error
        assert cause.error is not None and cause.error.code == expect["terminal"]["code"]
    if "get_token_calls" in expect:
        _within("get_token calls", run.get_token_calls, expect["get_token_calls"])
    for name, bounds in expect.get("proxy_accepted", {}).items():
        _within(f"connections through {name}", run.proxies[name].accepted, bounds)
    if "backend_calls" in expect:
        _within("backend calls", run.backend.calls if run.backend is not None else 0, expect["backend_calls"])
    for subject in expect.get("server_held", []):
        held = run.c.get_subscription(subject)
        assert held is not None and held.server, f"{subject} held as a feed the node made"
    if "opened" in expect:
        assert run.opened == expect["opened"]
    if "errors" in expect:
        assert len(run.errors) == expect["errors"], run.errors
    for counter in expect.get("counters_zero", []):
        assert getattr(run.c.counters, counter) == 0, counter
    names = {conn: name for name, conn in run.peer_ids.items()}
    for subject, wanted in expect.get("presence_events", {}).items():
        got = [f"{kind} {names.get(conn, conn)}" for kind, conn in run.presence.get(subject, [])[: len(wanted)]]
        assert got == wanted, f"{subject}: the first joins and leaves"


@pytest.mark.parametrize("path", _scenario_files(), ids=lambda p: p.stem)
async def test_scenario(path: Path) -> None:
    scenario = json.loads(path.read_text())
    assert scenario["name"] == path.stem
    if scenario["name"] in SKIPPED:
        pytest.skip(f"known gap (docs/sdk.md, Status): {SKIPPED[scenario['name']]}")
    run = Run(scenario)
    try:
        if scenario.get("redis"):
            run.redis = await start_redis()
            run.cleanup.append(run.redis.kill)
        if "backend" in scenario:
            run.backend = Backend(scenario["backend"]["status"], scenario["backend"]["answer"])
            await run.backend.start()
            run.cleanup.append(run.backend.close)
        for name, spec in scenario["nodes"].items():
            if spec.get("start", True):
                await _start_node(run, name)
        for name, target in scenario["proxies"].items():
            proxy = Proxy(run.nodes[target].ws)
            run.cleanup.append(proxy.close)
            run.proxies[name] = proxy
            run.names[await proxy.listen()] = name
        run.client = _make_client(run)
        for step in scenario["steps"]:
            await _step(run, step)
        _check(run)
    finally:
        for f in reversed(run.cleanup):
            await f()
