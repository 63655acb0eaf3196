#!/usr/bin/env bash
# The GPU check of issues #2 and #4, run on the lent H100 from the repository root:
#   bash bench/gpu/check.sh [models...]        (default: resnet50 transformer)
# Needs target/release/libtensile.so and target/release/tensile (built elsewhere, carried).
# For each model: native (backend:cudaMallocAsync, as the shim sets it), under the shim with
# tracing off, and under the shim with TENSILE_TRACE; then trace-info on the trace.
# Under memory pressure (issue #4's check): the native run stays unlimited, the two shim runs
# get the budget, and the losses must still be equal bit for bit:
#   TENSILE_DEVICE_MEMORY=6GiB TENSILE_POLICY=lru bash bench/gpu/check.sh gpt2
#   TENSILE_DEVICE_MEMORY=2GiB TENSILE_POLICY=lru bash bench/gpu/check.sh resnet50
# Peers on the same H100 (GPU_FACTS.md), GPT-2 small: native 187 ms, activation
# checkpointing 234 ms, save_on_cpu 691 ms; ResNet-50: native 39.4 ms, save_on_cpu 380 ms.
set -uo pipefail
cd "$(dirname "$0")/../.."
LIB=$PWD/target/release/libtensile.so
TENSILE=$PWD/target/release/tensile
OUT=${OUT:-/tmp/tensile-gpu-check}
mkdir -p "$OUT"
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(resnet50 transformer)
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
for m in "${models[@]}"; do
  echo "== $m"
  python3 bench/gpu/train.py --model "$m" --deterministic --label native 2>"$OUT/$m-native.err" | tee "$OUT/$m-native.json"
  LD_PRELOAD=$LIB python3 bench/gpu/train.py --model "$m" --deterministic --label shim 2>"$OUT/$m-shim.err" | tee "$OUT/$m-shim.json"
  LD_PRELOAD=$LIB TENSILE_TRACE="$OUT/$m.trace" python3 bench/gpu/train.py --model "$m" --deterministic --label traced 2>"$OUT/$m-traced.err" | tee "$OUT/$m-traced.json"
  "$TENSILE" trace-info "$OUT/$m.trace" | tee "$OUT/$m.trace-info.txt"
done
python3 - "$OUT" "${models[@]}" <<'PY'
import json, sys
out, models = sys.argv[1], sys.argv[2:]
print(f"{'model':<12} {'native ms':>10} {'shim ms':>10} {'ratio':>7} {'traced ms':>10} {'losses equal':>13}")
for m in models:
    r = {k: json.load(open(f"{out}/{m}-{k}.json")) for k in ("native", "shim", "traced")}
    n, s, t = (r[k]["median_step_ms"] for k in ("native", "shim", "traced"))
    same = r["native"]["losses"] == r["shim"]["losses"] == r["traced"]["losses"]
    print(f"{m:<12} {n:>10.2f} {s:>10.2f} {s / n:>7.3f} {t:>10.2f} {str(same):>13}")
PY
