#!/usr/bin/env python3
"""Issue 12's CPU figure as a distribution: `make bench-cpu`.

One A-only run of `bench_host` (1 000 watchers in 100 streams over 5 connections, 500 puts/s
for 20 s, a fresh etcd per run) gives watchcache's µs per delivery, but on a shared 2-core VM
that figure moves by up to 50 % within an hour with the same binary. So this runs it RUNS times
and prints the median, the quartiles and the extremes; with BASE (another watchcache binary) the
two binaries take turns run by run, so that the machine's drift falls on both alike, and the
median of the per-pair ratios is printed too. BASE may be the same binary: --args and
--base-args (each passed to `watchcache serve` as BENCH_WATCHCACHE_ARGS) then compare two
settings, e.g. --base-args "--worker-threads 1".

A run that lost or duplicated an event, or did not drain, fails the whole command: a CPU figure
of a run that did not deliver everything is not a figure.

Usage: cpu_runs.py --bench <bench_host> --etcd <etcd> --runs N --bin <watchcache> [--args FLAGS]
                   [--base <watchcache> [--base-args FLAGS]]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def one_run(bench, etcd, binary, flags, out):
    env = dict(os.environ, BENCH_ETCD=etcd, BENCH_WATCHCACHE=binary, BENCH_OUT=out)
    env["BENCH_WATCHCACHE_ARGS"] = flags
    cmd = [bench, "--targets", "watchcache", "--big-watchers", "0"]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:])
        raise SystemExit(f"bench_host failed (exit {p.returncode}) for {binary}")
    with open(out) as f:
        a = json.load(f)["targets"]["watchcache"]["A"]
    problems = [k for k in ("missing", "duplicates", "gaps") if a.get(k)]
    if not a.get("drained"):
        problems.append("not drained")
    if problems:
        raise SystemExit(f"run of {binary} is not a figure: {', '.join(problems)} ({a})")
    return a


def quartiles(xs):
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def describe(name, runs):
    us = [r["target_us_per_delivery"] for r in runs]
    cpu = [r["server_cpu_seconds_per_million_deliveries"] for r in runs]
    q1, q3 = quartiles(us)
    return (
        f"| {name} | {len(us)} | {statistics.median(us):.3f} | {q1:.3f}–{q3:.3f} | "
        f"{min(us):.2f}–{max(us):.2f} | {statistics.median(cpu):.2f} |"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--base")
    ap.add_argument("--args", default="", help="flags for this build's `watchcache serve`")
    ap.add_argument("--base-args", default="", help="flags for BASE's `watchcache serve`")
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1")
    for b in [args.bench, args.etcd, args.bin] + ([args.base] if args.base else []):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"not an executable: {b}")
    if args.base_args and not args.base:
        raise SystemExit("--base-args needs --base")
    targets = [("this build", args.bin, args.args)]
    if args.base:
        targets.append(("BASE", args.base, args.base_args))
    for name, binary, flags in targets:
        print(f"{name}: {binary} {flags}".rstrip(), flush=True)
    results = {name: [] for name, _, _ in targets}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            # Pairs alternate which binary goes first (the first after etcd's start tends to
            # differ a little).
            order = targets if i % 2 == 0 else targets[::-1]
            for name, binary, flags in order:
                a = one_run(args.bench, args.etcd, binary, flags, os.path.join(tmp, "out.json"))
                results[name].append(a)
                print(
                    f"run {i + 1}/{args.runs} {name}: {a['target_us_per_delivery']:.3f} µs per delivery, "
                    f"{a['server_cpu_seconds_per_million_deliveries']:.2f} CPU s per 1 M with etcd",
                    flush=True,
                )
    ended = time.strftime("%H:%M UTC", time.gmtime())
    print()
    print(f"A-only runs, {started}–{ended}, load average at the end {os.getloadavg()[0]:.2f}")
    print()
    print("| server | runs | µs per delivery, median | quartiles | range | CPU s per 1 M with etcd, median |")
    print("|---|---|---|---|---|---|")
    for name, _, _ in targets:
        print(describe(name, results[name]))
    if args.base:
        ratios = [
            a["target_us_per_delivery"] / b["target_us_per_delivery"]
            for a, b in zip(results["this build"], results["BASE"])
        ]
        q1, q3 = quartiles(ratios)
        print()
        print(
            f"this build / BASE, pair by pair: median {statistics.median(ratios):.3f} "
            f"(quartiles {q1:.3f}–{q3:.3f}, range {min(ratios):.3f}–{max(ratios):.3f})"
        )
    med = statistics.median(r["target_us_per_delivery"] for r in results["this build"])
    print()
    print(f"issue 12's ≤ 0.4 µs per delivery, median of {args.runs}: {med:.3f} {'✔' if med <= 0.4 else '✘'}")


if __name__ == "__main__":
    main()
