#!/usr/bin/env python3
"""Runs the benchmark scenarios behind docs/benchmarks.md and prints their
medians.

Each run starts fresh `myriad serve` nodes on ephemeral loopback ports (so
"RSS added per connection" is measured against an idle node), runs one
`myriad bench` command against them with --json, stops the nodes, and
collects the figures the scenario is about. With --runs N every scenario
runs N times; the table gives the median and the range.

    python3 scripts/benchmarks.py                       # every scenario, 3 runs each
    python3 scripts/benchmarks.py --runs 5 broadcast-saturating
    python3 scripts/benchmarks.py --list
    python3 scripts/benchmarks.py --node-arg=--history-size=0 idle-memory

--node-arg adds a flag to every node a scenario starts (history off, as
above); --bin runs another build. Scenarios marked "tls" run their nodes
with a certificate made once per output directory (openssl, ECDSA P-256,
self-signed for localhost) and the bench over wss:// trusting it. --baseline BIN runs an older build's
nodes (without --node-arg flags, which it may not know) alternately with
this one's, run by run, and prints both medians and their ratio: a
before/after comparison on a shared, noisy box. --alternate runs the named
scenarios in turn run by run (A B A B ...), for a comparison within one
build, such as plain against compressing subscribers:

    python3 scripts/benchmarks.py --alternate broadcast-saturating broadcast-saturating-ws-deflate

It uses target/release/myriad (build it first: cargo build --release -p
myriad) and writes every JSON report under target/benchmarks/. Nothing here
changes sysctls; the box's defaults are what is measured.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in scripts/ for the import below
from cluster import die_with_parent  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get(doc, path):
    """The value at a dotted path (list indices allowed), or None."""
    for part in path.split("."):
        if doc is None:
            return None
        if isinstance(doc, list):
            doc = doc[int(part)] if int(part) < len(doc) else None
        else:
            doc = doc.get(part)
    return doc


def phase(name, field):
    """A figure of one connect-rate phase."""

    def pick(doc):
        for p in doc.get("phases", []):
            if p["name"] == name:
                return p[field]
        return None

    return pick


def failures(doc):
    return sum(doc["failures"].values())


def wire_per_delivery(doc):
    """Bytes the bench read off its sockets per delivery it counted."""
    t = doc.get("totals") or {}
    return t["wire_bytes_in"] / t["messages_in"] if t.get("messages_in") and "wire_bytes_in" in t else None


def compression_us_per_frame(doc):
    """The node's time compressing per frame it compressed (once per
    publication, whatever the number of recipients), from its /metrics."""
    m = doc.get("node_metrics") or {}
    frames = m.get("myriad_compression_frames_total")
    return m["myriad_compression_seconds_total"] * 1e6 / frames if frames else None


def compression_frames(doc):
    return (doc.get("node_metrics") or {}).get("myriad_compression_frames_total")


def delivered_all(doc):
    d = doc.get("deliveries") or {}
    return "yes" if d.get("expected") == d.get("received") else "NO"


# Each figure: (label, dotted path or function, format).
LATENCY = [
    ("delivery p50 (ms)", "latency.p50_us", "ms"),
    ("delivery p99 (ms)", "latency.p99_us", "ms"),
    ("delivery p99.9 (ms)", "latency.p999_us", "ms"),
    ("delivery max (ms)", "latency.max_us", "ms"),
]

SCENARIOS = {
    "idle-memory": {
        "what": "19,000 idle WebSocket connections, each subscribed to its own subject (default workers)",
        "nodes": [[]],
        "bench": ["subscribers", "--connections", "19000", "--duration", "5s"],
        "figures": [
            ("server RSS added per connection (B)", "server.rss_added_per_connection", "int"),
            ("server RSS / connections (B)", "server.rss_per_connection", "int"),
            ("server RSS at 19k (MiB)", "server.rss_peak_bytes", "mib"),
            ("bench RSS added per connection (B)", "bench.rss_per_conn_bytes", "int"),
            ("set-up time (s)", "setup_secs", "f1"),
            ("upgrades with permessage-deflate", "totals.deflate_agreed", "int"),
            ("failures", failures, "int"),
        ],
    },
    "idle-memory-1w": {
        "what": "the same with --workers 1",
        "nodes": [["--workers", "1"]],
        "bench": ["subscribers", "--connections", "19000", "--duration", "5s"],
        "figures": [
            ("server RSS added per connection (B)", "server.rss_added_per_connection", "int"),
            ("server RSS / connections (B)", "server.rss_per_connection", "int"),
            ("bench RSS added per connection (B)", "bench.rss_per_conn_bytes", "int"),
            ("failures", failures, "int"),
        ],
    },
    "connect-rate": {
        "what": "seed 000: 20,000 arrivals/s, each upgrades, holds 1 s ± 5 %, closes; two nodes (one node's 20k open files cannot hold 1 s of arrivals)",
        "nodes": [[], []],
        "bench": ["connect-rate", "--rate", "20000", "--ramp-up", "2s", "--sustain", "10s", "--ramp-down", "2s"],
        "figures": [
            ("sustain: achieved handshakes/s", phase("sustain", "achieved_per_s"), "int"),
            ("connect p99 (ms)", "connect.p99_us", "ms"),
            ("handshake p50 (ms)", "handshake.p50_us", "ms"),
            ("handshake p99 (ms)", "handshake.p99_us", "ms"),
            ("listen queue overflows", "listen_queue.listen_overflows", "int"),
            ("failures", failures, "int"),
            ("bench CPU (s)", "bench.cpu_secs", "f1"),
            ("server CPU (s)", "server.cpu_secs", "f1"),
        ],
    },
    "connect-rate-25k": {
        "what": "the same at 25,000 arrivals/s",
        "nodes": [[], []],
        "bench": ["connect-rate", "--rate", "25000", "--ramp-up", "2s", "--sustain", "10s", "--ramp-down", "2s"],
        "figures": [
            ("sustain: achieved handshakes/s", phase("sustain", "achieved_per_s"), "int"),
            ("connect p99 (ms)", "connect.p99_us", "ms"),
            ("handshake p99 (ms)", "handshake.p99_us", "ms"),
            ("listen queue overflows", "listen_queue.listen_overflows", "int"),
            ("failures", failures, "int"),
        ],
    },
    "broadcast-saturating": {
        "what": "seed 002 shape: one subject, 10,000 subscribers, 800 publishes/s of 512 B (8 M deliveries/s offered)",
        "nodes": [[]],
        "bench": ["broadcast", "--subscribers", "10000", "--rate", "800", "--count", "4000", "--drain", "60s"],
        "figures": [
            ("deliveries/s", "broadcast.deliveries_per_s", "int"),
            ("all delivered", delivered_all, "str"),
            ("messages per write", "server.messages_per_write", "f1"),
            ("until last subscriber p50 (ms)", "broadcast.until_last.p50_us", "ms"),
            ("server CPU per delivery (µs)", "server.cpu_us_per_message_out", "f2"),
            ("bench CPU per delivery (µs)", "bench.cpu_us_per_message_in", "f2"),
            ("server RSS peak (MiB)", "server.rss_peak_bytes", "mib"),
            ("bytes on the wire per delivery (B)", wire_per_delivery, "int"),
            ("frames compressed (node)", compression_frames, "int"),
            ("compression CPU per frame (µs)", compression_us_per_frame, "f2"),
        ],
    },
    "broadcast-one-per-write": {
        "what": "10,000 subscribers, 20 publishes/s: below the point where queued messages share a write",
        "nodes": [[]],
        "bench": ["broadcast", "--subscribers", "10000", "--rate", "20", "--count", "200"],
        "figures": [
            ("deliveries/s", "broadcast.deliveries_per_s", "int"),
            ("messages per write", "server.messages_per_write", "f2"),
            ("delivery mean (ms)", "latency.mean_us", "ms"),
            ("delivery p99 (ms)", "latency.p99_us", "ms"),
            ("server CPU per delivery (µs)", "server.cpu_us_per_message_out", "f2"),
        ],
    },
    "broadcast-moderate": {
        "what": "10,000 subscribers, 5 publishes/s (the peers' ~50-60 ms mean)",
        "nodes": [[]],
        "bench": ["broadcast", "--subscribers", "10000", "--rate", "5", "--count", "50"],
        "figures": [
            ("delivery mean (ms)", "latency.mean_us", "ms"),
            *LATENCY,
            ("until last subscriber p50 (ms)", "broadcast.until_last.p50_us", "ms"),
            ("until last subscriber max (ms)", "broadcast.until_last.max_us", "ms"),
        ],
    },
    "one-to-one-saturating": {
        "what": "seed 001 shape: 10,000 subscribers, each its own subject, 512 B, 200,000 publishes/s offered over 4 connections",
        "nodes": [[]],
        "bench": ["run", "--connections", "10000", "--rate", "200000", "--duration", "10s", "--publisher-conns", "4", "--drain", "60s"],
        "figures": [
            ("deliveries/s", "messages_in_per_s", "int"),
            ("all delivered", delivered_all, "str"),
            ("messages per write", "server.messages_per_write", "f2"),
            ("server CPU per delivery (µs)", "server.cpu_us_per_message_out", "f2"),
        ],
    },
    "one-to-one-half": {
        "what": "the same at 74,000 publishes/s, half the saturating rate measured above",
        "nodes": [[]],
        "bench": ["run", "--connections", "10000", "--rate", "74000", "--duration", "20s", "--publisher-conns", "4"],
        "figures": [("deliveries/s", "messages_in_per_s", "int"), ("all delivered", delivered_all, "str"), *LATENCY],
    },
    "one-to-one-saturating-1w": {
        "what": "one-to-one saturating, node with --workers 1",
        "nodes": [["--workers", "1"]],
        "bench": ["run", "--connections", "10000", "--rate", "200000", "--duration", "10s", "--publisher-conns", "4", "--drain", "60s"],
        "figures": [
            ("deliveries/s", "messages_in_per_s", "int"),
            ("all delivered", delivered_all, "str"),
            ("server CPU per delivery (µs)", "server.cpu_us_per_message_out", "f2"),
        ],
    },
    "one-to-one-half-1w": {
        "what": "one-to-one at 48,000 publishes/s, half of --workers 1's saturating rate",
        "nodes": [["--workers", "1"]],
        "bench": ["run", "--connections", "10000", "--rate", "48000", "--duration", "20s", "--publisher-conns", "4"],
        "figures": [("deliveries/s", "messages_in_per_s", "int"), ("all delivered", delivered_all, "str"), *LATENCY],
    },
    "publishers-ws": {
        "what": "Benchpub alone: 100,000 publishes/s of 512 B over one WebSocket to subjects nobody holds",
        "nodes": [[]],
        "bench": ["publishers", "--rate", "100000", "--duration", "10s"],
        "figures": [
            ("published/s", "published_per_s", "int"),
            ("publish lag p99 (ms)", "publish_lag.p99_us", "ms"),
            ("dropped", "totals.publish_dropped", "int"),
        ],
    },
    "publishers-http": {
        "what": "Benchpub over the HTTP API: 20,000 requests/s pipelined on 4 keep-alive connections",
        "nodes": [[]],
        "bench": ["publishers", "--publish-transport", "http", "--publisher-conns", "4", "--rate", "20000", "--duration", "10s"],
        "figures": [
            ("published/s", "published_per_s", "int"),
            ("HTTP 2xx", "totals.http_ok", "int"),
            ("HTTP response p50 (ms)", "http_response.p50_us", "ms"),
            ("HTTP response p99 (ms)", "http_response.p99_us", "ms"),
        ],
    },
    "churn": {
        "what": "subscribers on 1,000 subjects with history reconnect 2,000 times/s and resume with since, while 5,000 publishes/s of 512 B go on, for 60 s",
        "nodes": [[]],
        "bench": ["churn", "--subscribers", "10000", "--subjects", "1000", "--reconnect-rate", "2000", "--rate", "5000", "--duration", "60s", "--size", "512"],
        "figures": [
            ("reconnects", "churn.reconnects", "int"),
            ("recovered (%)", "churn.recovered_percent", "f2"),
            ("unrecovered", "churn.unrecovered", "int"),
            ("lost", "churn.lost", "int"),
            ("duplicates", "churn.duplicates", "int"),
            ("replayed messages", "churn.replayed", "int"),
            ("replay per recovery, max", "churn.replay.max", "int"),
            ("resubscribe p50 (ms)", "resubscribe.p50_us", "ms"),
            ("resubscribe p99 (ms)", "resubscribe.p99_us", "ms"),
            ("delivery p99 (ms)", "latency.p99_us", "ms"),
            ("all delivered", delivered_all, "str"),
        ],
    },
    "churn-offline": {
        "what": "the same for 30 s, each subscriber away 2 s before it reconnects, so every recovery replays",
        "nodes": [[]],
        "bench": ["churn", "--subscribers", "10000", "--subjects", "1000", "--reconnect-rate", "2000", "--rate", "5000", "--duration", "30s", "--size", "512", "--offline", "2s"],
        "figures": [
            ("reconnects", "churn.reconnects", "int"),
            ("recovered (%)", "churn.recovered_percent", "f2"),
            ("lost", "churn.lost", "int"),
            ("duplicates", "churn.duplicates", "int"),
            ("replayed messages", "churn.replayed", "int"),
            ("replay per recovery, p50", "churn.replay.p50", "int"),
            ("replay per recovery, max", "churn.replay.max", "int"),
            ("resubscribe p99 (ms)", "resubscribe.p99_us", "ms"),
        ],
    },
    "subscribers-60k": {
        "what": "60,000 subscribed connections held for 30 s against four nodes on this host",
        "nodes": [[], [], [], []],
        "bench": ["subscribers", "--connections", "60000", "--duration", "30s"],
        "figures": [
            ("subscribed", "totals.subscribed", "int"),
            ("failures", failures, "int"),
            ("set-up time (s)", "setup_secs", "f1"),
            ("bench processes", "bench.processes", "int"),
            ("bench RSS added per connection (B)", "bench.rss_per_conn_bytes", "int"),
            ("server RSS added per connection (B)", "server.rss_added_per_connection", "int"),
            ("server RSS, 4 nodes (MiB)", "server.rss_peak_bytes", "mib"),
        ],
    },
}


def _over(transport, base, what):
    """`base` with its subscribers on another transport."""
    scenario = dict(SCENARIOS[base])
    bench = list(scenario["bench"])
    scenario["bench"] = bench[:1] + ["--subscribe-transport", transport] + bench[1:]
    scenario["what"] = what
    return scenario


# The same workloads over the receive-only HTTP transports (issue 8): run
# them in one invocation with their WebSocket originals to compare in one
# sitting.
for _t, _name in (
    ("sse", "Server-Sent Events"),
    ("stream", "HTTP streaming (chunked NDJSON)"),
    ("ws-deflate", "compressing WebSocket (permessage-deflate)"),
):
    SCENARIOS[f"idle-memory-{_t}"] = _over(
        _t, "idle-memory", f"19,000 idle {_name} connections, each subscribed to its own subject"
    )
    SCENARIOS[f"broadcast-saturating-{_t}"] = _over(
        _t, "broadcast-saturating", f"broadcast-saturating with the 10,000 subscribers on {_name}"
    )
    SCENARIOS[f"broadcast-moderate-{_t}"] = _over(
        _t, "broadcast-moderate", f"broadcast-moderate with the 10,000 subscribers on {_name}"
    )
# permessage-deflate (issue 30): broadcast-saturating with data of words
# (--pad words: text that compresses as real messages do, where random
# characters barely would), to plain and to compressing subscribers, at
# 10,000 and 1,000 subscribers: compression is once per publication, so
# its CPU per frame must not grow with the recipients. Run them with
# --alternate.
SCENARIOS["broadcast-text"] = {
    **SCENARIOS["broadcast-saturating"],
    "what": "broadcast-saturating with data of words (--pad words): 10,000 subscribers, 800 publishes/s of 512 B",
    "bench": ["broadcast", "--subscribers", "10000", "--rate", "800", "--count", "4000", "--drain", "60s", "--pad", "words"],
}
SCENARIOS["broadcast-text-1k"] = {
    **SCENARIOS["broadcast-text"],
    "what": "broadcast-text's publications (800/s of 512 B of words, 4,000) to 1,000 subscribers",
    "bench": ["broadcast", "--subscribers", "1000", "--rate", "800", "--count", "4000", "--drain", "60s", "--pad", "words"],
}
SCENARIOS["broadcast-text-paced"] = {
    **SCENARIOS["broadcast-text"],
    "what": "broadcast-text paced to what a compressing bench can inflate on this box: 10,000 subscribers, 30 publishes/s of 512 B of words, 600 in all",
    "bench": ["broadcast", "--subscribers", "10000", "--rate", "30", "--count", "600", "--drain", "60s", "--pad", "words"],
}
for _base in ("broadcast-text", "broadcast-text-1k", "broadcast-text-paced"):
    SCENARIOS[f"{_base}-ws-deflate"] = _over(
        "ws-deflate", _base, f"{_base} with its subscribers on compressing WebSocket (permessage-deflate)"
    )
SCENARIOS["broadcast-poll"] = {
    "what": "long-poll: 1,000 subscribers polling one subject in a loop, 100 publishes/s of 512 B for 20 s",
    "nodes": [["--poll-timeout", "2"]],
    "bench": [
        "broadcast", "--subscribe-transport", "poll", "--poll-timeout", "2s",
        "--subscribers", "1000", "--rate", "100", "--count", "2000", "--drain", "30s",
    ],
    "figures": [
        ("deliveries/s", "broadcast.deliveries_per_s", "int"),
        ("all delivered", delivered_all, "str"),
        ("delivery p50 (ms)", "latency.p50_us", "ms"),
        ("delivery p99 (ms)", "latency.p99_us", "ms"),
        ("server CPU per delivery (µs)", "server.cpu_us_per_message_out", "f2"),
    ],
}
SCENARIOS["broadcast-poll-ws"] = {
    **SCENARIOS["broadcast-poll"],
    "what": "broadcast-poll's load with WebSocket subscribers, for comparison",
    "nodes": [[]],
    "bench": ["broadcast", "--subscribers", "1000", "--rate", "100", "--count", "2000", "--drain", "30s"],
}


def social_wrong(doc):
    s = doc.get("social") or {}
    return sum(s.get(k, 0) for k in ("lost", "duplicated", "unexpected", "unanswered", "refused"))


SOCIAL_FIGURES = [
    ("sends/s", "published_per_s", "int"),
    ("deliveries/s", "messages_in_per_s", "int"),
    ("delivery p50 (ms)", "latency.p50_us", "ms"),
    ("delivery p99 (ms)", "latency.p99_us", "ms"),
    ("delivery max (ms)", "latency.max_us", "ms"),
    ("lost + duplicated + unexpected + unanswered", social_wrong, "int"),
    ("in flight, not judged", "social.in_flight", "int"),
    ("node CPU per send (µs)", "social.server_cpu_us_per_send", "f1"),
    ("node CPU per delivery (µs)", "social.server_cpu_us_per_delivery", "f2"),
    ("node RSS peak (MiB)", "server.rss_peak_bytes", "mib"),
    ("node RSS / connections (B)", "server.rss_per_connection", "int"),
]


def _social(rate, duration, what, extra=()):
    return {
        "what": what,
        "nodes": [[]],
        "graph": (20000, 15, 1),
        "bench": ["social", "--users", "19000", "--rate", str(rate), "--duration", duration, *extra],
        "figures": SOCIAL_FIGURES,
    }


for _rate in (5000, 10000, 15000, 20000):
    SCENARIOS[f"social-{_rate // 1000}k"] = _social(
        _rate, "20s", f"seed 004: 19,000 users of a 20,000-user BA graph (15 edges per node) send as themselves at {_rate:,}/s for 20 s"
    )
SCENARIOS["social-idle"] = {
    **_social(1, "3s", "19,000 users of the 20,000-user graph connected with their feeds (about 15 each), nearly idle: one send a second"),
    "figures": [
        ("server RSS added per connection (B)", "server.rss_added_per_connection", "int"),
        ("server RSS / connections (B)", "server.rss_per_connection", "int"),
        ("set-up time (s)", "setup_secs", "f1"),
        ("lost + duplicated + unexpected + unanswered", social_wrong, "int"),
    ],
}
# Half of the saturation measured with the ladder above (about 13,200
# sends/s achieved when 15,000 and 20,000 were asked).
SCENARIOS["social-half"] = _social(6600, "60s", "the same at 6,600 sends/s (half of saturation) for 60 s")
SCENARIOS["social-half-churn"] = _social(
    6600, "60s", "the same with 1,000 follow/unfollow operations/s through the admin API",
    ["--follow-rate", "1000"],
)


# TLS (issue 10): the idle cost of a wss:// connection and TLS handshakes
# per second, each beside its plain twin, to be run in one invocation:
#   python3 scripts/benchmarks.py idle-memory idle-memory-tls \
#       connect-rate-2k connect-rate-tls-2k connect-rate-tls-4k connect-rate-tls-saturating
SCENARIOS["idle-memory-tls"] = {
    **SCENARIOS["idle-memory"],
    "what": "19,000 idle WebSocket connections over TLS (wss://), each subscribed to its own subject",
    "tls": True,
}
SCENARIOS["idle-memory-tls-in-flight-50"] = {
    **SCENARIOS["idle-memory-tls"],
    "what": "the same, the bench setting up 50 connections at a time instead of 1,000 (fewer handshakes in flight at once)",
    "bench": ["--in-flight", "50", *SCENARIOS["idle-memory"]["bench"]],
}
_CONNECT_FIGURES = SCENARIOS["connect-rate"]["figures"]
_CONNECT = ["connect-rate", "--ramp-up", "2s", "--sustain", "10s", "--ramp-down", "2s"]
SCENARIOS["connect-rate-2k"] = {
    "what": "2,000 arrivals/s, each upgrades, holds 1 s ± 5 %, closes; one node (the plain twin of connect-rate-tls-2k)",
    "nodes": [[]],
    "bench": [*_CONNECT, "--rate", "2000"],
    "figures": _CONNECT_FIGURES,
}
SCENARIOS["connect-rate-tls-2k"] = {
    **SCENARIOS["connect-rate-2k"],
    "what": "the same over TLS: every arrival a full TLS 1.3 handshake (ECDSA P-256, no resumption)",
    "tls": True,
}
SCENARIOS["connect-rate-tls-4k"] = {
    **SCENARIOS["connect-rate-tls-2k"],
    "what": "TLS arrivals at 4,000/s, about what this box's two cores can handshake with the bench on them too",
    "bench": [*_CONNECT, "--rate", "4000"],
}
SCENARIOS["connect-rate-tls-saturating"] = {
    **SCENARIOS["connect-rate-tls-2k"],
    "what": "TLS arrivals offered at 8,000/s, more than this box's two cores can handshake (bench and node share them): the achieved rate is the ceiling",
    "bench": [*_CONNECT, "--rate", "8000"],
}


def fmt(value, kind):
    if value is None:
        return "-"
    if kind == "str":
        return str(value)
    if kind == "ms":
        return f"{value / 1000:.2f}"
    if kind == "mib":
        return f"{value / 1048576:.1f}"
    if kind == "f1":
        return f"{value:.1f}"
    if kind == "f2":
        return f"{value:.2f}"
    return f"{round(value):,}"


def graph_fixture(binary, out_dir, users, edges_per_node, seed):
    """A generated follow graph and a data directory holding it loaded, made
    once per output directory; returns (edge file, template data dir)."""
    name = f"graph-{users}x{edges_per_node}-s{seed}"
    path = os.path.join(out_dir, f"{name}.txt")
    template = os.path.join(out_dir, f"{name}.data")
    # Written only once the load has succeeded: the store's file exists as
    # soon as a load starts, so it cannot say the load finished.
    done = os.path.join(out_dir, f"{name}.loaded")
    if not os.path.exists(done):
        subprocess.run([binary, "graph", "generate", "--users", str(users), "--edges-per-node",
                        str(edges_per_node), "--seed", str(seed), "--out", path], check=True)
        shutil.rmtree(template, ignore_errors=True)
        subprocess.run([binary, "graph", "load", path, "--data-dir", template], check=True,
                       stdout=subprocess.DEVNULL)
        open(done, "w").close()
    return path, template


def tls_files(out_dir):
    """A self-signed ECDSA P-256 certificate for localhost and its key, made
    once per output directory; returns (cert, key)."""
    cert = os.path.join(out_dir, "tls-cert.pem")
    key = os.path.join(out_dir, "tls-key.pem")
    if not (os.path.exists(cert) and os.path.exists(key)):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", key, "-out", cert, "-days", "30", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=DNS:localhost",
             # A CA certificate cannot serve as a server's own (webpki).
             "-addext", "basicConstraints=critical,CA:FALSE"],
            check=True, capture_output=True)
    return cert, key


def start_node(binary, flags, data_template=None):
    """Starts a node on ephemeral loopback ports; returns (process, ws, admin)."""
    data_dir = tempfile.mkdtemp(prefix="myriad-")
    if data_template:
        shutil.copytree(data_template, data_dir, dirs_exist_ok=True)
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
        # A data directory of its own (through the environment, which older
        # builds compared as a baseline ignore).
        env={**os.environ, "MYRIAD_LOG": "warn", "MYRIAD_DATA_DIR": data_dir},
    )
    proc.data_dir = data_dir  # removed by stop_node
    ready = json.loads(proc.stdout.readline())
    return proc, ready["ws"], ready["admin"]


def stop_node(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(proc.data_dir, ignore_errors=True)


def run_once(binary, name, scenario, out_dir, index, node_args):
    bench_args = list(scenario["bench"])
    template = None
    if "graph" in scenario:
        graph, template = graph_fixture(binary, out_dir, *scenario["graph"])
        bench_args += ["--graph", graph]
    tls = []
    if scenario.get("tls"):
        cert, key = tls_files(out_dir)
        tls = ["--tls-cert", cert, "--tls-key", key]
    nodes = [start_node(binary, [*flags, *tls, *node_args], template) for flags in scenario["nodes"]]
    json_path = os.path.join(out_dir, f"{name}-{index}.json")
    cmd = [binary, "bench", "--progress", "off", "--json", json_path]
    for _, ws, admin in nodes:
        # The certificate is for localhost, the node listens on 127.0.0.1.
        url = f"wss://localhost:{ws.rsplit(':', 1)[1]}/ws" if tls else f"ws://{ws}/ws"
        cmd += ["--url", url, "--admin-url", f"http://{admin}"]
    if tls:
        cmd += ["--tls-ca", tls[1]]
    cmd += bench_args
    metrics = {}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode == 0:
            for _, _, admin in nodes:
                for series, value in node_metrics(admin).items():
                    metrics[series] = metrics.get(series, 0) + value
    finally:
        for proc, _, _ in nodes:
            stop_node(proc)
    if done.returncode != 0:
        sys.exit(f"{name} run {index} failed:\n{done.stdout}\n{done.stderr}")
    with open(json_path) as f:
        doc = json.load(f)
    doc["node_metrics"] = metrics
    return doc, cmd


def node_metrics(admin):
    """The node's unlabelled compression series from its /metrics (the
    figures the bench cannot see from outside), by name."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("myriad_compression_") and "{" not in line:
            name, value = line.split()[:2]
            out[name] = float(value)
    return out


def median_cell(values, kind):
    present = [v for v in values if v is not None]
    if not present:
        return "-", "-"
    if kind == "str":
        return ", ".join(str(v) for v in values), ""
    mid = statistics.median(present)
    return fmt(mid, kind), f"{fmt(min(present), kind)} – {fmt(max(present), kind)}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", help="which to run (default: all)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bin", default=os.path.join(REPO, "target", "release", "myriad"))
    parser.add_argument("--out", default=os.path.join(REPO, "target", "benchmarks"))
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--node-arg", action="append", default=[], help="extra flag for every node (repeatable)")
    parser.add_argument("--baseline", help="an older build to alternate with, run by run")
    parser.add_argument(
        "--alternate",
        action="store_true",
        help="run the named scenarios in turn, run by run (A B A B ...), not one after another, "
        "so that their ratios survive a shared box's drift",
    )
    args = parser.parse_args()
    if args.list:
        for name, s in SCENARIOS.items():
            print(f"{name:28} {s['what']}")
        return
    names = args.scenarios or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        sys.exit(f"unknown scenario(s): {', '.join(unknown)} (see --list)")
    os.makedirs(args.out, exist_ok=True)
    reports = {name: [] for name in names}
    baseline = {name: [] for name in names}
    order = [(i, n) for i in range(args.runs) for n in names] if args.alternate else \
        [(i, n) for n in names for i in range(args.runs)]
    for i, name in order:
        scenario = SCENARIOS[name]
        started = time.time()
        if args.baseline:
            base_out = os.path.join(args.out, "baseline")
            os.makedirs(base_out, exist_ok=True)
            baseline[name].append(run_once(args.baseline, name, scenario, base_out, i, [])[0])
        report, _ = run_once(args.bin, name, scenario, args.out, i, args.node_arg)
        reports[name].append(report)
        print(f"# {name} run {i + 1}/{args.runs}: {time.time() - started:.0f} s", file=sys.stderr)
        if i + 1 == args.runs:
            print_table(name, scenario, reports[name], baseline[name], args)
    if args.alternate:
        print(f"\nRuns alternated: {' → '.join(names)}, {args.runs} times.")


def print_table(name, scenario, reports, baseline, args):
    """The scenario's figures: median and range of its runs (and the
    baseline's, with their ratio)."""
    nodes = " ".join(
        "`myriad serve" + ("".join(" " + f for f in [*flags, *args.node_arg])) + "`"
        for flags in scenario["nodes"]
    )
    print(f"\n### {name}\n\n{scenario['what']}.\n")
    tls = (" Nodes with `--tls-cert`/`--tls-key`, the bench over `wss://localhost:PORT/ws`"
           " with `--tls-ca`." if scenario.get("tls") else "")
    print(f"Nodes: {nodes}; bench: `myriad bench {shlex.join(scenario['bench'])}` "
          f"(plus `--url`/`--admin-url` per node).{tls} Runs: {args.runs}.\n")
    if args.baseline:
        print(f"Baseline: `{args.baseline}`, alternating run by run.\n")
        print("| figure | this build: median | range | baseline: median | range | ratio |")
        print("|---|---|---|---|---|---|")
    else:
        print("| figure | median | range |\n|---|---|---|")
    for label, source, kind in scenario["figures"]:
        pick = lambda r: source(r) if callable(source) else get(r, source)
        values = [pick(r) for r in reports]
        mid, spread = median_cell(values, kind)
        if not args.baseline:
            print(f"| {label} | {mid} | {spread} |")
            continue
        base_values = [pick(r) for r in baseline]
        base_mid, base_spread = median_cell(base_values, kind)
        ratio = "-"
        nums = [v for v in values if isinstance(v, (int, float))]
        base_nums = [v for v in base_values if isinstance(v, (int, float))]
        if nums and base_nums and statistics.median(base_nums):
            ratio = f"{statistics.median(nums) / statistics.median(base_nums):.2f}"
        print(f"| {label} | {mid} | {spread} | {base_mid} | {base_spread} | {ratio} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
