//! The manager's lock counts the waits of threads that find it held, by whose they are.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::super::fake::{FakeConfig, FakeDriver, Progress};
use super::*;

#[test]
fn threads_that_find_the_managers_lock_held_are_counted_with_their_waits() {
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
    let st = mm.stats();
    assert_eq!((st.app_lock_waits, st.library_lock_waits), (0, 0));
    let held = mm.lock();
    let ready = Barrier::new(3);
    std::thread::scope(|scope| {
        // A thread of the library's (by its name) and one of the application's.
        let waiter = std::thread::Builder::new()
            .name("tensile-test".into())
            .spawn_scoped(scope, || {
                ready.wait();
                mm.budget()
            })
            .expect("spawn");
        let app = scope.spawn(|| {
            ready.wait();
            mm.budget()
        });
        ready.wait();
        std::thread::sleep(Duration::from_millis(30));
        drop(held);
        waiter.join().expect("waiter");
        app.join().expect("app");
    });
    let st = mm.stats();
    assert_eq!((st.app_lock_waits, st.library_lock_waits), (1, 1));
    for (who, ns) in [
        ("app", st.app_lock_wait_ns),
        ("library", st.library_lock_wait_ns),
    ] {
        assert!(ns >= 20_000_000, "{who} waited {ns} ns behind a 30 ms hold");
    }
}
