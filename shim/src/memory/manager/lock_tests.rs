//! The manager's lock counts the waits of threads that find it held.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::super::fake::{FakeConfig, FakeDriver, Progress};
use super::*;

#[test]
fn a_thread_that_finds_the_managers_lock_held_is_counted_with_its_wait() {
    let fake = Arc::new(FakeDriver::new(FakeConfig {
        device_capacity: 1 << 30,
        host_capacity: 1 << 30,
        progress: Progress::Immediate,
    }));
    let mut cfg = ManagerConfig::with_page(8 << 16, 8 << 16, 1 << 16);
    cfg.host_background = false;
    let mm = MemoryManager::new(fake, cfg).expect("manager");
    // Uncontended acquisitions are not counted.
    for _ in 0..3 {
        let _ = mm.budget();
    }
    assert_eq!(mm.stats().lock_waits, 0);
    let held = mm.lock();
    let ready = Barrier::new(2);
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            ready.wait();
            mm.budget()
        });
        ready.wait();
        std::thread::sleep(Duration::from_millis(30));
        drop(held);
        waiter.join().expect("waiter");
    });
    let st = mm.stats();
    assert_eq!(st.lock_waits, 1);
    assert!(
        st.lock_wait_ns >= 20_000_000,
        "waited {} ns behind a 30 ms hold",
        st.lock_wait_ns
    );
}
