//! `tensile coordinator`: serves the jobs of one GPU and user through their shared-memory
//! segment (`tensile_protocol`): reads each job's event stream into a planner of its own,
//! sends the job each new plan, grants budgets, reclaims the slots of dead jobs, and exits a
//! while after the last job has left.
//!
//! One thread does everything, in [`Coordinator::tick`]: heartbeat, sweep, follow the slot
//! table, grant, drain, plan, write commands. Nothing in it waits on a job. What the planner
//! is stays behind [`JobPlanner`].
//!
//! Grants ([`grants`]): the card's memory less a reserve is divided among the jobs by their
//! priorities, floors and needs; a job learns its grant through a `Budget` command and meets
//! it by evicting, and its planner plans for it. A job that reports no card yet (its memory
//! manager has not started) is granted the budget it asks for.
//!
//! Rooms: each job's plans leave a share of its grant free, the room the job asks in its slot
//! (its `TENSILE_PLAN_ROOM`, or what its run raised it to) or else `--plan-room`; the room in
//! force is said back in the slot, where the job's own control of it starts from.

mod floor;
pub mod grants;
mod log;
mod planner;
mod remembered;
mod turns;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tensile_analyzer::cost::format_bytes;
use tensile_analyzer::online::{parse_room, room_from_env, DEFAULT_PLAN_ROOM};
use tensile_analyzer::{CostModel, RemapModel, SwappedMapping};
use tensile_protocol::{
    Admission, Command, CoordinatorSegment, Corruption, Delivery, Geometry, JobSnapshot,
    SegmentError, SlotRoom,
};
use tensile_shim::config::PlanBandwidths;
use tensile_shim::planning::PlanPricing;

use floor::FloorTracker;
use grants::{Claim, Standing};

pub use log::Log;
pub use planner::{JobPlanner, LearnerPlanner, PlannerState};

/// Arguments of `tensile coordinator`.
#[derive(clap::Args)]
pub struct CoordinatorArgs {
    /// The segment's name: the GPU's identity, or what TENSILE_COORDINATOR=NAME says.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// Exit this many seconds after the last job left (or after starting, if none joins).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub idle_exit: f64,
    /// Append the log here instead of writing it to stderr.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Job slots in the segment: the most jobs served at once.
    #[arg(long, default_value_t = Geometry::default().slot_count)]
    pub slots: u32,
    /// KiB of each job's event ring: a power of two from 4 to 65536. A job whose ring is
    /// full (the coordinator does not keep up) drops records and counts them; its planner
    /// relearns after the gap.
    #[arg(long, value_name = "KIB", default_value_t = Geometry::default().ring_bytes >> 10)]
    pub ring_kib: u64,
    /// The copy rates the planner assumes, GB/s: H2D,D2H,BOTH (as the jobs'
    /// TENSILE_PLAN_GBPS); default the H100's (55,55,92). Each page moved also pays the
    /// H100's remap calls, shared by the pages of a unit (units the size of each job's
    /// tensors, held as --swapped says).
    #[arg(long, value_name = "H2D,D2H,BOTH")]
    pub plan_gbps: Option<String>,
    /// How the jobs hold swapped-out pages, which says what their remaps cost:
    /// host-units (the library's default), single-frames (TENSILE_HOST_UNITS=off) or
    /// unmapped (TENSILE_SWAPPED=unmapped).
    #[arg(long, value_name = "HOW", default_value = "host-units", value_parser = parse_swapped)]
    pub swapped: SwappedMapping,
    /// The remap calls take this many times the H100's (as the jobs' TENSILE_PLAN_VMM_TIME:
    /// a simulated card keeping time slower).
    #[arg(long, value_name = "K", default_value_t = 1.0)]
    pub plan_vmm_time: f64,
    /// The share of each job's grant its plans leave free, for what a run does that its plan
    /// cannot place: a percentage from 0 to 90. Default: TENSILE_PLAN_ROOM of the
    /// coordinator's environment, else 20%. A job that asks a room of its own (its
    /// TENSILE_PLAN_ROOM, or a room it raised) is planned with that.
    #[arg(long, value_name = "PERCENT")]
    pub plan_room: Option<String>,
    /// Percent of the card's memory never granted to jobs: room for what libraries allocate
    /// around the jobs' arenas (cuBLAS and cuDNN workspaces, NCCL buffers, contexts).
    #[arg(long, value_name = "PERCENT", default_value_t = DEFAULT_RESERVE_PERCENT)]
    pub reserve: f64,
    /// Where the largest launch of each command is kept across runs, so that a job that
    /// cannot fit beside the others is told as it joins: a file, or `none`. Default: the
    /// temporary directory's tensile-coordinator-UID-NAME.floors.
    #[arg(long, value_name = "FILE")]
    pub floors: Option<PathBuf>,
    /// When the jobs' needs do not fit the card together, the ones that fit run and the
    /// others wait; a turn lasts this many seconds, or ten times what a change of turns is
    /// measured to take if that is longer (at most 300 s; docs/sharing.md).
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_TURN.as_secs_f64())]
    pub turn: f64,
    /// Whether the jobs that swap beside each other share the copy engines in their plans
    /// (`on`: each is planned with an equal share of the card's copy rates) or each is
    /// planned as if it had them to itself (`off`). Default: TENSILE_COPY_SHARE of the
    /// coordinator's environment (a coordinator a job starts inherits the job's), else on.
    #[arg(long, value_name = "on|off")]
    pub copy_share: Option<String>,
}

/// `--copy-share`, or TENSILE_COPY_SHARE where it is not given (`env`), else on.
fn copy_share_setting(
    flag: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<bool, String> {
    let (text, what) = match flag {
        Some(t) => (t.to_string(), "--copy-share"),
        None => match env("TENSILE_COPY_SHARE") {
            Some(t) => (t, "TENSILE_COPY_SHARE"),
            None => return Ok(true),
        },
    };
    match text.trim() {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("{what}={other:?}: expected on or off")),
    }
}

/// Default `--turn`: the shortest turn, before any change of turns (the paused jobs' working
/// sets go out, the resumed ones' come in) is measured, and while one is measured to take less
/// than 6 s (turns last ten times a change). Changes of turns on the shared simulated card took 2 to 10 s (docs/sharing.md);
/// turns of 10 s before the first was measured stopped a BERT rerun a few seconds before its
/// end, and the change cost more than the turn it bought.
pub const DEFAULT_TURN: Duration = Duration::from_secs(60);

/// Default `--reserve`: the same headroom the shim leaves when it sizes a budget alone.
pub const DEFAULT_RESERVE_PERCENT: f64 = 5.0;

/// `--swapped`.
fn parse_swapped(text: &str) -> Result<SwappedMapping, String> {
    [
        SwappedMapping::HostUnits,
        SwappedMapping::SingleFrames,
        SwappedMapping::Unmapped,
    ]
    .into_iter()
    .find(|&m| tensile_shim::coordination::swapped_flag(m) == text.trim())
    .ok_or_else(|| format!("{text:?}: expected host-units, single-frames or unmapped"))
}

/// The planner's costs for `--plan-gbps`, `--swapped` and `--plan-vmm-time`, as the
/// library's own planner prices moves: copies at the rates told (else the card's) and the
/// remaps of the pages moved (docs/gpu-results.md).
fn cost_model(
    text: Option<&str>,
    swapped: SwappedMapping,
    vmm_time: f64,
) -> Result<(CostModel, Option<RemapModel>), String> {
    if !(vmm_time.is_finite() && vmm_time >= 0.0) {
        return Err(format!(
            "--plan-vmm-time {vmm_time}: expected a number of times the H100's call times (0 or more)"
        ));
    }
    let told = match text {
        None => None,
        Some(text) => {
            let values: Vec<f64> = text
                .split(',')
                .map(|v| {
                    v.trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite() && *x > 0.0)
                })
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    format!("--plan-gbps {text}: expected three positive numbers of GB/s")
                })?;
            let [to_device, to_host, both] = values[..] else {
                return Err(format!(
                    "--plan-gbps {text}: expected three numbers (to the device, to the host, both)"
                ));
            };
            Some(PlanBandwidths {
                to_device,
                to_host,
                both,
            })
        }
    };
    Ok(PlanPricing {
        gbps: told,
        mapping: swapped,
        vmm_time,
    }
    .costs())
}

/// How often the loop runs when there is nothing to read.
const IDLE_TICK: Duration = Duration::from_millis(10);
/// How often each job's planner is asked for a plan.
const PLAN_POLL: Duration = Duration::from_millis(50);
/// How often the slots of dead jobs are looked for.
const SWEEP_EVERY: Duration = Duration::from_millis(200);
/// The most bytes of one job's ring read per tick, so one busy job cannot starve the others.
const DRAIN_PER_TICK: usize = 4 << 20;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn request_stop(_signal: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Runs `tensile coordinator` until it has been idle long enough or is told to stop.
pub fn run(args: CoordinatorArgs) -> Result<(), String> {
    if !(args.idle_exit.is_finite() && args.idle_exit >= 0.0) {
        return Err(format!(
            "--idle-exit {}: not a number of seconds",
            args.idle_exit
        ));
    }
    let cost = cost_model(args.plan_gbps.as_deref(), args.swapped, args.plan_vmm_time)?;
    let copy_share = copy_share_setting(args.copy_share.as_deref(), |k| std::env::var(k).ok())?;
    let (room, room_problem) = match &args.plan_room {
        Some(v) => (
            parse_room(v).map_err(|why| format!("--plan-room {v}: {why}"))?,
            None,
        ),
        None => room_from_env(|k| std::env::var(k).ok()),
    };
    if !(args.reserve.is_finite() && (0.0..100.0).contains(&args.reserve)) {
        return Err(format!(
            "--reserve {}: expected a percentage from 0 to below 100",
            args.reserve
        ));
    }
    if !(args.turn.is_finite() && args.turn > 0.0) {
        return Err(format!(
            "--turn {}: expected a positive number of seconds",
            args.turn
        ));
    }
    let out: Box<dyn std::io::Write + Send> = match &args.log {
        Some(path) => Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("log file {}: {e}", path.display()))?,
        ),
        None => Box::new(std::io::stderr()),
    };
    let mut log = Log::new(out);
    let geometry = Geometry {
        slot_count: args.slots,
        ring_bytes: args.ring_kib.saturating_mul(1 << 10),
        ..Geometry::default()
    };
    let segment = match CoordinatorSegment::create_replacing_stale(&args.name, geometry) {
        Ok(s) => s,
        Err(e) => {
            // The error is printed on stderr; a log file gets it too, for whoever started
            // the coordinator detached.
            if args.log.is_some() {
                log.line(&format!(
                    "coordinator {}: not started: {e}",
                    std::process::id()
                ));
            }
            return Err(match e {
                SegmentError::CoordinatorRunning { .. } => format!("{e}; nothing to do"),
                other => other.to_string(),
            });
        }
    };
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGTERM,
            request_stop as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGINT,
            request_stop as *const () as libc::sighandler_t,
        );
    }
    let mut coordinator = Coordinator::new(
        segment,
        log,
        Box::new(move |job: &JobSnapshot, room: f64| {
            Box::new(LearnerPlanner::new(
                job.budget_bytes,
                cost,
                job.page(),
                room,
            )) as Box<dyn JobPlanner>
        }),
    );
    coordinator.room = room;
    match args.floors.as_deref() {
        Some(p) if p == Path::new("none") => {}
        path => {
            let path = path.map_or_else(|| remembered::default_path(&args.name), Path::to_path_buf);
            let (floors, problem) = remembered::RememberedFloors::load(path);
            if let Some(problem) = problem {
                coordinator
                    .log
                    .line(&format!("coordinator {}: {problem}", std::process::id()));
            }
            coordinator.remembered = floors;
        }
    }
    if let Some(problem) = room_problem {
        coordinator
            .log
            .line(&format!("coordinator {}: {problem}", std::process::id()));
    }
    coordinator.reserve_fraction = args.reserve / 100.0;
    coordinator.copy_share = copy_share;
    coordinator.turns = turns::Turns::new(Duration::from_secs_f64(args.turn));
    let idle_exit = Duration::from_secs_f64(args.idle_exit);
    let path = coordinator.segment.path();
    coordinator.log.line(&format!(
        "coordinator {} serving {path} ({} slots); exits {:.0} s after the last job leaves",
        std::process::id(),
        geometry.slot_count,
        args.idle_exit
    ));
    loop {
        let now = Instant::now();
        let busy = coordinator.tick(now);
        if STOP.load(Ordering::Relaxed) {
            coordinator.log.line("coordinator stopping (signal)");
            break;
        }
        if coordinator.idle_for(now) >= Some(idle_exit) {
            coordinator.log.line(&format!(
                "coordinator {}: no job for {:.1} s; exiting",
                std::process::id(),
                args.idle_exit
            ));
            break;
        }
        if !busy {
            std::thread::sleep(IDLE_TICK);
        }
    }
    // Dropping the segment unlinks its name (if it is still ours).
    drop(coordinator);
    Ok(())
}

/// Makes the planner of a job that joined, its plans leaving the room given (a share of the
/// grant) free.
pub type PlannerFactory = Box<dyn FnMut(&JobSnapshot, f64) -> Box<dyn JobPlanner>>;

/// One job the coordinator follows.
struct Job {
    incarnation: u64,
    pid: u32,
    /// Records the job lost (its ring was full, or it dropped them before pushing), as
    /// delivered since the last tick.
    gap: u64,
    command_line: String,
    planner: Box<dyn JobPlanner>,
    last_poll: Option<Instant>,
    records: u64,
    lost: u64,
    /// The planner's failures already logged.
    planner_failures: u64,
    /// When it joined, in the coordinator's count: earlier jobs keep their floors first.
    joined: u64,
    /// The grant last given (0: none yet).
    granted: u64,
    floor: FloorTracker,
    admission: Admission,
    /// Its footprint as read at each tick over the last [`NEED_WINDOW`]: a job's need is
    /// the largest, since its footprint rises and falls within every iteration.
    needs: std::collections::VecDeque<(Instant, u64)>,
    /// Its planner's predicted step at fractions of its need (see [`grants::Claim::curve`]),
    /// filled a point at a time while the card is short.
    curve: Vec<(u64, u64)>,
    /// The iteration and the need the curve was made for.
    curve_for: (u64, u64),
    /// Whether it holds its launches while others have the card.
    paused: bool,
    /// The share of the card's copy engines its plans count on (1: all of them).
    copy_share: f64,
    /// The room its plans leave free now (a share of its grant).
    room: f64,
    /// The room it asked for, as last read from its slot.
    room_asked: SlotRoom,
    /// How long it has run while others waited, ns (who goes next).
    ran_ns: u64,
    /// The largest footprint it ever reported.
    peak: u64,
    /// How long it has run since `peak` last grew by more than 1/[`GROWTH`], ns.
    steady_ns: u64,
}

/// A footprint counts as grown when it passes the job's peak by more than 1/N of it.
const GROWTH: u64 = 16;

impl Job {
    /// Takes one delivery from the job's ring; a corrupt ring is noted in `corrupt`.
    fn take(&mut self, delivery: Delivery, corrupt: &mut Option<Corruption>) {
        match delivery {
            Delivery::Record(r) => {
                self.records += 1;
                self.floor.push(&r);
                self.planner.push(&r);
            }
            Delivery::Lost(n) => {
                self.lost += n;
                self.gap += n;
                self.planner.lost(n);
            }
            Delivery::Corrupt(c) => {
                // How much is gone is unknown: at least one record.
                self.lost += 1;
                self.planner.lost(1);
                *corrupt = Some(c);
            }
        }
    }
}

/// The least a waiting job is granted: one page.
const MIN_GRANT: u64 = 2 << 20;

/// Points of a job's curve: its step predicted at 1/N, 2/N, ... of its need.
const CURVE_POINTS: u64 = 8;

impl Job {
    /// Computes the next point of the job's curve (a plan and a simulation: milliseconds);
    /// starts over when the job's iteration or need moved. Returns whether it computed one.
    fn extend_curve(&mut self, need: u64) -> bool {
        let generation = self.planner.cycle_generation();
        let (g, n) = self.curve_for;
        if g != generation || need.abs_diff(n) > n / 8 {
            self.curve.clear();
            self.curve_for = (generation, need);
        }
        let k = self.curve.len() as u64 + 1;
        if generation == 0 || k > CURVE_POINTS {
            return false;
        }
        let bytes = self.curve_for.1 * k / CURVE_POINTS;
        match self.planner.predict_step(bytes) {
            Some(step) => self.curve.push((bytes, step)),
            // No plan runs there: as slow as the slowest point known, so no memory is given
            // for nothing; the next point is tried at the next tick.
            None => self.curve.push((bytes, u64::MAX / 4)),
        }
        true
    }

    /// Whether its need is known: its planner has found its iteration (the need is then at
    /// least the iteration's peak), or it has run for a [`NEED_WINDOW`] without its footprint
    /// growing (a job whose stream has no iteration, or whose planner is not told it). Counted
    /// known after 8 s of running however it grew, a ResNet-50 rerun still learning at
    /// `--time-scale 16` let a waiting job in and grew past it.
    fn need_known(&self) -> bool {
        self.planner.cycle_generation() > 0 || self.steady_ns >= NEED_WINDOW.as_nanos() as u64
    }

    /// Records the footprint read `now` and returns the job's need: the largest footprint
    /// of the window, or the peak of its iteration if larger.
    fn need(&mut self, now: Instant, footprint: u64) -> u64 {
        while self
            .needs
            .front()
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) > NEED_WINDOW)
        {
            self.needs.pop_front();
        }
        // Only the samples that can still be the largest are kept.
        while self.needs.back().is_some_and(|&(_, b)| b <= footprint) {
            self.needs.pop_back();
        }
        self.needs.push_back((now, footprint));
        if footprint > self.peak + self.peak / GROWTH {
            self.peak = footprint;
            self.steady_ns = 0;
        }
        // Once the iteration is known, its peak too: the footprint of the iterations seen may
        // fall short of it (BERT's, sampled as its iteration was found, was 1.04 GiB of the
        // 1.18 it held from the next iteration on, and a job let into the difference was
        // stopped 2 s later).
        self.need_now()
    }

    /// The need as last recorded by [`Self::need`]: the largest footprint of the window, or
    /// the peak of its iteration if larger.
    fn need_now(&self) -> u64 {
        let window = self.needs.front().map_or(0, |&(_, b)| b);
        window.max(self.planner.cycle_peak_bytes().unwrap_or(0))
    }
}

/// A share as a percentage, to the tenth where it has one ("35%", "33.3%").
pub(crate) fn percent(share: f64) -> String {
    format!("{}%", (share * 1000.0).round() / 10.0)
}

/// The log's line for a job whose slot says a room no version writes.
fn invalid_room(job: &JobSnapshot, word: u64, room: f64) -> String {
    format!(
        "job {}: its slot asks for a room no version writes ({word:#018x}); ignored, its \
         plans leave {} of its grant free",
        job.process.pid,
        percent(room)
    )
}

/// How far back a job's footprint counts towards its need: longer than an iteration, so the
/// need is the iteration's peak and grants do not follow the rise and fall within one.
const NEED_WINDOW: Duration = Duration::from_secs(8);

/// The coordinator's state between ticks.
pub struct Coordinator {
    segment: CoordinatorSegment,
    log: Log,
    new_planner: PlannerFactory,
    jobs: BTreeMap<u32, Job>,
    idle_since: Option<Instant>,
    last_sweep: Option<Instant>,
    /// Jobs that ever joined.
    joins: u64,
    /// Fraction of the card never granted.
    reserve_fraction: f64,
    /// Which jobs have the card when their needs do not fit it together.
    turns: turns::Turns,
    /// When grants were last decided.
    last_grant: Option<Instant>,
    /// The room plans leave free for jobs that ask none of their own (`--plan-room`).
    room: f64,
    /// The floors of commands run before (`--floors`).
    remembered: remembered::RememberedFloors,
    /// Whether jobs that swap beside each other are planned with a share of the copy
    /// engines (`--copy-share`).
    copy_share: bool,
}

/// A grant moves only when its target differs from it by more than this fraction of the
/// larger of the two (or it has none yet): a job's footprint grows allocation by allocation,
/// and each grant change costs the job a replan.
const GRANT_HYSTERESIS: u64 = 32;

/// Whether a grant of `granted` should move to `target`.
fn grant_moves(granted: u64, target: u64) -> bool {
    granted == 0 || granted.abs_diff(target) > granted.max(target) / GRANT_HYSTERESIS
}

impl Coordinator {
    pub fn new(segment: CoordinatorSegment, log: Log, new_planner: PlannerFactory) -> Coordinator {
        Coordinator {
            segment,
            log,
            new_planner,
            jobs: BTreeMap::new(),
            idle_since: Some(Instant::now()),
            last_sweep: None,
            joins: 0,
            reserve_fraction: DEFAULT_RESERVE_PERCENT / 100.0,
            turns: turns::Turns::new(DEFAULT_TURN),
            last_grant: None,
            room: DEFAULT_PLAN_ROOM,
            remembered: remembered::RememberedFloors::in_memory(),
            copy_share: true,
        }
    }

    /// Keeps what `job` showed of its floor for the next run of its command.
    fn remember_floor(&mut self, job: &Job) {
        let floor = job.floor.to_remember();
        if floor == 0 || job.command_line.is_empty() {
            return;
        }
        self.remembered.set(&job.command_line, floor);
        if let Err(why) = self.remembered.save() {
            self.log
                .line(&format!("coordinator {}: {why}", std::process::id()));
        }
    }

    /// How long no job has been connected, as of `now`; `None` while one is.
    pub fn idle_for(&self, now: Instant) -> Option<Duration> {
        self.idle_since.map(|t| now.saturating_duration_since(t))
    }

    /// One round of the loop. Returns whether any job had records (run again at once).
    pub fn tick(&mut self, now: Instant) -> bool {
        self.segment.heartbeat();
        // Telling a dead job reads /proc; a few times a second is soon enough.
        let sweep_due = self
            .last_sweep
            .is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY);
        let reclaimed = if sweep_due {
            self.last_sweep = Some(now);
            self.segment.sweep()
        } else {
            Vec::new()
        };
        for r in reclaimed {
            match self.jobs.remove(&r.slot) {
                Some(job) => {
                    self.log.line(&format!(
                        "job {} died; slot {} reclaimed after {} records",
                        r.pid, r.slot, job.records
                    ));
                    self.remember_floor(&job);
                }
                None => self.log.line(&format!(
                    "job {} died while joining; slot {} reclaimed",
                    r.pid, r.slot
                )),
            }
        }
        let live: BTreeMap<u32, JobSnapshot> = self
            .segment
            .jobs()
            .into_iter()
            .filter(|j| j.live)
            .map(|j| (j.slot, j))
            .collect();
        // Jobs that left (or whose slot a new job took since the last tick).
        let gone: Vec<u32> = self
            .jobs
            .iter()
            .filter(|(slot, job)| {
                live.get(slot)
                    .is_none_or(|s| s.incarnation != job.incarnation)
            })
            .map(|(&slot, _)| slot)
            .collect();
        for slot in gone {
            if let Some(mut job) = self.jobs.remove(&slot) {
                // A joining job may take a dead job's slot before the sweep frees it: that
                // job died, it did not leave.
                if let Some(next) = live.get(&slot).filter(|s| s.took_from == job.pid) {
                    self.log.line(&format!(
                        "job {} died; slot {slot} taken by job {} after {} records",
                        job.pid, next.process.pid, job.records
                    ));
                    self.remember_floor(&job);
                    continue;
                }
                let mut corrupt = None;
                self.segment
                    .drain_departed(slot, job.incarnation, |d| job.take(d, &mut corrupt));
                let planner = match job.planner.state() {
                    PlannerState::Learning => "learning".to_string(),
                    PlannerState::Planned { version } => format!("plan version {version}"),
                };
                self.log.line(&format!(
                    "job {} left slot {slot} after {} records ({} lost), {planner}: {}",
                    job.pid, job.records, job.lost, job.command_line
                ));
                self.remember_floor(&job);
            }
        }
        for (slot, snap) in &live {
            if !self.jobs.contains_key(slot) {
                self.log.line(&format!(
                    "job {} joined slot {slot}, asking {}: {}",
                    snap.process.pid,
                    format_bytes(snap.budget_bytes),
                    snap.command_line
                ));
                let room = snap.room_asked.share().unwrap_or(self.room);
                let planner = (self.new_planner)(snap, room);
                self.segment
                    .set_room_in_force(*slot, snap.incarnation, SlotRoom::from_share(room));
                match snap.room_asked {
                    SlotRoom::Permille(_) => self.log.line(&format!(
                        "job {}: its plans leave {} of its grant free, as it asks (the \
                         coordinator's own room: {})",
                        snap.process.pid,
                        percent(room),
                        percent(self.room)
                    )),
                    SlotRoom::Invalid(word) => self.log.line(&invalid_room(snap, word, room)),
                    SlotRoom::NotSaid => {}
                }
                self.joins += 1;
                let mut floor = FloorTracker::new(snap.page());
                if let Some(bytes) = self.remembered.get(&snap.command_line) {
                    floor.remember(bytes);
                    self.log.line(&format!(
                        "job {}: an earlier run of its command needed {} for its largest \
                         launch; that is its floor until its own iteration is seen",
                        snap.process.pid,
                        format_bytes(bytes)
                    ));
                }
                self.jobs.insert(
                    *slot,
                    Job {
                        incarnation: snap.incarnation,
                        pid: snap.process.pid,
                        gap: 0,
                        command_line: snap.command_line.clone(),
                        planner,
                        last_poll: None,
                        records: 0,
                        lost: 0,
                        planner_failures: 0,
                        joined: self.joins,
                        granted: 0,
                        floor,
                        admission: Admission::Admitted,
                        needs: std::collections::VecDeque::new(),
                        curve: Vec::new(),
                        curve_for: (0, 0),
                        paused: false,
                        copy_share: 1.0,
                        room,
                        room_asked: snap.room_asked,
                        ran_ns: 0,
                        peak: 0,
                        steady_ns: 0,
                    },
                );
            }
        }
        self.follow_rooms(&live);
        self.idle_since = match (self.jobs.is_empty(), self.idle_since) {
            (true, None) => Some(now),
            (true, since) => since,
            (false, _) => None,
        };

        let mut busy = false;
        let Coordinator {
            segment, log, jobs, ..
        } = self;
        for (&slot, job) in jobs.iter_mut() {
            let mut corrupt = None;
            let before = job.records;
            segment.drain(slot, DRAIN_PER_TICK, |d| job.take(d, &mut corrupt));
            busy |= job.records != before;
            if job.gap > 0 {
                log.line(&format!(
                    "job {}: {} records lost on the way (its event ring was full, or the job \
                     dropped them); relearning",
                    job.pid, job.gap
                ));
                job.gap = 0;
            }
            if let Some(c) = corrupt {
                log.line(&format!(
                    "job {}: its event ring was corrupt ({c}); reset, relearning",
                    job.pid
                ));
            }
            if job.planner.cycle_generation() > 0 {
                job.floor.settle();
            }
            if job
                .last_poll
                .is_none_or(|t| now.saturating_duration_since(t) >= PLAN_POLL)
            {
                job.last_poll = Some(now);
                if let Some(plan) = job.planner.poll() {
                    let line = format!(
                        "job {} planned: version {}, {} launches per iteration, {} steps, \
                         {} out per iteration, budget {}, predicted step {:.3} ms",
                        job.pid,
                        plan.version,
                        plan.period,
                        plan.steps.len(),
                        format_bytes(plan.bytes_out_per_iteration()),
                        format_bytes(plan.budget_bytes),
                        plan.predicted_step_ns as f64 / 1e6
                    );
                    match segment.send(slot, job.incarnation, Command::Plan(plan)) {
                        Ok(()) => log.line(&line),
                        Err(e) => log.line(&format!("job {}: plan not sent: {e}", job.pid)),
                    }
                }
                if let Some(reason) = job.planner.take_no_plan() {
                    log.line(&format!(
                        "job {}: no plan for its iteration: {reason}; it swaps on demand",
                        job.pid
                    ));
                }
            }
            let failures = job.planner.failures();
            if failures > job.planner_failures {
                job.planner_failures = failures;
                log.line(&format!(
                    "job {}: its planner failed (a bug; {failures} time(s) so far) and starts \
                     over, relearning the job",
                    job.pid
                ));
            }
        }
        self.grant(now, &live);
        self.share_copy_engines();
        let Coordinator {
            segment, log, jobs, ..
        } = self;
        for (&slot, job) in jobs.iter_mut() {
            if let Err(e) = segment.flush_commands(slot, job.incarnation) {
                log.line(&format!("job {}: command not sent: {e}", job.pid));
            }
        }
        busy
    }

    /// Has each job's planner leave the room the job asks for, when it asks for another, and
    /// says the room in force in its slot (where the job's control of its room starts from).
    /// A word that is not a room changes nothing and is logged once.
    fn follow_rooms(&mut self, live: &BTreeMap<u32, JobSnapshot>) {
        for (slot, job) in self.jobs.iter_mut() {
            let Some(snap) = live.get(slot).filter(|s| s.incarnation == job.incarnation) else {
                continue;
            };
            if snap.room_asked == job.room_asked {
                continue;
            }
            job.room_asked = snap.room_asked;
            let room = match snap.room_asked {
                SlotRoom::Invalid(word) => {
                    self.log.line(&invalid_room(snap, word, job.room));
                    continue;
                }
                // Not said: no version takes back a room it asked for; the room stays.
                asked => match asked.share() {
                    Some(room) => room,
                    None => continue,
                },
            };
            if (room - job.room).abs() < 1e-9 {
                continue;
            }
            self.log.line(&format!(
                "job {} asks its plans to leave {} of its grant free (was {}); planning again",
                job.pid,
                percent(room),
                percent(job.room)
            ));
            job.room = room;
            job.planner.set_room(room);
            self.segment
                .set_room_in_force(*slot, job.incarnation, SlotRoom::from_share(room));
        }
    }

    /// Divides the card among the jobs (see [`grants`]) and tells each job whose grant
    /// moved. Until some job has reported the card's size, a job is granted what it asks.
    fn grant(&mut self, now: Instant, live: &BTreeMap<u32, JobSnapshot>) {
        let card = live.values().map(|s| s.card_bytes).max().unwrap_or(0);
        let mut order: Vec<u32> = self
            .jobs
            .keys()
            .copied()
            .filter(|s| live.contains_key(s))
            .collect();
        order.sort_by_key(|s| self.jobs[s].joined);
        // Per job: the grant to give now, the most it could be granted, and whether even its
        // floor could not be given.
        let (targets, grantable, short): (Vec<u64>, Vec<u64>, Vec<bool>) = if card == 0 {
            let asked: Vec<u64> = order.iter().map(|s| live[s].budget_bytes).collect();
            (asked.clone(), asked, vec![false; order.len()])
        } else {
            let available = card - (card as f64 * self.reserve_fraction) as u64;
            let needs: Vec<u64> = order
                .iter()
                .map(|s| {
                    let job = self.jobs.get_mut(s).expect("ordered from the jobs");
                    job.need(now, live[s].demand_bytes)
                })
                .collect();
            // While the card is short, one more point of one job's curve per tick (each is a
            // plan and a simulation), the job with the fewest first.
            if needs.iter().sum::<u64>() > available {
                let fewest = order
                    .iter()
                    .zip(&needs)
                    .filter(|(s, _)| self.jobs[s].curve.len() < CURVE_POINTS as usize)
                    .min_by_key(|(s, _)| self.jobs[s].curve.len());
                if let Some((s, &need)) = fewest {
                    let job = self.jobs.get_mut(s).expect("ordered from the jobs");
                    job.extend_curve(need);
                }
            }
            let claims: Vec<Claim> = order
                .iter()
                .zip(&needs)
                .map(|(s, &need)| {
                    let snap = &live[s];
                    Claim {
                        limit: if snap.budget_bytes == 0 {
                            u64::MAX
                        } else {
                            snap.budget_bytes
                        },
                        // At least a page each, so that no grant drops to nothing.
                        floor: self.jobs[s].floor.floor().max(MIN_GRANT),
                        need,
                        known: self.jobs[s].need_known(),
                        priority: snap.priority.unwrap_or_default(),
                        curve: self.jobs[s].curve.clone(),
                        turns_elsewhere: snap.turns_elsewhere,
                    }
                })
                .collect();
            let running = self.take_turns(now, &order, available, &claims, live);
            // A waiting job keeps its floor (at least a page): its turn starts from there.
            let claims: Vec<Claim> = claims
                .into_iter()
                .zip(&running)
                .map(|(c, &run)| {
                    if run {
                        c
                    } else {
                        let keep = c.floor.max(MIN_GRANT).min(c.limit);
                        Claim {
                            limit: keep,
                            need: keep,
                            ..c
                        }
                    }
                })
                .collect();
            let division = grants::divide(available, &claims);
            // A job granted less than its floor (a newcomer waiting its turn, granted nothing
            // yet) gets it even where that shrinks another grant by less than the hysteresis:
            // otherwise a job that has the whole card keeps it, and the newcomer no budget.
            let starved =
                order
                    .iter()
                    .zip(&claims)
                    .zip(&division.targets)
                    .any(|((s, c), &target)| {
                        // (Floors are at least a page: see the claims above.)
                        let floor = c.floor.min(c.limit).min(target);
                        self.jobs[s].granted < floor
                    });
            let standings: Vec<Standing> = order
                .iter()
                .zip(&division.targets)
                .map(|(s, &target)| {
                    let job = &self.jobs[s];
                    let shrink = starved && target < job.granted;
                    Standing {
                        granted: job.granted,
                        held: live[s].resident_bytes,
                        target: if shrink || grant_moves(job.granted, target) {
                            target
                        } else {
                            job.granted
                        },
                        priority: live[s].priority.unwrap_or_default(),
                    }
                })
                .collect();
            let short = claims
                .iter()
                .zip(&division.targets)
                .map(|(c, &t)| t < c.floor.min(c.limit))
                .collect();
            (
                grants::settle(available, &standings),
                division.grantable,
                short,
            )
        };
        let mut moved = Vec::new();
        // Shrinks are published before raises: a reader of the segment (or a job) must never
        // see a raise that counts on memory another job's shrink, not yet written, gives back.
        let mut publish: Vec<usize> = (0..order.len()).collect();
        publish.sort_by_key(|&i| targets[i] >= self.jobs[&order[i]].granted);
        for i in publish {
            let (slot, grant, grantable, short) = (&order[i], targets[i], grantable[i], short[i]);
            let snap = &live[slot];
            let job = self.jobs.get_mut(slot).expect("ordered from the jobs");
            let floor = job.floor.floor();
            let admission = if short {
                Admission::Short
            } else {
                Admission::Admitted
            };
            self.segment
                .set_admission(*slot, admission, floor, grantable);
            if admission != job.admission {
                job.admission = admission;
                if admission == Admission::Short {
                    self.log.line(&format!(
                        "job {}: its largest launch needs {}{}, but at most {} can be granted \
                         to it with every other job at its own floor; it is short until \
                         memory is freed",
                        job.pid,
                        format_bytes(floor),
                        if job.floor.is_remembered() {
                            " (in an earlier run of its command)"
                        } else {
                            ""
                        },
                        format_bytes(grantable)
                    ));
                }
            }
            // A grant of 0 is the budget asked before the card is known ("no limit"): not sent.
            // Once the card is known every decided grant is sent, down to 0 on a full card
            // (the job keeps a page): one not sent would still count as held by the job while
            // `settle` gave its memory to another.
            if grant == job.granted || (card == 0 && grant == 0) {
                continue;
            }
            moved.push(format!(
                "job {} {} (was {}; needs {}, floor {}, {})",
                job.pid,
                format_bytes(grant),
                format_bytes(job.granted),
                format_bytes(job.needs.front().map_or(snap.demand_bytes, |&(_, b)| b)),
                format_bytes(floor),
                snap.priority.unwrap_or_default().name()
            ));
            job.granted = grant;
            self.segment.set_grant(*slot, grant);
            job.planner.set_budget(grant);
            if let Err(e) = self
                .segment
                .send(*slot, job.incarnation, Command::Budget(grant))
            {
                self.log
                    .line(&format!("job {}: grant not sent: {e}", job.pid));
            }
        }
        if !moved.is_empty() {
            self.log.line(&format!(
                "grants{}: {}",
                if card > 0 {
                    format!(" of a {} card", format_bytes(card))
                } else {
                    String::new()
                },
                moved.join("; ")
            ));
        }
    }

    /// Tells each job's planner its share of the card's copy engines: the jobs that run and
    /// must swap (granted less than they need, the need the grants were decided on) share
    /// them equally, so that each plans its
    /// prefetches for the rate it will get and they do not all count on the whole engine;
    /// a job that fits its grant, or waits its turn, moves little and counts for none. (The
    /// jobs are still planned one by one: their phases are not staggered.)
    fn share_copy_engines(&mut self) {
        fn swaps(job: &Job) -> bool {
            !job.paused && job.granted > 0 && job.need_now() > job.granted
        }
        let swapping = self.jobs.values().filter(|j| swaps(j)).count();
        for job in self.jobs.values_mut() {
            let share = if self.copy_share && swapping > 1 && swaps(job) {
                1.0 / swapping as f64
            } else {
                1.0
            };
            if (share - job.copy_share).abs() < 1e-9 {
                continue;
            }
            self.log.line(&if share < 1.0 {
                format!(
                    "job {}: its plans count on {} of the copy engines ({swapping} jobs swap \
                     beside each other); planning again",
                    job.pid,
                    percent(share)
                )
            } else {
                format!(
                    "job {}: its plans count on the whole copy engines again; planning again",
                    job.pid
                )
            });
            job.copy_share = share;
            job.planner.set_copy_share(share);
        }
    }

    /// Decides which jobs run (see [`turns`]) and tells each job that starts or stops
    /// waiting; `order` and `claims` are the jobs by join order.
    fn take_turns(
        &mut self,
        now: Instant,
        order: &[u32],
        available: u64,
        claims: &[Claim],
        live: &BTreeMap<u32, JobSnapshot>,
    ) -> Vec<bool> {
        let elapsed = self
            .last_grant
            .map_or(0, |t| now.saturating_duration_since(t).as_nanos() as u64);
        self.last_grant = Some(now);
        for s in order {
            let job = self.jobs.get_mut(s).expect("ordered from the jobs");
            if !job.paused {
                job.ran_ns += elapsed;
                job.steady_ns += elapsed;
            }
        }
        let contenders: Vec<turns::Contender<'_>> = order
            .iter()
            .zip(claims)
            .map(|(s, claim)| turns::Contender {
                slot: *s,
                claim,
                ran: self.jobs[s].ran_ns,
                held: live[s].resident_bytes,
                granted: self.jobs[s].granted,
            })
            .collect();
        let (running, report) = self.turns.decide(now, available, &contenders);
        if let Some((took, length)) = report.settled {
            self.log.line(&format!(
                "a change of turns settled in {:.1} s; turns last {:.0} s",
                took.as_secs_f64(),
                length.as_secs_f64()
            ));
        }
        let mut changed = Vec::new();
        for (s, &run) in order.iter().zip(&running) {
            let job = self.jobs.get_mut(s).expect("ordered from the jobs");
            if job.paused != run {
                continue;
            }
            job.paused = !run;
            self.segment.set_paused(*s, !run);
            changed.push(format!(
                "job {} {}",
                job.pid,
                if run { "runs" } else { "waits" }
            ));
        }
        if !changed.is_empty() {
            let needs: u64 = claims.iter().map(|c| c.need.min(c.limit)).sum();
            self.log.line(&format!(
                "turns ({} of needs for {} of card): {}",
                format_bytes(needs),
                format_bytes(available),
                changed.join(", ")
            ));
        }
        running
    }

    /// The command lines of the jobs followed, by slot.
    #[cfg(test)]
    pub fn job_commands(&self) -> Vec<(u32, String)> {
        self.jobs
            .iter()
            .map(|(&s, j)| (s, j.command_line.clone()))
            .collect()
    }

    /// Where the planner of the job in `slot` stands.
    #[cfg(test)]
    pub fn planner_state(&self, slot: u32) -> Option<PlannerState> {
        self.jobs.get(&slot).map(|j| j.planner.state())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tensile_protocol::{CommandRead, ExecPlan, JobClient, JobOptions, SlotRoom};
    use tensile_trace::{Launch, Record};

    /// Log lines into a buffer the test reads.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    /// What the double saw, shared with the test.
    #[derive(Default)]
    struct Seen {
        launches: Vec<u64>,
        lost: u64,
        budget: u64,
        /// The room its plans leave, as made and as changed since.
        room: Option<f64>,
        /// The shares of the copy engines it was told, in order.
        copy_shares: Vec<f64>,
    }

    /// Plans once it has seen `after` launches: a plan whose period is the launch count.
    struct Scripted {
        seen: Arc<Mutex<Seen>>,
        after: usize,
        planned: bool,
    }

    impl JobPlanner for Scripted {
        fn push(&mut self, r: &Record) {
            if let Record::Launch(l) = r {
                self.seen.lock().unwrap().launches.push(l.seq);
            }
        }
        fn poll(&mut self) -> Option<ExecPlan> {
            let seen = self.seen.lock().unwrap();
            if self.planned || seen.launches.len() < self.after {
                return None;
            }
            self.planned = true;
            Some(ExecPlan {
                version: 1,
                period: 3,
                kernels: vec![0, 1, 2],
                anchor_seq: 0,
                steps: Vec::new(),
                uses: Vec::new(),
                host_resident: Vec::new(),
                budget_bytes: seen.budget,
                predicted_step_ns: 1_500_000,
                compute_ns: 1_000_000,
            })
        }
        fn lost(&mut self, n: u64) {
            self.seen.lock().unwrap().lost += n;
        }
        fn set_budget(&mut self, bytes: u64) {
            self.seen.lock().unwrap().budget = bytes;
        }
        fn set_room(&mut self, room: f64) {
            self.seen.lock().unwrap().room = Some(room);
        }
        fn set_copy_share(&mut self, share: f64) {
            self.seen.lock().unwrap().copy_shares.push(share);
        }
        fn state(&self) -> PlannerState {
            if self.planned {
                PlannerState::Planned { version: 1 }
            } else {
                PlannerState::Learning
            }
        }
    }

    fn launch(seq: u64) -> Record {
        Record::Launch(Launch {
            t_ns: seq,
            stream: 0,
            seq,
            kernel: (seq % 3) as u32,
            grid: [1; 3],
            block: [1; 3],
            smem: 0,
            accesses: Vec::new(),
        })
    }

    fn unique_name() -> String {
        use std::sync::atomic::AtomicU32;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        format!(
            "test-coord-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    }

    #[test]
    fn a_job_is_followed_from_join_through_its_plan_to_leaving() {
        let name = unique_name();
        let geometry = Geometry {
            slot_count: 2,
            ring_bytes: 64 << 10,
            command_bytes: 16 << 10,
        };
        let segment = CoordinatorSegment::create(&name, geometry).unwrap();
        let captured = Captured::default();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let for_factory = seen.clone();
        let mut c = Coordinator::new(
            segment,
            Log::new(Box::new(captured.clone())),
            Box::new(move |_, room| {
                for_factory.lock().unwrap().room = Some(room);
                Box::new(Scripted {
                    seen: for_factory.clone(),
                    after: 300,
                    planned: false,
                })
            }),
        );
        let t0 = Instant::now();
        c.tick(t0);
        assert!(c.idle_for(t0).is_some());

        let mut job = JobClient::join(
            &name,
            &JobOptions {
                budget_bytes: 5 << 30,
                command_line: "train.py --lr 3e-4".into(),
                ..JobOptions::default()
            },
        )
        .unwrap();
        let slot = job.slot_index();
        for seq in 0..200 {
            job.push(&launch(seq));
        }
        job.flush();
        c.tick(t0 + Duration::from_millis(1));
        assert_eq!(c.idle_for(t0 + Duration::from_millis(1)), None);
        assert_eq!(
            c.job_commands(),
            vec![(slot, "train.py --lr 3e-4".to_string())]
        );
        // No card reported yet: the grant is the budget asked.
        assert_eq!(job.grant(), 5 << 30);
        assert_eq!(seen.lock().unwrap().budget, 5 << 30);
        assert_eq!(
            job.poll_command(),
            CommandRead::New(Ok(Command::Budget(5 << 30)))
        );
        assert_eq!(job.poll_command(), CommandRead::Nothing);
        assert_eq!(c.planner_state(slot), Some(PlannerState::Learning));

        for seq in 200..400 {
            job.push(&launch(seq));
        }
        job.flush();
        // Past the poll interval: the planner is asked, and its plan reaches the job.
        c.tick(t0 + Duration::from_millis(100));
        assert_eq!(
            seen.lock().unwrap().launches,
            (0..400).collect::<Vec<u64>>()
        );
        match job.poll_command() {
            CommandRead::New(Ok(Command::Plan(p))) => {
                assert_eq!((p.version, p.budget_bytes), (1, 5 << 30))
            }
            other => panic!("expected the plan, got {other:?}"),
        }
        assert_eq!(
            c.planner_state(slot),
            Some(PlannerState::Planned { version: 1 })
        );

        // Records the job lost reach the planner as a gap.
        job.note_lost(7);
        job.push(&launch(1000));
        job.flush();
        c.tick(t0 + Duration::from_millis(101));
        assert_eq!(seen.lock().unwrap().lost, 7);

        // What it pushes just before leaving is read after it has left, and counted.
        job.push(&launch(1001));
        job.push(&launch(1002));
        job.leave();
        let t1 = t0 + Duration::from_millis(102);
        c.tick(t1);
        assert!(c.job_commands().is_empty());
        assert_eq!(
            c.idle_for(t1 + Duration::from_secs(1)),
            Some(Duration::from_secs(1))
        );

        let log = captured.text();
        let pid = std::process::id();
        for want in [
            format!("job {pid} joined slot {slot}, asking 5.00 GiB: train.py --lr 3e-4"),
            format!("grants: job {pid} 5.00 GiB (was 0 B"),
            format!("job {pid} planned: version 1, 3 launches per iteration"),
            format!("job {pid}: 7 records lost on the way"),
            format!("job {pid} left slot {slot} after 403 records (7 lost)"),
        ] {
            assert!(log.contains(&want), "{want:?} not in the log:\n{log}");
        }
        assert_eq!(log.lines().count(), 5, "{log}");
    }

    #[test]
    fn the_room_a_job_asks_reaches_its_planner_and_is_said_in_its_slot() {
        let name = unique_name();
        let segment = CoordinatorSegment::create(&name, Geometry::default()).unwrap();
        let captured = Captured::default();
        // Each job's planner reports to a `Seen` of its own, in join order.
        let planners: Arc<Mutex<Vec<Arc<Mutex<Seen>>>>> = Arc::default();
        let for_factory = planners.clone();
        let mut c = Coordinator::new(
            segment,
            Log::new(Box::new(captured.clone())),
            Box::new(move |_, room| {
                let seen = Arc::new(Mutex::new(Seen {
                    room: Some(room),
                    ..Seen::default()
                }));
                for_factory.lock().unwrap().push(seen.clone());
                Box::new(Scripted {
                    seen,
                    after: usize::MAX,
                    planned: false,
                })
            }),
        );
        c.room = 0.25;
        let room_of = |i: usize| planners.lock().unwrap()[i].lock().unwrap().room;
        let t0 = Instant::now();

        // A job that fixed its room is planned with it; one that says none, with the
        // coordinator's; each slot says the room in force.
        let fixed = JobClient::join(
            &name,
            &JobOptions {
                room: Some(0.35),
                ..JobOptions::default()
            },
        )
        .unwrap();
        let adapting = JobClient::join(&name, &JobOptions::default()).unwrap();
        assert_eq!(fixed.room_in_force(), SlotRoom::NotSaid, "not seen yet");
        c.tick(t0);
        assert_eq!(room_of(0), Some(0.35));
        assert_eq!(room_of(1), Some(0.25));
        assert_eq!(fixed.room_in_force(), SlotRoom::Permille(350));
        assert_eq!(adapting.room_in_force(), SlotRoom::Permille(250));

        // The second raises its room: its planner plans with it, and its slot says so.
        adapting.ask_room(0.35);
        c.tick(t0 + Duration::from_millis(1));
        assert_eq!(room_of(1), Some(0.35));
        assert_eq!(room_of(0), Some(0.35));
        assert_eq!(adapting.room_in_force(), SlotRoom::Permille(350));
        c.tick(t0 + Duration::from_millis(2));

        // A word that is not a room (the flag and the job's incarnation, but 99.9%) changes
        // nothing and is said once.
        let slot = adapting.slot_index();
        let incarnation = c
            .segment
            .jobs()
            .iter()
            .find(|j| j.slot == slot)
            .unwrap()
            .incarnation;
        let garbage = (incarnation & 0xffff_ffff) << 32 | 1 << 31 | 999;
        {
            use std::os::unix::fs::FileExt;
            let path = tensile_protocol::segment::shm_path(
                &tensile_protocol::segment::shm_name(&name).unwrap(),
            );
            let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            file.write_all_at(&garbage.to_le_bytes(), 256 + 1024 * u64::from(slot) + 696)
                .unwrap();
        }
        c.tick(t0 + Duration::from_millis(3));
        c.tick(t0 + Duration::from_millis(4));
        assert_eq!(room_of(1), Some(0.35));
        assert_eq!(adapting.room_in_force(), SlotRoom::Permille(350));

        let log = captured.text();
        let pid = std::process::id();
        for (want, times) in [
            (
                format!(
                    "job {pid}: its plans leave 35% of its grant free, as it asks (the \
                     coordinator's own room: 25%)"
                ),
                1,
            ),
            (
                format!(
                    "job {pid} asks its plans to leave 35% of its grant free (was 25%); \
                     planning again"
                ),
                1,
            ),
            (
                format!("job {pid}: its slot asks for a room no version writes"),
                1,
            ),
        ] {
            assert_eq!(
                log.matches(&want).count(),
                times,
                "{want:?} in the log:\n{log}"
            );
        }
        assert!(
            log.contains(&format!("({garbage:#018x}); ignored")),
            "{log}"
        );
        fixed.leave();
        adapting.leave();
    }

    /// What each job's planner double saw, in join order.
    type Planners = Arc<Mutex<Vec<Arc<Mutex<Seen>>>>>;

    /// A coordinator on a segment of its own whose planners never plan and which keeps no
    /// reserve (so the card's numbers are the grants'): its name, it, and its log.
    fn dividing_coordinator() -> (String, Coordinator, Captured) {
        let (name, c, captured, _) = dividing_coordinator_with_planners();
        (name, c, captured)
    }

    /// [`dividing_coordinator`], and what its planners saw.
    fn dividing_coordinator_with_planners() -> (String, Coordinator, Captured, Planners) {
        let name = unique_name();
        let segment = CoordinatorSegment::create(&name, Geometry::default()).unwrap();
        let captured = Captured::default();
        let planners = Planners::default();
        let made = planners.clone();
        let mut c = Coordinator::new(
            segment,
            Log::new(Box::new(captured.clone())),
            Box::new(move |_, _| {
                let seen = Arc::new(Mutex::new(Seen::default()));
                made.lock().unwrap().push(seen.clone());
                Box::new(Scripted {
                    seen,
                    after: usize::MAX,
                    planned: false,
                })
            }),
        );
        c.reserve_fraction = 0.0;
        (name, c, captured, planners)
    }

    /// A job's allocation of `bytes` and one launch touching it.
    fn big_launch(job: &mut JobClient, id: u64, bytes: u64) {
        job.push(&Record::Alloc(tensile_trace::Alloc {
            t_ns: 0,
            stream: 0,
            id,
            ptr: id << 40,
            bytes,
            kind: tensile_trace::AllocKind::Async,
        }));
        let Record::Launch(mut l) = launch(id) else {
            unreachable!()
        };
        l.accesses.push(tensile_trace::Access {
            alloc: id,
            param_offset: 0,
        });
        job.push(&Record::Launch(l));
        job.flush();
    }

    #[test]
    fn a_job_whose_largest_launch_cannot_fit_beside_the_others_floors_is_told_in_one_line() {
        const G: u64 = 1 << 30;
        let (name, mut c, captured) = dividing_coordinator();
        let t0 = Instant::now();
        let mut a = JobClient::join(&name, &JobOptions::default()).unwrap();
        let mut b = JobClient::join(&name, &JobOptions::default()).unwrap();
        for job in [&a, &b] {
            job.set_card_bytes(10 * G);
        }
        big_launch(&mut a, 1, 6 * G);
        big_launch(&mut b, 2, 5 * G);
        c.tick(t0);
        c.tick(t0 + Duration::from_millis(1));
        let (admission_a, _, _) = a.admission();
        let (admission_b, floor_b, grantable_b) = b.admission();
        assert_eq!(admission_a, Admission::Admitted);
        assert_eq!(admission_b, Admission::Short);
        assert!(
            floor_b > 5 * G && grantable_b < floor_b,
            "{floor_b} {grantable_b}"
        );
        let log = captured.text();
        assert_eq!(
            log.matches("its largest launch needs").count(),
            1,
            "said once: {log}"
        );
    }

    #[test]
    fn a_job_whose_command_could_not_fit_before_is_told_as_it_joins() {
        const G: u64 = 1 << 30;
        let dir = std::env::temp_dir().join(format!("tensile-floors-c-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("floors");
        let big = JobOptions {
            command_line: "python train.py --batch 512".into(),
            ..JobOptions::default()
        };
        // A first run of the command, alone: its largest launch is 6 GiB.
        {
            let (name, mut c, _captured) = dividing_coordinator();
            c.remembered = remembered::RememberedFloors::load(path.clone()).0;
            let t0 = Instant::now();
            let mut a = JobClient::join(&name, &big).unwrap();
            a.set_card_bytes(10 * G);
            big_launch(&mut a, 1, 6 * G);
            c.tick(t0);
            assert_eq!(a.admission().0, Admission::Admitted);
            a.leave();
            c.tick(t0 + Duration::from_millis(1));
        }
        // The next coordinator: another job holds 5 GiB at once; the command's second run is
        // told before it launches anything.
        let (name, mut c, captured) = dividing_coordinator();
        let (floors, problem) = remembered::RememberedFloors::load(path);
        assert_eq!(problem, None);
        c.remembered = floors;
        let t0 = Instant::now();
        let mut other = JobClient::join(&name, &JobOptions::default()).unwrap();
        other.set_card_bytes(10 * G);
        big_launch(&mut other, 2, 5 * G);
        c.tick(t0);
        let again = JobClient::join(&name, &big).unwrap();
        again.set_card_bytes(10 * G);
        c.tick(t0 + Duration::from_millis(1));
        c.tick(t0 + Duration::from_millis(2));
        let (admission, floor, grantable) = again.admission();
        assert_eq!(admission, Admission::Short);
        assert!(floor > 6 * G && grantable < floor, "{floor} {grantable}");
        assert_eq!(other.admission().0, Admission::Admitted);
        let log = captured.text();
        for want in [
            "an earlier run of its command needed 6.00 GiB",
            "(in an earlier run of its command), but at most",
        ] {
            assert_eq!(log.matches(want).count(), 1, "{want:?} in:\n{log}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The budget commands a job has been sent, in order.
    fn budgets(job: &mut JobClient) -> Vec<u64> {
        let mut seen = Vec::new();
        while let CommandRead::New(Ok(Command::Budget(b))) = job.poll_command() {
            seen.push(b);
        }
        seen
    }

    #[test]
    fn a_newcomer_that_waits_behind_a_job_with_the_card_is_granted_its_page() {
        const G: u64 = 1 << 30;
        let (name, mut c, _captured) = dividing_coordinator();
        let t0 = Instant::now();
        let mut a = JobClient::join(&name, &JobOptions::default()).unwrap();
        a.set_card_bytes(10 * G);
        a.set_memory(G, G);
        c.tick(t0);
        assert_eq!(budgets(&mut a), vec![10 * G]);
        // A newcomer, while the first is still learning its need: it waits, and gets a page
        // though that shrinks the first's grant by less than the hysteresis (without one it
        // would have no budget at all).
        let mut b = JobClient::join(&name, &JobOptions::default()).unwrap();
        b.set_card_bytes(10 * G);
        c.tick(t0 + Duration::from_millis(10));
        assert!(b.paused() && !a.paused());
        assert_eq!(budgets(&mut a), vec![10 * G - MIN_GRANT]);
        assert_eq!(budgets(&mut b), vec![MIN_GRANT]);
    }

    #[test]
    fn at_seeded_joins_leaves_and_changes_the_card_is_never_promised_twice_and_grants_settle() {
        // Jobs join, leave and change their needs at random points (seeded), each meeting its
        // grant after every tick as the shim does (holding at most its grant). At every tick
        // the grants, each job counted for the larger of its grant and what it holds, fit the
        // card; and where every job runs (no turns, whose grants move with time), the grants
        // stop moving within two ticks of a change.
        const G: u64 = 1 << 30;
        const CARD: u64 = 10 * G;
        for seed in 1..=6u64 {
            let (name, mut c, _captured) = dividing_coordinator();
            let t0 = Instant::now();
            let mut ms = 0;
            let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = move |n: u64| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state % n
            };
            // Each job with its need and what it holds.
            let mut jobs: Vec<(JobClient, u64, u64)> = Vec::new();
            for step in 0..40 {
                let what = next(4);
                if jobs.is_empty() || (what == 0 && jobs.len() < 4) {
                    let priority = match next(4) {
                        0 => tensile_protocol::Priority::High,
                        1 => tensile_protocol::Priority::Low,
                        _ => tensile_protocol::Priority::Normal,
                    };
                    let job = JobClient::join(
                        &name,
                        &JobOptions {
                            priority,
                            ..JobOptions::default()
                        },
                    )
                    .unwrap();
                    job.set_card_bytes(CARD);
                    let need = (1 + next(12)) * G / 2;
                    job.set_memory(0, need);
                    jobs.push((job, need, 0));
                } else if what == 1 {
                    let (job, _, _) = jobs.remove(next(jobs.len() as u64) as usize);
                    job.leave();
                } else {
                    let i = next(jobs.len() as u64) as usize;
                    jobs[i].1 = (1 + next(12)) * G / 2;
                    jobs[i].0.set_memory(jobs[i].2, jobs[i].1);
                }
                let mut seen: Vec<Vec<u64>> = Vec::new();
                for _ in 0..3 {
                    ms += 1;
                    c.tick(t0 + Duration::from_millis(ms));
                    let promised: u64 = jobs.iter().map(|(j, _, held)| j.grant().max(*held)).sum();
                    assert!(
                        promised <= CARD,
                        "seed {seed} step {step}: {promised} promised of a card of {CARD}"
                    );
                    for (job, need, held) in &mut jobs {
                        // The budget commands are read (the grant in the slot says the same).
                        budgets(job);
                        *held = (*need).min(job.grant());
                        job.set_memory(*held, *need);
                    }
                    seen.push(jobs.iter().map(|(j, _, _)| j.grant()).collect());
                }
                if jobs.iter().all(|(j, _, _)| !j.paused()) {
                    assert_eq!(
                        seen[1], seen[2],
                        "seed {seed} step {step}: grants still moving two ticks after a change"
                    );
                }
            }
        }
    }

    #[test]
    fn the_card_is_divided_as_jobs_come_and_go_and_never_promised_twice() {
        const G: u64 = 1 << 30;
        let (name, mut c, captured) = dividing_coordinator();
        let t0 = Instant::now();
        let tick = |c: &mut Coordinator, ms: u64| {
            c.tick(t0 + Duration::from_millis(ms));
        };

        // A job alone on a 10 GiB card needing 6 is granted the whole card.
        let mut a = JobClient::join(&name, &JobOptions::default()).unwrap();
        a.set_card_bytes(10 * G);
        a.set_memory(6 * G, 6 * G);
        tick(&mut c, 1);
        assert_eq!(budgets(&mut a), vec![10 * G]);
        a.set_memory(9 * G, 6 * G);
        // It runs 9 s without growing: its need is known (a job still learning would wait
        // for a high one that is learning too: see turns.rs).
        tick(&mut c, 9_000);
        assert_eq!(budgets(&mut a), Vec::<u64>::new());

        // A high-priority job needing 3 arrives: both fit. The first shrinks at once to its
        // need; the newcomer gets only what nobody holds until the first has given memory
        // back, then its need and the gigabyte left over.
        let mut b = JobClient::join(
            &name,
            &JobOptions {
                priority: tensile_protocol::Priority::High,
                ..JobOptions::default()
            },
        )
        .unwrap();
        b.set_card_bytes(10 * G);
        b.set_memory(0, 3 * G);
        tick(&mut c, 9_002);
        assert_eq!(budgets(&mut a), vec![6 * G]);
        assert_eq!(budgets(&mut b), vec![G], "only the gigabyte nobody holds");
        a.set_memory(6 * G, 6 * G);
        tick(&mut c, 9_003);
        assert_eq!(budgets(&mut b), vec![4 * G]);
        assert_eq!(a.grant() + b.grant(), 10 * G);
        assert!(!a.paused() && !b.paused());

        // The high job grows to 7: the two no longer fit, and the first waits its turn with a
        // page, its launches held; the high job gets the card as the first gives it back.
        b.set_memory(4 * G, 7 * G);
        tick(&mut c, 9_004);
        assert!(a.paused() && !b.paused());
        assert_eq!(budgets(&mut a), vec![MIN_GRANT]);
        assert_eq!(budgets(&mut b), Vec::<u64>::new(), "nothing freed yet");
        a.set_memory(MIN_GRANT, 6 * G);
        tick(&mut c, 9_005);
        assert_eq!(budgets(&mut b), vec![10 * G - MIN_GRANT]);

        // The high job leaves: the first runs again, with the card.
        b.leave();
        tick(&mut c, 9_006);
        assert!(!a.paused());
        assert_eq!(budgets(&mut a), vec![10 * G]);
        let log = captured.text();
        assert!(log.contains("grants of a 10.00 GiB card: job"), "{log}");
        assert!(log.contains(" waits"), "{log}");
    }

    #[test]
    fn jobs_that_swap_beside_each_other_are_planned_with_a_share_of_the_copy_engines() {
        const G: u64 = 1 << 30;
        let (name, mut c, captured, planners) = dividing_coordinator_with_planners();
        let shares = |i: usize| {
            planners.lock().unwrap()[i]
                .lock()
                .unwrap()
                .copy_shares
                .clone()
        };
        let t0 = Instant::now();
        let tick = |c: &mut Coordinator, ms: u64| c.tick(t0 + Duration::from_millis(ms));
        let limited = JobOptions {
            budget_bytes: 4 * G,
            ..JobOptions::default()
        };
        // A job limited to 4 GiB that needs 6 swaps, alone: the engines are its own.
        let mut a = JobClient::join(&name, &limited).unwrap();
        a.set_card_bytes(16 * G);
        a.set_memory(4 * G, 6 * G);
        tick(&mut c, 1);
        assert_eq!(budgets(&mut a), vec![4 * G]);
        assert_eq!(shares(0), Vec::<f64>::new());
        // A second such job: each plans with half of them. A third that fits its grant moves
        // nothing and changes nothing.
        let mut b = JobClient::join(&name, &limited).unwrap();
        b.set_card_bytes(16 * G);
        b.set_memory(4 * G, 6 * G);
        let small = JobClient::join(&name, &JobOptions::default()).unwrap();
        small.set_card_bytes(16 * G);
        small.set_memory(G, G);
        tick(&mut c, 2);
        assert_eq!(budgets(&mut b), vec![4 * G]);
        assert_eq!(shares(0), vec![0.5]);
        assert_eq!(shares(1), vec![0.5]);
        assert_eq!(shares(2), Vec::<f64>::new());
        tick(&mut c, 3);
        assert_eq!(shares(0), vec![0.5], "told once");
        // The second leaves: the first has the engines again.
        b.leave();
        tick(&mut c, 4);
        assert_eq!(shares(0), vec![0.5, 1.0]);
        let log = captured.text();
        assert!(
            log.contains("its plans count on 50% of the copy engines (2 jobs swap"),
            "{log}"
        );
        assert!(log.contains("the whole copy engines again"), "{log}");
        drop((a, small));
    }

    #[test]
    fn the_copy_share_is_on_unless_the_flag_or_the_environment_says_off() {
        let none = |_: &str| None;
        let off = |_: &str| Some("off".to_string());
        assert_eq!(copy_share_setting(None, none), Ok(true));
        assert_eq!(copy_share_setting(None, off), Ok(false));
        assert_eq!(
            copy_share_setting(Some("on"), off),
            Ok(true),
            "the flag first"
        );
        let bad = copy_share_setting(None, |_| Some("half".into())).unwrap_err();
        assert!(
            bad.contains("TENSILE_COPY_SHARE") && bad.contains("half"),
            "{bad}"
        );
    }
}
