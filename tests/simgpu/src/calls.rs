//! Counting the driver calls a process makes (`TENSILE_SIM_CALL_COUNTS=PATH`, `%p` in PATH
//! replaced by the pid): at exit, one line per entry point called, `name count`, sorted by
//! name. Tests compare what reaches the driver per launch under different configurations
//! (a stream wait or an event record added per launch costs nothing on the simulator but
//! serializes streams on a GPU). Unset: one relaxed load per call.
//!
//! Counted at the export, per exported name: `cuEventRecord` and `cuEventRecord_ptsz` are
//! separate lines. `cuInit`, `cuGetProcAddress[_v2]` and `cuGetExportTable` are not counted.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

/// 0: not read yet; 1: off; 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);
static COUNTS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

const VAR: &str = "TENSILE_SIM_CALL_COUNTS";

/// Counts one call of export `name` (when counting is on).
#[inline]
pub fn count(name: &'static str) {
    match STATE.load(Ordering::Relaxed) {
        1 => {}
        2 => add(name),
        _ => first(name),
    }
}

#[cold]
fn first(name: &'static str) {
    let on = std::env::var_os(VAR).is_some_and(|v| !v.is_empty());
    if STATE
        .compare_exchange(
            0,
            if on { 2 } else { 1 },
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
        && on
    {
        // SAFETY: registering a plain `extern "C" fn()` handler.
        unsafe { libc::atexit(write_at_exit) };
    }
    if STATE.load(Ordering::Acquire) == 2 {
        add(name);
    }
}

fn add(name: &'static str) {
    let mut counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    *counts.entry(name).or_insert(0) += 1;
}

/// The counts so far, by export name.
pub fn snapshot() -> BTreeMap<&'static str, u64> {
    COUNTS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

extern "C" fn write_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(path) = std::env::var_os(VAR) else {
            return;
        };
        let path = path
            .to_string_lossy()
            .replace("%p", &std::process::id().to_string());
        let mut text = String::new();
        for (name, n) in snapshot() {
            text.push_str(&format!("{name} {n}\n"));
        }
        match std::fs::File::create(&path) {
            Ok(mut f) => {
                let _ = f.write_all(text.as_bytes());
            }
            Err(e) => eprintln!("simgpu: cannot write the call counts to {path}: {e}"),
        }
    });
}
