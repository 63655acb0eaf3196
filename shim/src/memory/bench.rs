//! Micro-benchmarks of the manager's hot paths on the fake driver, as ignored tests:
//! `cargo test --release -p tensile-shim --lib memory::bench -- --ignored --nocapture`.
//!
//! They print nanoseconds per operation. The fake driver's own cost (a mutex and a queue per
//! call) is measured too and printed beside, so the manager's share can be read off; it is
//! not a stand-in for the real driver's cost.

use std::sync::Arc;
use std::time::Instant;

use super::fake::{FakeConfig, FakeDriver, Progress};
use super::{Driver, ManagerConfig, MemoryManager, Stream};

fn setup() -> (Arc<FakeDriver>, MemoryManager) {
    let fake = Arc::new(FakeDriver::new(FakeConfig {
        device_capacity: 1 << 40,
        host_capacity: 1 << 40,
        progress: Progress::Immediate,
    }));
    let mut cfg = ManagerConfig::new(1 << 30, 1 << 30);
    cfg.host_background = false;
    cfg.host_chunk_bytes = 64 << 20;
    let mm = MemoryManager::new(fake.clone(), cfg).unwrap();
    (fake, mm)
}

fn time(label: &str, iters: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    let ns = t.elapsed().as_nanos() as f64 / iters as f64;
    println!("{label:<58} {ns:>9.0} ns");
    ns
}

#[test]
#[ignore = "benchmark; run with --ignored --nocapture in release"]
fn hot_paths() {
    let (fake, mm) = setup();
    let s = fake.stream_create().unwrap();
    let ev = fake.event_create().unwrap();
    time(
        "fake driver: event_record (baseline, in each free/note)",
        200_000,
        || {
            fake.event_record(ev, s).unwrap();
        },
    );
    time(
        "alloc + free, 256 KiB, stream-ordered, same stream",
        200_000,
        || {
            let p = mm.alloc(256 << 10, Some(s)).unwrap();
            mm.free(p, Some(s)).unwrap();
        },
    );
    time(
        "alloc + free, 64 MiB, stream-ordered, same stream",
        100_000,
        || {
            let p = mm.alloc(64 << 20, Some(s)).unwrap();
            mm.free(p, Some(s)).unwrap();
        },
    );
    // A launch's worth of tensors, all resident.
    let bufs: Vec<_> = (0..8)
        .map(|i| mm.alloc((1 + i) << 20, Some(s)).unwrap())
        .collect();
    let ranges: Vec<_> = bufs
        .iter()
        .enumerate()
        .map(|(i, &b)| (b, (1 + i) << 20))
        .collect();
    let t = mm.prepare_access(s, &ranges).unwrap();
    mm.note_access_done(t).unwrap();
    time(
        "prepare_access, 8 resident tensors (36 MiB), + note",
        200_000,
        || {
            let t = mm.prepare_access(s, &ranges).unwrap();
            mm.note_access_done(t).unwrap();
        },
    );
    time("prepare_access, 1 resident tensor, + note", 200_000, || {
        let t = mm.prepare_access(s, &ranges[..1]).unwrap();
        mm.note_access_done(t).unwrap();
    });
    let mut tickets = Vec::with_capacity(200_000);
    let ns = time("prepare_access alone, 8 resident tensors", 100_000, || {
        tickets.push(mm.prepare_access(s, &ranges).unwrap());
    });
    for t in tickets {
        mm.note_access_done(t).unwrap();
    }
    // The launch hook's cost for resident data at 1,000 live allocations (issue 9).
    let live: Vec<_> = (0..1000)
        .map(|_| mm.alloc(256 << 10, Some(s)).unwrap())
        .collect();
    for &b in &live {
        let t = mm.prepare_access(s, &[(b, 256 << 10)]).unwrap();
        mm.note_access_done(t).unwrap();
    }
    let live_ns = time(
        "prepare_access + note, 1 resident tensor, 1,000 live allocations",
        200_000,
        || {
            let t = mm.prepare_access(s, &[(live[500], 256 << 10)]).unwrap();
            mm.note_access_done(t).unwrap();
        },
    );
    for b in live {
        mm.free(b, Some(s)).unwrap();
    }
    let _ = Stream(0);
    assert!(
        live_ns < 20_000.0,
        "resident access at 1,000 live took {live_ns} ns"
    );
    // Generous: catches an accidental driver call or a quadratic loop, not noise.
    assert!(ns < 20_000.0, "resident prepare_access took {ns} ns");
}
