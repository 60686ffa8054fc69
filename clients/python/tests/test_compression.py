"""permessage-deflate (RFC 7692) against the real node, with two clients
that are not ours: ``websockets`` (which offers and speaks it by default)
and raw sockets whose frames are made and read with Python's own zlib, so
that what the node puts on the wire is checked by an independent inflater.
See docs/protocol.md, *Compression*."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import struct
import urllib.request
import zlib
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Tuple

import pytest
from websockets.asyncio.client import connect

from harness import Node, start_node

Cleanup = List[Callable[[], Awaitable[None]]]

# A publication of realistic JSON text, well above compression_threshold.
DATA = {
    "type": "chat.message",
    "author": {"id": "u_1842", "name": "Ada Lovelace", "avatar": "https://cdn.example.com/a/1842.png"},
    "text": "Meeting moved to 3pm, the projector in room B is broken again so bring a laptop. " * 3,
    "reactions": [{"emoji": "thumbsup", "count": 3}, {"emoji": "eyes", "count": 2}],
}


@pytest.fixture
async def cleanup() -> AsyncIterator[Cleanup]:
    steps: Cleanup = []
    yield steps
    for step in reversed(steps):
        await step()


async def node(cleanup: Cleanup, *extra: str) -> Node:
    n = await start_node(extra)
    cleanup.append(n.kill)
    return n


def metrics(n: Node) -> Dict[str, float]:
    """``/metrics`` as name{labels} → value, for the compression series."""
    with urllib.request.urlopen(f"{n.api}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("myriad_compression") or line.startswith("myriad_connections_closed_total"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class Raw:
    """A WebSocket client on a plain socket: sends what it is told, masked,
    and reads frames as they are, RSV bits included."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: str) -> None:
        self.reader, self.writer, self.head = reader, writer, head

    @staticmethod
    async def open(n: Node, extensions: Optional[List[str]]) -> "Raw":
        host, port = n.ws.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            "GET /ws HTTP/1.1",
            f"Host: {n.ws}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        lines += [f"Sec-WebSocket-Extensions: {e}" for e in extensions or []]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode()
        assert head.startswith("HTTP/1.1 101"), head
        return Raw(reader, writer, head)

    def extensions(self) -> Optional[str]:
        found = re.search(r"^sec-websocket-extensions: (.*)\r$", self.head, re.I | re.M)
        return found.group(1) if found else None

    def send(self, first_byte: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", first_byte, 0x80 | n)
        elif n < 65536:
            head = struct.pack("!BBH", first_byte, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", first_byte, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.writer.write(head + mask + masked)

    def send_text(self, text: str, compress: bool) -> None:
        payload = text.encode()
        if compress:
            c = zlib.compressobj(wbits=-15)
            payload = (c.compress(payload) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]
        self.send(0x80 | (0x40 if compress else 0) | 0x1, payload)

    async def frame(self) -> Tuple[int, bytes]:
        """The next frame: its first byte and its payload."""
        b0, b1 = await asyncio.wait_for(self.reader.readexactly(2), 5)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
        return b0, await self.reader.readexactly(n)

    async def close_code(self) -> int:
        while True:
            b0, payload = await self.frame()
            if b0 & 0x0F == 0x8:
                return int(struct.unpack("!H", payload[:2])[0])

    async def message(self) -> Tuple[bool, Dict[str, Any]]:
        """The next text message: whether it came compressed, and its JSON."""
        while True:
            b0, payload = await self.frame()
            if b0 & 0x0F != 0x1:
                continue
            compressed = bool(b0 & 0x40)
            if compressed:
                d = zlib.decompressobj(wbits=-15)
                payload = d.decompress(payload + b"\x00\x00\xff\xff")
            parsed: Dict[str, Any] = json.loads(payload)
            return compressed, parsed

    async def close(self) -> None:
        self.writer.close()


async def test_the_node_answers_without_context_takeover_both_ways(cleanup: Cleanup) -> None:
    n = await node(cleanup)
    async with connect(n.url) as ws:
        assert ws.response is not None
        answer = ws.response.headers["Sec-WebSocket-Extensions"]
        assert answer == "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
    raw = await Raw.open(n, ["x-webkit-deflate-frame", "permessage-deflate; server_max_window_bits=10"])
    assert raw.extensions() == (
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover; server_max_window_bits=10"
    )
    await raw.close()
    off = await node(cleanup, "--compression", "false")
    raw = await Raw.open(off, ["permessage-deflate"])
    assert raw.extensions() is None
    await raw.close()
    assert metrics(n)["myriad_compression_negotiated_total"] == 2


async def test_bad_offers_are_declined_not_refused(cleanup: Cleanup) -> None:
    n = await node(cleanup)
    bad = {
        "permessage-deflate; server_max_window_bits=16": "invalid_value",
        "permessage-deflate; server_max_window_bits=08": "invalid_value",
        "permessage-deflate; client_no_context_takeover; client_no_context_takeover": "repeated_parameter",
        "permessage-deflate; mystery": "unknown_parameter",
        'permessage-deflate; server_max_window_bits="10': "malformed",
    }
    for offer in bad:
        raw = await Raw.open(n, [offer])
        assert raw.extensions() is None, offer
        # Declined means uncompressed, and RSV1 is then a protocol error.
        raw.send_text('{"op":"ping"}', compress=True)
        assert await raw.close_code() == 1002, offer
        await raw.close()
    # A bad offer falls back to the next one.
    raw = await Raw.open(n, ["permessage-deflate; mystery, permessage-deflate"])
    assert raw.extensions() is not None
    await raw.close()
    m = metrics(n)
    for reason in set(bad.values()):
        want = sum(1 for r in bad.values() if r == reason) + (reason == "unknown_parameter")
        assert m[f'myriad_compression_offers_declined_total{{reason="{reason}"}}'] == want, reason


async def test_a_publication_is_compressed_once_for_every_recipient(cleanup: Cleanup) -> None:
    n = await node(cleanup)
    raws = [await Raw.open(n, ["permessage-deflate; client_max_window_bits"]) for _ in range(3)]
    plain = await Raw.open(n, None)
    for i, r in enumerate(raws + [plain]):
        r.send_text(json.dumps({"op": "subscribe", "subject": "room", "id": 1}), compress=i == 0)
        while (await r.message())[1].get("op") != "subscribed":
            pass
    async with connect(n.url) as publisher:
        for seq in range(3):
            # websockets compresses what it sends: the node inflates it.
            await publisher.send(json.dumps({"op": "publish", "subject": "room", "data": {**DATA, "seq": seq}, "id": 9}))
            reply = json.loads(await asyncio.wait_for(publisher.recv(), 5))
            assert reply["op"] == "ok" and reply["reached"] == 4, reply
    for r in raws:
        for seq in range(3):
            compressed, msg = await r.message()
            assert compressed, "sent compressed to a compressing client"
            assert msg["data"] == {**DATA, "seq": seq}
    for seq in range(3):
        compressed, msg = await plain.message()
        assert not compressed
        assert msg["data"]["seq"] == seq
    m = metrics(n)
    assert m["myriad_compression_frames_total"] == 3, "once per publication, not per recipient"
    assert m["myriad_compression_bytes_after_total"] < m["myriad_compression_bytes_before_total"] / 2
    # Short messages (replies, the subscribe answers) went uncompressed.
    for r in raws + [plain]:
        await r.close()


async def test_a_compression_bomb_is_refused_with_1009(cleanup: Cleanup) -> None:
    n = await node(cleanup, "--max-message-size", "65536")
    raw = await Raw.open(n, ["permessage-deflate"])
    c = zlib.compressobj(9, wbits=-15)
    bomb = (c.compress(b" " * (64 << 20)) + c.flush(zlib.Z_SYNC_FLUSH))[:-4]
    assert len(bomb) < 65536, "the wire size passes the limit; the inflated one does not"
    raw.send(0x80 | 0x40 | 0x1, bomb)
    assert await raw.close_code() == 1009
    await raw.close()
    # The node is unaffected: the next client is served.
    async with connect(n.url) as ws:
        await ws.send('{"op":"ping","id":1}')
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["id"] == 1
    m = metrics(n)
    assert m['myriad_compression_refusals_total{reason="bomb"}'] == 1
    assert m['myriad_connections_closed_total{reason="message_too_big"}'] == 1


@pytest.mark.parametrize(
    "first_byte,payload,reason",
    [
        (0x80 | 0x40 | 0x9, b"", "compressed_control_frame"),
        (0x80 | 0x40 | 0x1, b"\xff\xff\xff\xff", "bad_data"),
    ],
)
async def test_broken_compressed_input_is_a_protocol_error(
    cleanup: Cleanup, first_byte: int, payload: bytes, reason: str
) -> None:
    n = await node(cleanup)
    raw = await Raw.open(n, ["permessage-deflate"])
    raw.send(first_byte, payload)
    assert await raw.close_code() == 1002
    await raw.close()
    assert metrics(n)[f'myriad_compression_refusals_total{{reason="{reason}"}}'] == 1


async def test_rsv1_on_a_continuation_is_a_protocol_error(cleanup: Cleanup) -> None:
    n = await node(cleanup)
    raw = await Raw.open(n, ["permessage-deflate"])
    raw.send(0x1, b'{"op":')  # a first fragment, uncompressed
    raw.send(0x80 | 0x40 | 0x0, b'"ping"}')
    assert await raw.close_code() == 1002
    await raw.close()
    assert metrics(n)['myriad_compression_refusals_total{reason="compressed_continuation"}'] == 1


async def test_a_recovery_replays_the_stored_compressed_frames(cleanup: Cleanup) -> None:
    n = await node(cleanup)
    live = await Raw.open(n, ["permessage-deflate"])
    live.send_text(json.dumps({"op": "subscribe", "subject": "room", "id": 1}), compress=False)
    _, subscribed = await live.message()
    assert subscribed["op"] == "subscribed", subscribed
    for seq in range(3):
        live.send_text(json.dumps({"op": "publish", "subject": "room", "data": {**DATA, "seq": seq}}), compress=True)
    for _ in range(3):
        compressed, msg = await live.message()
        assert compressed and msg["op"] == "msg"
    assert metrics(n)["myriad_compression_frames_total"] == 3
    late = await Raw.open(n, ["permessage-deflate"])
    since = {"epoch": subscribed["epoch"], "offset": subscribed["offset"]}
    late.send_text(json.dumps({"op": "subscribe", "subject": "room", "since": since, "id": 2}), compress=False)
    replayed: List[int] = []
    while len(replayed) < 3:
        compressed, msg = await late.message()
        if msg["op"] == "msg":
            assert compressed, "the replay is the stored compressed frame"
            replayed.append(msg["data"]["seq"])
    assert replayed == [0, 1, 2]
    assert metrics(n)["myriad_compression_frames_total"] == 3, "replayed, not compressed again"
    await live.close()
    await late.close()


async def test_history_counts_the_compressed_frames_it_keeps(cleanup: Cleanup) -> None:
    """A kept publication's compressed frame is charged to history_max_bytes
    (docs/operations.md): the same three publications cost history more on
    a subject whose subscriber got them compressed, by their frames."""
    n = await node(cleanup)

    def history_bytes() -> int:
        with urllib.request.urlopen(f"{n.api}/stats", timeout=5) as reply:
            return int(json.loads(reply.read())["history"]["bytes"])

    async def three_kept(subject: str, extensions: Optional[List[str]]) -> int:
        """What history's bytes grew by for three publications to `subject`."""
        client = await Raw.open(n, extensions)
        client.send_text(json.dumps({"op": "subscribe", "subject": subject, "id": 1}), compress=False)
        _, subscribed = await client.message()
        assert subscribed["op"] == "subscribed", subscribed
        before = history_bytes()
        for seq in range(3):
            client.send_text(json.dumps({"op": "publish", "subject": subject, "data": {**DATA, "seq": seq}}), compress=False)
        got = 0
        while got < 3:
            compressed, msg = await client.message()
            if msg["op"] == "msg":
                assert compressed == bool(extensions), msg
                got += 1
        grown = history_bytes() - before
        await client.close()
        return grown

    # Names of one length, the same data: the same plain bytes kept.
    plain = await three_kept("roomA", None)
    compressing = await three_kept("roomB", ["permessage-deflate"])
    m = metrics(n)
    assert m["myriad_compression_frames_total"] == 3
    payloads = int(m["myriad_compression_bytes_after_total"])
    # Each frame is its compressed payload and a header of 2 to 10 bytes.
    assert payloads + 3 * 2 <= compressing - plain <= payloads + 3 * 10, (plain, compressing, payloads)
