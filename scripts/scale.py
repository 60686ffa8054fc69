#!/usr/bin/env python3
"""The scale proof of issue 11 in one command: Redis and N `myriad` nodes
on this host, `myriad bench` driving all of them, and a report.

    python3 scripts/scale.py c10m      [--connections 1000000] [--duration 10m] [--period 60s] [--publishers N]
    python3 scripts/scale.py broadcast [--connections 1000000] [--count 1]
    python3 scripts/scale.py churn     [--connections 10000] [--nodes 4] [--duration 60s] [--kill-after 20s]
    python3 scripts/scale.py smoke     # c10m's shape at 2,000 over 2 nodes for 10 s (the test suite's)
    python3 scripts/scale.py c10m --check   # the box check only

Scenarios (the targets of issue 11):

  c10m       every subscriber on its own subject, each subject published
             once per --period (512 B, `bench run --order sequential`, so
             event n goes to subject n mod N): N / period publishes/s
             through the cluster for --duration. Target: 0 lost, p99 <= 25 ms.
  broadcast  every subscriber on ONE subject; --count publishes (default 1),
             one every --interval. Reports publish-to-last-delivery (target
             <= 6 s, 0 lost) and core-seconds per million deliveries: the CPU
             of every node, Redis and bench process (/proc utime + stime)
             from the second before the first publish to the last second
             with deliveries, over the deliveries.
  churn      `bench churn` across the nodes (default 4): subscribers over
             N/10 subjects reconnect (N/5 a second in all), each time to the
             next node, resuming with `since` from Redis history, while N/2
             publishes/s go on. Target: 0 lost, 0 duplicated. With
             --kill-after D a node holding no publisher (the last such) is
             killed (SIGKILL) D after the subscribers are set up: its
             subscribers fail over to the next node and must lose nothing
             either. Publishers default to one with --kill-after.
  smoke      c10m at 2,000 subscribers over 2 nodes for 10 s, each subject
             once every 5 s: what scripts/scale_smoke.py runs in the tests.

It starts --redis instances of `redis-server` (no persistence) on free
ports of 127.0.0.1 and --nodes nodes (`--engine redis`, one --redis-url per
instance), node i listening on 127.0.1.(i+1) so every node is a destination
address of its own; the bench gets every node's --url and --admin-url and
spreads its connections over them round robin (its --publishers too: one
per node unless told, else one on each of N nodes), and
picks its own 127.0.0.x source addresses. Nodes default to
ceil(connections / (open-file limit - 500)): the rest of each node's files
are its own, its Redis links and its admin listener's.

Before starting anything it checks the box against what the run needs and
prints a verdict, every row of it `myriad doctor --json`'s: one node's
limits (open files, fs.nr_open, the accept queues, send buffers, paging)
for the connections each node will hold, and the box's shared ones
(memory, tcp_mem, ports, fs.file-max, conntrack) for the whole run, since
nodes, bench and Redis share the box (--host-connections, --loopback and
the rest, from the plan); a run that cannot fit is refused with the
setting to change. It changes no setting of the host's, except that
--netns (root) sets net.ipv4.tcp_child_ehash_entries while it makes a
network namespace for the run, with a TCP connection table sized for
millions of sockets, and puts it back at once (enter_netns in cluster.py). Nodes and bench
share this script's session, so the scheduler shares the CPU between them
by thread; Redis gets a favoured session of its own (cluster.py).

Written into --out (default target/scale/<scenario>): bench.json and
bench.html (the bench's reports), bench.log, scale.json (everything below,
with the commands) and scale.html, redis logs. Per run: each node's, each
bench process's and each Redis's peak RSS, Redis's INFO memory,
/proc/net/sockstat before, at the peak and after, the bench's verdict,
lost and duplicated counts, latency percentiles, set-up time, what the
nodes counted (publishes taken and refused, slow-consumer closes), and the
CPU of each group. Exit status: 0 when every count holds (nothing lost or
duplicated, every subscriber set up, the bench's verdict passed, no
process left behind), 1 otherwise; the latency targets are reported, not
enforced. Every process started here is stopped on the way out, on errors
and Ctrl-C too, and the report lists any left behind.
"""

import argparse
import html
import json
import math
import os
import resource
import shlex
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in scripts/ for the import below
from cluster import (  # noqa: E402
    CLK_TCK, Children, catch_signals, descendants, enter_netns, favour, metrics, processes, redis_info,
    sockstat, start_node, start_redis)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB, GIB = 1 << 20, 1 << 30

# Files a node keeps besides client connections: its own (fds.rs: 32, 5 per
# worker, 64 refusals, 128 admin connections), its Redis links, slack.
NODE_RESERVED_FDS = 500
# The bench's worker keeps 100 (crates/bench/src/util/plan.rs).
BENCH_RESERVED_FDS = 100
# Redis's files and the script's own, besides connections.
OTHER_FDS = 1000
# Source addresses the bench spreads its connections over at most
# (127.0.0.1-254: crates/bench/src/coordinator/groups.rs).
BENCH_SOURCES = 254

# Userland memory per connection, for the plan: measured with this script
# at medium size (docs/benchmarks.md, "The scale proof"), rounded up. The
# kernel's share and the nodes' first 512 B a connection are the doctor's
# to count (`myriad doctor`'s memory row); the rest is passed to it as
# --extra-memory.
NODE_PER_CONN = 1200
DOCTOR_NODE_PER_CONN = 512
BENCH_PER_CONN = 400
NODE_BASE = 16 * MIB
BENCH_WORKER_BASE = 8 * MIB
REDIS_BASE = 16 * MIB
# Redis per subject with history (its hash, the list of kept messages,
# index entries): 2.1 KB measured at 100,000 subjects holding two 512-byte
# messages each. Past the history byte budget (256 MiB per instance by
# default) Redis evicts, so this overstates a long run: an upper bound.
REDIS_PER_SUBJECT = 2200
# TCP bytes queued per subscriber at the peak, which tcp_mem counts (the
# doctor's --queued-bytes). A broadcast puts one message in every
# subscriber's socket at once (a small loopback skb's truesize is ~2.3 KB;
# the medium runs peaked at 1.4 KB); the c10m shape peaked at 0.26 KB a
# socket, churn at 5.4 KB a subscriber.
TCP_QUEUED = {"broadcast": 2304, "c10m": 512, "smoke": 512, "churn": 8192}
# The userland estimate's margin: the figures above come from medium-size
# runs, not from a million.
SLACK = 1 * GIB

SCENARIOS = {
    "c10m": {"connections": 1_000_000, "duration": "10m"},
    "broadcast": {"connections": 1_000_000, "duration": "60s"},
    "churn": {"connections": 10_000, "duration": "60s", "nodes": 4},
    "smoke": {"connections": 2_000, "duration": "10s", "nodes": 2, "period": "5s"},
}


def secs(text):
    """`10m`, `60s`, `500ms`, `1.5h` or a number of seconds."""
    text = str(text).strip()
    for unit, scale in (("ms", 1e-3), ("s", 1), ("m", 60), ("h", 3600)):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "", 1).isdigit():
            return float(text[: -len(unit)]) * scale
    return float(text)


# ---- the plan and the box check ---------------------------------------------


def plan(args):
    """What the run will hold: connections, processes, and what the doctor
    is told of it (the run's share of this host's files and memory)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    per_node = max(soft - NODE_RESERVED_FDS, 1)
    conns = args.connections
    nodes = args.nodes or max(math.ceil(conns / per_node), 1)
    # A node killed under the run must not hold a publisher (bench
    # publishers do not fail over), so they default to one.
    publishers = 0 if args.scenario == "broadcast" else (args.publishers or (1 if args.kill_after else nodes))
    total = conns + publishers + (1 if args.scenario == "broadcast" else 0)
    bench_procs = math.ceil(conns / max(soft - BENCH_RESERVED_FDS, 1)) + 1
    subjects = {"c10m": conns, "smoke": conns, "broadcast": 1, "churn": max(conns // 10, 1)}[args.scenario]
    # The doctor counts the first node's own files and its per-connection
    # 512 B; everything else the run puts on the box is passed to it.
    extra_memory = (conns * (NODE_PER_CONN - DOCTOR_NODE_PER_CONN + BENCH_PER_CONN) + nodes * NODE_BASE
                    + bench_procs * BENCH_WORKER_BASE + args.redis * REDIS_BASE
                    + subjects * REDIS_PER_SUBJECT + SLACK)
    return {
        "open_files_per_process": soft,
        "connections": conns,
        "client_connections": total,
        "nodes": nodes,
        "publishers": publishers,
        "connections_per_node": math.ceil(total / nodes),
        "bench_processes": bench_procs,
        "redis_instances": args.redis,
        "subjects": subjects,
        "extra_memory_bytes": extra_memory,
        "extra_files": (nodes - 1) * NODE_RESERVED_FDS + bench_procs * BENCH_RESERVED_FDS + OTHER_FDS,
        "queued_bytes_per_connection": TCP_QUEUED[args.scenario],
    }


def doctor(myriad, p, node_args):
    """`myriad doctor --json`'s rows for the run: one node's own limits for
    the connections each node holds, and the box's shared ones (files,
    tcp_mem, memory, ports, conntrack) for the whole run on this host,
    clients and all."""
    cmd = [myriad, "doctor", "--json", "--connections", str(p["connections_per_node"]),
           "--host-connections", str(p["client_connections"]), "--loopback",
           "--sources", str(BENCH_SOURCES), "--extra-files", str(p["extra_files"]),
           "--extra-memory", str(p["extra_memory_bytes"]),
           "--queued-bytes", str(p["queued_bytes_per_connection"]), "--memory-available", *node_args]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if out.returncode not in (0, 1):
        sys.exit(f"scale.py: myriad doctor exited {out.returncode}")
    return json.loads(out.stdout)["checks"]


def check_box(p, myriad, node_args):
    """[(level, what, detail)] with level ok, warn or refuse: the doctor's
    verdicts (fail is refuse), each with its value and need, and its fix
    when not ok. Only the plan's arithmetic is this script's."""
    out = []
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    for row in doctor(myriad, p, node_args):
        level = {"ok": "ok", "warn": "warn", "fail": "refuse"}[row["verdict"]]
        detail = f"{row['value']}; needs {row['needs']}"
        if level != "ok":
            detail += f": {row['fix']}"
        if level == "refuse" and row["name"] == "open files":
            need = math.ceil(p["client_connections"] / max(soft - NODE_RESERVED_FDS, 1))
            detail += f"; or use --nodes {need} or more"
        out.append({"level": level, "what": row["name"], "detail": detail})
    return out


def print_verdict(p, items):
    print(f"# plan: {p['connections']:,} subscribers ({p['client_connections']:,} client connections) "
          f"over {p['nodes']} nodes and {p['redis_instances']} Redis; {p['bench_processes']} bench processes; "
          f"{p['subjects']:,} subjects", file=sys.stderr)
    for item in items:
        print(f"# [{item['level']}] {item['what']}: {item['detail']}", file=sys.stderr)
    refused = [i for i in items if i["level"] == "refuse"]
    print("# box check: " + ("CANNOT FIT: change what [refuse] says" if refused else "fits"), file=sys.stderr)
    return not refused


# ---- sampling ------------------------------------------------------------------


class Sampler(threading.Thread):
    """Every `every` seconds: the CPU ticks and RSS of the nodes, the Redis
    instances and the bench with everything below it, /proc/net/sockstat,
    and each Redis's INFO memory."""

    def __init__(self, children, nodes, redis, every):
        super().__init__(daemon=True)
        self.children = children
        self.groups = {"nodes": [n["pid"] for n in nodes], "redis": [r["pid"] for r in redis]}
        self.redis = redis
        self.bench_pid = None
        self.every = every
        self.samples = []  # (unix time, {pid: (group, ticks, rss)}, sockstat)
        self.redis_rss = {r["port"]: 0 for r in redis}
        self.stopped = threading.Event()

    def sample(self):
        procs = processes()
        self.children.group_pids()
        mine = {pid: g for g, pids in self.groups.items() for pid in pids}
        if self.bench_pid:
            for pid in descendants(procs, self.bench_pid):
                mine[pid] = "bench"
        now = {pid: (g, procs[pid][2], procs[pid][3]) for pid, g in mine.items() if pid in procs}
        self.samples.append((time.time(), now, sockstat()))
        for r in self.redis:
            try:
                rss = int(redis_info(r["port"], "memory")["used_memory_rss"])
                self.redis_rss[r["port"]] = max(self.redis_rss[r["port"]], rss)
            except (OSError, RuntimeError, KeyError, ValueError):
                pass

    def run(self):
        while not self.stopped.wait(self.every):
            self.sample()

    def finish(self):
        self.stopped.set()
        self.join()
        self.sample()

    def peak_rss(self):
        """{pid: (group, peak rss)}."""
        out = {}
        for _, procs, _ in self.samples:
            for pid, (g, _, rss) in procs.items():
                out[pid] = (g, max(rss, out.get(pid, (g, 0))[1]))
        return out

    def cpu(self, start=None, end=None):
        """CPU seconds per group between the last sample at or before
        `start` and the first at or after `end` (default: all of them). A
        process first seen later counts from 0; one that ended counts up to
        its last sample."""
        samples = sorted(self.samples, key=lambda s: s[0])
        if start is not None:
            i = max([k for k, s in enumerate(samples) if s[0] <= start] or [0])
            j = min([k for k, s in enumerate(samples) if s[0] >= end] or [len(samples) - 1])
            samples = samples[i: j + 1]
        if len(samples) < 2:
            return {"wall_s": 0.0}
        first, last = samples[0][1], {}
        for _, procs, _ in samples:
            last.update(procs)
        out = {"wall_s": samples[-1][0] - samples[0][0]}
        for pid, (g, ticks, _) in last.items():
            before = first.get(pid, (g, 0, 0))[1]
            out[g] = out.get(g, 0.0) + (ticks - before) / CLK_TCK
        return out

    def timeline(self):
        """Per sample: seconds since the first, TCP sockets and their
        queued memory, and each group's RSS and CPU seconds so far (of the
        processes alive then)."""
        if not self.samples:
            return []
        t0 = self.samples[0][0]
        out = []
        for t, procs, ss in self.samples:
            point = {"t": round(t - t0, 1), "tcp_inuse": ss["inuse"], "tcp_mem_bytes": ss["mem_bytes"]}
            for g in ("nodes", "redis", "bench"):
                point[f"{g}_rss"] = sum(rss for grp, _, rss in procs.values() if grp == g)
                point[f"{g}_cpu_s"] = round(sum(t for grp, t, _ in procs.values() if grp == g) / CLK_TCK, 2)
            out.append(point)
        return out

    def sockstat_peak(self):
        if not self.samples:
            return None
        return max((s for _, _, s in self.samples), key=lambda s: (s["alloc"], s["mem_pages"]))

    def sockstat_mem_peak(self):
        if not self.samples:
            return None
        return max((s for _, _, s in self.samples), key=lambda s: s["mem_pages"])


# ---- one run ---------------------------------------------------------------------


def labelled(counters, prefix):
    """{label value: count} of the non-zero counters `prefix{...}`."""
    out = {}
    for k, v in counters.items():
        if k.startswith(prefix + "{") and v:
            label = k.split('"')[1]
            out[label] = out.get(label, 0) + int(v)
    return out


def bench_args(args, p):
    """The workload's arguments."""
    n = args.connections
    if args.scenario in ("c10m", "smoke"):
        period = secs(args.period)
        rate = n / period
        return ["run", "--connections", str(n), "--rate", f"{rate:.6f}", "--duration", args.duration,
                "--order", "sequential", "--size", "512", "--publisher-conns", str(p["publishers"]),
                "--drain", args.drain]
    if args.scenario == "broadcast":
        return ["broadcast", "--subscribers", str(n), "--count", str(args.count),
                "--rate", f"{1 / secs(args.interval):.6f}", "--size", "512", "--drain", args.duration]
    return ["churn", "--subscribers", str(n), "--subjects", str(max(n // 10, 1)),
            "--reconnect-rate", str(max(n // 5, 1)), "--rate", str(max(n // 2, 1)),
            "--duration", args.duration, "--size", "512", "--publisher-conns", str(p["publishers"]),
            "--drain", args.drain]


def kill_victim(connections, publishers, nodes):
    """The last node that holds no publisher: the bench numbers its
    publishing connections after its subscribers and sends connection i to
    node i mod nodes (`route` in crates/bench/src/util/addr.rs)."""
    holding = {(connections + i) % nodes for i in range(publishers)}
    return max(set(range(nodes)) - holding)


def write_pids(path, children):
    with open(path + ".tmp", "w") as f:
        json.dump(sorted(children.seen), f)
    os.replace(path + ".tmp", path)


def run(args, p, box, children):
    out = args.out
    os.makedirs(out, exist_ok=True)
    # Nothing from an earlier run may pass for this one's.
    for name in ("scale.json", "scale.html", "bench.json", "bench.html", "bench.log", "pids.json"):
        if os.path.exists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    pids_path = os.path.join(out, "pids.json")
    result = {
        "scenario": args.scenario,
        "command": shlex.join([sys.executable, *sys.argv]),
        "plan": p,
        "box_check": box,
        "started_unix": time.time(),
    }
    redis, nodes, sampler, logs = [], [], None, []
    bench = None
    try:
        t0 = time.time()
        for i in range(args.redis):
            proc, port = start_redis(children, out, name=f"redis-{i}")
            redis.append({"pid": proc.pid, "port": port, "favoured": favour(proc),
                          "version": redis_info(port).get("redis_version")})
        flags = ["--engine", "redis", *[a for r in redis for a in ("--redis-url", f"redis://127.0.0.1:{r['port']}")],
                 *args.node_arg]
        node_log = open(os.path.join(out, "nodes.log"), "w")
        logs.append(node_log)
        for i in range(p["nodes"]):
            host = f"127.0.1.{i + 1}"
            proc, ws, admin = start_node(children, args.myriad, flags, listen=f"{host}:0", log=node_log)
            nodes.append({"pid": proc.pid, "ws": ws, "admin": admin, "proc": proc})
            write_pids(pids_path, children)
        result["start_s"] = time.time() - t0
        result["node_flags"] = flags
        json_path, html_path = os.path.join(out, "bench.json"), os.path.join(out, "bench.html")
        # Set-up of a million connections on two cores keeps up to 51,000
        # (the bench's in-flight bound) waiting at once, at a few thousand
        # handshakes a second: far past the bench's default 5 s bound on
        # connect + handshake. A million-run with the default (and another
        # bench on the box) counted 860,000 set-up errors in its first
        # 157 s; with 60 s all 1,000,000 were set up (docs/benchmarks.md).
        cmd = [args.myriad, "bench", "--progress", "plain", "--progress-every", "10s",
               "--connect-timeout", "60s", "--json", json_path, "--html", html_path]
        for n in nodes:
            cmd += ["--url", f"ws://{n['ws']}/ws", "--admin-url", f"http://{n['admin']}"]
        cmd += bench_args(args, p) + args.bench_arg
        result["bench_command"] = shlex.join(cmd)
        sampler = Sampler(children, nodes, redis, 0.5 if args.scenario == "broadcast" else 1.0)
        sampler.sample()
        result["sockstat_before"] = sampler.samples[-1][2]
        print(f"# {len(redis)} redis-server, {len(nodes)} nodes up in {result['start_s']:.1f} s; "
              f"bench: {result['bench_command']}", file=sys.stderr)
        log = open(os.path.join(out, "bench.log"), "w")
        logs.append(log)
        bench = children.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sampler.bench_pid = bench.pid
        sampler.start()

        def relay():
            for line in bench.stdout:
                if "subscribers set up" in line and "setup_done_unix" not in result:
                    # Publishing starts now: a broadcast's CPU is counted
                    # from this sample on (see broadcast_figures).
                    sampler.sample()
                    result["setup_done_unix"] = sampler.samples[-1][0]
                log.write(line)
                log.flush()
                sys.stderr.write(f"  | {line}")
        relayer = threading.Thread(target=relay, daemon=True)
        relayer.start()
        deadline = time.time() + args.timeout
        while bench.poll() is None:
            write_pids(pids_path, children)
            setup_done = result.get("setup_done_unix")
            if args.kill_after and "killed" not in result and setup_done \
                    and time.time() >= setup_done + secs(args.kill_after):
                victim = nodes[kill_victim(args.connections, p["publishers"], len(nodes))]
                victim["proc"].kill()
                victim["proc"].wait()
                result["killed"] = {"pid": victim["pid"], "ws": victim["ws"],
                                    "after_setup_s": round(time.time() - setup_done, 1)}
                print(f"# killed node {victim['ws']} (pid {victim['pid']}) with SIGKILL", file=sys.stderr)
            if time.time() > deadline:
                children.stop(bench, timeout=5)
                result["bench_timed_out"] = args.timeout
                break
            time.sleep(1)
        relayer.join(timeout=10)
        result["bench_exit"] = bench.returncode
        sampler.finish()
        per_node = []
        for n in nodes:
            if n["pid"] == (result.get("killed") or {}).get("pid"):
                per_node.append({"killed": True})
                continue
            try:
                per_node.append(metrics(n["admin"]))
            except OSError as e:
                per_node.append({"error": str(e)})
        result["redis_info"] = [redis_info(r["port"], "memory") for r in redis]
        result["redis_info_keyspace"] = [redis_info(r["port"], "keyspace") for r in redis]
        result["redis_info_clients"] = [redis_info(r["port"], "clients") for r in redis]
        result["bench"] = load(json_path)
        result["node_metrics"] = per_node
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.finish()
        children.stop_all()
        write_pids(pids_path, children)
        for f in logs:
            f.close()
    time.sleep(1)  # the kernel frees closed sockets' memory a moment later
    result["sockstat_after"] = sockstat()
    result["left_behind"] = children.left_behind()
    result["pids"] = sorted(children.seen)
    result["nodes"] = [{k: v for k, v in n.items() if k != "proc"} for n in nodes]
    result["redis"] = redis
    result["finished_unix"] = time.time()
    figures(result, sampler, args)
    # The bench's own report stays in its file.
    result["bench_json"] = json_path
    del result["bench"]
    return result


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def get(doc, path):
    for part in path.split("."):
        if doc is None:
            return None
        doc = doc.get(part)
    return doc


def figures(result, sampler, args):
    """The combined figures and the verdict, into `result`."""
    doc = result.get("bench") or {}
    f = {}
    d = doc.get("deliveries") or {}
    f["published"] = d.get("published")
    f["expected"] = d.get("expected")
    f["received"] = d.get("received")
    f["replay_exact"] = d.get("exact")
    if d.get("expected") is not None:
        f["lost"] = max(d["expected"] - d["received"], 0)
        # `run` and `broadcast` count deliveries, not which ones: a
        # duplicate would hide a loss. More received than owed shows here.
        f["extra"] = max(d["received"] - d["expected"], 0)
    churn = doc.get("churn")
    if churn:
        f["lost"] = churn["lost"]
        f["duplicated"] = churn["duplicates"]
        f["churn"] = churn
    # Churn's subscribes include every reconnect's; its own report says
    # whether each was answered.
    subscribed = None if churn else get(doc, "totals.subscribed")
    f["subscribed"] = subscribed
    f["failures"] = doc.get("failures")
    f["setup_s"] = doc.get("setup_secs")
    f["latency_us"] = doc.get("latency")
    f["publish_lag_us"] = doc.get("publish_lag")
    f["messages_in_per_s"] = doc.get("messages_in_per_s")
    f["published_per_s"] = doc.get("published_per_s")
    counters = {}
    for c in result.get("node_metrics") or []:
        for k, v in c.items():
            if isinstance(v, float):
                counters[k] = counters.get(k, 0) + v
    f["nodes_took_publishes"] = int(counters.get("myriad_publishes_total", 0))
    f["nodes_engine_failures"] = labelled(counters, "myriad_engine_failures_total")
    f["nodes_closed"] = {k: v for k, v in labelled(counters, "myriad_connections_closed_total").items()
                         if k not in ("normal", "abnormal")}
    if sampler is not None:
        peak = sampler.peak_rss()
        f["rss"] = {
            "nodes": [{"pid": n["pid"], "ws": n["ws"], "peak_rss": peak.get(n["pid"], (0, 0))[1]}
                      for n in result.get("nodes", [])],
            "bench": sorted(({"pid": pid, "peak_rss": rss} for pid, (g, rss) in peak.items() if g == "bench"),
                            key=lambda r: r["pid"]),
            "redis": [{"pid": r["pid"], "port": r["port"], "peak_rss": peak.get(r["pid"], (0, 0))[1],
                       "used_memory_rss_peak": sampler.redis_rss.get(r["port"])}
                      for r in result.get("redis", [])],
        }
        for k in ("nodes", "bench", "redis"):
            f["rss"][f"{k}_total"] = sum(r["peak_rss"] for r in f["rss"][k])
        f["sockstat_peak"] = sampler.sockstat_peak()
        f["sockstat_mem_peak"] = sampler.sockstat_mem_peak()
        f["cpu_s"] = sampler.cpu()
        result["timeline"] = sampler.timeline()
        if args.scenario == "broadcast":
            f["broadcast"] = broadcast_figures(doc, sampler, result.get("setup_done_unix"))
        elif args.scenario in ("c10m", "smoke") and f.get("published"):
            f["publishing"] = publishing_figures(doc, sampler, result.get("setup_done_unix"), f["published"])
    result["figures"] = f
    problems = []
    if result.get("bench") is None:
        problems.append("the bench wrote no report")
    if result.get("bench_exit") not in (0, None):
        problems.append(f"the bench exited {result.get('bench_exit')}")
    if result.get("bench_timed_out"):
        problems.append(f"the bench was stopped after {result['bench_timed_out']} s")
    if f.get("lost") is None:
        problems.append("lost deliveries not counted (too many subjects, or no report)")
    elif f["lost"]:
        problems.append(f"{f['lost']:,} lost")
    if f.get("duplicated"):
        problems.append(f"{f['duplicated']:,} duplicated")
    if f.get("extra"):
        problems.append(f"{f['extra']:,} deliveries more than owed")
    if f.get("replay_exact") is False:
        problems.append("the expected deliveries are not exact (a publisher connection was lost, "
                        "or not every subscriber was set up before publishing)")
    if subscribed is not None and subscribed < args.connections:
        problems.append(f"{subscribed:,} of {args.connections:,} subscribers set up")
    if result["left_behind"]:
        problems.append(f"processes left behind: {result['left_behind']}")
    if args.kill_after:
        if "killed" not in result:
            problems.append("the node was not killed: the run ended first")
        elif churn and not churn.get("failovers"):
            problems.append("no subscriber failed over from the killed node")
        elif churn and churn.get("failed_over") != churn.get("failovers"):
            problems.append(f"{churn['failovers'] - churn['failed_over']:,} subscribers did not fail over")
    targets = {}
    lat = f.get("latency_us") or {}
    if args.scenario == "c10m" and lat:
        targets["p99 <= 25 ms"] = lat.get("p99_us", 0) <= 25_000
    if args.scenario == "broadcast" and (f.get("broadcast") or {}).get("publish_to_last_us") is not None:
        targets["publish to last delivery <= 6 s"] = f["broadcast"]["publish_to_last_us"] <= 6_000_000
    result["verdict"] = {"pass": not problems, "problems": problems, "targets": targets}


def broadcast_figures(doc, sampler, setup_done):
    """Publish-to-last-delivery and core-seconds per million deliveries."""
    b = doc.get("broadcast") or {}
    until_last = b.get("until_last") or {}
    out = {"publish_to_last_us": until_last.get("max_us"), "until_last_us": until_last,
           "complete": b.get("complete"), "messages": b.get("messages"), "subscribers": b.get("subscribers")}
    started = doc.get("started_unix")
    timeline = doc.get("timeline") or []
    pub = [s["t"] for s in timeline if s.get("published_per_s")]
    rx = [s["t"] for s in timeline if s.get("messages_in_per_s")]
    received = get(doc, "deliveries.received") or 0
    if started and received:
        # The bench says its subscribers are set up just before it starts
        # its publisher: the window opens there. Its timeline's first
        # sample with a publish (a sample at t covers the second before it)
        # can come seconds later on a busy box (a million-subscriber run's
        # did, after the nodes had done most of their writing), so that is
        # only the fallback. The window closes with the last sample with
        # deliveries, or with the run when it was shorter than a tick.
        start = setup_done or started + (pub[0] - 1.0 if pub else doc.get("setup_secs") or 0.0)
        end = started + (rx[-1] if rx else doc.get("duration_secs") or 0.0)
        cpu = sampler.cpu(start, end)
        total = sum(v for k, v in cpu.items() if k != "wall_s")
        out["window_s"] = cpu["wall_s"]
        out["cpu_s"] = cpu
        out["core_seconds_per_million"] = total / (received / 1e6)
    return out


def publishing_figures(doc, sampler, setup_done, published):
    """Each group's CPU per publish while the publisher ran: the run's own
    CPU includes the set-up, which dominates a short run's."""
    started = doc.get("started_unix")
    pub = [s["t"] for s in doc.get("timeline") or [] if s.get("published_per_s")]
    if not (started and setup_done and pub):
        return None
    cpu = sampler.cpu(setup_done, started + pub[-1])
    if not cpu["wall_s"]:
        return None
    return {"window_s": cpu["wall_s"], "cpu_s": cpu,
            "us_per_publish": {g: cpu.get(g, 0) / published * 1e6 for g in ("nodes", "redis", "bench")}}


# ---- report ------------------------------------------------------------------------


def mib(v):
    return "-" if v is None else f"{v / MIB:,.1f}"


def ms(v):
    return "-" if v is None else f"{v / 1000:,.2f}"


def summary_rows(result):
    """(label, value) rows, for the terminal and the HTML page."""
    f = result["figures"]
    lat = f.get("latency_us") or {}
    rows = [
        ("verdict", "PASS" if result["verdict"]["pass"] else "FAIL: " + "; ".join(result["verdict"]["problems"])),
        *((f"target: {k}", "met" if v else "MISSED") for k, v in result["verdict"]["targets"].items()),
        ("subscribers set up", "see the churn report" if f.get("churn") else
         f"{f.get('subscribed') or 0:,} of {result['plan']['connections']:,}"),
        ("set-up time (s)", "-" if f.get("setup_s") is None else f"{f['setup_s']:.1f}"),
        ("published / expected / received",
         f"{f.get('published') or 0:,} / {f.get('expected') or 0:,} / {f.get('received') or 0:,}"),
        ("lost", f"{f['lost']:,}" if f.get("lost") is not None else "not counted"),
        ("duplicated", f"{f['duplicated']:,}" if "duplicated" in f else
         f"not counted by this workload (received beyond owed: {f.get('extra', 0):,})"),
        ("latency p50 / p99 / p99.9 / max (ms)",
         " / ".join(ms(lat.get(k)) for k in ("p50_us", "p99_us", "p999_us", "max_us"))),
        ("deliveries/s", f"{f.get('messages_in_per_s') or 0:,.0f}"),
        ("publishes the nodes took; engine failures", f"{f['nodes_took_publishes']:,}; {f['nodes_engine_failures'] or 0}"),
        ("closes by the nodes (not normal)", str(f["nodes_closed"] or 0)),
        ("network namespace", f"own, {result['netns']['ehash_buckets']:,} TCP hash buckets"
         if result.get("netns") else "the host's"),
    ]
    killed = result.get("killed")
    if killed:
        c = f.get("churn") or {}
        rows.append(("node killed (SIGKILL); subscribers failed over / lost with it",
                     f"{killed['ws']} {killed['after_setup_s']} s after set-up; "
                     f"{c.get('failed_over', 0):,} / {c.get('failovers', 0):,}"))
    b = f.get("broadcast")
    if b:
        rows += [
            ("broadcast: publish to last delivery (ms)", ms(b.get("publish_to_last_us"))),
            ("broadcast: core-seconds per million deliveries",
             "-" if b.get("core_seconds_per_million") is None else f"{b['core_seconds_per_million']:.2f}"),
            ("broadcast: CPU s in its window (nodes / redis / bench), window s",
             " / ".join(f"{(b.get('cpu_s') or {}).get(g, 0):.2f}" for g in ("nodes", "redis", "bench"))
             + f", {(b.get('cpu_s') or {}).get('wall_s', 0):.1f}"),
        ]
    p = f.get("publishing")
    if p:
        rows.append(("CPU while publishing: µs per publish (nodes / redis / bench), window s",
                     " / ".join(f"{p['us_per_publish'][g]:.1f}" for g in ("nodes", "redis", "bench"))
                     + f", {p['window_s']:.0f}"))
    rss = f.get("rss") or {}
    if rss:
        nodes = [r["peak_rss"] for r in rss["nodes"]]
        bench = [r["peak_rss"] for r in rss["bench"]]
        rows += [
            ("RSS peak, nodes: total / min / max (MiB)",
             f"{mib(rss['nodes_total'])} / {mib(min(nodes, default=0))} / {mib(max(nodes, default=0))}"),
            ("RSS peak, bench processes: count / total / max (MiB)",
             f"{len(bench)} / {mib(rss['bench_total'])} / {mib(max(bench, default=0))}"),
            ("RSS peak, Redis (MiB; INFO used_memory_rss)",
             ", ".join(f"{mib(r['peak_rss'])} ({mib(r['used_memory_rss_peak'])})" for r in rss["redis"])),
        ]
    cpu = f.get("cpu_s") or {}
    if cpu:
        rows.append(("CPU s over the run (nodes / redis / bench), wall s",
                     " / ".join(f"{cpu.get(g, 0):.1f}" for g in ("nodes", "redis", "bench"))
                     + f", {cpu.get('wall_s', 0):.0f}"))
    for label, s in (("before", result.get("sockstat_before")), ("peak", f.get("sockstat_peak")),
                     ("peak of mem", f.get("sockstat_mem_peak")), ("after", result.get("sockstat_after"))):
        if s:
            rows.append((f"sockstat {label}: TCP inuse / alloc / tw / mem (MiB)",
                         f"{s['inuse']:,} / {s['alloc']:,} / {s['tw']:,} / {mib(s['mem_bytes'])}"))
    rows.append(("processes started / left behind", f"{len(result['pids'])} / {len(result['left_behind'])}"))
    return rows


def write_html(result, path):
    esc = html.escape
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(str(v))}</td></tr>" for k, v in summary_rows(result))
    box = "".join(f"<tr><th>{esc(i['what'])}</th><td>{esc(i['level'])}</td><td>{esc(i['detail'])}</td></tr>"
                  for i in result["box_check"])
    rss = (result["figures"].get("rss") or {})
    procs = "".join(f"<tr><td>{esc(kind)}</td><td>{r['pid']}</td><td>{esc(str(r.get('ws', r.get('port', ''))))}</td>"
                    f"<td>{mib(r['peak_rss'])}</td></tr>"
                    for kind in ("nodes", "redis", "bench") for r in rss.get(kind, []))
    page = f"""<!doctype html><meta charset="utf-8"><title>myriad scale proof: {esc(result['scenario'])}</title>
<style>body{{font:14px sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
th,td{{border:1px solid #ccc;padding:3px 8px;text-align:left}}code{{font-size:12px}}</style>
<h1>Scale proof: {esc(result['scenario'])}</h1>
<p>Command: <code>{esc(result['command'])}</code><br>Bench: <code>{esc(result.get('bench_command', ''))}</code><br>
The bench's own report: <a href="bench.html">bench.html</a>, <a href="bench.json">bench.json</a>; all figures: <a href="scale.json">scale.json</a>.</p>
<table>{rows}</table>
<h2>Box check</h2><table>{box}</table>
<h2>Peak RSS per process</h2><table><tr><th>kind</th><th>pid</th><th>address</th><th>MiB</th></tr>{procs}</table>
"""
    with open(path, "w") as f:
        f.write(page)


# ---- main ----------------------------------------------------------------------------


def locate_myriad(args):
    if args.myriad:
        return args.myriad
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    print("# cargo build --release -p myriad", file=sys.stderr)
    subprocess.run(["cargo", "build", "--release", "-p", "myriad"], cwd=REPO, check=True)
    return os.path.join(target, "release", "myriad")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=list(SCENARIOS))
    parser.add_argument("--connections", type=int, help="subscribers (default: the scenario's)")
    parser.add_argument("--nodes", type=int, help="nodes (default: as few as the open-file limit allows; churn 4)")
    parser.add_argument("--redis", type=int, default=1, help="Redis instances, subjects hashed over them")
    parser.add_argument("--duration", help="how long to publish (c10m, churn); broadcast: how long to wait "
                                           "for deliveries after the last publish")
    parser.add_argument("--period", default=None, help="c10m: each subject gets one message per period (60s)")
    parser.add_argument("--publishers", type=int, help="c10m, churn: publishing connections, on as many nodes "
                        "(default: one per node)")
    parser.add_argument("--count", type=int, default=1, help="broadcast: publishes")
    parser.add_argument("--kill-after", help="churn: kill a node that holds no publisher (SIGKILL) this long "
                        "after the subscribers are set up; its subscribers must fail over and lose nothing")
    parser.add_argument("--interval", default="10s", help="broadcast: time between publishes")
    parser.add_argument("--drain", default="30s", help="c10m, churn: how long to wait for deliveries after the last publish")
    parser.add_argument("--out", help="output directory (default target/scale/<scenario>)")
    parser.add_argument("--myriad", help="the myriad binary (default: cargo build --release, then "
                                         "$CARGO_TARGET_DIR/release/myriad or target/release/myriad)")
    parser.add_argument("--node-arg", action="append", default=[], help="extra flag for every node (repeatable)")
    parser.add_argument("--bench-arg", action="append", default=[], help="extra flag for the bench's workload (repeatable)")
    parser.add_argument("--timeout", type=float, help="seconds the bench may run before it is stopped "
                                                      "(default: from the set-up, duration and drain)")
    parser.add_argument("--netns", type=int, nargs="?", const=1 << 21, metavar="EHASH",
                        help="run everything in a network namespace of its own (root) whose TCP connection "
                             "hash table has EHASH buckets (default 2097152): see enter_netns in cluster.py")
    parser.add_argument("--check", action="store_true", help="print the box check's verdict and exit")
    parser.add_argument("--force", action="store_true", help="run even when the box check refuses")
    args = parser.parse_args()
    defaults = SCENARIOS[args.scenario]
    args.connections = args.connections or defaults["connections"]
    args.nodes = args.nodes or defaults.get("nodes")
    args.duration = args.duration or defaults["duration"]
    args.period = args.period or defaults.get("period", "60s")
    if args.connections < 1 or args.redis < 1 or (args.nodes is not None and not 1 <= args.nodes <= 254):
        sys.exit("--connections and --redis must be at least 1, --nodes 1 to 254")
    if args.publishers is not None and args.publishers < 1:
        sys.exit("--publishers must be at least 1")
    if args.kill_after is not None:
        if args.scenario != "churn" or args.nodes < 2:
            sys.exit("--kill-after is for churn over at least 2 nodes")
        if args.publishers is not None and args.publishers >= args.nodes:
            sys.exit("--kill-after: --publishers must leave a node without one (publishers do not fail over)")
    for name in ("duration", "period", "interval", "drain", *(["kill_after"] if args.kill_after else [])):
        try:
            if secs(getattr(args, name)) <= 0:
                raise ValueError
        except ValueError:
            sys.exit(f"--{name} {getattr(args, name)!r}: expected a duration above 0 like 10m, 60s or 500ms")
    p = plan(args)
    args.myriad = os.path.abspath(locate_myriad(args))
    box = check_box(p, args.myriad, args.node_arg)
    fits = print_verdict(p, box)
    if args.check:
        sys.exit(0 if fits else 1)
    if not fits and not args.force:
        sys.exit("scale.py: the run cannot fit on this box (see [refuse] above); nothing was started")
    args.out = os.path.abspath(args.out or os.path.join(REPO, "target", "scale", args.scenario))
    publish_s = secs(args.duration) + secs(args.interval) * args.count if args.scenario == "broadcast" \
        else secs(args.duration) * 2 + secs(args.drain)
    args.timeout = args.timeout or (60 + args.connections / 500 + publish_s + 120)
    catch_signals()
    netns = None
    if args.netns:
        try:
            netns = enter_netns(args.netns)
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"scale.py: --netns: {e}; nothing was started")
    children = Children()
    try:
        result = run(args, p, box, children)
        result["netns"] = netns
    except (KeyboardInterrupt, SystemExit, Exception) as e:
        # run() has stopped everything on its way out.
        left = children.left_behind()
        why = "interrupted" if isinstance(e, (KeyboardInterrupt, SystemExit)) else f"failed: {e}"
        print(f"\nscale.py: {why}; stopped {len(children.seen)} processes, "
              f"left behind: {left or 'none'}; logs in {args.out}", file=sys.stderr)
        sys.exit(e.code if isinstance(e, SystemExit) and e.code else 130 if isinstance(e, KeyboardInterrupt) else 1)
    with open(os.path.join(args.out, "scale.json"), "w") as f:
        json.dump(result, f, indent=1)
    write_html(result, os.path.join(args.out, "scale.html"))
    width = max(len(k) for k, _ in summary_rows(result))
    print(f"\n## scale proof: {args.scenario}, {args.connections:,} subscribers, {p['nodes']} nodes, "
          f"{args.redis} Redis\n")
    for k, v in summary_rows(result):
        print(f"{k:<{width}}  {v}")
    print(f"\nreports: {args.out}/scale.json, scale.html, bench.json, bench.html")
    sys.exit(0 if result["verdict"]["pass"] else 1)


if __name__ == "__main__":
    main()
