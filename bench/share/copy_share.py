#!/usr/bin/env python3
"""Two `tensile rerun` jobs that swap beside each other on one shared simulated card, their
plans counting on the whole copy engines each (`TENSILE_COPY_SHARE=off`) or on an equal share
(`on`, the coordinator's default): docs/sharing.md, "Copy engines shared in the plans".

    cargo build --release -p tensile-tools -p tensile-simgpu -p tensile-preload
    python3 bench/share/copy_share.py [--iterations 3] [--budget 50%] [--card-memory 2.2GiB]

Each job is limited to --budget of its own peak (its TENSILE_DEVICE_MEMORY), so both fit the
card and both swap all the time: the copy engines are what they share. Reported per job and
setting: its measured steady-state step (median, trace time) and bytes each way per
iteration, and each setting's wall time; every stamp must verify.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACES = Path(os.environ.get("TENSILE_SHARED_TRACES", ROOT.parent / "shared" / "traces"))
JOBS = [("mlp", 4), ("resnet50", 4)]


def start(tensile, trace, scale, args, card, share):
    cmd = [
        str(tensile), "rerun", str(TRACES / f"{trace}.trace.gz"),
        "--simulated", "--json", "--policy", "plan",
        "--iterations", str(args.iterations), "--scale", str(scale),
        "--budget", args.budget, "--card", card, "--card-memory", args.card_memory,
    ]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    # The first job starts the card's coordinator, which inherits this.
    env["TENSILE_COPY_SHARE"] = share
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--budget", default="50%")
    ap.add_argument("--card-memory", default="2.2GiB")
    ap.add_argument("--tensile", default=str(ROOT / "target" / "release" / "tensile"))
    args = ap.parse_args()
    tensile = Path(args.tensile)
    if not tensile.exists():
        sys.exit(f"{tensile}: not built (cargo build --release -p tensile-tools "
                 "-p tensile-simgpu -p tensile-preload)")
    rows = []
    for share in ["off", "on"]:
        card = f"copyshare-{share}-{os.getpid()}"
        began = time.monotonic()
        procs = [(t, start(tensile, t, s, args, card, share)) for t, s in JOBS]
        for trace, p in procs:
            out, err = p.communicate()
            if p.returncode != 0:
                sys.exit(f"{trace} ({share}): tensile rerun failed ({p.returncode}):\n"
                         f"{err[-3000:]}")
            run = json.loads(out)["runs"][0]
            if not run["verified"]:
                sys.exit(f"{trace} ({share}): a stamp failed")
            rows.append((share, trace, run))
        wall = time.monotonic() - began
        rows.append((share, "(wall)", wall))
        log = Path(tempfile.gettempdir()) / f"tensile-coordinator-{os.getuid()}-{card}.log"
        print(f"copy share {share}: coordinator log {log}", file=sys.stderr)
    print(f"{'share':<6} {'job':<10} {'step':>11} {'H2D/iter':>10} {'D2H/iter':>10} "
          f"{'stall/iter':>11} {'stamps':>8}")
    for share, trace, run in rows:
        if trace == "(wall)":
            print(f"{share:<6} {'wall':<10} {run:>10.1f}s")
            continue
        gib = float(1 << 30)
        print(f"{share:<6} {trace:<10} {run['step_ns'] / 1e6:>8.2f} ms "
              f"{run['bytes_h2d'] / gib:>6.2f} GiB {run['bytes_d2h'] / gib:>6.2f} GiB "
              f"{run['stall_ns'] / 1e6:>8.2f} ms {run['stamps_checked']:>8}")


if __name__ == "__main__":
    main()
