#!/usr/bin/env python3
"""Three `tensile rerun` jobs on one shared simulated card: alone, together, and together with
one of them at high priority. Prints the fairness table of docs/sharing.md.

Each job is a reduced rerun of a shared PyTorch trace (resnet50, bert, mlp), scaled so that it
needs about 60% of the card; all three together need about 180% of it, so they swap, and the
coordinator they start divides the card among them.

    cargo build --release -p tensile-tools -p tensile-simgpu
    cargo build --release -p tensile-preload
    python3 bench/share/three_jobs.py [--iterations 4] [--time-scale 16] [--card-memory 2.2GiB]
                                      [--bin DIR] [--together-only] [--keep-logs DIR]

Reported per job: wall time of the whole rerun (prologue, learning, the iterations, the final
check) and the median steady-state step (trace time), alone on the card and shared; the
slowdown is shared / alone. Every run must verify every stamp, or the script fails.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACES = Path(os.environ.get("TENSILE_SHARED_TRACES", ROOT.parent / "shared" / "traces"))
# Trace -> --scale: peaks of 5.70 (resnet50), 9.54 (bert) and 5.20 GiB (mlp) at trace size
# become 1.43, 1.19 and 1.30 GiB played: 65%, 54% and 59% of a 2.2 GiB card.
JOBS = [("resnet50", 4), ("bert", 8), ("mlp", 4)]


def start(tensile, trace, scale, args, card, priority=None):
    cmd = [
        str(tensile), "rerun", str(TRACES / f"{trace}.trace.gz"),
        "--simulated", "--json", "--policy", "plan",
        "--iterations", str(args.iterations),
        "--scale", str(scale), "--time-scale", str(args.time_scale),
        "--card", card, "--card-memory", args.card_memory,
    ]
    if priority:
        cmd += ["--priority", priority]
    # The players' logs, to tell a job that did not join the card's coordinator.
    logs = Path(args.keep_logs or tempfile.gettempdir()) / f"three-jobs-{card}-{trace}"
    cmd += ["--logs", str(logs)]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True)
    proc.logs = logs
    proc.keep_logs = bool(args.keep_logs)
    return proc


def finish(proc, trace, started):
    out, err = proc.communicate()
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"{trace}: tensile rerun failed ({proc.returncode}):\n{err[-3000:]}")
    # A job that could not join the coordinator planned alone, on the whole card: its figures
    # are not sharing's.
    for log in sorted(proc.logs.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "no coordinator" in line:
                print(f"warning: {trace} ({log.name}) ran without the card's coordinator: "
                      f"{line.strip()[:300]}", file=sys.stderr)
    if not proc.keep_logs:
        shutil.rmtree(proc.logs, ignore_errors=True)
    run = json.loads(out)["runs"][0]
    if run.get("verified") is not True:
        sys.exit(f"{trace}: stamps not verified: {run}")
    return {"wall": wall, "step_ms": run["step_ns"] / 1e6,
            "h2d": run.get("bytes_h2d", 0), "d2h": run.get("bytes_d2h", 0)}


def together(tensile, args, card, high=None):
    """Starts the three at once; each one's wall time ends when it exits (a thread per job
    waits for it)."""
    started = time.monotonic()
    procs = [(t, start(tensile, t, s, args, card, "high" if t == high else None))
             for t, s in JOBS]
    results, failures = {}, []

    def wait(trace, proc):
        try:
            results[trace] = finish(proc, trace, started)
        except SystemExit as e:
            failures.append(str(e))

    threads = [threading.Thread(target=wait, args=tp) for tp in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        sys.exit("\n".join(failures))
    return results, time.monotonic() - started


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--time-scale", type=float, default=16)
    ap.add_argument("--card-memory", default="2.2GiB")
    ap.add_argument("--high", default="resnet50", help="the job run at high priority")
    ap.add_argument("--bin", default=str(ROOT / "target" / "release"),
                    help="the directory of the tensile binary, libtensile.so and the simulated "
                         "libcuda.so to run (to compare builds)")
    ap.add_argument("--keep-logs", metavar="DIR",
                    help="keep each job's player logs (native/plan/plan-baseline.log) under DIR "
                         "instead of deleting them; the coordinators' logs are "
                         "/tmp/tensile-coordinator-0-CARD.log either way")
    ap.add_argument("--together-only", action="store_true",
                    help="only the three together (no alone runs, no priority run)")
    args = ap.parse_args()
    tensile = Path(args.bin) / "tensile"
    if not tensile.exists():
        sys.exit(f"no {tensile}: build it first (see the top of this script)")
    tag = f"bench{os.getpid()}"

    if args.together_only:
        shared, shared_wall = together(tensile, args, f"{tag}-shared")
        print(f"together: {shared_wall:.1f} s; " + ", ".join(
            f"{t} wall {r['wall']:.1f} s step {r['step_ms']:.1f} ms" for t, r in shared.items()))
        return

    alone = {}
    for trace, scale in JOBS:
        print(f"alone: {trace} ...", file=sys.stderr)
        started = time.monotonic()
        alone[trace] = finish(start(tensile, trace, scale, args, f"{tag}-alone-{trace}"),
                              trace, started)
    print("together ...", file=sys.stderr)
    shared, shared_wall = together(tensile, args, f"{tag}-shared")
    print(f"together, {args.high} at high priority ...", file=sys.stderr)
    prio, prio_wall = together(tensile, args, f"{tag}-prio", high=args.high)

    sum_alone = sum(r["wall"] for r in alone.values())
    print(f"card {args.card_memory}, --time-scale {args.time_scale}, "
          f"{args.iterations} iterations; wall times in s, steps in trace-time ms")
    print()
    print(f"{'job':<10} {'alone wall':>10} {'alone step':>10} {'shared wall':>11} "
          f"{'shared step':>11} {'slowdown':>8} {'prio wall':>9} {'prio step':>9} "
          f"{'slowdown':>8}")
    for trace, _ in JOBS:
        a, s, p = alone[trace], shared[trace], prio[trace]
        name = trace + (" (high)" if trace == args.high else "")
        print(f"{name:<10} {a['wall']:>10.1f} {a['step_ms']:>10.1f} {s['wall']:>11.1f} "
              f"{s['step_ms']:>11.1f} {s['wall'] / a['wall']:>8.2f} {p['wall']:>9.1f} "
              f"{p['step_ms']:>9.1f} {p['wall'] / a['wall']:>8.2f}")
    print()
    print(f"one after another (alone): {sum_alone:.1f} s; together: {shared_wall:.1f} s "
          f"({shared_wall / sum_alone:.2f}x); together with {args.high} high: "
          f"{prio_wall:.1f} s ({prio_wall / sum_alone:.2f}x)")
    h = args.high
    print(f"{h} at high priority: step {prio[h]['step_ms']:.1f} ms vs {alone[h]['step_ms']:.1f} "
          f"alone ({prio[h]['step_ms'] / alone[h]['step_ms']:.2f}x); wall "
          f"{prio[h]['wall'] / alone[h]['wall']:.2f}x")


if __name__ == "__main__":
    main()
