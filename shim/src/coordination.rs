//! The job's side of the coordinator: a [`PlanSource`] that streams this process's records to
//! `tensile coordinator` through its shared-memory segment and takes the plans it sends back.
//!
//! Joining happens on the planning thread, never in a hook. With `TENSILE_COORDINATOR=auto`
//! (the default) or a name, a job that finds no coordinator starts one: the `tensile` binary
//! next to `libtensile.so`, detached, without `LD_PRELOAD`, its log in a file named in the log
//! line. If none can be joined the caller learns in the process instead.
//!
//! When the coordinator goes away mid-run (killed, crashed), the job says so once and goes on:
//! the plan it runs stays valid (it depends on the job alone), whatever the plan does not cover
//! is swapped on demand, and it tries to rejoin (starting a new coordinator) every
//! [`REJOIN_INTERVAL`]; the new one learns the job again from its stream.
//!
//! A coordinator that runs but does not read (stopped, starved) costs the job nothing either:
//! its ring fills, frames that do not fit are dropped and counted (never waited for), the job
//! says so once, and the coordinator relearns the job from the gap on.
//!
//! The room the coordinator's plans leave in this job's budget goes through the slot too: the
//! job asks one (its `TENSILE_PLAN_ROOM`, fixed; or what the planning thread's
//! [`crate::plan_room::RoomControl`] raised it to, asked again at every rejoin), and the
//! coordinator says the room in force, which the control starts from. Only the mechanism is
//! here; when to raise it is the control's.
//!
//! A process using several devices has a slot on each device's coordinator
//! ([`crate::other_devices`]): the first device's streams records and takes plans as above;
//! the others stream nothing and serve for grants and reports of their device's manager only,
//! and take no turns (see [`crate::other_devices`]).

use std::ffi::CStr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tensile_protocol::{Admission, Command as Order, CommandRead, ExecPlan, JobClient, JobOptions};
use tensile_protocol::{PlanState, Priority, SegmentError, SlotRoom, StepCounters};
use tensile_trace::Record;

use tensile_protocol::process::monotonic_ns;

use tensile_driver_abi::CUdevice;

use crate::config::GrantWait;
use crate::executor::ExecutorState;
use crate::managed::Managed;
use crate::memory::budget::format_size;
use crate::planning::{PlanPricing, PlanSource};
use crate::runtime::Runtime;
use tensile_analyzer::SwappedMapping;

/// The coordinator's name under `TENSILE_COORDINATOR=auto`.
pub const DEFAULT_NAME: &str = "default";
/// How long a job waits for a coordinator it started to open its segment.
const START_PATIENCE: Duration = Duration::from_secs(3);
/// How long a job whose started coordinator exited keeps trying to join when no segment is
/// there: a coordinator another job started at the same moment may be about to create it.
const EXITED_GRACE: Duration = Duration::from_millis(500);
/// How often a job whose coordinator went away tries to rejoin.
pub const REJOIN_INTERVAL: Duration = Duration::from_secs(1);
/// How long a coordinator started by a job stays after the last job left, in seconds.
const SPAWNED_IDLE_EXIT_S: &str = "30";

/// What a coordinator joined mid-run must be told first: the kernels and live allocations
/// (see [`crate::tracker::Tracker::state_records`]).
pub type StateRecords = Box<dyn Fn() -> Vec<Record> + Send>;

/// Streams to a coordinator and takes its plans.
pub struct CoordinatorSource {
    name: String,
    state: StateRecords,
    start_if_missing: bool,
    /// How a coordinator this job starts prices moves (one it joins keeps its own).
    pricing: PlanPricing,
    client: Option<JobClient>,
    priority: Priority,
    /// The most this job may be granted (`TENSILE_DEVICE_MEMORY`; 0: the card), known once
    /// the memory manager runs.
    limit: u64,
    /// A grant received and not yet taken by the planning loop.
    grant: Option<u64>,
    said_short: bool,
    /// How long this job's accesses wait for a grant to grow (`TENSILE_GRANT_WAIT`), said in
    /// the line that tells it it is short.
    grant_wait: GrantWait,
    next_rejoin: Instant,
    said_gone: bool,
    said_bad_command: bool,
    /// Whether the job said that the coordinator it joined last let its ring fill.
    said_ring_full: bool,
    /// The memory manager's page, told the coordinator when joining.
    page_bytes: u64,
    /// Launches per iteration and predicted step of the last plan received.
    plan_shape: Option<(u32, u64)>,
    /// Counters at the last report: launches, stalls, bytes to host and to the device, when.
    last_report: Option<(u64, u64, u64, u64, Instant)>,
    /// Whether `TENSILE_PLAN_ROOM` fixes the room (then the run does not adapt it).
    room_fixed: bool,
    /// The room this job asks its plans to leave (`None`: the coordinator's own), told the
    /// coordinator at every join.
    room_asked: Option<f64>,
    /// The room the coordinator says its plans for this job leave now, as last read.
    room_in_force: Option<f64>,
    /// Whether the job said that its slot holds a room no version writes.
    said_bad_room: bool,
    /// The device whose manager this slot reports and is granted for: `None` for the first
    /// (the one plans serve), the only one whose coordinator's turns the process takes.
    device: Option<CUdevice>,
    /// Whether the job said that this slot's coordinator asked it to wait its turn (a slot of
    /// another device, which takes no turns).
    said_pause_ignored: bool,
}

impl CoordinatorSource {
    /// How long this job's accesses wait for a grant to grow (`TENSILE_GRANT_WAIT`).
    pub fn set_grant_wait(&mut self, wait: GrantWait) {
        self.grant_wait = wait;
    }

    /// The manager this slot reports and is granted for.
    pub fn manager(&self, rt: &Runtime) -> Option<&'static Managed> {
        match self.device {
            None => rt.memory(),
            Some(d) => rt.memory.on_device(d),
        }
    }

    /// Joins coordinator `name`, starting it first if none runs and `start_if_missing`.
    /// `Err` says in one line why no coordinator can be joined.
    ///
    /// The first join needs no `state`: the stream starts with the process. A coordinator
    /// joined later (after the first went away) gets `state()` before the stream goes on, so
    /// it knows the parameters and the kernels made before it came. `page_bytes`: the
    /// memory manager's page, which the coordinator's plans must move in. `fixed_room`: the
    /// room `TENSILE_PLAN_ROOM` sets, which the coordinator then plans this job with
    /// (`None`: its own room, which the run may raise).
    pub fn connect(
        name: &str,
        start_if_missing: bool,
        pricing: PlanPricing,
        priority: Priority,
        page_bytes: u64,
        fixed_room: Option<f64>,
        state: StateRecords,
    ) -> Result<CoordinatorSource, String> {
        let source = Self::unjoined(
            name,
            start_if_missing,
            pricing,
            priority,
            page_bytes,
            fixed_room,
            state,
        );
        source.joined()
    }

    /// [`Self::connect`] for the manager of `device`, not the first: the slot reports that
    /// manager and is granted for it, streams nothing, and tells the coordinator that the job
    /// takes its turns elsewhere (on its first GPU's coordinator), so that this one never
    /// pauses it while its priority still ranks its memory (`crate::other_devices`).
    pub fn connect_for_device(
        device: CUdevice,
        name: &str,
        pricing: PlanPricing,
        priority: Priority,
        page_bytes: u64,
        fixed_room: Option<f64>,
    ) -> Result<CoordinatorSource, String> {
        let mut source = Self::unjoined(
            name,
            true,
            pricing,
            priority,
            page_bytes,
            fixed_room,
            // Nothing streamed: a coordinator joined again needs no state either.
            Box::new(Vec::new),
        );
        source.device = Some(device);
        source.joined()
    }

    fn unjoined(
        name: &str,
        start_if_missing: bool,
        pricing: PlanPricing,
        priority: Priority,
        page_bytes: u64,
        fixed_room: Option<f64>,
        state: StateRecords,
    ) -> CoordinatorSource {
        CoordinatorSource {
            name: name.to_owned(),
            state,
            start_if_missing,
            pricing,
            client: None,
            priority,
            limit: 0,
            grant: None,
            said_short: false,
            grant_wait: GrantWait::default(),
            next_rejoin: Instant::now(),
            said_gone: false,
            said_bad_command: false,
            said_ring_full: false,
            page_bytes,
            plan_shape: None,
            last_report: None,
            room_fixed: fixed_room.is_some(),
            room_asked: fixed_room,
            room_in_force: None,
            said_bad_room: false,
            device: None,
            said_pause_ignored: false,
        }
    }

    fn joined(mut self) -> Result<CoordinatorSource, String> {
        let client = self.join()?;
        tracing::info!(
            "joined coordinator {} (slot {})",
            client.segment_path(),
            client.slot_index()
        );
        self.client = Some(client);
        Ok(self)
    }

    fn options(&self) -> JobOptions {
        JobOptions {
            budget_bytes: self.limit,
            priority: self.priority,
            command_line: crate::recorder::command_line(),
            page_bytes: self.page_bytes,
            room: self.room_asked,
            turns_elsewhere: self.device.is_some(),
            ..JobOptions::default()
        }
    }

    fn join(&self) -> Result<JobClient, String> {
        // A segment being made (its coordinator, perhaps started by another job at the same
        // moment, has not written its magic yet) is waited for, not taken for no coordinator.
        let deadline = Instant::now() + START_PATIENCE;
        loop {
            match JobClient::join(&self.name, &self.options()) {
                Ok(c) => return Ok(c),
                Err(SegmentError::NotReady { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(SegmentError::NotFound { .. } | SegmentError::CoordinatorGone { .. })
                    if self.start_if_missing =>
                {
                    break
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        let (mut child, log) = self.start_coordinator()?;
        let deadline = Instant::now() + START_PATIENCE;
        let mut exited_at: Option<Instant> = None;
        let joined = loop {
            // Looked at before joining: a coordinator that exited (another job's started
            // first, or it could not create its segment) leaves the job waiting only while
            // another may still serve: a segment being made (`NotReady`) until the deadline,
            // none for a short grace (the other may be about to create it).
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() && exited_at.is_none() {
                exited_at = Some(Instant::now());
            }
            match JobClient::join(&self.name, &self.options()) {
                Ok(c) => {
                    tracing::info!(
                        "started coordinator {:?} (its log: {})",
                        self.name,
                        log.display()
                    );
                    break Ok(c);
                }
                Err(e) => {
                    let another_may_serve = matches!(e, SegmentError::NotReady { .. })
                        || exited_at.is_some_and(|t| t.elapsed() < EXITED_GRACE);
                    if let Some(status) = exited.filter(|_| !another_may_serve) {
                        break Err(format!(
                            "started a coordinator, but it exited ({status}{}) and none can be \
                             joined ({e}; its log: {})",
                            last_line(&log).map_or(String::new(), |l| format!(": {l}")),
                            log.display()
                        ));
                    }
                    if Instant::now() >= deadline {
                        break Err(format!(
                            "started a coordinator but could not join it within {:.0} s ({e}; \
                             its log: {})",
                            START_PATIENCE.as_secs_f64(),
                            log.display()
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        // Reaped when it exits, so it never lingers as a zombie of the job.
        let _ = std::thread::Builder::new()
            .name("tensile-coord-reaper".into())
            .spawn(move || {
                let _ = child.wait();
            });
        joined
    }

    /// Starts `tensile coordinator` detached; returns it and its log file.
    fn start_coordinator(&self) -> Result<(std::process::Child, PathBuf), String> {
        let binary = tensile_binary()
            .ok_or("no `tensile` binary next to libtensile.so to start a coordinator with")?;
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let log = std::env::temp_dir().join(format!("tensile-coordinator-{uid}-{}.log", self.name));
        let mut cmd = Command::new(&binary);
        cmd.arg("coordinator")
            .arg("--name")
            .arg(&self.name)
            .arg("--idle-exit")
            .arg(SPAWNED_IDLE_EXIT_S)
            .arg("--log")
            .arg(&log);
        let pricing = self.pricing;
        if let Some(b) = pricing.gbps {
            cmd.arg("--plan-gbps")
                .arg(format!("{},{},{}", b.to_device, b.to_host, b.both));
        }
        cmd.arg("--swapped").arg(swapped_flag(pricing.mapping));
        if pricing.vmm_time != 1.0 {
            cmd.arg("--plan-vmm-time").arg(pricing.vmm_time.to_string());
        }
        // The coordinator must not load the shim into itself, nor share our terminal's
        // signals (it outlives us, serving other jobs). Nor this job's room as its own: this
        // job asks it in its slot, and the jobs after it that set none get the default.
        cmd.env_remove("LD_PRELOAD")
            .env_remove("TENSILE_PLAN_ROOM")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: setsid is async-signal-safe and touches nothing of the parent.
            unsafe {
                cmd.pre_exec(|| {
                    libc::setsid();
                    Ok(())
                });
            }
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        Ok((child, log))
    }

    /// The coordinator went away: say so once, and rejoin (starting a new one) when due.
    fn rejoin_if_due(&mut self) {
        if !self.said_gone {
            tracing::warn!(
                "the coordinator {:?} went away; the current plan (if any) keeps running and the \
                 rest is swapped on demand; rejoining every {:.0} s",
                self.name,
                REJOIN_INTERVAL.as_secs_f64()
            );
            self.said_gone = true;
        }
        if Instant::now() < self.next_rejoin {
            return;
        }
        self.next_rejoin = Instant::now() + REJOIN_INTERVAL;
        if let Ok(mut client) = self.join() {
            let state = (self.state)();
            tracing::warn!(
                "rejoined coordinator {} (told it {} kernels and live allocations first)",
                client.segment_path(),
                state.len()
            );
            for record in &state {
                client.push(record);
            }
            // The new coordinator relearns from here on.
            self.client = Some(client);
            self.said_gone = false;
            self.said_ring_full = false;
        }
    }
}

impl PlanSource for CoordinatorSource {
    fn push(&mut self, record: &Record) {
        if let Some(c) = &mut self.client {
            c.push(record);
        }
    }

    fn lost(&mut self, count: u64) {
        if let Some(c) = &mut self.client {
            c.note_lost(count);
        }
    }

    fn set_budget(&mut self, _bytes: u64) {
        // The coordinator plans for the grant it gives; the slot states the job's own limit
        // (see `report`).
    }

    fn take_grant(&mut self) -> Option<u64> {
        self.grant.take()
    }

    fn poll(&mut self) -> Option<ExecPlan> {
        if self.client.as_ref().is_some_and(|c| !c.connected()) {
            // Leaving a dead coordinator's segment frees nothing anyone waits for.
            self.client = None;
        }
        let Some(client) = &mut self.client else {
            if self.device.is_none() {
                crate::turns::release();
            }
            self.rejoin_if_due();
            return None;
        };
        client.flush();
        client.heartbeat();
        if client.ring_full_records() > 0 && !self.said_ring_full {
            tracing::warn!(
                "the coordinator {:?} is not reading this job's records (its event ring is \
                 full): they are dropped and counted, the job goes on with its plan (if any) \
                 and on-demand swapping, and the coordinator relearns the job from what it \
                 reads next",
                self.name
            );
            self.said_ring_full = true;
        }
        // Renewed every poll while the coordinator keeps the job paused; it runs out by
        // itself if this thread or the coordinator stops.
        if let Some(device) = self.device {
            // Another device's slot says that the job takes its turns elsewhere, so no
            // coordinator of this version pauses it; one that does anyway (another version) is
            // not obeyed: see `crate::other_devices`.
            if client.paused() && !self.said_pause_ignored {
                tracing::warn!(
                    "tensile: the coordinator {:?} of device {device} asks this job to wait its \
                     turn; a process using several GPUs takes turns on its first GPU only, so \
                     it goes on",
                    self.name
                );
                self.said_pause_ignored = true;
            }
        } else if client.paused() {
            if !crate::turns::held() {
                tracing::info!("tensile: paused by the coordinator: another job has the card");
            }
            crate::turns::hold_until(monotonic_ns() + crate::turns::LEASE.as_nanos() as u64);
        } else if crate::turns::held() {
            tracing::info!("tensile: the coordinator gives this job its turn on the card");
            crate::turns::release();
        }
        match client.room_in_force() {
            SlotRoom::Invalid(word) => {
                if !self.said_bad_room {
                    tracing::warn!(
                        "the coordinator {:?} says a room no version writes ({word:#018x}); \
                         ignored",
                        self.name
                    );
                    self.said_bad_room = true;
                }
            }
            said => self.room_in_force = said.share(),
        }
        match client.poll_command() {
            CommandRead::New(Ok(Order::Plan(plan))) => {
                tracing::info!("{}, from the coordinator", crate::planning::learned(&plan));
                self.plan_shape = Some((plan.period, plan.predicted_step_ns));
                Some(plan)
            }
            CommandRead::New(Ok(Order::Budget(bytes))) => {
                self.grant = Some(bytes);
                None
            }
            CommandRead::New(Ok(Order::DropPlan)) => {
                tracing::debug!("coordinator dropped the plan; the next one replaces it");
                None
            }
            CommandRead::New(Err(e)) => {
                if !self.said_bad_command {
                    tracing::warn!("unusable command from the coordinator ({e}); ignored");
                    self.said_bad_command = true;
                }
                None
            }
            CommandRead::Nothing | CommandRead::Busy => None,
        }
    }

    /// Asks the coordinator to plan with `room` (now, and at every rejoin). False when
    /// `TENSILE_PLAN_ROOM` fixes the room.
    fn set_room(&mut self, room: f64) -> bool {
        if self.room_fixed {
            return false;
        }
        self.room_asked = Some(room);
        if let Some(client) = &self.client {
            client.ask_room(room);
        }
        true
    }

    /// The room the coordinator says it plans this job with: none until it has said one (or
    /// from a coordinator that says none), nor when `TENSILE_PLAN_ROOM` fixes it.
    fn adaptable_room(&self) -> Option<f64> {
        self.room_in_force.filter(|_| !self.room_fixed)
    }

    fn report(&mut self, rt: &Runtime) {
        let Some(client) = &self.client else {
            return;
        };
        // Plans serve the first device only: another device's slot never has one.
        let (version, state) = match rt.executor.state() {
            _ if self.device.is_some() => (0, PlanState::Learning),
            ExecutorState::NoPlan => (0, PlanState::Learning),
            ExecutorState::Planned { version } => (version, PlanState::Planned),
            ExecutorState::Fallback { version } => (version, PlanState::Fallback),
        };
        client.set_plan(version, state);
        client.set_launches(rt.tracker.launches());
        let Some(m) = self.manager(rt) else {
            return;
        };
        // An access already past the launch hook that waits for memory waits for the job's
        // turn too: its grant comes with the turn, and the wait must not run out meanwhile
        // (TENSILE_GRANT_WAIT counts only time the job has the card). A lease, as the pause.
        if crate::turns::held() {
            m.mm.stop_budget_clock_until(Instant::now() + crate::turns::LEASE);
        }
        self.limit = m.limit.map_or(0, |l| l as u64);
        client.set_budget(self.limit);
        client.set_card_bytes(m.card_bytes);
        client.set_memory(
            m.mm.device_bytes_held() as u64,
            m.mm.footprint_bytes() as u64,
        );
        let (admission, floor, grantable) = client.admission();
        match admission {
            Admission::Short if !self.said_short => {
                tracing::error!(
                    "tensile: this job's largest launch needs {} of device memory (seen in \
                     its launches, or in an earlier run of the same command), but the \
                     coordinator {:?} can grant it at most {} beside the other jobs on this GPU \
                     (`tensile status` lists them); launches that need more than the grant wait \
                     {} for memory to be freed, then fail with out of memory \
                     (TENSILE_GRANT_WAIT)",
                    format_size(floor),
                    self.name,
                    format_size(grantable),
                    match self.grant_wait {
                        GrantWait::Forever => "for as long as it takes".to_string(),
                        GrantWait::For(d) => format!("up to {:.0} s", d.as_secs_f64()),
                    }
                );
                self.said_short = true;
            }
            Admission::Admitted if self.said_short => {
                tracing::warn!(
                    "tensile: the coordinator can now grant this job the {} its largest launch \
                     needs",
                    format_size(floor)
                );
                self.said_short = false;
            }
            _ => {}
        }
        // Per step: the counters' growth since the last report, scaled by the launches of one
        // iteration of the plan (no plan, no steps to speak of).
        let s = m.mm.stats();
        let now = (
            rt.tracker.launches(),
            s.stalled_launches,
            s.bytes_to_host,
            s.bytes_to_device,
            Instant::now(),
        );
        if let (Some((period, predicted)), Some(last)) = (self.plan_shape, self.last_report) {
            let launches = now.0.saturating_sub(last.0);
            if launches >= u64::from(period) {
                let per_step = |d: u64| d.saturating_mul(u64::from(period)) / launches;
                client.set_step_counters(&StepCounters {
                    stalls: per_step(now.1.saturating_sub(last.1)),
                    bytes_to_host: per_step(now.2.saturating_sub(last.2)),
                    bytes_to_device: per_step(now.3.saturating_sub(last.3)),
                    predicted_step_ns: predicted,
                    measured_step_ns: per_step(now.4.duration_since(last.4).as_nanos() as u64),
                });
                self.last_report = Some(now);
            }
        } else {
            self.last_report = Some(now);
        }
    }
}

/// The last line of a file (a coordinator's log), if it has one.
fn last_line(path: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    Some(line.trim().to_string())
}

/// `tensile` in the directory of the `libtensile.so` this code is in.
fn tensile_binary() -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let here = tensile_binary as *const ();
    // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(here.cast(), &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated path owned by the loader.
    let lib = unsafe { CStr::from_ptr(info.dli_fname) };
    let lib = PathBuf::from(lib.to_string_lossy().into_owned());
    let binary = lib.parent()?.join("tensile");
    binary.is_file().then_some(binary)
}

/// `tensile coordinator --swapped`'s word for how swapped-out pages are held.
pub fn swapped_flag(mapping: SwappedMapping) -> &'static str {
    match mapping {
        SwappedMapping::HostUnits => "host-units",
        SwappedMapping::SingleFrames => "single-frames",
        SwappedMapping::Unmapped => "unmapped",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensile_protocol::{CoordinatorSegment, Geometry, JobSnapshot};

    fn unique_name() -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        format!(
            "test-shim-room-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn small() -> Geometry {
        Geometry {
            slot_count: 2,
            ring_bytes: 16 << 10,
            command_bytes: 16 << 10,
        }
    }

    /// A source joined to the coordinator `name` (none is started), its room fixed or not.
    fn source(name: &str, fixed_room: Option<f64>) -> CoordinatorSource {
        CoordinatorSource::connect(
            name,
            false,
            PlanPricing::h100(SwappedMapping::HostUnits),
            Priority::Normal,
            2 << 20,
            fixed_room,
            Box::new(Vec::new),
        )
        .unwrap()
    }

    fn only_job(segment: &CoordinatorSegment) -> JobSnapshot {
        let jobs = segment.jobs();
        assert_eq!(jobs.len(), 1, "{jobs:?}");
        jobs.into_iter().next().unwrap()
    }

    #[test]
    fn the_room_the_coordinator_says_is_the_one_the_run_adapts_and_its_raises_are_asked() {
        let name = unique_name();
        let segment = CoordinatorSegment::create(&name, small()).unwrap();
        let mut job = source(&name, None);
        let joined = only_job(&segment);
        assert_eq!(
            joined.room_asked,
            SlotRoom::NotSaid,
            "the coordinator's own"
        );
        // Nothing to adapt until the coordinator says its room.
        assert!(job.poll().is_none());
        assert_eq!(job.adaptable_room(), None);
        segment.set_room_in_force(joined.slot, joined.incarnation, SlotRoom::Permille(200));
        job.poll();
        assert_eq!(job.adaptable_room(), Some(0.2));
        // A raise is asked in the slot.
        assert!(job.set_room(0.3));
        assert_eq!(only_job(&segment).room_asked, SlotRoom::Permille(300));
        // A word no version writes is not taken for a room: the last one stays.
        let garbage = SlotRoom::Invalid((joined.incarnation & 0xffff_ffff) << 32 | 1 << 31 | 990);
        segment.set_room_in_force(joined.slot, joined.incarnation, garbage);
        job.poll();
        assert_eq!(job.adaptable_room(), Some(0.2));

        // A new coordinator under the name: the job rejoins it and asks the raised room.
        drop(segment);
        let segment = CoordinatorSegment::create(&name, small()).unwrap();
        job.poll();
        job.poll();
        let rejoined = only_job(&segment);
        assert_eq!(rejoined.room_asked, SlotRoom::Permille(300));
        drop(job);
    }

    #[test]
    fn a_room_fixed_by_the_job_is_asked_at_joining_and_never_adapted() {
        let name = unique_name();
        let segment = CoordinatorSegment::create(&name, small()).unwrap();
        let mut job = source(&name, Some(0.0));
        let joined = only_job(&segment);
        // 0% said, not nothing said.
        assert_eq!(joined.room_asked, SlotRoom::Permille(0));
        segment.set_room_in_force(joined.slot, joined.incarnation, SlotRoom::Permille(0));
        job.poll();
        assert_eq!(job.adaptable_room(), None);
        assert!(!job.set_room(0.1));
        assert_eq!(only_job(&segment).room_asked, SlotRoom::Permille(0));
        drop(job);
    }
}
