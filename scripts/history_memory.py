#!/usr/bin/env python3
"""Measures what history costs per stored 512-byte publication.

Starts a fresh node (target/release/myriad) that keeps up to 1,000
publications per subject and has room for all of them, publishes 100,000
messages of 512 bytes of data over 1,000 subjects through the HTTP API with
nobody subscribed (so every byte held is history), and compares the node's
RSS before and after. Prints, per run and as the median of --runs runs:
RSS added per stored publication, and the node's own accounting
(/stats history.bytes / history.messages).

    python3 scripts/history_memory.py --runs 3
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def stats(admin):
    with urllib.request.urlopen(f"http://{admin}/stats", timeout=10) as r:
        return json.load(r)


def publish(admin, messages):
    body = json.dumps({"messages": messages}).encode()
    req = urllib.request.Request(f"http://{admin}/api/publish", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200, r.status


def run_once(binary, count, subjects):
    data_dir = tempfile.mkdtemp(prefix="myriad-")
    node = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
         "--workers", "1", "--history-size", "1000", "--history-ttl", "0s",
         "--history-max-bytes", str(4 << 30)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "MYRIAD_LOG": "warn", "MYRIAD_DATA_DIR": data_dir},
    )
    try:
        admin = json.loads(node.stdout.readline())["admin"]
        before = stats(admin)["process"]["rss_bytes"]
        # 512 bytes of data: a JSON string of 510 characters and its quotes.
        data = "x" * 510
        batch = []
        for n in range(count):
            batch.append({"subject": f"/h/{n % subjects}", "data": data})
            if len(batch) == 1000:
                publish(admin, batch)
                batch = []
        if batch:
            publish(admin, batch)
        after = stats(admin)
        held = after["history"]
        assert held["messages"] == count, held
        return {
            "rss_added_per_message": (after["process"]["rss_bytes"] - before) / count,
            "accounted_per_message": held["bytes"] / held["messages"],
        }
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=20)
        shutil.rmtree(data_dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--subjects", type=int, default=1_000)
    parser.add_argument("--bin", default=os.path.join(REPO, "target", "release", "myriad"))
    args = parser.parse_args()
    runs = [run_once(args.bin, args.count, args.subjects) for _ in range(args.runs)]
    for i, r in enumerate(runs, 1):
        print(f"run {i}: RSS added {r['rss_added_per_message']:.0f} B/message, "
              f"accounted {r['accounted_per_message']:.0f} B/message")
    for key in ("rss_added_per_message", "accounted_per_message"):
        values = [r[key] for r in runs]
        print(f"median {key}: {statistics.median(values):.0f} B "
              f"(range {min(values):.0f} - {max(values):.0f})")


if __name__ == "__main__":
    main()
