"""API publishing from Python (issue 32): how many messages a second one
process publishes with the SDK's synchronous ``ApiClient`` over its one
kept-alive HTTP connection (httpx's pool; the requests follow each other),
one message a request (``publish``) and in batches (``publish_batch``).

Each run starts a fresh ``myriad serve`` on loopback, publishes MESSAGES
messages round-robin over 100 subjects (no subscribers) of about 80 bytes
of data each, and checks that the node answered each with an offset. Runs
alternate the modes (single, batch; batch, single; …); the medians are
printed, with the CPU this process spent a message (``time.process_time``):
what is left of the wall time is the node's answer and waiting for a CPU.

    cd clients/python && .venv/bin/python bench/api_publish.py [--bin ../../target/release/myriad]
        [--runs 3] [--single 5000] [--batched 100000] [--batch 100]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

HERE = Path(__file__).resolve().parent
# The package from this checkout, not an installed one.
sys.path.insert(0, str(HERE.parent / "src"))

from myriad.api import ApiClient  # noqa: E402

DATA = {"pad": "x" * 64}
SUBJECTS = 100


def one_run(binary: str, mode: str, messages: int, batch: int) -> Tuple[float, float]:
    """Messages a second, and this process's CPU µs a message, for one run of ``mode`` on a fresh node."""
    data_dir = tempfile.mkdtemp(prefix="myriad-pybench-")
    node = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", data_dir],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "MYRIAD_LOG": "error"},
    )
    try:
        assert node.stdout is not None
        ready = json.loads(node.stdout.readline())
        with ApiClient(f"http://{ready['admin']}") as api:
            published = 0
            start, cpu = time.perf_counter(), time.process_time()
            if mode == "single":
                for i in range(messages):
                    assert api.publish(f"s{i % SUBJECTS}", DATA).offset is not None
                    published += 1
            else:
                for first in range(0, messages, batch):
                    pairs = [(f"s{i % SUBJECTS}", DATA) for i in range(first, min(first + batch, messages))]
                    outcome = api.publish_batch(pairs)
                    assert len(outcome.results) == len(pairs) and all(r.offset is not None for r in outcome.results)
                    published += len(pairs)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert published == messages
        return messages / elapsed, cpu / messages * 1e6
    finally:
        node.kill()
        node.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=str(HERE.parent.parent.parent / "target" / "release" / "myriad"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--single", type=int, default=5000, help="messages published one a request")
    parser.add_argument("--batched", type=int, default=100_000, help="messages published in batches")
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    modes = {"single": args.single, "batch": args.batched}
    rates: Dict[str, List[float]] = {m: [] for m in modes}
    cpus: Dict[str, List[float]] = {m: [] for m in modes}
    for run in range(args.runs):
        for mode in list(modes) if run % 2 == 0 else list(reversed(modes)):
            rate, us = one_run(args.bin, mode, modes[mode], args.batch)
            rates[mode].append(rate)
            cpus[mode].append(us)
            print(f"run {run + 1} {mode}: {rate:,.0f} messages/s, {us:.1f} µs CPU a message", flush=True)
    for mode, rs in rates.items():
        label = "one a request" if mode == "single" else f"batches of {args.batch}"
        print(
            f"{label}: median {statistics.median(rs):,.0f} messages/s ({', '.join(f'{r:,.0f}' for r in rs)}); "
            f"median {statistics.median(cpus[mode]):.1f} µs CPU a message in this process"
        )


if __name__ == "__main__":
    main()
