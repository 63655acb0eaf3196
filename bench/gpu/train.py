#!/usr/bin/env python3
"""Training-step benchmark for libtensile on a real GPU.

Runs a few warm-up steps, then timed steps, and prints one JSON line with the median step
time, every step's loss, and the peak memory PyTorch saw. The same script is run natively,
under LD_PRELOAD=libtensile.so, and with tracing, so the three are compared on one machine
(see check.sh). Workloads match GPU_FACTS.md's table:

  resnet50     torchvision ResNet-50, batch 64, 224x224, AdamW
  transformer  12-layer nn.TransformerEncoder, d=1024, 16 heads, ff 4096, batch 16 x 512, AdamW
  gpt2         transformers GPT2LMHeadModel (small), seq 1024, batch 8, AdamW
  mlp          16 x Linear(4096)+GELU, batch 256, AdamW

--deterministic makes losses comparable bit for bit between runs (fixed seeds,
torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG).

--peer names what a user does today instead of libtensile, with a code change (GPU_FACTS.md's
table): `checkpoint` (activation checkpointing: GPT-2's gradient_checkpointing_enable, the
other models' layers in 4 checkpointed segments) or `save_on_cpu`
(torch.autograd.graph.save_on_cpu(pin_memory=True) around the forward pass).
"""
import argparse
import json
import os
import statistics
import sys
import time


def build(name, device, torch):
    nn = torch.nn
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50()
        x = torch.randn(64, 3, 224, 224, pin_memory=True)
        y = torch.randint(0, 1000, (64,), pin_memory=True)
        loss_fn = nn.CrossEntropyLoss()
        return model, lambda m, xb, yb: loss_fn(m(xb), yb), x, y
    if name == "transformer":
        layer = nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True, dropout=0.0)
        model = nn.Sequential(nn.TransformerEncoder(layer, 12), nn.Linear(1024, 1024))
        x = torch.randn(16, 512, 1024, pin_memory=True)
        y = torch.randn(16, 512, 1024, pin_memory=True)
        return model, lambda m, xb, yb: nn.functional.mse_loss(m(xb), yb), x, y
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config())
        x = torch.randint(0, 50257, (8, 1024), pin_memory=True)
        return model, lambda m, xb, yb: m(input_ids=xb, labels=xb).loss, x, x
    if name == "mlp":
        layers = []
        for _ in range(16):
            layers += [nn.Linear(4096, 4096), nn.GELU()]
        model = nn.Sequential(*layers)
        x = torch.randn(256, 4096, pin_memory=True)
        y = torch.randn(256, 4096, pin_memory=True)
        return model, lambda m, xb, yb: nn.functional.mse_loss(m(xb), yb), x, y
    sys.exit(f"unknown model {name}")


def checkpointed(name, model, torch):
    """The model with activation checkpointing, as a user would add it."""
    from torch.utils.checkpoint import checkpoint_sequential

    nn = torch.nn
    if name == "gpt2":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model
    if name == "resnet50":
        m = model
        # torchvision's ReLUs work in place, which a recomputed segment must not do.
        for mod in m.modules():
            if isinstance(mod, nn.ReLU):
                mod.inplace = False
        layers = nn.Sequential(m.conv1, m.bn1, m.relu, m.maxpool, m.layer1, m.layer2, m.layer3,
                               m.layer4, m.avgpool, nn.Flatten(1), m.fc)
    elif name == "transformer":
        layers = nn.Sequential(*model[0].layers, model[1])
    else:
        layers = model

    class Segments(nn.Module):
        def __init__(self, seq):
            super().__init__()
            self.seq = seq

        def forward(self, x):
            return checkpoint_sequential(self.seq, 4, x, use_reentrant=False)

    return Segments(layers)


def thread_cpu():
    """CPU seconds by thread name in this process, and of any `tensile` process (a coordinator
    the shim started): where the shim's time goes when steps are slower than native."""
    tick = os.sysconf("SC_CLK_TCK")

    def cpu(stat_path):
        with open(stat_path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime + stime

    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = open(f"/proc/self/task/{tid}/comm").read().strip()
            out[name] = round(out.get(name, 0.0) + cpu(f"/proc/self/task/{tid}/stat"), 3)
        except OSError:
            pass
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == "tensile":
                out[f"process tensile {pid}"] = round(cpu(f"/proc/{pid}/stat"), 3)
        except OSError:
            pass
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", choices=["resnet50", "transformer", "gpt2", "mlp"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--label", default="", help="free text copied into the output")
    p.add_argument("--peer", choices=["checkpoint", "save_on_cpu"],
                   help="what users do today instead (a code change): see above")
    args = p.parse_args()

    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.manual_seed(0)
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    device = torch.device("cuda")
    model, loss_of, x_host, y_host = build(args.model, device, torch)
    if args.peer == "checkpoint":
        model = checkpointed(args.model, model, torch)
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    losses, times = [], []
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        xb = x_host.to(device, non_blocking=True)
        yb = y_host.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        if args.peer == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                loss = loss_of(model, xb, yb)
        else:
            loss = loss_of(model, xb, yb)
        loss.backward()
        opt.step()
        value = loss.item()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        losses.append(value)
        if step >= args.warmup:
            times.append(dt)
        print(f"step {step}: loss {value:.6f} {dt * 1e3:.1f} ms", file=sys.stderr, flush=True)

    print(json.dumps({
        "model": args.model,
        "label": args.label,
        "peer": args.peer or "",
        "median_step_ms": statistics.median(times) * 1e3,
        "step_ms": [t * 1e3 for t in times],
        "losses": [float.hex(v) for v in losses],
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "preloaded": "libtensile" in os.environ.get("LD_PRELOAD", ""),
        "cpu_s_by_thread": thread_cpu(),
    }))


if __name__ == "__main__":
    main()
