#!/usr/bin/env python3
"""Throughput through Redis (issue 11): two nodes over one Redis against one
memory-engine node, in the same sitting, on the workloads of
docs/benchmarks.md.

Starts a fresh `redis-server` on a free loopback port (no persistence; with
--redis N, N of them), then for each of --runs runs, workload by workload,
alternates the configurations:

  A   one node, `--engine memory` (the default);
  B   two nodes, `--engine redis` over that Redis (subjects spread over all N,
      one --redis-url each); the bench spreads its connections over both
      (two --url), its publishers too;
  B+  B with `--redis-queue 1048576`, for the saturating one-to-one only:
      deep enough that no publish is refused, so the rate comes from a run
      that refused nothing (B refuses most of what it is offered).

With --tls, Redis also listens on a TLS port with a certificate made
for the run, and B's nodes reach it there (`rediss://`, `--redis-tls-ca`).
Every node is fresh for each bench command, and Redis is emptied
(FLUSHALL) before each B run. The workloads (bench arguments from
scripts/benchmarks.py's scenarios, scaled so a run takes at most ~60 s):

  one-to-one      one-to-one-saturating: 10,000 subscribers each on its own
                  subject, 200,000 publishes/s of 512 B offered over 4
                  connections, stopped after 1,000,000 publishes;
  broadcast       broadcast-saturating: 10,000 subscribers of one subject,
                  800 publishes/s, 4,000 publishes (40 M deliveries);
  one-to-one-10k  the one-to-one shape at 10,000 publishes/s for 20 s, below
                  what B can take, for its latency;
  broadcast-5     broadcast-moderate: 5 publishes/s to 10,000, for latency.

For each it prints medians (and ranges) of deliveries/s, latency
p50/p99/p99.9/max, where every publish went, and the CPU each process took
during the bench command (sampled from /proc once a second: redis-server,
the nodes, the bench and its workers, other processes, and the niced
background work), with the ratio B/A of deliveries/s. Where publishes went
is counted by the nodes and Redis, not the bench: the nodes' publish
counter (taken), their engine failures (refused: `redis_busy` when a
Redis queue is full), and the SPUBLISH commands Redis's scripts made
(run); "lost" is what the publishes the nodes took and did not refuse
owed and the subscribers did not receive. Publishes the bench sent that no
node took are counted apart: its publishers close as soon as they have
sent, with the nodes' error replies unread, and such a close resets the
connection, which drops what the node had not read yet (the last 11 – 29
of a million in a saturated B run). Redis's own figures come from INFO
commandstats (reset before each B run).

    cargo build --release -p myriad
    python3 scripts/redis_throughput.py --runs 3

It writes every bench JSON report under target/benchmarks/redis-throughput/
and a summary.json there. Every process it starts dies with it (the bench
command is also bounded by --bench-timeout); nothing here changes sysctls.
"""

import argparse
import json
import os
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in scripts/ for the imports below
import benchmarks  # noqa: E402
from benchmarks import SCENARIOS, fmt, get  # noqa: E402
from cluster import (  # noqa: E402
    CLK_TCK, Children, catch_signals, free_port, metrics, processes, redis_info, resp, start_node, start_redis)

REPO = benchmarks.REPO

# 1,000,000 publishes at 200,000/s: A delivers them in about 10 s, B+ (whose
# queue holds them) in about 45 s at the rate measured here.
ONE_TO_ONE = [*SCENARIOS["one-to-one-saturating"]["bench"], "--count", "1000000"]
ONE_TO_ONE_10K = ["run", "--connections", "10000", "--rate", "10000", "--duration", "20s", "--publisher-conns", "4"]
DEEP_QUEUE = ["--redis-queue", "1048576"]

WORKLOADS = {
    "one-to-one": {"bench": ONE_TO_ONE, "per_publish": 1, "deep": True},
    "broadcast": {"bench": SCENARIOS["broadcast-saturating"]["bench"], "per_publish": 10000},
    "one-to-one-10k": {"bench": ONE_TO_ONE_10K, "per_publish": 1},
    "broadcast-5": {"bench": SCENARIOS["broadcast-moderate"]["bench"], "per_publish": 10000},
}

# The most connections one process of this run holds: the bench's subscriber
# worker and A's node each hold the 10,000 subscribers.
MOST_CONNECTIONS = 10_004


# ---- CPU sampling ----------------------------------------------------------


class Sampler(threading.Thread):
    """Reads, once a second, the CPU time of every process on the box, and
    sorts it: `groups` (name to pids: the nodes, redis-server), the bench
    with every process below it, this script, other processes at nice 0
    (other work on the box, and kernel threads), and niced ones (the box's
    background fuzzers). Per-process times are the kernel's own accounting;
    /proc/stat's totals are tick samples that disagree with them here."""

    MINE = ("redis", "nodes", "bench")

    def __init__(self, groups, bench_pid):
        super().__init__(daemon=True)
        self.owner = {pid: name for name, pids in groups.items() for pid in pids}
        self.bench_pid = bench_pid
        self.samples = []
        self.stopped = threading.Event()
        self.sample()

    def sample(self):
        procs = processes()
        children = {}
        for pid, (ppid, *_) in procs.items():
            children.setdefault(ppid, []).append(pid)
        bench, todo = set(), [self.bench_pid]
        while todo:
            pid = todo.pop()
            bench.add(pid)
            todo.extend(children.get(pid, []))
        ticks = {}
        for pid, (_, nice, t, _) in procs.items():
            if pid in self.owner:
                group = self.owner[pid]
            elif pid in bench:
                group = "bench"
            elif pid == os.getpid():
                group = "script"
            else:
                group = "niced" if nice > 0 else "others"
            ticks[(group, pid)] = t
        self.samples.append((time.monotonic(), ticks))

    def run(self):
        while not self.stopped.wait(1.0):
            self.sample()

    def finish(self):
        self.stopped.set()
        self.join()
        self.sample()
        return self.summary()

    def spent(self, group, upto):
        """CPU seconds `group` took from the first sample to sample `upto`.
        A process seen first later (started meanwhile) counts whole; one
        that ended counts up to its last sample."""
        first = self.samples[0][1]
        latest = {}
        for _, ticks in self.samples[: upto + 1]:
            for key, v in ticks.items():
                if key[0] == group:
                    latest[key] = v
        return sum(v - first.get(key, 0) for key, v in latest.items()) / CLK_TCK

    def summary(self):
        """Per group: cores used over the bench command (CPU seconds over
        wall seconds); for redis, nodes and bench also the busiest one-second
        interval."""
        wall = max(self.samples[-1][0] - self.samples[0][0], 1e-9)
        last = len(self.samples) - 1
        out = {"wall_s": wall}
        for group in (*self.MINE, "script", "others", "niced"):
            total = self.spent(group, last)
            out[group] = {"cpu_s": total, "cores": total / wall}
            if group in self.MINE:
                peak = 0.0
                for i in range(1, len(self.samples)):
                    dt = self.samples[i][0] - self.samples[i - 1][0]
                    if dt > 0.5:
                        peak = max(peak, (self.spent(group, i) - self.spent(group, i - 1)) / dt)
                out[group]["peak_cores"] = peak
        out["box"] = {"cores": sum(out[g]["cores"] for g in (*self.MINE, "script", "others", "niced"))}
        return out


# ---- one bench command -----------------------------------------------------


def tls_certificate(out):
    """A certificate authority and a certificate it signed for 127.0.0.1
    with its key, made with openssl in `out`: {"ca", "cert", "key",
    "ports": {plain port: TLS port}}. (rustls refuses a self-signed
    authority's certificate as the server's own.)"""
    path = lambda name: os.path.join(out, f"redis-tls-{name}")  # noqa: E731
    run = lambda *argv: subprocess.run(["openssl", *argv], check=True,  # noqa: E731
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-keyout", path("ca.key"), "-out", path("ca.pem"), "-days", "2",
        "-subj", "/CN=redis_throughput.py CA")
    run("req", *ec, "-keyout", path("server.key"), "-out", path("server.csr"), "-subj", "/CN=127.0.0.1")
    with open(path("ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", path("server.csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"),
        "-CAcreateserial", "-out", path("server.pem"), "-days", "2", "-extfile", path("ext.cnf"))
    return {"ca": path("ca.pem"), "cert": path("server.pem"), "key": path("server.key"), "ports": {}}


def run_bench(args, children, config, workload, redises, index):
    """Starts `config`'s nodes, runs `workload`'s bench command against them
    while sampling CPU, stops the nodes; returns the figures. `redises` is
    every (process, port) of Redis; B's nodes spread subjects over them all."""
    spec = WORKLOADS[workload]
    if config == "A":
        flags, count = [], 1
    else:
        flags = ["--engine", "redis"]
        for _, port in redises:
            resp(port, "FLUSHALL")
            resp(port, "CONFIG", "RESETSTAT")
            if args.tls:
                flags += ["--redis-url", f"rediss://127.0.0.1:{args.tls['ports'][port]}"]
            else:
                flags += ["--redis-url", f"redis://127.0.0.1:{port}"]
        if args.tls:
            flags += ["--redis-tls-ca", args.tls["ca"]]
        if config == "B+":
            flags += DEEP_QUEUE
        count = 2
    nodes, bench = [], None
    try:
        for _ in range(count):
            nodes.append(start_node(children, args.bin, [*flags, *args.node_arg]))
        json_path = os.path.join(args.out, f"{workload}-{config.replace('+', 'deep')}-{index}.json")
        cmd = [args.bin, "bench", "--progress", "off", "--json", json_path]
        for _, ws, admin in nodes:
            cmd += ["--url", f"ws://{ws}/ws", "--admin-url", f"http://{admin}"]
        cmd += spec["bench"]
        groups = {"nodes": [p.pid for p, _, _ in nodes]}
        if config != "A":
            groups["redis"] = [proc.pid for proc, _ in redises]
        bench = children.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sampler = Sampler(groups, bench.pid)
        sampler.start()
        try:
            out, err = bench.communicate(timeout=args.bench_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(bench.pid, signal.SIGKILL)  # its workers too: they hold its stderr
            out, err = bench.communicate()
            err += f"\n(killed after {args.bench_timeout} s)"
        cpu = sampler.finish()
        counters, per_node = {}, []
        for _, _, admin in nodes:
            per_node.append(metrics(admin))
            for name, n in per_node[-1].items():
                counters[name] = counters.get(name, 0) + n
    finally:
        # Interrupted (Ctrl-C, SIGTERM, an error): the bench goes first,
        # with its workers (its process group).
        if bench is not None:
            children.stop(bench, timeout=0)
        for proc, _, _ in nodes:
            children.stop(proc)
    if not os.path.exists(json_path):
        raise SystemExit(f"{workload} {config} run {index}: the bench wrote no report "
                         f"(exit {bench.returncode}):\n{out}\n{err}")
    with open(json_path) as f:
        doc = json.load(f)
    received = get(doc, "deliveries.received")
    published = get(doc, "totals.published")
    # Counted by the nodes' engines: an error reply goes only to a
    # connection still open, and the bench's publishers close right after
    # their last publish, so the bench (and the node's `publish_failed`
    # count) miss the refusals answered after that.
    engine_failures = {k.split('"')[1]: int(v) for k, v in counters.items()
                       if k.startswith("myriad_engine_failures_total{") and v}
    refused = max(sum(engine_failures.values()),
                  int(counters.get('myriad_errors_total{kind="publish_failed"}', 0)))
    taken = int(counters.get("myriad_publishes_total", 0))
    figures = {
        "deliveries/s": doc.get("messages_in_per_s"),
        "published": published,
        "taken by the nodes": taken,
        "received": received,
        "refused": refused,
        "refused, seen by the bench": get(doc, "totals.server_errors"),
        "lost": (taken - refused) * spec["per_publish"] - received,
        "never taken": published - taken,
        "p50": get(doc, "latency.p50_us"),
        "p99": get(doc, "latency.p99_us"),
        "p999": get(doc, "latency.p999_us"),
        "max": get(doc, "latency.max_us"),
        "node_cpu_us_per_delivery": get(doc, "server.cpu_us_per_message_out"),
        "node_rss_peak": get(doc, "server.rss_peak_bytes"),
        "engine_failures": engine_failures,
        # The nodes' own closes (slow consumers and the like); `abnormal` is
        # the bench leaving without a close frame at the end of every run.
        # Per node, in --url order (the bench's first publisher connection
        # goes to the first).
        "closed_by_reason": [{k.split('"')[1]: int(v) for k, v in c.items()
                              if k.startswith("myriad_connections_closed_total{") and v
                              and k.split('"')[1] not in ("normal", "abnormal")} for c in per_node],
        "cpu": cpu,
        "exit": bench.returncode,
        "command": shlex.join(cmd),
    }
    if config != "A":
        infos = [redis_info(port, "ALL") for _, port in redises]

        def calls(command):
            """Calls and µs of `command`, summed over the instances."""
            total = [0, 0]
            for info in infos:
                stat = dict(kv.split("=") for kv in info.get(f"cmdstat_{command}", "calls=0,usec=0").split(","))
                total[0] += int(stat["calls"])
                total[1] += int(stat["usec"])
            return tuple(total)

        # Every publish script that found listeners ends in one SPUBLISH
        # (commands run by scripts count in commandstats too).
        ran, _ = calls("spublish")
        evalsha = dict(zip(("calls", "usec"), calls("evalsha")))
        figures["ran in redis"] = ran
        figures["not run in redis"] = figures["taken by the nodes"] - refused - ran
        figures["redis_us_per_script"] = float(evalsha["usec"]) / max(int(evalsha["calls"]), 1)
        if spec["per_publish"] == 1:
            # A broadcast's few publishes would charge them the attaches.
            figures["redis_cpu_us_per_publish"] = get(cpu, "redis.cpu_s") * 1e6 / max(ran, 1)
        figures["redis_rss"] = sum(int(info.get("used_memory_rss", 0)) for info in infos)
    return figures


# ---- report ------------------------------------------------------------------

FIGURES = [
    ("deliveries/s", lambda r: r["deliveries/s"], "int"),
    ("publishes the nodes took", lambda r: r["taken by the nodes"], "int"),
    ("of which refused (engine failures)", lambda r: r["refused"], "int"),
    ("of which Redis ran", lambda r: r.get("ran in redis"), "int"),
    ("publishes sent, never taken (the bench's closing publishers reset their connections)",
     lambda r: r["never taken"], "int"),
    ("deliveries lost (owed by the publishes taken, not received)", lambda r: r["lost"], "int"),
    ("publishes neither refused nor run by Redis", lambda r: r.get("not run in redis"), "int"),
    ("delivery p50 (ms)", lambda r: r["p50"], "ms"),
    ("delivery p99 (ms)", lambda r: r["p99"], "ms"),
    ("delivery p99.9 (ms)", lambda r: r["p999"], "ms"),
    ("delivery max (ms)", lambda r: r["max"], "ms"),
    ("node CPU per delivery (µs)", lambda r: r["node_cpu_us_per_delivery"], "f2"),
    ("Redis: time per script call, publishes and attaches (µs, INFO commandstats)", lambda r: r.get("redis_us_per_script"), "f1"),
    ("Redis: CPU per publish run (µs)", lambda r: r.get("redis_cpu_us_per_publish"), "f1"),
    ("Redis RSS after the run (MiB)", lambda r: r.get("redis_rss"), "mib"),
    ("redis-server, cores (mean over the command)", lambda r: get(r, "cpu.redis.cores"), "f2"),
    ("redis-server, busiest second (cores)", lambda r: get(r, "cpu.redis.peak_cores"), "f2"),
    ("nodes, cores", lambda r: get(r, "cpu.nodes.cores"), "f2"),
    ("nodes, busiest second (cores)", lambda r: get(r, "cpu.nodes.peak_cores"), "f2"),
    ("bench, cores", lambda r: get(r, "cpu.bench.cores"), "f2"),
    ("other processes at nice 0 and kernel threads, cores", lambda r: get(r, "cpu.others.cores"), "f2"),
    ("niced processes (the background fuzzers), cores", lambda r: get(r, "cpu.niced.cores"), "f2"),
    ("every process, cores (of 2)", lambda r: get(r, "cpu.box.cores"), "f2"),
]


def cell(values, kind):
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    mid = statistics.median(present)
    if len(present) == 1 or min(present) == max(present):
        return fmt(mid, kind)
    return f"{fmt(mid, kind)} ({fmt(min(present), kind)} – {fmt(max(present), kind)})"


def report(results, runs):
    for workload, spec in WORKLOADS.items():
        configs = [c for c in ("A", "B", "B+") if results.get((workload, c))]
        if not configs:
            continue
        print(f"\n### {workload}\n")
        print(f"Bench: `myriad bench {shlex.join(spec['bench'])}`; runs: {runs}; "
              "median (range).\n")
        head = " | ".join(c for c in configs)
        print(f"| figure | {head} | B / A |" + (" B+ / A |" if "B+" in configs else ""))
        print("|---|" + "---|" * len(configs) + "---|" + ("---|" if "B+" in configs else ""))
        for label, pick, kind in FIGURES:
            cols = {c: [pick(r) for r in results[(workload, c)]] for c in configs}
            if all(v is None for vs in cols.values() for v in vs):
                continue
            row = [cell(cols[c], kind) for c in configs]
            ratios = []
            for c in ("B", "B+"):
                if c not in configs:
                    continue
                a = [v for v in cols["A"] if v is not None]
                b = [v for v in cols[c] if v is not None]
                ratio = "-"
                if label == "deliveries/s" and a and b and statistics.median(a):
                    ratio = f"**{statistics.median(b) / statistics.median(a):.2f}**"
                ratios.append(ratio)
            print(f"| {label} | " + " | ".join(row) + " | " + " | ".join(ratios) + " |")
        failures = {}
        for c in configs:
            for r in results[(workload, c)]:
                for kind, n in r["engine_failures"].items():
                    if n:
                        failures.setdefault(c, []).append(f"{kind} {n:,}")
        for c, items in failures.items():
            print(f"\n{c}: engine failures counted by the nodes, per run: {'; '.join(items)}")
        for c in configs:
            closes = [r["closed_by_reason"] for r in results[(workload, c)]]
            if any(any(node) for run in closes for node in run):
                print(f"\n{c}: connections each node closed (in --url order), per run: {closes}")
        exits = {c: [r["exit"] for r in results[(workload, c)]] for c in configs}
        if any(e for es in exits.values() for e in es):
            print(f"\nbench exit codes: {exits}")
    sys.stdout.flush()


# ---- main ------------------------------------------------------------------


def check_box():
    """The open-file budget this run needs, and the port range; exits
    saying what to change when it cannot fit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = MOST_CONNECTIONS + 512
    if soft < need:
        sys.exit(f"open-file limit {soft} < {need}: a node and the bench's subscriber worker each hold "
                 f"{MOST_CONNECTIONS:,} connections (ulimit -n {need} or more)")
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            autogroup = f.read().strip()
    except OSError:
        autogroup = "absent"
    print(f"# open files per process: {soft:,} (most connections in one process: {MOST_CONNECTIONS:,}); "
          f"ephemeral ports {low}-{high}; sched_autogroup_enabled {autogroup}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="*", help=f"which to run (default: all of {', '.join(WORKLOADS)})")
    parser.add_argument("--runs", type=int, default=3)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    parser.add_argument("--bin", default=os.path.join(target, "release", "myriad"))
    parser.add_argument("--out", default=os.path.join(REPO, "target", "benchmarks", "redis-throughput"))
    parser.add_argument("--node-arg", action="append", default=[], help="extra flag for every node (repeatable)")
    parser.add_argument("--bench-timeout", type=float, default=300.0,
                        help="seconds one bench command may take before it is killed")
    parser.add_argument("--no-deep", action="store_true", help="skip B+ (the deep Redis queue)")
    parser.add_argument("--redis", type=int, default=1,
                        help="Redis instances; B's nodes spread subjects over all of them (default 1)")
    parser.add_argument("--tls", action="store_true",
                        help="B's nodes reach Redis over TLS (rediss://, with a certificate authority and a "
                             "certificate made for the run); Redis's plain port stays for this script's own "
                             "questions")
    args = parser.parse_args()
    names = args.workloads or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        sys.exit(f"unknown workload(s): {', '.join(unknown)}")
    check_box()
    os.makedirs(args.out, exist_ok=True)
    catch_signals()
    children = Children()
    args.tls = tls_certificate(args.out) if args.tls else None
    redises = []
    for i in range(args.redis):
        extra = ()
        if args.tls:
            tls_port = free_port()
            extra = ("--tls-port", str(tls_port), "--tls-cert-file", args.tls["cert"],
                     "--tls-key-file", args.tls["key"], "--tls-ca-cert-file", args.tls["ca"],
                     "--tls-auth-clients", "no")
        proc, port = start_redis(children, args.out, name=f"redis-server-{i}", extra=extra)
        if args.tls:
            args.tls["ports"][port] = tls_port
        redises.append((proc, port))
    ports = ", ".join(f"127.0.0.1:{port}" for _, port in redises)
    print(f"# redis-server {redis_info(redises[0][1]).get('redis_version')} on {ports}; "
          f"myriad {args.bin}", file=sys.stderr)
    results = {}
    try:
        for i in range(args.runs):
            for workload in names:
                configs = ["A", "B"]
                if WORKLOADS[workload].get("deep") and not args.no_deep:
                    configs.append("B+")
                if i % 2:
                    configs.reverse()
                for config in configs:
                    started = time.time()
                    r = run_bench(args, children, config, workload, redises, i)
                    results.setdefault((workload, config), []).append(r)
                    print(f"# run {i + 1}/{args.runs} {workload} {config}: {r['deliveries/s'] or 0:,.0f}/s, "
                          f"refused {r['refused']:,}, lost {r['lost']:,}, p99 {fmt(r['p99'], 'ms')} ms, "
                          f"redis {get(r, 'cpu.redis.cores') or 0:.2f} / nodes {get(r, 'cpu.nodes.cores'):.2f} / "
                          f"bench {get(r, 'cpu.bench.cores'):.2f} / others {get(r, 'cpu.others.cores'):.2f} / "
                          f"niced {get(r, 'cpu.niced.cores'):.2f} cores; "
                          f"{time.time() - started:.0f} s", file=sys.stderr)
    finally:
        children.stop_all()
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump({f"{w} {c}": rs for (w, c), rs in results.items()}, f, indent=1)
    report(results, args.runs)


if __name__ == "__main__":
    main()
