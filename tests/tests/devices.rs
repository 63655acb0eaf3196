//! A process using several GPUs, through `LD_PRELOAD` on a simulated GPU of two devices
//! (`TENSILE_SIM_DEVICE_COUNT=2`): each device's memory has a manager of its own, with its own
//! budget, and swaps; every byte comes out as without the shim, a copy from one device's memory
//! to another's included. Under
//! `TENSILE_COORDINATOR=auto` the process has a slot on each device's coordinator, and each
//! device's manager meets its coordinator's grant; two such processes sharing the same two
//! cards both finish, bit for bit.
//!
//! (A process using one device is every other test.)

use std::collections::BTreeMap;

use tensile_tests::expect::named_digests;
use tensile_tests::harness::{Output, Run};

/// Tensors per device and their KiB: a footprint of 24 MiB on each device.
const TENSORS: &str = "16";
const TENSOR_KIB: &str = "1536";
const ROUNDS: &str = "3";
/// Each simulated device's memory, and the budget of each (`TENSILE_DEVICE_MEMORY=80%`:
/// 8 MiB of each card, a third of its footprint).
const CARD: &str = "10MiB";
const BUDGET_MIB: u64 = 8;

fn two_devices() -> Run {
    Run::new(env!("CARGO_BIN_EXE_wl_devices"))
        .arg("2")
        .arg(TENSORS)
        .arg(TENSOR_KIB)
        .arg(ROUNDS)
        .env("TENSILE_SIM_DEVICE_COUNT", "2")
}

/// The run without the shim, on devices with room for everything: the digests to match.
fn native_digests() -> BTreeMap<String, String> {
    let native = two_devices().output();
    native.assert_ok("the native run");
    let want = named_digests(&native.stdout);
    assert_eq!(want.len(), 2 * 16, "{}", native.stdout);
    want
}

/// The numbers of the statistics line at exit of `device`: (MiB to host, MiB to device, peak
/// resident MiB).
fn device_stats(out: &Output, device: u32) -> (u64, u64, u64) {
    let prefix = format!("device {device}: swapped ");
    let line = out
        .stderr
        .lines()
        .find_map(|l| l.split_once(&prefix).map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no statistics of device {device}:\n{}", out.stderr));
    let number_after = |word: &str| -> u64 {
        let at = line
            .find(word)
            .unwrap_or_else(|| panic!("no {word:?} in {line}"));
        line[at + word.len()..]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number after {word:?} in {line}"))
    };
    let to_host: u64 = line
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    (
        to_host,
        number_after("MiB to host and "),
        number_after("peak resident "),
    )
}

#[test]
fn both_devices_memory_is_managed_and_swapped_within_each_budget_and_no_byte_is_lost() {
    let want = native_digests();
    let out = two_devices()
        .preload(true)
        .env("TENSILE_POLICY", "lru")
        .env("TENSILE_DEVICE_MEMORY", "80%")
        .env("TENSILE_SIM_DEVICE_MEMORY", CARD)
        .env("TENSILE_SIM_JITTER_US", "20")
        .env("TENSILE_LOG", "info")
        .output();
    out.assert_ok("two devices under the shim");
    assert_eq!(
        named_digests(&out.stdout),
        want,
        "results differ from the run without the shim\n{}",
        out.stderr
    );
    for device in [0, 1] {
        assert!(
            out.stderr
                .contains(&format!("memory manager on device {device}: budget 8 MiB")),
            "device {device}'s manager did not start with 80% of its card:\n{}",
            out.stderr
        );
        let (to_host, to_device, peak) = device_stats(&out, device);
        assert!(
            to_host > 0 && to_device > 0,
            "device {device} swapped nothing\n{}",
            out.stderr
        );
        assert!(
            peak <= BUDGET_MIB,
            "device {device}: peak {peak} MiB over its budget\n{}",
            out.stderr
        );
    }
    assert!(
        out.stderr
            .contains("this process uses several devices (0 and 1)"),
        "{}",
        out.stderr
    );
    // The copy from device 0's memory with device 1's context current: pinned in its owner.
    assert!(
        out.stderr
            .contains("work on device 1 uses memory of device 0 (peer access"),
        "{}",
        out.stderr
    );
    out.assert_quiet("two devices");
}

/// The `gpu-…` coordinator names a run joined, in the order of its log.
fn joined_coordinators(out: &Output) -> Vec<String> {
    out.stderr
        .lines()
        .filter_map(|l| l.split_once("joined coordinator ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(|path| path.rsplit('/').next().unwrap_or(path).to_string())
        .collect()
}

/// Stops the coordinator serving segment file `segment` (`tensile-<uid>-<name>`).
fn stop_coordinator_of(segment: &str) {
    use tensile_protocol::SegmentView;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let Some(name) = segment.strip_prefix(&format!("tensile-{uid}-")) else {
        return;
    };
    let Ok(view) = SegmentView::open(name) else {
        return;
    };
    let c = view.coordinator();
    if c.running {
        // SAFETY: plain kill(2) on a pid read from our own segment.
        unsafe { libc::kill(c.process.pid as i32, libc::SIGTERM) };
    }
}

#[test]
fn under_auto_a_process_on_two_devices_has_a_slot_on_each_devices_coordinator_and_meets_each_grant()
{
    let want = native_digests();
    let out = two_devices()
        .preload(true)
        .env("TENSILE_POLICY", "plan")
        .env("TENSILE_COORDINATOR", "auto")
        .env(
            "TENSILE_SIM_CARD",
            format!("devices-{}", std::process::id()),
        )
        .env("TENSILE_DEVICE_MEMORY", "80%")
        .env("TENSILE_SIM_DEVICE_MEMORY", CARD)
        .env("TENSILE_LOG", "info")
        .output();
    let joined = joined_coordinators(&out);
    for segment in &joined {
        stop_coordinator_of(segment);
    }
    out.assert_ok("two devices under auto");
    assert_eq!(
        named_digests(&out.stdout),
        want,
        "results differ from the run without the shim\n{}",
        out.stderr
    );
    assert_eq!(joined.len(), 2, "one slot per device:\n{}", out.stderr);
    assert!(
        joined.iter().all(|n| n.contains("-gpu-")),
        "{joined:?}\n{}",
        out.stderr
    );
    assert_ne!(joined[0], joined[1], "one coordinator per device");
    for device in [0, 1] {
        let met = out.stderr.lines().any(|l| {
            l.contains("the coordinator granted")
                && l.contains(&format!("on device {device}"))
                && l.contains("met in")
        });
        assert!(met, "device {device}: no grant met\n{}", out.stderr);
        let (_, _, peak) = device_stats(&out, device);
        assert!(peak <= BUDGET_MIB, "device {device}: peak {peak} MiB");
    }
}

/// Two processes on the same two GPUs, each needing more than either card: under `auto` each
/// card's coordinator divides it between them. A process takes turns on its first GPU's
/// coordinator only (its other slots say it takes its turns elsewhere, so they are never
/// paused): turns decided by each card on its
/// own once stopped each process on one card while it had the turn on the other, and both
/// waited for good.
#[test]
fn two_processes_on_the_same_two_gpus_never_wait_for_each_other_and_lose_no_byte() {
    let rounds = "20";
    let run = || {
        Run::new(env!("CARGO_BIN_EXE_wl_devices"))
            .arg("2")
            .arg(TENSORS)
            .arg(TENSOR_KIB)
            .arg(rounds)
            .env("TENSILE_SIM_DEVICE_COUNT", "2")
    };
    let native = run().output();
    native.assert_ok("the native run");
    let want = named_digests(&native.stdout);
    let card = format!("pair-{}", std::process::id());
    let job = || {
        run()
            .preload(true)
            .env("TENSILE_POLICY", "plan")
            .env("TENSILE_COORDINATOR", "auto")
            .env("TENSILE_SIM_CARD", &card)
            .env("TENSILE_SIM_DEVICE_MEMORY", "16MiB")
            .env("TENSILE_LOG", "info")
            .spawn()
    };
    let jobs = [job(), job()];
    let finished: Vec<bool> = jobs
        .iter()
        .map(|j| j.wait_for(false, "done", std::time::Duration::from_secs(120)))
        .collect();
    let stderr: Vec<String> = jobs.iter().map(|j| j.stderr()).collect();
    let outs: Vec<Output> = if finished.iter().all(|&f| f) {
        jobs.into_iter().map(|j| j.wait()).collect()
    } else {
        Vec::new()
    };
    let joined: Vec<String> = stderr
        .iter()
        .flat_map(|e| {
            joined_coordinators(&Output {
                success: true,
                code: None,
                stdout: String::new(),
                stderr: e.clone(),
            })
        })
        .collect();
    for segment in &joined {
        stop_coordinator_of(segment);
    }
    assert!(
        finished.iter().all(|&f| f),
        "the jobs did not finish within 120 s (waiting for each other?)\n--- first\n{}\n--- second\n{}",
        stderr[0],
        stderr[1]
    );
    for out in &outs {
        out.assert_ok("a job on two shared GPUs");
        assert_eq!(
            named_digests(&out.stdout),
            want,
            "results differ from the run without the shim\n{}",
            out.stderr
        );
        assert_eq!(
            joined_coordinators(out).len(),
            2,
            "one slot per device:\n{}",
            out.stderr
        );
        for device in [0, 1] {
            assert!(
                out.stderr
                    .lines()
                    .any(|l| l.contains("the coordinator granted")
                        && l.contains(&format!("on device {device}"))
                        && l.contains("met in")),
                "device {device}: no grant met\n{}",
                out.stderr
            );
        }
    }
}
