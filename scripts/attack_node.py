"""What the attack scripts (subject_flood.py, partial_frame_flood.py) share:
a fresh node from a given binary on ephemeral loopback ports, its /stats,
a raw WebSocket handshake, and runs that alternate between builds."""

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.request


def stats(admin):
    with urllib.request.urlopen(f"http://{admin}/stats", timeout=10) as r:
        return json.load(r)


@contextlib.contextmanager
def node(binary, extra=()):
    """A node of `binary` with `extra` flags; yields its first stdout line
    (`{"event":"listening","ws":…,"admin":…}`) and stops it after."""
    data_dir = tempfile.mkdtemp(prefix="myriad-attack-")
    process = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "MYRIAD_LOG": "warn", "MYRIAD_DATA_DIR": data_dir},
    )
    try:
        yield json.loads(process.stdout.readline())
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


def open_websocket(ws_addr):
    """A socket past a `/ws` upgrade (RFC 6455 4.1), nothing more."""
    host, port = ws_addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (f"GET /ws HTTP/1.1\r\nHost: {ws_addr}\r\nUpgrade: websocket\r\n"
         f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
         "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise SystemExit("the node closed the handshake")
        head += chunk
    if not head.startswith(b"HTTP/1.1 101"):
        raise SystemExit(f"handshake refused: {head[:80]!r}")
    return sock


def alternate(binaries, runs, one_run):
    """Runs `one_run(binary)` `runs` times per binary, alternating run by
    run, printing each result; returns the results per binary."""
    results = {b: [] for b in binaries}
    for run in range(runs):
        for binary in binaries:
            r = one_run(binary)
            results[binary].append(r)
            print(json.dumps({"run": run + 1, "binary": binary, **r}), flush=True)
    return results
