#!/usr/bin/env python3
"""CUDA tensors shared between processes under libtensile, on a real GPU.

The parent allocates a tensor, fills it, and hands it to a child process through
torch.multiprocessing (CUDA IPC: cudaIpcGetMemHandle in the parent, cudaIpcOpenMemHandle in
the child). The child checks every element, writes its own pattern, and says it is done; the
parent then allocates and touches other tensors well past its budget (so the manager swaps),
and checks that the shared tensor holds the child's pattern. One JSON line on stdout:
{"ok": bool, "shared_mib", "pressure_mib", "child_saw_parent", "parent_saw_child", "error"}.

Run it under the shim with a budget (bench/gpu/lease.sh, group `ipc`):

    LD_PRELOAD=target/release/libtensile.so TENSILE_DEVICE_MEMORY=2GiB \
    PYTORCH_CUDA_ALLOC_CONF=backend:native python3 bench/gpu/ipc_check.py

PyTorch's cudaMallocAsync backend, which libtensile selects when none is named, refuses CUDA
IPC itself ("cudaMallocAsync does not yet support shareIpcHandle"), so a program that shares
CUDA tensors between processes names the native backend, as above; the shim keeps a backend
the user named.
"""
import argparse
import json
import sys


def child(q_in, q_out):
    import torch

    try:
        t = q_in.get()
        expect = torch.arange(t.numel(), device=t.device, dtype=torch.int32)
        saw = bool(torch.equal(t, expect))
        t.copy_(expect * 3 + 7)
        torch.cuda.synchronize()
        q_out.put({"child_saw_parent": saw})
        # Keep our reference until the parent has read what we wrote.
        q_in.get()
    except Exception as e:  # the parent reports it
        q_out.put({"error": f"child: {type(e).__name__}: {e}"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared-mib", type=int, default=256)
    ap.add_argument("--pressure-mib", type=int, default=6144)
    args = ap.parse_args()

    import torch
    import torch.multiprocessing as mp

    result = {
        "ok": False,
        "shared_mib": args.shared_mib,
        "pressure_mib": args.pressure_mib,
        "child_saw_parent": None,
        "parent_saw_child": None,
        "error": None,
    }
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=child, args=(q_in, q_out))
    try:
        n = args.shared_mib * (1 << 20) // 4
        shared = torch.arange(n, device="cuda", dtype=torch.int32)
        torch.cuda.synchronize()
        proc.start()
        q_in.put(shared)
        got = q_out.get(timeout=300)
        if "error" in got:
            raise RuntimeError(got["error"])
        result["child_saw_parent"] = got["child_saw_parent"]
        # Pressure: tensors that together exceed the budget, each touched twice, so the
        # manager swaps them while the shared one must stay where the child wrote it.
        chunk = 64 << 20
        others = []
        for i in range(args.pressure_mib * (1 << 20) // chunk):
            others.append(torch.full((chunk // 4,), i, device="cuda", dtype=torch.int32))
        for i, o in enumerate(others):
            if int(o[0].item()) != i or int(o[-1].item()) != i:
                raise RuntimeError(f"pressure tensor {i} lost its value")
        expect = torch.arange(n, device="cuda", dtype=torch.int32) * 3 + 7
        result["parent_saw_child"] = bool(torch.equal(shared, expect))
        q_in.put("done")
        proc.join(timeout=60)
        result["ok"] = bool(result["child_saw_parent"] and result["parent_saw_child"])
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        if proc.is_alive():
            proc.kill()
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
