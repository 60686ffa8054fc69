#!/usr/bin/env python3
"""The scale proof's test (scripts/test.sh runs it): `scripts/scale.py
smoke` twice against the release binary, counts only.

1. Interrupted: Ctrl-C (SIGINT) once the bench has its subscribers set
   up; the script must exit non-zero and every process it started (Redis,
   the nodes, the bench and its workers, as listed in pids.json) must be
   gone.
2. Whole: 2,000 subscribers over 2 nodes and Redis for 10 s; scale.json
   must show a box check whose rows are `myriad doctor --json`'s, in
   order, the port row asked for the bench's sources, every subscriber
   set up, deliveries owed > 0, 0 lost, nothing beyond what was owed,
   the bench's report exact, and no process left behind, which is
   checked here again from /proc after the script exited.

    python3 scripts/scale_smoke.py PATH/TO/release/myriad [OUT_DIR]
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SCALE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale.py")


def alive(pids):
    """The pids still running (zombies are not)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(pid)
        except OSError:
            pass
    return out


def fail(what):
    sys.exit(f"scale_smoke: FAILED: {what}")


def interrupted(binary, out):
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.Popen([sys.executable, SCALE, "smoke", "--myriad", binary, "--out", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = os.path.join(out, "bench.log")
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with open(log) as f:
                if "subscribers set up" in f.read():
                    break
        except OSError:
            pass
        if proc.poll() is not None:
            fail(f"scale.py smoke ended before it was interrupted:\n{proc.stderr.read()}")
        time.sleep(0.2)
    else:
        proc.kill()
        fail("the bench did not set its subscribers up within 30 s")
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        fail("scale.py did not stop within 60 s of SIGINT")
    with open(os.path.join(out, "pids.json")) as f:
        pids = json.load(f)
    if proc.returncode == 0:
        fail("an interrupted run exited 0")
    # Redis, 2 nodes, the bench and its 2 workers.
    if len(pids) < 6:
        fail(f"pids.json lists {len(pids)} processes, expected at least 6: {pids}")
    left = alive(pids)
    if left:
        fail(f"processes left behind after SIGINT: {left}\n{err}")
    print(f"scale_smoke: interrupted run stopped all {len(pids)} processes")


def whole(binary, out):
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, SCALE, "smoke", "--myriad", binary, "--out", out],
                          capture_output=True, text=True, timeout=300)
    try:
        with open(os.path.join(out, "scale.json")) as f:
            result = json.load(f)
    except OSError:
        fail(f"no scale.json (exit {done.returncode}):\n{done.stderr}")
    f = result["figures"]
    # The box check judges nothing itself: its rows are the doctor's, in
    # order, and the shared ones were asked for the whole run (clients here).
    doctor = subprocess.run([binary, "doctor", "--json", "--connections", "1"],
                            capture_output=True, text=True, timeout=60)
    rows = [c["name"] for c in json.loads(doctor.stdout)["checks"]]
    box = {b["what"]: b["detail"] for b in result["box_check"]}
    checks = [
        ([b["what"] for b in result["box_check"]] == rows,
         f"the box check's rows are not the doctor's: {list(box)} vs {rows}"),
        ("the clients have 254" in box.get("net.ipv4.ip_local_port_range", ""),
         f"the port row was not asked for the bench's sources: {box.get('net.ipv4.ip_local_port_range')}"),
        (done.returncode == 0, f"scale.py exited {done.returncode}: {result['verdict']['problems']}"),
        (f.get("subscribed") == 2000, f"subscribed {f.get('subscribed')} of 2000"),
        ((f.get("expected") or 0) > 0, f"no deliveries owed: {f.get('expected')}"),
        (f.get("lost") == 0, f"lost {f.get('lost')}"),
        (f.get("received") == f.get("expected"), f"received {f.get('received')} of {f.get('expected')}"),
        (f.get("replay_exact") is True, "the bench's expected deliveries are not exact"),
        (result["left_behind"] == [], f"left behind: {result['left_behind']}"),
        (not alive(result["pids"]), f"still running after exit: {alive(result['pids'])}"),
        (len(result["figures"]["rss"]["nodes"]) == 2, "not two nodes' RSS"),
    ]
    for ok, what in checks:
        if not ok:
            fail(f"{what}\n{done.stderr[-4000:]}")
    print(f"scale_smoke: {f['received']:,} of {f['expected']:,} delivered, 0 lost, "
          f"{len(result['pids'])} processes started and stopped")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary = os.path.abspath(sys.argv[1])
    base = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="scale-smoke-")
    interrupted(binary, os.path.join(base, "interrupted"))
    whole(binary, os.path.join(base, "whole"))


if __name__ == "__main__":
    main()
