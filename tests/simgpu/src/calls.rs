//! Counting the driver calls a process makes (`TENSILE_SIM_CALL_COUNTS=PATH`, `%p` in PATH
//! replaced by the pid): at exit, one line per entry point called, `name count`, sorted by
//! name, then the VMM calls' sizes and times ([`vmm_held`], lines starting `vmm `). Tests
//! compare what reaches the driver per launch under different configurations (a stream wait
//! or an event record added per launch costs nothing on the simulator but serializes streams
//! on a GPU). Unset: one relaxed load per call.
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
/// Per VMM call kind and side (device, host): calls, mappings, pages, the time modelled and
/// the time the caller was actually held, in ns.
static VMM_TIME: Mutex<BTreeMap<(&'static str, &'static str), [u64; 5]>> =
    Mutex::new(BTreeMap::new());

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

/// Notes a VMM call's hold (when counting is on): the `mappings` (allocations, for create
/// and release) and `pages` it covered, `modelled` what it was to take and `held` what it
/// took, both in ns of wall time; `host`: of host memory. Written at exit beside the counts,
/// as `vmm NAME SIDE calls mappings pages modelled_ms held_ms`: how large the mappings a
/// run makes are (their cost is per mapping), and how much longer than modelled a loaded
/// machine holds a thread (a sleep oversleeps; a spin waits for a core).
pub fn vmm_held(
    name: &'static str,
    host: bool,
    mappings: u64,
    pages: u64,
    modelled: u64,
    held: u64,
) {
    if STATE.load(Ordering::Relaxed) != 2 {
        return;
    }
    let side = if host { "host" } else { "device" };
    let mut t = VMM_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let e = t.entry((name, side)).or_insert([0; 5]);
    for (sum, v) in e.iter_mut().zip([1, mappings, pages, modelled, held]) {
        *sum += v;
    }
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
        let vmm = VMM_TIME.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for ((name, side), [n, mappings, pages, modelled, held]) in vmm {
            text.push_str(&format!(
                "vmm {name} {side} {n} {mappings} {pages} {:.3} {:.3}\n",
                modelled as f64 / 1e6,
                held as f64 / 1e6
            ));
        }
        match std::fs::File::create(&path) {
            Ok(mut f) => {
                let _ = f.write_all(text.as_bytes());
            }
            Err(e) => eprintln!("simgpu: cannot write the call counts to {path}: {e}"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmm_holds_add_up_by_call_and_side() {
        STATE.store(2, Ordering::Release);
        vmm_held("cuMemTestCall", true, 3, 12, 100, 130);
        vmm_held("cuMemTestCall", true, 1, 4, 50, 55);
        vmm_held("cuMemTestCall", false, 1, 8, 10, 10);
        let t = VMM_TIME.lock().unwrap().clone();
        assert_eq!(t[&("cuMemTestCall", "host")], [2, 4, 16, 150, 185]);
        assert_eq!(t[&("cuMemTestCall", "device")], [1, 1, 8, 10, 10]);
    }
}
