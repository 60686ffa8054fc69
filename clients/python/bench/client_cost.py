"""Client cost in Python (issue 32): how many messages a second one client
process holding SUBJECTS subscriptions on one connection receives, and the
CPU it spends a message, the SDK (``myriad.Client`` with a counting
``publication`` listener on each subscription) against a bare
``websockets`` loop that only parses each message's JSON, in the same
sitting.

Each run starts a fresh ``myriad serve`` on loopback (``max_subscriptions``
and ``max_outbound_bytes`` raised so that the client holds SUBJECTS
subjects and is never cut as a slow consumer) and one client process,
which subscribes and says so. The driver then stops the client (SIGSTOP),
publishes MESSAGES messages round-robin over the subjects through the HTTP
API (the SDK's ``ApiClient``, batches of 500) and lets the client go on
(SIGCONT): the whole stream waits for it, so the client, not the
publisher, sets the pace. The client reads its own CPU time
(``time.process_time``) and the wall clock from its first message to its
last. Runs alternate (ws, sdk; sdk, ws; …), each on a fresh node; the
medians are printed.

    cd clients/python && .venv/bin/python bench/client_cost.py [--bin ../../target/release/myriad]
        [--runs 3] [--subjects 1000] [--messages 200000] [--kinds ws,sdk]

CLIENT_COST_PROFILE=DIR adds a cProfile of each client process (its set-up
included) in DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
# The package from this checkout, not an installed one.
sys.path.insert(0, str(HERE.parent / "src"))
# About 150 bytes on the wire a message, as the TypeScript bench's.
PAD = "x" * 64


def subject(i: int) -> str:
    return f"s{i}"


# ---- one client process -----------------------------------------------------


def run_queue_wait() -> float:
    """Seconds this thread has waited for a CPU while runnable (Linux's
    /proc/thread-self/schedstat, second field, in ns); 0 where there is none.
    On a busy box it says how much of the wall time was not the client's own."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except OSError:
        return 0.0


class Clock:
    """CPU, wall and run-queue time from the first message counted to the last."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.count = 0
        self.cpu0 = 0.0
        self.wall0 = 0.0
        self.waited0 = 0.0
        self.done = asyncio.Event()

    def tick(self) -> None:
        self.count += 1
        if self.count == 1:
            self.cpu0, self.wall0, self.waited0 = time.process_time(), time.perf_counter(), run_queue_wait()
        elif self.count == self.total:
            self.report()
            self.done.set()

    def report(self) -> None:
        cpu, wall = time.process_time() - self.cpu0, time.perf_counter() - self.wall0
        waited = run_queue_wait() - self.waited0
        print(json.dumps({"messages": self.total - 1, "cpu": cpu, "wall": wall, "waited": waited}), flush=True)


async def bare(url: str, subjects: int, clock: Clock) -> None:
    from websockets.asyncio.client import connect

    async with connect(url, ping_interval=None, max_size=None, compression=None) as ws:
        for i in range(subjects):
            await ws.send(json.dumps({"op": "subscribe", "subject": subject(i), "id": i + 1}))
        answered = 0
        while answered < subjects:
            if json.loads(await ws.recv()).get("op") == "subscribed":
                answered += 1
        print("ready", flush=True)
        async for text in ws:
            json.loads(text)
            clock.tick()
            if clock.done.is_set():
                return


async def sdk(url: str, subjects: int, clock: Clock) -> None:
    from myriad import Client

    client = Client(url)
    client.connect()
    subs = [client.subscribe(subject(i)) for i in range(subjects)]
    for sub in subs:
        sub.on("publication", lambda _: clock.tick())
    await asyncio.gather(*(sub.ready() for sub in subs))
    print("ready", flush=True)
    await clock.done.wait()
    await client.aclose()


def run_client(kind: str, url: str, subjects: int, messages: int) -> None:
    async def main() -> None:
        # The clock made on the running loop: before 3.10 an asyncio.Event
        # binds to the loop current when it is made.
        await (bare if kind == "ws" else sdk)(url, subjects, Clock(messages))

    # CLIENT_COST_PROFILE=DIR: a cProfile of each client process, DIR/<kind>-<pid>.prof.
    profile_dir = os.environ.get("CLIENT_COST_PROFILE")
    if not profile_dir:
        asyncio.run(main())
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.runcall(asyncio.run, main())
    profiler.dump_stats(os.path.join(profile_dir, f"{kind}-{os.getpid()}.prof"))


# ---- the driver --------------------------------------------------------------


def start_node(binary: str, subjects: int) -> "tuple[subprocess.Popen[str], Dict[str, str], str]":
    data_dir = tempfile.mkdtemp(prefix="myriad-pybench-")
    node = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", data_dir,
         "--max-subscriptions", str(subjects), "--max-outbound-bytes", str(512 << 20)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "MYRIAD_LOG": "error"},
    )
    assert node.stdout is not None
    ready = json.loads(node.stdout.readline())
    assert ready["event"] == "listening", ready
    return node, ready, data_dir


def one_run(binary: str, kind: str, subjects: int, messages: int) -> Dict[str, Any]:
    from myriad.api import ApiClient

    node, ready, data_dir = start_node(binary, subjects)
    client = subprocess.Popen(
        [sys.executable, __file__, "--client", kind, "--url", f"ws://{ready['ws']}/ws",
         "--subjects", str(subjects), "--messages", str(messages)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert client.stdout is not None
        line = client.stdout.readline().strip()
        assert line == "ready", f"the {kind} client said {line!r}"
        client.send_signal(signal.SIGSTOP)
        data = {"pad": PAD}
        with ApiClient(f"http://{ready['admin']}") as api:
            for start in range(0, messages, 500):
                api.publish_batch([(subject(i % subjects), data) for i in range(start, min(start + 500, messages))])
        client.send_signal(signal.SIGCONT)
        result: Dict[str, Any] = json.loads(client.stdout.readline())
        client.wait(60)
        return result
    finally:
        client.kill()
        node.kill()
        node.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


def drive(args: argparse.Namespace) -> None:
    kinds = args.kinds.split(",")
    results: Dict[str, List[Dict[str, Any]]] = {k: [] for k in kinds}
    for run in range(args.runs):
        for kind in kinds if run % 2 == 0 else list(reversed(kinds)):
            r = one_run(args.bin, kind, args.subjects, args.messages)
            r["rate"] = r["messages"] / r["wall"]
            r["us"] = r["cpu"] / r["messages"] * 1e6
            results[kind].append(r)
            print(
                f"run {run + 1} {kind}: {r['rate']:,.0f} messages/s, {r['us']:.2f} µs CPU a message; "
                f"of {r['wall']:.2f} s, {r['cpu']:.2f} s on a CPU and {r['waited']:.2f} s waiting for one",
                flush=True,
            )
    for kind, rs in results.items():
        rates = ", ".join(f"{r['rate']:,.0f}" for r in rs)
        us = ", ".join(f"{r['us']:.2f}" for r in rs)
        print(
            f"{kind}: median {statistics.median(r['rate'] for r in rs):,.0f} messages/s ({rates}); "
            f"median {statistics.median(r['us'] for r in rs):.2f} µs CPU a message ({us}), "
            f"so {1e6 / statistics.median(r['us'] for r in rs):,.0f} messages a CPU-second; "
            f"median {statistics.median(r['waited'] / r['wall'] for r in rs):.0%} of the wall time waiting for a CPU"
        )
    if "ws" in results and "sdk" in results:
        ratio = statistics.median(r["us"] for r in results["sdk"]) / statistics.median(r["us"] for r in results["ws"])
        print(f"sdk / ws CPU a message: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=str(HERE.parent.parent.parent / "target" / "release" / "myriad"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--subjects", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--kinds", default="ws,sdk")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        run_client(args.client, args.url, args.subjects, args.messages)
    else:
        drive(args)


if __name__ == "__main__":
    main()
