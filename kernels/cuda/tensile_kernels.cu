// The kernels that libtensile's tests and tools launch.
//
// Every kernel has a CPU twin in kernels/src/twins/ that computes the same result bit for
// bit: floating-point work uses explicit fmaf (never a contraction the compiler may or may
// not make), and reductions use wrapping integer sums, which are order-independent.
// All kernels use 64-bit grid-stride loops over every thread of the launch (x, y and z), so
// any launch shape gives the same result.
//
// The committed PTX (kernels/ptx/tensile_kernels.ptx) is generated from this file by
// kernels/gen/gen_ptx.py; change both together.

typedef unsigned int u32;
typedef unsigned long long u64;

// Every thread of the launch (all three grid and block dimensions) gets a distinct linear
// index, and the stride is the total thread count: each element is handled exactly once
// whatever the launch shape.
__device__ __forceinline__ u64 tensile_thread_index() {
    u64 block = ((u64)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    u64 threads_per_block = (u64)blockDim.x * blockDim.y * blockDim.z;
    u64 thread = ((u64)threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    return block * threads_per_block + thread;
}

__device__ __forceinline__ u64 tensile_thread_count() {
    return (u64)gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z;
}

#define GRID_STRIDE_LOOP(i, n)                                                  \
    for (u64 i = tensile_thread_index(); i < (n); i += tensile_thread_count())

// A cheap 64-bit mixer (the finalizer of MurmurHash3's 64-bit variant).
__device__ __forceinline__ u64 tensile_mix64(u64 x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

// p[i] = low 32 bits of mix64(i ^ (seed << 32) ^ 0x9e3779b97f4a7c15).
extern "C" __global__ void fill_pattern(u32* p, u64 n, u32 seed) {
    GRID_STRIDE_LOOP(i, n) {
        p[i] = (u32)tensile_mix64(i ^ ((u64)seed << 32) ^ 0x9e3779b97f4a7c15ULL);
    }
}

// *out += sum over i of mix64(((u64)p[i] << 32) ^ i), wrapping (mod 2^64).
// The per-element term depends on the index, so a permutation of the data changes the result,
// but the order of the additions does not. `out` is ACCUMULATED: zero it before the launch.
extern "C" __global__ void checksum(const u32* p, u64 n, u64* out) {
    u64 local = 0;
    GRID_STRIDE_LOOP(i, n) {
        local += tensile_mix64(((u64)p[i] << 32) ^ i);
    }
    if (local != 0) {
        atomicAdd(out, local);
    }
}

// y[i] = fmaf(a, x[i], y[i])
extern "C" __global__ void axpy(float a, const float* x, float* y, u64 n) {
    GRID_STRIDE_LOOP(i, n) {
        y[i] = fmaf(a, x[i], y[i]);
    }
}

// C (m x n) = A (m x k) * B (k x n), row-major, one output per thread, fmaf in k order from 0.
extern "C" __global__ void matmul_f32(const float* A, const float* B, float* C, u32 m, u32 n,
                                      u32 k) {
    u64 total = (u64)m * n;
    GRID_STRIDE_LOOP(idx, total) {
        u64 row = idx / n;
        u64 col = idx % n;
        float acc = 0.0f;
        for (u32 p = 0; p < k; ++p) {
            acc = fmaf(A[row * k + p], B[(u64)p * n + col], acc);
        }
        C[idx] = acc;
    }
}

// x[i] = x[i] * s
extern "C" __global__ void scale(float* x, float s, u64 n) {
    GRID_STRIDE_LOOP(i, n) {
        x[i] = __fmul_rn(x[i], s);
    }
}

// dst[i] = src[i]
extern "C" __global__ void copy_u32(u32* dst, const u32* src, u64 n) {
    GRID_STRIDE_LOOP(i, n) {
        dst[i] = src[i];
    }
}

// A struct of pointers passed BY VALUE: tests that pointers inside struct parameters are found.
struct Gather4Args {
    const u32* src[4];
    u32* dst;
    u64 n;
};

// dst[i] = src[0][i] ^ src[1][i] ^ src[2][i] ^ src[3][i]
extern "C" __global__ void gather4(Gather4Args args) {
    GRID_STRIDE_LOOP(i, args.n) {
        args.dst[i] = args.src[0][i] ^ args.src[1][i] ^ args.src[2][i] ^ args.src[3][i];
    }
}

// SGD with momentum: m[i] = fmaf(mu, m[i], g[i]); w[i] = fmaf(-lr, m[i], w[i]).
extern "C" __global__ void sgd_momentum(float* w, const float* g, float* m, float lr, float mu,
                                        u64 n) {
    GRID_STRIDE_LOOP(i, n) {
        float mi = fmaf(mu, m[i], g[i]);
        m[i] = mi;
        w[i] = fmaf(-lr, mi, w[i]);
    }
}

// ---- tensile_rerun_op: the stand-in kernel of `tensile rerun` ----
//
// One recorded launch, replayed: it touches the allocations the recorded launch touched and
// takes the recorded GPU time. In every piece (piece_bytes apart, from offset 0) of each
// touched allocation it checks the 16-byte stamp the program last wrote there, then writes the
// new stamp, so a piece that a swap lost or left stale is caught. A stamp is four words:
// allocation id, version, piece index, and a check word mixing the three. Version 0 means
// "unstamped": nothing is expected (the allocation was never written) or nothing is written.
// The layout must match kernels/src/rerun.rs.

#define RERUN_MAX_SLOTS 120

struct RerunSlot {
    u64 ptr;
    u64 bytes;
    u32 alloc_id;
    u32 expected;  // version expected in every piece; 0: do not check
    u32 written;   // version to write in every piece; 0: do not write
    u32 pad;
};

// The device result buffer: stamps checked, mismatches, and the first mismatch.
struct RerunResult {
    u64 checked;
    u32 mismatches;
    u32 pad0;
    u32 alloc_id;
    u32 piece;
    u32 op;
    u32 pad1;
    u32 expected[4];
    u32 found[4];
};

struct RerunArgs {
    u64 duration_ns;
    u32 op;
    u32 count;
    u64 piece_bytes;
    RerunResult* result;
    RerunSlot slots[RERUN_MAX_SLOTS];
};

__device__ __forceinline__ u32 rerun_check_word(u32 alloc_id, u32 version, u32 piece) {
    return (u32)tensile_mix64((((u64)alloc_id << 32) | version) ^ ((u64)piece << 7) ^
                              0x7265727573746d70ULL);
}

__device__ __forceinline__ u64 rerun_globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void tensile_rerun_op(RerunArgs args) {
    u64 start = rerun_globaltimer();
    u32 count = args.count < RERUN_MAX_SLOTS ? args.count : RERUN_MAX_SLOTS;
    u64 checked = 0;
    for (u32 s = 0; s < count; ++s) {
        RerunSlot slot = args.slots[s];
        if (args.piece_bytes == 0 || slot.bytes < 16) continue;
        u64 pieces = (slot.bytes - 16) / args.piece_bytes + 1;
        GRID_STRIDE_LOOP(p, pieces) {
            uint4* at = (uint4*)(slot.ptr + p * args.piece_bytes);
            if (slot.expected != 0) {
                uint4 found = *at;
                uint4 want = make_uint4(slot.alloc_id, slot.expected, (u32)p,
                                        rerun_check_word(slot.alloc_id, slot.expected, (u32)p));
                ++checked;
                if (found.x != want.x || found.y != want.y || found.z != want.z ||
                    found.w != want.w) {
                    if (atomicAdd(&args.result->mismatches, 1u) == 0) {
                        args.result->alloc_id = slot.alloc_id;
                        args.result->piece = (u32)p;
                        args.result->op = args.op;
                        args.result->expected[0] = want.x;
                        args.result->expected[1] = want.y;
                        args.result->expected[2] = want.z;
                        args.result->expected[3] = want.w;
                        args.result->found[0] = found.x;
                        args.result->found[1] = found.y;
                        args.result->found[2] = found.z;
                        args.result->found[3] = found.w;
                    }
                }
            }
            if (slot.written != 0) {
                *at = make_uint4(slot.alloc_id, slot.written, (u32)p,
                                 rerun_check_word(slot.alloc_id, slot.written, (u32)p));
            }
        }
    }
    if (checked != 0) atomicAdd(&args.result->checked, checked);
    // The recorded GPU time: every thread waits it out, so the launch occupies the device as
    // the recorded one did.
    while (rerun_globaltimer() - start < args.duration_ns) {
    }
}
