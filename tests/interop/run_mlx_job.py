#!/usr/bin/env python3
"""Run a pure-MLX ring job on loopback: NRANKS copies of mlx_rank.py.

    python run_mlx_job.py PLAN NRANKS CONNS OUTDIR [--timeout SECONDS] [--python EXE]

Reserves NRANKS*CONNS loopback ports, writes OUTDIR/hostfile.json (rank r's entry
holds CONNS "127.0.0.1:port" strings), starts every rank with MLX_HOSTFILE and
MLX_RANK set, and waits. Each rank writes OUTDIR/rank<r>.txt (see mlx_rank.py)
and its stdout/stderr to OUTDIR/rank<r>.log. If any rank fails, or the job
outlives the timeout (default 120 s), every rank still running is killed, the
logs of the failed ranks are printed to stderr and the exit status is 1.

On success the results of the collectives (all_sum/all_max/all_min/all_gather)
are also checked to be identical on every rank. Run it with the venv's python
(.venv/bin/python): the ranks use the same interpreter unless --python is given.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_SCRIPT = os.path.join(HERE, "mlx_rank.py")
COLLECTIVES = {"all_sum", "all_max", "all_min", "all_gather"}


def reserve_ports(count):
    """Distinct free loopback ports (bound together, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_hostfile(path, nranks, conns):
    ports = reserve_ports(nranks * conns)
    hosts = [
        [f"127.0.0.1:{ports[r * conns + c]}" for c in range(conns)] for r in range(nranks)
    ]
    with open(path, "w") as f:
        json.dump(hosts, f)
    return hosts


def kill(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def run_job(plan, nranks, conns, outdir, timeout=120.0, python=sys.executable, extra_env=None):
    """Returns (ok, message). Leaves OUTDIR/rank<r>.txt and .log."""
    os.makedirs(outdir, exist_ok=True)
    hostfile = os.path.join(outdir, "hostfile.json")
    write_hostfile(hostfile, nranks, conns)
    procs, logs = [], []
    for r in range(nranks):
        env = dict(os.environ)
        env.update(extra_env or {})
        env["MLX_HOSTFILE"] = hostfile
        env["MLX_RANK"] = str(r)
        log = open(os.path.join(outdir, f"rank{r}.log"), "w")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [python, RANK_SCRIPT, plan, os.path.join(outdir, f"rank{r}.txt")],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group, so kill() gets everything
            )
        )
    deadline = time.monotonic() + timeout
    failed, reason = [], None
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                reason = "rank(s) %s exited with %s" % (failed, [codes[r] for r in failed])
                break
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                failed = [r for r, c in enumerate(codes) if c is None]
                reason = f"timeout after {timeout:g}s; still running: rank(s) {failed}"
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            kill(p)
        for log in logs:
            log.close()
    if reason is None:
        return check_outputs(outdir, nranks)
    for r in failed:
        with open(os.path.join(outdir, f"rank{r}.log")) as f:
            text = f.read()
        print(f"---- rank {r} output ----\n{text.rstrip()}\n----", file=sys.stderr)
    return False, reason


def read_lines(path):
    out = {}
    with open(path) as f:
        for line in f:
            index, op, dtype, value = line.split()
            out[int(index)] = (op, dtype, value)
    return out


def check_outputs(outdir, nranks):
    results = [read_lines(os.path.join(outdir, f"rank{r}.txt")) for r in range(nranks)]
    for index, (op, dtype, value) in sorted(results[0].items()):
        if op not in COLLECTIVES:
            continue
        for r in range(1, nranks):
            if results[r].get(index) != (op, dtype, value):
                return False, f"op {index} {op} {dtype}: rank {r} differs from rank 0"
    return True, "ok"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan")
    ap.add_argument("nranks", type=int)
    ap.add_argument("conns", type=int)
    ap.add_argument("outdir")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    t0 = time.monotonic()
    ok, msg = run_job(args.plan, args.nranks, args.conns, args.outdir, args.timeout, args.python)
    dt = time.monotonic() - t0
    print(f"run_mlx_job: R={args.nranks} C={args.conns}: {msg} ({dt:.1f}s)",
          file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
