#!/usr/bin/env python3
"""Presence at size (issue 29's targets): one subject of N members, joined
all at once, on one node or across nodes over Redis.

Each run starts fresh nodes on ephemeral loopback ports, lets `myriad bench
subscribers` open N connections to one subject as fast as it can (the join
storm: the bench's default 1,000 handshakes in flight per process), and
then, while the N are held, asks the node's admin API for
`presence_stats` one request after another on one keep-alive connection.
What it reports per run:

- storm: seconds from the bench's start until `presence_stats` counts N
  connections, and the bench's own set-up time;
- memory per member: the nodes' RSS with the N subscribed, less the same
  for a run whose namespace has presence off (`--variants` runs them
  alternately, run by run, in one sitting); over Redis also Redis's
  `used_memory`, likewise;
- slow consumers: connections the node cut as slow consumers (its
  `/metrics`), and, with join/leave events on, the join events the
  members received (the bench's `other_in` less its N acks) against
  N(N-1)/2, one per later joiner. That is a bound, not an exact count:
  a member is told only of joins after its `subscribed`, so two joins
  that race each other's subscribe are each in the other's snapshot
  (`presence`) instead, and a member that times out and comes back adds
  a leave and a join;
- `presence_stats` latency: median and p99 of `--stats-requests` requests;
- over Redis (`--nodes K` > 1, one `redis-server`): the Redis process's
  CPU during the storm per member, against the presence-off run's, and
  during a hold of `--hold` seconds with `--presence-lease` short, its CPU
  per lease renewal (every node renews its members every third of the
  lease; the presence-off run's idle CPU is subtracted).

    python3 scripts/presence_bench.py --runs 3                     # one node, 10,000 members
    python3 scripts/presence_bench.py --runs 3 --variants plain presence events
    python3 scripts/presence_bench.py --runs 3 --nodes 4 --variants plain presence
    python3 scripts/presence_bench.py --runs 1 --members 300 --duration 5s --wait 20 --check   # smoke (scripts/test.sh)

It uses target/release/myriad (build it first). Nothing here changes
sysctls. Every load is bounded: N connections, one bench run of
`--duration`, `--stats-requests` requests.
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

sys.dont_write_bytecode = True  # no __pycache__ in scripts/ for the import below
from cluster import (  # noqa: E402
    Children,
    catch_signals,
    metrics,
    processes,
    redis_info,
    start_node,
    start_redis,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADMIN_KEY = "presence-bench-admin-key-0123456789abcdef"
SUBJECT = "room.1"

# What each variant sets on the `room.` namespace.
VARIANTS = {
    "plain": "presence = false\n",
    "presence": "presence = true\n",
    "events": "presence = true\njoin_leave = true\n",
}


def namespace_file(out_dir, variant, members):
    path = os.path.join(out_dir, f"{variant}.toml")
    with open(path, "w") as f:
        f.write('[[namespace]]\nprefix = "room."\n')
        f.write(VARIANTS[variant])
        f.write(f"presence_max_members = {members}\n")
    return path


class Admin:
    """One keep-alive HTTP connection to a node's admin API."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)

    def get(self, path, **query):
        self.conn.request("GET", f"{path}?{urllib.parse.urlencode(query)}",
                          headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        r = self.conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status} {body[:200]!r}")
        return json.loads(body)

    def stats(self):
        return self.get("/api/presence_stats", subject=SUBJECT)


def redis_cpu(port):
    """Redis's own CPU seconds (INFO cpu: microsecond precision, where
    /proc counts 10 ms ticks) and its script calls so far."""
    cpu = redis_info(port, "cpu")
    calls = 0
    for k, v in redis_info(port, "commandstats").items():
        if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"):
            calls += int(v.split(",")[0].split("=")[1])
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), calls


def redis_memory(port):
    return int(redis_info(port, "memory")["used_memory"])


def rss(pid):
    return processes()[pid][3]


def subscriptions(admins):
    total = 0.0
    for a in admins:
        total += sum(v for k, v in metrics(a, ADMIN_KEY).items() if k.startswith("myriad_subscriptions{"))
    return total


def slow_consumer_closes(admins):
    key = 'myriad_connections_closed_total{reason="slow_consumer"}'
    return sum(metrics(a, ADMIN_KEY).get(key, 0.0) for a in admins)


def run_once(args, variant, out_dir, index):
    children = Children()
    try:
        redis_port = None
        flags = ["--config", namespace_file(out_dir, variant, args.members),
                 "--admin-key", ADMIN_KEY, "--heartbeat-interval", "0"]
        if args.nodes > 1:
            _, redis_port = start_redis(children, out_dir)
            flags += ["--engine", "redis", "--redis-url", f"redis://127.0.0.1:{redis_port}",
                      "--presence-lease", args.presence_lease]
        nodes = [start_node(children, args.bin, flags) for _ in range(args.nodes)]
        admins = [admin for _, _, admin in nodes]
        time.sleep(1)  # let the nodes settle before the baseline
        rss_idle = sum(rss(p.pid) for p, _, _ in nodes)
        redis_mem0 = redis_memory(redis_port) if redis_port else None
        admin = Admin(admins[0])

        report = os.path.join(out_dir, f"{variant}-{index}.json")
        urls = ",".join(f"ws://{ws}/ws" for _, ws, _ in nodes)
        redis0 = redis_cpu(redis_port) if redis_port else None
        started = time.monotonic()
        bench = children.popen(
            [args.bin, "bench", "--url", urls, "--json", report, "--progress", "plain",
             "subscribers", "--connections", str(args.members), "--subjects", SUBJECT,
             "--duration", args.duration],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Every variant waits for the nodes to count N subscriptions; one
        # with presence also for `presence_stats` to count N members.
        subscribed_s, counted = None, None
        deadline = started + args.wait
        while time.monotonic() < deadline and (subscribed_s is None or counted is None):
            if subscribed_s is None and subscriptions(admins) >= args.members:
                subscribed_s = time.monotonic() - started
            if counted is None and (variant == "plain" or admin.stats()["connections"] >= args.members):
                counted = time.monotonic() - started
            time.sleep(0.05)
        redis_storm = redis_cpu(redis_port)[0] - redis0[0] if redis_port else None

        # Held: memory, then presence_stats one after another.
        time.sleep(2)
        rss_held = sum(rss(p.pid) for p, _, _ in nodes)
        redis_mem = redis_memory(redis_port) - redis_mem0 if redis_port else None
        took = []
        if variant != "plain":
            for _ in range(args.stats_requests):
                t = time.perf_counter()
                admin.stats()
                took.append(time.perf_counter() - t)
        redis_hold, hold_calls = None, None
        if redis_port:
            c0, n0 = redis_cpu(redis_port)
            time.sleep(args.hold)
            c1, n1 = redis_cpu(redis_port)
            redis_hold, hold_calls = c1 - c0, n1 - n0
        final = admin.stats() if variant != "plain" else {"connections": None}
        cut = slow_consumer_closes(admins)
        bench.wait(timeout=600)
        with open(report) as f:
            doc = json.load(f)
        totals = doc["totals"]
        n = args.members
        return {
            "setup_s": doc["setup_secs"],
            "subscribed_s": subscribed_s,
            "counted_s": counted if variant != "plain" else None,
            "subscribed": totals["subscribed"],
            "failed": sum(doc["failures"].values()),
            "closed": totals["closed"],
            "members": final["connections"],
            "slow_consumers": cut,
            "events_in": totals["other_in"] - totals["subscribed"],
            "events_expected": n * (n - 1) // 2 if variant == "events" else 0,
            "rss_per_conn": (rss_held - rss_idle) / n,
            "stats_p50_us": statistics.median(took) * 1e6 if took else None,
            "stats_p99_us": sorted(took)[int(len(took) * 0.99) - 1] * 1e6 if took else None,
            "redis_memory_per_conn": redis_mem / n if redis_port else None,
            "redis_storm_cpu_s": redis_storm,
            "redis_hold_cpu_s": redis_hold,
            "redis_hold_calls": hold_calls,
        }
    finally:
        children.stop_all()


def med(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def main():
    catch_signals()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/myriad"))
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=["plain", "presence"], choices=sorted(VARIANTS))
    ap.add_argument("--duration", default="30s", help="how long the bench holds its connections")
    ap.add_argument("--stats-requests", type=int, default=1000)
    ap.add_argument("--wait", type=float, default=120.0,
                    help="seconds to wait for the N subscriptions and members before going on without")
    ap.add_argument("--presence-lease", default="3s", help="with --nodes > 1: short, so the hold sees renewals")
    ap.add_argument("--hold", type=float, default=10.0, help="seconds of Redis CPU sampled while held")
    ap.add_argument("--out", default=os.path.join(REPO, "target/benchmarks/presence"))
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every run subscribed all N with none failed or cut, "
                         "and presence counted all N (the smoke run in scripts/test.sh)")
    args = ap.parse_args()
    if args.nodes > 1 and "events" in args.variants:
        sys.exit("join/leave events are memory-engine only: --variants events needs --nodes 1")
    os.makedirs(args.out, exist_ok=True)
    out_dir = tempfile.mkdtemp(prefix="presence-", dir=args.out)
    results = {v: [] for v in args.variants}
    for i in range(args.runs):
        for v in args.variants:
            r = run_once(args, v, out_dir, i)
            print(f"run {i + 1} {v}: {json.dumps(r)}", flush=True)
            results[v].append(r)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)

    print(f"\n{args.members} members, {args.nodes} node(s), medians of {args.runs} (range)")
    keys = list(next(iter(results.values()))[0].keys())
    for k in keys:
        cells = []
        for v in args.variants:
            m = med([r[k] for r in results[v]])
            cells.append("-" if m is None else f"{m[0]:,.2f} ({m[1]:,.2f} - {m[2]:,.2f})")
        print(f"  {k:18} " + " | ".join(f"{v}: {c}" for v, c in zip(args.variants, cells)))
    if "plain" in results:
        base = statistics.median(r["rss_per_conn"] for r in results["plain"])
        for v in args.variants:
            if v != "plain":
                m = statistics.median(r["rss_per_conn"] for r in results[v])
                print(f"  memory per member ({v}): {m - base:,.0f} B on the nodes")
                if args.nodes > 1:
                    rm = statistics.median(r["redis_memory_per_conn"] for r in results[v])
                    rb = statistics.median(r["redis_memory_per_conn"] for r in results["plain"])
                    print(f"  memory per member ({v}): {rm - rb:,.0f} B in Redis (used_memory)")
        if args.nodes > 1:
            hold_base = statistics.median(r["redis_hold_cpu_s"] for r in results["plain"])
            storm_base = statistics.median(r["redis_storm_cpu_s"] for r in results["plain"])
            for v in args.variants:
                if v == "plain":
                    continue
                storm = statistics.median(r["redis_storm_cpu_s"] for r in results[v])
                print(f"  Redis CPU per join ({v}): {(storm - storm_base) / args.members * 1e6:,.1f} µs "
                      f"(storm {storm:.3f} s against {storm_base:.3f} s presence off)")
                hold = statistics.median(r["redis_hold_cpu_s"] for r in results[v])
                calls = statistics.median(r["redis_hold_calls"] for r in results[v])
                base_calls = statistics.median(r["redis_hold_calls"] for r in results["plain"])
                renewals = calls - base_calls
                if renewals > 0:
                    print(f"  Redis CPU per lease renewal ({v}): {(hold - hold_base) / renewals * 1e6:,.0f} µs "
                          f"({renewals:.0f} more script calls than presence off in {args.hold:.0f} s, "
                          f"each renewing one node's {args.members // args.nodes:,} members)")
    print(f"\nreports in {out_dir}")
    if args.check:
        wrong = [f"{v} run {i + 1}: {r}" for v, runs in results.items() for i, r in enumerate(runs)
                 if r["subscribed"] != args.members or r["failed"] or r["slow_consumers"]
                 or (v != "plain" and r["members"] != args.members)]
        if wrong:
            sys.exit("presence check failed:\n  " + "\n  ".join(wrong))
        print("check: every run subscribed and counted all members, none failed or cut")


if __name__ == "__main__":
    main()
