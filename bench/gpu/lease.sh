#!/usr/bin/env bash
# Everything that needs a GPU, in one device call, most important first, inside a deadline.
#
#   LEASE_SECONDS=540 OUT=/tmp/out bash bench/gpu/lease.sh [GROUP...]
#
# Groups, in the order they run (default: all): probe (nvidia-smi, the kernels' PTX against
# their CPU twins, what the driver's VMM accepts: vmm_probe.py), vmmsync (whether VMM and
# pinning calls wait for the GPU's queued work: vmm_sync_probe.py), gate, gpt2trace (GPT-2 at
# 6 GiB under lru and under plan, traced with the library's records), nopressure, overhead
# (the shim's cost without pressure, part by part), steady (the same over 40 steps, with CPU
# seconds per thread), pressure, unmapped (the pressure runs with
# TENSILE_SWAPPED=unmapped), alloc, rerun, peers, ipc (a CUDA tensor shared with a child
# process through torch.multiprocessing under a budget: ipc_check.py), traced.
#
# Binaries come from $TENSILE_BIN (default target/release): libtensile.so, tensile, libcuda.so
# (the simulator, which `tensile rerun` wants beside it even on a GPU), wl_allocbench, gpu_check.
# Traces for `tensile rerun` from $TENSILE_TRACES (default ../shared/traces). Build them here
# and carry them (bench/gpu/README.md, "Runbook").
#
# The gate trains a small MLP under the shim with a budget; if the shim cannot, nothing after
# it can run, so the script stops there and keeps the rest of the lease for a second try.
# Then ResNet-50 and GPT-2 without pressure (the shim's cost), GPT-2 at 6 GiB and ResNet-50 at
# 2 GiB under the plan and under LRU (issue 11's check), the arena against the driver's
# allocator, `tensile rerun` of the recorded steps (the simulator against the card), what users
# do today (activation checkpointing, save_on_cpu), a traced run. Each step's time is capped by
# what is left of the deadline; a step that would not fit is skipped and says so. Results:
# $OUT/summary.txt (a table), results.jsonl (one object per training run), logs.txt (the
# first and last lines of every run's stderr, then the coordinators' logs), alloc_bench.txt,
# rerun.txt, trace-info.txt (`tensile trace-info` of each traced run) and traces.tar (the
# traces, gzipped): 7 files, what a device call brings back.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=$(realpath "${TENSILE_BIN:-target/release}")
TRACES=${TENSILE_TRACES:-../shared/traces}
TRAIN=${TENSILE_TRAIN_PY:-bench/gpu/train.py}
OUT=${OUT:-/tmp/tensile-lease}
WORK=$(mktemp -d /tmp/tensile-lease.XXXX)
DEADLINE=$(($(date +%s) + ${LEASE_SECONDS:-540}))
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# One allocation per tensor, as the shim sets it anyway (GPU_FACTS.md); natives get it too.
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync

say() { echo "$*" | tee -a "$OUT/summary.txt"; }
left() { echo $((DEADLINE - $(date +%s))); }

# step NAME MAX_SECONDS COMMAND...: runs COMMAND with stdout to $WORK/NAME.out and stderr to
# $WORK/NAME.err, for at most MAX_SECONDS and never past the deadline.
step() {
    local name=$1 max=$2
    shift 2
    local room=$(($(left) - 5))
    local limit=$((max < room ? max : room))
    if ((limit < 15)); then
        say "skipped $name: ${room}s left"
        return 99
    fi
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
    local rc=$?
    say "$(printf '%-28s rc %-3s %4ss' "$name" "$rc" $((SECONDS - t0)))$( ((rc == 124 || rc == 137)) && echo " (timed out at ${limit}s)")"
    {
        echo "=== $name (rc $rc)"
        # The first lines say why a run went wrong; the last ones what it did in the end.
        if (($(wc -l <"$WORK/$name.err") > 80)); then
            head -n 40 "$WORK/$name.err"
            echo "[...]"
            tail -n 40 "$WORK/$name.err"
        else
            cat "$WORK/$name.err"
        fi
    } >>"$OUT/logs.txt"
    return $rc
}

# train NAME MODEL [VAR=VALUE...] -- [train.py args...]: one training run; under the shim when
# a VAR is TENSILE_*. Its JSON line goes to results.jsonl with the run's name.
train() {
    local name=$1 model=$2
    shift 2
    local envs=()
    while (($#)) && [[ $1 != -- ]]; do
        envs+=("$1")
        shift
    done
    (($#)) && shift
    local pre=()
    [[ " ${envs[*]} " == *" TENSILE_"* ]] && pre=(LD_PRELOAD="$BIN/libtensile.so" TENSILE_LOG=info)
    step "$name" "${MAX_RUN:-120}" env "${pre[@]}" "${envs[@]}" \
        python3 "$TRAIN" --model "$model" --deterministic --label "$name" "$@"
    local rc=$?
    python3 - "$WORK/$name.out" "$name" "$rc" >>"$OUT/results.jsonl" <<'PY'
import json, sys
path, name, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
line = next((l for l in open(path) if l.startswith("{")), None)
r = json.loads(line) if line else {}
r.update(run=name, rc=rc)
print(json.dumps(r))
PY
    return $rc
}

groups=("$@")
((${#groups[@]})) || groups=(probe vmmsync gate gpt2trace nopressure overhead steady pressure unmapped alloc rerun peers ipc traced)
wants() { [[ " ${groups[*]} " == *" $1 "* ]]; }

say "lease started $(date -u +%FT%TZ), deadline in $(left)s, groups: ${groups[*]}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
python3 -c 'import torch, sys; print("torch", torch.__version__, torch.cuda.get_device_name(0), "python", sys.version.split()[0])' | tee -a "$OUT/summary.txt"

if wants probe; then
    step gpu_check 60 "$BIN/gpu_check"
    tail -n 3 "$WORK/gpu_check.out" | tee -a "$OUT/summary.txt"
    step vmm_probe 60 python3 bench/gpu/vmm_probe.py
    tee -a "$OUT/summary.txt" <"$WORK/vmm_probe.out"
fi

if wants vmmsync; then
    step vmm_sync_probe 60 python3 bench/gpu/vmm_sync_probe.py
    tee -a "$OUT/summary.txt" <"$WORK/vmm_sync_probe.out"
fi

# The gate: an MLP natively and under the shim, swapping on demand (a 2 GiB budget of its
# 5 GiB). If the shim cannot train it, nothing after can run: stop, and keep the rest of the
# lease for a second try.
if wants gate; then
    train mlp-native mlp -- --steps 4
    if ! train mlp-lru-2GiB mlp TENSILE_POLICY=lru TENSILE_DEVICE_MEMORY=2GiB -- --steps 4; then
        say "the shim could not train the MLP under pressure: stopping here (see logs.txt)"
        exit 1
    fi
fi

# traced NAME MODEL [VAR=VALUE...] -- [train.py args...]: a training run under the shim with
# TENSILE_TRACE; its `tensile trace-info` report goes to trace-info.txt and its trace, gzipped,
# to traces.tar at the end.
mkdir -p "$WORK/traces"
traced() {
    local name=$1 model=$2
    shift 2
    train "$name" "$model" TENSILE_TRACE="$WORK/$name.trace" "$@" || return
    {
        echo "=== $name"
        "$BIN/tensile" trace-info "$WORK/$name.trace" 2>&1
    } >>"$OUT/trace-info.txt"
    gzip -c "$WORK/$name.trace" >"$WORK/traces/$name.trace.gz"
}

# GPT-2 at 6 GiB traced (the library's swaps, host time per thread and plans are in the trace):
# under lru it ran at 1.7 s a step on the H200 of session 22 against 0.87 s on the H100 of
# session 15, and under plan the step the plan took effect took 11 s (docs/gpu-results.md).
# The traces also let `tensile rerun` play GPT-2 on the simulated GPU.
if wants gpt2trace; then
    MAX_RUN=150 traced gpt2-lru-6GiB-traced gpt2 TENSILE_POLICY=lru TENSILE_DEVICE_MEMORY=6GiB -- --warmup 3 --steps 4
    MAX_RUN=150 traced gpt2-plan-6GiB-traced gpt2 TENSILE_POLICY=plan TENSILE_DEVICE_MEMORY=6GiB -- --warmup 4 --steps 4
fi

if wants nopressure; then
    train resnet50-native resnet50 --
    train resnet50-shim resnet50 TENSILE_POLICY=plan --
    train gpt2-native gpt2 --
fi

# Where the shim's cost without pressure goes (ResNet-50 makes about 1,130 launches a step):
# interception and tracking alone (off), the memory manager (lru), the plan executor and the
# planning thread in the process (plan, coordinator off), and the coordinator's event ring.
if wants overhead; then
    train resnet50-native resnet50 --
    train resnet50-off resnet50 TENSILE_POLICY=off --
    train resnet50-lru resnet50 TENSILE_POLICY=lru --
    train resnet50-plan-alone resnet50 TENSILE_POLICY=plan TENSILE_COORDINATOR=off --
    train resnet50-plan resnet50 TENSILE_POLICY=plan --
fi

# The same at steady state (40 steps after 6 of warm-up: learning and planning are over), with
# each thread's CPU seconds in the JSON line (`cpu_s_by_thread`): whether the planning thread,
# a coordinator or the launching thread itself costs the time.
if wants steady; then
    echo "profilers here: $(command -v perf py-spy gdb | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
    for run in native:: lru:TENSILE_POLICY=lru plan-alone:TENSILE_POLICY=plan:TENSILE_COORDINATOR=off plan:TENSILE_POLICY=plan; do
        IFS=: read -r label envs <<<"$run"
        # shellcheck disable=SC2086
        train "resnet50-$label-steady" resnet50 ${envs//:/ } -- --warmup 6 --steps 40
    done
fi

if wants pressure; then
    MAX_RUN=150 train gpt2-plan-6GiB gpt2 TENSILE_POLICY=plan TENSILE_DEVICE_MEMORY=6GiB -- --warmup 4 --steps 6
    MAX_RUN=150 train gpt2-lru-6GiB gpt2 TENSILE_POLICY=lru TENSILE_DEVICE_MEMORY=6GiB -- --warmup 4 --steps 6
    train resnet50-plan-2GiB resnet50 TENSILE_POLICY=plan TENSILE_DEVICE_MEMORY=2GiB -- --warmup 4 --steps 6
    train resnet50-lru-2GiB resnet50 TENSILE_POLICY=lru TENSILE_DEVICE_MEMORY=2GiB -- --warmup 4 --steps 6
fi

# The same with swapped-out pages left unmapped (TENSILE_SWAPPED=unmapped): 40% of the VMM
# calls per page moved, and a fault instead of a slow access where the shim did not foresee one.
if wants unmapped; then
    MAX_RUN=150 train gpt2-plan-6GiB-unmapped gpt2 TENSILE_POLICY=plan TENSILE_DEVICE_MEMORY=6GiB TENSILE_SWAPPED=unmapped -- --warmup 4 --steps 6
    train resnet50-plan-2GiB-unmapped resnet50 TENSILE_POLICY=plan TENSILE_DEVICE_MEMORY=2GiB TENSILE_SWAPPED=unmapped -- --warmup 4 --steps 6
fi

if wants alloc; then
    CARGO_TARGET_DIR=$(dirname "$BIN") step alloc_bench 60 bash bench/gpu/alloc_bench.sh 2000
    cp "$WORK/alloc_bench.out" "$OUT/alloc_bench.txt"
fi

if wants rerun; then
    # RERUN_BUDGETS="50% 30%" for both of issue 11's budgets, RERUN_TRACES="resnet50" for
    # one trace (default: mlp resnet50 bert). BERT's step is 4 times the others', so it
    # plays 4 iterations where they play 6.
    for budget in ${RERUN_BUDGETS:-50%}; do
        for t in ${RERUN_TRACES:-mlp resnet50 bert}; do
            [[ -f $TRACES/$t.trace.gz ]] || continue
            iterations=6
            [[ $t == bert ]] && iterations=4
            step "rerun-$t-${budget%\%}" 150 "$BIN/tensile" rerun "$TRACES/$t.trace.gz" --budget "$budget" --policy all --iterations $iterations
            cat "$WORK/rerun-$t-${budget%\%}.out" >>"$OUT/rerun.txt"
        done
    done
fi

if wants peers; then
    train gpt2-checkpoint gpt2 -- --peer checkpoint
    train gpt2-save_on_cpu gpt2 -- --peer save_on_cpu
    train resnet50-save_on_cpu resnet50 -- --peer save_on_cpu
    train resnet50-checkpoint resnet50 -- --peer checkpoint
fi

if wants ipc; then
    # PyTorch's cudaMallocAsync backend refuses CUDA IPC itself; a program that shares CUDA
    # tensors names the native one, which the shim keeps.
    step ipc-native 180 env LD_PRELOAD="$BIN/libtensile.so" TENSILE_DEVICE_MEMORY=2GiB \
        PYTORCH_CUDA_ALLOC_CONF=backend:native python3 bench/gpu/ipc_check.py
    say "ipc-native: $(tail -n 1 "$WORK/ipc-native.out" 2>/dev/null)"
fi

if wants traced; then
    traced resnet50-traced resnet50 TENSILE_POLICY=plan --
fi

if compgen -G "$WORK/traces/*" >/dev/null; then
    tar -C "$WORK/traces" -cf "$OUT/traces.tar" .
fi
# A coordinator logs what it planned and why it did not, in its own file.
for log in /tmp/tensile-coordinator-*.log; do
    [[ -f $log ]] || continue
    echo "=== $log"
    tail -n 60 "$log"
done >>"$OUT/logs.txt"

[[ -f $OUT/results.jsonl ]] && python3 - "$OUT/results.jsonl" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
by = {r["run"]: r for r in runs}
print(f"\n{'run':<24} {'rc':>3} {'median ms':>10} {'x native':>9} {'peak GiB':>9} {'losses = native':>16}")
for r in runs:
    model = r["run"].split("-")[0]
    base = by.get(f"{model}-native", {})
    ms, nms = r.get("median_step_ms"), base.get("median_step_ms")
    ratio = f"{ms / nms:.3f}" if ms and nms else "-"
    a, b = r.get("losses", []), base.get("losses", [])
    n = min(len(a), len(b))
    same = "-" if not n or r is base else str(a[:n] == b[:n])
    peak = r.get("peak_allocated_gib")
    print(f"{r['run']:<24} {r['rc']:>3} {ms or 0:>10.1f} {ratio:>9} {peak or 0:>9.2f} {same:>16}")
PY
say "lease ended $(date -u +%FT%TZ), $(left)s before the deadline"
