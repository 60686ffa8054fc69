#!/usr/bin/env python3
"""Issue 26's first attack: one client publishing one byte to each of many
distinct subjects that nobody subscribes to, and what it costs the node.

Starts a fresh node from each --binary in turn (alternating, --runs times
each), opens one anonymous WebSocket, publishes `1` to subjects /f/0 ..
/f/N-1 without request ids (so nothing is answered and nothing waits),
then reads /stats: the node's RSS before and after, what history says it
holds against history_max_bytes, the positions kept and the evictions.
The figure that matters is RSS added against the budget: a node that keeps
every subject's state inside history_max_bytes grows by at most the budget
plus a constant, whatever N is.

    python3 scripts/subject_flood.py --binary target/release/myriad \\
        --subjects 2000000 --runs 3
    python3 scripts/subject_flood.py --binary old/myriad --binary target/release/myriad \\
        --subjects 300000 --history-max-bytes 1MiB --runs 3

Bounded: N publishes, then at most --settle seconds waiting for the node to
take them all (/stats publishes), then the node is stopped.
"""

import argparse
import statistics
import time

from attack_node import alternate, node, open_websocket, stats


def masked_text_frame(payload):
    """A client text frame (RFC 6455 5.2) with a zero mask: the mask is
    required, its value is not, and zero leaves the payload readable."""
    n = len(payload)
    if n < 126:
        head = bytes([0x81, 0x80 | n])
    else:
        head = bytes([0x81, 0x80 | 126]) + n.to_bytes(2, "big")
    return head + b"\0\0\0\0" + payload


def flood(binary, subjects, max_bytes, settle):
    extra = [] if max_bytes is None else ["--history-max-bytes", max_bytes]
    with node(binary, extra) as ready:
        admin = ready["admin"]
        before = stats(admin)
        sock = open_websocket(ready["ws"])
        started = time.monotonic()
        batch = []
        for n in range(subjects):
            body = b'{"op":"publish","subject":"/f/%d","data":1}' % n
            batch.append(masked_text_frame(body))
            if len(batch) == 4096:
                sock.sendall(b"".join(batch))
                batch = []
        if batch:
            sock.sendall(b"".join(batch))
        deadline = time.monotonic() + settle
        while True:
            after = stats(admin)
            if after["publishes"] >= before["publishes"] + subjects:
                break
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"the node took {after['publishes']} of {subjects} in {settle} s")
            time.sleep(0.2)
        took = time.monotonic() - started
        sock.close()
        history = after["history"]
        return {
            "subjects": subjects,
            "seconds": round(took, 1),
            "rss_before_mib": before["process"]["rss_bytes"] / 2**20,
            "rss_after_mib": after["process"]["rss_bytes"] / 2**20,
            "rss_added_mib": (after["process"]["rss_bytes"] - before["process"]["rss_bytes"]) / 2**20,
            "history_mib": history["bytes"] / 2**20,
            "history_max_mib": history.get("max_bytes", 0) / 2**20,
            "positions": history.get("positions"),
            "evictions": history["evictions"],
            "evicted_positions": history.get("evicted_positions"),
        }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", action="append", required=True,
                        help="a myriad binary; give two to compare them, alternating")
    parser.add_argument("--subjects", type=int, default=2_000_000)
    parser.add_argument("--history-max-bytes", default=None,
                        help="the node's budget (its flag's syntax); default: the node's default")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settle", type=float, default=300.0)
    args = parser.parse_args()
    results = alternate(args.binary, args.runs, lambda binary: flood(
        binary, args.subjects, args.history_max_bytes, args.settle))
    for binary, runs in results.items():
        median = statistics.median(r["rss_added_mib"] for r in runs)
        history = statistics.median(r["history_mib"] for r in runs)
        print(f"{binary}: RSS added {median:.1f} MiB (median of {len(runs)}), "
              f"history {history:.1f} MiB of {runs[0]['history_max_mib']:.1f} MiB")


if __name__ == "__main__":
    main()
