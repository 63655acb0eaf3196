//! Workload: threads that start before the process's first CUDA call, then all load the
//! driver, look up entry points and launch at once (so libtensile initializes under a race,
//! while other threads call `dlsym`).
//!
//! `wl_threads <lookup> <threads>`.

use std::sync::Barrier;

use tensile_tests::driver::Lookup;
use tensile_tests::session::{Arg, Form, Session};

fn main() {
    let mut args = std::env::args().skip(1);
    let lookup = args
        .next()
        .and_then(|a| Lookup::parse(&a))
        .expect("usage: wl_threads <lookup> <threads>");
    let threads: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let start = Barrier::new(threads as usize);
    let digests: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    let s = Session::start(lookup);
                    let ks = s.kernels(t % 2 == 0);
                    let find = |name: &str| ks.iter().find(|k| k.name == name).expect("kernel");
                    let st = s.stream();
                    let n = 1000 + 64 * u64::from(t);
                    let p = s.alloc_async((n * 4) as usize, st);
                    let q = s.alloc((n * 4) as usize);
                    for round in 0..20u32 {
                        s.launch(
                            find("fill_pattern"),
                            2,
                            64,
                            st,
                            &[Arg::ptr(p), Arg::U64(n), Arg::U32(t * 100 + round)],
                            Form::Params,
                        );
                        s.launch(
                            find("copy_u32"),
                            2,
                            64,
                            st,
                            &[Arg::ptr(q), Arg::ptr(p), Arg::U64(n)],
                            Form::Extra,
                        );
                    }
                    s.sync_stream(st);
                    let data = s.download(q, (n * 4) as usize, None);
                    s.free_async(p, st);
                    s.free(q);
                    s.sync_stream(st);
                    format!("D thread{t} {:016x}", tensile_tests::expect::fnv1a(&data))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    for d in digests {
        println!("{d}");
    }
}
