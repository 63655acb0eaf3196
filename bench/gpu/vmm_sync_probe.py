#!/usr/bin/env python3
"""Whether the driver's VMM and pinning calls wait for the GPU's queued work.

The simulated GPU charges each VMM call its caller's time only (what `vmm_probe.py` measured
with the GPU idle). If a call instead waits until the work already queued on the device has
finished, every remap the memory manager makes drains the pipeline the application built:
the launching thread loses its lead and the GPU idles while it refills. This probe tells
which: for each call it queues a kernel that spins for SPIN_MS (PyTorch's `torch.cuda._sleep`
on the current stream), then times the call on the host, against the same call with the GPU
idle. A call that waits shows about SPIN_MS busy.

    python3 bench/gpu/vmm_sync_probe.py [SPIN_MS]

Calls libcuda.so.1 through ctypes in PyTorch's context (the device's primary context). One
line per call: microseconds idle, busy, and the verdict. Exit status 0 whatever it finds.
"""
import ctypes as C
import sys
import time

import torch

from vmm_probe import DEVICE, HOST_NUMA, AccessDesc, Location, fn, prop

SPIN_MS = float(sys.argv[1]) if len(sys.argv) > 1 else 50.0


def ok(code, what):
    if code != 0:
        raise RuntimeError(f"{what} returned {code}")


class Vmm:
    """The handful of driver calls timed, each a closure with fresh arguments per round."""

    def __init__(self, page):
        self.page = page
        va = C.c_ulonglong()
        ok(fn("cuMemAddressReserve")(C.byref(va), C.c_size_t(4096 * page), C.c_size_t(0),
                                     C.c_ulonglong(0), C.c_ulonglong(0)), "reserve")
        self.next_va = va.value

    def va(self, pages):
        v = self.next_va
        self.next_va += pages * self.page
        return v

    def create(self, pages, kind=DEVICE):
        h = C.c_ulonglong()
        p = prop(kind)
        ok(fn("cuMemCreate")(C.byref(h), C.c_size_t(pages * self.page), C.byref(p),
                             C.c_ulonglong(0)), "cuMemCreate")
        return h.value

    def map(self, va, pages, h):
        ok(fn("cuMemMap")(C.c_ulonglong(va), C.c_size_t(pages * self.page), C.c_size_t(0),
                          C.c_ulonglong(h), C.c_ulonglong(0)), "cuMemMap")

    def access(self, va, pages):
        d = AccessDesc(Location(DEVICE, 0), 3)
        ok(fn("cuMemSetAccess")(C.c_ulonglong(va), C.c_size_t(pages * self.page), C.byref(d),
                                C.c_size_t(1)), "cuMemSetAccess")

    def unmap(self, va, pages):
        ok(fn("cuMemUnmap")(C.c_ulonglong(va), C.c_size_t(pages * self.page)), "cuMemUnmap")

    def release(self, h):
        ok(fn("cuMemRelease")(C.c_ulonglong(h)), "cuMemRelease")


def cases(vmm):
    """(name, prepare, call, tidy): `prepare` runs before the kernel is queued and returns
    the state `call` (timed) and `tidy` (after the GPU is idle again) take."""

    def mapped(pages, kind=DEVICE, with_access=True):
        def prep():
            h = vmm.create(pages, kind)
            va = vmm.va(pages)
            vmm.map(va, pages, h)
            if with_access:
                vmm.access(va, pages)
            return va, h
        return prep

    def free_mapped(state):
        va, h = state
        vmm.unmap(va, vmm_pages[va])
        vmm.release(h)

    vmm_pages = {}

    def track(pages, prep):
        def p():
            va, h = prep()
            vmm_pages[va] = pages
            return va, h
        return p

    out = []
    for pages, label in [(1, "1 page"), (32, "32 pages")]:
        out += [
            (f"cuMemCreate device {label}", lambda: None,
             lambda _s, n=pages: vmm.create(n), lambda h: vmm.release(h)),
            (f"cuMemMap device {label}", lambda n=pages: (vmm.create(n), vmm.va(n), n),
             lambda s: vmm.map(s[1], s[2], s[0]),
             lambda s: (vmm.unmap(s[1], s[2]), vmm.release(s[0]))),
            (f"cuMemSetAccess device {label}",
             track(pages, mapped(pages, with_access=False)),
             lambda s, n=pages: vmm.access(s[0], n), free_mapped),
            (f"cuMemUnmap device {label}", mapped(pages),
             lambda s, n=pages: vmm.unmap(s[0], n), lambda s: vmm.release(s[1])),
            (f"cuMemRelease device {label} (unmapped)", lambda n=pages: vmm.create(n),
             lambda h: vmm.release(h), lambda _s: None),
            (f"cuMemCreate host NUMA {label}", lambda: None,
             lambda _s, n=pages: vmm.create(n, HOST_NUMA), lambda h: vmm.release(h)),
            (f"cuMemSetAccess host NUMA {label}",
             track(pages, mapped(pages, HOST_NUMA, with_access=False)),
             lambda s, n=pages: vmm.access(s[0], n), free_mapped),
            (f"cuMemUnmap host NUMA {label}", mapped(pages, HOST_NUMA),
             lambda s, n=pages: vmm.unmap(s[0], n), lambda s: vmm.release(s[1])),
        ]

    def host_alloc(pages):
        p = C.c_void_p()
        ok(fn("cuMemHostAlloc")(C.byref(p), C.c_size_t(pages * vmm.page), C.c_uint(0)),
           "cuMemHostAlloc")
        return p.value

    out += [
        ("cuMemHostAlloc 1 page", lambda: None, lambda _s: host_alloc(1),
         lambda p: ok(fn("cuMemFreeHost")(C.c_void_p(p)), "cuMemFreeHost")),
        ("cuMemFreeHost 1 page", lambda: host_alloc(1),
         lambda p: ok(fn("cuMemFreeHost")(C.c_void_p(p)), "cuMemFreeHost"), lambda _s: None),
    ]

    def event():
        e = C.c_void_p()
        ok(fn("cuEventCreate")(C.byref(e), C.c_uint(2)), "cuEventCreate")  # disable timing
        return e

    stream = C.c_void_p(torch.cuda.current_stream().cuda_stream)
    out += [
        ("cuEventRecord", event, lambda e: ok(fn("cuEventRecord")(e, stream), "record"),
         lambda e: fn("cuEventDestroy_v2")(e)),
        ("cuEventQuery", lambda: (lambda e: (fn("cuEventRecord")(e, stream), e)[1])(event()),
         lambda e: fn("cuEventQuery")(e) and None, lambda e: fn("cuEventDestroy_v2")(e)),
    ]
    return out


def timed(prepare, call, busy):
    state = prepare()
    torch.cuda.synchronize()
    if busy:
        torch.cuda._sleep(SPIN_CYCLES)
    t0 = time.perf_counter()
    result = call(state)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6, state if result is None else result


def main():
    global SPIN_CYCLES
    torch.zeros(1, device="cuda")
    ctx = C.c_void_p()
    ok(fn("cuCtxGetCurrent")(C.byref(ctx)), "cuCtxGetCurrent")
    gran = C.c_size_t()
    p = prop(DEVICE)
    fn("cuMemGetAllocationGranularity")(C.byref(gran), C.byref(p), 0)
    vmm = Vmm(gran.value or 2 << 20)
    # Calibrate the spin: cycles for SPIN_MS on this clock.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(10_000_000)
    torch.cuda.synchronize()
    per_ms = 10_000_000 / ((time.perf_counter() - t0) * 1e3)
    SPIN_CYCLES = int(per_ms * SPIN_MS)
    t0 = time.perf_counter()
    torch.cuda._sleep(SPIN_CYCLES)
    queued_us = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    spun_ms = (time.perf_counter() - t0) * 1e3
    print(f"{torch.cuda.get_device_name(0)}; page {vmm.page >> 20} MiB; spin {spun_ms:.1f} ms "
          f"(queueing it took {queued_us:.0f} us)")
    print(f"{'call':<40} {'idle us':>9} {'busy us':>9}  waits for the GPU")
    for name, prepare, call, tidy in cases(vmm):
        idle, busy = [], []
        for _ in range(3):
            us, state = timed(prepare, call, False)
            tidy(state)
            idle.append(us)
            us, state = timed(prepare, call, True)
            tidy(state)
            busy.append(us)
        i, b = sorted(idle)[1], sorted(busy)[1]
        verdict = "yes" if b > 0.5 * SPIN_MS * 1e3 else "no"
        print(f"{name:<40} {i:>9.1f} {b:>9.1f}  {verdict}", flush=True)


if __name__ == "__main__":
    main()
