//! Workload: how long a thread whose data is resident waits while another thread swaps.
//!
//! `wl_hotlatency [seconds] [cold MiB]` (defaults 3, 256). Thread A memsets a hot 2 MiB
//! buffer on its own stream in a loop and times each call (the host time of the
//! `cuMemsetD32Async` call: under libtensile, the hook's wait for the manager included);
//! thread B cycles `cold MiB` of 2 MiB buffers on another stream, memsetting each in turn, so
//! that under a smaller budget every one of its calls swaps. Run with
//! `TENSILE_SIM_COPY_GBPS=4` to model copies at 4 GB/s. Prints
//! `L calls <n> p50_us <..> p99_us <..> worst_us <..> cold_calls <n>`.
//! Nothing here knows about libtensile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tensile_tests::driver::Lookup;
use tensile_tests::session::Session;

const PAGE: usize = 2 << 20;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut num = |default: u64| {
        args.next().map_or(default, |a| {
            a.parse()
                .expect("usage: wl_hotlatency [seconds] [cold MiB]")
        })
    };
    let (seconds, cold_mib) = (num(3), num(256) as usize);
    let s = Session::start(Lookup::ProcAddress {
        version: 13000,
        flags: 0,
    });
    let stop = AtomicBool::new(false);
    let (mut lat, cold_calls) = std::thread::scope(|scope| {
        let cold = scope.spawn(|| {
            s.bind();
            let st = s.stream();
            let bufs: Vec<_> = (0..cold_mib * (1 << 20) / PAGE)
                .map(|_| s.alloc_async(PAGE, st))
                .collect();
            let mut calls = 0u64;
            'run: loop {
                for &p in &bufs {
                    if stop.load(Ordering::Relaxed) {
                        break 'run;
                    }
                    s.memset(p, 4, calls as u32, PAGE / 4, Some(st));
                    calls += 1;
                }
                s.sync_stream(st);
            }
            s.sync_stream(st);
            for p in bufs {
                s.free_async(p, st);
            }
            s.sync_stream(st);
            calls
        });
        let hot = scope.spawn(|| {
            s.bind();
            let st = s.stream();
            let p = s.alloc_async(PAGE, st);
            let mut lat: Vec<Duration> = Vec::new();
            let end = Instant::now() + Duration::from_secs(seconds);
            let mut i = 0u32;
            while Instant::now() < end {
                let t0 = Instant::now();
                s.memset(p, 4, i, PAGE / 4, Some(st));
                lat.push(t0.elapsed());
                i += 1;
                if i.is_multiple_of(64) {
                    s.sync_stream(st);
                }
            }
            stop.store(true, Ordering::Relaxed);
            s.sync_stream(st);
            s.free_async(p, st);
            s.sync_stream(st);
            lat
        });
        let lat = hot.join().expect("hot thread panicked");
        (lat, cold.join().expect("cold thread panicked"))
    });
    lat.sort_unstable();
    let at = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    println!(
        "L calls {} p50_us {:.1} p99_us {:.1} worst_us {:.1} cold_calls {cold_calls}",
        lat.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    );
}
