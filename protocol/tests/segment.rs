//! The segment between processes: created and opened through `/dev/shm`, refused when it is
//! not ours or not our version, garbled through its file, and left behind by a job killed
//! with SIGKILL (a child process: this test binary run again as a job).

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::process::{Child, Command as Process, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use tensile_protocol::segment::{shm_name, shm_path};
use tensile_protocol::{
    Command, CommandError, CommandRead, CoordinatorSegment, Delivery, Geometry, JobClient,
    JobOptions, PlanState, Reclaimed, SegmentError, SegmentView, SlotRoom, StepCounters,
    LAYOUT_VERSION,
};
use tensile_trace::{Access, Launch, Record};

/// A coordinator name no other test (or test process) uses.
fn unique_name(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "test-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn small() -> Geometry {
    Geometry {
        slot_count: 4,
        ring_bytes: 16 << 10,
        command_bytes: 16 << 10,
    }
}

fn launch(seq: u64) -> Record {
    Record::Launch(Launch {
        t_ns: seq * 10,
        stream: 0,
        seq,
        kernel: (seq % 7) as u32,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        smem: 0,
        accesses: vec![Access {
            alloc: seq % 5,
            param_offset: 8,
        }],
    })
}

fn options(command_line: &str) -> JobOptions {
    JobOptions {
        budget_bytes: 3 << 30,
        command_line: command_line.into(),
        ..JobOptions::default()
    }
}

fn drain_all(c: &mut CoordinatorSegment, slot: u32) -> Vec<Delivery> {
    let mut out = Vec::new();
    c.drain(slot, usize::MAX, |d| out.push(d));
    out
}

/// Writes `bytes` at `offset` of the segment's file: the same memory every mapping sees.
fn poke(name: &str, offset: u64, bytes: &[u8]) {
    let path = shm_path(&shm_name(name).unwrap());
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

const SLOT0: u64 = 256;
const SLOT_BYTES: u64 = 1024;

#[test]
fn a_job_joins_streams_records_reports_and_leaves() {
    let name = unique_name("roundtrip");
    let mut coordinator = CoordinatorSegment::create(&name, small()).unwrap();
    let mut job = JobClient::join(&name, &options("python train.py --epochs 3")).unwrap();
    let slot = job.slot_index();

    let jobs = coordinator.jobs();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].process.pid, std::process::id());
    assert!(jobs[0].live);
    assert_eq!(jobs[0].budget_bytes, 3 << 30);
    assert_eq!(jobs[0].command_line, "python train.py --epochs 3");

    let sent: Vec<Record> = (0..500).map(launch).collect();
    let mut received = Vec::new();
    for r in &sent {
        job.push(r);
        // Drain now and then, as the coordinator's loop does.
        if let Record::Launch(l) = r {
            if l.seq % 97 == 0 {
                received.extend(drain_all(&mut coordinator, slot));
            }
        }
    }
    job.flush();
    received.extend(drain_all(&mut coordinator, slot));
    let records: Vec<Record> = received
        .into_iter()
        .map(|d| match d {
            Delivery::Record(r) => r,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(records, sent);

    job.set_memory(1 << 30, 2 << 30);
    job.set_plan(4, PlanState::Planned);
    job.set_step_counters(&StepCounters {
        stalls: 3,
        bytes_to_host: 100 << 20,
        bytes_to_device: 90 << 20,
        predicted_step_ns: 20_000_000,
        measured_step_ns: 21_000_000,
    });
    coordinator.set_grant(slot, 3 << 30);
    assert_eq!(job.grant(), 3 << 30);

    let view = SegmentView::open(&name).unwrap();
    assert_eq!(view.coordinator().process.pid, std::process::id());
    assert!(view.coordinator().running);
    let seen = &view.jobs()[0];
    assert_eq!(seen.resident_bytes, 1 << 30);
    assert_eq!(seen.demand_bytes, 2 << 30);
    assert_eq!(
        (seen.plan_version, seen.plan_state),
        (4, Some(PlanState::Planned))
    );
    assert_eq!(seen.measured_step_ns, 21_000_000);
    assert_eq!(seen.records_pushed, 500);
    assert!(job.connected());

    job.leave();
    assert!(coordinator.jobs().is_empty());
    drop(view);
    drop(coordinator);
    assert!(!std::path::Path::new(&shm_path(&shm_name(&name).unwrap())).exists());
}

#[test]
fn a_second_create_fails_by_kind_and_a_running_coordinator_is_not_replaced() {
    let name = unique_name("excl");
    let first = CoordinatorSegment::create(&name, small()).unwrap();
    assert!(matches!(
        CoordinatorSegment::create(&name, small()),
        Err(SegmentError::AlreadyExists { .. })
    ));
    match CoordinatorSegment::create_replacing_stale(&name, small()) {
        Err(SegmentError::CoordinatorRunning { pid, .. }) => assert_eq!(pid, std::process::id()),
        other => panic!("expected CoordinatorRunning, got {other:?}"),
    }
    drop(first);
}

#[test]
fn a_segment_of_another_version_is_refused_in_one_line() {
    let name = unique_name("version");
    let _coordinator = CoordinatorSegment::create(&name, small()).unwrap();
    poke(&name, 8, &(LAYOUT_VERSION + 1).to_le_bytes());
    let err = JobClient::join(&name, &options("x")).unwrap_err();
    match &err {
        SegmentError::VersionMismatch {
            found, expected, ..
        } => {
            assert_eq!((*found, *expected), (LAYOUT_VERSION + 1, LAYOUT_VERSION))
        }
        other => panic!("expected VersionMismatch, got {other:?}"),
    }
    let line = err.to_string();
    assert!(!line.contains('\n'), "{line}");
    assert!(
        line.contains(&format!("version {}", LAYOUT_VERSION + 1))
            && line.contains(&format!("version {LAYOUT_VERSION}")),
        "{line}"
    );
    assert!(matches!(
        SegmentView::open(&name),
        Err(SegmentError::VersionMismatch { .. })
    ));
}

#[test]
fn a_segment_open_to_others_or_of_wrong_size_or_magic_is_refused() {
    let name = unique_name("checks");
    let _coordinator = CoordinatorSegment::create(&name, small()).unwrap();
    let path = shm_path(&shm_name(&name).unwrap());
    // Created 0600 whatever the umask.
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(matches!(
        JobClient::join(&name, &options("x")),
        Err(SegmentError::OpenToOthers { mode: 0o644, .. })
    ));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

    poke(&name, 16, &(small().total_bytes() + 4096).to_le_bytes());
    assert!(matches!(
        JobClient::join(&name, &options("x")),
        Err(SegmentError::BadGeometry { .. })
    ));
    poke(&name, 16, &small().total_bytes().to_le_bytes());
    poke(&name, 12, &5000u32.to_le_bytes()); // slot count past the limit
    assert!(matches!(
        JobClient::join(&name, &options("x")),
        Err(SegmentError::BadGeometry { .. })
    ));
    poke(&name, 12, &small().slot_count.to_le_bytes());
    poke(&name, 0, b"NOTOURS!");
    assert!(matches!(
        JobClient::join(&name, &options("x")),
        Err(SegmentError::BadMagic { .. })
    ));
    // And a name with a slash is no name.
    assert!(matches!(
        JobClient::join("../etc", &options("x")),
        Err(SegmentError::BadName(_))
    ));
    assert!(matches!(
        JobClient::join(&unique_name("absent"), &options("x")),
        Err(SegmentError::NotFound { .. })
    ));
}

#[test]
fn another_users_segment_is_refused() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: cannot give a segment to another user; checked by mode instead");
        return;
    }
    let name = unique_name("owner");
    let _coordinator = CoordinatorSegment::create(&name, small()).unwrap();
    let path = shm_path(&shm_name(&name).unwrap());
    std::os::unix::fs::chown(&path, Some(12345), None).unwrap();
    match JobClient::join(&name, &options("x")) {
        Err(SegmentError::OtherOwner { owner, us, .. }) => assert_eq!((owner, us), (12345, 0)),
        other => panic!("expected OtherOwner, got {other:?}"),
    }
}

#[test]
fn a_half_made_segment_of_a_dead_creator_is_replaced() {
    let name = unique_name("stale");
    let coordinator = CoordinatorSegment::create(&name, small()).unwrap();
    // A creator that died before storing the magic: magic 0, its pid a dead process's.
    let mut dead = Process::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    poke(&name, 0, &0u64.to_le_bytes());
    poke(&name, 40, &dead_pid.to_le_bytes());
    assert!(matches!(
        JobClient::join(&name, &options("x")),
        Err(SegmentError::NotReady { .. })
    ));
    // The first coordinator's handle no longer names what is at the path once it is
    // replaced, so its drop must not unlink the new one.
    let replacement = CoordinatorSegment::create_replacing_stale(&name, small()).unwrap();
    drop(coordinator);
    let job = JobClient::join(&name, &options("x")).unwrap();
    assert!(job.connected());
    drop(job);
    drop(replacement);
    assert!(!std::path::Path::new(&shm_path(&shm_name(&name).unwrap())).exists());
}

/// Runs this test binary again as a job that joins `name`, says which slot it took, and
/// sleeps until killed.
fn spawn_job(name: &str) -> (Child, u32) {
    let mut child = Process::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "job_process_for_other_tests",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TENSILE_TEST_JOB_SEGMENT", name)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let slot = loop {
        let line = lines
            .next()
            .expect("the job process ended before claiming")
            .unwrap();
        // The test harness prints "test NAME ... " on the same line first.
        if let Some(at) = line.find("claimed slot ") {
            break line[at + "claimed slot ".len()..].trim().parse().unwrap();
        }
    };
    (child, slot)
}

/// Not a test on its own: the body of the job process of [`spawn_job`].
#[test]
fn job_process_for_other_tests() {
    let Ok(name) = std::env::var("TENSILE_TEST_JOB_SEGMENT") else {
        return;
    };
    let mut job = JobClient::join(&name, &options("killed-job --child")).unwrap();
    for seq in 0..10 {
        job.push(&launch(seq));
    }
    job.flush();
    println!("claimed slot {}", job.slot_index());
    std::thread::sleep(std::time::Duration::from_secs(120));
}

fn kill9(child: &mut Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
}

#[test]
fn the_slot_of_a_job_killed_with_sigkill_is_reclaimed_by_the_sweep() {
    let name = unique_name("sweep");
    let mut coordinator = CoordinatorSegment::create(&name, small()).unwrap();
    let (mut child, slot) = spawn_job(&name);
    let jobs = coordinator.jobs();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].process.pid, child.id());
    assert_eq!(jobs[0].command_line, "killed-job --child");
    // While it lives, the sweep leaves it alone.
    assert!(coordinator.sweep().is_empty());
    let pid = child.id();
    kill9(&mut child);
    assert_eq!(coordinator.sweep(), vec![Reclaimed { slot, pid }]);
    assert!(coordinator.jobs().is_empty());
}

#[test]
fn a_joining_job_takes_the_slot_of_a_dead_one_and_none_of_its_records() {
    let name = unique_name("reclaim");
    let geometry = Geometry {
        slot_count: 1,
        ..small()
    };
    let mut coordinator = CoordinatorSegment::create(&name, geometry).unwrap();
    let (mut child, slot) = spawn_job(&name);
    assert!(matches!(
        JobClient::join(&name, &options("x")),
        Err(SegmentError::NoFreeSlot { slots: 1, .. })
    ));
    let old_incarnation = coordinator.jobs()[0].incarnation;
    assert_eq!(coordinator.jobs()[0].took_from, 0, "its slot was free");
    let dead = child.id();
    kill9(&mut child);
    let mut job = JobClient::join(&name, &options("the new one")).unwrap();
    assert_eq!(job.slot_index(), slot);
    let now = &coordinator.jobs()[0];
    assert_eq!(now.process.pid, std::process::id());
    assert!(now.incarnation > old_incarnation);
    // The slot says whose it was, so the coordinator logs that job as dead.
    assert_eq!(now.took_from, dead);
    // The dead job's unread records are not delivered as the new job's.
    job.push(&launch(1000));
    job.flush();
    assert_eq!(
        drain_all(&mut coordinator, slot),
        vec![Delivery::Record(launch(1000))]
    );
}

#[test]
fn what_a_job_pushed_just_before_leaving_is_read_unless_a_new_job_took_the_slot() {
    let name = unique_name("departed");
    let geometry = Geometry {
        slot_count: 1,
        ..small()
    };
    let mut coordinator = CoordinatorSegment::create(&name, geometry).unwrap();
    let mut job = JobClient::join(&name, &options("leaves at once")).unwrap();
    let (slot, incarnation) = (job.slot_index(), coordinator.jobs()[0].incarnation);
    let sent: Vec<Record> = (0..40).map(launch).collect();
    for r in &sent {
        job.push(r);
    }
    job.leave();
    assert!(coordinator.jobs().is_empty());
    let mut got = Vec::new();
    coordinator.drain_departed(slot, incarnation, |d| got.push(d));
    let expected: Vec<Delivery> = sent.iter().cloned().map(Delivery::Record).collect();
    assert_eq!(got, expected);
    // The slot is free again: the next job takes it.
    assert!(coordinator.jobs().is_empty());

    // A job that left and whose slot a new job took: its records went with the claim, and
    // the new job's are not read as the old one's.
    let mut first = JobClient::join(&name, &options("first")).unwrap();
    let first_incarnation = coordinator.jobs()[0].incarnation;
    first.push(&launch(1));
    first.leave();
    let mut second = JobClient::join(&name, &options("second")).unwrap();
    second.push(&launch(2));
    second.flush();
    let mut got = Vec::new();
    coordinator.drain_departed(slot, first_incarnation, |d| got.push(d));
    assert_eq!(got, Vec::new());
    assert!(
        second.connected(),
        "reading the departed job's ring took the slot"
    );
    assert_eq!(
        drain_all(&mut coordinator, slot),
        vec![Delivery::Record(launch(2))]
    );
}

#[test]
fn a_full_ring_drops_counts_and_says_where_the_gap_is() {
    let name = unique_name("full");
    let mut coordinator = CoordinatorSegment::create(&name, small()).unwrap();
    let mut job = JobClient::join(
        &name,
        &JobOptions {
            batch_bytes: 512,
            ..options("x")
        },
    )
    .unwrap();
    let slot = job.slot_index();
    // Nobody drains: the 16 KiB ring fills and later batches are dropped.
    for seq in 0..2000 {
        job.push(&launch(seq));
    }
    job.flush();
    let dropped = coordinator.jobs()[0].records_dropped;
    let pushed = coordinator.jobs()[0].records_pushed;
    assert!(dropped > 0, "nothing dropped");
    assert_eq!(dropped + pushed, 2000);
    let mut deliveries = drain_all(&mut coordinator, slot);
    job.push(&launch(5000));
    job.flush();
    deliveries.extend(drain_all(&mut coordinator, slot));
    // In order: every record that fit, and at each gap the number of records it swallowed.
    let (mut next, mut lost) = (0u64, 0u64);
    let last = deliveries.pop();
    for d in deliveries {
        match d {
            Delivery::Record(r) => {
                assert_eq!(r, launch(next));
                next += 1;
            }
            Delivery::Lost(n) => {
                next += n;
                lost += n;
            }
            Delivery::Corrupt(c) => panic!("corrupt: {c}"),
        }
    }
    assert_eq!(lost, dropped);
    assert_eq!(next, 2000);
    assert_eq!(last, Some(Delivery::Record(launch(5000))));
}

#[test]
fn garbage_in_the_ring_is_detected_reset_counted_and_the_stream_goes_on() {
    let name = unique_name("garbage");
    let mut coordinator = CoordinatorSegment::create(&name, small()).unwrap();
    let mut job = JobClient::join(&name, &options("x")).unwrap();
    let slot = u64::from(job.slot_index());
    let head_at = SLOT0 + slot * SLOT_BYTES + 192;
    let ring_at = small().rings_offset() + slot * small().ring_bytes;

    for (what, offset, bytes) in [
        ("head", head_at, 0xdead_beef_u64.to_le_bytes()),
        ("tail", head_at + 64, 12_345u64.to_le_bytes()),
        ("length", ring_at, u64::MAX.to_le_bytes()),
    ] {
        // The frame header of the next frame sits at the tail's position in the ring;
        // write the frame first so the garbage lands on it.
        job.push(&launch(1));
        job.flush();
        if what == "length" {
            let tail = coordinator_tail(&name, slot);
            let at = ring_at + tail % small().ring_bytes;
            poke(&name, at, &bytes);
        } else {
            poke(&name, offset, &bytes);
        }
        let d = drain_all(&mut coordinator, slot as u32);
        assert!(
            matches!(d.as_slice(), [Delivery::Corrupt(_)]),
            "{what}: {d:?}"
        );
        // Records pushed afterwards arrive, in order.
        for seq in 10..20 {
            job.push(&launch(seq));
        }
        job.flush();
        let d = drain_all(&mut coordinator, slot as u32);
        let want: Vec<Delivery> = (10..20).map(|s| Delivery::Record(launch(s))).collect();
        assert_eq!(d, want, "{what}");
    }
    assert_eq!(coordinator.jobs()[0].ring_resets, 3);

    // A frame whose length is right but whose bytes are not records.
    job.push(&launch(1));
    job.flush();
    let tail = coordinator_tail(&name, slot);
    poke(&name, ring_at + (tail + 8) % small().ring_bytes, &[0xff; 8]);
    let d = drain_all(&mut coordinator, slot as u32);
    assert!(matches!(d.as_slice(), [Delivery::Corrupt(_)]), "{d:?}");
}

fn coordinator_tail(name: &str, slot: u64) -> u64 {
    let path = shm_path(&shm_name(name).unwrap());
    let f = OpenOptions::new().read(true).open(&path).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, SLOT0 + slot * SLOT_BYTES + 256)
        .unwrap();
    u64::from_le_bytes(b)
}

#[test]
fn commands_reach_the_job_in_order_one_at_a_time() {
    let name = unique_name("commands");
    let mut coordinator = CoordinatorSegment::create(&name, small()).unwrap();
    let mut job = JobClient::join(&name, &options("x")).unwrap();
    let slot = job.slot_index();
    let incarnation = coordinator.jobs()[0].incarnation;
    let plan = |version| tensile_protocol::ExecPlan {
        version,
        period: 3,
        kernels: vec![1, 2, 3],
        anchor_seq: 7,
        steps: Vec::new(),
        uses: Vec::new(),
        host_resident: Vec::new(),
        budget_bytes: 1 << 30,
        predicted_step_ns: 5,
        compute_ns: 4,
    };
    assert_eq!(job.poll_command(), CommandRead::Nothing);
    coordinator
        .send(slot, incarnation, Command::Budget(2 << 30))
        .unwrap();
    coordinator
        .send(slot, incarnation, Command::Plan(plan(1)))
        .unwrap();
    // A newer plan replaces the queued one: only the latest matters.
    coordinator
        .send(slot, incarnation, Command::Plan(plan(2)))
        .unwrap();
    assert_eq!(coordinator.queued_commands(slot), 1);
    assert_eq!(
        job.poll_command(),
        CommandRead::New(Ok(Command::Budget(2 << 30)))
    );
    assert_eq!(job.poll_command(), CommandRead::Nothing);
    coordinator.flush_commands(slot, incarnation).unwrap();
    assert_eq!(
        job.poll_command(),
        CommandRead::New(Ok(Command::Plan(plan(2))))
    );
    // A plan too large for the area is refused by kind, and nothing is sent.
    let mut huge = plan(3);
    huge.period = 20_000;
    huge.kernels = vec![1_000_000; 20_000];
    assert!(matches!(
        coordinator.send(slot, incarnation, Command::Plan(huge)),
        Err(CommandError::TooLarge { .. })
    ));
    assert_eq!(job.poll_command(), CommandRead::Nothing);
    // Garbage in the command area: refused, counted.
    let s = SLOT0 + u64::from(slot) * SLOT_BYTES;
    poke(&name, s + 328, &99u32.to_le_bytes());
    poke(&name, s + 320, &100u64.to_le_bytes());
    assert_eq!(
        job.poll_command(),
        CommandRead::New(Err(CommandError::UnknownKind(99)))
    );
    assert_eq!(coordinator.jobs()[0].commands_rejected, 1);
}

/// The slot's room words (offsets 696 and 704), for poking.
const ROOM_ASKED: u64 = 696;
const ROOM_IN_FORCE: u64 = 704;

#[test]
fn the_room_a_job_asks_and_the_room_in_force_go_through_the_slot() {
    let name = unique_name("room");
    let coordinator = CoordinatorSegment::create(&name, small()).unwrap();
    // One job says nothing, one asks for no room at all: 0% said is not nothing said.
    let silent = JobClient::join(&name, &options("silent")).unwrap();
    let none = JobClient::join(
        &name,
        &JobOptions {
            room: Some(0.0),
            ..options("no room")
        },
    )
    .unwrap();
    let job = |slot: u32| {
        let jobs = coordinator.jobs();
        jobs.into_iter().find(|j| j.slot == slot).unwrap()
    };
    assert_eq!(job(silent.slot_index()).room_asked, SlotRoom::NotSaid);
    assert_eq!(job(none.slot_index()).room_asked, SlotRoom::Permille(0));
    assert_eq!(
        silent.room_in_force(),
        SlotRoom::NotSaid,
        "nothing said yet"
    );

    // The coordinator says its room; the job (and a reader of the segment) reads it.
    let slot = silent.slot_index();
    let incarnation = job(slot).incarnation;
    coordinator.set_room_in_force(slot, incarnation, SlotRoom::Permille(0));
    assert_eq!(silent.room_in_force(), SlotRoom::Permille(0));
    coordinator.set_room_in_force(slot, incarnation, SlotRoom::from_share(0.2));
    assert_eq!(silent.room_in_force().share(), Some(0.2));
    let view = SegmentView::open(&name).unwrap();
    let seen = view.jobs().into_iter().find(|j| j.slot == slot).unwrap();
    assert_eq!(seen.room_in_force, SlotRoom::Permille(200));

    // The job asks for more later; a share is kept to the thousandth, up to 90%.
    silent.ask_room(0.3);
    assert_eq!(job(slot).room_asked, SlotRoom::Permille(300));
    silent.ask_room(0.355);
    assert_eq!(job(slot).room_asked.share(), Some(0.355));
    silent.ask_room(4.0);
    assert_eq!(job(slot).room_asked, SlotRoom::Permille(900));

    // A word written for another incarnation of the slot is nobody's.
    coordinator.set_room_in_force(slot, incarnation + 1, SlotRoom::Permille(500));
    assert_eq!(silent.room_in_force(), SlotRoom::NotSaid);

    // Garbage for this job (the flag and its incarnation, a share over 90%) is refused by
    // both readers, never read as a room.
    let garbage = (incarnation & 0xffff_ffff) << 32 | 1 << 31 | 999;
    let at = SLOT0 + SLOT_BYTES * u64::from(slot);
    poke(&name, at + ROOM_IN_FORCE, &garbage.to_le_bytes());
    poke(&name, at + ROOM_ASKED, &garbage.to_le_bytes());
    assert_eq!(silent.room_in_force(), SlotRoom::Invalid(garbage));
    assert_eq!(silent.room_in_force().share(), None);
    assert_eq!(job(slot).room_asked, SlotRoom::Invalid(garbage));

    // The next job in the slot starts with its own words: what it asks, and nothing in force.
    silent.leave();
    let next = JobClient::join(
        &name,
        &JobOptions {
            room: Some(0.4),
            ..options("next")
        },
    )
    .unwrap();
    assert_eq!(next.slot_index(), slot);
    assert_eq!(job(slot).room_asked, SlotRoom::Permille(400));
    assert_eq!(next.room_in_force(), SlotRoom::NotSaid);
    // A job of the layout before the rooms writes neither word when it claims: what the
    // slot's previous job left is another incarnation's, so nothing said.
    let left_by_next = (job(slot).incarnation & 0xffff_ffff) << 32 | 1 << 31 | 400;
    next.leave();
    let old = JobClient::join(&name, &options("old layout")).unwrap();
    poke(&name, at + ROOM_ASKED, &left_by_next.to_le_bytes());
    assert_eq!(old.slot_index(), slot);
    assert_eq!(job(slot).room_asked, SlotRoom::NotSaid);
    old.leave();
    none.leave();
}

#[test]
fn a_long_command_line_is_truncated_on_a_character_boundary() {
    let name = unique_name("cmdline");
    let coordinator = CoordinatorSegment::create(&name, small()).unwrap();
    // 2-byte characters, so byte 255 falls inside one.
    let long = "python train.py ".to_string() + &"é".repeat(300);
    let job = JobClient::join(&name, &options(&long)).unwrap();
    let seen = coordinator.jobs()[0].command_line.clone();
    assert!(
        seen.len() <= 255 && seen.len() >= 254,
        "{} bytes",
        seen.len()
    );
    assert!(long.starts_with(&seen));
    drop(job);
}
