//! Pins for captured graphs and for memory exported to other processes: resident at once
//! without touching the capturing stream, never evicted while allocated, released by the
//! free.

use std::sync::Arc;

use tensile_driver_abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY};

use super::super::fake::{FakeConfig, FakeDriver, Progress};
use super::*;

const PAGE: usize = 64 << 10;

fn setup(budget_pages: usize) -> (Arc<FakeDriver>, MemoryManager) {
    let fake = Arc::new(FakeDriver::new(FakeConfig {
        device_capacity: 1 << 40,
        host_capacity: 1 << 40,
        progress: Progress::Immediate,
    }));
    let cfg = ManagerConfig {
        device: 0,
        page_size: PAGE,
        arena_bytes: 1024 * PAGE,
        device_budget: budget_pages * PAGE,
        grow_bytes: 4 * PAGE,
        host_cap: 64 * PAGE,
        shared_host_cap: None,
        host_chunk_bytes: 8 * PAGE,
        numa_node: 0,
        host_background: false,
        evict_batch: 2,
        free_reserve_pages: 1,
        fence_every: 1,
        advice_sample: ADVICE_SAMPLE,
        host_mapped: true,
        host_units: false,
        hand_over: true,
    };
    let mm = MemoryManager::new(fake.clone(), cfg).unwrap();
    (fake, mm)
}

fn touch(fake: &FakeDriver, mm: &MemoryManager, s: Stream, p: CUdeviceptr, len: usize) {
    let t = mm.prepare_access(s, &[(p, len)]).unwrap();
    fake.app_write(s, p, vec![p as u8; len]).unwrap();
    mm.note_access_done(t).unwrap();
}

fn on_device(mm: &MemoryManager, p: CUdeviceptr) -> bool {
    matches!(mm.residency(p), Some(ResidencyState::Device(_)))
}

#[test]
fn a_capture_pinned_allocation_stays_resident_until_freed() {
    let (fake, mm) = setup(4);
    let s = fake.stream_create().unwrap();
    let a = mm.alloc(2 * PAGE, None).unwrap();
    touch(&fake, &mm, s, a, 2 * PAGE);
    // Push `a` out first, so the pin has to bring it back.
    let b = mm.alloc(4 * PAGE, None).unwrap();
    touch(&fake, &mm, s, b, 4 * PAGE);
    assert!(!on_device(&mm, a), "the budget forced `a` out");
    mm.pin_for_capture(&[(a + 100, 8)]).unwrap();
    assert!(mm.is_capture_pinned(a));
    assert!(on_device(&mm, a) && on_device(&mm, a + PAGE as u64));
    mm.audit().unwrap();
    // Pressure on the other pages never moves `a`.
    for _ in 0..3 {
        let c = mm.alloc(2 * PAGE, None).unwrap();
        touch(&fake, &mm, s, c, 2 * PAGE);
        touch(&fake, &mm, s, b, PAGE);
        assert!(on_device(&mm, a) && on_device(&mm, a + PAGE as u64));
        mm.free(c, None).unwrap();
    }
    // More than the unpinned rest of the budget at once is out of memory.
    assert_eq!(
        mm.prepare_access(s, &[(b, 4 * PAGE)]).err(),
        Some(CUDA_ERROR_OUT_OF_MEMORY)
    );
    mm.audit().unwrap();
    // Freed: unpinned, and its pages may go.
    mm.free(a, None).unwrap();
    assert!(!mm.is_capture_pinned(a));
    touch(&fake, &mm, s, b, 4 * PAGE);
    mm.audit().unwrap();
    assert!(fake.faults().is_empty() && fake.violations().is_empty());
}

#[test]
fn an_exported_allocation_is_pinned_and_named_by_the_units_that_back_it() {
    let (fake, mm) = setup(6);
    let s = fake.stream_create().unwrap();
    // A small allocation sharing a page with the exported one, which spans three pages.
    let small = mm.alloc(PAGE / 2, None).unwrap();
    let a = mm.alloc(2 * PAGE + 100, None).unwrap();
    touch(&fake, &mm, s, small, PAGE / 2);
    touch(&fake, &mm, s, a, 2 * PAGE + 100);
    let b = mm.alloc(6 * PAGE, None).unwrap();
    touch(&fake, &mm, s, b, 6 * PAGE);
    assert!(!on_device(&mm, a), "the budget forced `a` out");
    let ex = mm.pin_for_export(a + 5).unwrap();
    assert_eq!((ex.ptr, ex.size), (a, 2 * PAGE as u64 + 100));
    assert!(mm.is_capture_pinned(a));
    // Whole units, back to back, covering the allocation.
    assert!(ex.span_start <= a && a + ex.size <= ex.span_start + ex.span_bytes);
    let mut at = 0;
    for u in &ex.units {
        assert_eq!(u.offset, at);
        assert!(u.bytes > 0 && u.bytes.is_multiple_of(PAGE as u64));
        at += u.bytes;
    }
    assert_eq!(at, ex.span_bytes);
    assert_eq!(fake.exported().len(), ex.units.len());
    // Each unit is the one mapped there now, and stays there under pressure.
    for p in (0..ex.span_bytes).step_by(PAGE) {
        assert!(on_device(&mm, ex.span_start + p));
    }
    for _ in 0..3 {
        touch(&fake, &mm, s, b, 2 * PAGE);
        touch(&fake, &mm, s, b + 2 * PAGE as u64, 2 * PAGE);
        for p in (0..ex.span_bytes).step_by(PAGE) {
            assert!(on_device(&mm, ex.span_start + p));
        }
    }
    mm.audit().unwrap();
    assert_eq!(
        mm.pin_for_export(mm_unallocated(&mm)).err(),
        Some(CUDA_ERROR_INVALID_VALUE)
    );
    // Freed: unpinned.
    mm.free(a, None).unwrap();
    assert!(!mm.is_capture_pinned(a));
    touch(&fake, &mm, s, b, 6 * PAGE);
    mm.audit().unwrap();
    assert!(fake.faults().is_empty() && fake.violations().is_empty());
}

/// An arena address no allocation holds: far past the frontier.
fn mm_unallocated(mm: &MemoryManager) -> CUdeviceptr {
    let probe = mm.alloc(PAGE, None).unwrap();
    mm.free(probe, None).unwrap();
    probe + 512 * PAGE as u64
}
