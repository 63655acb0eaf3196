#!/usr/bin/env python3
"""What the driver's virtual memory management accepts, as the memory manager uses it.

Calls libcuda.so.1 directly (ctypes, no CUDA toolkit or bindings) and prints one line per
case: the call, the result code and its name. Run on a GPU to learn the rules the simulated
GPU (tests/simgpu) must follow; run on the simulated GPU (LD_LIBRARY_PATH pointing at its
libcuda.so.1) to compare. Exit status 0 whatever the driver answers: the answers are the
output.

    python3 bench/gpu/vmm_probe.py
"""
import ctypes as C
import sys

cu = C.CDLL("libcuda.so.1")
NAMES = {0: "SUCCESS", 1: "INVALID_VALUE", 2: "OUT_OF_MEMORY", 101: "INVALID_DEVICE",
         201: "INVALID_CONTEXT", 400: "INVALID_HANDLE", 801: "NOT_SUPPORTED",
         999: "UNKNOWN"}


class Location(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class AllocFlags(C.Structure):
    _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte),
                ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]


class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Location),
                ("win32HandleMetaData", C.c_void_p), ("allocFlags", AllocFlags)]


class AccessDesc(C.Structure):
    _fields_ = [("location", Location), ("flags", C.c_int)]


DEVICE, HOST_NUMA = 1, 3
MB = 1 << 20


def fn(name):
    f = getattr(cu, name)
    f.restype = C.c_int
    return f


def check(label, code):
    print(f"{label:<58} {code:>4} {NAMES.get(code, '?')}", flush=True)
    return code


def prop(kind, ident=0):
    p = Prop()
    p.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
    p.location = Location(kind, ident)
    return p


def create(size, kind, label):
    h = C.c_ulonglong()
    p = prop(kind)
    code = check(f"cuMemCreate {size // MB} MiB {label}", fn("cuMemCreate")(C.byref(h), C.c_size_t(size), C.byref(p), C.c_ulonglong(0)))
    return h.value if code == 0 else None


def reserve(size):
    va = C.c_ulonglong()
    fn("cuMemAddressReserve")(C.byref(va), C.c_size_t(size), C.c_size_t(0), C.c_ulonglong(0), C.c_ulonglong(0))
    return va.value


def mmap(label, va, size, offset, h):
    return check(label, fn("cuMemMap")(C.c_ulonglong(va), C.c_size_t(size), C.c_size_t(offset), C.c_ulonglong(h), C.c_ulonglong(0)))


def unmap(label, va, size):
    return check(label, fn("cuMemUnmap")(C.c_ulonglong(va), C.c_size_t(size)))


def access(label, va, size):
    d = AccessDesc(Location(DEVICE, 0), 3)  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return check(label, fn("cuMemSetAccess")(C.c_ulonglong(va), C.c_size_t(size), C.byref(d), C.c_size_t(1)))


def main():
    check("cuInit", fn("cuInit")(0))
    dev = C.c_int()
    fn("cuDeviceGet")(C.byref(dev), 0)
    ctx = C.c_void_p()
    check("cuDevicePrimaryCtxRetain", fn("cuDevicePrimaryCtxRetain")(C.byref(ctx), dev))
    check("cuCtxSetCurrent", fn("cuCtxSetCurrent")(ctx))
    gran = C.c_size_t()
    p = prop(DEVICE)
    fn("cuMemGetAllocationGranularity")(C.byref(gran), C.byref(p), 0)
    g = gran.value or 2 * MB
    print(f"granularity {g // MB} MiB")
    va = reserve(512 * g)

    big = create(16 * g, DEVICE, "device")
    if big is not None:
        if mmap("map a whole 16-page allocation at offset 0", va, 16 * g, 0, big) == 0:
            unmap("unmap it", va, 16 * g)
        if mmap("map 1 page of it at offset 0 (part)", va, g, 0, big) == 0:
            unmap("unmap it", va, g)
        if mmap("map 1 page of it at offset 1 page", va, g, g, big) == 0:
            unmap("unmap it", va, g)
        fn("cuMemRelease")(C.c_ulonglong(big))

    a, b = create(g, DEVICE, "device page a"), create(g, DEVICE, "device page b")
    if a is not None and b is not None:
        mmap("map a", va, g, 0, a)
        mmap("map b right after a", va + g, g, 0, b)
        access("set access over a and b in one call", va, 2 * g)
        if unmap("unmap a and b in one call", va, 2 * g) != 0:
            unmap("unmap a", va, g)
            unmap("unmap b", va + g, g)
        fn("cuMemRelease")(C.c_ulonglong(a))
        fn("cuMemRelease")(C.c_ulonglong(b))

    h = create(g, HOST_NUMA, "host NUMA 0")
    if h is not None:
        mmap("map the host page at VA1", va, g, 0, h)
        access("set access at VA1", va, g)
        mmap("map the same host page at VA2 too", va + 8 * g, g, 0, h)
        access("set access at VA2", va + 8 * g, g)
        check("cuMemsetD8 0x5a at VA1", fn("cuMemsetD8_v2")(C.c_ulonglong(va), C.c_ubyte(0x5A), C.c_size_t(g)))
        check("cuCtxSynchronize", fn("cuCtxSynchronize")())
        buf = (C.c_ubyte * 4096)()
        check("cuMemcpyDtoH 4 KiB from VA2", fn("cuMemcpyDtoH_v2")(buf, C.c_ulonglong(va + 8 * g), C.c_size_t(4096)))
        print(f"VA2 reads what VA1 wrote: {all(x == 0x5A for x in buf)}")
        unmap("unmap VA1", va, g)
        unmap("unmap VA2", va + 8 * g, g)
        fn("cuMemRelease")(C.c_ulonglong(h))
    big_host = create(16 * g, HOST_NUMA, "host NUMA 0")
    if big_host is not None:
        if mmap("map 1 page of a 16-page host allocation at offset 1 page", va, g, g, big_host) == 0:
            unmap("unmap it", va, g)
        fn("cuMemRelease")(C.c_ulonglong(big_host))
    timings(va, g)
    return 0


def timings(va, g):
    """Microseconds per page of each VMM call, by how the pages are grouped: `n` allocations
    of one page each (what the memory manager has, frames.rs) mapped one call each, with
    access set and the range unmapped either in one call over all of them or page by page;
    and one allocation of `n` pages mapped whole. Median of 5 rounds."""
    import statistics
    import time

    def us(f):
        t = time.perf_counter()
        code = f()
        return (time.perf_counter() - t) * 1e6, code

    def median(xs):
        return statistics.median(xs) if xs else float("nan")

    m, u, a, r = fn("cuMemMap"), fn("cuMemUnmap"), fn("cuMemSetAccess"), fn("cuMemRelease")
    desc = AccessDesc(Location(DEVICE, 0), 3)
    print(f"\n{'what':<44} {'pages':>5} {'create':>8} {'map':>8} {'access':>8} {'unmap':>8} {'release':>8}  (us per page)")
    for kind, kname in ((DEVICE, "device"), (HOST_NUMA, "host")):
        for n in (1, 8, 64, 256):
            for grouping in ("pages, ranged calls", "pages, call per page", "one allocation"):
                if grouping == "one allocation" and n == 1:
                    continue
                cols = {k: [] for k in ("create", "map", "access", "unmap", "release")}
                for _ in range(5):
                    p = prop(kind)
                    hs, failed = [], False
                    sizes = [g] * n if grouping != "one allocation" else [n * g]
                    t0 = time.perf_counter()
                    for size in sizes:
                        h = C.c_ulonglong()
                        if fn("cuMemCreate")(C.byref(h), C.c_size_t(size), C.byref(p), C.c_ulonglong(0)):
                            failed = True
                            break
                        hs.append(h.value)
                    cols["create"].append((time.perf_counter() - t0) * 1e6 / n)
                    if failed:
                        break
                    off = 0
                    t0 = time.perf_counter()
                    for h, size in zip(hs, sizes):
                        m(C.c_ulonglong(va + off), C.c_size_t(size), C.c_size_t(0), C.c_ulonglong(h), C.c_ulonglong(0))
                        off += size
                    cols["map"].append((time.perf_counter() - t0) * 1e6 / n)
                    ranged = grouping != "pages, call per page"
                    t0 = time.perf_counter()
                    if ranged:
                        a(C.c_ulonglong(va), C.c_size_t(n * g), C.byref(desc), C.c_size_t(1))
                    else:
                        for i in range(n):
                            a(C.c_ulonglong(va + i * g), C.c_size_t(g), C.byref(desc), C.c_size_t(1))
                    cols["access"].append((time.perf_counter() - t0) * 1e6 / n)
                    t0 = time.perf_counter()
                    if ranged:
                        code = u(C.c_ulonglong(va), C.c_size_t(n * g))
                    else:
                        code = 0
                        for i in range(n):
                            code |= u(C.c_ulonglong(va + i * g), C.c_size_t(g))
                    cols["unmap"].append((time.perf_counter() - t0) * 1e6 / n)
                    if code:
                        print(f"unmap failed: {code}")
                    t0 = time.perf_counter()
                    for h in hs:
                        r(C.c_ulonglong(h))
                    cols["release"].append((time.perf_counter() - t0) * 1e6 / n)
                row = " ".join(f"{median(cols[k]):>8.1f}" for k in cols)
                print(f"{kname + ': ' + grouping:<44} {n:>5} {row}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
