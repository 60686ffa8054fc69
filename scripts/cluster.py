"""The processes of a cluster run on this host, shared by
scripts/redis_throughput.py and scripts/scale.py: starting `redis-server`
and `myriad serve` nodes on loopback, talking RESP to Redis, reading the
CPU time and RSS of processes from /proc, and stopping everything that was
started, whatever ends the run.

Owns process handling only: no bench arguments, no figures of a workload.
Every child it starts gets SIGKILL when the starting script dies
(PR_SET_PDEATHSIG) and leads a process group of its own, so Ctrl-C on a
terminal reaches only the script, whose `finally` stops each group (with
everything its leader started, such as the bench's worker processes), and
`Children.left_behind()` can say whether anything survived.
"""

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def die_with_parent():
    """For preexec_fn: the child gets SIGKILL when this script dies, however
    it dies, so no node outlives a run that was killed."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def catch_signals():
    """SIGTERM ends the script like Ctrl-C does: through its `finally`.
    (SIGINT is set again because a shell starting this in the background
    leaves it ignored.)"""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)


# ---- Redis ---------------------------------------------------------------


def resp(port, *args, host="127.0.0.1"):
    """Sends one command to Redis on `port` and returns its reply (simple
    string, integer, bulk string or error text; enough for PING, FLUSHALL,
    INFO)."""
    out = f"*{len(args)}\r\n".encode()
    for a in args:
        a = str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(out)
        f = s.makefile("rb")
        line = f.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:].decode()
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else f.read(n + 2)[:-2].decode()
        if kind == b":":
            return int(rest)
        if kind == b"-":
            raise RuntimeError(f"redis: {rest}")
        return rest


def redis_info(port, section="default", host="127.0.0.1"):
    info = {}
    for line in resp(port, "INFO", section, host=host).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            info[k] = v
    return info


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Children:
    """Every process a run started, each the leader of its own process
    group; `stop_all` ends them (and their groups), newest first."""

    def __init__(self):
        self.procs = []
        self.seen = set()  # every pid ever seen in one of the groups

    def popen(self, cmd, own_session=False, **kw):
        """Starts `cmd` leading a process group of its own. It stays in this
        script's session unless `own_session`: with
        `kernel.sched_autogroup_enabled` (1 here) the scheduler shares the
        CPU equally between sessions, not threads, so a bench whose 53
        worker processes sat in one session beside 52 nodes in a session
        each got 1/53 of the box: in a million-subscriber broadcast the
        nodes wrote for 8 s while the bench, runnable, waited (0.05 of a
        core; docs/benchmarks.md). Nodes and bench share one session and
        so the CPU by thread; only a process to be weighted on its own
        (`favour`) gets a session."""
        if own_session:
            kw["start_new_session"] = True
        else:
            kw["process_group"] = 0
        proc = subprocess.Popen(cmd, preexec_fn=die_with_parent, **kw)
        self.procs.append(proc)
        self.seen.add(proc.pid)
        return proc

    def group_pids(self):
        """Live pids in the process groups of the children (the bench's
        workers among them); noted in `seen` as they are found."""
        groups = {p.pid for p in self.procs}
        # A zombie has been reaped by no one yet but holds nothing.
        out = {pid for pid, fields in stat_fields() if int(fields[2]) in groups and fields[0] != "Z"}
        self.seen |= out
        return out

    def stop(self, proc, timeout=20):
        """SIGTERM to `proc`'s group, SIGKILL after `timeout` s (at once
        when 0); waits, and removes its working directory."""
        if proc.poll() is None and timeout > 0:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        # What the leader started may outlive it (a bench worker).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        for name in ("work_dir", "data_dir"):
            if getattr(proc, name, None):
                shutil.rmtree(getattr(proc, name), ignore_errors=True)

    def stop_all(self, timeout=20):
        """Stops every child: the newest first (the bench before the nodes
        it talks to, the nodes before Redis), all of them without waiting
        for one another, so dozens of nodes take one `timeout`, not one
        each."""
        self.group_pids()
        live = [p for p in reversed(self.procs) if p.poll() is None]
        for proc in live:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + timeout
        for proc in live:
            try:
                proc.wait(timeout=max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                pass
        for proc in reversed(self.procs):
            self.stop(proc, timeout=0)

    def left_behind(self, wait=15):
        """Pids seen in the run still alive (not zombies) once everything
        was stopped: empty when the run cleaned up. A killed process is
        still listed while its exit closes its files, which took seconds
        for bench workers holding 20,000 sockets on a loaded box (8 – 12
        were reported and gone moments later), so this waits up to `wait`
        seconds for them to go."""
        deadline = time.time() + wait
        while True:
            alive = [pid for pid, fields in stat_fields(sorted(self.seen)) if fields[0] != "Z"]
            if not alive or time.time() >= deadline:
                return alive
            time.sleep(0.2)


def start_redis(children, out_dir, name="redis-server", host="127.0.0.1", extra=()):
    """A `redis-server` without persistence on a free port of `host`;
    returns (process, port)."""
    port = free_port(host)
    work = tempfile.mkdtemp(prefix=f"{name}-")
    log = open(os.path.join(out_dir, f"{name}.log"), "w")
    proc = children.popen(
        ["redis-server", "--port", str(port), "--bind", host, "--save", "",
         "--appendonly", "no", "--dir", work, "--daemonize", "no", *extra],
        stdout=log, stderr=subprocess.STDOUT, own_session=True)
    proc.work_dir = work  # removed once it has stopped
    deadline = time.time() + 10
    while True:
        try:
            if resp(port, "PING", host=host) == "PONG":
                return proc, port
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            children.stop(proc)
            sys.exit(f"redis-server did not start (see {log.name})")
        time.sleep(0.1)


def favour(proc, nice=-10):
    """Gives `proc`'s session (started with `own_session`) a larger share of
    the CPU. Every node waits on Redis: when each node still had a session
    of its own, Redis got about one hundredth of the two cores, stalled
    past the nodes' 5 s `redis_timeout`, and a million-subscriber run lost
    its Redis links (docs/benchmarks.md). In production Redis has cores of
    its own; here its session gets the weight of nice -10, about nine
    sessions' worth. Returns whether it could (it needs root, or
    CAP_SYS_NICE)."""
    try:
        with open(f"/proc/{proc.pid}/autogroup", "w") as f:
            f.write(str(nice))
        return True
    except OSError:
        return False


# ---- network namespace --------------------------------------------------------

CLONE_NEWNET = 0x40000000
# Per-namespace settings a new namespace would start at their defaults:
# copied from the host's, so a box tuned for the run stays tuned.
NETNS_SYSCTLS = ("net/core/somaxconn", "net/ipv4/ip_local_port_range", "net/ipv4/tcp_rmem",
                 "net/ipv4/tcp_wmem", "net/ipv4/tcp_max_syn_backlog", "net/ipv4/tcp_tw_reuse",
                 "net/ipv4/tcp_fin_timeout", "net/ipv4/tcp_syncookies", "net/ipv4/tcp_congestion_control")
EHASH_KNOB = "/proc/sys/net/ipv4/tcp_child_ehash_entries"


def enter_netns(ehash):
    """Moves this script, and so everything it starts from now on, into a
    network namespace of its own: loopback up, the host's per-namespace
    settings copied, and a TCP established-connection hash table of
    `ehash` buckets (net.ipv4.tcp_child_ehash_entries, read when a
    namespace is made; the host's value is put back at once). Needs root.

    Why a bench would want it: the host's table is sized at boot (262,144
    buckets on this 24 GiB box), so two million loopback sockets chain
    about eight deep on every packet's lookup. A million-subscriber
    broadcast took 8.6 s in the host's namespace and 6.9 s in one of 2^21
    buckets (docs/benchmarks.md, "The million"). Returns what was done,
    for the report."""
    kept = {}
    for knob in NETNS_SYSCTLS:
        try:
            with open(f"/proc/sys/{knob}") as f:
                kept[knob] = f.read().strip()
        except OSError:
            pass
    libc = ctypes.CDLL(None, use_errno=True)
    # Opened before the namespace changes, so the write after it reaches
    # the host's setting, not the new namespace's.
    fd = os.open(EHASH_KNOB, os.O_RDWR)
    try:
        host_ehash = os.pread(fd, 64, 0).decode().strip()
        os.pwrite(fd, str(ehash).encode(), 0)
        try:
            if libc.unshare(CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)} (needs root)")
        finally:
            os.pwrite(fd, host_ehash.encode(), 0)
    finally:
        os.close(fd)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for knob, value in kept.items():
        try:
            with open(f"/proc/sys/{knob}", "w") as f:
                f.write(value)
        except OSError:
            pass  # not per-namespace on this kernel: the host's applies
    return {"ehash_buckets": ehash, "host_ehash_setting": host_ehash, "copied": kept}


def start_node(children, binary, flags, listen="127.0.0.1:0", admin="127.0.0.1:0", log=None):
    """Starts `myriad serve` with a data directory of its own; returns
    (process, ws address, admin address) once it is listening."""
    data_dir = tempfile.mkdtemp(prefix="myriad-")
    proc = children.popen(
        [binary, "serve", "--listen", listen, "--admin-listen", admin, *flags],
        stdout=subprocess.PIPE, stderr=log or subprocess.DEVNULL,
        env={**os.environ, "MYRIAD_LOG": "warn", "MYRIAD_DATA_DIR": data_dir})
    proc.data_dir = data_dir
    line = proc.stdout.readline()
    if not line:
        children.stop(proc)
        raise RuntimeError(f"myriad serve {' '.join(flags)} exited before listening (exit {proc.returncode})")
    ready = json.loads(line)
    return proc, ready["ws"], ready["admin"]


def metrics(admin, key=None):
    """A node's Prometheus counters, by name with labels (`key`: the
    node's admin key, when it has one)."""
    req = urllib.request.Request(f"http://{admin}/metrics")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


# ---- /proc -----------------------------------------------------------------


def stat_fields(pids=None):
    """(pid, fields of /proc/<pid>/stat after the command's name) of every
    process now, or of `pids`: fields[0] is the state (proc(5) field 3),
    fields[1] the ppid, fields[2] the process group, and so on."""
    if pids is None:
        pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                yield pid, f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue


def processes():
    """{pid: (ppid, nice, utime + stime in ticks, rss bytes)} of every
    process now."""
    # proc(5) fields 14 and 15 (utime, stime), 19 (nice), 24 (rss).
    return {pid: (int(f[1]), int(f[16]), int(f[11]) + int(f[12]), int(f[21]) * PAGE)
            for pid, f in stat_fields()}


def descendants(procs, root):
    """`root` and every process below it in `procs` (from `processes()`)."""
    children = {}
    for pid, (ppid, *_) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            out.add(pid)
        todo.extend(children.get(pid, []))
    return out


def sockstat():
    """/proc/net/sockstat's TCP line, and all sockets: {"sockets_used",
    "inuse", "orphan", "tw", "alloc", "mem_pages", "mem_bytes"}."""
    out = {}
    with open("/proc/net/sockstat") as f:
        for line in f:
            kind, _, rest = line.partition(":")
            values = rest.split()
            pairs = dict(zip(values[::2], (int(v) for v in values[1::2])))
            if kind == "sockets":
                out["sockets_used"] = pairs.get("used", 0)
            elif kind == "TCP":
                out.update({k: pairs.get(k, 0) for k in ("inuse", "orphan", "tw", "alloc")})
                out["mem_pages"] = pairs.get("mem", 0)
    out["mem_bytes"] = out.get("mem_pages", 0) * PAGE
    return out
