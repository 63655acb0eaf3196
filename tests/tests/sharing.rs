//! Several jobs on one simulated card, through `LD_PRELOAD`: reruns of the shared PyTorch
//! traces that name the same card (`tensile rerun --card`) compete for its memory, and the
//! coordinator they start divides it. Every stamp must verify (nothing lost or stale under
//! swapping and grants that move), the grants must never add up to more than the card, a job
//! killed while holding memory must give its grant back within a second, and a coordinator
//! killed mid-run is replaced by one that grants the jobs again. Jobs that come and go at
//! seeded random points lose nothing, and one whose grant shrinks holds more than it only while
//! it evicts (325 ms at most when written).
//!
//! Each test uses a card and coordinator name of its own and stops the coordinator it caused.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tensile_protocol::{JobSnapshot, SegmentView};
use tensile_tests::harness::{artifacts, describe as text};
use tensile_tests::rng::Rng;

/// The card: about half of what the three reduced traces need together, so every job swaps.
const CARD: &str = "160MiB";
/// The share of the card the coordinator keeps back (its default `--reserve`).
const RESERVE_PERCENT: u64 = 5;

fn shared(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../analyzer/tests/data/{name}.trace.gz"))
}

/// A reduced rerun of `trace` on card `card`: sizes / 64, recorded times x 0.05.
fn job(trace: &str, card: &str, iterations: u32) -> Child {
    Command::new(&artifacts().tensile)
        .arg("rerun")
        .arg(shared(trace))
        .args(["--simulated", "--json", "--policy", "plan"])
        .args(["--iterations", &iterations.to_string()])
        .args(["--scale", "64", "--time-scale", "0.05"])
        .args(["--card", card, "--card-memory", CARD])
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting tensile rerun")
}

/// The tests of this file run one at a time: each starts several reruns and a coordinator,
/// and on a 2-core machine several such tests at once starve each other's simulated cards.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn unique_name(test: &str) -> String {
    format!("t{}-{test}", std::process::id())
}

fn live_jobs(name: &str) -> Vec<JobSnapshot> {
    SegmentView::open(name)
        .map(|v| v.jobs().into_iter().filter(|j| j.live).collect())
        .unwrap_or_default()
}

/// Stops the coordinator of `name` (if one runs) and waits for it to go.
fn stop_coordinator(name: &str) {
    let Ok(view) = SegmentView::open(name) else {
        return;
    };
    let c = view.coordinator();
    if !c.running {
        return;
    }
    // SAFETY: plain kill(2) on a pid read from our own segment.
    unsafe { libc::kill(c.process.pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while SegmentView::open(name).is_ok_and(|v| v.coordinator().running)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a watcher of the segment saw while jobs ran.
#[derive(Debug, Default)]
struct Watched {
    samples: u64,
    most_jobs: usize,
    /// Samples where the grants added up to more than the card less the reserve.
    over: Vec<String>,
    /// Whether some job was ever granted less than the whole card (memory was divided).
    divided: bool,
    /// The longest a job held more device memory than its grant (while it evicted down to a
    /// grant that shrank), by pid.
    longest_over_grant: Duration,
    /// Whether some job was ever asked to wait its turn.
    paused: bool,
}

/// Reads the segment every 2 ms until `stop`.
fn watch(name: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Watched> {
    std::thread::spawn(move || {
        let mut w = Watched::default();
        let mut over_since: std::collections::HashMap<u32, Instant> = Default::default();
        while !stop.load(Ordering::Relaxed) {
            let jobs = live_jobs(&name);
            for j in &jobs {
                w.paused |= j.paused;
                if j.grant_bytes > 0 && j.resident_bytes > j.grant_bytes {
                    let since = *over_since.entry(j.process.pid).or_insert_with(Instant::now);
                    w.longest_over_grant = w.longest_over_grant.max(since.elapsed());
                } else {
                    over_since.remove(&j.process.pid);
                }
            }
            let card = jobs.iter().map(|j| j.card_bytes).max().unwrap_or(0);
            if card > 0 {
                w.samples += 1;
                w.most_jobs = w.most_jobs.max(jobs.len());
                let available = card - card * RESERVE_PERCENT / 100;
                let granted: u64 = jobs.iter().map(|j| j.grant_bytes).sum();
                // The slots are read one after another, not at one instant: a sum over the
                // card counts only if a second read finds the same grants (the coordinator
                // moves grants at most once a tick, 10 ms).
                let again: Vec<(u32, u64)> = live_jobs(&name)
                    .iter()
                    .map(|j| (j.process.pid, j.grant_bytes))
                    .collect();
                let first: Vec<(u32, u64)> = jobs
                    .iter()
                    .map(|j| (j.process.pid, j.grant_bytes))
                    .collect();
                if granted > available + (1 << 20) && again == first {
                    w.over.push(format!(
                        "{granted} granted of {available}: {:?}",
                        jobs.iter()
                            .map(|j| (j.process.pid, j.grant_bytes, j.resident_bytes))
                            .collect::<Vec<_>>()
                    ));
                }
                w.divided |= jobs
                    .iter()
                    .any(|j| j.grant_bytes > 0 && j.grant_bytes < available * 9 / 10);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        w
    })
}

#[test]
fn three_jobs_share_one_card_with_every_stamp_verified_and_never_more_granted_than_it_has() {
    let _serial = one_at_a_time();
    let name = unique_name("three");
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(name.clone(), stop.clone());
    let jobs: Vec<(&str, Child)> = ["mlp", "resnet50", "bert"]
        .into_iter()
        .map(|t| (t, job(t, &name, 2)))
        .collect();
    let outs: Vec<(&str, Output)> = jobs
        .into_iter()
        .map(|(t, c)| (t, c.wait_with_output().expect("waiting for a rerun")))
        .collect();
    stop.store(true, Ordering::Relaxed);
    let watched = watcher.join().expect("the watcher");
    let log = std::fs::read_to_string(std::env::temp_dir().join(format!(
        "tensile-coordinator-{}-{name}.log",
        // SAFETY: getuid cannot fail.
        unsafe { libc::getuid() }
    )))
    .unwrap_or_default();
    stop_coordinator(&name);

    for (trace, out) in &outs {
        assert!(out.status.success(), "{trace}:\n{}", text(out));
        let doc: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{trace}: not JSON ({e}):\n{}", text(out)));
        let run = &doc["runs"][0];
        assert_eq!(
            run["verified"],
            Value::Bool(true),
            "{trace}:\n{}",
            text(out)
        );
        assert!(run["stamps_checked"].as_u64().unwrap_or(0) > 0, "{trace}");
    }
    assert!(
        watched.most_jobs >= 2,
        "the jobs never ran at the same time: {watched:?}"
    );
    assert!(
        watched.divided,
        "no job was ever granted less than the card: {watched:?}\n{log}"
    );
    assert!(
        watched.over.is_empty(),
        "grants exceeded the card in {} of {} samples, first: {}",
        watched.over.len(),
        watched.samples,
        watched.over[0]
    );
    assert!(log.contains("grants of a "), "{log}");
}

#[test]
fn a_job_killed_while_holding_memory_gives_its_grant_back_within_a_second() {
    let _serial = one_at_a_time();
    let name = unique_name("killed");
    // The victim first (its rerun takes longest to start playing); the survivor once the
    // victim plays, so that both are on the card together.
    let victim = job("bert", &name, 12);
    let victim_rerun = victim.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !live_jobs(&name).iter().any(|j| j.card_bytes > 0) {
        assert!(Instant::now() < deadline, "the victim never joined");
        std::thread::sleep(Duration::from_millis(10));
    }
    let survivor = job("resnet50", &name, 12);
    // Wait until both players hold grants (the victim may be waiting its turn, its memory
    // written out: what it holds then is its grant), then kill the victim's player (the rerun's child:
    // its script lies in the rerun's own scratch directory).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last_seen = Vec::new();
    let (victim_pid, survivor_pid) = loop {
        let jobs = live_jobs(&name);
        if !jobs.is_empty() {
            last_seen = jobs.clone();
        }
        let mine = |j: &&JobSnapshot| {
            j.command_line
                .contains(&format!("tensile-rerun-{victim_rerun}/"))
        };
        let v = jobs.iter().find(mine);
        let s = jobs.iter().find(|j| !mine(j));
        if let (Some(v), Some(s)) = (v, s) {
            if v.grant_bytes > 0 && v.card_bytes > 0 && s.grant_bytes > 0 {
                break (v.process.pid, s.process.pid);
            }
        }
        assert!(
            Instant::now() < deadline,
            "two jobs never held grants; last seen: {last_seen:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let card = live_jobs(&name)
        .iter()
        .map(|j| j.card_bytes)
        .max()
        .unwrap_or(0);
    let available = card - card * RESERVE_PERCENT / 100;
    // SAFETY: plain kill(2) of a player this test started (through its rerun).
    unsafe { libc::kill(victim_pid as i32, libc::SIGKILL) };
    let killed = Instant::now();
    let returned = loop {
        let jobs = live_jobs(&name);
        let survivor_grant = jobs
            .iter()
            .find(|j| j.process.pid == survivor_pid)
            .map_or(0, |j| j.grant_bytes);
        if !jobs.iter().any(|j| j.process.pid == victim_pid)
            && survivor_grant + (1 << 20) >= available
        {
            break killed.elapsed();
        }
        if killed.elapsed() > Duration::from_secs(5) {
            break killed.elapsed();
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let survivor_out = survivor
        .wait_with_output()
        .expect("waiting for the survivor");
    let _ = victim.wait_with_output();
    stop_coordinator(&name);
    assert!(
        returned < Duration::from_secs(1),
        "the killed job's grant came back after {returned:?}"
    );
    assert!(survivor_out.status.success(), "{}", text(&survivor_out));
    let doc: Value = serde_json::from_slice(&survivor_out.stdout).expect("JSON");
    assert_eq!(doc["runs"][0]["verified"], Value::Bool(true));
}

#[test]
fn a_coordinator_killed_mid_run_is_replaced_and_the_jobs_grants_are_rebuilt() {
    let _serial = one_at_a_time();
    let name = unique_name("restart");
    // bert first (its rerun takes longest to start playing), resnet50 once it plays.
    let first_job = job("bert", &name, 12);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !live_jobs(&name).iter().any(|j| j.card_bytes > 0) {
        assert!(Instant::now() < deadline, "the first job never joined");
        std::thread::sleep(Duration::from_millis(10));
    }
    let jobs = [first_job, job("resnet50", &name, 12)];
    let both_granted = |deadline: Duration| {
        let end = Instant::now() + deadline;
        loop {
            let live = live_jobs(&name);
            // Two or more: a rerun's baseline player may overlap the other's run.
            if live.len() >= 2 && live.iter().all(|j| j.grant_bytes > 0 && j.card_bytes > 0) {
                return Some(live);
            }
            if Instant::now() > end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let before = both_granted(Duration::from_secs(60)).expect("two jobs never held grants");
    let first = SegmentView::open(&name).unwrap().coordinator().process.pid;
    // SAFETY: plain kill(2) of the coordinator our jobs started.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    // The jobs rejoin (every second) a coordinator one of them starts; it grants again.
    let end = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let view = SegmentView::open(&name);
        let replaced = view.as_ref().is_ok_and(|v| {
            let c = v.coordinator();
            c.running && c.process.pid != first
        });
        if replaced {
            if let Some(live) = both_granted(Duration::from_millis(1)) {
                break live;
            }
        }
        assert!(
            Instant::now() < end,
            "no new coordinator granted both jobs within 10 s (before: {before:?})"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let card = after.iter().map(|j| j.card_bytes).max().unwrap_or(0);
    let granted: u64 = after.iter().map(|j| j.grant_bytes).sum();
    assert!(granted <= card, "{granted} granted of a {card}-byte card");
    let outs: Vec<Output> = jobs
        .into_iter()
        .map(|c| c.wait_with_output().expect("waiting for a rerun"))
        .collect();
    stop_coordinator(&name);
    for out in &outs {
        assert!(out.status.success(), "{}", text(out));
        let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(
            doc["runs"][0]["verified"],
            Value::Bool(true),
            "{}",
            text(out)
        );
    }
}

#[test]
fn jobs_joining_and_leaving_at_random_points_lose_nothing_and_never_overrun_the_card() {
    let _serial = one_at_a_time();
    let name = unique_name("random");
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(name.clone(), stop.clone());
    // Four jobs started at seeded random points over three seconds, each running one to three
    // iterations, so jobs come and go while others run.
    let mut rng = Rng(0x5eed_2026);
    let traces = ["mlp", "resnet50", "bert", "mlp"];
    let mut children = Vec::new();
    let started = Instant::now();
    let mut at: Vec<(Duration, &str, u32)> = traces
        .iter()
        .map(|&t| {
            let delay = Duration::from_millis(rng.below(3000) as u64);
            (delay, t, 1 + rng.below(3) as u32)
        })
        .collect();
    at.sort();
    for (delay, trace, iterations) in at {
        if let Some(wait) = delay.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
        children.push((trace, job(trace, &name, iterations)));
    }
    let outs: Vec<(&str, Output)> = children
        .into_iter()
        .map(|(t, c)| (t, c.wait_with_output().expect("waiting for a rerun")))
        .collect();
    stop.store(true, Ordering::Relaxed);
    let watched = watcher.join().expect("the watcher");
    stop_coordinator(&name);
    for (trace, out) in &outs {
        assert!(out.status.success(), "{trace}:\n{}", text(out));
        let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(doc["runs"][0]["verified"], Value::Bool(true), "{trace}");
    }
    assert!(
        watched.over.is_empty(),
        "grants exceeded the card: {}",
        watched.over[0]
    );
    // A job whose grant shrinks holds more than it until its eviction is done; that must be
    // a moment, not a state.
    assert!(
        watched.longest_over_grant < Duration::from_secs(3),
        "a job held more than its grant for {:?}",
        watched.longest_over_grant
    );
}
