//! Workload: allocation microbenchmark, the no-pressure target of the memory manager
//! ("allocation and free through the arena no slower than the driver's stream-ordered
//! allocator").
//!
//! `wl_allocbench [rounds] [table|json]` (default 2000 rounds, a table). For each case it
//! times `rounds` alloc+free pairs, after `rounds / 10` untimed ones:
//! - `async`: `cuMemAllocAsync` then `cuMemFreeAsync` on one non-blocking stream (what
//!   PyTorch's `backend:cudaMallocAsync` does per tensor), ending with one
//!   `cuStreamSynchronize` inside the timing (amortized over the rounds);
//! - `sync`: `cuMemAlloc` then `cuMemFree`.
//!
//! Cases: single sizes (512 B, 64 KiB, 2 MiB, 64 MiB), each freed right after its
//! allocation, and `mix`: a PyTorch-like set of tensor sizes (a GPT-2-small layer's weights,
//! biases, activations and a scalar, in exact bytes as PyTorch requests them) all allocated,
//! then freed in reverse order, per round; its `bytes` column is the mean size.
//!
//! Output, table: `# api case bytes rounds pairs ns_per_pair oom_syncs` then one row per
//! case (`oom_syncs`: see [`Bench::alloc`]; 0 on a GPU); JSON:
//! one object per line with the same fields. Then `cuMemGetInfo` (under libtensile the
//! budget's view): `I <free> <total>` and `done`, or `{"free":..,"total":..}`.
//!
//! Before timing, one allocation of every size is filled with `cuMemsetD8` and its first and
//! last bytes read back, so a run whose allocations are unusable fails instead of timing.
//! Nothing here knows about libtensile; it reaches the driver as libcudart does.

use std::time::Instant;

use tensile_driver_abi::{CUdeviceptr, CUstream, CUDA_ERROR_OUT_OF_MEMORY};
use tensile_tests::driver::{check, Lookup};
use tensile_tests::session::Session;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Exact byte counts of a GPT-2-small layer's tensors (hidden 768, batch 8 x 1024 tokens,
/// fp32), as PyTorch asks `cudaMallocAsync` for them (it does not round).
const PYTORCH_MIX: &[usize] = &[
    768 * 4,             // a bias / LayerNorm weight
    768 * 2304 * 4,      // fused QKV weight
    2304 * 4,            // its bias
    768 * 768 * 4,       // attention projection
    768 * 3072 * 4,      // MLP up
    3072 * 4,            // its bias
    8 * 1024 * 768 * 4,  // an activation
    8 * 1024 * 3072 * 4, // the MLP's inner activation
    4,                   // a scalar (the loss)
    8 * 1024 * 4,        // per-token statistics
];

struct Case {
    name: &'static str,
    /// Allocated in this order, freed in reverse, per round.
    sizes: &'static [usize],
}

const CASES: &[Case] = &[
    Case {
        name: "512B",
        sizes: &[512],
    },
    Case {
        name: "64KiB",
        sizes: &[64 * KIB],
    },
    Case {
        name: "2MiB",
        sizes: &[2 * MIB],
    },
    Case {
        name: "64MiB",
        sizes: &[64 * MIB],
    },
    Case {
        name: "mix",
        sizes: PYTORCH_MIX,
    },
];

#[derive(Clone, Copy, PartialEq)]
enum Api {
    Async,
    Sync,
}

impl Api {
    fn name(self) -> &'static str {
        match self {
            Api::Async => "async",
            Api::Sync => "sync",
        }
    }
}

struct Bench<'a> {
    s: &'a Session,
    stream: CUstream,
    /// Live pointers of the round in progress (reused, so the loop does not allocate).
    live: Vec<CUdeviceptr>,
    /// Stream-ordered allocations that failed for want of memory and were retried after a
    /// stream synchronization (see [`Bench::alloc`]).
    oom_syncs: usize,
}

impl Bench<'_> {
    /// One allocation. A stream-ordered one that finds no memory is retried once after
    /// synchronizing the stream, as PyTorch's `cudaMallocAsync` backend does: frees queued
    /// on the stream release their memory only when they execute. A GPU's pool reuses
    /// memory freed on the same stream at once, so this happens on the simulated GPU (whose
    /// frees execute on a worker thread), and is counted.
    fn alloc(&mut self, api: Api, bytes: usize) -> CUdeviceptr {
        let mut p: CUdeviceptr = 0;
        // SAFETY: valid out-pointer; a live stream.
        let mut r = unsafe {
            match api {
                Api::Async => (self.s.d.cuMemAllocAsync)(&mut p, bytes, self.stream),
                Api::Sync => (self.s.d.cuMemAlloc)(&mut p, bytes),
            }
        };
        if r == CUDA_ERROR_OUT_OF_MEMORY && api == Api::Async {
            self.oom_syncs += 1;
            self.sync();
            // SAFETY: as above.
            r = unsafe { (self.s.d.cuMemAllocAsync)(&mut p, bytes, self.stream) };
        }
        check(r, "alloc");
        assert!(p != 0, "a null pointer for {bytes} bytes");
        p
    }

    fn free(&self, api: Api, p: CUdeviceptr) {
        // SAFETY: a live allocation of this API; a live stream.
        let r = unsafe {
            match api {
                Api::Async => (self.s.d.cuMemFreeAsync)(p, self.stream),
                Api::Sync => (self.s.d.cuMemFree)(p),
            }
        };
        check(r, "free");
    }

    fn round(&mut self, api: Api, sizes: &[usize]) {
        for &bytes in sizes {
            let p = self.alloc(api, bytes);
            self.live.push(p);
        }
        while let Some(p) = self.live.pop() {
            self.free(api, p);
        }
    }

    fn sync(&self) {
        // SAFETY: a live stream.
        check(
            unsafe { (self.s.d.cuStreamSynchronize)(self.stream) },
            "cuStreamSynchronize",
        );
    }

    /// Nanoseconds per alloc+free pair over `rounds` rounds.
    fn time(&mut self, api: Api, sizes: &[usize], rounds: usize) -> f64 {
        for _ in 0..(rounds / 10).max(1) {
            self.round(api, sizes);
        }
        self.sync();
        let t = Instant::now();
        for _ in 0..rounds {
            self.round(api, sizes);
        }
        self.sync();
        t.elapsed().as_nanos() as f64 / (rounds * sizes.len()) as f64
    }

    /// Fills one allocation of `bytes` and reads its ends back.
    fn usable(&mut self, api: Api, bytes: usize) {
        let p = self.alloc(api, bytes);
        let mut ends = [0u8; 2];
        // SAFETY: `p` is a live allocation of `bytes` bytes; the host buffers are valid.
        unsafe {
            check((self.s.d.cuMemsetD8)(p, 0xa5, bytes), "cuMemsetD8");
            check(
                (self.s.d.cuMemcpyDtoH)(ends.as_mut_ptr().cast(), p, 1),
                "cuMemcpyDtoH",
            );
            check(
                (self.s.d.cuMemcpyDtoH)(ends[1..].as_mut_ptr().cast(), p + bytes as u64 - 1, 1),
                "cuMemcpyDtoH",
            );
        }
        assert_eq!(
            ends,
            [0xa5, 0xa5],
            "{bytes} bytes from {} are not usable",
            api.name()
        );
        self.free(api, p);
        self.sync();
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args
        .next()
        .map(|a| {
            a.parse()
                .expect("usage: wl_allocbench [rounds] [table|json]")
        })
        .unwrap_or(2000)
        .max(1);
    let json = match args.next().as_deref() {
        None | Some("table") => false,
        Some("json") => true,
        Some(other) => panic!("expected table or json, got {other}"),
    };
    let s = Session::start(Lookup::ProcAddress {
        version: 13000,
        flags: 0,
    });
    let stream = s.stream();
    let mut b = Bench {
        s: &s,
        stream,
        live: Vec::with_capacity(PYTORCH_MIX.len()),
        oom_syncs: 0,
    };
    for api in [Api::Async, Api::Sync] {
        for case in CASES {
            for &bytes in case.sizes {
                b.usable(api, bytes);
            }
        }
    }
    if !json {
        s.say("# api case bytes rounds pairs ns_per_pair oom_syncs");
    }
    for api in [Api::Async, Api::Sync] {
        for case in CASES {
            b.oom_syncs = 0;
            let ns = b.time(api, case.sizes, rounds);
            let syncs = b.oom_syncs;
            let bytes = case.sizes.iter().sum::<usize>() / case.sizes.len();
            let pairs = rounds * case.sizes.len();
            let (a, c) = (api.name(), case.name);
            if json {
                s.say(format_args!(
                    "{{\"api\":\"{a}\",\"case\":\"{c}\",\"bytes\":{bytes},\"rounds\":{rounds},\
                     \"pairs\":{pairs},\"ns_per_pair\":{ns:.1},\"oom_syncs\":{syncs}}}"
                ));
            } else {
                s.say(format_args!(
                    "{a} {c} {bytes} {rounds} {pairs} {ns:.1} {syncs}"
                ));
            }
        }
    }
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    check(
        unsafe { (s.d.cuMemGetInfo)(&mut free, &mut total) },
        "cuMemGetInfo",
    );
    if json {
        s.say(format_args!("{{\"free\":{free},\"total\":{total}}}"));
    } else {
        s.say(format_args!("I {free} {total}"));
        s.say("done");
    }
}
