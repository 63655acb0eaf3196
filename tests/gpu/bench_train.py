#!/usr/bin/env python3
"""The GPU check of issue #4, and the start of the benchmark suite.

Trains a model for a few steps with deterministic settings and prints one JSON line per
step (loss, step time) and a summary, so that a run under libtensile can be compared with an
unlimited run loss for loss:

    # unlimited, then at a 6 GiB budget with the LRU policy
    python tests/gpu/bench_train.py gpt2 > native.jsonl
    TENSILE_DEVICE_MEMORY=6GiB TENSILE_POLICY=lru TENSILE_LOG=info \
        tensile run -- python tests/gpu/bench_train.py gpt2 > lru.jsonl
    python tests/gpu/bench_train.py compare native.jsonl lru.jsonl

    python tests/gpu/bench_train.py resnet50            # the 2 GiB case: TENSILE_DEVICE_MEMORY=2GiB

Models: `gpt2` (transformers' GPT2LMHeadModel, GPT-2 small, seq 1024, batch 8, AdamW; about
14.7 GiB peak natively) and `resnet50` (torchvision, batch 64, 224x224, SGD momentum).
Inputs are random but seeded; `torch.use_deterministic_algorithms(True)` and
`CUBLAS_WORKSPACE_CONFIG=:4096:8` make the losses reproducible, so `compare` demands them
equal bit for bit (printed with `float.hex`). Step times exclude the first `--warmup` steps.
Peers to report next to (GPU_FACTS.md, GPT-2): native 187 ms, activation checkpointing
234 ms, save_on_cpu 691 ms.

Not run yet: no GPU was lent to the session that wrote it. It needs torch (with CUDA),
transformers and torchvision.
"""

import argparse
import json
import os
import statistics
import sys
import time


def deterministic(seed: int):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def gpt2_step_fn(torch, batch: int, seq: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_positions=seq)).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(1)
    vocab = model.config.vocab_size

    def step():
        ids = torch.randint(0, vocab, (batch, seq), device="cuda", generator=gen)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss

    return step


def resnet50_step_fn(torch, batch: int):
    import torchvision

    model = torchvision.models.resnet50(weights=None).cuda()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step():
        x = torch.randn(batch, 3, 224, 224, device="cuda", generator=gen)
        y = torch.randint(0, 1000, (batch,), device="cuda", generator=gen)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def train(args):
    torch = deterministic(args.seed)
    if args.model == "gpt2":
        step = gpt2_step_fn(torch, args.batch or 8, args.seq)
    else:
        step = resnet50_step_fn(torch, args.batch or 64)
    times = []
    for i in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        value = loss.item()  # synchronizes
        ms = (time.perf_counter() - t0) * 1e3
        if i >= args.warmup:
            times.append(ms)
        print(json.dumps({"step": i, "loss": value.hex(), "loss_f": value, "ms": round(ms, 2)}),
              flush=True)
    summary = {
        "model": args.model,
        "steps": args.steps,
        "median_ms": round(statistics.median(times), 2) if times else None,
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "tensile": {k: v for k, v in os.environ.items() if k.startswith("TENSILE_")},
    }
    print(json.dumps({"summary": summary}), flush=True)


def load(path):
    steps, summary = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            if "summary" in rec:
                summary = rec["summary"]
            else:
                steps[rec["step"]] = rec
    return steps, summary


def compare(a_path, b_path):
    a, sa = load(a_path)
    b, sb = load(b_path)
    if not a or set(a) != set(b):
        print(f"different steps: {sorted(a)} vs {sorted(b)}")
        return 1
    bad = [i for i in sorted(a) if a[i]["loss"] != b[i]["loss"]]
    for i in bad:
        print(f"step {i}: loss {a[i]['loss_f']} vs {b[i]['loss_f']}")
    print(f"{len(a) - len(bad)} of {len(a)} losses identical bit for bit")
    if sa and sb and sa.get("median_ms") and sb.get("median_ms"):
        ratio = sb["median_ms"] / sa["median_ms"]
        print(f"median step: {sa['median_ms']} ms vs {sb['median_ms']} ms ({ratio:.2f}x)")
    return 1 if bad else 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        return compare(sys.argv[2], sys.argv[3])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=["gpt2", "resnet50"])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=0, help="default: 8 (gpt2), 64 (resnet50)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    train(p.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
