#!/usr/bin/env python3
"""Idle cost of HTTP-transport connections, measured from outside.

An independent probe (plain asyncio sockets, no myriad code): opens N
Server-Sent Events or HTTP-stream connections to a running node, each
subscribed to its own subject, waits until the node reports them all
subscribed, then holds them for --hold seconds while heartbeats flow, and
reports from the node's /stats:

  - server RSS added per connection (RSS at N minus RSS before, over N),
  - server CPU over the hold (ms per second, and per connection-heartbeat),
  - heartbeats received by the probe.

    python3 scripts/http_idle_probe.py --transport sse --connections 19000 \\
        --hold 60 --ws 127.0.0.1:8080 --admin 127.0.0.1:8081

Start the node with the heartbeat interval to study, e.g.
`myriad serve --stream-heartbeat-interval 15`. One process holds at most
20,000 open files on this box, so N stays below that.
"""

import argparse
import asyncio
import json
import resource
import sys
import time
import urllib.request


def stats(admin):
    with urllib.request.urlopen(f"http://{admin}/stats", timeout=10) as r:
        return json.load(r)


async def hold_one(host, port, path, opening, heartbeats, stop):
    # At most `opening` requests in flight: a loaded event loop that opened
    # thousands of sockets at once could take longer than the node's
    # handshake_timeout to send each its request.
    async with opening:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head[:80])
    marker = b": heartbeat" if "/sse" in path else b"1\r\n\n\r\n"
    while not stop.is_set():
        try:
            chunk = await asyncio.wait_for(reader.read(4096), timeout=1.0)
        except asyncio.TimeoutError:
            continue
        if not chunk:
            break
        heartbeats[0] += chunk.count(marker)
    writer.close()


async def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transport", choices=["sse", "stream"], default="sse")
    p.add_argument("--connections", type=int, default=19000)
    p.add_argument("--hold", type=float, default=60.0)
    p.add_argument("--ws", default="127.0.0.1:8080", help="client listener host:port")
    p.add_argument("--admin", default="127.0.0.1:8081", help="admin listener host:port")
    args = p.parse_args()

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port = args.ws.rsplit(":", 1)
    before = stats(args.admin)
    opening, heartbeats, stop = asyncio.Semaphore(128), [0], asyncio.Event()
    tasks = []
    t0 = time.monotonic()
    for i in range(args.connections):
        path = f"/{args.transport}?subject=idle-{i}"
        tasks.append(asyncio.create_task(hold_one(host, int(port), path, opening, heartbeats, stop)))
    while True:
        s = stats(args.admin)
        if s["subscriptions"] - before["subscriptions"] >= args.connections:
            break
        failed = [t for t in tasks if t.done() and t.exception()]
        if failed:
            raise failed[0].exception()
        if time.monotonic() - t0 > 300:
            sys.exit(f"only {s['subscriptions']} subscribed after 300 s")
        await asyncio.sleep(0.5)
    setup = time.monotonic() - t0
    at_full = stats(args.admin)
    beats_before = heartbeats[0]
    await asyncio.sleep(args.hold)
    after = stats(args.admin)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)

    n = args.connections
    rss_added = at_full["process"]["rss_bytes"] - before["process"]["rss_bytes"]
    cpu = after["process"]["cpu_seconds"] - at_full["process"]["cpu_seconds"]
    beats = heartbeats[0] - beats_before
    report = {
        "transport": args.transport,
        "connections": n,
        "setup_seconds": round(setup, 1),
        "server_rss_added_per_connection": round(rss_added / n),
        "server_rss_at_full_mib": round(at_full["process"]["rss_bytes"] / 2**20, 1),
        "hold_seconds": args.hold,
        "server_cpu_ms_per_second": round(1000 * cpu / args.hold, 2),
        "heartbeats_received": beats,
        "server_cpu_us_per_heartbeat": round(1e6 * cpu / beats, 2) if beats else None,
        "rss_drift_over_hold_percent": round(
            100 * (after["process"]["rss_bytes"] - at_full["process"]["rss_bytes"]) / at_full["process"]["rss_bytes"], 2
        ),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
