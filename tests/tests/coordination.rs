//! Jobs and the coordinator, through `LD_PRELOAD` on the simulated GPU.
//!
//! A job under `TENSILE_POLICY=plan` that names a coordinator no one runs starts one (the
//! `tensile` binary next to `libtensile.so`), streams its records to it and runs the plan it
//! sends back; a coordinator killed with SIGKILL mid-run costs the job nothing but its plans:
//! it says so once, goes on (results bit for bit those of a run without the shim), rejoins
//! the coordinator it starts anew, and runs that one's plan (made knowing the allocations the
//! job made before it came).
//!
//! A segment of another version, of another owner or open to other users, or a segment
//! directory (`TENSILE_SHM_DIR`) that cannot hold one, is refused in one line, and the job
//! learns and plans in its own process instead. A coordinator that stops reading lets the
//! job's ring fill: the job drops and counts, never waits, says so once, and gets a new plan
//! once the coordinator reads again. A job killed mid-run is logged dead once, and the next
//! job gets its slot.
//!
//! Each test uses a coordinator name of its own, so tests run in parallel, and stops the
//! coordinators it caused.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use std::os::unix::fs::FileExt;

use tensile_protocol::segment::{shm_name, shm_path, Geometry, LAYOUT_VERSION};
use tensile_protocol::{CoordinatorSegment, SegmentView, SlotRoom};
use tensile_tests::expect::named_digests;
use tensile_tests::harness::{artifacts, Output, Run, Running};

/// Layers, tensor KiB (one 2 MiB page), as in `plan_exec`.
const LAYERS: &str = "6";
const TENSOR_KIB: &str = "2048";
/// Under the budget below, a third of the footprint.
const BUDGET: &str = "20MiB";

fn train(iterations: u32) -> Run {
    Run::new(env!("CARGO_BIN_EXE_wl_train"))
        .arg("proc:13000:0")
        .arg(LAYERS)
        .arg(TENSOR_KIB)
        .arg(iterations.to_string())
}

fn planned_job(iterations: u32, coordinator: &str) -> Run {
    train(iterations)
        .preload(true)
        .env("TENSILE_POLICY", "plan")
        .env("TENSILE_DEVICE_MEMORY", BUDGET)
        .env("TENSILE_COORDINATOR", coordinator)
        .env("TENSILE_LOG", "info")
}

/// A coordinator name no other test (or test run) uses.
fn unique_name(test: &str) -> String {
    format!("t{}-{test}", std::process::id())
}

/// The pid of the coordinator serving `name`, if one runs.
fn coordinator_pid(name: &str) -> Option<u32> {
    let view = SegmentView::open(name).ok()?;
    let c = view.coordinator();
    c.running.then_some(c.process.pid)
}

/// Stops the coordinator of `name` (if any) and waits for its segment to go.
fn stop_coordinator(name: &str) {
    if let Some(pid) = coordinator_pid(name) {
        // SAFETY: plain kill(2) on a pid we read from our own segment.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while coordinator_pid(name).is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The executor's counters from its exit line.
fn executor_counter(out: &Output, name: &str) -> u64 {
    let line = out
        .stderr
        .lines()
        .rev()
        .find_map(|l| l.split_once("plan executor: ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no executor line in:\n{}", out.stderr));
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .chunks(2)
        .find(|kv| kv[0] == name)
        .and_then(|kv| kv.get(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

#[test]
fn a_job_that_finds_no_coordinator_starts_one_and_runs_its_plan() {
    let name = unique_name("start");
    let native = train(12).output();
    native.assert_ok("native");
    let out = planned_job(12, &name).output();
    stop_coordinator(&name);
    out.assert_ok("job");
    assert_eq!(
        named_digests(&out.stdout),
        named_digests(&native.stdout),
        "results differ from the run without the shim"
    );
    assert!(
        out.stderr.contains("started coordinator"),
        "the job did not start a coordinator:\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("from the coordinator"),
        "no plan came from the coordinator:\n{}",
        out.stderr
    );
    assert!(executor_counter(&out, "plans_loaded") >= 1);
    assert!(executor_counter(&out, "steps_done") > 0);
    assert_eq!(executor_counter(&out, "mismatches"), 0);
}

#[test]
fn a_coordinator_killed_mid_run_is_survived_and_rejoined() {
    let name = unique_name("killed");
    let native = train(40).output();
    native.assert_ok("native");
    let job = planned_job(40, &name);
    let killer_name = name.clone();
    // Once the job has started the coordinator and streamed for a while, kill it.
    let killer = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(pid) = coordinator_pid(&killer_name) {
                std::thread::sleep(Duration::from_millis(800));
                // SAFETY: plain kill(2) on a pid read from our own segment.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                return Some(pid);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    });
    let out = job.output();
    let killed = killer.join().unwrap();
    stop_coordinator(&name);
    out.assert_ok("job");
    assert!(killed.is_some(), "no coordinator ran to kill");
    assert_eq!(
        named_digests(&out.stdout),
        named_digests(&native.stdout),
        "results differ from the run without the shim"
    );
    assert_eq!(
        out.stderr.matches("went away").count(),
        1,
        "the job should say once that its coordinator went away:\n{}",
        out.stderr
    );
    let (_, after_rejoin) = out
        .stderr
        .split_once("rejoined coordinator")
        .unwrap_or_else(|| panic!("the job did not rejoin a new coordinator:\n{}", out.stderr));
    // The new coordinator was told the parameters made before it came: its plan moves them
    // (a coordinator that saw only the stream after the rejoin plans no moves at all).
    let moves_after: Vec<u64> = after_rejoin
        .lines()
        .filter(|l| l.contains("from the coordinator"))
        .filter_map(|l| {
            let (before, _) = l.split_once(" moves")?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .collect();
    assert!(
        moves_after.iter().any(|&m| m > 0),
        "no plan with moves from the new coordinator (moves per plan: {moves_after:?}):\n{}",
        out.stderr
    );
}

#[test]
fn a_segment_of_another_version_is_refused_once_and_the_job_plans_alone() {
    let name = unique_name("version");
    // A coordinator of "another version" runs: this process holds a segment whose header
    // says a later layout.
    let segment = CoordinatorSegment::create(
        &name,
        Geometry {
            slot_count: 2,
            ..Geometry::default()
        },
    )
    .unwrap();
    let path = shm_path(&shm_name(&name).unwrap());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .write_all_at(&(LAYOUT_VERSION + 1).to_le_bytes(), 8)
        .unwrap();
    let native = train(12).output();
    native.assert_ok("native");
    let out = planned_job(12, &name).output();
    drop(segment);
    out.assert_ok("job");
    assert_eq!(
        named_digests(&out.stdout),
        named_digests(&native.stdout),
        "results differ from the run without the shim"
    );
    let refusals: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("no coordinator"))
        .collect();
    assert_eq!(refusals.len(), 1, "one line expected:\n{}", out.stderr);
    assert!(
        refusals[0].contains(&format!("version {}", LAYOUT_VERSION + 1)),
        "the line names the other version: {}",
        refusals[0]
    );
    assert!(
        !out.stderr.contains("started coordinator"),
        "a running coordinator's segment must not be replaced:\n{}",
        out.stderr
    );
    // Learned and planned in the process instead.
    assert!(
        executor_counter(&out, "plans_loaded") >= 1,
        "{}",
        out.stderr
    );
    assert_eq!(executor_counter(&out, "mismatches"), 0);
}

/// The segment path a job's log says it joined.
fn joined_segment(out: &Output) -> String {
    out.stderr
        .lines()
        .find_map(|l| l.split_once("joined coordinator ").map(|(_, rest)| rest))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the job joined no coordinator:\n{}", out.stderr))
        .to_string()
}

#[test]
fn under_auto_jobs_on_one_card_share_a_coordinator_and_jobs_on_another_do_not() {
    let card = unique_name("card");
    let on_card = |card: &str| {
        train(4)
            .preload(true)
            .env("TENSILE_POLICY", "plan")
            .env("TENSILE_COORDINATOR", "auto")
            .env("TENSILE_SIM_CARD", card)
            .env("TENSILE_LOG", "info")
            .output()
    };
    let first = on_card(&card);
    let second = on_card(&card);
    let other = on_card(&format!("{card}-other"));
    let names: Vec<String> = [&first, &second, &other]
        .iter()
        .map(|o| {
            o.assert_ok("job");
            joined_segment(o)
        })
        .collect();
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    for path in &names {
        let name = path
            .rsplit_once(&format!("tensile-{uid}-"))
            .map(|(_, n)| n.to_string())
            .unwrap_or_default();
        stop_coordinator(&name);
    }
    assert!(names[0].contains("-gpu-"), "{names:?}");
    assert_eq!(names[0], names[1], "one card, one coordinator");
    assert_ne!(names[0], names[2], "another card, another coordinator");
}

/// The driver calls a run made, by export name, as the simulated GPU counted them
/// (`TENSILE_SIM_CALL_COUNTS`).
fn driver_calls(path: &std::path::Path) -> std::collections::BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no call counts at {}: {e}", path.display()));
    text.lines()
        .filter_map(|l| {
            let (name, n) = l.split_once(' ')?;
            Some((name.to_string(), n.parse().ok()?))
        })
        .collect()
}

/// Calls of the exports whose name starts with one of `prefixes` (their per-thread-stream
/// and versioned twins included).
fn calls_of(counts: &std::collections::BTreeMap<String, u64>, prefixes: &[&str]) -> u64 {
    counts
        .iter()
        .filter(|(name, _)| {
            prefixes
                .iter()
                .any(|p| name.as_str() == *p || name.starts_with(&format!("{p}_")))
        })
        .map(|(_, &n)| n)
        .sum()
}

/// Issue 11: with a coordinator, ResNet-50 on an H200 once ran 23% slower than with the
/// planner in the process. A plan from the coordinator must cost the launch path exactly what
/// a plan learned in the process does: at no pressure, the same driver calls reach the GPU
/// per launch, above all none that order or block streams (a stream wait, an event or stream
/// synchronization added per launch serializes the card's streams, which the simulated GPU's
/// wall time would not show).
#[test]
fn at_no_pressure_a_coordinator_plan_adds_no_driver_calls_per_launch() {
    let name = unique_name("calls");
    let dir = std::env::temp_dir().join(format!("tensile-calls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |coordinator: &str| {
        let counts = dir.join(format!("{coordinator}.counts"));
        // No budget: the card's memory (or the coordinator's grant of it), far above the
        // footprint.
        let out = train(30)
            .preload(true)
            .env("TENSILE_POLICY", "plan")
            .env("TENSILE_COORDINATOR", coordinator)
            .env("TENSILE_LOG", "info")
            .env("TENSILE_SIM_CALL_COUNTS", counts.display().to_string())
            .output();
        (out, driver_calls(&counts))
    };
    let (alone, alone_calls) = run("off");
    let (joined, joined_calls) = run(&name);
    stop_coordinator(&name);
    let _ = std::fs::remove_dir_all(&dir);
    alone
        .assert_ok("job planning in its process")
        .assert_quiet("job planning in its process");
    joined
        .assert_ok("job with a coordinator")
        .assert_quiet("job with a coordinator");
    assert!(
        joined.stderr.contains("from the coordinator"),
        "no plan came from the coordinator:\n{}",
        joined.stderr
    );
    for out in [&alone, &joined] {
        assert!(executor_counter(out, "plans_loaded") >= 1, "{}", out.stderr);
        assert_eq!(executor_counter(out, "mismatches"), 0, "{}", out.stderr);
        assert_eq!(
            executor_counter(out, "pages_out"),
            0,
            "no pressure: nothing moves"
        );
        assert_eq!(
            executor_counter(out, "pages_in"),
            0,
            "no pressure: nothing moves"
        );
    }
    let launches = calls_of(&alone_calls, &["cuLaunchKernel", "cuLaunchKernelEx"]);
    assert!(launches > 0);
    assert_eq!(
        calls_of(&joined_calls, &["cuLaunchKernel", "cuLaunchKernelEx"]),
        launches
    );
    // Calls that order or block streams: exactly the application's own in both runs.
    for kind in [
        "cuStreamWaitEvent",
        "cuEventSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuStreamQuery",
    ] {
        assert_eq!(
            calls_of(&joined_calls, &[kind]),
            calls_of(&alone_calls, &[kind]),
            "{kind} with a coordinator against without one (per {launches} launches)"
        );
    }
    // Events recorded (the manager's fences, the planner's launch timing): the same, up to
    // fences the maintenance thread records for a stream gone quiet (timing-dependent: 3%
    // apart was seen with the other tests of this file running beside it). One more per
    // launch would be 100% more.
    let (with, without) = (
        calls_of(&joined_calls, &["cuEventRecord"]),
        calls_of(&alone_calls, &["cuEventRecord"]),
    );
    assert!(
        with.abs_diff(without) <= without / 10 + 4,
        "cuEventRecord: {with} with a coordinator, {without} without (per {launches} launches)"
    );
}

/// A coordinator a test starts itself (`tensile coordinator` with options of its own), stopped
/// (and resumed first, if the test stopped it) when dropped.
struct OwnCoordinator {
    child: std::process::Child,
    log: PathBuf,
}

impl OwnCoordinator {
    /// Starts `tensile coordinator --name NAME` with `options` and waits for its segment.
    fn start(name: &str, options: &[&str]) -> OwnCoordinator {
        let log = std::env::temp_dir().join(format!("tensile-e2e-{name}.log"));
        let _ = std::fs::remove_file(&log);
        let mut cmd = std::process::Command::new(&artifacts().tensile);
        cmd.args(["coordinator", "--name", name, "--idle-exit", "120", "--log"])
            .arg(&log)
            .args(options)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("TENSILE_") || k == "LD_PRELOAD" {
                cmd.env_remove(k.as_ref());
            }
        }
        let child = cmd.spawn().expect("starting tensile coordinator");
        let me = OwnCoordinator { child, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        while coordinator_pid(name) != Some(me.child.id()) {
            assert!(
                Instant::now() < deadline,
                "the coordinator did not open its segment:\n{}",
                me.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        me
    }

    fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) of a child this test started and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Its log so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for OwnCoordinator {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Starts a planned job of `iterations` under the coordinator `name` and waits for its first
/// plan from it.
fn job_with_a_plan(iterations: u32, name: &str, coordinator: &OwnCoordinator) -> Running {
    let job = planned_job(iterations, name).spawn();
    assert!(
        job.wait_for(true, "from the coordinator", PATIENCE),
        "the job got no plan from the coordinator:\n{}\n--- coordinator\n{}",
        job.stderr(),
        coordinator.log()
    );
    job
}

/// Iterations a running `wl_train` has said it finished.
fn iterations_done(job: &Running) -> u32 {
    job.stderr()
        .lines()
        .filter_map(|l| l.strip_prefix("wl_train: iteration "))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// Generous: the whole suite runs on two loaded cores.
const PATIENCE: Duration = Duration::from_secs(180);

/// Issue 11: a coordinator that stops reading (here stopped with SIGSTOP; a coordinator
/// starved of CPU is the same to the job) lets the job's event ring fill. The job never
/// waits for it: it drops and counts what does not fit, says so once, goes on computing
/// bit for bit with the plan it has and on-demand swapping; once the coordinator reads
/// again it learns of the gap, relearns the job and sends a new plan.
#[test]
fn a_full_event_ring_drops_and_counts_without_blocking_and_the_coordinator_relearns() {
    let name = unique_name("ring");
    let native = train(40).output();
    native.assert_ok("native");
    // The smallest ring (4 KiB, some 130 records): full within a second or two of the
    // simulated job's stream once nobody reads it.
    let coordinator = OwnCoordinator::start(&name, &["--ring-kib", "4"]);
    let job = job_with_a_plan(40, &name, &coordinator);
    coordinator.signal(libc::SIGSTOP);
    let full = job.wait_for(true, "is not reading this job's records", PATIENCE);
    // The job goes on while the coordinator is still stopped: three more iterations.
    let stalled_at = iterations_done(&job);
    let deadline = Instant::now() + PATIENCE;
    while iterations_done(&job) < stalled_at + 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let went_on = iterations_done(&job) >= stalled_at + 3;
    coordinator.signal(libc::SIGCONT);
    let out = job.wait();
    let log = coordinator.log();
    drop(coordinator);
    out.assert_ok("job");
    assert!(
        full,
        "the job did not say its ring was full:\n{}",
        out.stderr
    );
    assert!(
        went_on,
        "the job did not go on while the coordinator was stopped (iteration {stalled_at}):\n{}",
        out.stderr
    );
    assert_eq!(
        named_digests(&out.stdout),
        named_digests(&native.stdout),
        "results differ from the run without the shim"
    );
    assert_eq!(
        out.stderr
            .matches("is not reading this job's records")
            .count(),
        1,
        "the job should say once that its ring was full:\n{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("went away"),
        "a stopped coordinator is not a dead one:\n{}",
        out.stderr
    );
    // After the gap: the coordinator says how much was lost, relearns, plans again, and the
    // job runs that plan.
    let (_, after_gap) = log
        .split_once("records lost on the way")
        .unwrap_or_else(|| panic!("the coordinator logged no gap:\n{log}"));
    assert!(
        after_gap.contains("planned: version"),
        "no plan after the gap:\n{log}"
    );
    let (_, after_full) = out
        .stderr
        .split_once("is not reading this job's records")
        .unwrap();
    assert!(
        after_full.contains("from the coordinator"),
        "no plan from the coordinator after it read again:\n{}\n--- coordinator\n{log}",
        out.stderr
    );
    // Counted: the job's leaving line says how many of its records were lost.
    let lost: u64 = log
        .lines()
        .find_map(|l| {
            l.split_once(" left slot ")?
                .1
                .split_once(" records (")?
                .1
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("the job's leaving is not logged:\n{log}"));
    assert!(lost > 0, "no records counted lost:\n{log}");
    assert_eq!(executor_counter(&out, "mismatches"), 0);
}

/// Issue 11: a job killed with SIGKILL mid-run (streaming, its slot held, perhaps in the middle
/// of writing a frame) costs the next job nothing: with one slot only, the next job gets it
/// (taken from the dead job, or reclaimed by the sweep first), learns, gets a plan and
/// computes bit for bit; the coordinator logs the death once.
#[test]
fn a_job_killed_mid_run_is_logged_dead_once_and_its_slot_serves_the_next_job() {
    let name = unique_name("victim");
    let native = train(12).output();
    native.assert_ok("native");
    let coordinator = OwnCoordinator::start(&name, &["--slots", "1"]);
    let victim = job_with_a_plan(40, &name, &coordinator);
    let victim_pid = victim.pid();
    victim.signal(libc::SIGKILL);
    let killed = victim.wait();
    assert!(!killed.success, "the first job was not killed");
    // At once: the next job may find the dead job's slot before the sweep does.
    let out = planned_job(12, &name).output();
    let log = coordinator.log();
    drop(coordinator);
    out.assert_ok("the next job");
    assert_eq!(
        named_digests(&out.stdout),
        named_digests(&native.stdout),
        "results differ from the run without the shim"
    );
    assert!(
        out.stderr.contains("joined coordinator") && out.stderr.contains("(slot 0)"),
        "the next job did not join the only slot:\n{}\n--- coordinator\n{log}",
        out.stderr
    );
    assert!(
        out.stderr.contains("from the coordinator"),
        "the next job got no plan:\n{}\n--- coordinator\n{log}",
        out.stderr
    );
    assert!(executor_counter(&out, "plans_loaded") >= 1);
    assert_eq!(executor_counter(&out, "mismatches"), 0);
    let died = format!("job {victim_pid} died");
    assert_eq!(
        log.matches(&died).count(),
        1,
        "the death should be logged once:\n{log}"
    );
    assert!(
        !log.contains(&format!("job {victim_pid} left")),
        "a dead job logged as one that left:\n{log}"
    );
}

/// A job's own `TENSILE_PLAN_ROOM` reaches the coordinator it joins: the job asks it in its
/// slot, the coordinator (whose own room is the default) plans the job with it, says so in
/// its log and in the slot, and `tensile status` shows it.
#[test]
fn a_jobs_own_plan_room_is_the_one_its_coordinator_plans_it_with() {
    let name = unique_name("room");
    let coordinator = OwnCoordinator::start(&name, &[]);
    let job = planned_job(40, &name)
        .env("TENSILE_PLAN_ROOM", "35%")
        .spawn();
    assert!(
        job.wait_for(true, "from the coordinator", PATIENCE),
        "the job got no plan from the coordinator:\n{}\n--- coordinator\n{}",
        job.stderr(),
        coordinator.log()
    );
    let slot = SegmentView::open(&name)
        .unwrap()
        .jobs()
        .into_iter()
        .find(|j| j.process.pid == job.pid());
    let status = std::process::Command::new(&artifacts().tensile)
        .args(["status", "--name", &name])
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    let out = job.wait();
    let log = coordinator.log();
    drop(coordinator);
    out.assert_ok("job");
    let slot = slot.expect("the job's slot while it ran");
    assert_eq!(
        (slot.room_asked, slot.room_in_force),
        (SlotRoom::Permille(350), SlotRoom::Permille(350))
    );
    assert!(
        log.contains(
            "its plans leave 35% of its grant free, as it asks (the coordinator's own room: 20%)"
        ),
        "{log}"
    );
    assert!(
        !out.stderr.contains("plans now leave"),
        "a fixed room was adapted:\n{}",
        out.stderr
    );
    let row = status
        .lines()
        .find(|l| l.contains(&format!(" {} ", slot.process.pid)))
        .unwrap_or_else(|| panic!("the job is not in tensile status:\n{status}"));
    assert!(row.contains(" 35% "), "{row}");
}

/// The file's owner, mode, size, inode and bytes, to tell that nothing touched it.
fn fingerprint(path: &str) -> (u32, u32, u64, u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).unwrap();
    let bytes = std::fs::read(path).unwrap();
    (
        m.uid(),
        m.mode(),
        m.len(),
        m.ino(),
        tensile_tests::expect::fnv1a(&bytes),
    )
}

/// Issue 11: a segment under this job's name that another user owns, or that is open to
/// other users, is refused in one line (not joined, not replaced, not touched), and the job
/// learns and plans in its own process, bit for bit. Changing a file's owner needs root; as
/// another user only the mode is tried.
#[test]
fn a_segment_of_another_owner_or_open_to_others_is_refused_once_and_left_untouched() {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!(
            "not root: the segment owned by another user is not tried (chown needs root); \
             the segment open to others is"
        );
    }
    let native = train(12).output();
    native.assert_ok("native");
    let mut cases = vec![("mode", "open to other users")];
    if root {
        cases.push(("owner", "belongs to uid 65534"));
    }
    let segments: Vec<(String, CoordinatorSegment, String)> = cases
        .iter()
        .map(|(case, _)| {
            let name = unique_name(&format!("foreign-{case}"));
            let segment = CoordinatorSegment::create(
                &name,
                Geometry {
                    slot_count: 2,
                    ..Geometry::default()
                },
            )
            .unwrap();
            let path = shm_path(&shm_name(&name).unwrap());
            if *case == "owner" {
                let c = std::ffi::CString::new(path.clone()).unwrap();
                // SAFETY: a NUL-terminated path that outlives the call.
                assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
            } else {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            }
            (name, segment, path)
        })
        .collect();
    let before: Vec<_> = segments.iter().map(|(_, _, p)| fingerprint(p)).collect();
    let outs: Vec<Output> = std::thread::scope(|s| {
        let runs: Vec<_> = segments
            .iter()
            .map(|(name, _, _)| s.spawn(move || planned_job(12, name).output()))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let after: Vec<_> = segments.iter().map(|(_, _, p)| fingerprint(p)).collect();
    drop(segments);
    for ((out, (case, says)), (before, after)) in
        outs.iter().zip(&cases).zip(before.iter().zip(&after))
    {
        out.assert_ok(case);
        assert_eq!(
            named_digests(&out.stdout),
            named_digests(&native.stdout),
            "{case}: results differ from the run without the shim"
        );
        let refusals: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.contains("no coordinator"))
            .collect();
        assert_eq!(
            refusals.len(),
            1,
            "{case}: one line expected:\n{}",
            out.stderr
        );
        assert!(refusals[0].contains(says), "{case}: {}", refusals[0]);
        assert!(
            !out.stderr.contains("started coordinator")
                && !out.stderr.contains("joined coordinator"),
            "{case}: the segment must be neither joined nor replaced:\n{}",
            out.stderr
        );
        assert_eq!(before, after, "{case}: the segment was touched");
        assert!(
            executor_counter(out, "plans_loaded") >= 1,
            "{case}: {}",
            out.stderr
        );
        assert_eq!(executor_counter(out, "mismatches"), 0);
    }
}

/// The pid a coordinator's log says it serves with.
fn logged_coordinator_pid(log: &str) -> Option<u32> {
    log.lines().rev().find_map(|l| {
        l.split_once(" coordinator ")?
            .1
            .split_once(" serving ")?
            .0
            .parse()
            .ok()
    })
}

/// Issue 11: segments live where `TENSILE_SHM_DIR` says (default `/dev/shm`). A directory
/// that cannot hold them (a path under a regular file: not even root can make it; or one
/// that does not exist, so the coordinator the job starts cannot create its segment) is
/// reported in one line, and the job learns and plans in its own process, bit for bit. In
/// a directory that can, a job starts a coordinator there and runs its plan, and `tensile
/// status` with the same setting finds it.
#[test]
fn segments_live_in_tensile_shm_dir_and_one_that_cannot_hold_them_is_reported_once() {
    let dir = std::env::temp_dir().join(format!("tensile-shmdir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("good")).unwrap();
    std::fs::write(dir.join("file"), b"not a directory").unwrap();
    let native = train(12).output();
    native.assert_ok("native");
    let cases = [
        ("under-a-file", dir.join("file/shm"), "Not a directory"),
        ("absent", dir.join("absent"), "it exited"),
        ("good", dir.join("good"), ""),
    ];
    let names: Vec<String> = cases
        .iter()
        .map(|(case, _, _)| unique_name(&format!("shmdir-{case}")))
        .collect();
    let outs: Vec<Output> = std::thread::scope(|s| {
        let runs: Vec<_> = cases
            .iter()
            .zip(&names)
            .map(|((_, path, _), name)| {
                s.spawn(move || {
                    planned_job(12, name)
                        .env("TENSILE_SHM_DIR", path.display().to_string())
                        .output()
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let logs: Vec<PathBuf> = names
        .iter()
        .map(|n| std::env::temp_dir().join(format!("tensile-coordinator-{uid}-{n}.log")))
        .collect();
    let good_log = std::fs::read_to_string(&logs[2]).unwrap_or_default();
    let good_segment = dir.join("good").join(shm_name(&names[2]).unwrap());
    let status = std::process::Command::new(&artifacts().tensile)
        .arg("status")
        .env("TENSILE_SHM_DIR", dir.join("good"))
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    // Stop the coordinator the good job started (it is in a directory the helpers here do
    // not look in) and wait for its segment to go.
    if let Some(pid) = logged_coordinator_pid(&good_log) {
        // SAFETY: plain kill(2) of the pid that coordinator logged.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while good_segment.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let good_segment_gone = !good_segment.exists();
    let absent_created = dir.join("absent").exists();
    for log in &logs {
        let _ = std::fs::remove_file(log);
    }
    let _ = std::fs::remove_dir_all(&dir);
    for (out, (case, _, says)) in outs.iter().zip(&cases) {
        out.assert_ok(case);
        assert_eq!(
            named_digests(&out.stdout),
            named_digests(&native.stdout),
            "{case}: results differ from the run without the shim"
        );
        assert!(
            executor_counter(out, "plans_loaded") >= 1,
            "{case}: {}",
            out.stderr
        );
        assert_eq!(executor_counter(out, "mismatches"), 0);
        let refusals: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.contains("no coordinator"))
            .collect();
        if says.is_empty() {
            assert!(refusals.is_empty(), "{case}: {}", out.stderr);
            continue;
        }
        assert_eq!(
            refusals.len(),
            1,
            "{case}: one line expected:\n{}",
            out.stderr
        );
        assert!(refusals[0].contains(says), "{case}: {}", refusals[0]);
        assert!(
            !out.stderr.contains("joined coordinator"),
            "{case}:\n{}",
            out.stderr
        );
    }
    assert!(!absent_created, "a missing directory must not be made");
    let good = &outs[2];
    assert!(
        good.stderr
            .contains(&format!("joined coordinator {}", good_segment.display())),
        "the job did not join a segment in TENSILE_SHM_DIR:\n{}",
        good.stderr
    );
    assert!(
        good.stderr.contains("from the coordinator"),
        "no plan from the coordinator in TENSILE_SHM_DIR:\n{}\n--- coordinator\n{good_log}",
        good.stderr
    );
    assert!(
        status.contains(&names[2]),
        "tensile status with TENSILE_SHM_DIR did not find the coordinator:\n{status}"
    );
    assert!(
        good_segment_gone,
        "the coordinator in TENSILE_SHM_DIR did not stop"
    );
}

/// Issue 12, admission: a launch's needs are known only once it is made, so the coordinator
/// keeps each command line's floor (its largest launch) across runs, in its `--floors` file.
/// A job's run leaves its floor there as it leaves; the next run of the same command under
/// another coordinator starts with it (the coordinator says so as the job joins), so a job
/// that cannot fit is told as it starts (`coordinator::tests::a_job_whose_command_could_not_fit_before_is_told_as_it_joins`).
#[test]
fn a_commands_largest_launch_is_remembered_for_its_next_run() {
    let name = unique_name("floors");
    let floors = std::env::temp_dir().join(format!("tensile-e2e-{name}.floors"));
    let _ = std::fs::remove_file(&floors);
    let floors_arg = floors.to_str().expect("a UTF-8 temporary directory");
    let remembered = || -> Option<(u64, String)> {
        let text = std::fs::read_to_string(&floors).ok()?;
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("tensile-floors 1"), "{text}");
        let (bytes, command) = lines.next()?.split_once('\t')?;
        Some((bytes.parse().ok()?, command.to_string()))
    };
    let first = {
        let coordinator = OwnCoordinator::start(&name, &["--floors", floors_arg]);
        planned_job(4, &name).output().assert_ok("the first run");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(r) = remembered() {
                break r;
            }
            assert!(
                Instant::now() < deadline,
                "the job's floor was not kept:\n{}",
                coordinator.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Its sgd_momentum launches touch a parameter, its gradient and its momentum: three
    // tensors of a page each, at the least.
    assert!(first.0 >= 3 * (2 << 20), "{first:?}");
    assert!(first.1.contains("wl_train"), "{first:?}");
    let coordinator = OwnCoordinator::start(&name, &["--floors", floors_arg]);
    let job = planned_job(4, &name).spawn();
    let deadline = Instant::now() + PATIENCE;
    while !coordinator
        .log()
        .contains("an earlier run of its command needed")
    {
        assert!(
            Instant::now() < deadline,
            "the second run was not given its remembered floor:\n{}",
            coordinator.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    job.wait().assert_ok("the second run");
    drop(coordinator);
    let _ = std::fs::remove_file(&floors);
}
