#!/usr/bin/env bash
# Allocation microbenchmark: the memory manager's no-pressure target ("allocation and free
# through the arena no slower than the driver's stream-ordered allocator"). Runs
# tests/src/bin/wl_allocbench.rs three ways and prints ns per alloc+free pair and the ratio
# to native, per API (async: cuMemAllocAsync/cuMemFreeAsync on one stream; sync:
# cuMemAlloc/cuMemFree) and case (512B, 64KiB, 2MiB, 64MiB, a PyTorch-like mix):
#   native    the driver alone
#   shim      LD_PRELOAD=libtensile.so (TENSILE_POLICY=lru: the arena serves allocations)
#   shim-off  LD_PRELOAD=libtensile.so with TENSILE_POLICY=off (forwarded to the driver and
#             tracked: the interception cost alone)
#
#   bash bench/gpu/alloc_bench.sh [rounds]        (default 2000)
#
# From the repository root or anywhere. Binaries: $CARGO_TARGET_DIR (default target)/release;
# they are built with cargo when cargo is on the PATH, else they must be there already
# (carried to a GPU machine). Simulated GPU: with TENSILE_BENCH_SIM=1, or when no
# nvidia-smi is found, the simulator's libcuda.so.1 is put on LD_LIBRARY_PATH (as the e2e
# tests do). ON THE SIMULATOR THE RATIO MEASURES ONLY THE SHIM'S OWN OVERHEAD against the
# simulator's allocator (bookkeeping on the CPU, nothing like the real driver's cost), not the
# target: the target is the ratio on a GPU. Extra settings pass through
# (TENSILE_DEVICE_MEMORY, TENSILE_SIM_DEVICE_MEMORY, ...).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
ROUNDS=${1:-2000}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET/release
SIM=${TENSILE_BENCH_SIM:-}
if [ -z "$SIM" ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then SIM=0; else SIM=1; fi
fi
libs=(-p tensile-preload)
[ "$SIM" = 1 ] && libs+=(-p tensile-simgpu)
if command -v cargo >/dev/null 2>&1; then
  # Two builds: `--bin` would restrict the library packages to binaries too.
  cargo build --quiet --release -p tensile-tests --bin wl_allocbench
  cargo build --quiet --release "${libs[@]}"
fi
for f in "$BIN/wl_allocbench" "$BIN/libtensile.so"; do
  [ -e "$f" ] || { echo "alloc_bench: $f is missing (build it, or set CARGO_TARGET_DIR)" >&2; exit 1; }
done
if [ "$SIM" = 1 ]; then
  [ -e "$BIN/libcuda.so" ] || { echo "alloc_bench: $BIN/libcuda.so (simulator) is missing" >&2; exit 1; }
  mkdir -p "$BIN/simgpu"
  ln -sf "$BIN/libcuda.so" "$BIN/simgpu/libcuda.so.1"
  export LD_LIBRARY_PATH="$BIN/simgpu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "# simulated GPU: the ratio is the shim's own overhead, not the GPU target"
  echo "# (oom syncs: async allocations retried after a stream sync because the simulator"
  echo "#  releases freed memory only when the queued free executes; 0 on a GPU)"
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
run() { # label, then env assignments
  local label=$1; shift
  env "$@" "$BIN/wl_allocbench" "$ROUNDS" table >"$OUT/$label.txt" 2>"$OUT/$label.err" || {
    echo "alloc_bench: the $label run failed:" >&2; cat "$OUT/$label.err" >&2; exit 1; }
  grep -q '^done$' "$OUT/$label.txt" || { echo "alloc_bench: the $label run did not finish" >&2; exit 1; }
}
run native
run shim LD_PRELOAD="$BIN/libtensile.so"
run shim-off LD_PRELOAD="$BIN/libtensile.so" TENSILE_POLICY=off
echo "# rounds=$ROUNDS; ns per alloc+free pair; ratio = shim / native"
awk '
  FNR == 1 { file++ }
  /^#/ || /^I / || /^done$/ { next }
  { key = $1 " " $2; ns[file, key] = $6; syncs[file, key] = $7
    if (file == 1) { order[++n] = key; bytes[key] = $3 } }
  END {
    printf "%-6s %-6s %10s %11s %11s %11s %7s %9s  %s\n", "api", "case", "bytes", "native ns", "shim ns", "off ns", "ratio", "off ratio", "oom syncs n/s/o"
    for (i = 1; i <= n; i++) {
      k = order[i]; split(k, p, " ")
      printf "%-6s %-6s %10d %11.1f %11.1f %11.1f %7.2f %9.2f  %s/%s/%s\n", p[1], p[2], bytes[k], ns[1, k], ns[2, k], ns[3, k], ns[2, k] / ns[1, k], ns[3, k] / ns[1, k], syncs[1, k], syncs[2, k], syncs[3, k]
    }
  }' "$OUT/native.txt" "$OUT/shim.txt" "$OUT/shim-off.txt"
