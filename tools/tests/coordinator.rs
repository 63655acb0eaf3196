//! `tensile coordinator` and `tensile status` as processes: a job (this test) joins a running
//! coordinator, `status` lists it, the coordinator exits and unlinks its segment after the job
//! leaves, and one killed with SIGKILL is replaced by the next.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tensile_protocol::segment::{shm_name, shm_path};
use tensile_protocol::{JobClient, JobOptions, SegmentError};
use tensile_trace::{Launch, Record};

const TENSILE: &str = env!("CARGO_BIN_EXE_tensile");

fn unique_name(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "test-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn log_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{name}.log"))
}

fn start_coordinator(name: &str) -> Child {
    Command::new(TENSILE)
        .args([
            "coordinator",
            "--name",
            name,
            "--idle-exit",
            "1",
            "--slots",
            "4",
        ])
        .arg("--log")
        .arg(log_path(name))
        .spawn()
        .expect("starting tensile coordinator")
}

fn tensile(args: &[&str]) -> Output {
    Command::new(TENSILE)
        .args(args)
        .output()
        .expect("running tensile")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Joins `name` once its coordinator has made the segment.
fn join_when_ready(name: &str, command_line: &str) -> JobClient {
    let options = JobOptions {
        budget_bytes: 6 << 30,
        command_line: command_line.into(),
        ..JobOptions::default()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match JobClient::join(name, &options) {
            Ok(job) => return job,
            Err(SegmentError::NotFound { .. } | SegmentError::NotReady { .. })
                if Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("joining {name}: {e}"),
        }
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the coordinator did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn segment_file(name: &str) -> String {
    shm_path(&shm_name(name).unwrap())
}

fn launch(seq: u64) -> Record {
    Record::Launch(Launch {
        t_ns: seq,
        stream: 0,
        seq,
        kernel: 1,
        grid: [1; 3],
        block: [1; 3],
        smem: 0,
        accesses: Vec::new(),
    })
}

#[test]
fn a_coordinator_serves_a_job_status_lists_it_and_it_exits_after_the_job_leaves() {
    let name = unique_name("serve");
    let mut coordinator = start_coordinator(&name);
    let mut job = join_when_ready(&name, "python train.py --batch 64");
    for seq in 0..1000 {
        job.push(&launch(seq));
    }
    job.flush();
    // The coordinator grants what the job asked.
    let deadline = Instant::now() + Duration::from_secs(10);
    while job.grant() != 6 << 30 {
        assert!(Instant::now() < deadline, "no grant after 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(job.connected());

    let status = tensile(&["status", "--name", &name]);
    assert!(status.status.success(), "{}", text(&status.stderr));
    let report = text(&status.stdout);
    let pid = std::process::id().to_string();
    assert!(
        report.contains(&format!("coordinator {name} (pid {}", coordinator.id())),
        "{report}"
    );
    let row = report
        .lines()
        .find(|l| l.split_whitespace().next() == Some(pid.as_str()))
        .unwrap_or_else(|| panic!("no row for pid {pid}:\n{report}"));
    for want in ["6.00 GiB", "learning", "python train.py --batch 64"] {
        assert!(row.contains(want), "{want:?} not in {row:?}");
    }
    // Without --name, every segment of this user is listed, this one among them.
    let all = text(&tensile(&["status"]).stdout);
    assert!(all.contains(&format!("coordinator {name} ")), "{all}");

    // A second coordinator for the same name refuses, in one line.
    let second = tensile(&["coordinator", "--name", &name, "--idle-exit", "1"]);
    assert!(!second.status.success());
    let err = text(&second.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("which is running"), "{err}");

    job.leave();
    let exit = wait_exit(&mut coordinator, Duration::from_secs(15));
    assert!(exit.success(), "{exit:?}");
    assert!(
        !Path::new(&segment_file(&name)).exists(),
        "segment left behind"
    );
    let log = std::fs::read_to_string(log_path(&name)).unwrap();
    for want in [
        format!("job {pid} joined slot 0, asking 6.00 GiB: python train.py --batch 64"),
        format!("job {pid} left slot 0 after 1000 records (0 lost)"),
        "no job for 1.0 s; exiting".to_string(),
    ] {
        assert!(log.contains(&want), "{want:?} not in the log:\n{log}");
    }
    let _ = std::fs::remove_file(log_path(&name));
}

#[test]
fn a_coordinator_killed_with_sigkill_is_replaced_and_the_job_rejoins() {
    let name = unique_name("killed");
    let mut first = start_coordinator(&name);
    let job = join_when_ready(&name, "job --rejoins");
    assert!(job.connected());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(first.id() as i32, libc::SIGKILL) };
    first.wait().unwrap();
    assert!(
        !job.connected(),
        "the job did not notice its coordinator died"
    );
    let report = text(&tensile(&["status", "--name", &name]).stdout);
    assert!(report.contains("is NOT running"), "{report}");
    // Joining the dead coordinator's segment is refused by kind: start a new one instead.
    match JobClient::join(&name, &JobOptions::default()) {
        Err(SegmentError::CoordinatorGone { pid, .. }) => assert_eq!(pid, first.id()),
        other => panic!("expected CoordinatorGone, got {other:?}"),
    }

    let mut second = start_coordinator(&name);
    // The new coordinator replaces the stale segment; the job joins it anew.
    let deadline = Instant::now() + Duration::from_secs(20);
    let rejoined = loop {
        match JobClient::join(&name, &JobOptions::default()) {
            Ok(j) if j.connected() => break j,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("did not rejoin: {other:?}"),
        }
    };
    assert!(!job.connected());
    drop(job);
    rejoined.leave();
    let exit = wait_exit(&mut second, Duration::from_secs(15));
    assert!(exit.success());
    assert!(!Path::new(&segment_file(&name)).exists());
    let _ = std::fs::remove_file(log_path(&name));
}

#[test]
fn status_says_in_one_line_that_a_named_coordinator_is_not_running() {
    let name = unique_name("absent");
    let out = tensile(&["status", "--name", &name]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert_eq!(
        err.trim(),
        format!("tensile: no coordinator named {name:?} is running")
    );
}

/// Not a test on its own: the body of the job process `spawn_job` starts (this test binary
/// run again), which joins, says so, and sleeps until killed.
#[test]
fn job_process_for_other_tests() {
    let Ok(name) = std::env::var("TENSILE_TEST_JOB_SEGMENT") else {
        return;
    };
    let mut job = join_when_ready(&name, "doomed-job");
    for seq in 0..100 {
        job.push(&launch(seq));
    }
    job.flush();
    println!("joined");
    std::thread::sleep(Duration::from_secs(120));
}

fn spawn_job(name: &str) -> Child {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "job_process_for_other_tests", "--nocapture"])
        .env("TENSILE_TEST_JOB_SEGMENT", name)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The harness prints "test NAME ... " on the same line first.
    while !lines
        .next()
        .expect("the job process ended before joining")
        .unwrap()
        .contains("joined")
    {}
    child
}

#[test]
fn a_job_killed_with_sigkill_is_logged_its_slot_freed_and_the_coordinator_then_exits() {
    let name = unique_name("jobdies");
    let mut coordinator = start_coordinator(&name);
    let mut job = spawn_job(&name);
    let pid = job.id();
    let report = text(&tensile(&["status", "--name", &name]).stdout);
    assert!(report.contains("doomed-job"), "{report}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    job.wait().unwrap();
    let want = format!("job {pid} died; slot 0 reclaimed after ");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(log_path(&name)).unwrap_or_default();
        if log.contains(&want) {
            break;
        }
        assert!(Instant::now() < deadline, "{want:?} not in the log:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // No job left: the coordinator exits after its idle time and removes its segment.
    let exit = wait_exit(&mut coordinator, Duration::from_secs(15));
    assert!(exit.success());
    assert!(!Path::new(&segment_file(&name)).exists());
    let _ = std::fs::remove_file(log_path(&name));
}
