#!/usr/bin/env python3
"""Redis's CPU per publication for the Redis engine's publish script alone:
no node and no bench in the way, so versions of the script can be compared
in one sitting (docs/benchmarks.md, "Through Redis").

For each version (a git revision, or `.` for the working tree) and each
of --runs runs, alternating, it starts a fresh `redis-server` on a free
loopback port (no persistence), subscribes one connection to every
subject's channel as a node would, loads lib.lua + publish.lua of that
version, and sends --publishes publications of --bytes bytes round robin
over --subjects subjects, --run per script call (what the engine's
batches carry at saturation), --window calls in flight. It reports the
CPU `redis-server` spent (utime + stime from /proc) per publication, the
time Redis's own commands took inside the scripts (INFO commandstats), and
the median over runs.

    python3 scripts/publish_script_cost.py --rev fc28a64 --rev .
    python3 scripts/publish_script_cost.py --rev . --size 20            # full histories: each publish drops one
    python3 scripts/publish_script_cost.py --rev . --ttl 1000           # each publish expires one

History defaults are the engine's (100 publications, 5 minutes, 256 MiB);
the defaults here fill no history, so each publish stores and publishes.
Nothing here changes a setting of the host, and Redis stops with the run.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in scripts/ for the import below
from cluster import CLK_TCK, Children, catch_signals, redis_info, resp, stat_fields, start_redis  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = "crates/server/src/engine/redis"
# The base of the one partition measured, as the engine builds it
# (engine/redis/keys.rs): prefix "cost", partition 0.
BASE = "cost:{0}"
# The partition's shared keys, the scripts' KEYS[1..3] (lib.lua).
SHARED = [f"{BASE}:totals", f"{BASE}:oldest", f"{BASE}:expiry"]
# A fresh epoch as the engine passes it (16 hex digits).
EPOCH = "00000000c0ffee00"


def encode(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    """A RESP connection for pipelining: it reads exactly the replies it is
    owed (cluster.resp sends one command per connection)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    def _fill(self):
        data = self.sock.recv(1 << 20)
        if not data:
            raise EOFError("redis closed the connection")
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise RuntimeError(f"redis: {rest.decode()}")
        if kind in (b"+", b":"):
            return rest
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill()
            value, self.buf = self.buf[:n], self.buf[n + 2:]
            return value
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        raise RuntimeError(f"unexpected reply {line!r}")


def script_of(rev):
    """lib.lua + publish.lua as the engine assembles them, at `rev`."""
    parts = []
    for name in ("lib.lua", "publish.lua"):
        path = f"{SCRIPTS}/{name}"
        if rev == ".":
            with open(os.path.join(REPO, path)) as f:
                parts.append(f.read())
        else:
            parts.append(subprocess.run(["git", "-C", REPO, "show", f"{rev}:{path}"], check=True,
                                        capture_output=True, text=True).stdout)
    return "".join(parts)


def cpu_seconds(pid):
    """utime + stime of `pid` (proc(5) fields 14 and 15)."""
    _, fields = next(stat_fields([pid]))
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def one_run(script, args, out_dir):
    children = Children()
    try:
        proc, port = start_redis(children, out_dir)
        sha = resp(port, "SCRIPT", "LOAD", script)
        conn = Conn(port)
        subjects = [f"s{i}" for i in range(args.subjects)]
        listener = Conn(port)
        for i in range(0, len(subjects), 1000):
            listener.sock.sendall(encode("SSUBSCRIBE", *[f"{BASE}:c:{s}" for s in subjects[i:i + 1000]]))
        for _ in subjects:
            listener.reply()

        def drain():
            # What a node would read; only so that Redis never waits on it.
            try:
                while listener.sock.recv(1 << 20):
                    pass
            except OSError:
                pass

        threading.Thread(target=drain, daemon=True).start()
        data = b"x" * args.bytes
        calls = args.publishes // args.run
        requests = []
        k = 0
        for _ in range(calls):
            # ARGV: base, budget, fresh epoch, replication id ('' = none).
            argv = ["EVALSHA", sha, len(SHARED), *SHARED, BASE, args.budget, EPOCH, ""]
            for _ in range(args.run):
                argv += [subjects[k % len(subjects)], data, args.size, args.ttl]
                k += 1
            requests.append(encode(*argv))
        resp(port, "CONFIG", "RESETSTAT")
        before, started = cpu_seconds(proc.pid), time.time()
        sent = answered = 0
        while answered < calls:
            while sent < calls and sent - answered < args.window:
                conn.sock.sendall(requests[sent])
                sent += 1
            conn.reply()
            answered += 1
        wall, cpu = time.time() - started, cpu_seconds(proc.pid) - before
        # The time of the commands the scripts ran (commandstats counts
        # those too), without the calls around them.
        stats = redis_info(port, "commandstats")
        inner = sum(int(dict(kv.split("=") for kv in value.split(","))["usec"])
                    for name, value in stats.items()
                    if name.removeprefix("cmdstat_").split("|")[0]
                    not in ("evalsha", "config", "info", "subscribe", "script"))
        published = calls * args.run
        return {"cpu_us": 1e6 * cpu / published, "commands_us": inner / published,
                "per_s": published / wall, "published": published}
    finally:
        children.stop_all()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--rev", action="append", default=[], help="a git revision, or . for the working tree (repeatable)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--subjects", type=int, default=10_000)
    parser.add_argument("--publishes", type=int, default=400_000)
    parser.add_argument("--run", type=int, default=21, help="publications per script call")
    parser.add_argument("--window", type=int, default=64, help="script calls in flight")
    parser.add_argument("--bytes", type=int, default=512)
    parser.add_argument("--size", type=int, default=100, help="history size per subject")
    parser.add_argument("--ttl", type=int, default=300_000, help="history age limit, ms (0: none)")
    parser.add_argument("--budget", type=int, default=256 << 20, help="history bytes on the instance")
    args = parser.parse_args()
    catch_signals()
    revs = args.rev or ["."]
    scripts = {rev: script_of(rev) for rev in revs}
    out_dir = tempfile.mkdtemp(prefix="publish-script-cost-")
    results = {rev: [] for rev in revs}
    for i in range(args.runs):
        for rev in revs:
            r = one_run(scripts[rev], args, out_dir)
            results[rev].append(r)
            print(f"# run {i + 1}/{args.runs} {rev}: {r['cpu_us']:.2f} µs of Redis CPU per publication "
                  f"({r['commands_us']:.2f} in its commands), {r['per_s']:,.0f}/s", flush=True)
    print(f"\n{args.publishes:,} publications of {args.bytes} B over {args.subjects:,} subjects, {args.run} per "
          f"call, history size {args.size}, age limit {args.ttl} ms; medians of {args.runs} (range):\n")
    print("| version | Redis CPU per publication (µs) | of it in Redis's commands (µs) | publications/s |")
    print("|---|---|---|---|")
    for rev in revs:
        def cell(key, fmt):
            values = [r[key] for r in results[rev]]
            return f"{fmt(statistics.median(values))} ({fmt(min(values))} – {fmt(max(values))})"
        print(f"| {rev} | {cell('cpu_us', '{:.2f}'.format)} | {cell('commands_us', '{:.2f}'.format)} | "
              f"{cell('per_s', '{:,.0f}'.format)} |")


if __name__ == "__main__":
    main()
