"""What the tests stand on: the real node (``myriad serve`` from MYRIAD_BIN,
default the repository's release build, on ephemeral loopback ports learnt
from its first stdout line, as clients/js/test/integration/harness.ts
does), a ``redis-server`` on a free loopback port (clients/conformance's
harness contract), a TCP proxy on loopback that can cut every connection through it or
point at another node, a scriptable fake node (a ``websockets`` server) for
the timing and error paths, HS256 tokens, and bounded waits."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

HERE = Path(__file__).resolve().parent
BIN = os.environ.get("MYRIAD_BIN") or str(HERE.parent.parent.parent / "target" / "release" / "myriad")


class Child:
    """A process the tests started, with the temporary directory it keeps its data in."""

    def __init__(self, process: asyncio.subprocess.Process, data_dir: str) -> None:
        self.process = process
        self._data_dir = data_dir

    async def kill(self) -> None:
        """SIGKILL (no close frame, no drain), then the data directory removed; again is harmless."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()
        shutil.rmtree(self._data_dir, ignore_errors=True)


class Node(Child):
    """A running ``myriad serve``; ``url`` is its WebSocket URL, ``admin`` its admin address."""

    def __init__(self, process: asyncio.subprocess.Process, ws: str, admin: str, data_dir: str) -> None:
        super().__init__(process, data_dir)
        self.ws = ws
        self.admin = admin
        self.url = f"ws://{ws}/ws"
        self.api = f"http://{admin}"


async def start_node(extra: Sequence[str] = ()) -> Node:
    data_dir = tempfile.mkdtemp(prefix="myriad-pysdk-")
    process = await asyncio.create_subprocess_exec(
        BIN,
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir,
        *extra,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "MYRIAD_LOG": "warn"},
    )
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), 10)
    except asyncio.TimeoutError:
        process.kill()
        raise RuntimeError("no ready line from myriad within 10 s")
    if not line:
        raise RuntimeError(f"myriad exited with {await process.wait()}")
    ready = json.loads(line)
    assert ready["event"] == "listening", line
    return Node(process, ready["ws"], ready["admin"], data_dir)


class Redis(Child):
    """A ``redis-server`` on 127.0.0.1 with no persistence; ``url`` is ``redis://127.0.0.1:<port>``."""

    def __init__(self, process: asyncio.subprocess.Process, port: int, data_dir: str) -> None:
        super().__init__(process, data_dir)
        self.url = f"redis://127.0.0.1:{port}"


async def _redis_answers(port: int, within: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"PING\r\n")
            answer = await asyncio.wait_for(reader.readline(), 1)
            writer.close()
            if answer == b"+PONG\r\n":
                return True
        except (OSError, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.05)
    return False


async def start_redis() -> Redis:
    """Redis cannot listen on port 0: a port found free (bind to 0, read it, close), tried up to 5 times."""
    for _ in range(5):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        data_dir = tempfile.mkdtemp(prefix="myriad-pysdk-redis-")
        process = await asyncio.create_subprocess_exec(
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            data_dir,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        redis = Redis(process, port, data_dir)
        if await _redis_answers(port, 5.0):
            return redis
        await redis.kill()
    raise RuntimeError("redis-server did not start on any of 5 ports")


class Proxy:
    """A TCP proxy on 127.0.0.1:0 towards ``target`` ("host:port")."""

    def __init__(self, target: str) -> None:
        self.target = target
        # Connections accepted so far.
        self.accepted = 0
        self._writers: Set[asyncio.StreamWriter] = set()
        self._server: Optional[asyncio.AbstractServer] = None

    async def listen(self) -> str:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{port}/ws"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        host, port = self.target.rsplit(":", 1)
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.transport.abort()
            return
        pair = [writer, up_writer]
        self._writers.update(pair)

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                for w in pair:
                    w.transport.abort()
                    self._writers.discard(w)

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    def cut(self) -> None:
        """Cuts every connection through the proxy at once (no close frame)."""
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()


def hs256(secret: str, claims: Dict[str, Any]) -> str:
    """An HS256 JWT with ``claims``, signed with ``secret``."""

    def part(value: bytes) -> str:
        return base64.urlsafe_b64encode(value).rstrip(b"=").decode()

    body = f"{part(json.dumps({'alg': 'HS256', 'typ': 'JWT'}).encode())}.{part(json.dumps(claims).encode())}"
    return f"{body}.{part(hmac.new(secret.encode(), body.encode(), hashlib.sha256).digest())}"


async def until(what: str, done: Callable[[], bool], timeout: float = 10.0) -> None:
    """Returns when ``done()`` holds (checked every 10 ms); fails after ``timeout`` s naming ``what``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not done():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class FakeConnection:
    """One client connection to the fake node, driven by the test."""

    def __init__(self, ws: ServerConnection, path: str) -> None:
        self.ws = ws
        self.path = path
        self.received: "asyncio.Queue[Dict[str, Any]]" = asyncio.Queue()
        self.closed = asyncio.Event()

    async def recv(self, timeout: float = 5.0) -> Dict[str, Any]:
        """The next command the client sent."""
        return await asyncio.wait_for(self.received.get(), timeout)

    async def send(self, message: Any) -> None:
        await self.ws.send(message if isinstance(message, str) else json.dumps(message))

    async def close(self, code: int, reason: str = "") -> None:
        await self.ws.close(code, reason)

    def drop(self) -> None:
        """Ends the connection without a close frame (1006 for the client)."""
        self.ws.transport.abort()


class FakeNode:
    """A scriptable node: every connection it accepts goes to ``connections``."""

    def __init__(self) -> None:
        self.connections: "asyncio.Queue[FakeConnection]" = asyncio.Queue()
        self.all: List[FakeConnection] = []
        self._server: Optional[Server] = None
        self.url = ""
        # Upgrades to refuse with 503 before accepting again (1006 for the client).
        self.refuse = 0
        self.refused = 0

    def _process_request(self, connection: ServerConnection, request: Request) -> Optional[Response]:
        if self.refuse > 0:
            self.refuse -= 1
            self.refused += 1
            return connection.respond(503, "refused by the test")
        return None

    async def start(self) -> "FakeNode":
        self._server = await serve(
            self._handle, "127.0.0.1", 0, ping_interval=None, compression=None, process_request=self._process_request
        )
        port = list(self._server.sockets)[0].getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}/ws"
        return self

    async def _handle(self, ws: ServerConnection) -> None:
        conn = FakeConnection(ws, ws.request.path if ws.request else "")
        self.all.append(conn)
        await self.connections.put(conn)
        try:
            async for text in ws:
                await conn.received.put(json.loads(text))
        except Exception:  # noqa: BLE001 - the client went away
            pass
        finally:
            conn.closed.set()

    async def accept(self, timeout: float = 5.0) -> FakeConnection:
        return await asyncio.wait_for(self.connections.get(), timeout)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
