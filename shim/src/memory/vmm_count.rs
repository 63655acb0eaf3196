//! How many VMM calls (`cuMemMap`, `cuMemUnmap`, `cuMemSetAccess`, `cuMemCreate`, ...) the
//! manager makes per MiB it swaps, counted on the fake driver for a training-like workload
//! under pressure, and split by where they happen: inside `prepare_access` (the launch path,
//! where they stall the application) or inside `maintain` (the interposer's background
//! thread).
//!
//! The table: `cargo test --release -p tensile-shim --lib memory::vmm_count -- --ignored
//! --nocapture`. The regression test (not ignored) checks the bounds the batching gives.
//! Counts only: the fake driver's timing says nothing about the real driver's.

use std::sync::Arc;

use super::fake::{FakeCall, FakeConfig, FakeDriver, Progress};
use super::{Driver, ManagerConfig, MemoryManager};

const MIB: usize = 1 << 20;
const PAGE: usize = 2 * MIB;

/// The VMM call kinds counted.
const VMM: [FakeCall; 7] = [
    FakeCall::AddressReserve,
    FakeCall::CreateDevice,
    FakeCall::CreateHost,
    FakeCall::Release,
    FakeCall::Map,
    FakeCall::Unmap,
    FakeCall::SetAccess,
];

/// VMM calls by kind (indexed as [`VMM`]).
#[derive(Debug, Default, Clone, Copy)]
struct Counts([u64; VMM.len()]);

impl Counts {
    fn read(fake: &FakeDriver) -> Self {
        Counts(VMM.map(|c| fake.calls(c)))
    }

    fn since(self, before: Counts) -> Counts {
        let mut out = self;
        for (o, b) in out.0.iter_mut().zip(before.0) {
            *o -= b;
        }
        out
    }

    fn add(&mut self, other: Counts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    fn get(&self, call: FakeCall) -> u64 {
        VMM.iter().position(|&c| c == call).map_or(0, |i| self.0[i])
    }

    fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// What one run measured.
struct Run {
    launch_path: Counts,
    background: Counts,
    mib_moved: f64,
    pages_moved: u64,
    /// Pages of the footprint (each mapped once when first backed).
    footprint_pages: u64,
}

/// A training-like loop: `layers` layers, each a 2-page weight, a 4-page activation and a
/// 2-page gradient plus a small bias; forward touches weight, bias, previous and own
/// activation; backward (reverse order) weight, activation and gradient. The budget is a
/// quarter of the footprint. `maintain_every`: call `maintain` after every n-th launch, as
/// the interposer's background thread would between launches (0: never).
fn run(layers: usize, iterations: usize, maintain_every: usize) -> Run {
    let fake = Arc::new(FakeDriver::new(FakeConfig {
        device_capacity: 1 << 40,
        host_capacity: 1 << 40,
        progress: Progress::Immediate,
    }));
    let footprint_pages = layers * 8 + 1;
    let mut cfg = ManagerConfig::new(footprint_pages / 4 * PAGE, 2 * footprint_pages * PAGE);
    cfg.host_background = false;
    cfg.host_chunk_bytes = 64 * MIB;
    // The interposer caps both at a quarter of small budgets (see `managed.rs`).
    cfg.free_reserve_pages = cfg.free_reserve_pages.min(footprint_pages / 16);
    cfg.evict_batch = cfg.evict_batch.min(footprint_pages / 16);
    let mm = MemoryManager::new(fake.clone(), cfg).expect("manager");
    let s = fake.stream_create().expect("stream");
    let alloc = |bytes: usize| (mm.alloc(bytes, Some(s)).expect("alloc"), bytes);
    let tensors: Vec<[(u64, usize); 4]> = (0..layers)
        .map(|_| {
            [
                alloc(2 * PAGE),
                alloc(4 * 1024),
                alloc(4 * PAGE),
                alloc(2 * PAGE),
            ]
        })
        .collect();
    let mut launch_path = Counts::default();
    let mut background = Counts::default();
    let mut launches = 0usize;
    let mut launch = |ranges: &[(u64, usize)]| {
        let before = Counts::read(&fake);
        let t = mm.prepare_access(s, ranges).expect("prepare_access");
        mm.note_access_done(t).expect("note_access_done");
        launch_path.add(Counts::read(&fake).since(before));
        launches += 1;
        if maintain_every > 0 && launches.is_multiple_of(maintain_every) {
            let before = Counts::read(&fake);
            mm.maintain().expect("maintain");
            background.add(Counts::read(&fake).since(before));
        }
    };
    for _ in 0..iterations {
        for l in 0..layers {
            let [w, b, a, _] = tensors[l];
            let prev = tensors[l.saturating_sub(1)][2];
            launch(&[w, b, prev, a]);
        }
        for l in (0..layers).rev() {
            let [w, _, a, g] = tensors[l];
            launch(&[w, a, g]);
        }
    }
    mm.audit().expect("audit");
    assert!(fake.faults().is_empty(), "{:?}", fake.faults());
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    let st = mm.stats();
    let moved = st.bytes_to_host + st.bytes_to_device;
    Run {
        launch_path,
        background,
        mib_moved: moved as f64 / MIB as f64,
        pages_moved: st.pages_evicted + st.pages_swapped_in,
        footprint_pages: footprint_pages as u64,
    }
}

fn print_row(label: &str, c: Counts, r: &Run) {
    let per_mib = |n: u64| n as f64 / r.mib_moved;
    println!(
        "{label:<28} {:>7} {:>7} {:>7} {:>7} {:>7}   {:>6.3} {:>6.3} {:>6.3} {:>6.3}",
        c.get(FakeCall::Map),
        c.get(FakeCall::Unmap),
        c.get(FakeCall::SetAccess),
        c.get(FakeCall::CreateDevice) + c.get(FakeCall::CreateHost),
        c.total(),
        per_mib(c.get(FakeCall::Map)),
        per_mib(c.get(FakeCall::Unmap)),
        per_mib(c.get(FakeCall::SetAccess)),
        per_mib(c.total()),
    );
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture"]
fn vmm_calls_per_mib_swapped() {
    println!(
        "{:<28} {:>7} {:>7} {:>7} {:>7} {:>7}   {:>6} {:>6} {:>6} {:>6}",
        "", "map", "unmap", "access", "create", "all", "map/M", "unm/M", "acc/M", "all/M"
    );
    for maintain_every in [0, 4, 1] {
        let r = run(16, 4, maintain_every);
        println!(
            "-- maintain every {maintain_every} launches (0: never): {:.0} MiB moved, {} pages",
            r.mib_moved, r.pages_moved
        );
        print_row("launch path", r.launch_path, &r);
        print_row("maintain", r.background, &r);
        let mut all = r.launch_path;
        all.add(r.background);
        print_row("total", all, &r);
    }
}

/// The VMM calls one access makes, as `(map, unmap, set access)`.
fn calls_of(fake: &FakeDriver, f: impl FnOnce()) -> (u64, u64, u64) {
    let before = Counts::read(fake);
    f();
    let c = Counts::read(fake).since(before);
    (
        c.get(FakeCall::Map),
        c.get(FakeCall::Unmap),
        c.get(FakeCall::SetAccess),
    )
}

/// The page of the small managers below.
const SMALL_PAGE: usize = 64 << 10;

/// A manager of `budget_pages` pages of [`SMALL_PAGE`] on an immediate fake driver, one fence
/// per launch, nothing reserved, swapped-out pages mapped to the host or not.
fn small_manager(budget_pages: usize, host_mapped: bool) -> (Arc<FakeDriver>, MemoryManager) {
    const P: usize = SMALL_PAGE;
    let fake = Arc::new(FakeDriver::new(FakeConfig {
        device_capacity: 1 << 30,
        host_capacity: 1 << 30,
        progress: Progress::Immediate,
    }));
    let cfg = ManagerConfig {
        device: 0,
        page_size: P,
        arena_bytes: 1024 * P,
        device_budget: budget_pages * P,
        grow_bytes: budget_pages * P,
        host_cap: 64 * P,
        shared_host_cap: None,
        host_chunk_bytes: 16 * P,
        numa_node: 0,
        host_background: false,
        evict_batch: 4,
        free_reserve_pages: 0,
        fence_every: 1,
        advice_sample: super::manager::ADVICE_SAMPLE,
        host_mapped,
        host_units: true,
        hand_over: true,
    };
    let mm = MemoryManager::new(fake.clone(), cfg).expect("manager");
    (fake, mm)
}

/// One launch's access to the 4 pages from `ptr`.
fn access_4_pages(mm: &MemoryManager, s: super::Stream, ptr: u64) {
    let t = mm
        .prepare_access(s, &[(ptr, 4 * SMALL_PAGE)])
        .expect("prepare_access");
    mm.note_access_done(t).expect("note_access_done");
}

/// One launch's access to `ranges`.
fn touch(mm: &MemoryManager, s: super::Stream, ranges: &[(u64, usize)]) {
    let t = mm.prepare_access(s, ranges).expect("prepare_access");
    mm.note_access_done(t).expect("note_access_done");
}

/// `want` is what the `want.len()` bytes at `ptr` read, and the fake driver saw no fault.
fn assert_reads(fake: &FakeDriver, s: super::Stream, ptr: u64, want: &[u8], what: &str) {
    let read = fake.app_read(s, ptr, want.len()).expect("read");
    assert!(read.get().as_deref() == Some(want), "{what} changed");
    assert!(fake.faults().is_empty(), "{:?}", fake.faults());
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn a_tensor_leaves_and_returns_with_one_mapping_and_one_access_call_each_way() {
    const P: usize = SMALL_PAGE;
    let (fake, mm) = small_manager(8, true);
    let s = fake.stream_create().expect("stream");
    let access = |ptr: u64| access_4_pages(&mm, s, ptr);
    // Three tensors of 4 pages for a budget of 8: each access brings one in and sends the
    // least recently used one out.
    let a = mm.alloc(4 * P, Some(s)).expect("a");
    let b = mm.alloc(4 * P, Some(s)).expect("b");
    let c = mm.alloc(4 * P, Some(s)).expect("c");
    let patterns: Vec<Vec<u8>> = (0..3u8)
        .map(|k| (0..4 * P).map(|i| (i * 7 + i / P) as u8 ^ k).collect())
        .collect();
    for (&x, p) in [a, b, c].iter().zip(&patterns) {
        access(x);
        fake.app_write(s, x, p.clone()).expect("write");
    }
    // Warm-up: the tensors' device and host units are made on their first trips.
    for &x in &[a, b, c, a, b, c] {
        access(x);
    }
    let creates =
        |fake: &FakeDriver| fake.calls(FakeCall::CreateDevice) + fake.calls(FakeCall::CreateHost);
    let created = creates(&fake);
    // Then a trip each way is one mapping: the tensor coming in loses its host unit's
    // mapping and gets its device unit's, the one going out the reverse; one access call
    // per direction; nothing is created (the units of a size are reused).
    for &x in &[a, b, c, a] {
        assert_eq!(calls_of(&fake, || access(x)), (2, 2, 2));
        assert!(matches!(
            mm.residency(x),
            Some(super::ResidencyState::Device(_))
        ));
    }
    assert_eq!(
        creates(&fake),
        created,
        "units were created in steady state"
    );
    for (&x, p) in [a, b, c].iter().zip(&patterns) {
        // Read as a launch would: a tensor whose frames were just handed over to the one
        // brought in last is still on its way out (manager/handover.rs).
        access(x);
        let read = fake.app_read(s, x, 4 * P).expect("read");
        assert!(
            read.get().as_deref() == Some(&p[..]),
            "bytes changed on the trips"
        );
    }
    mm.audit().expect("audit");
    // One page of a tensor on the host comes in with the rest of its host unit (the unit is
    // mapped whole), and every byte still reads right. (Polled first: the last one to leave
    // was handed over, and is completed there.)
    mm.poll().expect("poll");
    let out = [a, b, c]
        .into_iter()
        .position(|x| matches!(mm.residency(x), Some(super::ResidencyState::Host(_))))
        .expect("one tensor is on the host");
    let x = [a, b, c][out];
    let t = mm
        .prepare_access(s, &[(x + P as u64, P)])
        .expect("one page");
    mm.note_access_done(t).expect("note");
    for page in 0..4 {
        assert!(
            matches!(
                mm.residency(x + (page * P) as u64),
                Some(super::ResidencyState::Device(_))
            ),
            "page {page} stayed on the host"
        );
    }
    mm.audit().expect("audit after one page came in");
    let read = fake.app_read(s, x, 4 * P).expect("read");
    assert!(
        read.get().as_deref() == Some(&patterns[out][..]),
        "bytes changed"
    );
    assert!(fake.faults().is_empty(), "{:?}", fake.faults());
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn a_small_tensor_packed_into_a_large_ones_last_page_comes_in_alone() {
    const P: usize = SMALL_PAGE;
    let (fake, mm) = small_manager(8, true);
    let s = fake.stream_create().expect("stream");
    // A tensor of 3 pages and a quarter: the arena packs a small one into the rest of its
    // last page.
    let big_len = 3 * P + P / 4;
    let big = mm.alloc(big_len, Some(s)).expect("big");
    let small = mm.alloc(P / 8, Some(s)).expect("small");
    let last_page = big + 3 * P as u64;
    assert!(
        (last_page..last_page + P as u64).contains(&small),
        "the small tensor is not in the large one's last page"
    );
    let touch = |ranges: &[(u64, usize)]| touch(&mm, s, ranges);
    touch(&[(big, big_len), (small, P / 8)]);
    let big_bytes: Vec<u8> = (0..big_len).map(|i| (i * 13 + i / P) as u8).collect();
    let small_bytes: Vec<u8> = (0..P / 8).map(|i| (i * 5) as u8 ^ 0x5a).collect();
    fake.app_write(s, big, big_bytes.clone())
        .expect("write big");
    fake.app_write(s, small, small_bytes.clone())
        .expect("write small");
    // Both go out (into a host unit of 3 pages and a single frame), then the small one alone
    // is used: only its page comes back.
    assert_eq!(mm.start_swap_out(&[(big, big_len)]).expect("swap out"), 4);
    mm.poll().expect("poll");
    assert!(matches!(
        mm.residency(big),
        Some(super::ResidencyState::Host(_))
    ));
    let before = mm.stats().pages_swapped_in;
    touch(&[(small, P / 8)]);
    assert_eq!(
        mm.stats().pages_swapped_in - before,
        1,
        "the small tensor's access brought in more than its page"
    );
    for page in 0..3 {
        assert!(
            matches!(
                mm.residency(big + (page * P) as u64),
                Some(super::ResidencyState::Host(_))
            ),
            "page {page} of the large tensor came in"
        );
    }
    mm.audit().expect("audit");
    touch(&[(big, big_len)]);
    assert_reads(&fake, s, big, &big_bytes, "big");
    assert_reads(&fake, s, small, &small_bytes, "small");
}

#[test]
fn tensors_on_the_pages_of_a_freed_ones_unit_leave_and_return_apart() {
    const P: usize = SMALL_PAGE;
    let (fake, mm) = small_manager(8, true);
    let s = fake.stream_create().expect("stream");
    let touch = |ranges: &[(u64, usize)]| touch(&mm, s, ranges);
    // A tensor of 4 pages gets a device unit of 4, is freed, and two tensors of 2 pages take
    // its place (and its unit: its last use has not run yet, so it cannot be dropped).
    let old = mm.alloc(4 * P, Some(s)).expect("old");
    fake.set_progress(Progress::Manual);
    touch(&[(old, 4 * P)]);
    mm.free(old, Some(s)).expect("free");
    let x = mm.alloc(2 * P, Some(s)).expect("x");
    let y = mm.alloc(2 * P, Some(s)).expect("y");
    fake.set_progress(Progress::Immediate);
    assert_eq!(
        (x, y),
        (old, old + 2 * P as u64),
        "the freed pages were not reused"
    );
    touch(&[(x, 2 * P), (y, 2 * P)]);
    let xs: Vec<u8> = (0..2 * P).map(|i| (i * 3) as u8).collect();
    let ys: Vec<u8> = (0..2 * P).map(|i| (i * 7) as u8 ^ 0xa5).collect();
    fake.app_write(s, x, xs.clone()).expect("write x");
    fake.app_write(s, y, ys.clone()).expect("write y");
    // The unit leaves whole; on the host each tensor has a host unit of its own, so the
    // next use of one brings in its pages alone.
    assert_eq!(mm.start_swap_out(&[(x, 2 * P)]).expect("swap out"), 4);
    mm.poll().expect("poll");
    let before = mm.stats().pages_swapped_in;
    touch(&[(x, 2 * P)]);
    assert_eq!(mm.stats().pages_swapped_in - before, 2, "y came in with x");
    assert!(matches!(
        mm.residency(y),
        Some(super::ResidencyState::Host(_))
    ));
    mm.audit().expect("audit");
    touch(&[(y, 2 * P)]);
    assert_reads(&fake, s, x, &xs, "x");
    assert_reads(&fake, s, y, &ys, "y");
}

#[test]
fn the_dead_pages_of_a_unit_going_out_are_not_copied() {
    const P: usize = SMALL_PAGE;
    let (fake, mm) = small_manager(8, true);
    let s = fake.stream_create().expect("stream");
    let touch = |ranges: &[(u64, usize)]| touch(&mm, s, ranges);
    // A unit of 4 pages whose tensor was freed (its last use not run yet, so the unit stays);
    // a tensor of 2 pages takes its first half, the second half stays dead.
    let old = mm.alloc(4 * P, Some(s)).expect("old");
    fake.set_progress(Progress::Manual);
    touch(&[(old, 4 * P)]);
    mm.free(old, Some(s)).expect("free");
    let x = mm.alloc(2 * P, Some(s)).expect("x");
    fake.set_progress(Progress::Immediate);
    assert_eq!(x, old, "the freed pages were not reused");
    touch(&[(x, 2 * P)]);
    let xs: Vec<u8> = (0..2 * P).map(|i| (i * 11) as u8 ^ 0x3c).collect();
    fake.app_write(s, x, xs.clone()).expect("write x");
    // The unit leaves whole, but only x's pages are copied.
    let before = mm.stats().bytes_to_host;
    assert_eq!(mm.start_swap_out(&[(x, 2 * P)]).expect("swap out"), 4);
    mm.poll().expect("poll");
    assert_eq!(
        mm.stats().bytes_to_host - before,
        2 * P as u64,
        "dead pages were copied"
    );
    mm.audit().expect("audit");
    touch(&[(x, 2 * P)]);
    assert_reads(&fake, s, x, &xs, "x");
    // The dead pages hold an allocation again, which reads what it writes.
    let y = mm.alloc(2 * P, Some(s)).expect("y");
    assert_eq!(y, old + 2 * P as u64);
    touch(&[(y, 2 * P)]);
    let ys: Vec<u8> = (0..2 * P).map(|i| (i * 5) as u8).collect();
    fake.app_write(s, y, ys.clone()).expect("write y");
    touch(&[(x, 2 * P), (y, 2 * P)]);
    assert_reads(&fake, s, y, &ys, "y");
    assert_reads(&fake, s, x, &xs, "x");
    mm.audit().expect("audit at the end");
}

#[test]
fn a_tensor_on_the_pages_of_a_freed_ones_idle_unit_gets_units_of_its_own() {
    const P: usize = SMALL_PAGE;
    let (fake, mm) = small_manager(8, true);
    let s = fake.stream_create().expect("stream");
    let touch = |ranges: &[(u64, usize)]| touch(&mm, s, ranges);
    // A tensor of 4 pages gets a device unit of 4 and is freed; once its last use is known
    // done, two tensors of 2 pages take its place.
    let old = mm.alloc(4 * P, Some(s)).expect("old");
    touch(&[(old, 4 * P)]);
    mm.free(old, Some(s)).expect("free");
    mm.poll().expect("poll");
    let moved = mm.stats().bytes_to_host;
    let x = mm.alloc(2 * P, Some(s)).expect("x");
    let y = mm.alloc(2 * P, Some(s)).expect("y");
    assert_eq!((x, y), (old, old + 2 * P as u64));
    assert_eq!(mm.stats().bytes_to_host, moved, "the dead unit was copied");
    touch(&[(x, 2 * P), (y, 2 * P)]);
    let xs: Vec<u8> = (0..2 * P).map(|i| (i * 3) as u8 ^ 0x11).collect();
    let ys: Vec<u8> = (0..2 * P).map(|i| (i * 9) as u8).collect();
    fake.app_write(s, x, xs.clone()).expect("write x");
    fake.app_write(s, y, ys.clone()).expect("write y");
    // The old unit is gone: x leaves alone, and y stays.
    assert_eq!(mm.start_swap_out(&[(x, 2 * P)]).expect("swap out"), 2);
    mm.poll().expect("poll");
    assert!(matches!(
        mm.residency(y),
        Some(super::ResidencyState::Device(_))
    ));
    mm.audit().expect("audit");
    touch(&[(x, 2 * P)]);
    assert_reads(&fake, s, x, &xs, "x");
    assert_reads(&fake, s, y, &ys, "y");
}

#[test]
fn with_units_capped_at_a_plans_piece_a_piece_leaves_and_returns_alone() {
    const P: usize = SMALL_PAGE;
    let (fake, mm) = small_manager(16, true);
    let s = fake.stream_create().expect("stream");
    let touch = |ranges: &[(u64, usize)]| touch(&mm, s, ranges);
    // Pieces of 2 pages: a tensor of 6 gets units of 2.
    mm.set_max_unit_pages(Some(2));
    let t = mm.alloc(6 * P, Some(s)).expect("t");
    touch(&[(t, 6 * P)]);
    let bytes: Vec<u8> = (0..6 * P).map(|i| (i * 7) as u8 ^ 0x42).collect();
    fake.app_write(s, t, bytes.clone()).expect("write");
    let piece = t + 2 * P as u64;
    assert_eq!(mm.start_swap_out(&[(piece, 2 * P)]).expect("swap out"), 2);
    mm.poll().expect("poll");
    for (page, on_device) in [(0, true), (2, false), (3, false), (4, true)] {
        let state = mm.residency(t + (page * P) as u64);
        assert_eq!(
            matches!(state, Some(super::ResidencyState::Device(_))),
            on_device,
            "page {page}: {state:?}"
        );
    }
    // It comes back alone, and every byte reads right.
    let before = mm.stats().pages_swapped_in;
    touch(&[(piece, 2 * P)]);
    assert_eq!(mm.stats().pages_swapped_in - before, 2);
    mm.audit().expect("audit");
    assert_reads(&fake, s, t, &bytes, "the tensor");
}

#[test]
fn without_host_mappings_a_unit_moved_costs_one_device_unmap_out_and_one_map_in() {
    const P: usize = SMALL_PAGE;
    let (fake, mm) = small_manager(4, false);
    let s = fake.stream_create().expect("stream");
    let access = |ptr: u64| access_4_pages(&mm, s, ptr);
    let a = mm.alloc(4 * P, Some(s)).expect("a");
    let b = mm.alloc(4 * P, Some(s)).expect("b");
    access(a);
    let pattern: Vec<u8> = (0..4 * P).map(|i| (i * 13 + i / P) as u8).collect();
    fake.app_write(s, a, pattern.clone()).expect("write a");
    // b comes in, a goes out: a's 4 device mappings go (an allocation of over half the
    // budget is backed page by page, as frames are found) and nothing is mapped in their
    // place; b's pages (host-backed when allocated, mapped then) lose their host mappings
    // and get one device unit. One access call, for b.
    let (maps, unmaps, access_calls) = calls_of(&fake, || access(b));
    assert_eq!((maps, unmaps, access_calls), (1, 4 + 4, 1));
    assert!(matches!(
        mm.residency(a),
        Some(super::ResidencyState::Host(_))
    ));
    // An access the manager was not told of faults, as it would on the card...
    let stray = fake.app_read(s, a, P).expect("queued");
    assert!(
        stray.get().is_none(),
        "a stray read of a swapped-out page got bytes"
    );
    let faults = fake.faults().len();
    assert!(
        faults > 0,
        "a stray read of a swapped-out page did not fault"
    );
    // ... and one it prepares brings a back whole: one device map, b's one device unmap, no
    // host-side call at all. (b's frames are handed over to a: its unmap completes its
    // swap-out, at the next poll.)
    assert_eq!(
        calls_of(&fake, || {
            access(a);
            mm.poll().expect("poll");
        }),
        (1, 1, 1)
    );
    let read = fake.app_read(s, a, 4 * P).expect("read a");
    assert!(
        read.get() == Some(pattern),
        "a's bytes changed on the round trip"
    );
    assert_eq!(fake.faults().len(), faults, "no fault once a is back");
    mm.audit().expect("audit");
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn the_training_loop_needs_one_map_and_one_unmap_per_page_moved_and_no_more() {
    let r = run(8, 2, 0);
    let mut all = r.launch_path;
    all.add(r.background);
    // A page moved is unmapped from one frame and mapped to another: nothing can do with
    // less (the driver maps only whole allocations, and a frame is one), and nothing should
    // remap a page that did not move. The footprint's first mappings come on top.
    let map_unmap = all.get(FakeCall::Map) + all.get(FakeCall::Unmap);
    assert!(
        r.pages_moved > 100,
        "the loop must swap: {} pages",
        r.pages_moved
    );
    assert!(
        map_unmap <= r.pages_moved * 2 + r.footprint_pages,
        "{map_unmap} maps and unmaps for {} pages moved, {} in the footprint",
        r.pages_moved,
        r.footprint_pages
    );
}

#[test]
fn without_pressure_a_repeating_step_makes_no_vmm_calls_once_warm() {
    // On the H100 such calls in a step that moves nothing doubled ResNet-50's step under the
    // shim (docs/gpu-results.md): a new tensor on a freed one's pages reuses their frames.
    const P: usize = SMALL_PAGE;
    let fake = Arc::new(FakeDriver::new(FakeConfig {
        device_capacity: 1 << 30,
        host_capacity: 1 << 30,
        progress: Progress::Immediate,
    }));
    // The production configuration (the arena grows 16 pages at a time, backed in units),
    // with a budget far above the footprint.
    let mut cfg = ManagerConfig::with_page(512 * P, 64 * P, P);
    cfg.host_background = false;
    let mm = MemoryManager::new(fake.clone(), cfg).expect("manager");
    let s = fake.stream_create().expect("stream");
    // A training step's shape with stream-ordered frees: forward activations of mixed sizes
    // (partial pages included), half freed in reverse during backward while gradients of
    // other sizes land in their holes, then everything freed. Each step starts with a
    // tensor of another size (none, or a fifth of a page to eight pages), so tensors land on
    // other pages than the step before, as when a free's fence has not completed yet: units
    // made for one step's tensors reach past the next step's.
    let forward = [4 * P, P + P / 3, 2 * P, P / 8, 6 * P, 3 * P, P / 2, 5 * P];
    let backward = [3 * P + P / 4, P, 7 * P, P / 16, 2 * P];
    let step = |fifths: usize| {
        let shift = (fifths > 0).then(|| mm.alloc(fifths * P / 5, Some(s)).expect("shift"));
        let acts: Vec<(u64, usize)> = forward
            .iter()
            .map(|&b| (mm.alloc(b, Some(s)).expect("activation"), b))
            .collect();
        touch(&mm, s, &acts);
        for &(p, _) in acts.iter().rev().step_by(2) {
            mm.free(p, Some(s)).expect("free activation");
        }
        mm.poll().expect("poll");
        let grads: Vec<(u64, usize)> = backward
            .iter()
            .map(|&b| (mm.alloc(b, Some(s)).expect("gradient"), b))
            .collect();
        touch(&mm, s, &grads);
        for &(p, _) in acts.iter().rev().skip(1).step_by(2).chain(&grads) {
            mm.free(p, Some(s)).expect("free");
        }
        if let Some(p) = shift {
            mm.free(p, Some(s)).expect("free shift");
        }
        mm.poll().expect("poll");
    };
    // Warm: the arena has grown to the largest step.
    for fifths in [39, 0, 20] {
        step(fifths);
    }
    let before = Counts::read(&fake);
    for fifths in [16, 33, 10, 27, 4, 21] {
        step(fifths);
    }
    let calls = Counts::read(&fake).since(before);
    assert_eq!(mm.stats().pages_evicted, 0, "nothing had to move");
    assert_eq!(
        calls.total(),
        0,
        "VMM calls in 6 warm steps (reserve, create device, create host, release, map, \
         unmap, set access): {:?}",
        calls.0
    );
    mm.audit().expect("audit");
}
