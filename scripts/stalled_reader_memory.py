#!/usr/bin/env python3
"""Kernel memory held for stalled readers the node has cut (issue 10).

Starts a fresh node (target/release/myriad, or --binary) with its default
limits and the given --close-timeout, opens --readers WebSocket readers that
subscribe to one subject and then never read (each with a 4 KiB receive
buffer, so the readers' own side of loopback holds little), publishes 2 MiB
to that subject through the HTTP API, which is past every reader's buffers
and its 1 MiB queue, and waits until the node has cut every one of them as a
slow consumer (close 4001). It samples /proc/net/sockstat `TCP ... mem`
(pages, the box's whole TCP buffer memory, both ends of loopback) and,
from /proc/net/tcp, the unacknowledged bytes of the node's own sockets:

  - before: the node up, no reader connected;
  - cut: every reader cut, the close timeout running;
  - after: close timeout + 2 s after the last cut (the sweep has run), the
    readers still open and still not reading;
  - gone: after the readers closed their sockets.

It also reports how long after the last cut the node's sockets held no
more data (`node_free_after_s`, sampled every 100 ms), and the node's count
of sockets it reset (`myriad_sockets_aborted_total`, absent before the fix).
The box is shared, so `mem` moves with whatever else runs; every run starts
a fresh node, and --runs gives medians.

    python3 scripts/stalled_reader_memory.py --readers 2000 --close-timeout 5 --runs 3
    python3 scripts/stalled_reader_memory.py --binary /tmp/base/target/release/myriad ...
"""

import argparse
import base64
import json
import os
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.sysconf("SC_PAGE_SIZE")


def get(admin, path):
    with urllib.request.urlopen(f"http://{admin}{path}", timeout=10) as r:
        return r.read().decode()


def stats(admin):
    return json.loads(get(admin, "/stats"))


def aborted(admin):
    for line in get(admin, "/metrics").splitlines():
        if line.startswith("myriad_sockets_aborted_total "):
            return int(float(line.split()[1]))
    return None


def publish(admin, messages):
    body = json.dumps({"messages": messages}).encode()
    req = urllib.request.Request(f"http://{admin}/api/publish", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200, r.status


def tcp_mem_pages():
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                fields = line.split()
                return int(fields[fields.index("mem") + 1])
    raise RuntimeError("no TCP line in /proc/net/sockstat")


def node_sockets(port):
    """(sockets, unacknowledged bytes) on the node's side of `port`, listener aside."""
    count, queued = 0, 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local_port = int(fields[1].split(":")[1], 16)
            if local_port != port or fields[3] == "0A":
                continue
            count += 1
            queued += int(fields[4].split(":")[0], 16)
    return count, queued


def masked_text(payload):
    mask = os.urandom(4)
    data = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x81, 0x80 | len(payload)]) + mask + data


def stalled_reader(host, port, subject):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect((host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(4096)
        if not chunk:
            raise RuntimeError("closed during the upgrade")
        got += chunk
    if not got.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(got[:80])
    s.sendall(masked_text(json.dumps({"op": "subscribe", "subjects": [subject], "id": 1}).encode()))
    rest = got.split(b"\r\n\r\n", 1)[1]
    while b'"subscribed"' not in rest:
        chunk = s.recv(4096)
        if not chunk:
            raise RuntimeError("closed before subscribed")
        rest += chunk
    return s


def run_once(binary, readers, close_timeout):
    data_dir = tempfile.mkdtemp(prefix="myriad-")
    node = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
         "--close-timeout", str(close_timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "MYRIAD_LOG": "error", "MYRIAD_DATA_DIR": data_dir},
    )
    socks = []
    try:
        ready = json.loads(node.stdout.readline())
        admin = ready["admin"]
        host, port = ready["ws"].rsplit(":", 1)
        port = int(port)
        time.sleep(0.5)
        before = tcp_mem_pages()
        for _ in range(readers):
            socks.append(stalled_reader(host, port, "firehose"))
        chunk = "x" * (8 * 1024)
        for batch in range(8):
            publish(admin, [{"subject": "firehose", "data": f"{batch}-{i}-{chunk}"} for i in range(32)])
        deadline = time.monotonic() + 120
        while stats(admin)["slow_consumer_disconnects"] < readers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"not all cut: {stats(admin)['slow_consumer_disconnects']}")
            time.sleep(0.05)
        cut_at = time.monotonic()
        cut = tcp_mem_pages()
        cut_node = node_sockets(port)
        free_after = None
        while time.monotonic() < cut_at + close_timeout + 2:
            if free_after is None and node_sockets(port)[1] == 0:
                free_after = time.monotonic() - cut_at
            time.sleep(0.1)
        after = tcp_mem_pages()
        after_node = node_sockets(port)
        resets = aborted(admin)
        for s in socks:
            s.close()
        socks = []
        time.sleep(1)
        gone = tcp_mem_pages()
        mib = lambda pages: round(pages * PAGE / 2**20, 1)
        return {
            "readers": readers,
            "close_timeout_s": close_timeout,
            "tcp_mem_mib": {"before": mib(before), "cut": mib(cut), "after": mib(after), "gone": mib(gone)},
            "node_sockets": {"cut": cut_node[0], "after": after_node[0]},
            "node_unacked_mib": {"cut": round(cut_node[1] / 2**20, 1), "after": round(after_node[1] / 2**20, 1)},
            "node_free_after_s": None if free_after is None else round(free_after, 1),
            "sockets_aborted": resets,
        }
    finally:
        for s in socks:
            s.close()
        node.kill()
        node.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default=os.path.join(REPO, "target", "release", "myriad"))
    p.add_argument("--readers", type=int, default=2000)
    p.add_argument("--close-timeout", type=int, default=5)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    runs = []
    for _ in range(args.runs):
        run = run_once(args.binary, args.readers, args.close_timeout)
        print(json.dumps(run), flush=True)
        runs.append(run)
    median = {
        key: statistics.median(r["tcp_mem_mib"][key] for r in runs) for key in runs[0]["tcp_mem_mib"]
    }
    frees = [r["node_free_after_s"] for r in runs if r["node_free_after_s"] is not None]
    print(json.dumps({
        "median_tcp_mem_mib": median,
        "range_tcp_mem_mib": {k: [min(r["tcp_mem_mib"][k] for r in runs), max(r["tcp_mem_mib"][k] for r in runs)]
                              for k in median},
        "median_node_free_after_s": statistics.median(frees) if len(frees) == len(runs) else None,
    }))


if __name__ == "__main__":
    main()
