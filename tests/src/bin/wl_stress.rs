//! Workload: many threads, a stream and buffers each, far more data than the budget.
//!
//! `wl_stress <threads> <rounds> <seed>`. Each thread owns `BUFFERS` buffers of seeded random
//! sizes (64 KiB to 4 MiB, so several threads' buffers share 2 MiB pages) on its own
//! non-blocking stream. Every round, for every buffer: read it back whole and check every
//! word against the value written in the previous round (bit for bit), then fill it with a
//! new value; between rounds a thread sleeps a seeded random 0 to 2 ms. Under libtensile at a
//! quarter of the footprint every round's reads find pages that other threads' work pushed
//! out, while those threads hold pages pinned by their own calls.
//!
//! Output: `F <footprint bytes>` (the sum of the buffer sizes), then one `T <thread> <words
//! checked>` line per thread, then `done`. A wrong word panics with thread, buffer, round,
//! offset and both values; any driver error panics too (so an out-of-memory fails the run).
//! Nothing here knows about libtensile.

use tensile_tests::driver::Lookup;
use tensile_tests::rng::Rng;
use tensile_tests::session::Session;

const KIB: usize = 1 << 10;
const BUFFERS: usize = 3;

/// The sizes of every thread's buffers, in words of 4 bytes (the fill's unit).
fn plan(threads: usize, seed: u64) -> Vec<Vec<usize>> {
    (0..threads)
        .map(|t| {
            let mut r = Rng(seed ^ (t as u64).wrapping_mul(0x5851_f42d_4c95_7f2d));
            (0..BUFFERS)
                .map(|_| (64 * KIB + r.below(4032 * KIB)) / 4)
                .collect()
        })
        .collect()
}

/// The value of buffer `b` of thread `t` after round `round` (distinct per buffer and round).
fn value(t: usize, b: usize, round: usize) -> u32 {
    0x9e37_79b9u32
        .wrapping_mul(t as u32 + 1)
        .wrapping_add((b as u32) << 20)
        .wrapping_add(round as u32)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut num = |default: u64| {
        args.next().map_or(default, |a| {
            a.parse()
                .expect("usage: wl_stress <threads> <rounds> <seed>")
        })
    };
    let (threads, rounds, seed) = (num(8) as usize, num(4) as usize, num(1));
    let sizes = plan(threads, seed);
    let footprint: usize = sizes.iter().flatten().map(|w| w * 4).sum();
    println!("F {footprint}");
    let s = Session::start(Lookup::ProcAddress {
        version: 13000,
        flags: 0,
    });
    let checked: Vec<usize> = std::thread::scope(|scope| {
        let handles: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(t, words)| {
                let s = &s;
                scope.spawn(move || {
                    s.bind();
                    let mut r = Rng(seed.wrapping_add(1000 + t as u64));
                    let st = s.stream();
                    let bufs: Vec<_> = words.iter().map(|&w| s.alloc_async(w * 4, st)).collect();
                    let mut checked = 0;
                    for round in 0..=rounds {
                        for (b, (&p, &w)) in bufs.iter().zip(words).enumerate() {
                            if round > 0 {
                                let want = value(t, b, round - 1);
                                let got = s.download(p, w * 4, Some(st));
                                for (i, word) in got.chunks_exact(4).enumerate() {
                                    let v = u32::from_ne_bytes(word.try_into().unwrap());
                                    assert!(
                                        v == want,
                                        "thread {t} buffer {b} round {round} byte {}: \
                                         {v:#010x} instead of {want:#010x}",
                                        i * 4
                                    );
                                }
                                checked += w;
                            }
                            if round < rounds {
                                s.memset(p, 4, value(t, b, round), w, Some(st));
                            }
                        }
                        let pause = r.below(2000) as u64;
                        std::thread::sleep(std::time::Duration::from_micros(pause));
                    }
                    for p in bufs {
                        s.free_async(p, st);
                    }
                    s.sync_stream(st);
                    checked
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    for (t, n) in checked.iter().enumerate() {
        println!("T {t} {n}");
    }
    println!("done");
}
